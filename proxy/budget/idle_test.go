package budget_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/proxy/admission"
	"github.com/governor-project/governor/proxy/budget"
	"github.com/governor-project/governor/server/serverconfig"
)

// A subtask (one per Proxy-Authorization username or application_name)
// that holds nothing and runs nothing for SubtaskIdle is closed at
// governord and forgotten; its next use creates it again. One still in use
// is kept however long its work runs.
func TestIdleSubtasksAreClosedAndComeBack(t *testing.T) {
	for _, delegate := range []bool{true, false} {
		t.Run(map[bool]string{true: "delegation", false: "no delegation"}[delegate], func(t *testing.T) {
			srv := govtest.Start(t, func(c *serverconfig.Config) { c.Root.Limits = map[string]int64{"db": 10} })
			a := start(t, srv, govtest.TenantKey, governor.Spec{Name: "pod"}, func(c *budget.Config) {
				c.Delegate, c.SubtaskIdle, c.Linger = delegate, 300*time.Millisecond, 20*time.Millisecond
			})
			adm := admin(t, srv)
			busy := admit(t, a, admission.Request{Subtask: "busy", Class: "db", Charges: map[string]int64{"calls": 1}})
			busyID := node(t, adm, govtest.Tenant, "pod", "busy").GetId()
			admit(t, a, admission.Request{Subtask: "crawl-1", Class: "db", Charges: map[string]int64{"calls": 1}}).End(0, false)
			idleID := node(t, adm, govtest.Tenant, "pod", "crawl-1").GetId()

			// crawl-1, used after busy, is closed; busy, older but with
			// work running, is not.
			eventually(t, "the idle subtask to close", func() bool { return state(t, adm, idleID) == governorpb.NodeState_NODE_STATE_CLOSED })
			if s := state(t, adm, busyID); s != governorpb.NodeState_NODE_STATE_OPEN {
				t.Fatalf("a subtask with work running is %v", s)
			}
			busy.End(0, false)
			eventually(t, "the subtask to close once its work ended", func() bool {
				return state(t, adm, busyID) == governorpb.NodeState_NODE_STATE_CLOSED
			})

			// Its name comes back as a new subtask, open, starting afresh;
			// the task counts everything.
			admit(t, a, admission.Request{Subtask: "crawl-1", Charges: map[string]int64{"calls": 2}})
			a.Settle(context.Background())
			again := node(t, adm, govtest.Tenant, "pod", "crawl-1")
			if again.GetId() == idleID || again.GetUsed()["calls"] != 2 {
				t.Errorf("crawl-1 again: node %d (was %d), used %v; want a new node that spent 2", again.GetId(), idleID, again.GetUsed())
			}
			if used := node(t, adm, govtest.Tenant, "pod").GetUsed()["calls"]; used != 4 {
				t.Errorf("the task spent %d calls; want all 4", used)
			}
		})
	}
}

// A request for a subtask's name while it is being closed for idleness
// waits for the close and gets a new, open subtask, never the closing one.
// The uses come at random moments around the idle period, so that many
// land while a close is in flight.
func TestAUseRacingAnIdleCloseGetsAnOpenSubtask(t *testing.T) {
	srv := govtest.Start(t, nil)
	a := start(t, srv, govtest.TenantKey, governor.Spec{Name: "pod"}, func(c *budget.Config) {
		c.SubtaskIdle, c.Linger = 3*time.Millisecond, time.Millisecond
	})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for i := range 100 {
				ctx, cancel := admission.WithWaitTimeout(context.Background(), waitFor)
				_, err := a.Admit(ctx, admission.Request{Subtask: "racer", Charges: map[string]int64{"calls": 1}})
				cancel()
				if err != nil {
					t.Errorf("use %d of a subtask closed for idleness between uses: %v", i, err)
					return
				}
				time.Sleep(time.Duration(rng.IntN(8000)) * time.Microsecond) // a pause around the idle period
			}
		}()
	}
	wg.Wait()
}

// state is a node's state at governord, ended or not.
func state(t *testing.T, c *governor.Client, id int64) governorpb.NodeState {
	t.Helper()
	n, err := c.Raw().GetNode(context.Background(), &governorpb.GetNodeRequest{NodeId: id})
	if err != nil {
		t.Fatal(err)
	}
	return n.GetState()
}
