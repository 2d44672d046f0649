package engine

import (
	"cmp"
	"slices"
	"time"
)

// This file answers what an operator asks of a subtree (governor top's
// detail panel, governor doctor): its live leases with their holders and
// ages, its queued acquires and how long they have waited, and the
// sessions scoped inside it with when they last heartbeated. None of it is
// state that changes: it reads under the lock and emits nothing.

// LeaseInfo is a live lease or block.
type LeaseInfo struct {
	ID      LeaseID
	Node    NodeID
	Class   string
	Session SessionID
	Granted int64 // unix nanoseconds
	Count   int64 // slots: 1 for a lease
	Block   bool
}

// WaiterInfo is a queued acquire.
type WaiterInfo struct {
	Node     NodeID
	Class    string
	Session  SessionID
	Since    int64 // when it queued, unix nanoseconds; 0 if not known
	Priority int64
	// Rate is the resource whose rate it waits for (ratewait.go), "" for
	// an acquire waiting for a slot of Class.
	Rate string
}

// SessionInfo is an open session and its heartbeats.
type SessionInfo struct {
	ID    SessionID
	Scope NodeID
	TTL   time.Duration
	// Expires is when it ends unless it heartbeats: its last heartbeat
	// (or a restart) was at Expires - TTL.
	Expires int64
	Leases  int
}

// Inspection is what Inspect finds in a subtree, each list oldest first and
// cut at the limit asked for.
type Inspection struct {
	Now      int64
	Leases   []LeaseInfo
	Waiters  []WaiterInfo
	Sessions []SessionInfo
	// Counts before the lists were cut.
	LeaseCount, WaiterCount, SessionCount int
}

// DefaultInspectLimit is how many of each list Inspect returns unless told.
const DefaultInspectLimit = 1000

// Inspect lists the live leases on id's subtree, its queued acquires and
// the sessions scoped inside it, as far as the session may see them.
func (e *Engine) Inspect(sid SessionID, id NodeID, limit int) (Inspection, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.tick()
	n, err := e.sessionTarget(sid, id, now)
	if err != nil {
		return Inspection{}, err
	}
	if limit <= 0 {
		limit = DefaultInspectLimit
	}
	out := Inspection{Now: now}
	for _, l := range e.leases {
		if l.node.within(n) {
			out.Leases = append(out.Leases, LeaseInfo{ID: l.id, Node: l.node.id, Class: l.class, Session: l.session.id,
				Granted: l.granted, Count: l.count, Block: l.block})
		}
	}
	e.eachQueue(func(q *classQueue) { // rate waiters too (ratewait.go)
		for _, tq := range q.byNode {
			for _, w := range tq.waiters {
				if !w.done && w.node.within(n) {
					out.Waiters = append(out.Waiters, WaiterInfo{Node: w.node.id, Class: w.class, Session: w.session.id,
						Since: w.since, Priority: w.priority, Rate: w.rate})
				}
			}
		}
	})
	for _, ss := range e.sessions {
		if ss.scope.within(n) && !ss.expired(now) {
			out.Sessions = append(out.Sessions, SessionInfo{ID: ss.id, Scope: ss.scope.id, TTL: ss.ttl,
				Expires: ss.expires, Leases: len(ss.leases)})
		}
	}
	slices.SortFunc(out.Leases, func(a, b LeaseInfo) int { return cmp.Or(cmp.Compare(a.Granted, b.Granted), cmp.Compare(a.ID, b.ID)) })
	slices.SortFunc(out.Waiters, func(a, b WaiterInfo) int {
		return cmp.Or(cmp.Compare(a.Since, b.Since), cmp.Compare(a.Session, b.Session), cmp.Compare(a.Node, b.Node))
	})
	// Sessions by their last heartbeat, the stalest first.
	slices.SortFunc(out.Sessions, func(a, b SessionInfo) int {
		return cmp.Or(cmp.Compare(a.Expires-int64(a.TTL), b.Expires-int64(b.TTL)), cmp.Compare(a.ID, b.ID))
	})
	out.LeaseCount, out.WaiterCount, out.SessionCount = len(out.Leases), len(out.Waiters), len(out.Sessions)
	out.Leases = out.Leases[:min(limit, len(out.Leases))]
	out.Waiters = out.Waiters[:min(limit, len(out.Waiters))]
	out.Sessions = out.Sessions[:min(limit, len(out.Sessions))]
	return out, nil
}

// DefaultSubtreeLimit is how many nodes Subtree lists unless told.
const DefaultSubtreeLimit = 20000

// Subtree lists the open nodes of id's subtree, id first and then depth
// first (children by id), at most limit of them (more says there were
// more), with how many acquires queue on each node that has any.
func (e *Engine) Subtree(sid SessionID, id NodeID, limit int) (nodes []NodeView, waiting map[NodeID]int, more bool, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	top, err := e.sessionTarget(sid, id, e.tick())
	if err != nil {
		return nil, nil, false, err
	}
	if limit <= 0 {
		limit = DefaultSubtreeLimit
	}
	stack := []*node{top}
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if len(nodes) == limit {
			more = true
			break
		}
		nodes = append(nodes, n.view())
		// Children are kept in creation order, which is id order: push them
		// backwards so the first comes out first.
		for i := len(n.children) - 1; i >= 0; i-- {
			if c := n.children[i]; c.state == Open {
				stack = append(stack, c)
			}
		}
	}
	waiting = make(map[NodeID]int)
	e.eachQueue(func(q *classQueue) {
		for _, tq := range q.byNode {
			for _, w := range tq.waiters {
				if !w.done && w.node.within(top) {
					waiting[w.node.id]++
				}
			}
		}
	})
	return nodes, waiting, more, nil
}
