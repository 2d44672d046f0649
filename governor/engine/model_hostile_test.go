package engine

import (
	"cmp"
	"maps"
	"math"
	"math/big"
	"slices"
)

// The model's side of hostile amounts (I24): no event takes usage past a
// cap that refuses it, every counter stays in [0, MaxInt64] (model.count
// checks each change), and the amounts a call must be refused for, which
// the driver checks its answers against.

// usageKey names what counts against one cap: a quota's used plus
// reserved, or a limit's slots held.
type usageKey struct {
	node NodeID
	modeKey
}

// chainUsage is what counts against each cap, or would against one, on
// the chain of the node ev names (a new node's parent's).
func (m *model) chainUsage(ev Event) map[usageKey]int64 {
	id := ev.Node
	if ev.Kind == EvNodeCreated {
		id = ev.Parent
	}
	if id == 0 {
		return nil
	}
	out := map[usageKey]int64{}
	for _, a := range m.chain(id) {
		for r := range m.used[a] {
			out[usageKey{a, modeKey{false, r}}] = m.spent(a, r) // what counts against a cap
		}
		for r, v := range m.reserved[a] {
			k := usageKey{a, modeKey{false, r}}
			if u := out[k]; u > math.MaxInt64-v {
				m.failf("I24 counters: node %d has %d used and %d reserved of %s, past MaxInt64 together", a, u, v, r)
			}
			out[k] += v
		}
		for c, h := range m.held[a] {
			out[usageKey{a, modeKey{true, c}}] = h
		}
	}
	return out
}

// checkCapsPassed is I24's transition check of ev, applied, given what
// counted against the caps on its chain before: no cap that refuses (a
// hard cap, or a soft one past its burst) ends up with more counted
// against it than where it refuses, unless it already had as much. A cap
// lowered below its usage by an edit is not passed: the usage did not grow.
func (m *model) checkCapsPassed(ev Event, before map[usageKey]int64) {
	after := m.chainUsage(ev)
	keys := make([]usageKey, 0, len(after))
	for k := range after {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b usageKey) int {
		return cmp.Or(cmp.Compare(a.node, b.node), cmp.Compare(a.name, b.name), cmp.Compare(b2i(a.limit), b2i(b.limit)))
	})
	for _, k := range keys {
		q, refuses := m.refusesAt(k.node, k.limit, k.name)
		if now := after[k]; refuses && now > q && now > before[k] {
			m.failf("I24 caps: event %d (%s) takes %s of %s on node %d from %d to %d, past where its cap refuses (%d)",
				ev.Seq, ev.Kind, map[bool]string{false: "used and reserved", true: "slots held"}[k.limit], k.name, k.node,
				before[k], now, q)
		}
	}
}

// quotaOverflows reports whether amount more of r on id would take a
// counter on its chain past MaxInt64 (I24): used plus reserved, plus the
// shadow ledger when shadow is set, or the ledger itself. The root's
// counters saturate where it enforces no cap of r, and refuse nothing.
func (m *model) quotaOverflows(id NodeID, r string, amount int64, shadow bool) bool {
	for _, a := range m.chain(id) {
		if m.rootSaturates(a, false, r) {
			continue
		}
		want := amount
		if shadow {
			if m.shadow[a][r] > math.MaxInt64-amount {
				return true
			}
			want += m.shadow[a][r]
		}
		if want > math.MaxInt64-m.used[a][r]-m.reserved[a][r] {
			return true
		}
	}
	return false
}

// chargesInvalid reports whether charges (as a request carries them, before
// the engine normalizes them) must be refused as invalid on id: an amount
// not positive, or one that would overflow.
func (m *model) chargesInvalid(id NodeID, charges map[string]int64, shadow bool) bool {
	for r, a := range charges {
		if a <= 0 || m.quotaOverflows(id, r, a, shadow) {
			return true
		}
	}
	return false
}

// unlessClamped is what a recount of counts on id should find: the
// recount, except for the root's counts that were ever held to their range,
// which are then only bounded by it (and checked against the model's own
// arithmetic instead).
func (m *model) unlessClamped(id NodeID, what string, engine, recount map[string]int64) map[string]int64 {
	if id != RootID {
		return recount
	}
	out := maps.Clone(recount)
	for k, rc := range recount {
		// A count clamped to 0 is no key in the engine's map at all.
		if v := engine[k]; m.rootClamped[what+"/"+k] && v <= rc {
			out[k] = v
			if v == 0 {
				delete(out, k)
			}
		}
	}
	return out
}

// upToMax is a+b, for a and b not negative, or MaxInt64 when that is
// more: what the root's counters and its shadow ledger count together.
func upToMax(a, b int64) int64 {
	sum := new(big.Int).Add(big.NewInt(a), big.NewInt(b))
	if !sum.IsInt64() {
		return math.MaxInt64
	}
	return sum.Int64()
}

// rootSaturates reports whether a's count of name saturates rather than
// refusing an amount it cannot hold: the root's, unless a cap enforced on
// it counts from a period's base (what earlier windows spent).
func (m *model) rootSaturates(a NodeID, limit bool, name string) bool {
	if a != RootID {
		return false
	}
	_, enforced := m.refusesAt(a, limit, name)
	return !enforced || limit || m.used[a][name] == m.spent(a, name)
}

// slotsOverflow reports whether n more slots of class on id would take a
// count of slots held on its chain past MaxInt64.
func (m *model) slotsOverflow(id NodeID, class string, n int64) bool {
	for _, a := range m.chain(id) {
		if m.rootSaturates(a, true, class) {
			continue
		}
		if n > math.MaxInt64-m.held[a][class] {
			return true
		}
	}
	return false
}
