package server

import (
	"context"
	"math"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor/engine"
)

// A charge with wait_for_rate waits for the rate at governord instead of
// being refused, within the call's deadline: granted when its token is
// there (the reaper wakes for it), DEADLINE_EXCEEDED and nothing charged
// when the deadline passes first, whatever the deadline (passed, zero, a
// nanosecond, the largest a context holds).
func TestChargeWaitsForRate(t *testing.T) {
	cfg := testConfig()
	cfg.Root.Rates = map[string]engine.Rate{"calls": {Units: 5, Per: int64(time.Second), Burst: 1}}
	cfg.ReapInterval = time.Minute // only DueIn may wake the reaper in time
	srv := start(t, cfg)
	pay := session(t, srv.Addr(), "pay-key", 0)
	task := pay.task(t, "job", nil)
	used := func() int64 {
		v, err := srv.eng.Get(engine.System, engine.NodeID(task.Id))
		if err != nil {
			t.Fatal(err)
		}
		return v.Used["calls"]
	}
	charge := func(ctx context.Context, wait bool) error {
		_, err := pay.ChargeAndAcquire(ctx, &governorpb.ChargeAndAcquireRequest{NodeId: task.Id,
			Charges: map[string]int64{"calls": 1}, WaitForRate: wait})
		return err
	}
	if err := charge(pay.ctx, false); err != nil { // the burst
		t.Fatal(err)
	}
	rateRefusal(t, charge(pay.ctx, false))

	for _, d := range []time.Duration{-time.Second, 0, 1, 20 * time.Millisecond} {
		ctx, cancel := context.WithTimeout(pay.ctx, d)
		err := charge(ctx, true)
		cancel()
		wantCode(t, "a waiting charge with a deadline of "+d.String(), err, codes.DeadlineExceeded)
	}
	if n := srv.eng.Stats(); n.Root.Used["calls"] != 1 || used() != 1 {
		t.Fatalf("charges that gave up were charged: %d used", used())
	}
	for _, d := range []time.Duration{time.Duration(math.MaxInt64), 5 * time.Second} {
		ctx, cancel := context.WithTimeout(pay.ctx, d)
		began := time.Now()
		err := charge(ctx, true)
		cancel()
		if err != nil {
			t.Fatalf("a waiting charge with a deadline of %v: %v", d, err)
		}
		if waited := time.Since(began); waited > 2*time.Second {
			t.Fatalf("a waiting charge at 5/s took %v; the reaper did not wake for its token", waited)
		}
	}
	if used() != 3 {
		t.Fatalf("%d used after two waiting charges granted; want 3", used())
	}
}
