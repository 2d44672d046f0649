package engine

import (
	"errors"
	"testing"
	"time"
)

// rateFixture is the fixture with the tenants acme (weight 3) and other
// (weight 1) sharing a root rate of 40 calls a second, burst 1.
func rateFixture(t *testing.T) *fixture {
	f := newFixture(t)
	three, one := int64(3), int64(1)
	f.setCaps(RootID, CapsEdit{Rates: map[string]Rate{"calls": perSecond(40, 1)}})
	f.setCaps(f.acme, CapsEdit{Weight: &three})
	f.setCaps(f.other, CapsEdit{Weight: &one})
	return f
}

// waitCall asks for one call on node, waiting for the rate, and returns
// its wait (nil when granted at once).
func (f *fixture) waitCall(node NodeID, class string) *Wait {
	f.t.Helper()
	_, w, err := f.e.Acquire(f.sessionFor(node), AcquireRequest{Node: node, Class: class,
		Charges: map[string]int64{"calls": 1}, WaitRate: true})
	if err != nil {
		f.t.Fatalf("a waiting charge on node %d: %v", node, err)
	}
	return w
}

// answered reports whether w has its outcome, failing on an error.
func answered(t *testing.T, w *Wait) bool {
	t.Helper()
	select {
	case o := <-w.C:
		if o.Err != nil {
			t.Fatalf("a rate waiter failed: %v", o.Err)
		}
		return true
	default:
		return false
	}
}

// TestFairQueueRateWeights: tenants of weights 3 and 1 flooding a root
// rate of 40/s get 30 and 10 grants a second, in turns of 3 and 1,
// whether each keeps many waiters queued or only one at a time (as a
// sidecar's head does, sending the next as the last is answered).
func TestFairQueueRateWeights(t *testing.T) {
	for _, depth := range []int{1, 8} {
		f := rateFixture(t)
		f.consume(f.sA, f.job, "calls", 1) // the burst
		queued := map[NodeID][]*Wait{}
		for range depth {
			for _, n := range []NodeID{f.job, f.otherJob} {
				if w := f.waitCall(n, ""); w != nil {
					queued[n] = append(queued[n], w)
				} else {
					t.Fatalf("depth %d: a charge was granted at once with the bucket empty", depth)
				}
			}
		}
		got := map[NodeID]int{}
		var order []NodeID
		for range 400 {
			f.clock.Advance(25 * time.Millisecond) // one token
			d, ok := f.e.DueIn()
			if !ok || d != 0 {
				t.Fatalf("depth %d: DueIn is %v, %v with a waiter's token there; want 0, true", depth, d, ok)
			}
			f.e.Reap()
			for _, n := range []NodeID{f.job, f.otherJob} {
				if len(queued[n]) > 0 && answered(t, queued[n][0]) {
					got[n]++
					order = append(order, n)
					queued[n] = append(queued[n][1:], f.waitCall(n, ""))
				}
			}
		}
		if got[f.job] != 300 || got[f.otherJob] != 100 {
			t.Fatalf("depth %d: 10 s at 40/s gave acme (weight 3) %d and other (weight 1) %d grants; want 300 and 100",
				depth, got[f.job], got[f.otherJob])
		}
		for i := 0; i+4 <= len(order); i += 4 {
			n := 0
			for _, id := range order[i : i+4] {
				if id == f.job {
					n++
				}
			}
			if n != 3 {
				t.Fatalf("depth %d: grants %d to %d gave acme %d of 4; want 3 in every turn", depth, i, i+4, n)
			}
		}
	}
}

// TestRateWaiterDueIn: DueIn wakes the reaper when the waiter in turn's
// tokens are there, and not before.
func TestRateWaiterDueIn(t *testing.T) {
	f := rateFixture(t)
	f.consume(f.sA, f.job, "calls", 1)
	w := f.waitCall(f.job, "")
	if d, ok := f.e.DueIn(); !ok || d != 25*time.Millisecond {
		t.Fatalf("DueIn %v, %v; want 25ms, true", d, ok)
	}
	f.clock.Advance(25*time.Millisecond - 1)
	f.e.Reap()
	if answered(t, w) {
		t.Fatal("granted a nanosecond before its token")
	}
	f.clock.Advance(1)
	f.e.Reap()
	if !answered(t, w) {
		t.Fatal("not granted when its token came")
	}
	if d, ok := f.e.DueIn(); ok && d < time.Minute {
		t.Fatalf("DueIn %v with nobody waiting: only the sessions' TTL is due", d)
	}
}

// TestRateWaitersKeepTheirTokens: a charge that arrives while a waiter
// waits does not take the tokens it waits for: it is refused with the
// wait for the bucket to hold the waiter's and its own.
func TestRateWaitersKeepTheirTokens(t *testing.T) {
	f := newFixture(t)
	f.setCaps(RootID, CapsEdit{Rates: map[string]Rate{"calls": perSecond(10, 4)}})
	f.consume(f.sA, f.job, "calls", 4)
	f.clock.Advance(200 * time.Millisecond) // 2 tokens
	_, w, err := f.e.Acquire(f.sA, AcquireRequest{Node: f.job, Charges: map[string]int64{"calls": 3}, WaitRate: true})
	if err != nil || w == nil {
		t.Fatalf("a waiting charge of 3 with 2 there: %v, %v", w, err)
	}
	// The bucket holds 2, enough for a charge of 1, but the waiter waits
	// for them: 1 more comes in 100ms, then 1 for the newcomer.
	rateErr(t, f.e.Consume(f.sB, f.otherJob, "calls", 1, ""), RootID, 200*time.Millisecond)
	_, _, err = f.e.Acquire(f.sB, AcquireRequest{Node: f.otherJob, Charges: map[string]int64{"calls": 1}})
	rateErr(t, err, RootID, 200*time.Millisecond)
	f.clock.Advance(100 * time.Millisecond)
	f.e.Reap()
	if !answered(t, w) {
		t.Fatal("the waiter was not granted when its tokens came")
	}
	f.clock.Advance(100 * time.Millisecond)
	f.consume(f.sB, f.otherJob, "calls", 1)
}

// TestRateWaiterEnds: a cancelled waiter leaves the queue and is never
// granted; a session's end fails its waiters; a waiter with a class gets
// its lease when both its tokens and its slot are there.
func TestRateWaiterEnds(t *testing.T) {
	f := rateFixture(t)
	f.consume(f.sA, f.job, "calls", 1)
	w1 := f.waitCall(f.job, "")
	w2 := f.waitCall(f.otherJob, "")
	f.e.CancelWait(w1)
	f.clock.Advance(25 * time.Millisecond)
	f.e.Reap()
	if !answered(t, w2) {
		t.Fatal("the other tenant's waiter was not granted after the first was cancelled")
	}
	select {
	case o := <-w1.C:
		t.Fatalf("a cancelled waiter got %+v", o)
	default:
	}
	w3 := f.waitCall(f.otherJob, "")
	if err := f.e.CloseSession(f.sB); err != nil {
		t.Fatal(err)
	}
	if o := <-w3.C; !errors.Is(o.Err, ErrUnauthenticated) {
		t.Fatalf("a closed session's waiter got %+v", o)
	}
	f.setCaps(f.job, CapsEdit{Limits: map[string]int64{"db": 1}})
	held, _, err := f.e.Acquire(f.sA, AcquireRequest{Node: f.job, Class: "db"})
	if err != nil {
		t.Fatal(err)
	}
	w4 := f.waitCall(f.job, "db")
	f.clock.Advance(time.Second)
	f.e.Reap()
	if answered(t, w4) {
		t.Fatal("a rate waiter got a lease while its slot was held")
	}
	if err := f.e.Release(f.sA, held.Lease, 0, false, ""); err != nil {
		t.Fatal(err)
	}
	select {
	case o := <-w4.C:
		if o.Err != nil || o.Grant.Lease == 0 {
			t.Fatalf("a rate waiter with a class got %+v", o)
		}
	default:
		t.Fatal("a rate waiter with a class was not granted when its slot came back")
	}
}

// TestRateWaiterFailsWithItsNode: a rate waiter fails when its node ends,
// when its tenant is suspended, and when its quota is lowered past its
// charge while it waits (with the quota's denial, at its turn).
func TestRateWaiterFailsWithItsNode(t *testing.T) {
	f := rateFixture(t)
	f.consume(f.sA, f.job, "calls", 1)
	onJob := f.waitCall(f.job, "")
	if _, err := f.e.EndNode(f.sA, f.job, Closed, ""); err != nil {
		t.Fatal(err)
	}
	if o := <-onJob.C; !errors.Is(o.Err, ErrTaskEnded) {
		t.Fatalf("a rate waiter on an ended node got %+v", o)
	}
	onOther := f.waitCall(f.otherJob, "")
	if _, err := f.e.SetTenantState(System, f.other, Suspended, "test", false, ""); err != nil {
		t.Fatal(err)
	}
	if o := <-onOther.C; !errors.Is(o.Err, ErrTenantState) {
		t.Fatalf("a suspended tenant's rate waiter got %+v", o)
	}
	spent := f.waitCall(f.job2, "")
	f.setCaps(f.job2, CapsEdit{Quotas: map[string]int64{"calls": 0}})
	f.clock.Advance(time.Second)
	f.e.Reap()
	if o := <-spent.C; !errors.Is(o.Err, ErrQuotaExhausted) {
		t.Fatalf("a rate waiter whose quota was lowered past it while it waited got %+v", o)
	}
}

// TestRateWaiterGivenUpAtItsGrant: a waiting charge without a lease
// granted just as its caller gives up is undone whole: its quota and
// tokens come back, its request id is forgotten (a retry is decided
// afresh), and replay agrees. Spent in a window that has reset since, it
// stays spent there; with its session gone, it stands.
func TestRateWaiterGivenUpAtItsGrant(t *testing.T) {
	f := newPeriodFixture(t, nil, time.Date(2026, 1, 1, 0, 0, 59, 0, time.UTC))
	f.sA = f.open(f.acme, longTTL)
	f.setCaps(f.acme, CapsEdit{Rates: map[string]Rate{"calls": perSecond(10, 1)},
		Quotas: map[string]int64{"calls": 100}, QuotaPeriods: map[string]Period{"calls": {Every: int64(time.Minute)}}})
	f.consume(f.sA, f.job, "calls", 1) // the bucket is empty
	req := AcquireRequest{Node: f.job, Charges: map[string]int64{"calls": 1}, WaitRate: true, RequestID: "r1"}
	_, w, err := f.e.Acquire(f.sA, req)
	if err != nil || w == nil {
		t.Fatalf("a waiting charge: %v, %v", w, err)
	}
	f.clock.Advance(100 * time.Millisecond)
	f.e.Reap() // granted: the outcome waits for a caller who gives up now
	if v := f.node(f.job); v.Used["calls"] != 2 {
		t.Fatalf("granted: used %d, want 2", v.Used["calls"])
	}
	f.e.CancelWait(w)
	last := f.rec.events[len(f.rec.events)-1]
	if last.Kind != EvCharged || !last.GivenBack || last.ChargedAt != f.now() || last.Forget != "r1" {
		t.Fatalf("the give-back is %+v", last)
	}
	if v := f.node(f.job); v.Used["calls"] != 1 {
		t.Fatalf("given back: used %d, want 1", v.Used["calls"])
	}
	if lv := f.rates(f.job)[0].Level; lv != 1 {
		t.Fatalf("given back: the bucket holds %d, want its token back", lv)
	}
	f.e.CancelWait(w) // twice: nothing more
	if f.rec.events[len(f.rec.events)-1].Seq != last.Seq {
		t.Fatal("a second CancelWait gave back again")
	}
	f.checkRebuilds(t)
	// The retry is decided afresh: it takes the token back.
	if g, w, err := f.e.Acquire(f.sA, req); err != nil || w != nil || g.Node != f.job {
		t.Fatalf("the retry: %+v, %v, %v", g, w, err)
	}
	if v := f.node(f.job); v.Used["calls"] != 2 {
		t.Fatalf("the retry: used %d, want 2", v.Used["calls"])
	}

	// Granted in one window, given up in the next: the new window's spend
	// is not lowered.
	f.clock.Advance(100 * time.Millisecond)
	req.RequestID = "r2"
	f.consume(f.sA, f.job, "calls", 1)
	if _, w, err = f.e.Acquire(f.sA, req); err != nil || w == nil {
		t.Fatalf("a second waiting charge: %v, %v", w, err)
	}
	f.clock.Advance(100 * time.Millisecond)
	f.e.Reap()
	if !answeredLater(w) {
		t.Fatal("the second waiter was not granted")
	}
	f.clock.Advance(700 * time.Millisecond) // to 00:01:00.1: a new window
	f.consume(f.sA, f.job2, "calls", 1)
	f.e.CancelWait(w)
	if st := f.periods(f.acme); st[0].Spent != 1 {
		t.Fatalf("the window spent %d after a give-back of the last window's charge, want 1", st[0].Spent)
	}
	f.checkRebuilds(t)

	// Its session closed meanwhile: the charge stands.
	f.clock.Advance(time.Second)
	sid := f.open(f.acme, longTTL)
	f.consume(sid, f.job, "calls", 1)
	_, w, err = f.e.Acquire(sid, AcquireRequest{Node: f.job, Charges: map[string]int64{"calls": 1}, WaitRate: true})
	if err != nil || w == nil {
		t.Fatalf("a third waiting charge: %v, %v", w, err)
	}
	f.clock.Advance(100 * time.Millisecond)
	f.e.Reap()
	used := f.node(f.job).Used["calls"]
	if err := f.e.CloseSession(sid); err != nil {
		t.Fatal(err)
	}
	seq := f.e.Seq()
	f.e.CancelWait(w)
	if f.e.Seq() != seq || f.node(f.job).Used["calls"] != used {
		t.Fatal("a charge whose session ended was given back")
	}
}

// answeredLater reports whether w's outcome is there, without taking it.
func answeredLater(w *Wait) bool { return len(w.C) > 0 }
