package engine

import (
	"errors"
	"reflect"
	"testing"
	"time"
)

// An override reverts by itself when its time has passed on the engine's
// clock, by an event that replay and a restore give back exactly, and the
// audit trail keeps who, when, why, and the old and new values of every
// change, the revert included.
func TestOverrideRevertsByItselfAndIsAudited(t *testing.T) {
	f := newFixture(t)
	f.setCaps(f.job, CapsEdit{Quotas: map[string]int64{"tokens": 1000}, Limits: map[string]int64{"db": 4}})
	admin := f.open(RootID, longTTL)
	start := f.now()

	v, err := f.e.SetCapsAudited(f.sA, f.job, CapsEdit{Quotas: map[string]int64{"tokens": 50000}},
		Audit{Reason: "incident 7: batch backlog", For: 2 * time.Hour}, "r1")
	if err != nil {
		t.Fatal(err)
	}
	if v.Quotas["tokens"] != 50000 {
		t.Fatalf("the override's answer shows tokens %d, want 50000", v.Quotas["tokens"])
	}
	if d, ok := f.e.DueIn(); !ok || d > 2*time.Hour {
		t.Fatalf("DueIn = %v, %v; want at most the override's 2h", d, ok)
	}
	// A retry with the same id and arguments changes nothing; other
	// arguments under the same id are refused.
	seq := f.e.Seq()
	if _, err := f.e.SetCapsAudited(f.sA, f.job, CapsEdit{Quotas: map[string]int64{"tokens": 50000}},
		Audit{Reason: "incident 7: batch backlog", For: 2 * time.Hour}, "r1"); err != nil || f.e.Seq() != seq {
		t.Fatalf("a retry: %v, seq %d -> %d", err, seq, f.e.Seq())
	}
	_, err = f.e.SetCapsAudited(f.sA, f.job, CapsEdit{Quotas: map[string]int64{"tokens": 50000}},
		Audit{Reason: "another reason", For: 2 * time.Hour}, "r1")
	wantErr(t, err, ErrRequestIDReused)

	// The admin lowers the limit for an hour on top.
	f.clock.Advance(time.Minute)
	if _, err := f.e.SetCapsAudited(admin, f.job, CapsEdit{Limits: map[string]int64{"db": 1}},
		Audit{Reason: "db failover", For: time.Hour}, ""); err != nil {
		t.Fatal(err)
	}

	// Nothing moves a nanosecond early.
	f.clock.Advance(time.Hour - 1)
	f.e.Reap()
	if got := f.node(f.job).Limits["db"]; got != 1 {
		t.Fatalf("a nanosecond before its hour, limit db is %d, want 1", got)
	}
	f.clock.Advance(1)
	if d, ok := f.e.DueIn(); !ok || d != 0 {
		t.Fatalf("at the limit's revert DueIn = %v, %v; want 0", d, ok)
	}
	f.e.Reap()
	if got := f.node(f.job); got.Limits["db"] != 4 || got.Quotas["tokens"] != 50000 {
		t.Fatalf("after an hour: limits %v quotas %v, want db back at 4 and tokens still 50000", got.Limits, got.Quotas)
	}
	f.clock.Advance(time.Hour - time.Minute)
	f.e.Reap()
	if got := f.node(f.job).Quotas["tokens"]; got != 1000 {
		t.Fatalf("after two hours tokens is %d, want 1000 back", got)
	}
	if _, ok := f.e.DueIn(); ok {
		t.Fatal("DueIn still says something is due after every override reverted")
	}

	changes, pending, err := f.e.CapsHistory(f.open(f.acme, longTTL), f.job)
	if err != nil {
		t.Fatal(err)
	}
	if len(pending) != 0 {
		t.Fatalf("pending overrides %v after both reverted", pending)
	}
	want := []CapsChange{
		{At: start, Who: WhoConfig, Old: CapsEdit{Quotas: map[string]int64{"tokens": NoCap}, Limits: map[string]int64{"db": NoCap}},
			New: CapsEdit{Quotas: map[string]int64{"tokens": 1000}, Limits: map[string]int64{"db": 4}}},
		{At: start, Who: "tenant:acme", Reason: "incident 7: batch backlog", Until: start + int64(2*time.Hour),
			Old: CapsEdit{Quotas: map[string]int64{"tokens": 1000}}, New: CapsEdit{Quotas: map[string]int64{"tokens": 50000}}},
		{At: start + int64(time.Minute), Who: WhoAdmin, Reason: "db failover", Until: start + int64(time.Minute+time.Hour),
			Old: CapsEdit{Limits: map[string]int64{"db": 4}}, New: CapsEdit{Limits: map[string]int64{"db": 1}}},
		{At: start + int64(time.Minute+time.Hour), Who: WhoGovernord, Reason: "temporary override expired", Revert: true,
			Old: CapsEdit{Limits: map[string]int64{"db": 1}}, New: CapsEdit{Limits: map[string]int64{"db": 4}}},
		{At: start + int64(2*time.Hour), Who: WhoGovernord, Reason: "temporary override expired", Revert: true,
			Old: CapsEdit{Quotas: map[string]int64{"tokens": 50000}}, New: CapsEdit{Quotas: map[string]int64{"tokens": 1000}}},
	}
	for i := range changes {
		changes[i].Seq = 0 // compared apart: each names its event
	}
	if !reflect.DeepEqual(changes, want) {
		t.Fatalf("audit trail:\n got %+v\nwant %+v", changes, want)
	}
	for _, way := range []string{wayReplay, wayRestore} {
		r := f.rebuild(t, way)
		if got, want := r.Snapshot(), f.e.Snapshot(); !reflect.DeepEqual(got.Audit, want.Audit) {
			t.Fatalf("%s: audit %+v, live %+v", way, got.Audit, want.Audit)
		}
	}
}

// A restart in the middle of an override keeps it: the engine rebuilt from
// a snapshot, or from the events, reverts it at the same instant.
func TestOverrideSurvivesARestart(t *testing.T) {
	for _, way := range []string{wayReplay, wayRestore} {
		t.Run(way, func(t *testing.T) {
			f := newFixture(t)
			f.setCaps(f.job, CapsEdit{Quotas: map[string]int64{"tokens": 10}})
			if _, err := f.e.SetCapsAudited(f.sA, f.job, CapsEdit{Quotas: map[string]int64{"tokens": 99}},
				Audit{Reason: "spike", For: 10 * time.Minute}, ""); err != nil {
				t.Fatal(err)
			}
			f.clock.Advance(5 * time.Minute)
			r := f.rebuild(t, way)
			f.clock.Advance(5*time.Minute - 1)
			r.Reap()
			if got := nodeOf(t, r, f.job).Quotas["tokens"]; got != 99 {
				t.Fatalf("rebuilt, before the end: tokens %d, want 99", got)
			}
			f.clock.Advance(1)
			r.Reap()
			if got := nodeOf(t, r, f.job).Quotas["tokens"]; got != 10 {
				t.Fatalf("rebuilt, at the end: tokens %d, want 10 back", got)
			}
		})
	}
}

func nodeOf(t *testing.T, e *Engine, id NodeID) NodeView {
	t.Helper()
	v, err := e.Get(System, id)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// Overrides stack on the value before the first, a permanent edit of a cap
// cancels its pending revert, and a node with no cap before gets none back.
func TestOverridesStackAndPermanentEditsWin(t *testing.T) {
	f := newFixture(t)
	set := func(edit CapsEdit, d time.Duration) {
		t.Helper()
		if _, err := f.e.SetCapsAudited(f.sA, f.job, edit, Audit{Reason: "x", For: d}, ""); err != nil {
			t.Fatal(err)
		}
	}
	set(CapsEdit{Quotas: map[string]int64{"a": 5, "b": 5}}, time.Hour)
	set(CapsEdit{Quotas: map[string]int64{"a": 7}}, 2*time.Hour) // extends a, still back to none
	set(CapsEdit{Quotas: map[string]int64{"b": 9}}, 0)           // b is permanent now
	f.clock.Advance(time.Hour)
	f.e.Reap()
	if got := f.node(f.job).Quotas; !reflect.DeepEqual(got, map[string]int64{"a": 7, "b": 9}) {
		t.Fatalf("after an hour quotas %v, want a 7 (extended) and b 9 (made permanent)", got)
	}
	f.clock.Advance(time.Hour)
	f.e.Reap()
	if got := f.node(f.job).Quotas; !reflect.DeepEqual(got, map[string]int64{"b": 9}) {
		t.Fatalf("after two hours quotas %v, want a back to no cap", got)
	}
}

// An override on a node that ends meanwhile still reverts, and a reclaimed
// node's pending revert goes with it: nothing is left due.
func TestOverrideOnAnEndedNode(t *testing.T) {
	f := newFixture(t)
	if _, err := f.e.SetCapsAudited(f.sA, f.job2, CapsEdit{Limits: map[string]int64{"db": 3}}, Audit{For: time.Hour}, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := f.e.EndNode(f.sA, f.job2, Closed, ""); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(DefaultRetention + time.Second)
	f.e.Reap()
	if _, err := f.e.Get(System, f.job2); !errors.Is(err, ErrNotFound) {
		t.Fatalf("job2 after the retention: %v, want reclaimed", err)
	}
	f.clock.Advance(time.Hour)
	f.e.Reap()
	if len(f.e.overridden) != 0 {
		t.Fatalf("a reclaimed node's override is still pending: %v", f.e.overridden)
	}
	for _, way := range []string{wayReplay, wayRestore} {
		if r := f.rebuild(t, way); !reflect.DeepEqual(r.Snapshot(), f.e.Snapshot()) {
			t.Fatalf("%s differs from the live engine", way)
		}
	}
}

func TestOverrideBadInput(t *testing.T) {
	f := newFixture(t)
	for _, tc := range []struct {
		edit CapsEdit
		a    Audit
	}{
		{CapsEdit{Weight: ptr(2)}, Audit{For: time.Hour}},
		{CapsEdit{Quotas: map[string]int64{"a": 1}, DefaultQuotas: map[string]int64{"a": 1}}, Audit{For: time.Hour}},
		{CapsEdit{}, Audit{For: time.Hour}},
		{CapsEdit{Quotas: map[string]int64{"a": 1}}, Audit{For: -time.Second}},
		{CapsEdit{Quotas: map[string]int64{"a": 1}}, Audit{Reason: string(make([]byte, MaxReason+1))}},
	} {
		err := unchanged(t, f.e, func() error {
			_, err := f.e.SetCapsAudited(f.sA, f.job, tc.edit, tc.a, "")
			return err
		})
		wantErr(t, err, ErrInvalid)
	}
	// Another tenant's node is not found, its history too.
	_, err := f.e.SetCapsAudited(f.sB, f.job, CapsEdit{Quotas: map[string]int64{"a": 1}}, Audit{For: time.Hour}, "")
	wantErr(t, err, ErrNotFound)
	_, _, err = f.e.CapsHistory(f.sB, f.job)
	wantErr(t, err, ErrNotFound)
}

// Paths resolve from the root through open nodes, inside the scope only.
func TestLookupByPath(t *testing.T) {
	f := newFixture(t)
	for _, tc := range []struct {
		sid  SessionID
		path string
		want NodeID
		err  error
	}{
		{System, "acme/job/step", f.step, nil},
		{f.sA, "acme/job", f.job, nil},
		{f.sA, "/acme/job/", f.job, nil},
		{f.sA, "acme", f.acme, nil},
		{f.sA, "other/otherJob", 0, ErrNotFound},
		{f.sB, "acme", 0, ErrNotFound},
		{f.sA, "acme/nope", 0, ErrNotFound},
		{f.sA, "acme//job", 0, ErrInvalid},
	} {
		v, err := f.e.Lookup(tc.sid, tc.path)
		if tc.err != nil {
			wantErr(t, err, tc.err)
			continue
		}
		if err != nil || v.ID != tc.want {
			t.Errorf("Lookup(%q) = %d, %v; want %d", tc.path, v.ID, err, tc.want)
		}
	}
}
