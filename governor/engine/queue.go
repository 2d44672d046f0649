package engine

import (
	"cmp"
	"maps"
	"slices"
)

// waiter is a queued Acquire.
type waiter struct {
	session     *session
	node        *node
	class       string
	charges     []Charge
	requestID   string
	fingerprint uint64
	priority    int64
	write       bool   // a write, which a read_only tenant refuses
	waitRate    bool   // waits for a rate rather than being refused (ratewait.go)
	rate        string // the resource whose rate queue holds it; "" in its class's queue
	arrival     uint64
	mark        int64 // its tenant queue's grants when it queued (the aging guard, minimum.go)
	since       int64 // when it queued (not state: for Inspect)
	ch          chan Outcome

	done    bool
	granted LeaseID
	// charged marks a waiter granted its charges without a lease (a rate
	// waiter), at chargedAt: CancelWait undoes them (ratewait.go).
	charged   bool
	chargedAt int64
}

// classQueue is the wait queue of one lease class: one FIFO-by-priority queue
// per tenant, served by weighted deficit round robin.
type classQueue struct {
	ring      []*tenantQueue
	byNode    map[*node]*tenantQueue
	cursor    int // whose turn it is
	waiting   int
	contended bool // what block holders were last told (notice.go)
}

// tenantQueue holds one tenant's waiters, highest priority first and in
// arrival order within a priority.
type tenantQueue struct {
	tenant  *node
	waiters []*waiter
	deficit int64 // grants left in the tenant's current turn
	grants  int64 // grants made from this queue (the aging guard, minimum.go)
}

// fits reports whether one more lease of class fits under every limit on n's
// chain.
func (n *node) fits(class string) bool {
	for a := n; a != nil; a = a.parent {
		if g := a.limit[class]; g != nil && g.full(1, a.saturates(g)) {
			return false
		}
	}
	return true
}

// enqueue queues a copy of w in its class's queue, the one place a waiter
// is allocated, and returns it.
func (e *Engine) enqueue(wv waiter) *waiter {
	w := &wv
	w.ch = make(chan Outcome, 1)
	e.arrival++
	w.arrival = e.arrival
	q := e.queues[w.class]
	if q == nil {
		q = newQueue()
		e.queues[w.class] = q
	}
	q.add(w)
	e.contention(w.class, q)
	return w
}

func newQueue() *classQueue { return &classQueue{byNode: make(map[*node]*tenantQueue)} }

// add files w in its tenant's queue, by priority then arrival, and counts
// it against its tenant and its session.
func (q *classQueue) add(w *waiter) {
	tq := q.byNode[w.node.tenant]
	if tq == nil {
		tq = &tenantQueue{tenant: w.node.tenant}
		q.byNode[w.node.tenant] = tq
		q.ring = append(q.ring, tq)
	}
	w.mark = tq.grants
	i, _ := slices.BinarySearchFunc(tq.waiters, w, func(a, b *waiter) int {
		// Highest priority first, then arrival order.
		return cmp.Or(cmp.Compare(b.priority, a.priority), cmp.Compare(a.arrival, b.arrival))
	})
	tq.waiters = slices.Insert(tq.waiters, i, w)
	q.waiting++
	w.node.tenant.waiting++
	w.session.waiters = append(w.session.waiters, w)
}

// queueOf is the queue that holds w: its rate's or its class's.
func (e *Engine) queueOf(w *waiter) *classQueue {
	if w.rate != "" {
		return e.rateQueues[w.rate]
	}
	return e.queues[w.class]
}

func (e *Engine) removeWaiter(w *waiter) {
	q := e.queueOf(w)
	tq := q.byNode[w.node.tenant]
	if i := slices.Index(tq.waiters, w); i >= 0 {
		tq.waiters = slices.Delete(tq.waiters, i, i+1)
		q.waiting--
		w.node.tenant.waiting--
	}
	if i := slices.Index(w.session.waiters, w); i >= 0 {
		w.session.waiters = slices.Delete(w.session.waiters, i, i+1)
	}
	if w.rate != "" {
		e.rateWaiting--
		e.rateDue = 0 // it may have held the turn
		return        // a rate queue is no lease class: no block holder hears of it
	}
	e.contention(w.class, q)
}

func (e *Engine) failWaiter(w *waiter, err error) {
	if w.done {
		return
	}
	e.removeWaiter(w)
	w.done = true
	w.ch <- Outcome{Err: err}
}

// firstFit is the tenant's first waiter, in priority order, that fits
// everywhere on its chain. It skips the scan when the tenant's own cap is
// full, since then none of its waiters can fit.
func (tq *tenantQueue) firstFit(class string) *waiter {
	if g := tq.tenant.limit[class]; g != nil && g.full(1, false) { // a tenant is never the root
		return nil
	}
	if w := tq.aged(class); w != nil {
		return w
	}
	for _, w := range tq.waiters {
		if w.node.fits(class) {
			return w
		}
	}
	return nil
}

// next picks the waiter to grant: the first that fits in the queue of the
// tenant whose turn it is. A tenant none of whose waiters fits forfeits the
// rest of its turn, and the turn passes on (work conserving).
func (q *classQueue) next(class string) (*tenantQueue, *waiter) {
	return q.nextBy(func(tq *tenantQueue) (*waiter, bool) { return tq.firstFit(class), false })
}

// nextBy is next over any queue: pick is a tenant's waiter that may be
// granted now, or nil and hold when the tenant keeps its turn without one
// (a rate queue's waiter waiting for tokens the whole ring shares: the
// turn must not pass on while they refill, or weights would not count).
func (q *classQueue) nextBy(pick func(*tenantQueue) (w *waiter, hold bool)) (*tenantQueue, *waiter) {
	for range len(q.ring) {
		tq := q.ring[q.cursor]
		if tq.deficit <= 0 {
			tq.deficit = tq.tenant.weight // a new turn
		}
		if len(tq.waiters) > 0 {
			if w, hold := pick(tq); w != nil || hold {
				return tq, w
			}
		}
		tq.deficit = 0
		q.cursor = (q.cursor + 1) % len(q.ring)
	}
	return nil, nil
}

// dispatch grants queued leases of class while any fits. Granting can end
// nodes (a deadline found on the way), which frees other classes, so a
// nested request to dispatch is remembered and served by the outermost call.
func (e *Engine) dispatch(class string) {
	defer e.dispatchRatesAfter()
	q := e.queues[class]
	if q == nil || q.waiting == 0 {
		return
	}
	if e.dispatching {
		e.dispatchAgain = true
		return
	}
	e.dispatching, e.dispatchAgain = true, false
	e.dispatchClass(class, q)
	e.dispatching = false
	if e.dispatchAgain {
		e.dispatchAll()
	}
}

// dispatchAll dispatches every class until nothing more fits.
func (e *Engine) dispatchAll() {
	defer e.dispatchRatesAfter()
	if e.dispatching {
		e.dispatchAgain = true
		return
	}
	e.dispatching = true
	defer func() { e.dispatching = false }()
	for {
		e.dispatchAgain = false
		for _, class := range e.sortedQueues() {
			e.dispatchClass(class, e.queues[class])
		}
		if !e.dispatchAgain {
			return
		}
	}
}

func (e *Engine) dispatchClass(class string, q *classQueue) {
	now := e.now()
	for q.waiting > 0 && e.root.fits(class) {
		// A tenant below its reserved minimum goes first, outside the
		// round robin (minimum.go).
		tq, w := q.belowMinimum(class, now)
		fromMin := w != nil
		if !fromMin {
			tq, w = q.next(class)
		}
		if w == nil {
			return
		}
		if w.session.expired(now) {
			e.endSession(w.session, now, EndExpired) // fails its waiters, this one included
			continue
		}
		if err := e.checkOpen(w.node, now); err != nil {
			e.failWaiter(w, err) // its node just expired
			continue
		}
		if err := e.checkUse(w.node.tenant, w.class, w.charges); err != nil {
			// Its tenant forgot a name it asks for while it waited (a cap
			// removed while nothing held it), and other names took its place.
			e.failWaiter(w, err)
			continue
		}
		if err := w.node.checkAll(w.charges); err != nil {
			e.failWaiter(w, e.refused(w.session, err)) // a quota was spent, or reserved, while it waited
			continue
		}
		if err := w.node.checkRatesAhead(w.charges, now, e.aheadOf()); err != nil {
			if e.waitForRate(w, err) {
				continue // it waits on in its rate's queue (ratewait.go)
			}
			e.failWaiter(w, err) // a rate was drawn down while it waited
			continue
		}
		e.removeWaiter(w)
		g := e.grant(w, now)
		w.done, w.granted = true, g.Lease
		w.ch <- Outcome{Grant: g}
		tq.grants++
		if fromMin {
			continue
		}
		if tq.deficit--; tq.deficit <= 0 {
			q.cursor = (q.cursor + 1) % len(q.ring)
		}
	}
}

func (e *Engine) sortedQueues() []string {
	return slices.Sorted(maps.Keys(e.queues))
}
