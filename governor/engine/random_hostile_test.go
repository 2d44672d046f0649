package engine

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
)

// The randomized driver's side of hostile amounts (I24): now and then an
// amount a consume, a charge, a reservation, a block or a dry run carries is
// replaced by one a broken or hostile sidecar sends, and every such call is
// checked against what the model says it must be refused for.

// hostileOdds is one in how many amounts is replaced, in the seeds that
// replace any (half of them, so that the other half keep every counter
// small and their coverage of everything else as it was: an amount
// accepted that takes a counter to MaxInt64 leaves its resource refused
// as invalid for the rest of the history).
const hostileOdds = 16

// hostileAmount is amount or, one time in hostileOdds, an amount a broken
// or hostile sidecar sends instead: zero, negative, one of the sizes that
// break other code (2^31, 2^53, MaxInt64/2, MaxInt64/2+1, MaxInt64), or one
// that takes the fullest counter on the call's chain (which holds fill)
// exactly to MaxInt64 or one past it. It draws from hrng, a stream of its
// own, so that each seed's other draws stay as they were.
func (w *world) hostileAmount(amount, fill int64) int64 {
	if !w.hostile || w.hrng.Intn(hostileOdds) != 0 {
		return amount
	}
	switch w.hrng.Intn(10) {
	case 0:
		return 0
	case 1:
		return -1 - w.hrng.Int63n(3)
	case 2:
		return math.MinInt64
	case 3:
		return 1 << 31
	case 4:
		return 1 << 53
	case 5:
		return half - 1
	case 6:
		return half
	case 7:
		return math.MaxInt64
	case 8:
		return max(math.MaxInt64-fill, 1)
	}
	if fill == 0 {
		return math.MaxInt64
	}
	return math.MaxInt64 - fill + 1
}

// fullest is what the fullest quota counter of r on id's chain holds: used
// plus reserved, plus the shadow ledger when shadow is set.
func (m *model) fullest(id NodeID, r string, shadow bool) int64 {
	most := int64(0)
	for _, a := range m.chain(id) {
		n := m.used[a][r] + m.reserved[a][r]
		if shadow { // the sum, or MaxInt64 when it is past that
			n = min(n, math.MaxInt64-m.shadow[a][r]) + m.shadow[a][r]
		}
		most = max(most, n)
	}
	return most
}

// fullestHeld is the most slots of class any node on id's chain holds.
func (m *model) fullestHeld(id NodeID, class string) int64 {
	most := int64(0)
	for _, a := range m.chain(id) {
		most = max(most, m.held[a][class])
	}
	return most
}

// checkHostile checks the answer to a call the model says must be refused
// for its amounts (I24): refused as invalid, or for a reason decided before
// amounts are (its node ended, its tenant's state, a bound, its session
// gone), never accepted, denied or recalled: a counter past MaxInt64 is no
// quota's business. A call the model finds nothing wrong with must not be
// refused as invalid.
func (w *world) checkHostile(what string, err error, mustRefuse bool) {
	w.t.Helper()
	if !mustRefuse {
		if errors.Is(err, ErrInvalid) && !neverFitsRate(err) { // checkRateRefusal checks those
			w.fail("I24 hostile: %s was refused as invalid (%v); the model finds nothing wrong with its amounts", what, err)
		}
		return
	}
	for _, ok := range []error{ErrInvalid, ErrTaskEnded, ErrTenantState, ErrBound, ErrNotFound, ErrUnauthenticated, ErrSessionExpired} {
		if errors.Is(err, ok) {
			w.tally.hostileRefused++
			return
		}
	}
	w.fail("I24 hostile: %s answered %v; the model refuses its amounts as invalid", what, err)
}

// checkCounters is I24's state check: every counter in the engine's
// tables within [0, MaxInt64].
func (w *world) checkCounters() {
	if bad := counterErrors(w.e); len(bad) > 0 {
		w.fail("I24 counters: %s", strings.Join(bad, "; "))
	}
}

// reserveInvalid says whether the model refuses req by session sid as
// invalid: a count below zero or nothing asked, an exact reservation that
// settles, a settlement of more than the session holds, or an exact one
// that would overflow; and whether it overflows: a top-up where a counter
// can hold nothing more, which must be refused unless it reserves nothing
// (a rated resource with no slice to come).
func (w *world) reserveInvalid(sid SessionID, req ReserveRequest) (invalid, overflows bool) {
	m := w.m
	switch have := m.reservations[modelRes{sid, req.Node, req.Resource}]; {
	case req.Spent < 0 || req.Return < 0 || req.Want < 0,
		req.Spent == 0 && req.Return == 0 && req.Want == 0,
		req.Exact && (req.Spent != 0 || req.Return != 0),
		req.Spent > have || req.Return > have-req.Spent:
		return true, false
	case req.Want == 0:
		return false, false
	case req.Exact:
		return m.quotaOverflows(req.Node, req.Resource, req.Want, false), false
	}
	for _, a := range m.chain(req.Node) {
		if !m.rootSaturates(a, false, req.Resource) && m.used[a][req.Resource]+m.reserved[a][req.Resource]-req.Return >= math.MaxInt64 {
			return false, true // a top-up with no room for one unit
		}
	}
	return false, false
}

// blockInvalid says whether the model refuses req by session sid as
// invalid: a count below zero, a grow and a shrink at once, a shrink past
// the block, or a growth past MaxInt64 slots where no limit stops it first
// (none while the class is contended).
func (w *world) blockInvalid(sid SessionID, req BlockRequest, contended bool) bool {
	m := w.m
	switch {
	case req.Want < 0 || req.Return < 0 || req.Want > 0 && req.Return > 0:
		return true
	case req.Return > 0:
		for _, l := range m.leases {
			if l.block && l.session == sid && l.node == req.Node && l.class == req.Class {
				return req.Return > l.count
			}
		}
		return false // no block: not found
	case contended:
		return false
	}
	grow := req.Want
	for _, a := range m.chain(req.Node) {
		if q, ok := m.refusesAt(a, true, req.Class); ok {
			grow = min(grow, max(q-m.held[a][req.Class], 0))
		}
	}
	return grow > 0 && m.slotsOverflow(req.Node, req.Class, grow)
}

// otherAmount is an amount other than a, for a retry with other arguments
// (never one refused for itself before its request id is looked up).
func otherAmount(a int64) int64 {
	if a == math.MaxInt64 {
		return a - 1
	}
	return a + 1
}

// giveBackOp is, now and then, a session giving back a lease it holds as a
// server does for a caller that went away (Engine.GiveBack, by lease id):
// with the charges its grant made, the lease ends and they are refunded;
// with any others, it must be refused as invalid and change nothing. It
// draws from hrng, in every seed.
func (w *world) giveBackOp() {
	if w.hrng.Intn(40) != 0 || len(w.held) == 0 {
		return
	}
	ids := sortedKeys(w.held)
	id := ids[w.hrng.Intn(len(ids))]
	sid, ml := w.held[id], w.m.leases[id]
	if ml.block || ml.session != sid {
		return
	}
	charges := map[string]int64{}
	for _, c := range ml.charges {
		charges[c.Resource] = c.Amount
	}
	honest := w.hrng.Intn(2) == 0
	if !honest {
		r := resources[w.hrng.Intn(len(resources))]
		charges[r] = otherAmount(max(charges[r], 0))
		if w.hrng.Intn(2) == 0 {
			charges[r] = []int64{0, -1, math.MinInt64, half, math.MaxInt64}[w.hrng.Intn(5)]
		}
	}
	before := w.e.Seq()
	got, err := w.e.GiveBack(sid, AcquireRequest{Node: ml.node, Class: ml.class, Charges: charges}, id)
	what := fmt.Sprintf("give back s%d l%d %v (honest %v) -> l%d", sid, id, charges, honest, got)
	w.expect(what, before, err, ErrInvalid)
	// A lease its node's end took on the way has nothing to give back,
	// whatever the charges named: only a call that gave a lease back, or
	// found it live, must have refused other charges.
	_, live := w.m.leases[id]
	w.checkHostile(what, err, !honest && (got != 0 || live || err != nil))
	// An honest give-back ends the lease, unless its session or node ended
	// it on the way; any other gives back nothing.
	if (got != 0 && (live || !honest)) || (got == 0 && honest && live) {
		w.fail("%s: %v, and the model holds lease %d live: %v", what, err, id, live)
	}
	if got != 0 {
		delete(w.held, id)
	}
}

// chargeReq is a charge without a lease a session was granted.
type chargeReq struct {
	sid SessionID
	req AcquireRequest
}

// giveBackChargedOp is, now and then, a session giving back a charge it
// was granted without a lease, as a server does for a caller that went
// away or abandons the request (Engine.GiveBackCharged, by request id):
// undone whole when the model says the session remembers the request and
// its node is kept, else nothing; and with other charges, a reuse of the
// request id. It draws from hrng, in every seed.
func (w *world) giveBackChargedOp() {
	if w.hrng.Intn(30) != 0 || len(w.charges) == 0 {
		return
	}
	i := w.hrng.Intn(len(w.charges))
	c := w.charges[i]
	req := c.req
	honest := w.hrng.Intn(3) != 0
	if !honest {
		req.Charges = maps.Clone(req.Charges)
		for r, a := range req.Charges {
			req.Charges[r] = otherAmount(a)
		}
	}
	want := honest && w.m.GivesBackCharge(c.sid, req.RequestID)
	before := w.e.Seq()
	given, err := w.e.GiveBackCharged(c.sid, req)
	what := fmt.Sprintf("give back the charge of s%d %q %v (honest %v) -> %v", c.sid, req.RequestID, req.Charges, honest, given)
	w.expect(what, before, err, ErrInvalid, ErrRequestIDReused)
	if err == nil && given != want {
		w.fail("%s: the model says %v", what, want)
	}
	if given {
		w.tally.chargesGivenBack++
		w.charges = slices.Delete(w.charges, i, i+1)
	}
}
