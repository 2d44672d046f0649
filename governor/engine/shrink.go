package engine

// Giving back the room a burst took. A Go map keeps the room it grew to
// when its entries are deleted, and a slice re-sliced or emptied keeps its
// array, so the containers that follow the work (nodes held, tombstones,
// ended nodes waiting, a tenant's children) would keep, for good, the room
// of the busiest moment since the engine started: tens of megabytes, after
// a hundred thousand tasks that ended within a retention. Each is built
// again once it holds a quarter of the most it has held, or less; the cost
// is a copy of what is left, which the three quarters gone pay for.

// shrinkAbove is the fewest entries a container must have held to be worth
// building again.
const shrinkAbove = 4096

// highWater is the most entries a container has held since it was built.
type highWater struct{ most int }

// sparse records that n entries are held now, and reports whether the
// container should be built again; if so, n is its new most.
func (h *highWater) sparse(n int) bool {
	h.most = max(h.most, n)
	if h.most < shrinkAbove || n > h.most/4 {
		return false
	}
	h.most = n
	return true
}

// shrink builds again the engine's maps and queues that reclaims and purges
// have left sparse. Reap and Tidy call it: the most is sampled there, which
// is close enough, since a map's room follows its most only roughly too.
func (e *Engine) shrink() {
	if e.nodesMost.sparse(len(e.nodes)) {
		e.nodes = rebuilt(e.nodes)
	}
	if e.tombsMost.sparse(len(e.tombs)) {
		e.tombs = rebuilt(e.tombs)
		e.tombOrder = clipped(e.tombOrder)
	}
	e.endedQ, e.endedHead = shrunkQueue(e.endedQ, e.endedHead)
}

// rebuilt is a copy of m with no more room than its entries need (unlike
// maps.Clone, which keeps m's).
func rebuilt[K comparable, V any](m map[K]V) map[K]V {
	out := make(map[K]V, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// clipped is a copy of s in an array of its own length.
func clipped[T any](s []T) []T {
	return append(make([]T, 0, len(s)), s...)
}

// shrunkQueue drops the taken head of a queue (q[head:] is what is left),
// into an array of its own once the queue's array is mostly empty.
func shrunkQueue[T any](q []T, head int) ([]T, int) {
	if cap(q) < shrinkAbove || len(q)-head > cap(q)/4 {
		return q, head
	}
	return clipped(q[head:]), 0
}

// shrinkChildren gives n's children an array of their own length once
// removals have left its array mostly empty: a tenant's children are its
// tasks, ended ones included, until they are reclaimed.
func (n *node) shrinkChildren() {
	if cap(n.children) >= shrinkAbove && len(n.children) <= cap(n.children)/4 {
		n.children = clipped(n.children)
	}
}
