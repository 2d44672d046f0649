package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// Unit tests of the engine's contract, one behaviour at a time, on a fake
// clock. They need no goroutines: a Wait's channel is buffered, so a test
// reads an outcome with outcome. A test that shows an engine bug not yet
// fixed checks the right behaviour and skips with "BUG:" (knownBug) where it
// is missing, so the suite stays green and starts checking once it is fixed.

const (
	testTTL = 10 * time.Second
	longTTL = time.Hour
	noSuch  = 999 // an id that names nothing
)

// sentinels is every sentinel error; an engine error wraps exactly one.
var sentinels = []error{ErrInvalid, ErrNotFound, ErrPermission, ErrUnauthenticated, ErrSessionExpired,
	ErrTaskEnded, ErrQuotaExhausted, ErrLeaseExpired, ErrLeaseRevoked, ErrLeaseReleased,
	ErrRequestIDReused, ErrExists, ErrRecalling, ErrCorrupt, ErrBound, ErrTenantState, ErrRateLimited}

// fixture is an engine on a fake clock. newFixture gives it this tree, with
// one long-lived session per tenant:
//
//	root
//	├── acme          tenant, session sA ("token-1")
//	│   ├── job       task
//	│   │   └── step  subtask
//	│   └── job2      task
//	└── other         tenant, session sB ("token-2")
//	    └── otherJob  task
type fixture struct {
	t      *testing.T
	clock  *fakeClock
	rec    *recorder
	cfg    Config
	e      *Engine
	tokens int

	acme, job, step, job2, other, otherJob NodeID
	sA, sB                                 SessionID
}

func newBareFixture(t *testing.T, adaptive ...Adaptive) *fixture {
	t.Helper()
	f := &fixture{t: t, clock: newFakeClock(), rec: &recorder{}}
	f.cfg = Config{Clock: f.clock, Sink: f.rec, Adaptive: adaptive}
	e, err := New(f.cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	f.e = e
	return f
}

func newFixture(t *testing.T, adaptive ...Adaptive) *fixture {
	t.Helper()
	f := newBareFixture(t, adaptive...)
	f.acme = f.create(System, RootID, NodeSpec{Name: "acme"})
	f.job = f.create(System, f.acme, NodeSpec{Name: "job"})
	f.step = f.create(System, f.job, NodeSpec{Name: "step"})
	f.job2 = f.create(System, f.acme, NodeSpec{Name: "job2"})
	f.other = f.create(System, RootID, NodeSpec{Name: "other"})
	f.otherJob = f.create(System, f.other, NodeSpec{Name: "otherJob"})
	f.sA = f.open(f.acme, longTTL)
	f.sB = f.open(f.other, longTTL)
	return f
}

// names maps the fixture's node names to their ids.
func (f *fixture) names() map[string]NodeID {
	return map[string]NodeID{"root": RootID, "acme": f.acme, "job": f.job, "step": f.step,
		"job2": f.job2, "other": f.other, "otherJob": f.otherJob}
}

// sessionFor is the fixture's session whose scope holds id.
func (f *fixture) sessionFor(id NodeID) SessionID {
	if id == f.other || id == f.otherJob {
		return f.sB
	}
	return f.sA
}

func (f *fixture) now() int64 { return f.clock.Now().UnixNano() }

func (f *fixture) create(sid SessionID, parent NodeID, spec NodeSpec) NodeID {
	f.t.Helper()
	v, err := f.e.CreateNode(sid, parent, spec, "")
	if err != nil {
		f.t.Fatalf("CreateNode(%d, %d, %q): %v", sid, parent, spec.Name, err)
	}
	return v.ID
}

func (f *fixture) open(scope NodeID, ttl time.Duration) SessionID {
	f.t.Helper()
	f.tokens++
	id, err := f.e.OpenSession(scope, fmt.Sprintf("token-%d", f.tokens), ttl)
	if err != nil {
		f.t.Fatalf("OpenSession(%d): %v", scope, err)
	}
	return id
}

func (f *fixture) setCaps(id NodeID, edit CapsEdit) {
	f.t.Helper()
	if _, err := f.e.SetCaps(System, id, edit, ""); err != nil {
		f.t.Fatalf("SetCaps(%d): %v", id, err)
	}
}

func (f *fixture) consume(sid SessionID, id NodeID, resource string, amount int64) {
	f.t.Helper()
	if err := f.e.Consume(sid, id, resource, amount, ""); err != nil {
		f.t.Fatalf("Consume(%d, %d, %s, %d): %v", sid, id, resource, amount, err)
	}
}

// acquire takes a lease that must be granted at once.
func (f *fixture) acquire(sid SessionID, id NodeID, class string) LeaseID {
	f.t.Helper()
	g, w, err := f.e.Acquire(sid, AcquireRequest{Node: id, Class: class})
	if err != nil || w != nil || g.Lease == 0 {
		f.t.Fatalf("Acquire(%d, %d, %s) = %+v, queued %v, %v; want a grant", sid, id, class, g, w != nil, err)
	}
	return g.Lease
}

// enqueue asks for a lease that must queue.
func (f *fixture) enqueue(sid SessionID, id NodeID, class string) *Wait {
	f.t.Helper()
	g, w, err := f.e.Acquire(sid, AcquireRequest{Node: id, Class: class})
	if err != nil || w == nil {
		f.t.Fatalf("Acquire(%d, %d, %s) = %+v, %v; want it queued", sid, id, class, g, err)
	}
	return w
}

func (f *fixture) release(sid SessionID, id LeaseID) {
	f.t.Helper()
	if err := f.e.Release(sid, id, 0, false, ""); err != nil {
		f.t.Fatalf("Release(%d, %d): %v", sid, id, err)
	}
}

func (f *fixture) node(id NodeID) NodeView {
	f.t.Helper()
	v, err := f.e.Get(System, id)
	if err != nil {
		f.t.Fatalf("Get(%d): %v", id, err)
	}
	return v
}

// leases lists the live leases of e.
func leases(e *Engine) []LeaseID {
	var out []LeaseID
	for _, l := range e.Snapshot().Leases {
		out = append(out, l.ID)
	}
	return out
}

// Ways to build a second engine from the first one's record.
const (
	wayLive    = "live"
	wayRestore = "snapshot and restore"
	wayReplay  = "replay of every event"
)

// rebuild returns f's engine (wayLive) or a new one rebuilt from it, going
// through JSON as a store would.
func (f *fixture) rebuild(t *testing.T, way string) *Engine {
	t.Helper()
	if way == wayLive {
		return f.e
	}
	e, err := New(Config{Clock: f.clock, Adaptive: f.cfg.Adaptive})
	if err != nil {
		t.Fatal(err)
	}
	switch way {
	case wayRestore:
		err = e.Restore(cloneSnapshot(t, f.e.Snapshot()))
	case wayReplay:
		var events []Event
		jsonCopy(t, f.rec.events, &events)
		err = e.Apply(events...)
	default:
		t.Fatalf("unknown way %q", way)
	}
	if err != nil {
		t.Fatalf("%s: %v", way, err)
	}
	return e
}

func jsonCopy(t *testing.T, in, out any) {
	t.Helper()
	raw, err := json.Marshal(in)
	if err == nil {
		err = json.Unmarshal(raw, out)
	}
	if err != nil {
		t.Fatalf("JSON round trip: %v", err)
	}
}

func cloneSnapshot(t *testing.T, s Snapshot) Snapshot {
	t.Helper()
	var out Snapshot
	jsonCopy(t, s, &out)
	return out
}

// unchanged runs call and fails t if the engine's state moved: no event, the
// same sequence number and a deep-equal snapshot. It returns call's error.
func unchanged(t *testing.T, e *Engine, call func() error) error {
	t.Helper()
	seq, before := e.Seq(), e.Snapshot()
	err := call()
	if got := e.Seq(); got != seq {
		t.Errorf("Seq moved from %d to %d (err %v)", seq, got, err)
	}
	if after := e.Snapshot(); !reflect.DeepEqual(after, before) {
		t.Errorf("state changed (err %v):\n%s", err, diffSnapshots(before, after))
	}
	return err
}

// wantErr checks that err wraps want, and no other sentinel. A nil want
// wants no error.
func wantErr(t *testing.T, err, want error) {
	t.Helper()
	if want == nil {
		if err != nil {
			t.Errorf("unexpected error: %v", err)
		}
		return
	}
	if !errors.Is(err, want) {
		t.Errorf("error %v, want %v", err, want)
		return
	}
	for _, s := range sentinels {
		if s != want && errors.Is(err, s) {
			t.Errorf("error %v wraps %v as well as %v", err, s, want)
		}
	}
}

// outcome returns a Wait's outcome if it has one, without blocking.
func outcome(w *Wait) (Outcome, bool) {
	select {
	case o := <-w.C:
		return o, true
	default:
		return Outcome{}, false
	}
}

func noOutcome(t *testing.T, w *Wait, what string) {
	t.Helper()
	if o, ok := outcome(w); ok {
		t.Fatalf("%s: got outcome %+v, want it still waiting", what, o)
	}
}

func granted(t *testing.T, w *Wait, what string) Grant {
	t.Helper()
	o, ok := outcome(w)
	if !ok || o.Err != nil || o.Grant.Lease == 0 {
		t.Fatalf("%s: outcome %+v (present %v), want a grant", what, o, ok)
	}
	return o.Grant
}

// knownBug skips a test at the point where it shows an engine bug that is
// not fixed yet. Delete the call when the bug is fixed.
func knownBug(t *testing.T, format string, args ...any) {
	t.Helper()
	t.Fatalf("BUG: "+format, args...)
}

func ptr(v int64) *int64 { return &v }

// 1. Bad input.

func TestBadInputIsRefusedAndChangesNothing(t *testing.T) {
	long := strings.Repeat("x", MaxNameLen+1)
	acquire := func(f *fixture, sid SessionID, r AcquireRequest) error {
		_, _, err := f.e.Acquire(sid, r)
		return err
	}
	create := func(f *fixture, sid SessionID, parent NodeID, spec NodeSpec, rid string) error {
		_, err := f.e.CreateNode(sid, parent, spec, rid)
		return err
	}
	caps := func(f *fixture, sid SessionID, id NodeID, edit CapsEdit, rid string) error {
		_, err := f.e.SetCaps(sid, id, edit, rid)
		return err
	}
	end := func(f *fixture, sid SessionID, id NodeID, st State, rid string) error {
		_, err := f.e.EndNode(sid, id, st, rid)
		return err
	}
	q := func(k string, v int64) map[string]int64 { return map[string]int64{k: v} }
	tests := []struct {
		name string
		call func(f *fixture, lease LeaseID) error
		want error
	}{
		{"consume on an unknown node", func(f *fixture, _ LeaseID) error { return f.e.Consume(System, noSuch, "tokens", 1, "") }, ErrNotFound},
		{"consume of zero", func(f *fixture, _ LeaseID) error { return f.e.Consume(f.sA, f.job, "tokens", 0, "") }, ErrInvalid},
		{"consume of a negative amount", func(f *fixture, _ LeaseID) error { return f.e.Consume(f.sA, f.job, "tokens", -3, "") }, ErrInvalid},
		{"consume of an empty resource", func(f *fixture, _ LeaseID) error { return f.e.Consume(f.sA, f.job, "", 1, "") }, ErrInvalid},
		{"consume of an over-long resource", func(f *fixture, _ LeaseID) error { return f.e.Consume(f.sA, f.job, long, 1, "") }, ErrInvalid},
		{"consume of a resource with NUL", func(f *fixture, _ LeaseID) error { return f.e.Consume(f.sA, f.job, "tok\x00ens", 1, "") }, ErrInvalid},
		{"consume overflowing usage", func(f *fixture, _ LeaseID) error { return f.e.Consume(f.sA, f.job, "tokens", math.MaxInt64, "") }, ErrInvalid},
		{"consume by an unknown session", func(f *fixture, _ LeaseID) error { return f.e.Consume(noSuch, f.job, "tokens", 1, "") }, ErrUnauthenticated},
		{"consume reusing an id with another amount", func(f *fixture, _ LeaseID) error { return f.e.Consume(f.sA, f.job, "tokens", 2, "rid-1") }, ErrRequestIDReused},
		{"consume reusing an id on another node", func(f *fixture, _ LeaseID) error { return f.e.Consume(f.sA, f.step, "tokens", 1, "rid-1") }, ErrRequestIDReused},

		{"acquire on an unknown node", func(f *fixture, _ LeaseID) error { return acquire(f, f.sA, AcquireRequest{Node: noSuch, Class: "db"}) }, ErrNotFound},
		{"acquire with no class and no charges", func(f *fixture, _ LeaseID) error { return acquire(f, f.sA, AcquireRequest{Node: f.job}) }, ErrInvalid},
		{"acquire with no class and empty charges", func(f *fixture, _ LeaseID) error {
			return acquire(f, f.sA, AcquireRequest{Node: f.job, Charges: map[string]int64{}})
		}, ErrInvalid},
		{"acquire with a zero charge", func(f *fixture, _ LeaseID) error {
			return acquire(f, f.sA, AcquireRequest{Node: f.job, Class: "db", Charges: q("tokens", 0)})
		}, ErrInvalid},
		{"acquire with a negative charge", func(f *fixture, _ LeaseID) error {
			return acquire(f, f.sA, AcquireRequest{Node: f.job, Charges: q("tokens", -1)})
		}, ErrInvalid},
		{"acquire charging an empty resource", func(f *fixture, _ LeaseID) error {
			return acquire(f, f.sA, AcquireRequest{Node: f.job, Charges: q("", 1)})
		}, ErrInvalid},
		{"acquire of an over-long class", func(f *fixture, _ LeaseID) error { return acquire(f, f.sA, AcquireRequest{Node: f.job, Class: long}) }, ErrInvalid},
		{"acquire of a class with NUL", func(f *fixture, _ LeaseID) error {
			return acquire(f, f.sA, AcquireRequest{Node: f.job, Class: "d\x00b"})
		}, ErrInvalid},
		{"acquire by the system session", func(f *fixture, _ LeaseID) error { return acquire(f, System, AcquireRequest{Node: f.job, Class: "db"}) }, ErrInvalid},
		{"acquire by an unknown session", func(f *fixture, _ LeaseID) error { return acquire(f, noSuch, AcquireRequest{Node: f.job, Class: "db"}) }, ErrUnauthenticated},
		{"acquire reusing an id", func(f *fixture, _ LeaseID) error {
			return acquire(f, f.sA, AcquireRequest{Node: f.job, Class: "db", RequestID: "rid-1"})
		}, ErrRequestIDReused},

		{"create with an empty name", func(f *fixture, _ LeaseID) error { return create(f, f.sA, f.job, NodeSpec{}, "") }, ErrInvalid},
		{"create with an over-long name", func(f *fixture, _ LeaseID) error { return create(f, f.sA, f.job, NodeSpec{Name: long}, "") }, ErrInvalid},
		{"create with NUL in the name", func(f *fixture, _ LeaseID) error { return create(f, f.sA, f.job, NodeSpec{Name: "a\x00b"}, "") }, ErrInvalid},
		{"create under an unknown node", func(f *fixture, _ LeaseID) error { return create(f, f.sA, noSuch, NodeSpec{Name: "x"}, "") }, ErrNotFound},
		{"create with a quota below NoCap", func(f *fixture, _ LeaseID) error {
			return create(f, f.sA, f.job, NodeSpec{Name: "x", Quotas: q("tokens", -2)}, "")
		}, ErrInvalid},
		{"create with a limit below NoCap", func(f *fixture, _ LeaseID) error {
			return create(f, f.sA, f.job, NodeSpec{Name: "x", Limits: q("db", -2)}, "")
		}, ErrInvalid},
		{"create with a default quota below NoCap", func(f *fixture, _ LeaseID) error {
			return create(f, f.sA, f.job, NodeSpec{Name: "x", DefaultQuotas: q("tokens", math.MinInt64)}, "")
		}, ErrInvalid},
		{"create with a default limit below NoCap", func(f *fixture, _ LeaseID) error {
			return create(f, f.sA, f.job, NodeSpec{Name: "x", DefaultLimits: q("db", -7)}, "")
		}, ErrInvalid},
		{"create with an empty cap name", func(f *fixture, _ LeaseID) error {
			return create(f, f.sA, f.job, NodeSpec{Name: "x", Quotas: q("", 1)}, "")
		}, ErrInvalid},
		{"create with an over-long cap name", func(f *fixture, _ LeaseID) error {
			return create(f, f.sA, f.job, NodeSpec{Name: "x", Limits: q(long, 1)}, "")
		}, ErrInvalid},
		{"create with a negative weight", func(f *fixture, _ LeaseID) error { return create(f, f.sA, f.job, NodeSpec{Name: "x", Weight: -1}, "") }, ErrInvalid},
		{"create with a negative deadline", func(f *fixture, _ LeaseID) error {
			return create(f, f.sA, f.job, NodeSpec{Name: "x", Deadline: -1}, "")
		}, ErrInvalid},
		{"create of a name an open sibling has", func(f *fixture, _ LeaseID) error { return create(f, f.sA, f.acme, NodeSpec{Name: "job"}, "") }, ErrExists},
		{"create by an unknown session", func(f *fixture, _ LeaseID) error { return create(f, noSuch, f.job, NodeSpec{Name: "x"}, "") }, ErrUnauthenticated},
		{"create reusing an id", func(f *fixture, _ LeaseID) error { return create(f, f.sA, f.job, NodeSpec{Name: "x"}, "rid-1") }, ErrRequestIDReused},
		{"find-or-create with an empty name", func(f *fixture, _ LeaseID) error {
			_, _, err := f.e.FindOrCreate(f.sA, f.job, NodeSpec{}, "")
			return err
		}, ErrInvalid},

		{"caps with a quota below NoCap", func(f *fixture, _ LeaseID) error { return caps(f, f.sA, f.job, CapsEdit{Quotas: q("tokens", -2)}, "") }, ErrInvalid},
		{"caps with a limit below NoCap", func(f *fixture, _ LeaseID) error { return caps(f, f.sA, f.job, CapsEdit{Limits: q("db", -5)}, "") }, ErrInvalid},
		{"caps with a default quota below NoCap", func(f *fixture, _ LeaseID) error {
			return caps(f, f.sA, f.job, CapsEdit{DefaultQuotas: q("tokens", -2)}, "")
		}, ErrInvalid},
		{"caps with a default limit below NoCap", func(f *fixture, _ LeaseID) error {
			return caps(f, f.sA, f.job, CapsEdit{DefaultLimits: q("db", -2)}, "")
		}, ErrInvalid},
		{"caps with an empty cap name", func(f *fixture, _ LeaseID) error { return caps(f, f.sA, f.job, CapsEdit{Quotas: q("", 1)}, "") }, ErrInvalid},
		{"caps with NUL in a cap name", func(f *fixture, _ LeaseID) error { return caps(f, f.sA, f.job, CapsEdit{Limits: q("d\x00b", 1)}, "") }, ErrInvalid},
		{"caps with weight zero", func(f *fixture, _ LeaseID) error { return caps(f, f.sA, f.job, CapsEdit{Weight: ptr(0)}, "") }, ErrInvalid},
		{"caps with a negative weight", func(f *fixture, _ LeaseID) error { return caps(f, f.sA, f.job, CapsEdit{Weight: ptr(-4)}, "") }, ErrInvalid},
		{"caps with a negative deadline", func(f *fixture, _ LeaseID) error { return caps(f, f.sA, f.job, CapsEdit{Deadline: ptr(-1)}, "") }, ErrInvalid},
		{"caps on an unknown node", func(f *fixture, _ LeaseID) error {
			return caps(f, System, noSuch, CapsEdit{Quotas: q("tokens", 1)}, "")
		}, ErrNotFound},
		{"caps by an unknown session", func(f *fixture, _ LeaseID) error { return caps(f, noSuch, f.job, CapsEdit{}, "") }, ErrUnauthenticated},
		{"caps reusing an id", func(f *fixture, _ LeaseID) error {
			return caps(f, f.sA, f.job, CapsEdit{Quotas: q("tokens", 1)}, "rid-1")
		}, ErrRequestIDReused},

		{"end as open", func(f *fixture, _ LeaseID) error { return end(f, f.sA, f.job, Open, "") }, ErrInvalid},
		{"end as expired", func(f *fixture, _ LeaseID) error { return end(f, f.sA, f.job, Expired, "") }, ErrInvalid},
		{"end as an unknown state", func(f *fixture, _ LeaseID) error { return end(f, f.sA, f.job, State(42), "") }, ErrInvalid},
		{"end of an unknown node", func(f *fixture, _ LeaseID) error { return end(f, System, noSuch, Cancelled, "") }, ErrNotFound},
		{"end by an unknown session", func(f *fixture, _ LeaseID) error { return end(f, noSuch, f.job, Cancelled, "") }, ErrUnauthenticated},
		{"end reusing an id", func(f *fixture, _ LeaseID) error { return end(f, f.sA, f.job, Cancelled, "rid-1") }, ErrRequestIDReused},

		{"release of an unknown lease", func(f *fixture, _ LeaseID) error { return f.e.Release(f.sA, noSuch, 0, false, "") }, ErrNotFound},
		{"release of lease zero", func(f *fixture, _ LeaseID) error { return f.e.Release(f.sA, 0, 0, false, "") }, ErrNotFound},
		{"release of a negative lease", func(f *fixture, _ LeaseID) error { return f.e.Release(f.sA, -1, 0, false, "") }, ErrNotFound},
		{"release by an unknown session", func(f *fixture, l LeaseID) error { return f.e.Release(noSuch, l, 0, false, "") }, ErrUnauthenticated},
		{"release reusing an id", func(f *fixture, l LeaseID) error { return f.e.Release(f.sA, l, 0, false, "rid-1") }, ErrRequestIDReused},
		{"validate of an unknown lease", func(f *fixture, _ LeaseID) error {
			_, err := f.e.Validate(f.sA, noSuch)
			return err
		}, ErrNotFound},
		{"validate by an unknown session", func(f *fixture, l LeaseID) error {
			_, err := f.e.Validate(noSuch, l)
			return err
		}, ErrUnauthenticated},

		{"heartbeat of an unknown session", func(f *fixture, _ LeaseID) error {
			_, err := f.e.Heartbeat(noSuch)
			return err
		}, ErrUnauthenticated},
		{"close of an unknown session", func(f *fixture, _ LeaseID) error { return f.e.CloseSession(noSuch) }, ErrUnauthenticated},
		{"close of the system session", func(f *fixture, _ LeaseID) error { return f.e.CloseSession(System) }, ErrInvalid},
		{"open with a zero TTL", func(f *fixture, _ LeaseID) error {
			_, err := f.e.OpenSession(f.acme, "fresh", 0)
			return err
		}, ErrInvalid},
		{"open with a negative TTL", func(f *fixture, _ LeaseID) error {
			_, err := f.e.OpenSession(f.acme, "fresh", -time.Second)
			return err
		}, ErrInvalid},
		{"open on an unknown node", func(f *fixture, _ LeaseID) error {
			_, err := f.e.OpenSession(noSuch, "fresh", testTTL)
			return err
		}, ErrNotFound},
		{"open with a token in use", func(f *fixture, _ LeaseID) error {
			_, err := f.e.OpenSession(f.acme, "token-1", testTTL)
			return err
		}, ErrInvalid},

		{"get of an unknown node", func(f *fixture, _ LeaseID) error {
			_, err := f.e.Get(f.sA, noSuch)
			return err
		}, ErrNotFound},
		{"get by an unknown session", func(f *fixture, _ LeaseID) error {
			_, err := f.e.Get(noSuch, f.job)
			return err
		}, ErrUnauthenticated},
		{"children of an unknown node", func(f *fixture, _ LeaseID) error {
			_, err := f.e.Children(System, noSuch, 0, 0)
			return err
		}, ErrNotFound},
		{"adaptive limit of an unknown class", func(f *fixture, _ LeaseID) error {
			_, err := f.e.AdaptiveLimit("db")
			return err
		}, ErrNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			lease := f.acquire(f.sA, f.job, "db")
			if err := f.e.Consume(f.sA, f.job, "tokens", 1, "rid-1"); err != nil {
				t.Fatal(err)
			}
			err := unchanged(t, f.e, func() (err error) {
				defer func() {
					if r := recover(); r != nil {
						t.Fatalf("panicked: %v", r)
					}
				}()
				return tt.call(f, lease)
			})
			wantErr(t, err, tt.want)
		})
	}
}

func TestTreeDepthIsBounded(t *testing.T) {
	f := newBareFixture(t)
	parent := RootID
	for depth := 1; depth < MaxDepth; depth++ {
		parent = f.create(System, parent, NodeSpec{Name: fmt.Sprintf("level%d", depth)})
	}
	if v := f.node(parent); v.Kind != KindSubtask {
		t.Fatalf("the deepest node is a %s, want a subtask", v.Kind)
	}
	for _, find := range []bool{false, true} {
		t.Run(fmt.Sprintf("find=%v", find), func(t *testing.T) {
			err := unchanged(t, f.e, func() error {
				if find {
					_, _, err := f.e.FindOrCreate(System, parent, NodeSpec{Name: "too-deep"}, "")
					return err
				}
				_, err := f.e.CreateNode(System, parent, NodeSpec{Name: "too-deep"}, "")
				return err
			})
			wantErr(t, err, ErrInvalid)
		})
	}
}

// snapshotSource is an engine with a bit of everything: nodes, two sessions
// with tokens, a live lease (1, sA on job) and a tombstone (2, sB's).
func snapshotSource(t *testing.T) (*fixture, Snapshot) {
	f := newFixture(t)
	f.setCaps(f.job, CapsEdit{Quotas: map[string]int64{"tokens": 10}, Deadline: ptr(f.now() + int64(time.Hour))})
	f.consume(f.sA, f.step, "tokens", 3)
	f.acquire(f.sA, f.job, "db")
	f.release(f.sB, f.acquire(f.sB, f.otherJob, "db"))
	snap := f.e.Snapshot()
	if len(snap.Leases) != 1 || len(snap.Tombstones) != 1 || len(snap.Sessions) != 2 {
		t.Fatalf("source snapshot has %d leases, %d tombstones, %d sessions", len(snap.Leases), len(snap.Tombstones), len(snap.Sessions))
	}
	return f, snap
}

func TestSnapshotCorruptIsRefused(t *testing.T) {
	_, good := snapshotSource(t)
	tests := []struct {
		name   string
		mutate func(s *Snapshot)
		// leaks: the failure is found after Restore has already installed
		// part of the snapshot (a known bug, see knownBug below).
		leaks bool
		// accepted: Restore takes this corrupt snapshot (a known bug).
		accepted string
	}{
		{name: "no nodes", mutate: func(s *Snapshot) { s.Nodes = nil }},
		{name: "the first node is not the root", mutate: func(s *Snapshot) { s.Nodes = s.Nodes[1:] }},
		{name: "the root has a parent", mutate: func(s *Snapshot) { s.Nodes[0].Parent = 3 }},
		{name: "a node under an unknown node", mutate: func(s *Snapshot) { s.Nodes[3].Parent = noSuch }},
		{name: "nodes out of order", mutate: func(s *Snapshot) { s.Nodes[1], s.Nodes[2] = s.Nodes[2], s.Nodes[1] }},
		{name: "a node id not below NextNode", mutate: func(s *Snapshot) { s.NextNode = s.Nodes[len(s.Nodes)-1].ID }},
		{name: "a session on an unknown node", mutate: func(s *Snapshot) { s.Sessions[0].Scope = noSuch }},
		{name: "a session without a TTL", mutate: func(s *Snapshot) { s.Sessions[0].TTL = 0 }},
		{name: "a session id not below NextSession", mutate: func(s *Snapshot) { s.NextSession = s.Sessions[0].ID }},
		{name: "a later session is corrupt", mutate: func(s *Snapshot) { s.Sessions[1].Scope = noSuch }, leaks: true},
		{name: "a lease of an unknown session", mutate: func(s *Snapshot) { s.Leases[0].Session = noSuch }, leaks: true},
		{name: "a lease on an unknown node", mutate: func(s *Snapshot) { s.Leases[0].Node = noSuch }, leaks: true},
		{name: "a lease id not below NextLease", mutate: func(s *Snapshot) { s.NextLease = s.Leases[0].ID }, leaks: true},
		{name: "a later lease is corrupt", mutate: func(s *Snapshot) {
			bad := s.Leases[0]
			bad.ID, bad.Session = s.Tombstones[0].Lease, noSuch
			s.Leases = append(s.Leases, bad)
			s.Tombstones = nil
		}, leaks: true},
		{name: "a tombstone id not below NextLease", mutate: func(s *Snapshot) { s.NextLease = s.Tombstones[0].Lease }, leaks: true,
			accepted: "Restore accepts a tombstone whose lease id is not below NextLease, so the next grant reissues that id (a fencing token); check every tombstone id < NextLease (snapshot.go, tombstone loop)"},
		{name: "NextNode not above the root", mutate: func(s *Snapshot) {
			s.Nodes, s.Sessions, s.Leases, s.Tombstones, s.NextNode = s.Nodes[:1], nil, nil, nil, RootID
		}, accepted: "Restore checks v.ID < NextNode only for nodes after the root, so NextNode <= RootID is accepted and the next CreateNode makes a node with the root's id (or 0) and overwrites e.nodes[1]; check the root too (snapshot.go, node loop)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			snap := cloneSnapshot(t, good)
			tt.mutate(&snap)
			f := newBareFixture(t)
			fresh := f.e.Snapshot()
			err := f.e.Restore(snap)
			if err == nil && tt.accepted != "" {
				knownBug(t, "%s", tt.accepted)
			}
			wantErr(t, err, ErrCorrupt)
			var leaks []string
			if f.e.Seq() != 0 {
				leaks = append(leaks, fmt.Sprintf("Seq is %d", f.e.Seq()))
			}
			if got := f.e.Snapshot(); !reflect.DeepEqual(got, fresh) {
				leaks = append(leaks, "snapshot: "+diffSnapshots(fresh, got))
			}
			for _, ss := range good.Sessions {
				if id, _, ok := f.e.SessionByToken(ss.Token); ok {
					leaks = append(leaks, fmt.Sprintf("SessionByToken(%q) finds session %d", ss.Token, id))
				}
			}
			switch {
			case len(leaks) > 0 && tt.leaks:
				knownBug(t, "a failed Restore leaves state behind (%s): snapshot.go Restore writes e.byToken, e.leases and e.deadlines while it is still checking; build them aside and install them only once the whole snapshot checks out", strings.Join(leaks, "; "))
			case len(leaks) > 0:
				t.Errorf("a failed Restore left state behind: %s", strings.Join(leaks, "; "))
			case tt.leaks:
				t.Logf("no longer leaks: drop leaks from this case")
			}
		})
	}
	t.Run("into a used engine", func(t *testing.T) {
		f := newBareFixture(t)
		f.open(RootID, testTTL)
		err := unchanged(t, f.e, func() error { return f.e.Restore(cloneSnapshot(t, good)) })
		wantErr(t, err, ErrCorrupt)
	})
	t.Run("a good snapshot restores", func(t *testing.T) {
		f := newBareFixture(t)
		if err := f.e.Restore(cloneSnapshot(t, good)); err != nil {
			t.Fatal(err)
		}
		if got := f.e.Snapshot(); !reflect.DeepEqual(got, good) {
			t.Errorf("restored state differs:\n%s", diffSnapshots(good, got))
		}
	})
}

func TestApplyCorruptEventIsRefused(t *testing.T) {
	src, _ := snapshotSource(t)
	// The same ids as any engine rebuilt from src's events.
	s := src.e.Snapshot()
	seq, at := s.Seq, src.now()
	sA, released := src.sA, s.Tombstones[0].Lease
	tests := []struct {
		name string
		ev   Event
	}{ // Seq 0 means the next one, except in "sequence number zero"
		{"a gap in the sequence", Event{Seq: seq + 2, Kind: EvConsumed, Node: RootID, Resource: "tokens", Amount: 1}},
		{"a repeated sequence number", Event{Seq: seq, Kind: EvConsumed, Node: RootID, Resource: "tokens", Amount: 1}},
		{"sequence number zero", Event{Seq: 0, Kind: EvConsumed, Node: RootID, Resource: "tokens", Amount: 1}},
		{"an unknown kind", Event{Kind: 99}},
		{"kind zero", Event{Kind: 0}},
		{"a consume on an unknown node", Event{Kind: EvConsumed, Node: noSuch, Resource: "tokens", Amount: 1}},
		{"a consume of zero", Event{Kind: EvConsumed, Node: src.job, Resource: "tokens"}},
		{"a charge on an unknown node", Event{Kind: EvCharged, Node: noSuch, Charges: []Charge{{"tokens", 1}}}},
		{"a node under an unknown node", Event{Kind: EvNodeCreated, Node: s.NextNode, Parent: noSuch, Spec: &NodeSpec{Name: "x"}}},
		{"a node id that is not next", Event{Kind: EvNodeCreated, Node: s.NextNode + 1, Parent: src.job, Spec: &NodeSpec{Name: "x"}}},
		{"a node id going backwards", Event{Kind: EvNodeCreated, Node: src.job, Parent: src.acme, Spec: &NodeSpec{Name: "x"}}},
		{"a node without a spec", Event{Kind: EvNodeCreated, Node: s.NextNode, Parent: src.job}},
		{"a node named as an open sibling", Event{Kind: EvNodeCreated, Node: s.NextNode, Parent: src.acme, Spec: &NodeSpec{Name: "job"}}},
		{"the end of an unknown node", Event{Kind: EvNodeEnded, Node: noSuch, State: Cancelled}},
		{"a node ended as open", Event{Kind: EvNodeEnded, Node: src.job, State: Open}},
		{"caps without an edit", Event{Kind: EvCapsSet, Node: src.job}},
		{"caps on an unknown node", Event{Kind: EvCapsSet, Node: noSuch, Caps: &CapsEdit{}}},
		{"a lease id going backwards", Event{Kind: EvLeaseGranted, Session: sA, Node: src.job, Lease: s.NextLease - 1, Resource: "db"}},
		{"lease id zero", Event{Kind: EvLeaseGranted, Session: sA, Node: src.job, Lease: 0, Resource: "db"}},
		{"a lease to an unknown session", Event{Kind: EvLeaseGranted, Session: noSuch, Node: src.job, Lease: s.NextLease, Resource: "db"}},
		{"a lease on an unknown node", Event{Kind: EvLeaseGranted, Session: sA, Node: noSuch, Lease: s.NextLease, Resource: "db"}},
		{"a lease without a class", Event{Kind: EvLeaseGranted, Session: sA, Node: src.job, Lease: s.NextLease}},
		{"the release of a released lease", Event{Kind: EvLeaseReleased, Session: src.sB, Lease: released}},
		{"the release of an unknown lease", Event{Kind: EvLeaseReleased, Session: sA, Lease: noSuch}},
		{"the end of an unknown session", Event{Kind: EvSessionEnded, Session: noSuch, Reason: EndExpired}},
		{"a session id going backwards", Event{Kind: EvSessionOpened, Session: sA, Node: src.acme, Amount: int64(testTTL)}},
		{"a session on an unknown node", Event{Kind: EvSessionOpened, Session: s.NextSession, Node: noSuch, Amount: int64(testTTL)}},
		{"a session without a TTL", Event{Kind: EvSessionOpened, Session: s.NextSession, Node: src.acme}},
		{"a session with a token in use", Event{Kind: EvSessionOpened, Session: s.NextSession, Node: src.acme, Token: "token-1", Amount: int64(testTTL)}},
		{"a negative limit", Event{Kind: EvLimitAdjusted, Node: RootID, Resource: "psp", Amount: -1}},
		{"a limit on an unknown node", Event{Kind: EvLimitAdjusted, Node: noSuch, Resource: "psp", Amount: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := src.rebuild(t, wayReplay)
			ev := tt.ev
			if ev.Seq == 0 && tt.name != "sequence number zero" {
				ev.Seq = seq + 1
			}
			ev.At = at
			err := unchanged(t, e, func() error { return e.Apply(ev) })
			wantErr(t, err, ErrCorrupt)
			// The engine stays usable: the next good event applies.
			good := Event{Seq: seq + 1, At: at, Kind: EvConsumed, Node: src.job, Resource: "tokens", Amount: 1}
			if err := e.Apply(good); err != nil {
				t.Errorf("a good event after the corrupt one: %v", err)
			}
		})
	}
}

// 2. Consume.

func TestConsumeIsAllOrNothingAcrossTheChain(t *testing.T) {
	type denial struct {
		node        string
		used, limit int64
		largest     string
		largestUsed int64
	}
	tests := []struct {
		name     string
		quotas   map[string]int64 // tokens, by node name
		on       string
		amount   int64
		want     *denial
		wantUsed map[string]int64 // after a consume that fits
	}{
		{name: "fits on every level", quotas: map[string]int64{"root": 100, "acme": 20, "job": 10, "step": 10}, on: "step", amount: 3,
			wantUsed: map[string]int64{"step": 7, "job": 8, "job2": 6, "acme": 14, "other": 30, "root": 44}},
		{name: "an exact fit is allowed", quotas: map[string]int64{"root": 44, "acme": 14, "job": 8, "step": 7}, on: "step", amount: 3,
			wantUsed: map[string]int64{"step": 7, "job": 8, "job2": 6, "acme": 14, "other": 30, "root": 44}},
		{name: "the subtask's cap", quotas: map[string]int64{"step": 6, "job": 100, "acme": 100, "root": 100}, on: "step", amount: 3,
			want: &denial{node: "step", used: 4, limit: 6, largest: "step", largestUsed: 4}},
		{name: "the task's cap", quotas: map[string]int64{"job": 7}, on: "step", amount: 3,
			want: &denial{node: "job", used: 5, limit: 7, largest: "step", largestUsed: 4}},
		{name: "the tenant's cap", quotas: map[string]int64{"acme": 13, "step": 100}, on: "step", amount: 3,
			want: &denial{node: "acme", used: 11, limit: 13, largest: "job2", largestUsed: 6}},
		{name: "the root's cap", quotas: map[string]int64{"root": 43}, on: "step", amount: 3,
			want: &denial{node: "root", used: 41, limit: 43, largest: OtherTenant, largestUsed: 0}}, // another tenant's: not acme's to see
		{name: "the lowest full cap is named", quotas: map[string]int64{"root": 43, "acme": 13, "step": 6}, on: "step", amount: 3,
			want: &denial{node: "step", used: 4, limit: 6, largest: "step", largestUsed: 4}},
		{name: "a direct charge is the largest consumer", quotas: map[string]int64{"job": 5}, on: "job", amount: 1,
			want: &denial{node: "job", used: 5, limit: 5, largest: "step", largestUsed: 4}},
		{name: "the node itself when its direct charges are largest", quotas: map[string]int64{"other": 30}, on: "otherJob", amount: 1,
			want: &denial{node: "other", used: 30, limit: 30, largest: "other", largestUsed: 30}},
		{name: "a zero quota refuses everything", quotas: map[string]int64{"job2": 0}, on: "job2", amount: 1,
			want: &denial{node: "job2", used: 6, limit: 0, largest: "job2", largestUsed: 6}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			names := f.names()
			// step 4, job 1 direct, job2 6, other 30 direct: acme 11, root 41.
			f.consume(System, f.step, "tokens", 4)
			f.consume(System, f.job, "tokens", 1)
			f.consume(System, f.job2, "tokens", 6)
			f.consume(System, f.other, "tokens", 30)
			for name, v := range tt.quotas {
				f.setCaps(names[name], CapsEdit{Quotas: map[string]int64{"tokens": v}})
			}
			on := names[tt.on]
			if tt.want == nil {
				if err := f.e.Consume(f.sessionFor(on), on, "tokens", tt.amount, ""); err != nil {
					t.Fatalf("Consume: %v", err)
				}
				for name, want := range tt.wantUsed {
					if got := f.node(names[name]).Used["tokens"]; got != want {
						t.Errorf("%s used %d, want %d", name, got, want)
					}
				}
				return
			}
			err := unchanged(t, f.e, func() error { return f.e.Consume(f.sessionFor(on), on, "tokens", tt.amount, "") })
			wantErr(t, err, ErrQuotaExhausted)
			var d *Denial
			if !errors.As(err, &d) {
				t.Fatalf("error %v is not a *Denial", err)
			}
			want := &Denial{Resource: "tokens", Node: names[tt.want.node], NodeName: tt.want.node, Used: tt.want.used,
				Limit: tt.want.limit, Amount: tt.amount,
				Largest: Consumer{Node: names[tt.want.largest], Name: tt.want.largest, Used: tt.want.largestUsed}}
			if !reflect.DeepEqual(d, want) {
				t.Errorf("denial\n got %+v\nwant %+v", d, want)
			}
			for _, part := range []string{"tokens", fmt.Sprintf("%q", tt.want.node), fmt.Sprintf("%d of %d", tt.want.used, tt.want.limit)} {
				if !strings.Contains(d.Error(), part) {
					t.Errorf("denial message %q does not say %s", d.Error(), part)
				}
			}
		})
	}
}

func TestAcquireChargesAreAllOrNothing(t *testing.T) {
	f := newFixture(t)
	f.setCaps(f.job, CapsEdit{Quotas: map[string]int64{"calls": 0, "tokens": 100}})
	f.setCaps(f.acme, CapsEdit{Quotas: map[string]int64{"tokens": 100}})
	for _, class := range []string{"db", ""} {
		t.Run(fmt.Sprintf("class=%q", class), func(t *testing.T) {
			var g Grant
			var w *Wait
			err := unchanged(t, f.e, func() (err error) {
				g, w, err = f.e.Acquire(f.sA, AcquireRequest{Node: f.step, Class: class,
					Charges: map[string]int64{"tokens": 3, "calls": 1}})
				return err
			})
			wantErr(t, err, ErrQuotaExhausted)
			if g.Lease != 0 || w != nil {
				t.Errorf("a denied acquire granted %+v or queued (%v)", g, w != nil)
			}
			var d *Denial
			if errors.As(err, &d) && (d.Resource != "calls" || d.Node != f.job || d.Limit != 0 || d.Amount != 1) {
				t.Errorf("denial %+v, want calls on job, limit 0, amount 1", d)
			}
		})
	}
}

func TestQuotaLoweredBelowUsageRevokesNothing(t *testing.T) {
	f := newFixture(t)
	f.setCaps(f.job, CapsEdit{Quotas: map[string]int64{"tokens": 10}, Limits: map[string]int64{"db": 2}})
	f.consume(f.sA, f.job, "tokens", 8)
	l1, l2 := f.acquire(f.sA, f.job, "db"), f.acquire(f.sA, f.job, "db")

	// A tenant may lower the caps of its own task.
	v, err := f.e.SetCaps(f.sA, f.job, CapsEdit{Quotas: map[string]int64{"tokens": 5}, Limits: map[string]int64{"db": 1}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if v.Used["tokens"] != 8 || v.Quotas["tokens"] != 5 || v.Held["db"] != 2 || v.Limits["db"] != 1 {
		t.Fatalf("after lowering: used %v of %v, held %v of %v", v.Used, v.Quotas, v.Held, v.Limits)
	}
	for _, l := range []LeaseID{l1, l2} {
		if _, err := f.e.Validate(f.sA, l); err != nil {
			t.Errorf("lease %d after lowering the limit: %v", l, err)
		}
	}
	err = unchanged(t, f.e, func() error { return f.e.Consume(f.sA, f.job, "tokens", 1, "") })
	var d *Denial
	if !errors.As(err, &d) || d.Used != 8 || d.Limit != 5 || d.Largest != (Consumer{f.job, "job", 8}) {
		t.Fatalf("consume over a lowered quota: %v (%+v)", err, d)
	}
	w := f.enqueue(f.sA, f.job, "db")
	f.release(f.sA, l1)
	noOutcome(t, w, "1 held of limit 1")
	f.release(f.sA, l2)
	granted(t, w, "0 held of limit 1")
}

func TestNoCapRemovesACap(t *testing.T) {
	t.Run("quota", func(t *testing.T) {
		f := newFixture(t)
		f.setCaps(f.job, CapsEdit{Quotas: map[string]int64{"tokens": 5}})
		f.consume(f.sA, f.job, "tokens", 5)
		wantErr(t, f.e.Consume(f.sA, f.job, "tokens", 1, ""), ErrQuotaExhausted)
		v, err := f.e.SetCaps(f.sA, f.job, CapsEdit{Quotas: map[string]int64{"tokens": NoCap}}, "")
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := v.Quotas["tokens"]; ok {
			t.Fatalf("quotas after NoCap: %v", v.Quotas)
		}
		f.consume(f.sA, f.job, "tokens", 1000)
		if got := f.node(f.job).Used["tokens"]; got != 1005 {
			t.Errorf("used %d, want 1005", got)
		}
	})
	t.Run("limit", func(t *testing.T) {
		f := newFixture(t)
		f.setCaps(f.job, CapsEdit{Limits: map[string]int64{"db": 1}})
		f.acquire(f.sA, f.job, "db")
		w := f.enqueue(f.sA, f.job, "db")
		v, err := f.e.SetCaps(f.sA, f.job, CapsEdit{Limits: map[string]int64{"db": NoCap}}, "")
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := v.Limits["db"]; ok {
			t.Fatalf("limits after NoCap: %v", v.Limits)
		}
		granted(t, w, "after the limit was removed")
	})
	t.Run("a cap that is not there", func(t *testing.T) {
		f := newFixture(t)
		v, err := f.e.SetCaps(f.sA, f.job, CapsEdit{Quotas: map[string]int64{"tokens": NoCap}}, "")
		if err != nil || v.Quotas != nil {
			t.Fatalf("SetCaps = %v, %v", v.Quotas, err)
		}
	})
	t.Run("default", func(t *testing.T) {
		f := newFixture(t)
		f.setCaps(f.acme, CapsEdit{DefaultQuotas: map[string]int64{"retry": 3}})
		f.setCaps(f.acme, CapsEdit{DefaultQuotas: map[string]int64{"retry": NoCap}})
		if v := f.node(f.create(f.sA, f.acme, NodeSpec{Name: "new"})); v.Quotas != nil || v.DefaultQuotas != nil {
			t.Errorf("child of a node whose default was removed: quotas %v, defaults %v", v.Quotas, v.DefaultQuotas)
		}
	})
}

func TestDefaultsAreInheritedByNewChildren(t *testing.T) {
	type caps = map[string]int64
	tests := []struct {
		name               string
		spec               NodeSpec
		wantQ, wantL       caps
		wantDefQ, wantDefL caps // also what a grandchild starts with
	}{
		{name: "a child inherits", spec: NodeSpec{},
			wantQ: caps{"retry": 3}, wantL: caps{"db": 2}, wantDefQ: caps{"retry": 3}, wantDefL: caps{"db": 2}},
		{name: "NoCap opts out of an inherited quota", spec: NodeSpec{Quotas: caps{"retry": NoCap}},
			wantL: caps{"db": 2}, wantDefQ: caps{"retry": 3}, wantDefL: caps{"db": 2}},
		{name: "NoCap opts out of an inherited limit", spec: NodeSpec{Limits: caps{"db": NoCap}},
			wantQ: caps{"retry": 3}, wantDefQ: caps{"retry": 3}, wantDefL: caps{"db": 2}},
		{name: "a spec overrides an inherited cap", spec: NodeSpec{Quotas: caps{"retry": 5}},
			wantQ: caps{"retry": 5}, wantL: caps{"db": 2}, wantDefQ: caps{"retry": 3}, wantDefL: caps{"db": 2}},
		{name: "a spec adds to the inherited caps", spec: NodeSpec{Quotas: caps{"tokens": 9}},
			wantQ: caps{"retry": 3, "tokens": 9}, wantL: caps{"db": 2}, wantDefQ: caps{"retry": 3}, wantDefL: caps{"db": 2}},
		{name: "empty defaults stop inheritance", spec: NodeSpec{DefaultQuotas: caps{}, DefaultLimits: caps{}},
			wantQ: caps{"retry": 3}, wantL: caps{"db": 2}},
		{name: "own defaults replace the parent's", spec: NodeSpec{DefaultQuotas: caps{"tokens": 7}},
			wantQ: caps{"retry": 3}, wantL: caps{"db": 2}, wantDefQ: caps{"tokens": 7}, wantDefL: caps{"db": 2}},
		{name: "NoCap in own defaults", spec: NodeSpec{DefaultQuotas: caps{"retry": NoCap}},
			wantQ: caps{"retry": 3}, wantL: caps{"db": 2}, wantDefL: caps{"db": 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			f.setCaps(f.acme, CapsEdit{DefaultQuotas: caps{"retry": 3}, DefaultLimits: caps{"db": 2}})
			spec := tt.spec
			spec.Name = "new"
			child := f.node(f.create(f.sA, f.acme, spec))
			for _, c := range []struct {
				what      string
				got, want caps
			}{
				{"quotas", child.Quotas, tt.wantQ}, {"limits", child.Limits, tt.wantL},
				{"default quotas", child.DefaultQuotas, tt.wantDefQ}, {"default limits", child.DefaultLimits, tt.wantDefL},
			} {
				if !reflect.DeepEqual(nilIfEmpty(c.got), c.want) {
					t.Errorf("child %s %v, want %v", c.what, c.got, c.want)
				}
			}
			grandchild := f.node(f.create(f.sA, child.ID, NodeSpec{Name: "sub"}))
			if !reflect.DeepEqual(grandchild.Quotas, tt.wantDefQ) || !reflect.DeepEqual(grandchild.Limits, tt.wantDefL) {
				t.Errorf("grandchild quotas %v limits %v, want %v and %v", grandchild.Quotas, grandchild.Limits, tt.wantDefQ, tt.wantDefL)
			}
		})
	}
	t.Run("a retry budget is spent like any quota", func(t *testing.T) {
		f := newFixture(t)
		f.setCaps(f.acme, CapsEdit{DefaultQuotas: caps{"retry": 3}})
		task := f.create(f.sA, f.acme, NodeSpec{Name: "new"})
		for range 3 {
			f.consume(f.sA, task, "retry", 1)
		}
		wantErr(t, f.e.Consume(f.sA, task, "retry", 1, ""), ErrQuotaExhausted)
	})
	t.Run("defaults are not retroactive", func(t *testing.T) {
		f := newFixture(t)
		f.setCaps(f.acme, CapsEdit{DefaultQuotas: caps{"retry": 3}})
		if q := f.node(f.job).Quotas; q != nil {
			t.Errorf("an existing child's quotas became %v", q)
		}
	})
}

// 3. Leases and sessions.

func TestLeaseGrantAndRelease(t *testing.T) {
	f := newFixture(t)
	f.setCaps(f.job, CapsEdit{Limits: map[string]int64{"db": 2}})
	g, w, err := f.e.Acquire(f.sA, AcquireRequest{Node: f.step, Class: "db"})
	if err != nil || w != nil {
		t.Fatalf("Acquire = %+v, %v, %v", g, w, err)
	}
	if g.Lease <= 0 || g.Node != f.step || g.Class != "db" {
		t.Fatalf("grant %+v", g)
	}
	for _, id := range []NodeID{f.step, f.job, f.acme, RootID} {
		if held := f.node(id).Held["db"]; held != 1 {
			t.Errorf("node %d holds %d, want 1", id, held)
		}
	}
	if v, err := f.e.Validate(f.sA, g.Lease); err != nil || v != g {
		t.Errorf("Validate = %+v, %v; want %+v", v, err, g)
	}
	f.release(f.sA, g.Lease)
	if held := f.node(RootID).Held; held != nil {
		t.Errorf("root holds %v after the release", held)
	}
	for _, rid := range []string{"", "again"} {
		err := unchanged(t, f.e, func() error { return f.e.Release(f.sA, g.Lease, 0, false, rid) })
		wantErr(t, err, nil)
	}
	_, err = f.e.Validate(f.sA, g.Lease)
	wantErr(t, err, ErrLeaseReleased)
}

func TestLeaseReleaseAfterSessionExpiry(t *testing.T) {
	type env struct {
		holder, witness SessionID
		lease           LeaseID
	}
	tests := []struct {
		name string
		reap bool
		call func(f *fixture, v env) error
		want error
		bug  string
	}{
		{name: "the holder, lazily", call: func(f *fixture, v env) error { return f.e.Release(v.holder, v.lease, 0, false, "") }, want: ErrSessionExpired},
		{name: "the holder, after Reap", reap: true, call: func(f *fixture, v env) error { return f.e.Release(v.holder, v.lease, 0, false, "") }, want: ErrUnauthenticated},
		{name: "another session validates, lazily", call: func(f *fixture, v env) error {
			_, err := f.e.Validate(v.witness, v.lease)
			return err
		}, want: ErrLeaseExpired},
		{name: "another session releases after a lazy validate", call: func(f *fixture, v env) error {
			f.e.Validate(v.witness, v.lease)
			return f.e.Release(v.witness, v.lease, 0, false, "")
		}, want: ErrLeaseExpired},
		{name: "another session releases, lazily", call: func(f *fixture, v env) error { return f.e.Release(v.witness, v.lease, 0, false, "") }, want: ErrLeaseExpired,
			bug: "Release checks l.session != s (ErrPermission) before touch, so a lease whose session expired but was not reaped yet answers PERMISSION_DENIED, while after Reap it answers LEASE_EXPIRED: the answer depends on Reap's timing. lease.go Release: call e.touch(l, now) before the holder check (as Validate does), and check the holder only if the lease is still live"},
		{name: "another session releases, after Reap", reap: true, call: func(f *fixture, v env) error { return f.e.Release(v.witness, v.lease, 0, false, "") }, want: ErrLeaseExpired},
		{name: "another session validates, after Reap", reap: true, call: func(f *fixture, v env) error {
			_, err := f.e.Validate(v.witness, v.lease)
			return err
		}, want: ErrLeaseExpired},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			v := env{holder: f.open(f.acme, testTTL), witness: f.open(f.acme, longTTL)}
			v.lease = f.acquire(v.holder, f.job, "db")
			f.clock.Advance(testTTL)
			if tt.reap {
				if n, _ := f.e.Reap(); n != 1 {
					t.Fatalf("Reap ended %d sessions, want 1", n)
				}
			}
			err := tt.call(f, v)
			if tt.bug != "" && !errors.Is(err, tt.want) {
				knownBug(t, "got %v, want %v: %s", err, tt.want, tt.bug)
			}
			wantErr(t, err, tt.want)
			if ids := leases(f.e); len(ids) != 0 {
				t.Errorf("live leases %v after the session expired", ids)
			}
			if held := f.node(f.job).Held; held != nil {
				t.Errorf("job holds %v", held)
			}
		})
	}
}

func TestLeaseRevokedWhenItsNodeEnds(t *testing.T) {
	tests := []struct {
		name string
		end  func(f *fixture)
	}{
		{"its subtask's task is closed by the tenant", func(f *fixture) {
			if _, err := f.e.EndNode(f.sA, f.job, Closed, ""); err != nil {
				f.t.Fatal(err)
			}
		}},
		{"its subtask is cancelled", func(f *fixture) {
			if _, err := f.e.EndNode(System, f.step, Cancelled, ""); err != nil {
				f.t.Fatal(err)
			}
		}},
		{"its tenant is cancelled", func(f *fixture) {
			if _, err := f.e.EndNode(System, f.acme, Cancelled, ""); err != nil {
				f.t.Fatal(err)
			}
		}},
		{"its task passes a deadline, found lazily", func(f *fixture) {
			f.setCaps(f.job, CapsEdit{Deadline: ptr(f.now() + int64(time.Second))})
			f.clock.Advance(time.Second)
		}},
		{"its task passes a deadline, found by Reap", func(f *fixture) {
			f.setCaps(f.job, CapsEdit{Deadline: ptr(f.now() + int64(time.Second))})
			f.clock.Advance(time.Second)
			if _, n := f.e.Reap(); n != 1 {
				f.t.Fatalf("Reap ended %d nodes", n)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			lease := f.acquire(f.sA, f.step, "db")
			tt.end(f)
			err := f.e.Release(f.sA, lease, 0, false, "")
			wantErr(t, err, ErrLeaseRevoked)
			var le *LeaseEndedError
			if !errors.As(err, &le) || le.Lease != lease || le.Reason != EndRevoked {
				t.Errorf("error %v is not a LeaseEndedError for lease %d, revoked (%+v)", err, lease, le)
			}
			_, err = f.e.Validate(f.sA, lease)
			wantErr(t, err, ErrLeaseRevoked)
			if ids := leases(f.e); len(ids) != 0 {
				t.Errorf("live leases %v", ids)
			}
			if held := f.node(RootID).Held; held != nil {
				t.Errorf("root holds %v", held)
			}
		})
	}
}

func TestTombstonesVanishAfterTheirTTL(t *testing.T) {
	tests := []struct {
		name string
		end  func(f *fixture, holder SessionID, lease LeaseID)
		want error // what the witness is told while the tombstone lasts
	}{
		{"released", func(f *fixture, holder SessionID, lease LeaseID) { f.release(holder, lease) }, ErrLeaseReleased},
		{"revoked", func(f *fixture, _ SessionID, _ LeaseID) {
			if _, err := f.e.EndNode(System, f.job, Cancelled, ""); err != nil {
				f.t.Fatal(err)
			}
		}, ErrLeaseRevoked},
		{"expired", func(f *fixture, _ SessionID, _ LeaseID) {
			f.clock.Advance(testTTL)
			f.e.Reap()
		}, ErrLeaseExpired},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			ttl := longTTL
			if tt.want == ErrLeaseExpired {
				ttl = testTTL
			}
			holder, witness := f.open(f.acme, ttl), f.open(f.acme, longTTL)
			lease := f.acquire(holder, f.job, "db")
			tt.end(f, holder, lease)

			f.clock.Advance(TombstoneTTL - 1)
			_, err := f.e.Validate(witness, lease)
			wantErr(t, err, tt.want)
			if tombs := f.e.Snapshot().Tombstones; len(tombs) != 1 || tombs[0].Lease != lease {
				t.Errorf("tombstones %+v, want lease %d's", tombs, lease)
			}

			f.clock.Advance(1)
			_, err = f.e.Validate(witness, lease)
			wantErr(t, err, ErrNotFound)
			wantErr(t, f.e.Release(witness, lease, 0, false, ""), ErrNotFound)
			if tt.want == ErrLeaseReleased {
				wantErr(t, f.e.Release(holder, lease, 0, false, ""), ErrNotFound)
			}
			f.e.Reap()
			if tombs := f.e.Snapshot().Tombstones; tombs != nil {
				t.Errorf("tombstones %+v after TombstoneTTL and Reap", tombs)
			}
		})
	}
}

func TestValidateReportsALeaseState(t *testing.T) {
	type env struct {
		held, released, revoked, expired, others LeaseID
	}
	tests := []struct {
		name  string
		sid   func(f *fixture) SessionID
		lease func(v env) LeaseID
		want  error
	}{
		{"held", func(f *fixture) SessionID { return f.sA }, func(v env) LeaseID { return v.held }, nil},
		{"released", func(f *fixture) SessionID { return f.sA }, func(v env) LeaseID { return v.released }, ErrLeaseReleased},
		{"revoked", func(f *fixture) SessionID { return f.sA }, func(v env) LeaseID { return v.revoked }, ErrLeaseRevoked},
		{"expired", func(f *fixture) SessionID { return f.sA }, func(v env) LeaseID { return v.expired }, ErrLeaseExpired},
		{"unknown", func(f *fixture) SessionID { return f.sA }, func(v env) LeaseID { return noSuch }, ErrNotFound},
		{"another tenant's", func(f *fixture) SessionID { return f.sA }, func(v env) LeaseID { return v.others }, ErrNotFound},
		{"any, by the system session", func(f *fixture) SessionID { return System }, func(v env) LeaseID { return v.others }, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			short := f.open(f.acme, testTTL)
			v := env{
				held:     f.acquire(f.sA, f.job, "db"),
				released: f.acquire(f.sA, f.job, "db"),
				revoked:  f.acquire(f.sA, f.job2, "db"),
				expired:  f.acquire(short, f.job, "db"),
				others:   f.acquire(f.sB, f.otherJob, "db"),
			}
			f.release(f.sA, v.released)
			if _, err := f.e.EndNode(f.sA, f.job2, Cancelled, ""); err != nil {
				t.Fatal(err)
			}
			f.clock.Advance(testTTL)
			g, err := f.e.Validate(tt.sid(f), tt.lease(v))
			wantErr(t, err, tt.want)
			if err == nil && g.Lease != tt.lease(v) {
				t.Errorf("Validate = %+v", g)
			}
		})
	}
}

func TestLeaseIDsOnlyGrow(t *testing.T) {
	for _, way := range []string{wayLive, wayRestore, wayReplay} {
		t.Run(way, func(t *testing.T) {
			f := newFixture(t)
			var last LeaseID
			for i := range 6 {
				l := f.acquire(f.sA, f.job, "db")
				if l <= last {
					t.Fatalf("lease %d after %d", l, last)
				}
				last = l
				if i%2 == 0 {
					f.release(f.sA, l)
				}
			}
			for _, l := range leases(f.e) {
				f.release(f.sA, l)
			}
			// Nothing live and no tombstone left: only the counter remembers.
			f.clock.Advance(TombstoneTTL)
			f.e.Reap()
			if s := f.e.Snapshot(); s.Leases != nil || s.Tombstones != nil || s.NextLease != last+1 {
				t.Fatalf("snapshot leases %v, tombstones %v, next %d", s.Leases, s.Tombstones, s.NextLease)
			}
			e := f.rebuild(t, way)
			g, _, err := e.Acquire(f.sA, AcquireRequest{Node: f.job, Class: "db"})
			if err != nil || g.Lease != last+1 {
				t.Errorf("first lease after %s: %+v, %v; want %d", way, g, err, last+1)
			}
		})
	}
}

func TestLeaseOfAnotherSessionCannotBeReleased(t *testing.T) {
	f := newFixture(t)
	s2 := f.open(f.acme, longTTL)
	lease := f.acquire(f.sA, f.job, "db")
	for _, rid := range []string{"", "r"} {
		err := unchanged(t, f.e, func() error { return f.e.Release(s2, lease, 0, false, rid) })
		wantErr(t, err, ErrPermission)
	}
	if _, err := f.e.Validate(s2, lease); err != nil {
		t.Errorf("a session may validate a lease in its scope: %v", err)
	}
	f.release(f.sA, lease)
	wantErr(t, f.e.Release(s2, lease, 0, false, ""), ErrLeaseReleased)
	wantErr(t, f.e.Release(f.sA, lease, 0, false, ""), nil)
}

func TestSessionHeartbeatKeepsItAlive(t *testing.T) {
	f := newFixture(t)
	s := f.open(f.acme, testTTL)
	lease := f.acquire(s, f.job, "db")
	for range 10 {
		f.clock.Advance(testTTL - time.Second)
		ttl, err := f.e.Heartbeat(s)
		if err != nil || ttl != testTTL {
			t.Fatalf("Heartbeat = %v, %v", ttl, err)
		}
	}
	f.clock.Advance(testTTL - 1)
	if _, err := f.e.Validate(System, lease); err != nil {
		t.Fatalf("lease a nanosecond before the TTL: %v", err)
	}
	f.clock.Advance(1)
	_, err := f.e.Heartbeat(s)
	wantErr(t, err, ErrSessionExpired)
	_, err = f.e.Validate(System, lease)
	wantErr(t, err, ErrLeaseExpired)
	_, err = f.e.Heartbeat(s)
	wantErr(t, err, ErrUnauthenticated)
}

func TestSessionGetsOneFreshTTLAfterARestart(t *testing.T) {
	for _, way := range []string{wayRestore, wayReplay} {
		t.Run(way, func(t *testing.T) {
			f := newFixture(t)
			s := f.open(f.acme, testTTL)
			lease := f.acquire(s, f.job, "db")
			f.clock.Advance(testTTL - time.Second) // one second left
			e := f.rebuild(t, way)
			f.clock.Advance(testTTL - time.Second) // long past the old expiry
			if _, err := e.Validate(System, lease); err != nil {
				t.Fatalf("after the restart the session has a fresh TTL, but: %v", err)
			}
			_, err := f.e.Validate(System, lease)
			wantErr(t, err, ErrLeaseExpired) // the engine that did not restart
			f.clock.Advance(time.Second)     // one TTL since the restart
			_, err = e.Heartbeat(s)
			wantErr(t, err, ErrSessionExpired)
		})
	}
}

func TestSessionByToken(t *testing.T) {
	f := newFixture(t)
	if id, scope, ok := f.e.SessionByToken("token-1"); !ok || id != f.sA || scope != f.acme {
		t.Errorf("SessionByToken(token-1) = %d, %d, %v", id, scope, ok)
	}
	for _, tok := range []string{"nope", ""} {
		if _, _, ok := f.e.SessionByToken(tok); ok {
			t.Errorf("SessionByToken(%q) found a session", tok)
		}
	}
	e := f.rebuild(t, wayRestore)
	if id, scope, ok := e.SessionByToken("token-2"); !ok || id != f.sB || scope != f.other {
		t.Errorf("after a restore SessionByToken(token-2) = %d, %d, %v", id, scope, ok)
	}
	if err := f.e.CloseSession(f.sA); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := f.e.SessionByToken("token-1"); ok {
		t.Error("a closed session is found by its token")
	}
	short, err := f.e.OpenSession(f.acme, "token-1", testTTL) // a freed token can be reused
	if err != nil || short == f.sA {
		t.Fatalf("OpenSession with a freed token = %d, %v", short, err)
	}
	f.clock.Advance(testTTL)
	f.e.Reap()
	if _, _, ok := f.e.SessionByToken("token-1"); ok {
		t.Error("an expired session is found by its token")
	}
}

// 4. Waits.

// waitFixture limits acme to one db lease and fills it with a lease of sA on
// job2.
func waitFixture(t *testing.T) (*fixture, LeaseID) {
	f := newFixture(t)
	f.setCaps(f.acme, CapsEdit{Limits: map[string]int64{"db": 1}})
	return f, f.acquire(f.sA, f.job2, "db")
}

func TestWaitIsGrantedOnRelease(t *testing.T) {
	f, holder := waitFixture(t)
	s2 := f.open(f.acme, longTTL)
	w := f.enqueue(s2, f.job, "db")
	noOutcome(t, w, "while the limit is full")
	f.release(f.sA, holder)
	g := granted(t, w, "after the release")
	if g.Lease <= holder || g.Node != f.job || g.Class != "db" {
		t.Errorf("grant %+v", g)
	}
	snap := f.e.Snapshot()
	if len(snap.Leases) != 1 || snap.Leases[0].ID != g.Lease || snap.Leases[0].Session != s2 {
		t.Errorf("leases %+v", snap.Leases)
	}
}

func TestCancelWaitBeforeTheGrant(t *testing.T) {
	f, holder := waitFixture(t)
	w := f.enqueue(f.sA, f.job, "db")
	unchanged(t, f.e, func() error { f.e.CancelWait(w); return nil })
	unchanged(t, f.e, func() error { f.e.CancelWait(w); return nil }) // twice is harmless
	f.release(f.sA, holder)
	noOutcome(t, w, "a cancelled wait")
	if ids := leases(f.e); ids != nil {
		t.Errorf("leases %v after the only holder released", ids)
	}
	f.acquire(f.sA, f.job, "db") // the slot is free
}

func TestCancelWaitAfterTheGrantGivesTheLeaseBack(t *testing.T) {
	f, holder := waitFixture(t)
	sB2, sC := f.open(f.acme, longTTL), f.open(f.acme, longTTL)
	wB := f.enqueue(sB2, f.job, "db")
	wC := f.enqueue(sC, f.job2, "db")
	f.release(f.sA, holder) // wB is granted; its outcome sits in the channel
	seq := f.e.Seq()
	f.e.CancelWait(wB) // the caller gave up at that instant
	if kinds := []EventKind{f.rec.events[seq].Kind, f.rec.events[seq+1].Kind}; f.e.Seq() != seq+2 ||
		kinds[0] != EvLeaseReleased || kinds[1] != EvLeaseGranted {
		t.Fatalf("CancelWait emitted %v", f.rec.events[seq:])
	}
	gC := granted(t, wC, "the next waiter")
	snap := f.e.Snapshot()
	if len(snap.Leases) != 1 || snap.Leases[0].ID != gC.Lease || snap.Leases[0].Session != sC {
		t.Fatalf("leases %+v, want only %d of session %d: a lease leaked", snap.Leases, gC.Lease, sC)
	}
	if held := f.node(f.acme).Held["db"]; held != 1 {
		t.Errorf("acme holds %d", held)
	}
	gB := granted(t, wB, "the cancelled waiter's channel")
	_, err := f.e.Validate(sB2, gB.Lease)
	wantErr(t, err, ErrLeaseReleased)
	unchanged(t, f.e, func() error { f.e.CancelWait(wB); return nil }) // twice is harmless
}

func TestWaiterFails(t *testing.T) {
	type env struct {
		holder LeaseID
		waiter SessionID
	}
	tests := []struct {
		name    string
		ttl     time.Duration
		onStep  bool
		charges map[string]int64
		trigger func(f *fixture, v env)
		want    error
	}{
		{name: "its task is cancelled", trigger: func(f *fixture, _ env) {
			if _, err := f.e.EndNode(System, f.job, Cancelled, ""); err != nil {
				f.t.Fatal(err)
			}
		}, want: ErrTaskEnded},
		{name: "its task is closed by its tenant", trigger: func(f *fixture, _ env) {
			if _, err := f.e.EndNode(f.sA, f.job, Closed, ""); err != nil {
				f.t.Fatal(err)
			}
		}, want: ErrTaskEnded},
		{name: "an ancestor of its subtask is cancelled", onStep: true, trigger: func(f *fixture, _ env) {
			if _, err := f.e.EndNode(System, f.job, Cancelled, ""); err != nil {
				f.t.Fatal(err)
			}
		}, want: ErrTaskEnded},
		{name: "its task passes a deadline (Reap)", trigger: func(f *fixture, _ env) {
			f.setCaps(f.job, CapsEdit{Deadline: ptr(f.now() + int64(time.Second))})
			f.clock.Advance(time.Second)
			f.e.Reap()
		}, want: ErrTaskEnded},
		{name: "its session expires (Reap)", ttl: testTTL, trigger: func(f *fixture, _ env) {
			f.clock.Advance(testTTL)
			f.e.Reap()
		}, want: ErrSessionExpired},
		{name: "its session expires (lazily)", ttl: testTTL, trigger: func(f *fixture, v env) {
			f.clock.Advance(testTTL)
			f.e.Heartbeat(v.waiter)
		}, want: ErrSessionExpired},
		{name: "its quota was spent while it waited", charges: map[string]int64{"tokens": 3}, trigger: func(f *fixture, v env) {
			f.consume(f.sA, f.job, "tokens", 3)
			f.release(f.sA, v.holder)
		}, want: ErrQuotaExhausted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, holder := waitFixture(t)
			f.setCaps(f.job, CapsEdit{Quotas: map[string]int64{"tokens": 5}})
			ttl := tt.ttl
			if ttl == 0 {
				ttl = longTTL
			}
			v := env{holder: holder, waiter: f.open(f.acme, ttl)}
			on := f.job
			if tt.onStep {
				on = f.step
			}
			g, w, err := f.e.Acquire(v.waiter, AcquireRequest{Node: on, Class: "db", Charges: tt.charges})
			if err != nil || w == nil {
				t.Fatalf("Acquire = %+v, %v; want it queued", g, err)
			}
			tt.trigger(f, v)
			o, ok := outcome(w)
			if !ok {
				t.Fatal("the waiter has no outcome")
			}
			wantErr(t, o.Err, tt.want)
			if o.Grant.Lease != 0 {
				t.Errorf("a failed waiter got lease %d", o.Grant.Lease)
			}
			for _, l := range f.e.Snapshot().Leases {
				if l.Session == v.waiter {
					t.Errorf("the waiter's session holds lease %+v", l)
				}
			}
			if tt.want == ErrQuotaExhausted {
				var d *Denial
				if !errors.As(o.Err, &d) || d.Node != f.job || d.Used != 3 || d.Limit != 5 || d.Amount != 3 {
					t.Errorf("denial %+v", d)
				}
				if used := f.node(f.job).Used["tokens"]; used != 3 {
					t.Errorf("job used %d tokens, want 3: the failed waiter was charged", used)
				}
			}
		})
	}
}

func TestWaitersByPriorityWithinATenant(t *testing.T) {
	f, holder := waitFixture(t)
	lo := f.create(f.sA, f.acme, NodeSpec{Name: "lo", Priority: 1})
	mid := f.create(f.sA, f.acme, NodeSpec{Name: "mid", Priority: 3})
	hi := f.create(f.sA, f.acme, NodeSpec{Name: "hi", Priority: 5})
	hiStep := f.create(f.sA, hi, NodeSpec{Name: "hi-step"})
	if p := f.node(hiStep).Priority; p != 5 {
		t.Fatalf("a subtask's priority is %d, want its parent's 5", p)
	}
	arrivals := []struct {
		name string
		node NodeID
	}{{"lo#1", lo}, {"mid", mid}, {"hi-step", hiStep}, {"hi", hi}, {"lo#2", lo}}
	waits := map[string]*Wait{}
	for _, a := range arrivals {
		waits[a.name] = f.enqueue(f.sA, a.node, "db")
	}
	for _, want := range []string{"hi-step", "hi", "mid", "lo#1", "lo#2"} {
		f.release(f.sA, holder)
		var got []string
		for name, w := range waits {
			if o, ok := outcome(w); ok {
				got = append(got, name)
				holder = o.Grant.Lease
				delete(waits, name)
			}
		}
		if len(got) != 1 || got[0] != want {
			t.Fatalf("granted %v, want %s", got, want)
		}
	}
}

func TestWorkConservingQueue(t *testing.T) {
	tests := []struct {
		name    string
		limits  map[string]int64 // db, by node name
		holders [2]string
		waiters [2]string // waiter 0 is blocked by its own cap; waiter 1 is not
	}{
		{"a task's full cap does not block its tenant's next waiter",
			map[string]int64{"acme": 2, "job": 1}, [2]string{"job", "job2"}, [2]string{"job", "job2"}},
		{"a tenant's full cap does not block another tenant",
			map[string]int64{"root": 2, "acme": 1}, [2]string{"job", "otherJob"}, [2]string{"job2", "otherJob"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			names := f.names()
			for name, v := range tt.limits {
				f.setCaps(names[name], CapsEdit{Limits: map[string]int64{"db": v}})
			}
			var held [2]LeaseID
			var waits [2]*Wait
			for i := range 2 {
				id := names[tt.holders[i]]
				held[i] = f.acquire(f.sessionFor(id), id, "db")
			}
			for i := range 2 {
				id := names[tt.waiters[i]]
				waits[i] = f.enqueue(f.sessionFor(id), id, "db")
			}
			f.release(f.sessionFor(names[tt.holders[1]]), held[1])
			noOutcome(t, waits[0], "the head waiter, blocked by its own cap")
			granted(t, waits[1], "the later waiter that fits")
			f.release(f.sessionFor(names[tt.holders[0]]), held[0])
			granted(t, waits[0], "the head waiter once its cap frees")
		})
	}
}

// 5. Deadlines.

func TestDeadlineEndsATaskLazilyAndByReap(t *testing.T) {
	type env struct {
		task, sub NodeID
		lease     LeaseID
	}
	tests := []struct {
		name string
		call func(f *fixture, v env) error
		want error
	}{
		{"consume on it", func(f *fixture, v env) error { return f.e.Consume(f.sA, v.task, "tokens", 1, "") }, ErrTaskEnded},
		{"consume on its subtask", func(f *fixture, v env) error { return f.e.Consume(f.sA, v.sub, "tokens", 1, "") }, ErrTaskEnded},
		{"acquire on its subtask", func(f *fixture, v env) error {
			_, _, err := f.e.Acquire(f.sA, AcquireRequest{Node: v.sub, Class: "db"})
			return err
		}, ErrTaskEnded},
		{"charge-only acquire", func(f *fixture, v env) error {
			_, _, err := f.e.Acquire(f.sA, AcquireRequest{Node: v.task, Charges: map[string]int64{"tokens": 1}})
			return err
		}, ErrTaskEnded},
		{"create under it", func(f *fixture, v env) error {
			_, err := f.e.CreateNode(f.sA, v.task, NodeSpec{Name: "x"}, "")
			return err
		}, ErrTaskEnded},
		{"find-or-create under its subtask", func(f *fixture, v env) error {
			_, _, err := f.e.FindOrCreate(f.sA, v.sub, NodeSpec{Name: "x"}, "")
			return err
		}, ErrTaskEnded},
		{"set its caps", func(f *fixture, v env) error {
			_, err := f.e.SetCaps(f.sA, v.task, CapsEdit{Quotas: map[string]int64{"tokens": 1}}, "")
			return err
		}, ErrTaskEnded},
		{"end it (already ended: no error)", func(f *fixture, v env) error {
			_, err := f.e.EndNode(f.sA, v.task, Closed, "")
			return err
		}, nil},
		{"validate its lease", func(f *fixture, v env) error {
			_, err := f.e.Validate(f.sA, v.lease)
			return err
		}, ErrLeaseRevoked},
		{"release its lease", func(f *fixture, v env) error { return f.e.Release(f.sA, v.lease, 0, false, "") }, ErrLeaseRevoked},
		{"open a session on it", func(f *fixture, v env) error {
			_, err := f.e.OpenSession(v.sub, "late", testTTL)
			return err
		}, ErrTaskEnded},
		{"Reap", func(f *fixture, v env) error {
			if _, n := f.e.Reap(); n != 1 {
				return fmt.Errorf("Reap ended %d nodes, want 1", n)
			}
			return nil
		}, nil},
	}
	setup := func(t *testing.T, until time.Duration) (*fixture, env, LeaseID) {
		f := newFixture(t)
		v := env{task: f.create(f.sA, f.acme, NodeSpec{Name: "batch", Deadline: f.now() + int64(5*time.Second)})}
		v.sub = f.create(f.sA, v.task, NodeSpec{Name: "part"})
		v.lease = f.acquire(f.sA, v.sub, "db")
		keep := f.acquire(f.sA, f.job, "db")
		f.clock.Advance(until)
		return f, v, keep
	}
	t.Run("a nanosecond early nothing ends", func(t *testing.T) {
		f, v, _ := setup(t, 5*time.Second-1)
		f.consume(f.sA, v.sub, "tokens", 1)
		if _, n := f.e.Reap(); n != 0 {
			t.Errorf("Reap ended %d nodes", n)
		}
		if _, err := f.e.Validate(f.sA, v.lease); err != nil {
			t.Error(err)
		}
	})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, v, keep := setup(t, 5*time.Second)
			err := tt.call(f, v)
			wantErr(t, err, tt.want)
			var ee *EndedError
			if tt.want == ErrTaskEnded && (!errors.As(err, &ee) || ee.Node != v.task || !ee.Deadline || ee.State != Expired) {
				t.Errorf("error %v does not name task %d as past its deadline (%+v)", err, v.task, ee)
			}
			for _, id := range []NodeID{v.task, v.sub} {
				if st := f.node(id).State; st != Expired {
					t.Errorf("node %d is %s, want expired", id, st)
				}
			}
			if ids := leases(f.e); !slices.Equal(ids, []LeaseID{keep}) {
				t.Errorf("live leases %v, want only %d", ids, keep)
			}
			_, err = f.e.Validate(System, v.lease)
			wantErr(t, err, ErrLeaseRevoked)
			if st := f.node(f.job).State; st != Open {
				t.Errorf("a sibling task is %s", st)
			}
			if _, err := f.e.CreateNode(f.sA, f.acme, NodeSpec{Name: "batch"}, ""); err != nil {
				t.Errorf("the expired task's name is not free: %v", err)
			}
		})
	}
}

func TestDeadlineSetAndClearedBySetCaps(t *testing.T) {
	type step struct {
		advance time.Duration
		ended   bool
	}
	tests := []struct {
		name      string
		deadlines []time.Duration // from now; 0 clears
		steps     []step
	}{
		{"set", []time.Duration{2 * time.Second}, []step{{2*time.Second - 1, false}, {1, true}}},
		{"cleared", []time.Duration{2 * time.Second, 0}, []step{{3 * time.Second, false}}},
		{"moved later", []time.Duration{2 * time.Second, 10 * time.Second}, []step{{3 * time.Second, false}, {7 * time.Second, true}}},
		{"moved earlier", []time.Duration{10 * time.Second, time.Second}, []step{{time.Second, true}}},
		{"cleared and set again", []time.Duration{2 * time.Second, 0, 4 * time.Second}, []step{{3 * time.Second, false}, {time.Second, true}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			for _, d := range tt.deadlines {
				at := int64(0)
				if d != 0 {
					at = f.now() + int64(d)
				}
				v, err := f.e.SetCaps(f.sA, f.job, CapsEdit{Deadline: &at}, "")
				if err != nil || v.Deadline != at {
					t.Fatalf("SetCaps(deadline %d) = %d, %v", at, v.Deadline, err)
				}
			}
			for i, s := range tt.steps {
				f.clock.Advance(s.advance)
				_, n := f.e.Reap()
				if (n == 1) != s.ended || n > 1 {
					t.Fatalf("step %d: Reap ended %d nodes, want ended=%v", i, n, s.ended)
				}
			}
			if !tt.steps[len(tt.steps)-1].ended {
				f.consume(f.sA, f.job, "tokens", 1)
			}
		})
	}
}

// 6. Idempotency.

func TestIdempotentRetries(t *testing.T) {
	type call = func(e *Engine, f *fixture, lease LeaseID, rid string) (string, error)
	tests := []struct {
		name  string
		call  call
		other call // the same request id with other arguments
	}{
		{"consume",
			func(e *Engine, f *fixture, _ LeaseID, rid string) (string, error) {
				return "", e.Consume(f.sA, f.job, "tokens", 2, rid)
			},
			func(e *Engine, f *fixture, _ LeaseID, rid string) (string, error) {
				return "", e.Consume(f.sA, f.job, "tokens", 3, rid)
			}},
		{"acquire",
			func(e *Engine, f *fixture, _ LeaseID, rid string) (string, error) {
				g, _, err := e.Acquire(f.sA, AcquireRequest{Node: f.job, Class: "db", Charges: map[string]int64{"tokens": 1}, RequestID: rid})
				return fmt.Sprint(g), err
			},
			func(e *Engine, f *fixture, _ LeaseID, rid string) (string, error) {
				g, _, err := e.Acquire(f.sA, AcquireRequest{Node: f.job, Class: "http", Charges: map[string]int64{"tokens": 1}, RequestID: rid})
				return fmt.Sprint(g), err
			}},
		{"charge-only acquire",
			func(e *Engine, f *fixture, _ LeaseID, rid string) (string, error) {
				g, _, err := e.Acquire(f.sA, AcquireRequest{Node: f.job, Charges: map[string]int64{"tokens": 2}, RequestID: rid})
				return fmt.Sprint(g), err
			},
			func(e *Engine, f *fixture, _ LeaseID, rid string) (string, error) {
				g, _, err := e.Acquire(f.sA, AcquireRequest{Node: f.job, Charges: map[string]int64{"calls": 2}, RequestID: rid})
				return fmt.Sprint(g), err
			}},
		{"create",
			func(e *Engine, f *fixture, _ LeaseID, rid string) (string, error) {
				v, err := e.CreateNode(f.sA, f.acme, NodeSpec{Name: "new", Quotas: map[string]int64{"tokens": 5}}, rid)
				return fmt.Sprint(v.ID, v.Name, v.Quotas), err
			},
			func(e *Engine, f *fixture, _ LeaseID, rid string) (string, error) {
				v, err := e.CreateNode(f.sA, f.acme, NodeSpec{Name: "new", Quotas: map[string]int64{"tokens": 6}}, rid)
				return fmt.Sprint(v.ID), err
			}},
		{"find-or-create that creates",
			func(e *Engine, f *fixture, _ LeaseID, rid string) (string, error) {
				v, created, err := e.FindOrCreate(f.sA, f.acme, NodeSpec{Name: "new"}, rid)
				return fmt.Sprint(v.ID, created), err
			},
			func(e *Engine, f *fixture, _ LeaseID, rid string) (string, error) {
				v, created, err := e.FindOrCreate(f.sA, f.job, NodeSpec{Name: "new"}, rid)
				return fmt.Sprint(v.ID, created), err
			}},
		{"set caps",
			func(e *Engine, f *fixture, _ LeaseID, rid string) (string, error) {
				v, err := e.SetCaps(f.sA, f.job, CapsEdit{Quotas: map[string]int64{"tokens": 50}}, rid)
				return fmt.Sprint(v.ID, v.Quotas), err
			},
			func(e *Engine, f *fixture, _ LeaseID, rid string) (string, error) {
				v, err := e.SetCaps(f.sA, f.job, CapsEdit{Quotas: map[string]int64{"tokens": 50}, Weight: ptr(2)}, rid)
				return fmt.Sprint(v.ID, v.Quotas), err
			}},
		{"end node",
			func(e *Engine, f *fixture, _ LeaseID, rid string) (string, error) {
				v, err := e.EndNode(f.sA, f.job2, Cancelled, rid)
				return fmt.Sprint(v.ID, v.State), err
			},
			func(e *Engine, f *fixture, _ LeaseID, rid string) (string, error) {
				v, err := e.EndNode(f.sA, f.job2, Closed, rid)
				return fmt.Sprint(v.ID, v.State), err
			}},
		{"release",
			func(e *Engine, f *fixture, lease LeaseID, rid string) (string, error) {
				return "", e.Release(f.sA, lease, time.Millisecond, false, rid)
			},
			func(e *Engine, f *fixture, lease LeaseID, rid string) (string, error) {
				return "", e.Release(f.sA, lease+1, time.Millisecond, false, rid)
			}},
	}
	for _, tt := range tests {
		for _, way := range []string{wayLive, wayRestore, wayReplay} {
			t.Run(tt.name+"/"+way, func(t *testing.T) {
				f := newFixture(t)
				lease := f.acquire(f.sA, f.job, "db")
				first, err := tt.call(f.e, f, lease, "req-1")
				if err != nil {
					t.Fatalf("first call: %v", err)
				}
				if last := f.rec.events[len(f.rec.events)-1]; last.RequestID != "req-1" || last.Session != f.sA {
					t.Fatalf("the request id is not in the event it caused: %+v", last)
				}
				e := f.rebuild(t, way)
				var again string
				err = unchanged(t, e, func() (err error) {
					again, err = tt.call(e, f, lease, "req-1")
					return err
				})
				if err != nil || again != first {
					t.Errorf("retry = %q, %v; the original returned %q", again, err, first)
				}
				err = unchanged(t, e, func() error {
					_, err := tt.other(e, f, lease, "req-1")
					return err
				})
				wantErr(t, err, ErrRequestIDReused)
			})
		}
	}
}

func TestIdempotencyRemembersTheLastRequestMemoryIDs(t *testing.T) {
	for _, way := range []string{wayLive, wayRestore, wayReplay} {
		t.Run(way, func(t *testing.T) {
			f := newFixture(t)
			consume := func(e *Engine, i int) error {
				return e.Consume(f.sA, f.job, "tokens", 1, fmt.Sprintf("r%d", i))
			}
			for i := range RequestMemory + 1 { // r0 .. r1024: r0 is pushed out
				if err := consume(f.e, i); err != nil {
					t.Fatal(err)
				}
			}
			e := f.rebuild(t, way)
			for _, s := range e.Snapshot().Sessions {
				if s.ID != f.sA {
					continue
				}
				if len(s.Requests) != RequestMemory || s.Requests[0].ID != "r1" || s.Requests[RequestMemory-1].ID != "r1024" {
					t.Fatalf("session remembers %d ids, %s .. %s", len(s.Requests), s.Requests[0].ID, s.Requests[len(s.Requests)-1].ID)
				}
			}
			used := func() int64 {
				v, err := e.Get(System, f.job)
				if err != nil {
					t.Fatal(err)
				}
				return v.Used["tokens"]
			}
			for _, i := range []int{1, 2, RequestMemory / 2, RequestMemory} {
				if err := unchanged(t, e, func() error { return consume(e, i) }); err != nil {
					t.Errorf("retry of r%d: %v", i, err)
				}
			}
			before, seq := used(), e.Seq()
			if err := consume(e, 0); err != nil || used() != before+1 || e.Seq() != seq+1 {
				t.Fatalf("retry of the forgotten r0: %v, used %d -> %d, seq %d -> %d", err, before, used(), seq, e.Seq())
			}
			// Doing r0 again remembered it, which pushed out r1.
			if err := consume(e, 1); err != nil || used() != before+2 {
				t.Fatalf("retry of r1 after r0 pushed it out: %v, used %d", err, used())
			}
		})
	}
}

// 7. Scope.

func TestScopeRefusesAnotherTenant(t *testing.T) {
	type env struct{ live, ended LeaseID }
	tests := []struct {
		name string
		call func(f *fixture, v env) error
	}{
		{"get", func(f *fixture, _ env) error { _, err := f.e.Get(f.sA, f.otherJob); return err }},
		{"get its tenant", func(f *fixture, _ env) error { _, err := f.e.Get(f.sA, f.other); return err }},
		{"get the root", func(f *fixture, _ env) error { _, err := f.e.Get(f.sA, RootID); return err }},
		{"children", func(f *fixture, _ env) error { _, err := f.e.Children(f.sA, f.other, 0, 0); return err }},
		{"children of the root", func(f *fixture, _ env) error { _, err := f.e.Children(f.sA, RootID, 0, 0); return err }},
		{"create under it", func(f *fixture, _ env) error {
			_, err := f.e.CreateNode(f.sA, f.otherJob, NodeSpec{Name: "x"}, "r")
			return err
		}},
		{"create a tenant", func(f *fixture, _ env) error {
			_, err := f.e.CreateNode(f.sA, RootID, NodeSpec{Name: "evil"}, "")
			return err
		}},
		{"find its task", func(f *fixture, _ env) error {
			_, _, err := f.e.FindOrCreate(f.sA, f.other, NodeSpec{Name: "otherJob"}, "")
			return err
		}},
		{"set its caps", func(f *fixture, _ env) error {
			_, err := f.e.SetCaps(f.sA, f.otherJob, CapsEdit{Quotas: map[string]int64{"tokens": 1}}, "r")
			return err
		}},
		{"set the root's caps", func(f *fixture, _ env) error {
			_, err := f.e.SetCaps(f.sA, RootID, CapsEdit{Limits: map[string]int64{"db": 1 << 40}}, "")
			return err
		}},
		{"end it", func(f *fixture, _ env) error { _, err := f.e.EndNode(f.sA, f.otherJob, Cancelled, "r"); return err }},
		{"end its tenant", func(f *fixture, _ env) error { _, err := f.e.EndNode(f.sA, f.other, Cancelled, ""); return err }},
		{"consume on it", func(f *fixture, _ env) error { return f.e.Consume(f.sA, f.otherJob, "tokens", 1, "r") }},
		{"consume on the root", func(f *fixture, _ env) error { return f.e.Consume(f.sA, RootID, "tokens", 1, "") }},
		{"acquire on it", func(f *fixture, _ env) error {
			_, _, err := f.e.Acquire(f.sA, AcquireRequest{Node: f.otherJob, Class: "db", RequestID: "r"})
			return err
		}},
		{"charge it", func(f *fixture, _ env) error {
			_, _, err := f.e.Acquire(f.sA, AcquireRequest{Node: f.otherJob, Charges: map[string]int64{"tokens": 1}})
			return err
		}},
		{"release its lease", func(f *fixture, v env) error { return f.e.Release(f.sA, v.live, 0, false, "r") }},
		{"validate its lease", func(f *fixture, v env) error { _, err := f.e.Validate(f.sA, v.live); return err }},
		{"release its ended lease", func(f *fixture, v env) error { return f.e.Release(f.sA, v.ended, 0, false, "") }},
		{"validate its ended lease", func(f *fixture, v env) error { _, err := f.e.Validate(f.sA, v.ended); return err }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			v := env{live: f.acquire(f.sB, f.otherJob, "db"), ended: f.acquire(f.sB, f.otherJob, "db")}
			f.release(f.sB, v.ended)
			err := unchanged(t, f.e, func() error { return tt.call(f, v) })
			wantErr(t, err, ErrNotFound) // as if it did not exist
		})
	}
}

func TestScopeNodeIsNotEditableBySessions(t *testing.T) {
	raise := CapsEdit{Quotas: map[string]int64{"tokens": 1 << 40}}
	tests := []struct {
		name string
		call func(f *fixture, admin SessionID) error
		want error
	}{
		{"a tenant raises its own quota", func(f *fixture, _ SessionID) error { _, err := f.e.SetCaps(f.sA, f.acme, raise, ""); return err }, ErrPermission},
		{"a tenant raises its own weight", func(f *fixture, _ SessionID) error {
			_, err := f.e.SetCaps(f.sA, f.acme, CapsEdit{Weight: ptr(100)}, "")
			return err
		}, ErrPermission},
		{"a tenant closes its own node", func(f *fixture, _ SessionID) error { _, err := f.e.EndNode(f.sA, f.acme, Closed, ""); return err }, ErrPermission},
		{"a tenant cancels its own node", func(f *fixture, _ SessionID) error { _, err := f.e.EndNode(f.sA, f.acme, Cancelled, ""); return err }, ErrPermission},
		{"a root session edits the root", func(f *fixture, admin SessionID) error { _, err := f.e.SetCaps(admin, RootID, raise, ""); return err }, ErrPermission},
		{"a root session ends the root", func(f *fixture, admin SessionID) error {
			_, err := f.e.EndNode(admin, RootID, Cancelled, "")
			return err
		}, ErrPermission},
		{"a tenant edits a task", func(f *fixture, _ SessionID) error { _, err := f.e.SetCaps(f.sA, f.job, raise, ""); return err }, nil},
		{"a tenant ends a task", func(f *fixture, _ SessionID) error { _, err := f.e.EndNode(f.sA, f.job, Closed, ""); return err }, nil},
		{"a root session edits a tenant", func(f *fixture, admin SessionID) error { _, err := f.e.SetCaps(admin, f.acme, raise, ""); return err }, nil},
		{"the system session edits the root", func(f *fixture, _ SessionID) error {
			if _, err := f.e.SetCaps(System, RootID, CapsEdit{Quotas: map[string]int64{"tokens": 7}, Limits: map[string]int64{"db": 3}}, ""); err != nil {
				return err
			}
			if v := f.node(RootID); v.Quotas["tokens"] != 7 || v.Limits["db"] != 3 {
				return fmt.Errorf("root caps %v %v", v.Quotas, v.Limits)
			}
			return nil
		}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			admin := f.open(RootID, longTTL)
			if tt.want == nil {
				seq := f.e.Seq()
				wantErr(t, tt.call(f, admin), nil)
				if f.e.Seq() != seq+1 {
					t.Errorf("an allowed edit emitted %d events", f.e.Seq()-seq)
				}
				return
			}
			wantErr(t, unchanged(t, f.e, func() error { return tt.call(f, admin) }), tt.want)
		})
	}
}

// 8. Adaptive limits.

var psp = Adaptive{Class: "psp", TargetP95: 300 * time.Millisecond, MaxOverload: 0.02, MinLimit: 1, MaxLimit: 20}

type sample struct {
	latency    time.Duration
	overloaded bool
}

var (
	fast       = sample{100 * time.Millisecond, false}
	slow       = sample{400 * time.Millisecond, false}
	atTarget   = sample{300 * time.Millisecond, false}
	overloaded = sample{100 * time.Millisecond, true}
)

func samples(parts ...any) []sample {
	var out []sample
	for i := 0; i < len(parts); i += 2 {
		for range parts[i].(int) {
			out = append(out, parts[i+1].(sample))
		}
	}
	return out
}

// adaptiveFixture sets the root's psp limit to start, as a config would.
func adaptiveFixture(t *testing.T, start int64) *fixture {
	f := newFixture(t, psp)
	f.setCaps(RootID, CapsEdit{Limits: map[string]int64{"psp": start}})
	return f
}

// feed reports samples through acquire and release pairs.
func (f *fixture) feed(ss []sample) {
	f.t.Helper()
	for _, s := range ss {
		l := f.acquire(f.sA, f.job, "psp")
		if err := f.e.Release(f.sA, l, s.latency, s.overloaded, ""); err != nil {
			f.t.Fatal(err)
		}
	}
}

// tick lets one adaptive interval pass.
func (f *fixture) tick() {
	f.clock.Advance(DefaultAdaptiveInterval)
	f.e.Reap()
}

func (f *fixture) adaptiveLimit() int64 {
	f.t.Helper()
	v, err := f.e.AdaptiveLimit("psp")
	if err != nil {
		f.t.Fatal(err)
	}
	if root := f.node(RootID).Limits["psp"]; root != v {
		f.t.Fatalf("AdaptiveLimit %d, but the root's limit is %d", v, root)
	}
	return v
}

func TestAdaptiveLimitDecides(t *testing.T) {
	tests := []struct {
		name    string
		start   int64
		samples []sample
		want    int64
	}{
		{"too few samples", 10, samples(9, fast), 10},
		{"too few samples, however slow", 10, samples(9, slow), 10},
		{"healthy", 10, samples(10, fast), 11},
		{"healthy at the maximum", 20, samples(10, fast), 20},
		{"above the maximum is clamped", 30, samples(10, fast), 20},
		{"p95 over the target", 20, samples(10, slow), 14},
		{"p95 at the target is healthy", 10, samples(10, atTarget), 11},
		{"one slow release in 20 is under the p95", 10, samples(19, fast, 1, slow), 11},
		{"two slow releases in 20 put the p95 over", 10, samples(18, fast, 2, slow), 7},
		{"overloaded share over the maximum", 20, samples(9, fast, 1, overloaded), 14},
		{"overloaded share at the maximum", 10, samples(49, fast, 1, overloaded), 11},
		{"a cut is clamped to the minimum", 2, samples(10, slow), 1},
		{"at the minimum a cut does not move", 1, samples(10, slow), 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := adaptiveFixture(t, tt.start)
			seq := f.e.Seq()
			f.feed(tt.samples)
			f.tick()
			if got := f.adaptiveLimit(); got != tt.want {
				t.Errorf("limit %d -> %d, want %d", tt.start, got, tt.want)
			}
			adjusted := 0
			for _, ev := range f.rec.events[seq:] {
				if ev.Kind == EvLimitAdjusted {
					adjusted++
				}
			}
			if moved := tt.want != tt.start; (adjusted == 1) != moved || adjusted > 1 {
				t.Errorf("%d limit events, want moved=%v", adjusted, moved)
			}
		})
	}
}

func TestAdaptiveLimitClimbsOnePerInterval(t *testing.T) {
	f := adaptiveFixture(t, 17)
	f.feed(samples(10, fast))
	f.clock.Advance(DefaultAdaptiveInterval - 1)
	f.e.Reap()
	if got := f.adaptiveLimit(); got != 17 {
		t.Fatalf("decided before the interval: %d", got)
	}
	f.clock.Advance(1)
	f.e.Reap()
	if got := f.adaptiveLimit(); got != 18 {
		t.Fatalf("after the first interval: %d, want 18", got)
	}
	for _, want := range []int64{19, 20, 20} {
		f.feed(samples(10, fast))
		f.tick()
		if got := f.adaptiveLimit(); got != want {
			t.Fatalf("limit %d, want %d", got, want)
		}
	}
	f.tick() // an interval without samples holds
	if got := f.adaptiveLimit(); got != 20 {
		t.Fatalf("after an empty interval: %d", got)
	}
}

func TestAdaptiveLoweringRevokesNothing(t *testing.T) {
	f := adaptiveFixture(t, 20)
	var held []LeaseID
	for range 19 {
		held = append(held, f.acquire(f.sA, f.job, "psp"))
	}
	// Ten slow calls through the twentieth slot: the tenth release cuts the
	// limit to 14 at once, under the 19 leases still held.
	f.feed(samples(10, slow))
	if got := f.adaptiveLimit(); got != 14 {
		t.Fatalf("limit %d, want 14", got)
	}
	if ids := leases(f.e); len(ids) != 19 {
		t.Fatalf("%d live leases after the cut, want all 19", len(ids))
	}
	for _, l := range held {
		if _, err := f.e.Validate(f.sA, l); err != nil {
			t.Errorf("lease %d: %v", l, err)
		}
	}
	w := f.enqueue(f.sA, f.job, "psp")
	for _, l := range held[:5] {
		f.release(f.sA, l)
	}
	noOutcome(t, w, "14 held of limit 14")
	f.release(f.sA, held[5])
	granted(t, w, "13 held of limit 14")
}

// A cut comes as soon as the interval's verdict is certain: once the
// window's overloaded (or slow) calls are too many for the rule to pass even
// if the rest of an interval as busy as the last whole one were healthy,
// and not before.
func TestAdaptiveCutsAsSoonAsTheVerdictIsCertain(t *testing.T) {
	f := adaptiveFixture(t, 10)
	f.feed(samples(100, fast))
	f.tick() // a whole interval of 100 calls: 10 -> 11
	// max_overload 0.02 of 100 calls is 2: a second overloaded call leaves
	// the verdict open, a third settles it.
	f.feed(samples(8, fast, 2, overloaded))
	if got := f.adaptiveLimit(); got != 11 {
		t.Fatalf("limit %d after 2 overloaded calls in 10, of an interval of 100; want 11 until the interval ends", got)
	}
	f.feed(samples(1, overloaded))
	if got := f.adaptiveLimit(); got != 7 {
		t.Fatalf("limit %d after 3 overloaded calls in 11, of an interval of 100; want 7 (11 cut to 70%%) at once", got)
	}
	// p95 likewise: 5 slow calls of 100 are within it, 6 are not.
	f.clock.Advance(time.Second) // calls that began after the cut
	f.tick()
	f.feed(samples(100, fast))
	f.tick() // 7 -> 8, an interval of 100 calls
	f.feed(samples(5, fast, 5, slow))
	if got := f.adaptiveLimit(); got != 8 {
		t.Fatalf("limit %d after 5 slow calls in 10, of an interval of 100; want 8 until the interval ends", got)
	}
	f.feed(samples(1, slow))
	if got := f.adaptiveLimit(); got != 5 {
		t.Fatalf("limit %d after 6 slow calls in 11, of an interval of 100; want 5 (8 cut to 70%%) at once", got)
	}
}

// A cut revokes nothing, so the calls admitted before it go on ending
// overloaded for a while; they are not counted against the new limit. Calls
// whose leases were granted after the cut are.
func TestAdaptiveCountsOnlyCallsBegunAfterTheCut(t *testing.T) {
	f := adaptiveFixture(t, 20)
	var before []LeaseID
	for range 10 {
		before = append(before, f.acquire(f.sA, f.job, "psp"))
	}
	f.clock.Advance(time.Millisecond)
	f.feed(samples(10, overloaded))
	if got := f.adaptiveLimit(); got != 14 {
		t.Fatalf("limit %d, want 14", got)
	}
	for _, l := range before {
		if err := f.e.Release(f.sA, l, 0, true, ""); err != nil {
			t.Fatal(err)
		}
	}
	if got := f.adaptiveLimit(); got != 14 {
		t.Fatalf("limit %d after calls granted before the cut, want it kept at 14", got)
	}
	f.feed(samples(10, overloaded))
	if got := f.adaptiveLimit(); got != 9 {
		t.Fatalf("limit %d after calls granted after the cut, want 9 (14 cut to 70%%)", got)
	}
}

func TestAdaptiveRaiseDispatchesWaiters(t *testing.T) {
	f := adaptiveFixture(t, 10)
	f.feed(samples(10, fast))
	for range 10 {
		f.acquire(f.sA, f.job, "psp")
	}
	w := f.enqueue(f.sA, f.job, "psp")
	f.tick()
	if got := f.adaptiveLimit(); got != 11 {
		t.Fatalf("limit %d, want 11", got)
	}
	granted(t, w, "after the raise")
}

func TestAdaptiveConfigIsValidated(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(a *Adaptive)
		bug    string
	}{
		{name: "empty class", mutate: func(a *Adaptive) { a.Class = "" }},
		{name: "over-long class", mutate: func(a *Adaptive) { a.Class = strings.Repeat("c", MaxNameLen+1) }},
		{name: "NUL in the class", mutate: func(a *Adaptive) { a.Class = "p\x00sp" }},
		{name: "min limit zero", mutate: func(a *Adaptive) { a.MinLimit = 0 }},
		{name: "negative min limit", mutate: func(a *Adaptive) { a.MinLimit = -1 }},
		{name: "max below min", mutate: func(a *Adaptive) { a.MinLimit, a.MaxLimit = 5, 4 }},
		{name: "zero target", mutate: func(a *Adaptive) { a.TargetP95 = 0 }},
		{name: "negative target", mutate: func(a *Adaptive) { a.TargetP95 = -time.Millisecond }},
		{name: "negative max overload", mutate: func(a *Adaptive) { a.MaxOverload = -0.01 }},
		{name: "max overload over 1", mutate: func(a *Adaptive) { a.MaxOverload = 1.01 }},
		{name: "negative interval", mutate: func(a *Adaptive) { a.Interval = -time.Second }},
		{name: "negative min samples", mutate: func(a *Adaptive) { a.MinSamples = -1 }},
		{name: "NaN max overload", mutate: func(a *Adaptive) { a.MaxOverload = math.NaN() },
			bug: "newController checks MaxOverload < 0 || > 1, which NaN passes, so an adaptive class that can never cut for overload is accepted; check !(a.MaxOverload >= 0 && a.MaxOverload <= 1) (adaptive.go)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := psp
			tt.mutate(&a)
			e, err := New(Config{Clock: newFakeClock(), Adaptive: []Adaptive{a}})
			if err == nil && tt.bug != "" {
				knownBug(t, "%s", tt.bug)
			}
			wantErr(t, err, ErrInvalid)
			if e != nil {
				t.Error("New returned an engine with its error")
			}
		})
	}
	t.Run("a class configured twice", func(t *testing.T) {
		_, err := New(Config{Clock: newFakeClock(), Adaptive: []Adaptive{psp, psp}})
		wantErr(t, err, ErrInvalid)
	})
	t.Run("edges are valid", func(t *testing.T) {
		a, b := psp, psp
		a.MaxOverload, a.MinLimit, a.MaxLimit = 0, 3, 3
		b.Class, b.MaxOverload = "llm", 1
		if _, err := New(Config{Clock: newFakeClock(), Adaptive: []Adaptive{a, b}}); err != nil {
			t.Error(err)
		}
	})
}

func TestAdaptiveLimitHoldsBeforeTheFirstDecision(t *testing.T) {
	f := newFixture(t, psp) // no root limit for psp configured
	if got, err := f.e.AdaptiveLimit("psp"); err != nil || got != psp.MaxLimit {
		t.Fatalf("AdaptiveLimit = %d, %v; want %d", got, err, psp.MaxLimit)
	}
	for range psp.MaxLimit {
		f.acquire(f.sA, f.job, "psp")
	}
	g, w, err := f.e.Acquire(f.sA, AcquireRequest{Node: f.job, Class: "psp"})
	if err == nil && w == nil {
		knownBug(t, "AdaptiveLimit reports %d, yet lease %d of psp was granted: until the first tick the root has no psp limit at all (AdaptiveLimit falls back to MaxLimit, fits sees nothing). Either set the root limit to MaxLimit when the controller is created (e.g. tick on the first Reap regardless of the interval when the root has no limit, and document that the config must set it) or make AdaptiveLimit report no limit", psp.MaxLimit, g.Lease)
	}
	if err != nil || w == nil {
		t.Fatalf("lease %d of psp: %+v, %v; want it queued", psp.MaxLimit+1, g, err)
	}
}

// 9. Reading the tree.

func TestChildrenPages(t *testing.T) {
	f := newFixture(t)
	var ids []NodeID
	for i := range 5 {
		ids = append(ids, f.create(f.sA, f.job2, NodeSpec{Name: fmt.Sprintf("c%d", i)}))
		if i == 1 {
			f.create(f.sA, f.job, NodeSpec{Name: "elsewhere"}) // a gap in the ids
		}
	}
	if _, err := f.e.EndNode(f.sA, ids[1], Closed, ""); err != nil { // ended children are listed too
		t.Fatal(err)
	}
	all := []int{0, 1, 2, 3, 4}
	tests := []struct {
		name  string
		after NodeID
		limit int
		want  []int // indexes into ids
		bug   string
	}{
		{name: "all", after: 0, limit: 0, want: all},
		{name: "a negative limit is all", after: 0, limit: -1, want: all},
		{name: "the first page", after: 0, limit: 2, want: []int{0, 1}},
		{name: "the next page", after: ids[1], limit: 2, want: []int{2, 3}},
		{name: "after an id that is not a child", after: ids[1] + 1, limit: 2, want: []int{2, 3}},
		{name: "a short last page", after: ids[3], limit: 2, want: []int{4}},
		{name: "after the last", after: ids[4], limit: 2, want: nil},
		{name: "a limit above the count", after: ids[2], limit: 100, want: []int{3, 4}},
		{name: "after a negative id", after: -1, limit: 0, want: all},
		{name: "after the largest id", after: math.MaxInt64, limit: 0, want: nil},
		{name: "after the smallest id", after: math.MinInt64, limit: 0, want: all,
			bug: "Children compares ids by subtraction (int(c.id - id) in slices.BinarySearchFunc, tree.go), which overflows for after near math.MinInt64, so the search lands past the end and returns no children; use cmp.Compare(c.id, id)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := f.e.Children(f.sA, f.job2, tt.after, tt.limit)
			if err != nil {
				t.Fatal(err)
			}
			var gotIDs, wantIDs []NodeID
			for _, v := range got {
				gotIDs = append(gotIDs, v.ID)
			}
			for _, i := range tt.want {
				wantIDs = append(wantIDs, ids[i])
			}
			if !slices.Equal(gotIDs, wantIDs) {
				if tt.bug != "" {
					knownBug(t, "after %d: got %v, want %v: %s", tt.after, gotIDs, wantIDs, tt.bug)
				}
				t.Errorf("Children(after %d, limit %d) = %v, want %v", tt.after, tt.limit, gotIDs, wantIDs)
			}
		})
	}
	t.Run("paging visits every child once", func(t *testing.T) {
		var seen []NodeID
		after := NodeID(0)
		for range 10 {
			page, err := f.e.Children(f.sA, f.job2, after, 2)
			if err != nil {
				t.Fatal(err)
			}
			if len(page) == 0 {
				break
			}
			for _, v := range page {
				seen = append(seen, v.ID)
			}
			after = page[len(page)-1].ID
		}
		if !slices.Equal(seen, ids) {
			t.Errorf("pages visited %v, want %v", seen, ids)
		}
	})
	t.Run("a leaf has none", func(t *testing.T) {
		if got, err := f.e.Children(f.sA, f.step, 0, 0); err != nil || got != nil {
			t.Errorf("Children(step) = %v, %v", got, err)
		}
	})
}

func TestGetReportsANode(t *testing.T) {
	f := newFixture(t)
	deep := f.create(f.sA, f.step, NodeSpec{Name: "deep"})
	f.setCaps(f.job, CapsEdit{Quotas: map[string]int64{"tokens": 9}, Limits: map[string]int64{"db": 2}})
	f.consume(f.sA, f.step, "tokens", 4)
	f.acquire(f.sA, f.step, "db")
	if _, err := f.e.EndNode(f.sA, f.job2, Cancelled, ""); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		id   NodeID
		want NodeView
	}{
		{RootID, NodeView{ID: RootID, Name: "root", Kind: KindRoot, Used: map[string]int64{"tokens": 4}, Held: map[string]int64{"db": 1}}},
		{f.acme, NodeView{Parent: RootID, Name: "acme", Kind: KindTenant, Used: map[string]int64{"tokens": 4}, Held: map[string]int64{"db": 1}}},
		{f.job, NodeView{Parent: f.acme, Name: "job", Kind: KindTask, Quotas: map[string]int64{"tokens": 9},
			Used: map[string]int64{"tokens": 4}, Limits: map[string]int64{"db": 2}, Held: map[string]int64{"db": 1}}},
		{f.step, NodeView{Parent: f.job, Name: "step", Kind: KindSubtask, Used: map[string]int64{"tokens": 4}, Held: map[string]int64{"db": 1}}},
		{deep, NodeView{Parent: f.step, Name: "deep", Kind: KindSubtask}},
		{f.job2, NodeView{Parent: f.acme, Name: "job2", Kind: KindTask, State: Cancelled, Ended: f.clock.Now().UnixNano()}},
	}
	for _, tt := range tests {
		t.Run(tt.want.Name, func(t *testing.T) {
			want := tt.want
			want.ID, want.Weight = tt.id, 1
			if tt.id != RootID {
				want.Created = f.clock.Now().UnixNano() // the fixture makes every node at its start
			}
			got, err := f.e.Get(f.sA, tt.id)
			if tt.id == RootID {
				wantErr(t, err, ErrNotFound) // outside a tenant's scope
				got, err = f.e.Get(System, tt.id)
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("Get(%d)\n got %+v\nwant %+v", tt.id, got, want)
			}
		})
	}
}

// The engine keeps its own copies: a caller that changes a map it passed in,
// or one it got back, changes neither the state nor the recorded event.
func TestCallerMapsAreCopied(t *testing.T) {
	f := newFixture(t)
	spec := NodeSpec{Name: "new", Quotas: map[string]int64{"tokens": 5}, DefaultLimits: map[string]int64{"db": 1}}
	v, err := f.e.CreateNode(f.sA, f.acme, spec, "")
	if err != nil {
		t.Fatal(err)
	}
	created := f.rec.events[len(f.rec.events)-1]
	edit := CapsEdit{Limits: map[string]int64{"db": 2}, Weight: ptr(3)}
	if _, err := f.e.SetCaps(f.sA, v.ID, edit, ""); err != nil {
		t.Fatal(err)
	}
	edited := f.rec.events[len(f.rec.events)-1]
	charges := map[string]int64{"tokens": 1}
	if _, _, err := f.e.Acquire(f.sA, AcquireRequest{Node: v.ID, Charges: charges}); err != nil {
		t.Fatal(err)
	}
	before := f.e.Snapshot()

	spec.Quotas["tokens"], spec.DefaultLimits["db"] = 500, 100
	edit.Limits["db"], *edit.Weight = 200, 30
	charges["tokens"] = 1000
	got := f.node(v.ID)
	got.Quotas["tokens"], got.Used["tokens"] = 9999, 9999

	if after := f.e.Snapshot(); !reflect.DeepEqual(after, before) {
		t.Errorf("changing the caller's maps changed the state:\n%s", diffSnapshots(before, after))
	}
	if created.Spec.Quotas["tokens"] != 5 || created.Spec.DefaultLimits["db"] != 1 {
		t.Errorf("the recorded spec changed: %+v", created.Spec)
	}
	if edited.Caps.Limits["db"] != 2 || *edited.Caps.Weight != 3 {
		t.Errorf("the recorded edit changed: %+v (weight %d)", edited.Caps, *edited.Caps.Weight)
	}
}

// Known bugs found by reading the engine, each shown by a test.

// A sibling past its deadline that nothing has touched yet still holds its
// name, so whether the name is free depends on when Reap last ran.
func TestCreateNodeOverASiblingPastItsDeadline(t *testing.T) {
	for _, find := range []bool{false, true} {
		t.Run(fmt.Sprintf("find=%v", find), func(t *testing.T) {
			f := newFixture(t)
			old := f.create(f.sA, f.acme, NodeSpec{Name: "batch", Deadline: f.now() + int64(time.Second)})
			f.clock.Advance(time.Second)
			var v NodeView
			var err error
			created := true
			if find {
				v, created, err = f.e.FindOrCreate(f.sA, f.acme, NodeSpec{Name: "batch"}, "")
			} else {
				v, err = f.e.CreateNode(f.sA, f.acme, NodeSpec{Name: "batch"}, "")
			}
			if errors.Is(err, ErrExists) || (err == nil && !created) {
				knownBug(t, "a sibling past its deadline still owns its name until something touches it or Reap runs (got %v, found node %d): createNode (tree.go) looks up parent.open[name] without checking the sibling's deadline; run checkOpen on an existing sibling (ending it lazily) before ErrExists / returning it as found", err, v.ID)
			}
			if err != nil || v.ID == old || !created {
				t.Fatalf("got node %d (created %v), %v; want a new node", v.ID, created, err)
			}
			if st := f.node(old).State; st != Expired {
				t.Errorf("the old task is %s", st)
			}
		})
	}
}

// A waiter whose session has passed its TTL, with nothing to notice yet, is
// granted a lease ahead of a live waiter.
func TestWaiterOfAnExpiredSessionIsNotGranted(t *testing.T) {
	f, holder := waitFixture(t)
	s1 := f.open(f.acme, testTTL)
	w1 := f.enqueue(s1, f.job, "db")
	s2 := f.open(f.acme, longTTL)
	w2 := f.enqueue(s2, f.job, "db")
	f.clock.Advance(testTTL) // s1 is past its TTL; nothing has touched it
	f.release(f.sA, holder)
	o1, _ := outcome(w1)
	if o1.Err == nil && o1.Grant.Lease != 0 {
		knownBug(t, "lease %d was granted to session %d after its TTL passed, while a live waiter waits: dispatchClass (queue.go) checks the waiter's node (checkOpen) but not its session; check w.session.expired(now) and end the session (endSession, which fails its waiters) before granting", o1.Grant.Lease, s1)
	}
	wantErr(t, o1.Err, ErrSessionExpired)
	granted(t, w2, "the live waiter")
}

// Lowering a tenant's weight in the middle of its turn leaves it the rest of
// the old, larger turn. Found by TestRandomized with seed 860 (I6 DRR).
func TestTenantWeightLoweredMidTurn(t *testing.T) {
	f := newFixture(t)
	f.setCaps(RootID, CapsEdit{Limits: map[string]int64{"db": 1}})
	f.setCaps(f.acme, CapsEdit{Weight: ptr(3)})
	holder := f.acquire(f.sA, f.job, "db")
	waits := map[string]*Wait{}
	for _, name := range []string{"acme#1", "acme#2", "acme#3"} {
		waits[name] = f.enqueue(f.sA, f.job, "db")
	}
	waits["other"] = f.enqueue(f.sB, f.otherJob, "db")
	next := func() string {
		f.t.Helper()
		f.release(f.sA, holder)
		for name, w := range waits {
			if o, ok := outcome(w); ok {
				delete(waits, name)
				holder = o.Grant.Lease
				return name
			}
		}
		t.Fatal("nobody was granted the slot")
		return ""
	}
	if got := next(); got != "acme#1" {
		t.Fatalf("first grant went to %s", got)
	}
	// acme has used one grant of a turn of 3; now its weight is 1, so it
	// may take at most one more before other is served.
	f.setCaps(f.acme, CapsEdit{Weight: ptr(1)})
	var got []string
	for len(got) < 2 {
		if got = append(got, next()); got[len(got)-1] == "other" {
			return
		}
	}
	knownBug(t, "after acme's weight went from 3 to 1 mid-turn, acme got %v before other was served: the tenant queue keeps the deficit of the old weight (queue.go, tenantQueue.deficit), breaking SPEC I6 (deficit in [0, weight]; TestRandomized seed 860 finds it too). Clamp it when the weight changes, e.g. in node.applyCaps (tree.go) after n.weight = *c.Weight: for each e.queues[class].byNode[n], tq.deficit = min(tq.deficit, n.weight) (clamping later, in next(), still lets the checker see deficit > weight after the edit)", got)
}

// A retry of an Acquire whose grant was given back by CancelWait returns the
// given-back lease as if it were held.
func TestCancelledGrantIsNotReturnedByARetry(t *testing.T) {
	f, holder := waitFixture(t)
	s2 := f.open(f.acme, longTTL)
	req := AcquireRequest{Node: f.job, Class: "db", RequestID: "acq-1"}
	_, w, err := f.e.Acquire(s2, req)
	if err != nil || w == nil {
		t.Fatalf("Acquire: %v, queued %v", err, w != nil)
	}
	f.release(f.sA, holder) // granted...
	f.e.CancelWait(w)       // ...but the caller gave up at that instant: given back
	g, w2, err := f.e.Acquire(s2, req)
	if err != nil || (w2 == nil && g.Lease == 0) {
		t.Fatalf("retry: %+v, %v", g, err)
	}
	if w2 != nil {
		return // queued afresh: fine
	}
	if _, verr := f.e.Validate(s2, g.Lease); verr != nil {
		knownBug(t, "the retry returned lease %d, which CancelWait gave back (%v): the caller never saw the grant, yet the request id stays remembered with that lease, so the retry reports success without a lease. When CancelWait gives a grant back, drop the request id from the session's memory (say, by emitting the release with the request id and a flag that apply uses to forget it), so the retry is decided afresh", g.Lease, verr)
	}
}

// A charge-and-acquire whose caller gave up at the instant of its grant is
// undone whole: its charges come back, and the retry charges exactly once.
func TestCancelledGrantUndoesItsCharges(t *testing.T) {
	f, holder := waitFixture(t)
	s2 := f.open(f.acme, longTTL)
	req := AcquireRequest{Node: f.job, Class: "db", Charges: map[string]int64{"tokens": 5}, RequestID: "cha-1"}
	used := func() int64 {
		v, err := f.e.Get(System, f.job)
		if err != nil {
			t.Fatal(err)
		}
		return v.Used["tokens"]
	}
	_, w, err := f.e.Acquire(s2, req)
	if err != nil || w == nil {
		t.Fatalf("Acquire: %v, queued %v", err, w != nil)
	}
	f.release(f.sA, holder) // granted, and charged...
	if got := used(); got != 5 {
		t.Fatalf("after the grant %d tokens are used, want 5", got)
	}
	f.e.CancelWait(w) // ...but the caller gave up at that instant
	if got := used(); got != 0 {
		t.Fatalf("after the grant was given back %d tokens are used, want 0", got)
	}
	g, w2, err := f.e.Acquire(s2, req)
	if err != nil || w2 != nil || g.Lease == 0 {
		t.Fatalf("retry: %+v, queued %v, %v", g, w2 != nil, err)
	}
	if got := used(); got != 5 {
		t.Fatalf("after the retry %d tokens are used, want 5 (charged once)", got)
	}
}
