package engine

import (
	"fmt"
	"math/rand"
	"testing"
	"time"
)

// pool is a one-class pool shared by tenants, for fair queue scenarios.
type pool struct {
	t       testing.TB
	e       *Engine
	clock   *fakeClock
	tenants []NodeID
	tasks   []NodeID // one task per tenant
	sess    []SessionID
	byTask  map[NodeID]int // task -> tenant index
	held    []LeaseID
}

// newPool builds tenants with the given weights under a root limit of slots.
func newPool(t testing.TB, slots int64, weights ...int64) *pool {
	t.Helper()
	clock := newFakeClock()
	e, err := New(Config{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	p := &pool{t: t, e: e, clock: clock, byTask: map[NodeID]int{}}
	if _, err := e.SetCaps(System, RootID, CapsEdit{Limits: map[string]int64{"db": slots}}, ""); err != nil {
		t.Fatal(err)
	}
	for i, w := range weights {
		ten, err := e.CreateNode(System, RootID, NodeSpec{Name: fmt.Sprintf("tenant%d", i), Weight: w}, "")
		if err != nil {
			t.Fatal(err)
		}
		sid, err := e.OpenSession(ten.ID, fmt.Sprint("token", i), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		task, err := e.CreateNode(sid, ten.ID, NodeSpec{Name: "task"}, "")
		if err != nil {
			t.Fatal(err)
		}
		p.tenants, p.sess, p.tasks = append(p.tenants, ten.ID), append(p.sess, sid), append(p.tasks, task.ID)
		p.byTask[task.ID] = i
	}
	return p
}

// fill takes every slot for tenant i.
func (p *pool) fill(i int) {
	for {
		g, w, err := p.e.Acquire(p.sess[i], AcquireRequest{Node: p.tasks[i], Class: "db"})
		if err != nil {
			p.t.Fatal(err)
		}
		if w != nil {
			p.e.CancelWait(w)
			return
		}
		p.held = append(p.held, g.Lease)
	}
}

// queue adds n waiters for tenant i.
func (p *pool) queue(i, n int) []*Wait {
	var out []*Wait
	for range n {
		_, w, err := p.e.Acquire(p.sess[i], AcquireRequest{Node: p.tasks[i], Class: "db"})
		if err != nil || w == nil {
			p.t.Fatalf("acquire for tenant %d: wait %v, err %v", i, w, err)
		}
		out = append(out, w)
	}
	return out
}

// cycle releases the oldest held lease and returns which tenant got the
// freed slot. With waiters queued, somebody must.
func (p *pool) cycle(waits map[*Wait]int) int {
	p.t.Helper()
	if len(p.held) == 0 {
		p.t.Fatalf("no lease is held: %d waiters queued and the pool is idle", len(waits))
	}
	l := p.held[0]
	p.held = p.held[1:]
	owner := -1
	for i := range p.sess {
		if p.e.Release(p.sess[i], l, 0, false, "") == nil {
			owner = i
			break
		}
	}
	if owner < 0 {
		p.t.Fatalf("nobody could release lease %d", l)
	}
	for w, i := range waits {
		select {
		case o := <-w.C:
			if o.Err != nil {
				p.t.Fatalf("waiter of tenant %d failed: %v", i, o.Err)
			}
			delete(waits, w)
			p.held = append(p.held, o.Grant.Lease)
			return i
		default:
		}
	}
	if len(waits) > 0 {
		p.t.Fatalf("lease %d was released with %d waiters queued and nobody got the slot", l, len(waits))
	}
	return -1
}

func waitSet(p *pool, counts ...int) map[*Wait]int {
	all := map[*Wait]int{}
	for i, n := range counts {
		for _, w := range p.queue(i, n) {
			all[w] = i
		}
	}
	return all
}

// A tenant with 10,000 waiters and one with 2, at equal weight, alternate.
func TestFairQueueLongQueueDoesNotStarveShortOne(t *testing.T) {
	p := newPool(t, 1, 1, 1)
	p.fill(0)
	waits := waitSet(p, 10000, 2)
	var got []int
	for range 6 {
		got = append(got, p.cycle(waits))
	}
	// Tenant 0 holds the slot; the grants alternate while tenant 1 waits.
	want := []int{0, 1, 0, 1, 0, 0}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("grants went to tenants %v, want %v", got, want)
	}
}

// Weights 4:1 give 4:1 grants, in every round.
func TestFairQueueWeightsGiveProportionalGrants(t *testing.T) {
	p := newPool(t, 1, 4, 1)
	p.fill(0)
	waits := waitSet(p, 3000, 3000)
	grants := [2]int{}
	for round := range 200 {
		var inRound [2]int
		for range 5 {
			inRound[p.cycle(waits)]++
		}
		if inRound != [2]int{4, 1} {
			t.Fatalf("round %d gave %v grants, want [4 1]", round, inRound)
		}
		grants[0] += inRound[0]
		grants[1] += inRound[1]
	}
	if grants != [2]int{800, 200} {
		t.Fatalf("grants %v, want [800 200]", grants)
	}
}

// The DRR bound, as a property over random weights and queue lengths: while a
// tenant has a waiter that fits, the other tenants get at most the sum of
// their weights in grants before it gets one; and over whole rounds grants
// follow weights.
func TestFairQueueWaitBoundIsOthersWeights(t *testing.T) {
	for seed := int64(1); seed <= 200; seed++ {
		rng := rand.New(rand.NewSource(seed))
		k := 2 + rng.Intn(5)
		weights := make([]int64, k)
		counts := make([]int, k)
		var total int64
		for i := range weights {
			weights[i] = 1 + rng.Int63n(5)
			counts[i] = 1 + rng.Intn(60)
			total += weights[i]
		}
		p := newPool(t, 1+int64(rng.Intn(3)), weights...)
		p.fill(0)
		waits := waitSet(p, counts...)
		since := make([]int64, k) // grants to others since tenant i's last grant
		for len(waits) > 0 {
			before := map[int]bool{}
			for _, i := range waits {
				before[i] = true
			}
			got := p.cycle(waits)
			for i := range k {
				if i == got {
					since[i] = 0
					continue
				}
				if before[i] {
					since[i]++
					if bound := total - weights[i]; since[i] > bound {
						t.Fatalf("seed %d: tenant %d (weight %d of %v) waited %d grants, bound %d",
							seed, i, weights[i], weights, since[i], bound)
					}
				}
			}
		}
	}
}

// When a tenant whose turn it is is reclaimed, the turn passes to the next
// tenant in the ring, as if it had forfeited it; it does not go back to
// the tenant before it, which would then get two turns in a row. (The
// ring is A, B, C; C's turn; C is reclaimed; A is next, not B.)
func TestFairQueueReclaimedTenantPassesItsTurnOn(t *testing.T) {
	f := newRetentionFixture(t, nil)
	f.setCaps(RootID, CapsEdit{Limits: map[string]int64{"db": 1}})
	a := f.create(System, RootID, NodeSpec{Name: "a"})
	b := f.create(System, RootID, NodeSpec{Name: "b"})
	c := f.create(System, RootID, NodeSpec{Name: "c"})
	sa, sb, sc := f.open(a, longTTL), f.open(b, longTTL), f.open(c, longTTL)
	queue := func(sid SessionID, n NodeID) *Wait {
		t.Helper()
		_, w, err := f.e.Acquire(sid, AcquireRequest{Node: n, Class: "db"})
		if err != nil || w == nil {
			t.Fatalf("acquire on %d: %v, queued %v", n, err, w != nil)
		}
		return w
	}
	granted := func(w *Wait) LeaseID {
		t.Helper()
		select {
		case o := <-w.C:
			if o.Err != nil {
				t.Fatalf("wait failed: %v", o.Err)
			}
			return o.Grant.Lease
		default:
			return 0
		}
	}
	held := f.acquire(sa, a, "db")
	wa, wb := queue(sa, a), queue(sb, b)
	queue(sc, c)        // the ring is a, b, c
	f.release(sa, held) // a's turn
	held = granted(wa)
	f.release(sa, held) // b's turn
	held = granted(wb)
	if held == 0 {
		t.Fatal("b was not granted in its turn")
	}
	if err := f.e.CloseSession(sc); err != nil { // c's waiter fails; its turn comes, with nobody to take it
		t.Fatal(err)
	}
	if _, err := f.e.EndNode(System, c, Closed, ""); err != nil {
		t.Fatal(err)
	}
	wa, wb = queue(sa, a), queue(sb, b)
	f.clock.Advance(testRetention)
	if _, err := f.e.Heartbeat(sa); err != nil {
		t.Fatal(err)
	}
	if _, err := f.e.Heartbeat(sb); err != nil {
		t.Fatal(err)
	}
	f.e.Reap()
	if f.e.nodes[c] != nil {
		t.Fatal("c was not reclaimed")
	}
	f.release(sb, held)
	if granted(wa) == 0 || granted(wb) != 0 {
		t.Error("the slot after reclaimed c's turn went to b, not to a, the next in the ring")
	}
}
