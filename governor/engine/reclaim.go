package engine

import (
	"cmp"
	"container/heap"
	"fmt"
	"math"
	"slices"
	"time"
)

// Reclaiming ended nodes. An ended node stays in the tree for the retention
// after its end, answering as ended: a call on it is ErrTaskEnded, Get shows
// its final state and usage, a retry of the request that created, edited
// or ended it returns its original answer, and a tombstone of a lease on it
// still says how the lease ended. Then Reap reclaims it with its whole
// subtree (which ended with it or before it), in an EvNodesReclaimed event,
// so that replay removes exactly the same nodes; from then on its id is
// ErrNotFound, and a retry naming it too. Ids are never reused.
//
// A node is kept past its retention while something still names it by id
// and must not outlive it (a pin): an open session scoped to it, or a
// session's reservation on it, which its holder settles when told the node
// ended. What the reclaimed subtree spent stays in its ancestors' usage;
// the parent keeps it apart as Reclaimed, so that a denial's largest
// consumer is still told right.

// ReclaimedConsumer names, as a denial's largest consumer (with node 0), the
// children of a node that ended and were reclaimed, together.
const ReclaimedConsumer = "(ended children, reclaimed)"

// endedEntry is an ended node waiting for its retention to pass.
type endedEntry struct {
	at   int64
	node NodeID
}

const (
	// maxReclaimPerReap bounds the subtrees one Reap reclaims, so that a
	// backlog (after a restart, or a burst of ends) goes in short holds of
	// the lock.
	maxReclaimPerReap = 4096
	// maxReclaimPerEvent bounds the subtrees one event lists.
	maxReclaimPerEvent = 512
)

// Retention is how long an ended node is kept before it is reclaimed.
func (e *Engine) Retention() time.Duration { return e.retention }

// reclaim reclaims the ended nodes whose retention has passed by now and
// that nothing pins, oldest first.
func (e *Engine) reclaim(now int64) {
	cutoff := now - int64(e.retention)
	var roots []NodeID
	var chosen map[NodeID]bool
	consider := func(ent endedEntry) {
		n := e.nodes[ent.node]
		if n == nil || n.state == Open || n.parent == nil {
			return // reclaimed with an ancestor already; the root stays
		}
		if n.pinnedBelow() {
			e.pinnedQ = append(e.pinnedQ, ent)
			return
		}
		for a := n.parent; a != nil; a = a.parent {
			if chosen[a.id] {
				return // goes with its ancestor, listed before it
			}
		}
		if chosen == nil {
			chosen = map[NodeID]bool{}
		}
		chosen[n.id] = true
		roots = append(roots, n.id)
	}
	// Pinned ones first: what pinned them may have gone.
	pinned := e.pinnedQ
	e.pinnedQ = nil
	for i, ent := range pinned {
		if len(roots) == maxReclaimPerReap {
			e.pinnedQ = append(e.pinnedQ, pinned[i:]...)
			break
		}
		consider(ent)
	}
	for e.endedHead < len(e.endedQ) && len(roots) < maxReclaimPerReap {
		ent := e.endedQ[e.endedHead]
		if ent.at > cutoff {
			break
		}
		e.endedHead++
		consider(ent)
	}
	if e.endedHead > 1024 && e.endedHead > len(e.endedQ)/2 {
		n := copy(e.endedQ, e.endedQ[e.endedHead:])
		clear(e.endedQ[n:])
		e.endedQ, e.endedHead = e.endedQ[:n], 0
	}
	for len(roots) > 0 {
		k := min(len(roots), maxReclaimPerEvent)
		e.emit(Event{Kind: EvNodesReclaimed, At: now, Nodes: roots[:k:k]})
		roots = roots[k:]
	}
}

// pinnedBelow reports whether anything pins n or a node below it.
func (n *node) pinnedBelow() bool {
	if n.pins > 0 {
		return true
	}
	for _, c := range n.children {
		if c.pinnedBelow() {
			return true
		}
	}
	return false
}

// pinSession counts a session scoped to n: a pin on n, and one of its
// tenant's sessions (the root's are not counted).
func (n *node) pinSession() {
	n.pins++
	if n.tenant.parent != nil {
		n.tenant.sessions++
	}
}

func (n *node) unpinSession() {
	n.pins--
	if n.tenant.parent != nil {
		n.tenant.sessions--
	}
}

func (e *Engine) applyReclaimed(ev *Event) error {
	if len(ev.Nodes) == 0 {
		return fmt.Errorf("%w: a reclamation of no nodes", ErrCorrupt)
	}
	listed := make(map[NodeID]bool, len(ev.Nodes))
	for _, id := range ev.Nodes {
		n := e.nodes[id]
		if n == nil || n.parent == nil || n.state == Open || n.pinnedBelow() || listed[id] {
			return fmt.Errorf("%w: node %d cannot be reclaimed", ErrCorrupt, id)
		}
		for a := n.parent; a != nil; a = a.parent {
			if listed[a.id] {
				return fmt.Errorf("%w: node %d is reclaimed after its ancestor %d", ErrCorrupt, id, a.id)
			}
		}
		listed[id] = true
	}
	var parents []*node
	gone := make(map[*node][]*node) // by parent
	for _, id := range ev.Nodes {
		n := e.nodes[id]
		p := n.parent
		for r, g := range n.quota {
			if g.n != 0 {
				if p.gone == nil {
					p.gone = make(map[string]int64)
				}
				p.gone[r] = clampedAdd(p.gone[r], g.n, math.MaxInt64) // exact but on the root (node.saturates)
			}
		}
		e.forget(n)
		if _, ok := gone[p]; !ok {
			parents = append(parents, p)
		}
		gone[p] = append(gone[p], n)
	}
	for _, p := range parents {
		p.removeChildren(gone[p])
	}
	return nil
}

// removeChildren removes gone, some of n's children, from n.children. A
// tenant may hold tens of thousands of ended tasks for a retention, and
// the reaper reclaims a few of them at a time under the engine's lock, so
// each is found by binary search (children are in id order: they are
// appended as they are created) and only the slice's pointers are moved,
// rather than every child being looked at.
func (n *node) removeChildren(gone []*node) {
	at := make([]int, 0, len(gone))
	for _, c := range gone {
		i, ok := slices.BinarySearchFunc(n.children, c.id, func(x *node, id NodeID) int { return cmp.Compare(x.id, id) })
		if !ok || n.children[i] != c {
			// Not in id order after all: look at every child.
			n.children = slices.DeleteFunc(n.children, func(x *node) bool { return slices.Contains(gone, x) })
			n.shrinkChildren()
			return
		}
		at = append(at, i)
	}
	slices.Sort(at)
	w := at[0]
	for k, i := range at {
		end := len(n.children)
		if k+1 < len(at) {
			end = at[k+1]
		}
		w += copy(n.children[w:], n.children[i+1:end])
	}
	clear(n.children[w:])
	n.children = n.children[:w]
	n.shrinkChildren()
}

// forget removes n and its subtree from the engine.
func (e *Engine) forget(n *node) {
	for _, c := range n.children {
		e.forget(c)
	}
	delete(e.nodes, n.id)
	delete(e.overridden, n.id)
	if n.tenant == n {
		e.dropTenantQueues(n)
	}
}

// dropTenantQueues removes a reclaimed tenant's (empty) queues.
func (e *Engine) dropTenantQueues(t *node) {
	e.eachQueue(func(q *classQueue) {
		tq := q.byNode[t]
		if tq == nil {
			return
		}
		delete(q.byNode, t)
		i := slices.Index(q.ring, tq)
		q.ring = slices.Delete(q.ring, i, i+1)
		// The turn stays with whoever had it; the reclaimed tenant's own
		// passes on to the next in the ring.
		if q.cursor > i {
			q.cursor--
		}
		if q.cursor >= len(q.ring) {
			q.cursor = 0
		}
	})
}

// notFound is the error for a node id the engine does not hold.
func (e *Engine) notFound(id NodeID) error {
	return fmt.Errorf("%w: node %d: no such node, or it ended more than %v ago and was reclaimed", ErrNotFound, id, e.retention)
}

// compactDeadlines drops the stale entries of the deadline heap (nodes
// ended or reclaimed, deadlines moved) once they outnumber the nodes, so
// that tasks ending long before their deadlines do not pile up in it.
func (e *Engine) compactDeadlines() {
	if len(e.deadlines) <= 2*len(e.nodes)+64 {
		return
	}
	kept := e.deadlines[:0]
	for _, d := range e.deadlines {
		if n := e.nodes[d.node]; n != nil && n.state == Open && n.deadline == d.at {
			kept = append(kept, d)
		}
	}
	clear(e.deadlines[len(kept):])
	e.deadlines = kept
	heap.Init(&e.deadlines)
}

// restoreEnded rebuilds what reclamation keeps of a restored tree: the
// queue of ended nodes (the top of each ended subtree, by end time), and
// the counts bounds read. A node of a snapshot written before ends were
// timed counts as ended now.
func (e *Engine) restoreEnded(nodes map[NodeID]*node, now int64) {
	var q []endedEntry
	for _, n := range nodes {
		if n.state == Open {
			if n.depth >= int(KindTask) {
				n.tenant.openBelow++
			}
			continue
		}
		if n.endedAt == 0 {
			n.endedAt = now
		}
	}
	for _, n := range nodes {
		if n.state != Open && n.parent != nil && (n.parent.state == Open || n.parent.endedAt > n.endedAt) {
			q = append(q, endedEntry{at: n.endedAt, node: n.id})
		}
	}
	slices.SortFunc(q, func(a, b endedEntry) int { return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.node, b.node)) })
	e.endedQ, e.endedHead, e.pinnedQ = q, 0, nil
}

// Tidy drops what only serves to act on time, and decides nothing: lease
// tombstones past their TTL, stale deadline entries, and ended nodes
// waiting for reclamation that were reclaimed already. An engine that only
// mirrors another's events, to take snapshots off the live engine's lock,
// calls it now and then instead of Reap, whose decisions (and events) are
// the live engine's alone.
func (e *Engine) Tidy() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.purgeTombstones(e.now())
	e.compactDeadlines()
	kept := e.endedQ[:0]
	for _, ent := range e.endedQ[e.endedHead:] {
		if e.nodes[ent.node] != nil {
			kept = append(kept, ent)
		}
	}
	clear(e.endedQ[len(kept):])
	e.endedQ, e.endedHead = kept, 0
	e.shrink()
}
