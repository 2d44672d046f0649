package budget_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/proxy/admission"
	"github.com/governor-project/governor/proxy/budget"
	"github.com/governor-project/governor/server/serverconfig"
)

// holdReply holds, once armed, the reply to the next growth call (a
// ResizeBlock or a Reserve that wants more) after governord has answered
// it: a top-up in flight while the tenant's state changes.
type holdReply struct {
	mu      sync.Mutex
	method  string        // the armed method's name; "" when not armed
	held    chan struct{} // closed once a reply is held
	release chan struct{} // closed to let it through
}

func (h *holdReply) arm(method string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.method, h.held, h.release = method, make(chan struct{}), make(chan struct{})
}

func (h *holdReply) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	w, ok := req.(interface{ GetWant() int64 })
	h.mu.Lock()
	hold := h.method != "" && strings.HasSuffix(method, "/"+h.method) && ok && w.GetWant() > 0
	held, release := h.held, h.release
	if hold {
		h.method = ""
	}
	h.mu.Unlock()
	if hold {
		close(held)
		<-release
	}
	return err
}

// readOnlyAdmitter starts governord and an admitter whose growth replies
// h can hold, and returns a function that sets the tenant's state and
// waits until the admitter has acted on the recall the change sends.
func readOnlyAdmitter(t *testing.T, h *holdReply) (*budget.Admitter, func(state string)) {
	t.Helper()
	srv := govtest.Start(t, nil)
	m := budget.NewMetrics()
	a := start(t, srv, govtest.TenantKey, governor.Spec{Name: "pod"}, func(c *budget.Config) {
		c.Metrics = m
		c.Linger = time.Hour // nothing goes back for idleness: only the recall takes it
		c.Dial = append(c.Dial, governor.WithGRPCOptions(grpc.WithChainUnaryInterceptor(h.intercept)))
	})
	reg := prometheus.NewRegistry()
	if err := m.Register(reg, a); err != nil {
		t.Fatal(err)
	}
	recalls := func() float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "governor_proxy_notices_total" {
				continue
			}
			for _, s := range mf.GetMetric() {
				if s.GetLabel()[0].GetValue() == "recall" {
					return s.GetCounter().GetValue()
				}
			}
		}
		return 0
	}
	adm := admin(t, srv)
	tenant := node(t, adm, govtest.Tenant)
	return a, func(state string) {
		t.Helper()
		before := recalls()
		if _, err := adm.Raw().SetTenantState(context.Background(), &governorpb.SetTenantStateRequest{NodeId: tenant.GetId(), State: state, Reason: "test"}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the recall at "+state, func() bool { return recalls() > before })
	}
}

// wantReadOnly admits r, a write, and wants it refused as a read-only
// tenant's, with governord's words.
func wantReadOnly(t *testing.T, a *budget.Admitter, r admission.Request) {
	t.Helper()
	if tk, ok := a.TryAdmit(r); ok {
		if tk != nil {
			tk.End(0, false)
		}
		t.Fatalf("TryAdmit admitted a write of a read-only tenant: %+v", r)
	}
	ctx, cancel := admission.WithWaitTimeout(context.Background(), waitFor)
	defer cancel()
	tk, err := a.Admit(ctx, r)
	if err == nil {
		if tk != nil {
			tk.End(0, false)
		}
		t.Fatalf("Admit admitted a write of a read-only tenant: %+v", r)
	}
	d := admission.Deny(ctx, err, r.Class, 0)
	if d.Cause != admission.CauseReadOnly || d.Tenant == nil || d.Tenant.Tenant != govtest.Tenant || d.Tenant.Refused != "a write" ||
		!strings.Contains(d.Message(), "read-only") {
		t.Fatalf("a write of a read-only tenant: %v (%+v), want refused as read-only", err, d)
	}
}

// A block's growth answered before the tenant went read_only, and arriving
// after the recall that the change sent, is stale: its slots go back, and
// no write is granted from them; the next growth says the tenant is
// read-only, and reads go on. Resuming (and its recall) lets writes in.
func TestStaleGrowthGrantsNoWrite(t *testing.T) {
	h := &holdReply{}
	a, setState := readOnlyAdmitter(t, h)
	var running []admission.Ticket
	for range 4 { // a block of at least 4 slots, all in use
		running = append(running, admit(t, a, admission.Request{Class: "db"}))
	}
	h.arm("ResizeBlock")
	type result struct {
		tk  admission.Ticket
		err error
	}
	grown := make(chan result)
	// A read that grows the block; governord answers it while the tenant
	// is active, and the answer is held back.
	go func() {
		ctx, cancel := admission.WithWaitTimeout(context.Background(), waitFor)
		defer cancel()
		tk, err := a.Admit(ctx, admission.Request{Class: "db"})
		grown <- result{tk, err}
	}()
	<-h.held
	setState("read_only")
	close(h.release)
	r := <-grown
	if r.err != nil {
		t.Fatalf("the read that grew the block: %v", r.err)
	}
	running = append(running, r.tk)
	wantReadOnly(t, a, admission.Request{Class: "db", Write: true})
	running = append(running, admit(t, a, admission.Request{Class: "db"}))
	setState("active")
	running = append(running, admit(t, a, admission.Request{Class: "db", Write: true}))
	for _, tk := range running {
		tk.End(0, false)
	}
}

// The same for a reservation's top-up: units reserved before the tenant
// went read_only, arriving after the recall, go back unspent, and a write
// that charges the resource is refused; reads still spend.
func TestStaleReservationGrantsNoWrite(t *testing.T) {
	h := &holdReply{}
	a, setState := readOnlyAdmitter(t, h)
	charge := map[string]int64{"calls": 1}
	admit(t, a, admission.Request{Charges: charge}) // reserves 2, spends 1
	h.arm("Reserve")
	admit(t, a, admission.Request{Charges: charge}) // spends the last, and refills in the background
	<-h.held
	setState("read_only")
	close(h.release)
	wantReadOnly(t, a, admission.Request{Charges: charge, Write: true})
	admit(t, a, admission.Request{Charges: charge})
	setState("active")
	admit(t, a, admission.Request{Charges: charge, Write: true})
}

// Units a request held when the recall came (taken, waiting for its slot)
// go back to governord if it is refused after all, rather than into the
// reservation: so no write is granted from them before a top-up has said
// the tenant is read-only.
func TestUnitsHeldAcrossARecallGoBack(t *testing.T) {
	h := &holdReply{}
	a, setState := readOnlyAdmitter(t, h)
	var running []admission.Ticket
	for range 4 { // a block of at least 4 slots, all in use
		running = append(running, admit(t, a, admission.Request{Class: "db"}))
	}
	charge := map[string]int64{"calls": 1}
	for range 3 { // reserves 2, then 4 more: 3 unspent, and no refill due
		admit(t, a, admission.Request{Charges: charge})
	}
	h.arm("ResizeBlock")
	ctx, cancel := context.WithCancel(context.Background())
	refused := make(chan error)
	go func() { // takes a unit, then waits for the block to grow
		_, err := a.Admit(ctx, admission.Request{Class: "db", Charges: charge, Write: true})
		refused <- err
	}()
	<-h.held
	setState("read_only")
	cancel() // the client goes away: its unit is freed after the recall
	if err := <-refused; err == nil {
		t.Fatal("a canceled request was admitted")
	}
	close(h.release)
	wantReadOnly(t, a, admission.Request{Charges: charge, Write: true})
	for _, tk := range running {
		tk.End(0, false)
	}
}

// With delegation off, a metered call (held charges) that is a write is
// refused for a read-only tenant too: the exact hold says so.
func TestHeldWriteOfAReadOnlyTenant(t *testing.T) {
	srv := govtest.Start(t, nil)
	a := start(t, srv, govtest.TenantKey, governor.Spec{Name: "pod"}, func(c *budget.Config) { c.Delegate = false })
	adm := admin(t, srv)
	if _, err := adm.Raw().SetTenantState(context.Background(), &governorpb.SetTenantStateRequest{NodeId: node(t, adm, govtest.Tenant).GetId(), State: "read_only"}); err != nil {
		t.Fatal(err)
	}
	for _, class := range []string{"", "llm"} {
		r := admission.Request{Class: class, Charges: map[string]int64{"tokens": 100}, Held: true, Write: true}
		ctx, cancel := admission.WithWaitTimeout(context.Background(), waitFor)
		_, err := a.Admit(ctx, r)
		cancel()
		var d *admission.Denial
		if !errors.As(err, &d) || d.Cause != admission.CauseReadOnly {
			t.Fatalf("a held write (class %q) of a read-only tenant: %v", class, err)
		}
		r.Write = false
		tk := admit(t, a, r)
		tk.(admission.Settler).Settle(map[string]int64{"tokens": 10})
		tk.End(0, false)
	}
	// Settled in the background: the reads' 10 each spent, and every hold
	// back, the refused writes' too.
	eventually(t, "the holds settled", func() bool {
		n := node(t, adm, govtest.Tenant)
		return n.GetUsed()["tokens"] == 20 && n.GetReserved()["tokens"] == 0
	})
}

// A write that must queue at governord for a slot (the block cannot grow)
// is marked as one there, so a read-only tenant's is refused at once
// rather than after its wait.
func TestQueuedWriteOfAReadOnlyTenant(t *testing.T) {
	srv := govtest.Start(t, func(c *serverconfig.Config) { c.Root.Limits = map[string]int64{"db": 1} })
	a := start(t, srv, govtest.TenantKey, governor.Spec{Name: "pod"}, nil)
	adm := admin(t, srv)
	if _, err := adm.Raw().SetTenantState(context.Background(), &governorpb.SetTenantStateRequest{NodeId: node(t, adm, govtest.Tenant).GetId(), State: "read_only"}); err != nil {
		t.Fatal(err)
	}
	running := admit(t, a, admission.Request{Class: "db"}) // the only slot
	defer running.End(0, false)
	ctx, cancel := admission.WithWaitTimeout(context.Background(), 5*time.Second)
	defer cancel()
	began := time.Now()
	_, err := a.Admit(ctx, admission.Request{Class: "db", Write: true})
	var d *admission.Denial
	if !errors.As(err, &d) || d.Cause != admission.CauseReadOnly {
		t.Fatalf("a write waiting for a slot of a read-only tenant: %v", err)
	}
	if waited := time.Since(began); waited > 2*time.Second {
		t.Errorf("the write was refused after %v, not at once", waited)
	}
}
