package server

import (
	"context"
	"math"
	"strings"
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

// An acquire with wait_for_rate that first queues for a slot, and at its
// turn finds the rate empty, moves to the rate's queue: the reaper wakes
// for its tokens then (engine.Config.Wake), not up to a ReapInterval
// later. While it waits, /metrics counts it in governor_rate_queue_depth
// by tenant and resource, and Inspect names the rate it waits for.
func TestLeaseWaiterMovedToARateIsTimed(t *testing.T) {
	cfg := testConfig()
	cfg.Root.Rates = map[string]engine.Rate{"calls": {Units: 1, Per: int64(2 * time.Second), Burst: 1}}
	cfg.ReapInterval = time.Minute // only a wake-up may time its grant
	srv := start(t, cfg)
	pay := session(t, srv.Addr(), "pay-key", 0)
	task, err := pay.CreateNode(pay.ctx, &governorpb.CreateNodeRequest{ParentId: pay.scope,
		Spec: &governorpb.NodeSpec{Name: "job", Limits: map[string]int64{"db": 1}}})
	if err != nil {
		t.Fatal(err)
	}
	held, err := pay.Acquire(pay.ctx, &governorpb.AcquireRequest{NodeId: task.Id, Class: "db"})
	if err != nil {
		t.Fatal(err)
	}
	answer := make(chan error, 1)
	go func() {
		_, err := pay.ChargeAndAcquire(pay.ctx, &governorpb.ChargeAndAcquireRequest{NodeId: task.Id, Class: "db",
			Charges: map[string]int64{"calls": 1}, WaitForRate: true})
		answer <- err
	}()
	for srv.eng.Stats().Waiting["db"] != 1 { // the rate let it by: queued for the slot
		time.Sleep(time.Millisecond) // polling the engine's count
	}
	if _, err := pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: task.Id, Resource: "calls", Amount: 1}); err != nil {
		t.Fatal(err) // the bucket's one call: empty for 2s
	}
	released := time.Now()
	if _, err := pay.Release(pay.ctx, &governorpb.ReleaseRequest{LeaseId: held.GetId()}); err != nil {
		t.Fatal(err)
	}
	st := srv.eng.Stats()
	if st.Waiting["db"] != 0 || st.WaitingRate[engine.TenantResource{Tenant: "payments", Resource: "calls"}] != 1 {
		t.Fatalf("after the release: %v waiting for a slot, %v for a rate; want it moved to the rate of calls", st.Waiting, st.WaitingRate)
	}
	if m := scrape(t, srv); !strings.Contains(m, `governor_rate_queue_depth{resource="calls",tenant="payments"} 1`) {
		t.Errorf("/metrics does not count the rate waiter:\n%s", grepLines(m, "queue_depth"))
	}
	in, err := pay.Inspect(pay.ctx, &governorpb.InspectRequest{NodeId: task.Id})
	if err != nil {
		t.Fatal(err)
	}
	if len(in.GetWaiters()) != 1 || in.GetWaiters()[0].GetRate() != "calls" || in.GetWaiters()[0].GetClass() != "db" {
		t.Fatalf("Inspect lists %v; want one waiter of db for the rate of calls", in.GetWaiters())
	}
	if err := <-answer; err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(released); waited > 10*time.Second {
		t.Fatalf("granted %v after the release, with a token due within 2s: the reaper slept through it", waited)
	}
}

// grepLines is the lines of text holding s.
func grepLines(text, s string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
