package engine

import (
	"fmt"
	"reflect"
	"testing"
	"time"
)

// Grants given back because their callers never learned of them
// (giveback.go): whole, found by request id or by what the caller says,
// once, and the same after a rebuild.

func TestGiveBackUndoesALeaseWhole(t *testing.T) {
	f, holder := waitFixture(t)
	f.setCaps(f.job, CapsEdit{Quotas: map[string]int64{"tokens": 10}})
	f.release(f.sA, holder)
	s2 := f.open(f.acme, longTTL)
	req := AcquireRequest{Node: f.job, Class: "db", Charges: map[string]int64{"tokens": 4}, RequestID: "acq-1"}
	g, w, err := f.e.Acquire(s2, req)
	if err != nil || w != nil {
		t.Fatalf("Acquire: %+v, queued %v, %v", g, w != nil, err)
	}
	waiter := f.enqueue(f.sA, f.job2, "db") // the slot's next holder

	// Another session's give-back of the same request id finds nothing.
	unchanged(t, f.e, func() error { _, err := f.e.GiveBack(f.sA, req, 0); return err })
	// A request id used for something else is a reuse.
	other := req
	other.Class = "http"
	_, err = f.e.GiveBack(s2, other, 0)
	wantErr(t, err, ErrRequestIDReused)

	id, err := f.e.GiveBack(s2, req, 0)
	if err != nil || id != g.Lease {
		t.Fatalf("GiveBack = %d, %v; want lease %d", id, err, g.Lease)
	}
	if v := f.node(f.job); v.Used["tokens"] != 0 || v.Held["db"] != 0 {
		t.Errorf("after the give-back job has used %d tokens and holds %d, want none", v.Used["tokens"], v.Held["db"])
	}
	granted(t, waiter, "the next waiter")
	unchanged(t, f.e, func() error { _, err := f.e.GiveBack(s2, req, 0); return err }) // twice is harmless

	// The request id is forgotten: the same request is decided afresh (it
	// queues behind the waiter that has the slot now).
	if _, w, err := f.e.Acquire(s2, req); err != nil || w == nil {
		t.Fatalf("the request again: queued %v, %v; want it decided afresh", w != nil, err)
	}
	for _, way := range []string{wayRestore, wayReplay} {
		if got, want := f.rebuild(t, way).Snapshot(), f.e.Snapshot(); !reflect.DeepEqual(got, want) {
			t.Errorf("%s differs:\n%s", way, diffSnapshots(want, got))
		}
	}
}

func TestGiveBackWithoutARequestIDTakesTheLeaseNamed(t *testing.T) {
	f := newFixture(t)
	req := AcquireRequest{Node: f.job, Class: "db"}
	lease := f.acquire(f.sA, f.job, "db")
	mismatched := []AcquireRequest{
		{Node: f.job, Class: "http"}, // another class
		{Node: f.job2, Class: "db"},  // another node
	}
	for _, r := range mismatched {
		unchanged(t, f.e, func() error { _, err := f.e.GiveBack(f.sA, r, lease); return err })
	}
	unchanged(t, f.e, func() error { _, err := f.e.GiveBack(f.sB, req, lease); return err }) // not its lease
	if id, err := f.e.GiveBack(f.sA, req, lease); err != nil || id != lease {
		t.Fatalf("GiveBack = %d, %v", id, err)
	}
	_, err := f.e.Validate(f.sA, lease)
	wantErr(t, err, ErrLeaseReleased)
	// A charge made without a lease is never refunded.
	charge := AcquireRequest{Node: f.job, Charges: map[string]int64{"tokens": 2}, RequestID: "charge"}
	if _, _, err := f.e.Acquire(f.sA, charge); err != nil {
		t.Fatal(err)
	}
	unchanged(t, f.e, func() error { _, err := f.e.GiveBack(f.sA, charge, 0); return err })
}

func TestGiveBackBlockTakesBackWhatTheGrowthAdded(t *testing.T) {
	f := newFixture(t)
	f.setCaps(f.acme, CapsEdit{Limits: map[string]int64{"db": 10}})
	first := BlockRequest{Node: f.job, Class: "db", Want: 2, RequestID: "b-1"}
	if _, err := f.e.Block(f.sA, first); err != nil {
		t.Fatal(err)
	}
	grow := BlockRequest{Node: f.job, Class: "db", Want: 5, RequestID: "b-2"}
	if g, err := f.e.Block(f.sA, grow); err != nil || g.Granted != 5 || g.Count != 7 {
		t.Fatalf("growth: %+v, %v", g, err)
	}
	g, k, err := f.e.GiveBackBlock(f.sA, grow, 0)
	if err != nil || k != 5 || g.Count != 2 {
		t.Fatalf("GiveBackBlock = %+v, %d, %v; want 5 taken back, 2 left", g, k, err)
	}
	if held := f.node(f.acme).Held["db"]; held != 2 {
		t.Errorf("acme holds %d slots, want the first request's 2", held)
	}
	// Twice is harmless, and the request again adds nothing.
	unchanged(t, f.e, func() error { _, _, err := f.e.GiveBackBlock(f.sA, grow, 0); return err })
	unchanged(t, f.e, func() error {
		g, err := f.e.Block(f.sA, grow)
		if g.Granted != 0 {
			t.Errorf("the request again granted %d", g.Granted)
		}
		return err
	})
	// A shrink is not undone.
	shrink := BlockRequest{Node: f.job, Class: "db", Return: 1, RequestID: "b-3"}
	if _, err := f.e.Block(f.sA, shrink); err != nil {
		t.Fatal(err)
	}
	unchanged(t, f.e, func() error { _, _, err := f.e.GiveBackBlock(f.sA, shrink, 0); return err })
	// Without a request id, the caller says how many slots were added.
	if _, err := f.e.Block(f.sA, BlockRequest{Node: f.job, Class: "db", Want: 3}); err != nil {
		t.Fatal(err)
	}
	if g, k, err := f.e.GiveBackBlock(f.sA, BlockRequest{Node: f.job, Class: "db", Want: 3}, 3); err != nil || k != 3 || g.Count != 1 {
		t.Fatalf("GiveBackBlock without an id = %+v, %d, %v", g, k, err)
	}
	for _, way := range []string{wayRestore, wayReplay} {
		if got, want := f.rebuild(t, way).Snapshot(), f.e.Snapshot(); !reflect.DeepEqual(got, want) {
			t.Errorf("%s differs:\n%s", way, diffSnapshots(want, got))
		}
	}
}

func TestGiveBackReservedKeepsTheSettlement(t *testing.T) {
	f := newFixture(t)
	f.setCaps(f.acme, CapsEdit{Quotas: map[string]int64{"tokens": 1000}})
	if _, err := f.e.Reserve(f.sA, ReserveRequest{Node: f.job, Resource: "tokens", Want: 20}); err != nil {
		t.Fatal(err)
	}
	// Settle 5 spent and top up, in one request whose caller went away.
	req := ReserveRequest{Node: f.job, Resource: "tokens", Spent: 5, Want: 30, RequestID: "r-1"}
	res, err := f.e.Reserve(f.sA, req)
	if err != nil || res.Granted != 30 || res.Reserved != 45 {
		t.Fatalf("Reserve: %+v, %v", res, err)
	}
	res, k, err := f.e.GiveBackReserved(f.sA, req, 0)
	if err != nil || k != 30 || res.Reserved != 15 {
		t.Fatalf("GiveBackReserved = %+v, %d, %v; want 30 given back, 15 left", res, k, err)
	}
	if v := f.node(f.acme); v.Used["tokens"] != 5 || v.Reserved["tokens"] != 15 {
		t.Errorf("acme has used %d and reserved %d tokens; want the 5 settled and 15 reserved", v.Used["tokens"], v.Reserved["tokens"])
	}
	// Twice is harmless, and the request again neither settles nor adds.
	unchanged(t, f.e, func() error { _, _, err := f.e.GiveBackReserved(f.sA, req, 0); return err })
	unchanged(t, f.e, func() error {
		res, err := f.e.Reserve(f.sA, req)
		if res.Granted != 0 {
			t.Errorf("the request again granted %d", res.Granted)
		}
		return err
	})
	for _, way := range []string{wayRestore, wayReplay} {
		if got, want := f.rebuild(t, way).Snapshot(), f.e.Snapshot(); !reflect.DeepEqual(got, want) {
			t.Errorf("%s differs:\n%s", way, diffSnapshots(want, got))
		}
	}
}

// A give-back refunds what its lease's grant charged, and refuses to
// refund anything else: no caller can take a node's usage below what it
// spent, or below zero.
func TestGiveBackRefundsOnlyWhatItsGrantCharged(t *testing.T) {
	for _, a := range append(hostileAmounts, 5, 4, 6) {
		t.Run(fmt.Sprint(a), func(t *testing.T) {
			f, _ := delegationFixture(t)
			f.consume(f.sA, f.job2, "tokens", 100)
			g, _, err := f.e.Acquire(f.sA, AcquireRequest{Node: f.job, Class: "db", Charges: map[string]int64{"tokens": 5}})
			if err != nil {
				t.Fatal(err)
			}
			r := AcquireRequest{Node: f.job, Class: "db", Charges: map[string]int64{"tokens": a}}
			var id LeaseID
			err = unchangedUnless(t, f.e, a == 5, func() error {
				var err error
				id, err = f.e.GiveBack(f.sA, r, g.Lease)
				return err
			})
			switch {
			case a == 5 && (err != nil || id != g.Lease):
				t.Fatalf("give-back of the grant's own charges: %d, %v", id, err)
			case a != 5:
				wantErr(t, err, ErrInvalid)
			}
			want := int64(105)
			if a == 5 {
				want = 100
			}
			if used := f.node(RootID).Used["tokens"]; used != want {
				t.Errorf("the root used %d tokens, want %d", used, want)
			}
		})
	}
}

// unchangedUnless is unchanged, or just the call when changes are allowed.
func unchangedUnless(t *testing.T, e *Engine, allowed bool, call func() error) error {
	if allowed {
		return call()
	}
	return unchanged(t, e, call)
}

// A charge without a lease whose caller never learned of it is undone
// whole by its request id: quota back on the chain, tokens back in the
// buckets, the id forgotten so that a retry charges once; once only, the
// same after a restore or a replay; and a charge of a window that has
// reset since is not refunded to the new window.
func TestGiveBackChargedUndoesAChargeWhole(t *testing.T) {
	f := newPeriodFixture(t, nil, time.Date(2026, 1, 1, 0, 0, 30, 0, time.UTC))
	f.sA = f.open(f.acme, longTTL)
	f.setCaps(f.acme, CapsEdit{Quotas: map[string]int64{"q": 10}, QuotaPeriods: map[string]Period{"q": {Every: int64(time.Minute)}},
		Rates: map[string]Rate{"q": {Units: 10, Per: int64(time.Hour)}}})
	req := AcquireRequest{Node: f.job, Charges: map[string]int64{"q": 4}, RequestID: "c-1"}
	if _, w, err := f.e.Acquire(f.sA, req); err != nil || w != nil {
		t.Fatalf("the charge: %v, %v", w, err)
	}
	noID := req
	noID.RequestID = ""
	_, err := f.e.GiveBackCharged(f.sA, noID)
	wantErr(t, err, ErrInvalid)
	other := req
	other.Charges = map[string]int64{"q": 3}
	_, err = f.e.GiveBackCharged(f.sA, other)
	wantErr(t, err, ErrRequestIDReused)
	if given, err := f.e.GiveBackCharged(f.open(f.acme, longTTL), req); err != nil || given {
		t.Fatalf("another session's give-back: %v, %v; want nothing", given, err)
	}

	for _, way := range []string{wayRestore, wayReplay} { // the charge's time is state
		e := f.rebuild(t, way)
		if given, err := e.GiveBackCharged(f.sA, req); err != nil || !given {
			t.Fatalf("%s: %v, %v; want the charge given back", way, given, err)
		}
	}
	if given, err := f.e.GiveBackCharged(f.sA, req); err != nil || !given {
		t.Fatalf("GiveBackCharged: %v, %v", given, err)
	}
	if v := f.node(f.acme); v.Used["q"] != 0 || f.rates(f.acme)[0].Level != 10 {
		t.Fatalf("after the give-back: used %d, %d tokens; want none used and the bucket full", v.Used["q"], f.rates(f.acme)[0].Level)
	}
	if given, err := f.e.GiveBackCharged(f.sA, req); err != nil || given {
		t.Fatalf("a second give-back: %v, %v; want nothing", given, err)
	}
	f.checkRebuilds(t)
	if _, _, err := f.e.Acquire(f.sA, req); err != nil { // decided afresh: charged again
		t.Fatal(err)
	}
	if v := f.node(f.acme); v.Used["q"] != 4 {
		t.Fatalf("the retry: used %d, want 4", v.Used["q"])
	}

	// Given back in the next window: the new window keeps what it spent.
	f.clock.Advance(time.Minute)
	f.consume(f.sA, f.job2, "q", 2)
	if given, err := f.e.GiveBackCharged(f.sA, req); err != nil || !given {
		t.Fatalf("the give-back in the next window: %v, %v", given, err)
	}
	if st := f.periods(f.acme); st[0].Spent != 2 {
		t.Fatalf("the new window spent %d after a give-back of the last one's charge; want 2", st[0].Spent)
	}
	f.checkRebuilds(t)

	// A request that took a lease is GiveBack's.
	f.setCaps(f.job, CapsEdit{Limits: map[string]int64{"db": 1}})
	lease := AcquireRequest{Node: f.job, Class: "db", Charges: map[string]int64{"q": 1}, RequestID: "l-1"}
	if _, _, err := f.e.Acquire(f.sA, lease); err != nil {
		t.Fatal(err)
	}
	if given, err := f.e.GiveBackCharged(f.sA, lease); err != nil || given {
		t.Fatalf("GiveBackCharged of a lease's request: %v, %v; want nothing", given, err)
	}
}
