package engine

import (
	"errors"
	"reflect"
	"testing"
)

// Suspending a tenant refuses all its new work at once (charges, leases,
// delegated growth, reservations, nodes) and fails its queued acquires,
// but leaves its running leases alone; read_only refuses only writes;
// closing refuses only new tasks; revoke ends the leases. Every change is
// audited with who and why, and a restore and a replay give it back.
func TestTenantStates(t *testing.T) {
	f := newFixture(t)
	f.setCaps(f.job, CapsEdit{Limits: map[string]int64{"db": 1}})
	admin := f.open(RootID, longTTL)
	running := f.acquire(f.sA, f.job, "db")
	queued := f.enqueue(f.sA, f.job, "db")

	if _, err := f.e.SetTenantState(f.sA, f.acme, Suspended, "self", false, ""); !errors.Is(err, ErrPermission) {
		t.Fatalf("a tenant suspending itself: %v", err)
	}
	if _, err := f.e.SetTenantState(admin, f.job, Suspended, "", false, ""); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a task's state: %v", err)
	}
	v, err := f.e.SetTenantState(admin, f.acme, Suspended, "incident 9", false, "r1")
	if err != nil || v.TenantState != Suspended || v.TenantStateReason != "incident 9" {
		t.Fatalf("suspend: %+v %v", v, err)
	}
	if o := <-queued.C; !errors.Is(o.Err, ErrTenantState) {
		t.Fatalf("the queued acquire ended with %v, want the tenant's state", o.Err)
	}
	var te *TenantStateError
	for what, err := range map[string]error{
		"consume": f.e.Consume(f.sA, f.job, "tokens", 1, ""),
		"acquire": func() error { _, _, err := f.e.Acquire(f.sA, AcquireRequest{Node: f.job2, Class: "db"}); return err }(),
		"block":   func() error { _, err := f.e.Block(f.sA, BlockRequest{Node: f.job2, Class: "db", Want: 2}); return err }(),
		"reserve": func() error {
			_, err := f.e.Reserve(f.sA, ReserveRequest{Node: f.job2, Resource: "tokens", Want: 2})
			return err
		}(),
		"create": func() error { _, err := f.e.CreateNode(f.sA, f.acme, NodeSpec{Name: "new"}, ""); return err }(),
	} {
		if !errors.As(err, &te) || te.State != Suspended || te.Tenant != "acme" || te.Reason != "incident 9" {
			t.Errorf("%s while suspended: %v", what, err)
		}
	}
	if _, err := f.e.Validate(f.sA, running); err != nil {
		t.Fatalf("the running lease after a suspension without revoke: %v", err)
	}
	// Another tenant is untouched.
	f.consume(f.sB, f.otherJob, "tokens", 1)

	// read_only: reads go on, writes are refused.
	if _, err := f.e.SetTenantState(admin, f.acme, ReadOnly, "migration", false, ""); err != nil {
		t.Fatal(err)
	}
	f.consume(f.sA, f.job2, "tokens", 1)
	if _, _, err := f.e.Acquire(f.sA, AcquireRequest{Node: f.job2, Class: "http"}); err != nil {
		t.Fatalf("a read while read_only: %v", err)
	}
	if _, _, err := f.e.Acquire(f.sA, AcquireRequest{Node: f.job2, Class: "http", Write: true}); !errors.As(err, &te) || te.What != "a write" {
		t.Fatalf("a write while read_only: %v", err)
	}
	// closing: no new task, but a subtask of a task that runs.
	if _, err := f.e.SetTenantState(admin, f.acme, Closing, "retire", false, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := f.e.CreateNode(f.sA, f.acme, NodeSpec{Name: "new"}, ""); !errors.As(err, &te) || te.What != "a new task" {
		t.Fatalf("a new task while closing: %v", err)
	}
	f.create(f.sA, f.job, NodeSpec{Name: "sub"})
	// Suspended with revoke: the running lease ends as revoked.
	if _, err := f.e.SetTenantState(admin, f.acme, Suspended, "breach", true, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := f.e.Validate(f.sA, running); !errors.Is(err, ErrLeaseRevoked) {
		t.Fatalf("the running lease after a revoke: %v", err)
	}
	changes, _, err := f.e.CapsHistory(admin, f.acme)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range changes {
		if c.NewState != "" {
			got = append(got, c.Who+":"+c.OldState+">"+c.NewState+":"+c.Reason)
		}
	}
	want := []string{"admin:active>suspended:incident 9", "admin:suspended>read_only:migration", "admin:read_only>closing:retire", "admin:closing>suspended:breach"}
	if len(got) != len(want) || got[0] != want[0] || got[3] != want[3] || !changes[len(changes)-1].Revoked {
		t.Fatalf("audit trail %v, want %v", got, want)
	}
	for _, way := range []string{wayRestore, wayReplay} {
		e := f.rebuild(t, way)
		v, err := e.Get(System, f.acme)
		if err != nil || v.TenantState != Suspended || v.TenantStateReason != "breach" {
			t.Fatalf("%s: %+v %v", way, v, err)
		}
		if _, err := e.Validate(f.sA, running); !errors.Is(err, ErrLeaseRevoked) {
			t.Fatalf("%s: the revoked lease: %v", way, err)
		}
	}
	// Active again: work goes on.
	if _, err := f.e.SetTenantState(admin, f.acme, Active, "resolved", false, ""); err != nil {
		t.Fatal(err)
	}
	f.consume(f.sA, f.job, "tokens", 1)
}

// A read_only tenant's delegated budgets say so: its blocks still grow and
// its reservations still fill (for reads), and each answer carries the
// refusal a write gets, so that a holder refuses writes from them. Going
// read_only and leaving it both recall what is delegated below the tenant,
// so that every holder tops up and learns the new state; a retried answer
// says the state at the retry.
func TestReadOnlyMarksDelegatedBudgets(t *testing.T) {
	f, log := delegationFixture(t)
	admin := f.open(RootID, longTTL)
	if g := f.block(f.sA, f.job, "db", 2, 0); g.ReadOnly != nil {
		t.Fatalf("a block of an active tenant: %+v", g)
	}
	if r := f.reserve(f.sA, ReserveRequest{Node: f.job, Resource: "tokens", Want: 4}); r.ReadOnly != nil {
		t.Fatalf("a reservation of an active tenant: %+v", r)
	}
	log.take()
	if _, err := f.e.SetTenantState(admin, f.acme, ReadOnly, "migration", false, ""); err != nil {
		t.Fatal(err)
	}
	recall := []Notice{{Session: f.sA, Kind: NoticeRecall, Node: f.acme}}
	if got := log.take(); !reflect.DeepEqual(got, recall) {
		t.Fatalf("notices when the tenant went read_only: %+v, want %+v", got, recall)
	}
	want := &TenantStateError{Tenant: "acme", State: ReadOnly, Reason: "migration", What: "a write"}
	g, err := f.e.Block(f.sA, BlockRequest{Node: f.job, Class: "db", Want: 1, RequestID: "b1"})
	if err != nil || g.Granted != 1 || !reflect.DeepEqual(g.ReadOnly, want) {
		t.Fatalf("a block's growth while read_only: %+v %v, want one slot and %+v", g, err, want)
	}
	if g := f.block(f.sA, f.job, "db", 0, 1); !reflect.DeepEqual(g.ReadOnly, want) {
		t.Fatalf("a block's shrink while read_only: %+v", g)
	}
	r, err := f.e.Reserve(f.sA, ReserveRequest{Node: f.step, Resource: "tokens", Want: 2, RequestID: "r1"})
	if err != nil || r.Granted == 0 || !reflect.DeepEqual(r.ReadOnly, want) {
		t.Fatalf("a reservation while read_only: %+v %v, want units and %+v", r, err, want)
	}
	if r := f.reserve(f.sB, ReserveRequest{Node: f.otherJob, Resource: "tokens", Want: 2}); r.ReadOnly != nil {
		t.Fatalf("another tenant's reservation: %+v", r)
	}
	log.take()
	if _, err := f.e.SetTenantState(admin, f.acme, Active, "done", false, ""); err != nil {
		t.Fatal(err)
	}
	if got := log.take(); !reflect.DeepEqual(got, recall) {
		t.Fatalf("notices when the tenant left read_only: %+v, want %+v", got, recall)
	}
	if g := f.block(f.sA, f.job, "db", 1, 0); g.ReadOnly != nil {
		t.Fatalf("a block's growth after resuming: %+v", g)
	}
	// Retries answer with the state now, as Contended does.
	if g, err := f.e.Block(f.sA, BlockRequest{Node: f.job, Class: "db", Want: 1, RequestID: "b1"}); err != nil || g.ReadOnly != nil {
		t.Fatalf("a retried growth after resuming: %+v %v", g, err)
	}
	if r, err := f.e.Reserve(f.sA, ReserveRequest{Node: f.step, Resource: "tokens", Want: 2, RequestID: "r1"}); err != nil || r.ReadOnly != nil {
		t.Fatalf("a retried reservation after resuming: %+v %v", r, err)
	}
	// Leaving suspended recalls nothing: a suspended tenant was refused
	// every top-up, so its holders come back anyway.
	if _, err := f.e.SetTenantState(admin, f.acme, Suspended, "", false, ""); err != nil {
		t.Fatal(err)
	}
	log.take()
	if _, err := f.e.SetTenantState(admin, f.acme, Active, "", false, ""); err != nil {
		t.Fatal(err)
	}
	if got := log.take(); len(got) != 0 {
		t.Fatalf("notices when the tenant left suspended: %+v", got)
	}
}
