package budget_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/proxy/admission"
	"github.com/governor-project/governor/proxy/budget"
	"github.com/governor-project/governor/server"
	"github.com/governor-project/governor/server/serverconfig"
)

// These tests run the admitter against a real governord in this process,
// over real gRPC. The sidecar's own tests drive it through real clients and
// real sidecar processes.

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const waitFor = 10 * time.Second

// start runs an admitter for task name as the tenant key's, until the test
// ends.
func start(t *testing.T, srv *server.Server, key string, spec governor.Spec, edit func(*budget.Config)) *budget.Admitter {
	t.Helper()
	cfg := budget.Config{Task: spec, Delegate: true,
		Dial: []governor.Option{governor.WithAddr(srv.Addr()), governor.WithAPIKey(key), governor.WithTTL(2 * time.Second)}}
	if edit != nil {
		edit(&cfg)
	}
	a := budget.New(cfg)
	ctx, stop := context.WithCancel(context.Background())
	go a.Run(ctx)
	t.Cleanup(func() {
		stop()
		cctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		a.Close(cctx)
	})
	select {
	case <-a.Ready():
	case <-time.After(waitFor):
		t.Fatal("no session")
	}
	return a
}

// admin is an operator's session on srv.
func admin(t *testing.T, srv *server.Server) *governor.Client {
	t.Helper()
	c, err := governor.Dial(context.Background(), governor.WithAddr(srv.Addr()), governor.WithAPIKey(govtest.AdminKey))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// node finds an open node by its path of names under the root.
func node(t *testing.T, a *governor.Client, path ...string) *governorpb.Node {
	t.Helper()
	id := int64(1)
	var found *governorpb.Node
	for _, name := range path {
		resp, err := a.Raw().ListChildren(context.Background(), &governorpb.ListChildrenRequest{NodeId: id, PageSize: 1000})
		if err != nil {
			t.Fatal(err)
		}
		found = nil
		for _, n := range resp.GetNodes() {
			if n.GetName() == name && n.GetState() == governorpb.NodeState_NODE_STATE_OPEN {
				found = n
			}
		}
		if found == nil {
			t.Fatalf("no open node %v", path)
		}
		id = found.GetId()
	}
	return found
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	govtest.Eventually(t, waitFor, what, cond)
}

func admit(t *testing.T, a *budget.Admitter, r admission.Request) admission.Ticket {
	t.Helper()
	ctx, cancel := admission.WithWaitTimeout(context.Background(), waitFor)
	defer cancel()
	tk, err := a.Admit(ctx, r)
	if err != nil {
		t.Fatalf("Admit(%+v): %v", r, err)
	}
	return tk
}

func TestSlotsComeFromTheBlock(t *testing.T) {
	srv := govtest.Start(t, func(c *serverconfig.Config) { c.Root.Limits = map[string]int64{"db": 10} })
	a := start(t, srv, govtest.TenantKey, governor.Spec{Name: "pod"}, nil)
	adm := admin(t, srv)
	var tickets []admission.Ticket
	for range 6 {
		tickets = append(tickets, admit(t, a, admission.Request{Class: "db"}))
	}
	root := node(t, adm, govtest.Tenant)
	if held := root.GetHeld()["db"]; held < 6 || held > 10 {
		t.Errorf("the tenant holds %d db slots for 6 requests", held)
	}
	calls := func() float64 { return callsOf(t, srv, "ResizeBlock") }
	before := calls()
	for _, tk := range tickets {
		tk.End(time.Millisecond, false)
	}
	for range 50 { // within the block: no call at all
		admit(t, a, admission.Request{Class: "db"}).End(0, false)
	}
	if got := calls(); got != before {
		t.Errorf("50 requests within the block made %v ResizeBlock calls", got-before)
	}
	// Idle past the linger, the slots go back.
	eventually(t, "idle slots to go back", func() bool { return node(t, adm, govtest.Tenant).GetHeld()["db"] == 0 })
}

// callsOf reads governord's call counter for method from its metrics.
func callsOf(t *testing.T, srv *server.Server, method string) float64 {
	t.Helper()
	return govtest.Metric(t, srv, fmt.Sprintf(`governor_calls_total{code="OK",method=%q}`, method))
}

func TestContentionSendsSlotsThroughTheQueue(t *testing.T) {
	srv := govtest.Start(t, func(c *serverconfig.Config) {
		c.Root.Limits = map[string]int64{"db": 2}
		c.Tenants = append(c.Tenants, serverconfig.TenantConfig{Name: "other", APIKey: "other-key-0123456789", Weight: 1})
	})
	a := start(t, srv, govtest.TenantKey, governor.Spec{Name: "a"}, func(c *budget.Config) { c.Linger = time.Hour })
	b := start(t, srv, "other-key-0123456789", governor.Spec{Name: "b"}, nil)
	// a takes both slots, and keeps them idle (a long linger).
	t1, t2 := admit(t, a, admission.Request{Class: "db"}), admit(t, a, admission.Request{Class: "db"})
	t1.End(0, false)
	t2.End(0, false)
	// b's request queues at governord; a is told, gives its idle slots back,
	// and b gets one promptly.
	began := time.Now()
	tb := admit(t, b, admission.Request{Class: "db"})
	if d := time.Since(began); d > 2*time.Second {
		t.Errorf("b waited %v for a slot a held idle", d)
	}
	tb.End(0, false)
}

func TestReservationsAdmitExactlyTheQuotaAcrossAdmitters(t *testing.T) {
	srv := govtest.Start(t, func(c *serverconfig.Config) { c.Tenants[0].Quotas = map[string]int64{"calls": 200} })
	var admitters []*budget.Admitter
	for i := range 2 {
		admitters = append(admitters, start(t, srv, govtest.TenantKey, governor.Spec{Name: fmt.Sprint("pod-", i)}, nil))
	}
	var admitted, denied atomic.Int64
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := admitters[w%2]
			for range 75 {
				ctx, cancel := admission.WithWaitTimeout(context.Background(), waitFor)
				_, err := a.Admit(ctx, admission.Request{Charges: map[string]int64{"calls": 1}})
				cancel()
				var d *admission.Denial
				switch {
				case err == nil:
					admitted.Add(1)
				case errors.As(err, &d) && d.Cause == admission.CauseQuota:
					denied.Add(1)
				default:
					t.Errorf("admit: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if admitted.Load() != 200 || denied.Load() != 400 {
		t.Errorf("admitted %d and denied %d of 600 against a quota of 200", admitted.Load(), denied.Load())
	}
	for _, a := range admitters {
		a.Settle(context.Background())
	}
	if used := node(t, admin(t, srv), govtest.Tenant).GetUsed()["calls"]; used != 200 {
		t.Errorf("governord counts %d calls spent", used)
	}
}

func TestAnEndedTaskIsDeniedAtOnce(t *testing.T) {
	srv := govtest.Start(t, nil)
	a := start(t, srv, govtest.TenantKey, governor.Spec{Name: "pod"}, func(c *budget.Config) { c.Linger = time.Hour })
	admit(t, a, admission.Request{Class: "db", Charges: map[string]int64{"calls": 1}}).End(0, false)
	adm := admin(t, srv)
	task := node(t, adm, govtest.Tenant, "pod")
	if _, err := adm.Raw().CloseNode(context.Background(), &governorpb.CloseNodeRequest{NodeId: task.GetId()}); err != nil {
		t.Fatal(err)
	}
	// The notice reaches the admitter: local grants stop within 100 ms.
	closed := time.Now()
	eventually(t, "a denial", func() bool {
		_, err := a.Admit(context.Background(), admission.Request{Class: "db"})
		var d *admission.Denial
		return errors.As(err, &d) && d.Cause == admission.CauseTaskEnded
	})
	if d := time.Since(closed); d > 100*time.Millisecond {
		t.Errorf("local grants went on for %v after the task ended", d)
	}
}

func TestCloseGivesEverythingBack(t *testing.T) {
	srv := govtest.Start(t, func(c *serverconfig.Config) {
		c.Root.Limits = map[string]int64{"db": 8}
		c.Tenants[0].Quotas = map[string]int64{"calls": 1000}
	})
	cfg := budget.Config{Task: governor.Spec{Name: "pod"}, Delegate: true, Linger: time.Hour,
		Dial: []governor.Option{governor.WithAddr(srv.Addr()), governor.WithAPIKey(govtest.TenantKey)}}
	a := budget.New(cfg)
	ctx, stop := context.WithCancel(context.Background())
	go a.Run(ctx)
	<-a.Ready()
	for range 5 {
		admit(t, a, admission.Request{Class: "db", Charges: map[string]int64{"calls": 2}}).End(0, false)
	}
	adm := admin(t, srv)
	if v := node(t, adm, govtest.Tenant); v.GetHeld()["db"] == 0 || v.GetReserved()["calls"] == 0 {
		t.Fatalf("before Close: held %v, reserved %v; want a block and a reservation", v.GetHeld(), v.GetReserved())
	}
	stop()
	if err := a.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	v := node(t, adm, govtest.Tenant)
	if v.GetHeld()["db"] != 0 || v.GetReserved()["calls"] != 0 || v.GetUsed()["calls"] != 10 {
		t.Errorf("after Close: held %v, reserved %v, used %v; want nothing held or reserved and 10 spent",
			v.GetHeld(), v.GetReserved(), v.GetUsed())
	}
}

func TestDelegationOff(t *testing.T) {
	srv := govtest.Start(t, func(c *serverconfig.Config) { c.Tenants[0].Quotas = map[string]int64{"calls": 3} })
	a := start(t, srv, govtest.TenantKey, governor.Spec{Name: "pod"}, func(c *budget.Config) { c.Delegate = false })
	adm := admin(t, srv)
	tk := admit(t, a, admission.Request{Class: "db", Charges: map[string]int64{"calls": 1}})
	if v := node(t, adm, govtest.Tenant); v.GetHeld()["db"] != 1 || v.GetUsed()["calls"] != 1 || len(v.GetReserved()) != 0 {
		t.Errorf("one request without delegation: held %v used %v reserved %v", v.GetHeld(), v.GetUsed(), v.GetReserved())
	}
	tk.End(0, false)
	eventually(t, "the release", func() bool { return node(t, adm, govtest.Tenant).GetHeld()["db"] == 0 })
	admit(t, a, admission.Request{Charges: map[string]int64{"calls": 2}})
	_, err := a.Admit(context.Background(), admission.Request{Charges: map[string]int64{"calls": 1}})
	var d *admission.Denial
	if !errors.As(err, &d) || d.Cause != admission.CauseQuota || d.Quota == nil || d.Quota.Used != 3 {
		t.Errorf("past the quota: %v", err)
	}
}

// A charge of several units beyond what the reservation holds is decided at
// once: refused for the quota when the quota cannot hold it (it used to
// wait out the whole wait timeout, topping the reservation up a share at a
// time while its own units were recalled), admitted when it can.
func TestALargeChargeIsDecidedAtOnce(t *testing.T) {
	srv := govtest.Start(t, func(c *serverconfig.Config) { c.Root.Limits = map[string]int64{"db": 10} })
	a := start(t, srv, govtest.TenantKey, governor.Spec{Name: "pod", Quotas: map[string]int64{"w": 3}}, nil)
	admit(t, a, admission.Request{Charges: map[string]int64{"w": 1}})
	ctx, cancel := admission.WithWaitTimeout(context.Background(), waitFor)
	defer cancel()
	began := time.Now()
	_, err := a.Admit(ctx, admission.Request{Class: "db", Charges: map[string]int64{"w": 3}})
	if d := admission.Deny(ctx, err, "db", waitFor); err == nil || d.Cause != admission.CauseQuota {
		t.Fatalf("a charge of 3 with 2 units left: %v, want the quota's denial", err)
	}
	if took := time.Since(began); took > 2*time.Second {
		t.Errorf("the denial took %v", took)
	}
	admit(t, a, admission.Request{Class: "db", Charges: map[string]int64{"w": 2}}).End(time.Millisecond, false)
	if _, err := a.Admit(ctx, admission.Request{Charges: map[string]int64{"w": 1}}); err == nil {
		t.Fatal("a fourth unit was admitted")
	}
	if used := node(t, admin(t, srv), govtest.Tenant, "pod").GetUsed()["w"]; used != 3 {
		t.Errorf("the task used %d units, want 3", used)
	}
}
