package engine

import "slices"

// Grants their callers never learned of. A caller that stops waiting just
// as its grant is made (its deadline passes while the answer is committed
// or on the wire) cannot release what it does not know it holds. Whoever
// finds out gives the grant back with these: the server, when the caller's
// context ended before the answer was committed, and the caller itself,
// when it sends the request again marked as abandoned. They are what
// CancelWait does for a queued grant, for grants already made.
//
// With a request id, what is given back is what the session remembers the
// request got, so the same call finds it again from either side, and a
// second give-back finds nothing. Without one, it is what the caller says
// the request got; a lease's charges are refunded only as its grant made
// them, whatever the caller says.

// GiveBack undoes r's lease whole: the slot goes to the next waiter, r's
// charges are refunded, and r's request id is forgotten, so that a retry is
// decided afresh. It returns the lease given back, or 0 when r holds none
// (never granted, a charge only, already given back or ended). A charge
// without a lease is GiveBackCharged's. r's charges must be those
// the lease was granted with: a give-back naming others is refused as
// invalid, since it would refund what the lease never charged.
func (e *Engine) GiveBack(sid SessionID, r AcquireRequest, lease LeaseID) (LeaseID, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.tick()
	s, charges, err := e.sessionCharges(sid, r.Charges, now)
	if err != nil {
		return 0, err
	}
	if r.RequestID != "" {
		res, ok, err := s.requests.lookup(r.RequestID, r.fingerprint(charges))
		if err != nil || !ok {
			return 0, err
		}
		lease = res.lease
	}
	l := e.leases[lease]
	if l == nil || l.session != s || l.block || l.node.id != r.Node || l.class != r.Class {
		return 0, nil
	}
	if l = e.touch(l, now); l == nil {
		return 0, nil
	}
	if !slices.Equal(charges, l.charges) {
		return 0, invalid("lease %d was granted charging %v, not %v: a give-back refunds only what its grant charged", l.id, l.charges, charges)
	}
	e.emit(Event{Kind: EvLeaseReleased, At: now, Session: s.id, Lease: l.id, Forget: r.RequestID,
		Charges: l.charges, GivenBack: true})
	e.dispatch(l.class)
	return l.id, nil
}

// GiveBackCharged undoes, whole, the charges r made without a lease (an
// Acquire with no class), as CancelWait undoes a rate waiter's: they are
// refunded to every node on the chain (from the window they were spent
// in: what a window that has reset since spent stays spent there) and to
// every bucket, and r's request id is forgotten, so that a retry is
// decided afresh. It names the charge by r's request id, which the
// session remembers with the charge's time, and r's charges must be the
// request's. It reports whether it gave anything back: nothing for a
// request not remembered (never granted, given back already, among the
// oldest forgotten), one that took a lease (GiveBack), one whose node has
// been reclaimed, or one remembered by an older governord, which did not
// keep the time.
func (e *Engine) GiveBackCharged(sid SessionID, r AcquireRequest) (bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.tick()
	s, charges, err := e.sessionCharges(sid, r.Charges, now)
	if err != nil {
		return false, err
	}
	if r.RequestID == "" {
		return false, invalid("a charge is given back by the request id that made it")
	}
	res, ok, err := s.requests.lookup(r.RequestID, r.fingerprint(charges))
	if err != nil || !ok || res.lease != 0 || res.chargedAt == 0 || len(charges) == 0 {
		return false, err
	}
	n := e.nodes[res.node]
	if n == nil {
		return false, nil
	}
	e.undoCharge(s, n, charges, r.RequestID, res.chargedAt, now)
	return true, nil
}

// GiveBackBlock takes back the slots r added to the session's block, as
// long as the block holds them, and returns the block and how many slots
// it took back. A shrink is not undone: the slots it gave back may be held
// by others already. The request id stays remembered, as having added
// nothing, so a retry adds nothing either.
func (e *Engine) GiveBackBlock(sid SessionID, r BlockRequest, added int64) (BlockGrant, int64, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.tick()
	s, err := e.session(sid, now)
	if err != nil {
		return BlockGrant{}, 0, err
	}
	fp := uint64(0)
	if r.RequestID != "" {
		fp = r.fingerprint()
		res, ok, err := s.requests.lookup(r.RequestID, fp)
		if err != nil {
			return BlockGrant{}, 0, err
		}
		added = 0
		if ok {
			added = res.amount
		}
	}
	l := s.blocks[blockKey{r.Node, r.Class}]
	if l == nil || e.touch(l, now) == nil {
		return BlockGrant{Node: r.Node, Class: r.Class}, 0, nil
	}
	k := max(min(added, l.count), 0)
	if k > 0 {
		e.emit(Event{Kind: EvBlockResized, At: now, Session: s.id, Node: l.node.id, Lease: l.id, Resource: l.class,
			Amount: -k, RequestID: r.RequestID, Fingerprint: fp})
		e.dispatch(l.class)
	}
	return BlockGrant{Lease: l.id, Node: l.node.id, Class: l.class, Count: l.count, Contended: e.contended(l.class),
		Adaptive: e.adaptive[l.class] != nil}, k, nil
}

// GiveBackReserved gives back the units r added to the session's
// reservation, as long as it holds them, and returns the reservation and
// how many units it gave back. What r settled stays settled: units spent
// were spent. The request id stays remembered, as having added nothing, so
// a retry neither adds nor settles again.
func (e *Engine) GiveBackReserved(sid SessionID, r ReserveRequest, added int64) (Reservation, int64, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.tick()
	s, err := e.session(sid, now)
	if err != nil {
		return Reservation{}, 0, err
	}
	fp := uint64(0)
	if r.RequestID != "" {
		fp = r.fingerprint()
		res, ok, err := s.requests.lookup(r.RequestID, fp)
		if err != nil {
			return Reservation{}, 0, err
		}
		added = 0
		if ok {
			added = res.amount
		}
	}
	k := max(min(added, s.reservedOn(r.Node, r.Resource)), 0)
	if k > 0 {
		e.emit(Event{Kind: EvReserved, At: now, Session: s.id, Node: r.Node, Resource: r.Resource,
			Returned: k, RequestID: r.RequestID, Fingerprint: fp})
	}
	return Reservation{Node: r.Node, Resource: r.Resource, Reserved: s.reservedOn(r.Node, r.Resource)}, k, nil
}
