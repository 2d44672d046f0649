package governor_test

import (
	"net"
	"os"
	"testing"
	"time"

	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/internal/faultproxy"
)

// A dry run and a cap-status read whose answers are lost on the way back
// are sent again: the caller gets governord's answer, and a recorded dry
// run is recorded once (the request id), so a quota of 2 is would-be
// refused at the third, however many answers were lost.
func TestDryRunAndCapStatusSurviveALostAnswer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	proxy := faultproxy.New(ln, os.Getenv(governor.EnvAddr))
	t.Cleanup(func() { proxy.Close() }) // after the session's, which need it
	// A long TTL: no heartbeat is due while the answers are dropped, so the
	// next call after DropNextAnswer is the test's.
	c := dialReal(t, governor.WithAddr(proxy.Addr()), governor.WithTTL(time.Minute))
	ctx, task := newTask(t, t.Context(), c, governor.Spec{Quotas: map[string]int64{"calls": 2}})
	calls := governor.Work{Charges: map[string]int64{"calls": 1}}
	for i, want := range []string{"admitted", "admitted", "quota"} {
		proxy.DropNextAnswer()
		v, err := task.DryRun(ctx, calls, governor.LedgerRecorded)
		if err != nil {
			t.Fatalf("recorded dry run %d: %v", i+1, err)
		}
		if v.Outcome != want || (want == "quota") != (v.Denial != nil) {
			t.Fatalf("recorded dry run %d: %+v, want %s", i+1, v, want)
		}
	}
	proxy.DropNextAnswer()
	caps, err := task.CapStatus(ctx, governor.LedgerIgnored)
	if err != nil {
		t.Fatal(err)
	}
	if len(caps) == 0 || caps[0].NodeID != task.ID() || caps[0].Name != "calls" || caps[0].Cap != 2 || caps[0].Used != 0 {
		t.Fatalf("the caps over the task: %+v; want first calls on the task, 0 of 2 used (shadow charges are not real)", caps)
	}
	if dropped := proxy.AnswersDropped(); dropped != 4 {
		t.Fatalf("the fault proxy dropped %d answers, want 4", dropped)
	}
	// The ledger counts only where asked to.
	if v, err := task.DryRun(ctx, calls, governor.LedgerIgnored); err != nil || v.Outcome != "admitted" {
		t.Fatalf("a dry run that ignores the ledger: %+v, %v; want admitted", v, err)
	}
	if v, err := task.DryRun(ctx, calls, governor.LedgerCounted); err != nil || v.Outcome != "quota" {
		t.Fatalf("a dry run that counts the ledger: %+v, %v; want quota", v, err)
	}
}
