package engine

import (
	"errors"
	"maps"
	"math"
	"slices"
)

// Waiting for a rate. An Acquire with WaitRate that a rate refuses, and
// nothing else, is queued instead of refused: in the rate queue of the
// resource whose bucket refused it, one tenantQueue per tenant, served by
// the same weighted deficit round robin as the lease queues (nextBy), so
// that tenants share a contended rate by weight. Time refills buckets, so
// the rate queues are dispatched by tick, which every call runs first,
// and DueIn wakes the server's reaper for the instant the next waiter may
// fit. The ring moves only when a waiter fits: while the root's bucket
// refills, the tenant in turn keeps its turn, even through an instant
// with no waiter queued (a sidecar sends its next request as the last is
// answered). A charge that arrives while waiters are queued leaves them
// the tokens they wait for (ahead). Waiters are not state: a restart
// fails them, as it does lease waiters.

// fit is where a rate waiter stands at an instant.
type fit int

const (
	fitNow    fit = iota // it may be granted (or failed, for another reason)
	fitOwn               // held up within its tenant: a bucket below the root, or a slot
	fitShared            // held up only by the root's bucket, which every tenant shares
)

// rateFit is where w stands at now, and when its rates would fit (0 when
// they do, math.MaxInt64 when only a slot holds it up).
func (w *waiter) rateFit(now int64) (fit, int64) {
	err := w.node.checkRates(w.charges, now)
	var re *RateError
	switch {
	case err == nil && w.class != "" && !w.node.fits(w.class):
		return fitOwn, math.MaxInt64 // a release dispatches it
	case !errors.As(err, &re):
		return fitNow, 0 // fits, or never will (dispatch fails it)
	case w.node.heldBelowRoot(w.charges, now):
		return fitOwn, now + min(int64(re.RetryAfter), math.MaxInt64-now)
	}
	return fitShared, now + min(int64(re.RetryAfter), math.MaxInt64-now)
}

// heldBelowRoot reports whether a bucket below the root (its tenant's or
// under it) holds less than one of charges asks.
func (n *node) heldBelowRoot(charges []Charge, now int64) bool {
	for _, c := range charges {
		for a := n; a.parent != nil; a = a.parent {
			if b := a.rates[c.Resource]; b != nil {
				if lv, _ := b.at(now); lv < c.Amount {
					return true
				}
			}
		}
	}
	return false
}

// firstRateFit is the tenant's first waiter that may be granted now, or
// hold when a waiter before any such waits for the root's tokens: the
// tenant keeps its turn for it. Waiters held up within the tenant are
// passed over, as a lease waiter held up by its own task's cap is.
func (tq *tenantQueue) firstRateFit(now int64) (*waiter, bool) {
	for _, w := range tq.waiters {
		switch f, _ := w.rateFit(now); f {
		case fitNow:
			return w, false
		case fitShared:
			return nil, true
		}
	}
	return nil, false
}

// scan reports whether any of q's waiters may be granted now, and the
// soonest instant at which one's rates fit.
func (q *classQueue) scan(now int64) (fits bool, due int64) {
	due = math.MaxInt64
	for _, tq := range q.ring {
		for _, w := range tq.waiters {
			f, at := w.rateFit(now)
			if f == fitNow {
				return true, now
			}
			due = min(due, at)
		}
	}
	return false, due
}

// enqueueRate queues a copy of wv in the rate queue of resource and
// returns it.
func (e *Engine) enqueueRate(wv waiter, resource string) *waiter {
	w := &wv
	w.ch = make(chan Outcome, 1)
	e.arrival++
	w.arrival = e.arrival
	w.rate = resource
	e.addRateWaiter(w)
	return w
}

func (e *Engine) addRateWaiter(w *waiter) {
	q := e.rateQueues[w.rate]
	if q == nil {
		q = newQueue()
		e.rateQueues[w.rate] = q
	}
	q.add(w)
	e.rateWaiting++
	e.rateDue = 0 // decide it at the next tick
	if e.wake != nil {
		e.wake() // the caller's reaper may sleep past its instant
	}
}

// waitForRate moves a lease waiter that asked to wait for a rate, and
// that err (a rate) refuses at its turn, into that rate's queue. It
// reports whether it did.
func (e *Engine) waitForRate(w *waiter, err error) bool {
	var re *RateError
	if !w.waitRate || !errors.As(err, &re) {
		return false
	}
	e.removeWaiter(w)
	w.rate = re.Resource
	e.addRateWaiter(w)
	return true
}

// queueForRate answers a request that err refused: a rate waiter when it
// asked to wait and err is a rate, granted at once if its turn and its
// tokens are there; err otherwise.
func (e *Engine) queueForRate(w waiter, err error, now int64) (Grant, *Wait, error) {
	var re *RateError
	if !w.waitRate || !errors.As(err, &re) {
		return Grant{}, nil, err
	}
	if err := e.checkNewWaiter(w.node.tenant); err != nil {
		return Grant{}, nil, err
	}
	w.since = now
	qw := e.enqueueRate(w, re.Resource)
	e.dispatchRates(now)
	if qw.done {
		o := <-qw.ch
		return o.Grant, nil, o.Err
	}
	return Grant{}, &Wait{C: qw.ch, w: qw}, nil
}

// dispatchRates grants rate waiters in turn while they fit, queue by
// queue in resource order, and notes when one may fit next. A nested
// call (a waiter found with its session expired, whose end frees slots
// and so dispatches) is left to the outer one, which goes round the
// queues again: a queue it has passed may hold a waiter that now fits.
func (e *Engine) dispatchRates(now int64) {
	if e.rateWaiting == 0 {
		return
	}
	if e.rateDispatching {
		e.rateAgain = true
		return
	}
	e.rateDispatching = true
	defer func() { e.rateDispatching = false }()
	for {
		e.rateAgain = false
		due := int64(math.MaxInt64)
		for _, r := range slices.Sorted(maps.Keys(e.rateQueues)) {
			due = min(due, e.dispatchRate(e.rateQueues[r], now))
		}
		if !e.rateAgain {
			e.rateDue = due
			return
		}
	}
}

// dispatchRate grants q's waiters in weighted round robin while any fits,
// and returns when the next may fit.
func (e *Engine) dispatchRate(q *classQueue, now int64) int64 {
	for q.waiting > 0 {
		fits, due := q.scan(now)
		if !fits {
			return due // the ring stays where it is while the buckets refill
		}
		tq, w := q.nextBy(func(tq *tenantQueue) (*waiter, bool) { return tq.firstRateFit(now) })
		if w == nil && tq != nil {
			return tq.holdsUntil(now) // the tenant in turn waits for the root's tokens
		}
		if w == nil {
			return due // cannot be: the one that fits would be picked
		}
		if !e.stillGrantable(w, now) {
			continue
		}
		e.removeWaiter(w)
		g := e.grantNow(w, now)
		w.done, w.granted = true, g.Lease
		w.charged, w.chargedAt = g.Lease == 0, now
		w.ch <- Outcome{Grant: g}
		q.served(tq)
	}
	return math.MaxInt64
}

// holdsUntil is when the first of tq's waiters held up by the root's
// bucket fits.
func (tq *tenantQueue) holdsUntil(now int64) int64 {
	for _, w := range tq.waiters {
		if f, at := w.rateFit(now); f == fitShared {
			return at
		}
	}
	return now
}

// served counts a grant to tq in its turn, and passes the turn on when it
// is used up.
func (q *classQueue) served(tq *tenantQueue) {
	tq.grants++
	tq.deficit--
	if tq.deficit <= 0 {
		q.cursor = (q.cursor + 1) % len(q.ring)
	}
}

// stillGrantable checks a rate waiter about to be granted as a lease
// waiter is checked, failing it (or ending its session) when it cannot be.
func (e *Engine) stillGrantable(w *waiter, now int64) bool {
	if w.session.expired(now) {
		e.endSession(w.session, now, EndExpired) // fails its waiters, this one included
		return false
	}
	err := e.checkOpen(w.node, now)
	if err == nil {
		err = w.node.admits(w.write, false)
	}
	if err == nil {
		err = e.checkUse(w.node.tenant, w.class, w.charges)
	}
	if err == nil {
		if err = w.node.checkAll(w.charges); err != nil {
			err = e.refused(w.session, err) // a quota was spent, or reserved, while it waited
		}
	}
	if err == nil {
		err = w.node.checkRates(w.charges, now) // a rate lowered past it: never fits
	}
	if err != nil {
		e.failWaiter(w, err)
		return false
	}
	return true
}

// grantNow charges w, and grants its lease when it has a class. The
// caller has checked that it fits.
func (e *Engine) grantNow(w *waiter, now int64) Grant {
	if w.class != "" {
		return e.grant(w, now)
	}
	e.emit(Event{Kind: EvCharged, At: now, Session: w.session.id, Node: w.node.id, Charges: w.charges,
		RequestID: w.requestID, Fingerprint: w.fingerprint, Warnings: w.node.warnings(w.charges, "", 0), Write: w.write})
	return Grant{Node: w.node.id}
}

// giveBackCharge undoes the charges of w, granted without a lease, whose
// caller gave up at the instant of the grant: they are refunded (from the
// window they were made in, and to the buckets), and the request id is
// forgotten, so that a retry is decided afresh. A charge whose session or
// node has gone since stands, as a lease ended meanwhile does.
func (e *Engine) giveBackCharge(w *waiter) {
	w.charged = false // a second CancelWait finds nothing
	now := e.tick()
	if e.sessions[w.session.id] != w.session || e.nodes[w.node.id] != w.node {
		return
	}
	e.undoCharge(w.session, w.node, w.charges, w.requestID, w.chargedAt, now)
}

// undoCharge refunds charges made on n at chargedAt, a grant without a
// lease that its caller never learned of, and makes s forget requestID.
func (e *Engine) undoCharge(s *session, n *node, charges []Charge, requestID string, chargedAt, now int64) {
	e.emit(Event{Kind: EvCharged, At: now, Session: s.id, Node: n.id, Charges: charges,
		Forget: requestID, GivenBack: true, ChargedAt: chargedAt})
	e.dispatchRatesAfter() // the tokens given back may let a rate waiter fit
}

// aheadOf is what the rate waiters on or below a ask of r: what a charge
// of r arriving while they wait must leave in a's bucket for them. nil
// when nobody waits.
func (e *Engine) aheadOf() func(a *node, r string) int64 {
	if e.rateWaiting == 0 {
		return nil
	}
	return e.ahead
}

func (e *Engine) ahead(a *node, r string) int64 {
	sum := int64(0)
	for _, q := range e.rateQueues {
		for _, tq := range q.ring {
			for _, w := range tq.waiters {
				if !w.node.within(a) {
					continue
				}
				for _, c := range w.charges {
					if c.Resource == r {
						sum = saturatingAdd(sum, c.Amount)
					}
				}
			}
		}
	}
	return sum
}

// rateChanged makes the next tick dispatch the rate queues: something
// that may let a waiter fit sooner than foreseen happened (a release, an
// edit, a give-back, an ended slice, a waiter gone).
func (e *Engine) rateChanged() {
	if e.rateWaiting > 0 {
		e.rateDue = 0
	}
}

// dispatchRatesAfter dispatches the rate queues after the outermost
// dispatch of leases: what freed a slot may have freed tokens too, or the
// slot a rate waiter with a class waits for.
func (e *Engine) dispatchRatesAfter() {
	if e.rateWaiting > 0 && !e.dispatching {
		e.rateChanged()
		e.dispatchRates(e.now())
	}
}

// nextRateDue lowers next to when a rate waiter may fit.
func (e *Engine) nextRateDue(next int64) int64 {
	if e.rateWaiting == 0 {
		return next
	}
	return min(next, e.rateDue)
}

// tenantQueues is t's queues, of lease classes then of rates, each in
// name order.
func (e *Engine) tenantQueues(t *node) []*tenantQueue {
	var out []*tenantQueue
	for _, m := range []map[string]*classQueue{e.queues, e.rateQueues} {
		for _, name := range slices.Sorted(maps.Keys(m)) {
			if tq := m[name].byNode[t]; tq != nil {
				out = append(out, tq)
			}
		}
	}
	return out
}

// eachQueue calls f with every queue, of lease classes and of rates.
func (e *Engine) eachQueue(f func(*classQueue)) {
	for _, q := range e.queues {
		f(q)
	}
	for _, q := range e.rateQueues {
		f(q)
	}
}
