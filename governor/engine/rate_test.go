package engine

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func perSecond(units, burst int64) Rate {
	return Rate{Units: units, Per: int64(time.Second), Burst: burst}
}

// rateErr asserts err is a refusal for rate naming node with the wait.
func rateErr(t *testing.T, err error, node NodeID, wait time.Duration) *RateError {
	t.Helper()
	var re *RateError
	if !errors.As(err, &re) || !errors.Is(err, ErrRateLimited) || errors.Is(err, ErrQuotaExhausted) {
		t.Fatalf("got %v; want a *RateError (ErrRateLimited only)", err)
	}
	if re.Node != node || re.RetryAfter != wait {
		t.Fatalf("refusal %v names node %d after %v; want node %d after %v", err, re.Node, re.RetryAfter, node, wait)
	}
	return re
}

func TestRateRefusesUntilRefilled(t *testing.T) {
	f := newFixture(t)
	f.setCaps(f.job, CapsEdit{Rates: map[string]Rate{"calls": perSecond(10, 0)}})
	for range 10 { // the bucket starts full: one period's worth
		f.consume(f.sA, f.step, "calls", 1)
	}
	before := f.e.Seq()
	err := f.e.Consume(f.sA, f.step, "calls", 1, "")
	rateErr(t, err, f.job, 100*time.Millisecond)
	if f.e.Seq() != before {
		t.Fatalf("a refusal for rate emitted events")
	}
	f.clock.Advance(100*time.Millisecond - 1)
	rateErr(t, f.e.Consume(f.sA, f.step, "calls", 1, ""), f.job, 1)
	f.clock.Advance(1)
	f.consume(f.sA, f.step, "calls", 1)
	// Another task has no rate; the job's bucket is its own.
	f.consume(f.sA, f.job2, "calls", 1000)
}

func TestRateOnEveryLevelAllOrNone(t *testing.T) {
	f := newFixture(t)
	f.setCaps(RootID, CapsEdit{Rates: map[string]Rate{"calls": perSecond(100, 0)}})
	f.setCaps(f.acme, CapsEdit{Rates: map[string]Rate{"calls": perSecond(10, 5)}, Quotas: map[string]int64{"calls": 7}})
	f.setCaps(f.job, CapsEdit{Rates: map[string]Rate{"calls": {Units: 1, Per: int64(time.Minute), Burst: 4}}})
	f.consume(f.sA, f.step, "calls", 4)
	// The job's bucket is empty: a unit comes back in a minute, the
	// tenant's in 0 (it holds 1). The longest wait is named.
	rateErr(t, f.e.Consume(f.sA, f.step, "calls", 1, ""), f.job, time.Minute)
	// The tenant's 5-unit bucket holds 1: 2 more need 100ms at 10/s.
	rateErr(t, f.e.Consume(f.sA, f.job2, "calls", 2, ""), f.acme, 100*time.Millisecond)
	// A quota refusal takes nothing from any bucket, and a rate refusal
	// charges nothing to any quota.
	f.clock.Advance(time.Second)
	if err := f.e.Consume(f.sA, f.job2, "calls", 4, ""); !errors.Is(err, ErrQuotaExhausted) {
		t.Fatalf("4 more past a quota of 7 with 4 used: %v", err)
	}
	if st := f.rates(f.job2); st[0].Level != 5 || st[1].Level != 100 {
		t.Fatalf("a quota refusal took from the buckets: %+v", st)
	}
	v, _ := f.e.Get(f.sA, f.acme)
	if v.Used["calls"] != 4 {
		t.Fatalf("used %d, want 4", v.Used["calls"])
	}
	// Acquire with charges, and an exact reservation (one call's hold),
	// take from the buckets too. A reservation that is not exact takes a
	// slice of the rate instead (slice_test.go).
	if _, _, err := f.e.Acquire(f.sA, AcquireRequest{Node: f.job2, Charges: map[string]int64{"calls": 2}}); err != nil {
		t.Fatal(err)
	}
	res, err := f.e.Reserve(f.sA, ReserveRequest{Node: f.job2, Resource: "calls", Want: 1, Exact: true})
	if err != nil || res.Granted != 1 || res.Rated { // the quota's headroom is 1
		t.Fatalf("exact reserve: %+v %v", res, err)
	}
	if st := f.rates(f.job2); st[0].Level != 2 || st[1].Level != 97 {
		t.Fatalf("after a charge of 2 and a reservation of 1: %+v", st)
	}
}

// rates is the fixture's RateStatus of id, read by the operator.
func (f *fixture) rates(id NodeID) []RateStatus {
	f.t.Helper()
	st, err := f.e.RateStatus(System, id)
	if err != nil {
		f.t.Fatal(err)
	}
	return st
}

func TestRateChargeLargerThanBurstIsInvalid(t *testing.T) {
	f := newFixture(t)
	f.setCaps(f.acme, CapsEdit{Rates: map[string]Rate{"tokens": {Units: 100, Per: int64(time.Minute), Burst: 50}}})
	err := f.e.Consume(f.sA, f.job, "tokens", 51, "")
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "can never fit") {
		t.Fatalf("a charge larger than the burst: %v; want ErrInvalid saying it can never fit", err)
	}
	f.consume(f.sA, f.job, "tokens", 50)
	// A reservation of one call's estimate larger than the burst too.
	if _, err := f.e.Reserve(f.sA, ReserveRequest{Node: f.job, Resource: "tokens", Want: 51, Exact: true}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("an exact reservation larger than the burst: %v", err)
	}
}

func TestRateHostileNumbers(t *testing.T) {
	f := newFixture(t)
	for _, bad := range []Rate{{Units: 0, Per: 1}, {Units: -2, Per: 1}, {Units: 1, Per: 0}, {Units: 1, Per: -1},
		{Units: 1, Per: 1, Burst: -1}, {Units: NoCap, Per: 1}} {
		if _, err := f.e.SetCaps(System, f.job, CapsEdit{Rates: map[string]Rate{"x": bad}}, ""); !errors.Is(err, ErrInvalid) {
			t.Errorf("rate %+v: %v; want ErrInvalid", bad, err)
		}
	}
	// The largest rate and burst: charges of 2^53 take exactly that.
	max := Rate{Units: math.MaxInt64, Per: 1, Burst: math.MaxInt64}
	f.setCaps(f.job, CapsEdit{Rates: map[string]Rate{"x": max}})
	f.consume(f.sA, f.job, "x", 1<<53)
	f.consume(f.sA, f.job, "x", 1<<53)
	if st := f.rates(f.job); st[0].Level != math.MaxInt64-1<<54 || st[0].Full != 1 {
		t.Fatalf("after two charges of 2^53: %+v", st)
	}
	// A clock jump of a century refills to the burst, never past it.
	f.clock.Advance(100 * 365 * 24 * time.Hour)
	if st := f.rates(f.job); st[0].Level != math.MaxInt64 || st[0].Full != 0 {
		t.Fatalf("after a century: %+v", st)
	}
	// The slowest rate: one unit per 2^63-1 ns, with a burst of 2^53.
	slow := Rate{Units: 1, Per: math.MaxInt64, Burst: 1 << 53}
	f.setCaps(f.job2, CapsEdit{Rates: map[string]Rate{"x": slow}})
	s := f.open(f.acme, longTTL) // the century ended the fixture's sessions
	f.consume(s, f.job2, "x", 1<<53)
	rateErr(t, f.e.Consume(s, f.job2, "x", 1, ""), f.job2, math.MaxInt64)
	// Its wait for the whole burst does not wrap: it saturates.
	if st := f.rates(f.job2); st[0].Level != 0 || st[0].Full != math.MaxInt64 {
		t.Fatalf("the slowest bucket, empty: %+v", st)
	}
	// Another century: the wait is what is left of the 2^63-1 ns.
	f.clock.Advance(100 * 365 * 24 * time.Hour)
	rateErr(t, f.e.Consume(f.open(f.acme, longTTL), f.job2, "x", 1, ""), f.job2, math.MaxInt64-100*365*24*time.Hour)
}

func TestRateClockGoingBackNeitherRefillsNorDrains(t *testing.T) {
	f := newFixture(t)
	f.setCaps(f.job, CapsEdit{Rates: map[string]Rate{"calls": perSecond(10, 0)}})
	f.consume(f.sA, f.job, "calls", 10)
	f.clock.Advance(-time.Hour) // a new leader whose clock is behind
	rateErr(t, f.e.Consume(f.sA, f.job, "calls", 1, ""), f.job, 100*time.Millisecond)
	f.clock.Advance(time.Hour + 50*time.Millisecond)
	rateErr(t, f.e.Consume(f.sA, f.job, "calls", 1, ""), f.job, 50*time.Millisecond)
	f.clock.Advance(50 * time.Millisecond)
	f.consume(f.sA, f.job, "calls", 1)
}

// TestRateSurvivesRestart: a snapshot, and a replay of the events, give
// the bucket exactly as it was, fraction of a unit included: a restart
// neither refills nor drains it.
func TestRateSurvivesRestart(t *testing.T) {
	f := newFixture(t)
	f.setCaps(f.acme, CapsEdit{Rates: map[string]Rate{"calls": {Units: 3, Per: int64(time.Second)}},
		DefaultRates: map[string]Rate{"calls": perSecond(2, 0)}})
	f.consume(f.sA, f.job, "calls", 3)
	f.clock.Advance(500 * time.Millisecond) // 1.5 units
	f.consume(f.sA, f.job, "calls", 1)      // 0.5 left
	task := f.create(f.sA, f.acme, NodeSpec{Name: "new"})
	snap := f.e.Snapshot()
	for name, rebuild := range map[string]func(*Engine) error{
		"snapshot": func(e *Engine) error { return e.Restore(cloneSnapshot(t, snap)) },
		"events": func(e *Engine) error {
			for _, ev := range f.rec.events {
				if err := e.Apply(ev); err != nil {
					return err
				}
			}
			return nil
		},
	} {
		e, err := New(Config{Clock: f.clock})
		if err != nil {
			t.Fatal(err)
		}
		if err := rebuild(e); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		sid, err := e.OpenSession(f.acme, "again-"+name, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		rateErr(t, e.Consume(sid, f.job, "calls", 1, ""), f.acme, 500*time.Millisecond/3+1)
		// The new task inherited the tenant's default rate, full.
		st, _ := e.RateStatus(sid, task)
		if len(st) != 2 || st[0].Rate != perSecond(2, 0) || st[0].Level != 2 {
			t.Fatalf("%s: the new task's rates: %+v", name, st)
		}
	}
}

func TestRateEditKeepsWholeUnits(t *testing.T) {
	f := newFixture(t)
	f.setCaps(f.job, CapsEdit{Rates: map[string]Rate{"calls": perSecond(10, 0)}})
	f.consume(f.sA, f.job, "calls", 8)
	f.clock.Advance(150 * time.Millisecond) // 3.5 units
	f.setCaps(f.job, CapsEdit{Rates: map[string]Rate{"calls": perSecond(1, 100)}})
	if st := f.rates(f.job); st[0].Level != 3 {
		t.Fatalf("after the edit: %+v; want the 3 whole units kept", st)
	}
	f.setCaps(f.job, CapsEdit{Rates: map[string]Rate{"calls": {Units: NoCap}}})
	if st := f.rates(f.job); len(st) != 0 {
		t.Fatalf("a removed rate: %+v", st)
	}
	f.consume(f.sA, f.job, "calls", 1000)
}

// A temporary override sets quotas and limits only: one with a rate would
// set the rate for good while saying it reverts.
func TestRateIsNotATemporaryOverride(t *testing.T) {
	f := newFixture(t)
	for _, edit := range []CapsEdit{
		{Quotas: map[string]int64{"calls": 5}, Rates: map[string]Rate{"calls": perSecond(1, 0)}},
		{Quotas: map[string]int64{"calls": 5}, DefaultRates: map[string]Rate{"calls": perSecond(1, 0)}},
	} {
		before := f.e.Seq()
		if _, err := f.e.SetCapsAudited(System, f.job, edit, Audit{Reason: "incident", For: time.Minute}, ""); !errors.Is(err, ErrInvalid) || f.e.Seq() != before {
			t.Errorf("an override with %+v: %v; want ErrInvalid and nothing emitted", edit, err)
		}
	}
}

func TestRateGivenBackGrantReturnsItsUnits(t *testing.T) {
	f := newFixture(t)
	f.setCaps(f.job, CapsEdit{Rates: map[string]Rate{"calls": perSecond(5, 0)}})
	g, w, err := f.e.Acquire(f.sA, AcquireRequest{Node: f.job, Class: "db", Charges: map[string]int64{"calls": 5}, RequestID: "r1"})
	if err != nil || w != nil {
		t.Fatal(err)
	}
	if got, err := f.e.GiveBack(f.sA, AcquireRequest{Node: f.job, Class: "db", Charges: map[string]int64{"calls": 5}, RequestID: "r1"}, 0); err != nil || got != g.Lease {
		t.Fatalf("give back: %d %v", got, err)
	}
	if st := f.rates(f.job); st[0].Level != 5 {
		t.Fatalf("a grant its caller never saw kept its units: %+v", st)
	}
}

// TestRatedResourceIsNotDelegated: units reserved are taken from the
// buckets when reserved but spent by their holder whenever it likes, so a
// reservation of a rated resource would let the fleet pass the rate: under
// 50/s (burst 50), a session reserving 50 at t=0 and spending them at t=10s,
// when the bucket is full again and another session takes 50, makes 100 in
// an instant. So a reservation that is not exact reserves nothing of a
// resource a rate binds anywhere on the chain, says Rated, and emits
// nothing unless it settles; once the rate is removed, reservations are
// granted again. (Without contention a slice of the rate is delegated
// instead, which is exact: slice_test.go. Here the bucket is drained
// below half, which is contention.)
func TestRatedResourceIsNotDelegated(t *testing.T) {
	f := newFixture(t)
	sA2 := f.open(f.acme, longTTL)
	// A reservation made before the rate exists is settled after it.
	res, err := f.e.Reserve(f.sA, ReserveRequest{Node: f.job, Resource: "calls", Want: 8})
	if err != nil || res.Granted != 8 || res.Rated {
		t.Fatalf("reserve before any rate: %+v %v", res, err)
	}
	f.setCaps(f.acme, CapsEdit{Rates: map[string]Rate{"calls": {Units: 50, Per: int64(time.Second)}}})
	f.consume(sA2, f.job2, "calls", 26)

	before := f.e.Seq()
	res, err = f.e.Reserve(f.sA, ReserveRequest{Node: f.step, Resource: "calls", Want: 50})
	if err != nil || res.Granted != 0 || !res.Rated {
		t.Fatalf("reserve under a rate on the tenant: %+v %v; want nothing granted, rated", res, err)
	}
	if f.e.Seq() != before {
		t.Errorf("a reservation that reserved and settled nothing emitted %d events", f.e.Seq()-before)
	}
	f.clock.Advance(10 * time.Second)
	if err := f.e.Consume(sA2, f.job2, "calls", 50, ""); err != nil {
		t.Fatalf("the other session's 50 in the full bucket: %v", err)
	}
	// The first session holds only what it reserved before the rate: it
	// settles, and its top-up is refused as rated, in one event.
	res, err = f.e.Reserve(f.sA, ReserveRequest{Node: f.job, Resource: "calls", Spent: 3, Return: 5, Want: 50})
	if err != nil || res.Granted != 0 || !res.Rated || res.Reserved != 0 {
		t.Fatalf("settle and top up under the rate: %+v %v", res, err)
	}
	if f.e.Seq() != before+2 { // the consume, the settlement
		t.Errorf("%d events since, want 2", f.e.Seq()-before)
	}
	// A charge still meets the rate: the bucket is empty.
	rateErr(t, f.e.Consume(f.sA, f.job, "calls", 1, ""), f.acme, 20*time.Millisecond)

	// Another resource, and another tenant, are not rated.
	if res, err := f.e.Reserve(f.sA, ReserveRequest{Node: f.job, Resource: "tokens", Want: 5}); err != nil || res.Granted != 5 || res.Rated {
		t.Fatalf("an unrated resource: %+v %v", res, err)
	}
	f.setCaps(f.acme, CapsEdit{Rates: map[string]Rate{"calls": {Units: NoCap}}})
	if res, err := f.e.Reserve(f.sA, ReserveRequest{Node: f.job, Resource: "calls", Want: 5}); err != nil || res.Granted != 5 || res.Rated {
		t.Fatalf("reserve once the rate is removed: %+v %v", res, err)
	}
}
