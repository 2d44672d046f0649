package engine

import (
	"fmt"
	"math"
	"slices"
)

// The model's side of enforcement modes (policy.go): which caps are soft or
// warn_only, the usage at which each refuses, and the warnings every charge
// or grant past a cap it did not refuse must carry (I20).

type modeKey struct {
	limit bool
	name  string
}

// setModes follows an EvCapsSet: a removed cap loses its mode, and the
// edit's modes replace the old ones (the zero CapMode is hard, kept as none).
func (m *model) setModes(id NodeID, c *CapsEdit) {
	for _, side := range []struct {
		limit bool
		caps  map[string]int64
		modes map[string]CapMode
	}{{false, c.Quotas, c.QuotaModes}, {true, c.Limits, c.LimitModes}} {
		for k, v := range side.caps {
			if v == NoCap {
				delete(m.modes[id], modeKey{side.limit, k})
			}
		}
		for k, cm := range side.modes {
			if cm == (CapMode{}) {
				delete(m.modes[id], modeKey{side.limit, k})
				continue
			}
			if m.modes[id] == nil {
				m.modes[id] = map[modeKey]CapMode{}
			}
			m.modes[id][modeKey{side.limit, k}] = cm
		}
	}
}

// refusesAt is the usage at which a's cap on name refuses more, as SPEC.md
// states it: the cap (hard), cap plus burst (soft), never (warn_only).
func (m *model) refusesAt(a NodeID, limit bool, name string) (int64, bool) {
	caps := m.quotas[a]
	if limit {
		caps = m.limits[a]
	}
	v, ok := caps[name]
	if !ok {
		return 0, false
	}
	cm := m.modes[a][modeKey{limit, name}]
	switch cm.Mode {
	case ModeWarnOnly:
		return 0, false
	case ModeSoft:
		if v > math.MaxInt64-cm.Burst {
			return math.MaxInt64, true
		}
		return v + cm.Burst, true
	}
	return v, true
}

// checkWarnings checks I20 before ev is applied: ev carries exactly one
// warning for each soft or warn_only cap on its chain that it takes past
// the cap, with the usage it reaches.
func (m *model) checkWarnings(ev Event) {
	var charges []Charge
	class, slots, node := "", int64(0), ev.Node
	switch ev.Kind {
	case EvConsumed:
		charges = []Charge{{ev.Resource, ev.Amount}}
	case EvCharged:
		if ev.GivenBack {
			return // a give-back warns of nothing
		}
		charges = ev.Charges
	case EvLeaseGranted:
		charges, class, slots = ev.Charges, ev.Resource, 1
		if ev.Block {
			slots = ev.Amount
		}
	case EvBlockResized:
		l, ok := m.leases[ev.Lease]
		if !ok || ev.Amount <= 0 {
			break
		}
		class, slots, node = l.class, ev.Amount, l.node
	case EvReserved:
		if ev.Amount > 0 {
			charges = []Charge{{ev.Resource, ev.Amount - ev.Returned}}
		}
	}
	var want []string
	for _, a := range m.chain(node) {
		for _, c := range charges {
			cm := m.modes[a][modeKey{false, c.Resource}]
			if q, ok := m.quotas[a][c.Resource]; ok && cm.Mode != ModeHard && m.spent(a, c.Resource)+m.reserved[a][c.Resource]+c.Amount > q {
				want = append(want, fmt.Sprint(Warning{Node: a, Name: c.Resource, Mode: cm.Mode,
					Used: m.spent(a, c.Resource) + m.reserved[a][c.Resource] + c.Amount, Cap: q}))
			}
		}
		cm := m.modes[a][modeKey{true, class}]
		if l, ok := m.limits[a][class]; ok && slots > 0 && cm.Mode != ModeHard && m.held[a][class]+slots > l {
			want = append(want, fmt.Sprint(Warning{Node: a, Limit: true, Name: class, Mode: cm.Mode, Used: m.held[a][class] + slots, Cap: l}))
		}
	}
	var got []string
	for _, w := range ev.Warnings {
		got = append(got, fmt.Sprint(w))
	}
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(want, got) {
		m.failf("I20 warnings: event %d (%s) warns %v, the model wants %v", ev.Seq, ev.Kind, got, want)
	}
}

// The model's side of tenant states (tenantstate.go): each tenant's state,
// checked against every event that starts work (I21), and the waiters a
// change fails.

// tenantRefuses is what SPEC.md says a tenant in state st refuses: for
// suspended everything new, for read_only a write, for closing a task.
func tenantRefuses(st TenantState, write, task bool) bool {
	switch st {
	case Suspended:
		return true
	case ReadOnly:
		return write
	case Closing:
		return task
	}
	return false
}

// checkTenantState checks I21 before ev is applied: no event starts work
// its tenant's state refuses.
func (m *model) checkTenantState(ev Event) {
	node, write, task := ev.Node, ev.Write, false
	switch ev.Kind {
	case EvConsumed, EvCharged, EvLeaseGranted, EvShadowCharged:
		if ev.GivenBack {
			return // undoing a charge starts no work
		}
	case EvBlockResized:
		l, ok := m.leases[ev.Lease]
		if !ok || ev.Amount <= 0 {
			return
		}
		node = l.node
	case EvReserved:
		if ev.Amount <= 0 {
			return
		}
	case EvNodeCreated:
		node = ev.Parent
		task = m.parent[ev.Parent] == RootID
		if ev.Parent == RootID {
			return
		}
	default:
		return
	}
	t := m.tenantOf(node)
	if t == RootID {
		return
	}
	if st := m.tstate[t]; tenantRefuses(st, write, task) {
		m.failf("I21 tenant state: event %d (%s, write %v) on node %d starts work its tenant %d, %s, refuses", ev.Seq, ev.Kind, write, node, t, st)
	}
}

// applyTenantState follows an EvTenantStateSet: the new state, and with
// Revoke every lease below the tenant ended as revoked.
func (m *model) applyTenantState(ev Event) {
	if m.parent[ev.Node] != RootID {
		m.failf("event %d sets the state of node %d, which is not a tenant", ev.Seq, ev.Node)
		return
	}
	m.tstate[ev.Node] = ev.TenantState
	if !ev.Revoke {
		return
	}
	for _, id := range sortedKeys(m.leases) {
		if m.inside(m.leases[id].node, ev.Node) {
			m.endLease(id, EndRevoked, ev.At)
		}
	}
}

// decideTenantState fails the tenant's waiters its new state refuses, as
// the engine does at the change.
func (m *model) decideTenantState(ev Event) {
	m.dropWaiters(func(w *mWaiter) bool {
		return m.tenantOf(w.node) == ev.Node && tenantRefuses(ev.TenantState, w.write, false)
	})
}

// The model's side of reserved minimums and the aging guard (minimum.go),
// written from SPEC.md: a tenant below its active minimum is served before
// the round robin, the one furthest below first (ring order from the
// cursor on a tie); within a tenant, a waiter passed over by AgingGrants
// grants of its queue goes first (oldest first) when it fits.

const specAgingGrants = 16 // "passed over by at most 16 grants of its tenant's queue"

func (m *model) setMinimums(id NodeID, edit map[string]Minimum) {
	for class, mn := range edit {
		if mn.Min == 0 {
			delete(m.mins[id], class)
			continue
		}
		if m.mins[id] == nil {
			m.mins[id] = map[string]Minimum{}
		}
		m.mins[id][class] = mn
	}
}

// shortfall is how far tenant t is below its active minimum of class.
func (m *model) shortfall(t NodeID, class string) int64 {
	mn, ok := m.mins[t][class]
	if !ok || mn.Min <= 0 || (mn.From != 0 && m.now < mn.From) || (mn.Until != 0 && m.now >= mn.Until) {
		return 0
	}
	return max(mn.Min-m.held[t][class], 0)
}

// firstFit is the waiter tq serves: none when the tenant's own cap is
// full (or its count of slots at MaxInt64); else its oldest aged waiter that fits; else its first in priority
// order that fits.
func (m *model) firstFit(tq *mTenantQueue, class string) *mWaiter {
	if limit, ok := m.refusesAt(tq.tenant, true, class); ok && m.held[tq.tenant][class] >= limit || m.held[tq.tenant][class] == math.MaxInt64 {
		return nil
	}
	var oldest *mWaiter
	for _, w := range tq.waiters {
		if tq.grants-w.mark >= specAgingGrants && m.fits(w.node, class) && (oldest == nil || w.arrival < oldest.arrival) {
			oldest = w
		}
	}
	if oldest != nil {
		return oldest
	}
	for _, w := range tq.waiters {
		if m.fits(w.node, class) {
			return w
		}
	}
	return nil
}

// belowMinimum is the waiter served before the round robin, if any.
func (m *model) belowMinimum(q *mClassQueue, class string) (*mTenantQueue, *mWaiter) {
	var best *mTenantQueue
	var bestW *mWaiter
	short := int64(0)
	for i := range len(q.ring) {
		tq := q.ring[(q.cursor+i)%len(q.ring)]
		s := m.shortfall(tq.tenant, class)
		if s <= short || len(tq.waiters) == 0 {
			continue
		}
		if w := m.firstFit(tq, class); w != nil {
			best, bestW, short = tq, w, s
		}
	}
	return best, bestW
}
