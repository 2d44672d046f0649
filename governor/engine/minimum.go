package engine

// This file holds reserved minimums: a tenant's guaranteed share of a pool
// class (min: 4 of db), optionally within a time window. A minimum sets
// nothing aside: idle reserved capacity is lent to anyone, and it comes
// back by the fair queue serving a tenant below its minimum before any
// tenant at or above its own (never by revoking). Above the minimums the
// queue is weighted deficit round robin as before. The aging guard keeps a
// tenant's low-priority waiter from starving under strict priority.

// AgingGrants bounds how many grants of its tenant's queue a waiter can
// be passed over by: from then on it is served first among its tenant's
// waiters (oldest first) whenever it fits.
const AgingGrants = 16

// Minimum is a tenant's reserved minimum of a lease class, active from
// From until Until (unix nanoseconds; 0 is unbounded). Min 0 removes it.
type Minimum struct {
	Min   int64 `json:"min"`
	From  int64 `json:"from,omitempty"`
	Until int64 `json:"until,omitempty"`
}

// active reports whether the minimum applies at now.
func (m Minimum) active(now int64) bool {
	return m.Min > 0 && (m.From == 0 || now >= m.From) && (m.Until == 0 || now < m.Until)
}

func (m Minimum) validate(class string) error {
	switch {
	case m.Min < 0:
		return invalid("minimum of %s is %d; it must be >= 0", class, m.Min)
	case m.From < 0 || m.Until < 0:
		return invalid("the window of the minimum of %s is negative", class)
	case m.Until != 0 && m.Until <= m.From:
		return invalid("the minimum of %s ends (%d) before it starts (%d)", class, m.Until, m.From)
	}
	return nil
}

// checkMinimums refuses an edit of n that would take the minimums of a
// class, summed over the open tenants, above the root's limit of it: a
// tenant's larger minimum, or a lower root limit. (An adaptive limit may
// fall below the sum; then the minimums are served first as far as the
// pool goes, and only edits that add to the excess are refused.)
func (e *Engine) checkMinimums(n *node, edit *CapsEdit) error {
	if edit.Minimums != nil && n.depth != int(KindTenant) {
		return invalid("only a tenant has minimums; node %d is a %s", n.id, n.kind())
	}
	for class, m := range edit.Minimums {
		if err := validName("lease class", class); err != nil {
			return err
		}
		if err := m.validate(class); err != nil {
			return err
		}
	}
	var classes []string
	for class, m := range edit.Minimums {
		if m.Min > n.mins[class].Min {
			classes = append(classes, class)
		}
	}
	if n == e.root {
		for class, v := range edit.Limits {
			if cur, ok := e.root.limit.capOf(class); v != NoCap && (!ok || v < cur) {
				classes = append(classes, class)
			}
		}
	}
	for _, class := range classes {
		limit, capped := e.root.limit.capOf(class)
		if n == e.root {
			if v, ok := edit.Limits[class]; ok {
				limit, capped = v, v != NoCap
			}
		}
		if !capped {
			continue
		}
		sum := int64(0)
		for _, t := range e.root.open {
			m := t.mins[class]
			if t == n {
				if em, ok := edit.Minimums[class]; ok {
					m = em
				}
			}
			// sum is within limit so far, so limit-sum cannot wrap, and
			// a sum past MaxInt64 is refused rather than wrapped.
			if m.Min > limit-sum {
				return invalid("the minimums of %s sum to more than the pool's limit of %d", class, limit)
			}
			sum += m.Min
		}
	}
	return nil
}

// applyMinimums sets a tenant's minimums from an edit.
func (n *node) applyMinimums(edit map[string]Minimum) {
	for class, m := range edit {
		if m.Min == 0 {
			delete(n.mins, class)
			continue
		}
		if n.mins == nil {
			n.mins = make(map[string]Minimum)
		}
		n.mins[class] = m
	}
	if len(n.mins) == 0 {
		n.mins = nil // as a snapshot gives it back
	}
}

// shortfall is how far t is below its active minimum of class at now.
func (t *node) shortfall(class string, now int64) int64 {
	m, ok := t.mins[class]
	if !ok || !m.active(now) {
		return 0
	}
	return max(m.Min-t.limit.count(class), 0)
}

// belowMinimum is the waiter to grant before the round robin: the first
// that fits of the tenant furthest below its active minimum of class (the
// first in ring order from the cursor on a tie), or nil when no tenant
// below its minimum has a waiter that fits.
func (q *classQueue) belowMinimum(class string, now int64) (*tenantQueue, *waiter) {
	var best *tenantQueue
	var bestW *waiter
	short := int64(0)
	for i := range len(q.ring) {
		tq := q.ring[(q.cursor+i)%len(q.ring)]
		s := tq.tenant.shortfall(class, now)
		if s <= short || len(tq.waiters) == 0 {
			continue
		}
		if w := tq.firstFit(class); w != nil {
			best, bestW, short = tq, w, s
		}
	}
	return best, bestW
}

// aged is the tenant's oldest waiter that has been passed over by
// AgingGrants grants of its queue and fits now, or nil.
func (tq *tenantQueue) aged(class string) *waiter {
	var oldest *waiter
	for _, w := range tq.waiters {
		if tq.grants-w.mark >= AgingGrants && (oldest == nil || w.arrival < oldest.arrival) && w.node.fits(class) {
			oldest = w
		}
	}
	return oldest
}
