package engine

import (
	"errors"
	"fmt"
	"math"
)

// A reservation is a share of a quota delegated to a session: units of one
// resource on one node that the session may spend without asking. Unspent
// reserved units count against every quota on the chain exactly like
// spent ones, so caps hold at every instant across any number of sessions.
// The holder reports what it spent (which is then charged for good) and
// gives back what it will not spend; giving back is not a refund, since
// those units were never spent. When a charge does not fit only because
// of other sessions' unspent reservations, the engine recalls them
// (NoticeRecall) and answers ErrRecalling, and the caller tries again: so
// a quota of N admits exactly N units, however they are spread. A session
// that ends with units reserved has them counted as spent: it may have
// spent them, and nobody can know.

// ReserveShare bounds a new reservation to this fraction of the headroom
// on its chain (but at least one unit), so that reservations shrink to
// single units as a quota runs out and several holders can share the rest.
const ReserveShare = 4

type reservation struct {
	session  *session
	node     *node
	resource string
	amount   int64 // reserved and not known to be spent
}

// resKey names a session's reservation.
type resKey struct {
	node     NodeID
	resource string
}

// ReserveRequest settles and tops up the session's reservation of Resource
// on Node, in one step.
type ReserveRequest struct {
	Node     NodeID
	Resource string
	// Spent is how many reserved units the holder has spent since it last
	// said: they are charged for good.
	Spent int64
	// Return is how many unspent units it gives back.
	Return int64
	// Want is how many more units to reserve. Fewer are reserved when the
	// headroom is small (see ReserveShare); with no headroom the request is
	// a *Denial, or ErrRecalling while other reservations hold what it needs.
	Want int64
	// Exact reserves all of Want or nothing, checked as a consume of Want
	// would be: the hold of one call's estimate, which must not come back
	// short. It settles nothing: Spent and Return are 0.
	Exact bool
	// EndSlice gives back the session's slice of the resource's rate on
	// the node, if it holds one (slice.go). It reserves nothing (Want 0).
	EndSlice  bool
	RequestID string
}

// Reservation is a reservation after a ReserveRequest.
type Reservation struct {
	Node     NodeID
	Resource string
	// Reserved is how many unspent units the session holds now.
	Reserved int64
	// Granted is how many units this request added.
	Granted int64
	// ReadOnly, set while the node's tenant is read_only, is the refusal a
	// write gets: the holder spends none of the units on a write.
	ReadOnly *TenantStateError
	// Rated says that a rate on the node's chain binds the resource, so
	// none of it is reserved (Want is not granted): units spent later by
	// their holder would not be taken from the buckets at the time of
	// their spending, and the fleet could pass the rate. The holder charges
	// the resource per unit of work instead, and may ask again later (the
	// rate may be removed). With a slice of the rate (Slice), units
	// are reserved all the same: the holder spends them as its slice lets
	// it, and charges per unit of work when its slice has nothing.
	Rated bool
	// Slice is the session's slice of the resource's rate on the node, as
	// it stands after the request, or nil (slice.go).
	Slice *Slice
}

// Reserve settles what the session spent of its reservation of
// r.Resource on r.Node, gives back what it returns, and reserves up to
// r.Want more, all in one step or not at all. A request that only settles
// (Want 0) is accepted on an ended node. A retry with the same request id
// returns the original reservation and changes nothing.
func (e *Engine) Reserve(sid SessionID, r ReserveRequest) (Reservation, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.tick()
	s, err := e.session(sid, now)
	if err != nil {
		return Reservation{}, err
	}
	if s.id == System {
		return Reservation{}, invalid("the system session holds no reservations")
	}
	if err := validName("resource", r.Resource); err != nil {
		return Reservation{}, err
	}
	if r.Spent < 0 || r.Return < 0 || r.Want < 0 {
		return Reservation{}, invalid("spent %d, return %d and want %d cannot be negative", r.Spent, r.Return, r.Want)
	}
	if r.Spent == 0 && r.Return == 0 && r.Want == 0 && !r.EndSlice {
		return Reservation{}, invalid("nothing to reserve, settle or return")
	}
	if r.EndSlice && (r.Want != 0 || r.Exact) {
		return Reservation{}, invalid("giving a slice back reserves nothing (want %d)", r.Want)
	}
	if r.Exact && (r.Want == 0 || r.Spent != 0 || r.Return != 0) {
		return Reservation{}, invalid("an exact reservation reserves want units and settles nothing (want %d, spent %d, return %d)", r.Want, r.Spent, r.Return)
	}
	fp := uint64(0)
	if r.RequestID != "" {
		fp = r.fingerprint()
		if res, ok, err := s.requests.lookup(r.RequestID, fp); ok || err != nil {
			if err != nil {
				return Reservation{}, err
			}
			v := Reservation{Node: r.Node, Resource: r.Resource, Granted: res.amount,
				Reserved: s.reservedOn(r.Node, r.Resource), Slice: s.sliceView(r.Node, r.Resource, now)}
			if n := e.nodes[r.Node]; n != nil {
				v.ReadOnly = n.writesRefused()
			}
			return v, nil
		}
	}
	n, err := e.target(s, r.Node)
	if err != nil {
		return Reservation{}, err
	}
	if err := e.checkResource(n.tenant, r.Resource); err != nil {
		return Reservation{}, err
	}
	have := s.reservedOn(n.id, r.Resource)
	if r.Spent > have || r.Return > have-r.Spent {
		return Reservation{}, invalid("spent %d and return %d settle more than the %d units reserved", r.Spent, r.Return, have)
	}
	grant, rated, sg, err := e.reserveWant(s, n, r, now)
	if err != nil {
		return Reservation{}, err
	}
	if r.EndSlice && s.slices[resKey{n.id, r.Resource}] != nil {
		e.emit(Event{Kind: EvSliceEnded, At: now, Session: s.id, Node: n.id, Resource: r.Resource})
	}
	if r.Spent == 0 && r.Return == 0 && grant == 0 && sg == nil {
		// Nothing changes but the slice given back, if any: no EvReserved.
		return Reservation{Node: n.id, Resource: r.Resource, Reserved: have, Rated: rated,
			Slice: s.sliceView(n.id, r.Resource, now), ReadOnly: n.writesRefused()}, nil
	}
	var warn []Warning
	if grant > 0 {
		// Units settled leave reserved for used, and returned ones free
		// room: what the chain holds grows by the grant less what returns.
		warn = n.warnings([]Charge{{r.Resource, grant - r.Return}}, "", 0)
	}
	e.emit(Event{Kind: EvReserved, At: now, Session: s.id, Node: n.id, Resource: r.Resource,
		Spent: r.Spent, Returned: r.Return, Amount: grant, RequestID: r.RequestID, Fingerprint: fp, Warnings: warn, Slice: sg})
	return Reservation{Node: n.id, Resource: r.Resource, Reserved: s.reservedOn(n.id, r.Resource), Granted: grant,
		Rated: rated, Slice: s.sliceView(n.id, r.Resource, now), ReadOnly: n.writesRefused()}, nil
}

// reserveWant decides what r's Want adds on n at now: nothing without a
// Want; for a resource a rate binds on n's chain (unless exact: one call's
// hold is taken as its charge would be), rated, and nothing unless a
// slice of the rate is granted or renewed (slice.go), with which the
// units are granted as if no rate bound them; otherwise the grant, sized
// to quotas and rates, or the refusal.
func (e *Engine) reserveWant(s *session, n *node, r ReserveRequest, now int64) (grant int64, rated bool, sg *SliceGrant, err error) {
	if r.Want == 0 {
		return 0, false, nil, nil
	}
	if err := e.checkOpen(n, now); err != nil {
		return 0, false, nil, err
	}
	if err := n.admits(false, false); err != nil {
		return 0, false, nil, err
	}
	if !r.Exact && n.rated(r.Resource) {
		if sg = e.sliceFor(s, n, r.Resource, now); sg == nil {
			return 0, true, nil, nil
		}
		rated = true
	}
	grant, err = n.reserveGrant(r)
	if err != nil {
		return 0, false, nil, e.refused(s, err)
	}
	if sg == nil {
		grant, err = n.reserveRate(r, grant, now, e.aheadOf())
	}
	return grant, rated, sg, err
}

// reserveGrant is how many units r adds on n: all of Want or a refusal for
// an exact reservation, otherwise a share of the headroom (ReserveShare).
func (n *node) reserveGrant(r ReserveRequest) (int64, error) {
	if r.Exact {
		if err := n.check(r.Resource, r.Want); err != nil {
			return 0, err
		}
		return r.Want, nil
	}
	room, err := n.reserveRoom(r.Resource, r.Spent, r.Return)
	if err != nil {
		return 0, err
	}
	return min(r.Want, max(1, room/ReserveShare)), nil
}

// fingerprint tells a retry of r from another request with its id.
func (r *ReserveRequest) fingerprint() uint64 {
	fp := fnvAdd(fnvAdd(fingerprint(opReserve, r.Node, r.Resource, r.Want), uint64(r.Spent)), uint64(r.Return))
	if r.Exact {
		fp = fnvAdd(fp, 1)
	}
	if r.EndSlice {
		fp = fnvAdd(fp, 2)
	}
	return fp
}

// reservedOn is how many units of resource the session holds on node.
func (s *session) reservedOn(node NodeID, resource string) int64 {
	if res := s.reservations[resKey{node, resource}]; res != nil {
		return res.amount
	}
	return 0
}

// reserveRoom is the headroom on n's chain for a new reservation of r once
// spent units of the session's reservation there are charged and returned
// units given back, and at most what every counter on the chain can still
// hold (capped or not). With no room it returns ErrInvalid when a counter
// is at MaxInt64, else the *Denial of the first node whose spent usage is
// at its cap, or, when only unspent reservations are in the way, a
// *recallNeeded.
func (n *node) reserveRoom(r string, spent, returned int64) (int64, error) {
	room := int64(math.MaxInt64)
	var denied, blocked *node
	var deniedLimit int64
	for a := n; a != nil; a = a.parent {
		g := a.quota[r]
		if g == nil {
			continue
		}
		if !a.saturates(g) {
			// Spent units move from reserved to used: the sum stays.
			space := math.MaxInt64 - g.n - g.r + returned
			if space <= 0 {
				return 0, invalid("%s on %q is at the largest count it can hold", r, a.name)
			}
			room = min(room, space)
		}
		eff, refuses := g.enforced()
		if !refuses || denied != nil {
			continue
		}
		if g.spent()+spent >= eff {
			denied, deniedLimit = a, eff
			continue
		}
		free := eff - g.spent() - g.r + returned
		if free <= 0 {
			blocked = a
		}
		room = min(room, free)
	}
	if denied != nil {
		// What this request settles is spent too: the denial counts it
		// where it was spent.
		return 0, denied.denialWith(r, 1, deniedLimit, n, spent)
	}
	if blocked != nil {
		return 0, &recallNeeded{node: blocked, resource: r}
	}
	return room, nil
}

// recallNeeded is a charge that does not fit only because of unspent
// reservations under node.
type recallNeeded struct {
	node     *node
	resource string
}

func (r *recallNeeded) Error() string {
	return fmt.Sprintf("%s on %q is held by reservations", r.resource, r.node.name)
}

// recalled turns a *recallNeeded into ErrRecalling, telling the holders of
// the reservations in the way to give back what they have not spent. Other
// errors pass through.
func (e *Engine) recalled(err error) error {
	var rn *recallNeeded
	if !errors.As(err, &rn) {
		return err
	}
	e.recallUnder(rn.node, "", rn.resource)
	return fmt.Errorf("%w: %s on %q is held unspent by reservations, which are being recalled; try again shortly",
		ErrRecalling, rn.resource, rn.node.name)
}

func (e *Engine) applyReserved(ev *Event) error {
	s, n := e.sessions[ev.Session], e.nodes[ev.Node]
	if s == nil || n == nil || ev.Resource == "" || ev.Spent < 0 || ev.Returned < 0 || ev.Amount < 0 {
		return fmt.Errorf("%w: reservation of %s on node %d by session %d", ErrCorrupt, ev.Resource, ev.Node, ev.Session)
	}
	key := resKey{n.id, ev.Resource}
	res := s.reservations[key]
	settled := ev.Spent + ev.Returned
	if settled > s.reservedOn(n.id, ev.Resource) {
		return fmt.Errorf("%w: session %d settles %d units of %s on node %d, more than it holds", ErrCorrupt, ev.Session, settled, ev.Resource, ev.Node)
	}
	if ev.Slice != nil {
		if err := e.checkSlice(s, n, ev); err != nil {
			return err // before anything of ev applies
		}
	}
	for a := n; a != nil; a = a.parent {
		a.quota.at(ev.Resource).shift(ev.Spent, ev.Amount-settled, a.isRoot())
	}
	if ev.Slice == nil {
		n.takeRate(ev.Resource, ev.Amount, ev.At)
	} else {
		e.applySlice(s, n, ev)
	}
	if res == nil {
		if ev.Amount == 0 {
			return nil
		}
		res = &reservation{session: s, node: n, resource: ev.Resource}
		e.addReservation(res)
	}
	res.amount += ev.Amount - settled
	if res.amount == 0 {
		e.dropReservation(res)
	}
	return nil
}

func (e *Engine) addReservation(res *reservation) {
	s := res.session
	if s.reservations == nil {
		s.reservations = make(map[resKey]*reservation)
	}
	s.reservations[resKey{res.node.id, res.resource}] = res
	res.node.pins++
	byRes := e.reserved[res.resource]
	if byRes == nil {
		byRes = make(map[*reservation]struct{})
		e.reserved[res.resource] = byRes
	}
	byRes[res] = struct{}{}
}

func (e *Engine) dropReservation(res *reservation) {
	delete(res.session.reservations, resKey{res.node.id, res.resource})
	res.node.pins--
	delete(e.reserved[res.resource], res)
	if len(e.reserved[res.resource]) == 0 {
		delete(e.reserved, res.resource)
	}
}

// spendReservations counts a session's unspent reservations as spent, when
// the session ends: nobody can know how much of them it used.
func (e *Engine) spendReservations(s *session) {
	for _, res := range s.reservations {
		for a := res.node; a != nil; a = a.parent {
			a.quota.at(res.resource).shift(res.amount, -res.amount, a.isRoot())
		}
		e.dropReservation(res)
	}
}
