package engine

import (
	"errors"
	"math"
)

// Consume charges amount of resource to node and every ancestor, or, when any
// cap on the chain would be exceeded, to none of them and returns a *Denial.
// A retry with the same requestID returns the original result and charges
// nothing.
func (e *Engine) Consume(sid SessionID, id NodeID, resource string, amount int64, requestID string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.tick()
	s, err := e.session(sid, now)
	if err != nil {
		return err
	}
	if err := validName("resource", resource); err != nil {
		return err
	}
	if amount <= 0 {
		return invalid("amount %d is not positive", amount)
	}
	fp := uint64(0)
	if requestID != "" {
		fp = fingerprint(opConsume, id, resource, amount)
		if _, ok, err := s.requests.lookup(requestID, fp); ok || err != nil {
			return err
		}
	}
	n, err := e.target(s, id)
	if err != nil {
		return err
	}
	if err := e.checkOpen(n, now); err != nil {
		return err
	}
	if err := n.admits(false, false); err != nil {
		return err
	}
	if err := e.checkResource(n.tenant, resource); err != nil {
		return err
	}
	if err := n.check(resource, amount); err != nil {
		return e.refused(s, err)
	}
	if err := n.checkRateAhead(resource, amount, now, e.aheadOf()); err != nil {
		return err
	}
	e.emit(Event{Kind: EvConsumed, At: now, Session: s.id, Node: n.id, Resource: resource, Amount: amount,
		RequestID: requestID, Fingerprint: fp, Warnings: n.warnings([]Charge{{resource, amount}}, "", 0)})
	return nil
}

// check returns nil if amount more of r fits on n's chain, counting
// unspent reservations. When it does not, it returns ErrInvalid if a
// counter on the chain (used plus reserved) would pass MaxInt64, else the
// *Denial of the first node (from n up) whose spent usage leaves no room,
// or, when only unspent reservations are in the way, a *recallNeeded
// naming the highest node they block (Engine.recalled turns that into
// ErrRecalling).
func (n *node) check(r string, amount int64) error {
	return n.checkAs(r, amount, false)
}

// checkAs is check, counting each node's shadow ledger as spent when
// shadow is set: how a shadow rule's request would have been decided had
// the shadow requests before it been enforced (dryrun.go). A denial's Used
// then includes the ledger.
//
// An amount no counter could hold is refused as invalid wherever it would
// overflow, even above a node that denies it: a hostile amount gets the
// same answer whatever the caps say.
func (n *node) checkAs(r string, amount int64, shadow bool) error {
	var denied, blocked *node
	var deniedLimit int64
	for a := n; a != nil; a = a.parent {
		g := a.quota[r]
		want, err := a.counted(g, r, amount, shadow)
		if err != nil {
			return err
		}
		if g == nil || denied != nil || !g.full(want, a.saturates(g)) {
			continue
		}
		if eff, _ := g.enforced(); want > eff-g.spent() { // full, so enforced
			denied, deniedLimit = a, eff
			continue
		}
		blocked = a
	}
	if denied != nil {
		d := denied.denial(r, amount, deniedLimit)
		if shadow { // the ledger counts as spent (the root's may pass MaxInt64 with it)
			d.Used = clampedAdd(d.Used, denied.shadow[r], math.MaxInt64)
		}
		return d
	}
	if blocked != nil {
		return &recallNeeded{node: blocked, resource: r}
	}
	return nil
}

// checkAll checks several charges against n's chain, as if made together.
func (n *node) checkAll(charges []Charge) error {
	return n.checkAllAs(charges, false)
}

// checkAllAs is checkAll as checkAs decides each charge. A charge that
// would overflow a counter is refused as invalid even when an earlier one
// is denied or recalled.
func (n *node) checkAllAs(charges []Charge, shadow bool) error {
	for i, c := range charges {
		err := n.checkAs(c.Resource, c.Amount, shadow)
		if err == nil {
			continue
		}
		for _, later := range charges[i+1:] {
			if err := n.overflows(later.Resource, later.Amount, shadow); err != nil {
				return err
			}
		}
		return err
	}
	return nil
}

// overflows is checkAs's test for an amount no counter could hold alone.
func (n *node) overflows(r string, amount int64, shadow bool) error {
	for a := n; a != nil; a = a.parent {
		if _, err := a.counted(a.quota[r], r, amount, shadow); err != nil {
			return err
		}
	}
	return nil
}

// counted is what amount of r counts for on n, whose gauge of r is g (nil
// for none): amount, plus n's shadow ledger when shadow is set. It is
// ErrInvalid when that, or used and reserved with it, would pass MaxInt64,
// except on the root, whose counters saturate (gauge.shift).
func (n *node) counted(g *gauge, r string, amount int64, shadow bool) (int64, error) {
	want := amount
	if shadow {
		ledger := n.shadow[r]
		if ledger > math.MaxInt64-amount && !n.saturates(g) {
			return 0, invalid("%s on %q would overflow its shadow ledger", r, n.name)
		}
		want = clampedAdd(ledger, amount, math.MaxInt64)
	}
	// Used plus reserved never passes MaxInt64, so neither side wraps.
	if g != nil && !n.saturates(g) && want > math.MaxInt64-g.n-g.r {
		return 0, invalid("%s on %q would overflow", r, n.name)
	}
	return want, nil
}

// refused is what session s is told of a charge that does not fit: a
// *Denial as s may see it (seenBy), or ErrRecalling (recalled).
func (e *Engine) refused(s *session, err error) error {
	var d *Denial
	if errors.As(err, &d) {
		d.seenBy(e, s.scope)
		return err
	}
	return e.recalled(err)
}

// seenBy hides, from a session scoped to scope, the largest consumer of a
// denial on a node above scope (shared with other tenants) unless that
// consumer lies inside scope. The cap's own used and limit stay: they are
// the shared pool's, and without them the denial cannot be understood.
func (d *Denial) seenBy(e *Engine, scope *node) {
	if n := e.nodes[d.Node]; n == nil || n.within(scope) || d.Largest == (Consumer{}) {
		return
	}
	if c := e.nodes[d.Largest.Node]; d.Largest.Node != 0 && c != nil && c.within(scope) {
		return
	}
	d.Largest = Consumer{Name: OtherTenant}
}

func (n *node) denial(r string, amount, limit int64) *Denial {
	return n.denialWith(r, amount, limit, nil, 0)
}

// denialWith is denial with extra units of r counted as if already charged
// at node at (n or below it).
func (n *node) denialWith(r string, amount, limit int64, at *node, extra int64) *Denial {
	d := &Denial{Resource: r, Node: n.id, NodeName: n.name, Used: n.quota.count(r) + extra, Limit: limit, Amount: amount}
	// What n was charged directly is its usage less its children's.
	direct := d.Used
	if g := n.quota[r]; g != nil && g.per != nil { // the window's spend, and when it resets
		d.Used -= g.base
		if !g.per.period.IsZero() {
			d.ResetAt = g.per.win.End
		}
	}
	for _, c := range n.children {
		u := c.quota.count(r)
		if at != nil && at != n && at.within(c) {
			u += extra
		}
		direct -= u
		if u > d.Largest.Used || (d.Largest.Node == 0 && u > 0) {
			d.Largest = Consumer{Node: c.id, Name: c.name, Used: u}
		}
	}
	// Children already reclaimed spent their share too; it is neither
	// n's own nor a live child's.
	gone := n.gone[r]
	if direct -= gone; gone > d.Largest.Used {
		d.Largest = Consumer{Name: ReclaimedConsumer, Used: gone}
	}
	if direct > d.Largest.Used {
		d.Largest = Consumer{Node: n.id, Name: n.name, Used: direct}
	}
	return d
}

// normalizeCharges validates charges and merges them into one sorted list,
// so the same charges always make the same event and fingerprint.
func normalizeCharges(in map[string]int64) ([]Charge, error) {
	if len(in) == 0 {
		return nil, nil
	}
	out := make([]Charge, 0, len(in))
	for r, a := range in {
		if err := validName("resource", r); err != nil {
			return nil, err
		}
		if a <= 0 {
			return nil, invalid("charge of %q is %d; it must be positive", r, a)
		}
		out = append(out, Charge{Resource: r, Amount: a})
	}
	sortCharges(out)
	return out, nil
}

func sortCharges(cs []Charge) {
	for i := 1; i < len(cs); i++ {
		for j := i; j > 0 && cs[j].Resource < cs[j-1].Resource; j-- {
			cs[j], cs[j-1] = cs[j-1], cs[j]
		}
	}
}
