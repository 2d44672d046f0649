package engine

import (
	"errors"
	"testing"
	"time"
)

// A tenant's reserved minimum under a flood from another tenant: while it
// is idle its reserved slots are lent to the other; when its waiters
// arrive, each slot the other releases goes to it until it holds its
// minimum (within one release cycle: the next releases), whatever the
// round robin's turn; then the round robin by weight goes on.
func TestMinimumHoldsUnderAFlood(t *testing.T) {
	f := newFixture(t)
	f.setCaps(RootID, CapsEdit{Limits: map[string]int64{"db": 4}})
	f.setCaps(f.acme, CapsEdit{Minimums: map[string]Minimum{"db": {Min: 2}}})
	var flood []LeaseID
	for range 4 { // acme is idle: its reserved slots are lent
		flood = append(flood, f.acquire(f.sB, f.otherJob, "db"))
	}
	var otherWaits []*Wait
	for range 6 {
		otherWaits = append(otherWaits, f.enqueue(f.sB, f.otherJob, "db"))
	}
	a1, a2 := f.enqueue(f.sA, f.job, "db"), f.enqueue(f.sA, f.job2, "db")
	f.release(f.sB, flood[0])
	if o, ok := outcome(a1); !ok || o.Err != nil || o.Grant.Lease == 0 {
		t.Fatalf("the first slot freed went to %v, want acme's first waiter (below its minimum)", o)
	}
	f.release(f.sB, flood[1])
	if o, ok := outcome(a2); !ok || o.Err != nil || o.Grant.Lease == 0 {
		t.Fatalf("the second slot freed went to %v, want acme's second waiter", o)
	}
	// Lent capacity comes back by not granting it onward, never by
	// revoking: the flood's two other leases are still held.
	for _, l := range flood[2:] {
		if _, err := f.e.Validate(f.sB, l); err != nil {
			t.Fatalf("a lent slot was revoked: %v", err)
		}
	}
	// At its minimum, acme waits its turn like anyone: with no waiter of
	// its own, the next slot goes to the other tenant.
	f.release(f.sB, flood[2])
	if o, ok := outcome(otherWaits[0]); !ok || o.Err != nil || o.Grant.Lease == 0 {
		t.Fatalf("the next slot went to %v, want the other tenant's first waiter", o)
	}
	for _, way := range []string{wayRestore, wayReplay} {
		e := f.rebuild(t, way)
		if v, _ := e.Get(System, f.acme); v.Minimums["db"].Min != 2 {
			t.Fatalf("%s: minimums %v", way, v.Minimums)
		}
	}
}

// A minimum with a window applies only inside it.
func TestMinimumWindow(t *testing.T) {
	f := newFixture(t)
	f.setCaps(RootID, CapsEdit{Limits: map[string]int64{"db": 1}})
	from := f.now() + int64(time.Minute)
	f.setCaps(f.acme, CapsEdit{Minimums: map[string]Minimum{"db": {Min: 1, From: from, Until: from + int64(time.Hour)}}})
	held := f.acquire(f.sB, f.otherJob, "db")
	b := f.enqueue(f.sB, f.otherJob, "db")
	a := f.enqueue(f.sA, f.job, "db")
	f.release(f.sB, held) // before the window: the round robin's turn (other, which queued first)
	o, ok := outcome(b)
	if !ok {
		t.Fatal("acme was served first before its minimum's window")
	}
	f.release(f.sB, o.Grant.Lease)
	if o, ok = outcome(a); !ok { // then acme's turn
		t.Fatal("acme was not served after the other tenant")
	}
	f.release(f.sA, o.Grant.Lease)
	held = f.acquire(f.sB, f.otherJob, "db")
	b = f.enqueue(f.sB, f.otherJob, "db")
	a = f.enqueue(f.sA, f.job, "db")
	f.clock.Advance(2 * time.Minute) // inside the window
	f.release(f.sB, held)
	if _, ok := outcome(a); !ok {
		t.Fatal("inside its window, acme (below its minimum) was not served first")
	}
}

// The minimums of a class never sum above the pool's limit: a larger
// minimum, and a lower root limit, that would are refused.
func TestMinimumsWithinThePool(t *testing.T) {
	f := newFixture(t)
	f.setCaps(RootID, CapsEdit{Limits: map[string]int64{"db": 4}})
	f.setCaps(f.acme, CapsEdit{Minimums: map[string]Minimum{"db": {Min: 3}}})
	for what, err := range map[string]error{
		"a minimum past the pool": func() error {
			_, err := f.e.SetCaps(System, f.other, CapsEdit{Minimums: map[string]Minimum{"db": {Min: 2}}}, "")
			return err
		}(),
		"a pool under the minimums": func() error {
			_, err := f.e.SetCaps(System, RootID, CapsEdit{Limits: map[string]int64{"db": 2}}, "")
			return err
		}(),
		"a minimum on a task": func() error {
			_, err := f.e.SetCaps(System, f.job, CapsEdit{Minimums: map[string]Minimum{"db": {Min: 1}}}, "")
			return err
		}(),
		"a window that ends before it starts": func() error {
			_, err := f.e.SetCaps(System, f.other, CapsEdit{Minimums: map[string]Minimum{"db": {Min: 1, From: 10, Until: 5}}}, "")
			return err
		}(),
	} {
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", what, err)
		}
	}
	f.setCaps(f.other, CapsEdit{Minimums: map[string]Minimum{"db": {Min: 1}}}) // exactly the pool
	f.setCaps(f.acme, CapsEdit{Minimums: map[string]Minimum{"db": {Min: 0}}})  // removed
	if v := f.node(f.acme); v.Minimums != nil {
		t.Fatalf("a removed minimum stays: %v", v.Minimums)
	}
}

// The aging guard: under strict priority a tenant's low-priority waiter is
// passed over by at most AgingGrants (16) grants of its tenant's queue;
// the next grant is its own, however many high-priority waiters queue.
func TestAgingGuardBoundsStarvation(t *testing.T) {
	f := newFixture(t)
	f.setCaps(RootID, CapsEdit{Limits: map[string]int64{"db": 1}})
	hi := f.create(System, f.acme, NodeSpec{Name: "urgent", Priority: 10})
	held := f.acquire(f.sA, hi, "db")
	low := f.enqueue(f.sA, f.job, "db") // priority 0
	queued := []*Wait{f.enqueue(f.sA, hi, "db")}
	passed := 0
	for {
		f.release(f.sA, held)
		if o, ok := outcome(low); ok {
			if o.Err != nil || passed != AgingGrants {
				t.Fatalf("the low-priority waiter got %v after %d grants to others, want a grant after exactly %d", o, passed, AgingGrants)
			}
			return
		}
		o, ok := outcome(queued[0])
		if !ok || o.Err != nil {
			t.Fatalf("a freed slot went to nobody: %v %v", o, ok)
		}
		held, queued = o.Grant.Lease, queued[1:]
		if passed++; passed > AgingGrants {
			t.Fatalf("the low-priority waiter was passed over %d times", passed)
		}
		queued = append(queued, f.enqueue(f.sA, hi, "db")) // high priority keeps arriving
	}
}
