package engine

import (
	"fmt"
	"time"
)

type lease struct {
	id      LeaseID
	session *session
	node    *node
	class   string
	granted int64
	// count is how many slots the lease holds: 1 for a lease, any number
	// (0 included) for a block delegated to a session (block.go).
	count int64
	block bool
	// charges are what its grant charged: all a give-back may undo
	// (giveback.go).
	charges []Charge
}

// tombstone remembers how a lease ended, for TombstoneTTL.
type tombstone struct {
	session SessionID
	node    NodeID
	class   string
	reason  EndReason
	at      int64
}

// AcquireRequest asks for a lease of Class on Node, and charges Charges to
// Node's quotas in the same step: both happen, or neither. An empty Class
// charges without taking a lease.
type AcquireRequest struct {
	Node      NodeID
	Class     string
	Charges   map[string]int64
	RequestID string
	// Write marks work classified as a write, which a read_only tenant
	// refuses (tenantstate.go).
	Write bool
	// WaitRate queues the request when a rate refuses its charges (and
	// nothing else does), rather than refusing it: it is granted in
	// weighted round robin with the other tenants' rate waiters once the
	// buckets hold its charges (ratewait.go). It is not part of the
	// request's fingerprint: waiting changes when it is decided, not what.
	WaitRate bool
}

// fingerprint tells a retry of r (with its normalized charges) from
// another request with its id; a request not marked Write keeps the
// fingerprint it always had.
func (r *AcquireRequest) fingerprint(charges []Charge) uint64 {
	fp := fingerprintCharges(opAcquire, r.Node, r.Class, charges)
	if r.Write {
		fp = fnvAdd(fp, 1)
	}
	return fp
}

// Grant is a granted lease. Lease is zero for a charge-only request.
type Grant struct {
	Lease LeaseID
	Node  NodeID
	Class string
}

// Outcome is what a Wait ends with: a grant or an error.
type Outcome struct {
	Grant Grant
	Err   error
}

// Wait is a queued Acquire. C receives exactly one Outcome. A caller that
// stops waiting must call CancelWait.
type Wait struct {
	C <-chan Outcome
	w *waiter
}

// Acquire charges r.Charges and takes a lease of r.Class on r.Node. When the
// lease fits now it returns the grant. When a limit on the chain is full it
// queues the request and returns a *Wait; so it does, with r.WaitRate, when
// a rate refuses the charges. A quota that would be exceeded is a *Denial
// at once, and nothing is queued or charged.
func (e *Engine) Acquire(sid SessionID, r AcquireRequest) (Grant, *Wait, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.tick()
	s, err := e.session(sid, now)
	if err != nil {
		return Grant{}, nil, err
	}
	if s.id == System {
		return Grant{}, nil, invalid("the system session holds no leases")
	}
	if r.Class != "" {
		if err := validName("lease class", r.Class); err != nil {
			return Grant{}, nil, err
		}
	} else if len(r.Charges) == 0 {
		return Grant{}, nil, invalid("nothing to acquire: no class and no charges")
	}
	charges, err := normalizeCharges(r.Charges)
	if err != nil {
		return Grant{}, nil, err
	}
	fp := uint64(0)
	if r.RequestID != "" {
		fp = r.fingerprint(charges)
		if res, ok, err := s.requests.lookup(r.RequestID, fp); ok || err != nil {
			return Grant{Lease: res.lease, Node: r.Node, Class: r.Class}, nil, err
		}
	}
	n, err := e.target(s, r.Node)
	if err != nil {
		return Grant{}, nil, err
	}
	if err := e.checkOpen(n, now); err != nil {
		return Grant{}, nil, err
	}
	if err := n.admits(r.Write, false); err != nil {
		return Grant{}, nil, err
	}
	if err := e.checkUse(n.tenant, r.Class, charges); err != nil {
		return Grant{}, nil, err
	}
	if err := n.checkAll(charges); err != nil {
		return Grant{}, nil, e.refused(s, err)
	}
	// w stays on the stack when granted at once: only a queued waiter is
	// allocated (by enqueue), so the uncontended path does not pay for it.
	w := waiter{session: s, node: n, class: r.Class, charges: charges, requestID: r.RequestID,
		fingerprint: fp, priority: n.priority, write: r.Write, waitRate: r.WaitRate}
	if err := n.checkRatesAhead(charges, now, e.aheadOf()); err != nil {
		return e.queueForRate(w, err, now)
	}
	if r.Class == "" || n.fits(r.Class) {
		return e.grantNow(&w, now), nil, nil
	}
	if err := e.checkNewWaiter(n.tenant); err != nil {
		return Grant{}, nil, err
	}
	w.since = now
	qw := e.enqueue(w)
	return Grant{}, &Wait{C: qw.ch, w: qw}, nil
}

// CancelWait withdraws a queued Acquire. If it was granted in the meantime,
// the grant is undone whole: the lease is given straight back and the slot
// goes to the next waiter, so no lease is leaked, and its charges are
// refunded; so are those of a charge granted without a lease (a rate
// waiter's). The caller never saw the grant.
func (e *Engine) CancelWait(wt *Wait) {
	e.mu.Lock()
	defer e.mu.Unlock()
	w := wt.w
	if !w.done {
		e.removeWaiter(w)
		w.done = true
		e.dispatchRatesAfter() // it may have held a rate queue's turn
		return
	}
	if w.charged {
		e.giveBackCharge(w)
		return
	}
	if l := e.leases[w.granted]; l != nil {
		// The caller never saw this grant: undo it whole, charges included,
		// and forget its request id so a retry is decided afresh.
		e.emit(Event{Kind: EvLeaseReleased, At: e.tick(), Session: l.session.id, Lease: l.id,
			Forget: w.requestID, Charges: w.charges, GivenBack: true})
		e.dispatch(l.class)
	}
}

// grant charges and grants w's lease now. The caller has checked it fits.
func (e *Engine) grant(w *waiter, now int64) Grant {
	id := e.nextLease
	e.emit(Event{Kind: EvLeaseGranted, At: now, Session: w.session.id, Node: w.node.id, Lease: id,
		Resource: w.class, Charges: w.charges, RequestID: w.requestID, Fingerprint: w.fingerprint,
		Warnings: w.node.warnings(w.charges, w.class, 1), Write: w.write})
	return Grant{Lease: id, Node: w.node.id, Class: w.class}
}

func (e *Engine) applyGrant(ev *Event) error {
	n, s := e.nodes[ev.Node], e.sessions[ev.Session]
	if n == nil || s == nil || ev.Lease < e.nextLease || ev.Resource == "" {
		return fmt.Errorf("%w: grant of lease %d (next %d) on node %d to session %d",
			ErrCorrupt, ev.Lease, e.nextLease, ev.Node, ev.Session)
	}
	if ev.Block && (ev.Amount < 0 || s.blocks[blockKey{n.id, ev.Resource}] != nil) {
		return fmt.Errorf("%w: block %d of %d slots of %s on node %d", ErrCorrupt, ev.Lease, ev.Amount, ev.Resource, ev.Node)
	}
	for _, c := range ev.Charges {
		n.charge(c.Resource, c.Amount)
	}
	n.takeRates(ev.Charges, ev.At, 1)
	l := &lease{id: ev.Lease, session: s, node: n, class: ev.Resource, granted: ev.At, count: 1, charges: ev.Charges}
	if ev.Block {
		l.block, l.count = true, ev.Amount
	}
	e.attach(l)
	for a := n; a != nil; a = a.parent {
		a.limit.add(l.class, l.count, a.isRoot())
	}
	e.nextLease = l.id + 1
	return nil
}

// attach files a lease under the engine, its session and its node, and a
// block also under its class and the session's blocks.
func (e *Engine) attach(l *lease) { attachLease(l, e.leases, e.blocks) }

func attachLease(l *lease, all map[LeaseID]*lease, blocks map[string]map[LeaseID]*lease) {
	all[l.id] = l
	l.session.leases[l.id] = l
	if l.node.leases == nil {
		l.node.leases = make(map[LeaseID]*lease)
	}
	l.node.leases[l.id] = l
	if l.block {
		if l.session.blocks == nil {
			l.session.blocks = make(map[blockKey]*lease)
		}
		l.session.blocks[blockKey{l.node.id, l.class}] = l
		byClass := blocks[l.class]
		if byClass == nil {
			byClass = make(map[LeaseID]*lease)
			blocks[l.class] = byClass
		}
		byClass[l.id] = l
	}
}

// endLease ends a live lease and leaves its tombstone.
func (e *Engine) endLease(l *lease, why EndReason, at int64) {
	delete(e.leases, l.id)
	delete(l.session.leases, l.id)
	delete(l.node.leases, l.id)
	if l.block {
		delete(l.session.blocks, blockKey{l.node.id, l.class})
		delete(e.blocks[l.class], l.id)
		if why == EndRevoked {
			e.notify(Notice{Session: l.session.id, Kind: NoticeEnded, Node: l.node.id, Class: l.class})
		}
	}
	// An empty block frees nothing, and must not bring back a class
	// whose cap was removed while it held no slot (a name, for bounds).
	for a := l.node; a != nil && l.count != 0; a = a.parent {
		a.limit.add(l.class, -l.count, a.isRoot())
	}
	e.tombs[l.id] = tombstone{session: l.session.id, node: l.node.id, class: l.class, reason: why, at: at}
	e.tombOrder = append(e.tombOrder, l.id)
}

func (e *Engine) tombstone(id LeaseID, now int64) (tombstone, bool) {
	t, ok := e.tombs[id]
	if !ok || t.at+int64(TombstoneTTL) <= now {
		return tombstone{}, false
	}
	return t, true
}

func (e *Engine) purgeTombstones(now int64) {
	i := 0
	for ; i < len(e.tombOrder); i++ {
		id := e.tombOrder[i]
		if t, ok := e.tombs[id]; ok {
			if t.at+int64(TombstoneTTL) > now {
				break
			}
			delete(e.tombs, id)
		}
	}
	e.tombOrder = e.tombOrder[i:]
}

// touch checks a live lease lazily: its session's TTL and its node's chain.
// It returns the lease if it is still live.
func (e *Engine) touch(l *lease, now int64) *lease {
	if l.session.expired(now) {
		e.endSession(l.session, now, EndExpired)
		return nil
	}
	if e.checkOpen(l.node, now) != nil {
		return nil
	}
	return e.leases[l.id]
}

// Release gives a lease back and reports how the call it covered went, for
// adaptive limits. Releasing a released lease is a no-op; releasing one that
// expired or was revoked returns ErrLeaseExpired or ErrLeaseRevoked.
func (e *Engine) Release(sid SessionID, id LeaseID, latency time.Duration, overloaded bool, requestID string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.tick()
	s, err := e.session(sid, now)
	if err != nil {
		return err
	}
	if latency < 0 {
		return invalid("latency %v is negative", latency)
	}
	fp := uint64(0)
	if requestID != "" {
		fp = fingerprint(opRelease, 0, "", int64(id))
		if _, ok, err := s.requests.lookup(requestID, fp); ok || err != nil {
			return err
		}
	}
	if l := e.leases[id]; l != nil {
		if !l.node.within(s.scope) {
			return leaseNotFound(id)
		}
		// Touch first, so an expired lease reads as expired whether or not
		// Reap has run.
		if l = e.touch(l, now); l != nil && l.session != s {
			return fmt.Errorf("%w: lease %d is held by another session", ErrPermission, id)
		}
		if l != nil {
			// A block's end reports no call: its slots' calls are reported
			// by Observe as they end. A cut the call calls for comes first,
			// so the slot it frees is dispatched under the new limit.
			if c := e.adaptive[l.class]; c != nil && !l.block {
				c.observe(latency, overloaded, l.granted)
				c.cutEarly(e, now)
			}
			e.emit(Event{Kind: EvLeaseReleased, At: now, Session: s.id, Lease: id,
				RequestID: requestID, Fingerprint: fp})
			e.dispatch(l.class)
			return nil
		}
	}
	return e.ended(s, id, now)
}

// ended explains why a lease that is not live is not live.
func (e *Engine) ended(s *session, id LeaseID, now int64) error {
	t, ok := e.tombstone(id, now)
	if !ok {
		return leaseNotFound(id)
	}
	// A lease whose node was reclaimed is as forgotten; one outside the
	// scope is, to this session, as if it never existed.
	if n := e.nodes[t.node]; n == nil || !n.within(s.scope) {
		return leaseNotFound(id)
	}
	if t.reason == EndReleased && t.session == s.id {
		return nil
	}
	return &LeaseEndedError{Lease: id, Reason: t.reason}
}

// leaseNotFound is the error for a lease id the engine does not hold, or
// holds outside the session's scope: the two read the same, so that a
// tenant cannot learn which of another tenant's lease ids exist.
func leaseNotFound(id LeaseID) error {
	return fmt.Errorf("%w: lease %d", ErrNotFound, id)
}

// Validate reports whether a lease is still held, so a downstream can check
// before work it cannot undo.
func (e *Engine) Validate(sid SessionID, id LeaseID) (Grant, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.tick()
	s, err := e.session(sid, now)
	if err != nil {
		return Grant{}, err
	}
	if l := e.leases[id]; l != nil {
		if !l.node.within(s.scope) {
			return Grant{}, leaseNotFound(id)
		}
		if l = e.touch(l, now); l != nil {
			return Grant{Lease: l.id, Node: l.node.id, Class: l.class}, nil
		}
	}
	err = e.ended(s, id, now)
	if err == nil {
		err = &LeaseEndedError{Lease: id, Reason: EndReleased}
	}
	return Grant{}, err
}
