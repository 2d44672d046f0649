package engine

import (
	"fmt"
	"slices"
)

// The randomized driver's aging episodes (minimum.go's aging guard, I22):
// a low-priority waiter passed over by more than AgingGrants grants of its
// tenant's queue. The driver only sets the scene; the model's fair queue
// decides every grant, the aged one included, and I6's check holds the
// engine to it.

// agingOp is, now and then, an aging episode: under an active tenant, a
// node (ag) with a limit of one slot and a child (hi) of a higher priority;
// a fresh operator's session takes ag's slot, queues one acquire on ag,
// then over and over queues one on hi and gives the slot back, so that
// each grant of the tenant's queue passes the acquire on ag over until it
// has aged. It draws from aging, a stream of its own.
func (w *world) agingOp() {
	if w.aging.Intn(150) != 0 {
		return
	}
	var active []NodeID
	for _, t := range w.tenants {
		if st, kept := w.m.state[t]; kept && st == Open && w.m.tstate[t] == Active {
			active = append(active, t)
		}
	}
	if len(active) == 0 {
		return
	}
	t := active[w.aging.Intn(len(active))]
	class := []string{"db", "http"}[w.aging.Intn(2)] // not adaptive: releases report nothing
	w.openSessionDrawing(RootID, w.aging)
	sid := w.sessions[len(w.sessions)-1]
	if w.scope[sid] != RootID {
		return
	}
	k := w.aging.Intn(1000)
	ag, ok := w.agingNode(sid, t, NodeSpec{Name: fmt.Sprintf("ag%d", k), Limits: map[string]int64{class: 1}, Priority: 1})
	if !ok {
		return
	}
	hi, ok := w.agingNode(sid, ag, NodeSpec{Name: "hi", Priority: 3})
	if !ok {
		return
	}
	if !w.agingAcquire(sid, ag, class) {
		return // the slot is not ours: nothing to give back
	}
	w.agingAcquire(sid, ag, class) // the one to age
	for range specAgingGrants + 4 {
		w.agingAcquire(sid, hi, class)
		held := slices.IndexFunc(sortedKeys(w.e.leases), func(id LeaseID) bool {
			l := w.e.leases[id]
			return l.session.id == sid && l.class == class && !l.block && l.node.within(w.e.nodes[ag])
		})
		if held < 0 {
			continue // the slot went elsewhere, or ag ended
		}
		id := sortedKeys(w.e.leases)[held]
		before := w.e.Seq()
		err := w.e.Release(sid, id, 0, false, "")
		w.expect(fmt.Sprintf("aging: release s%d l%d", sid, id), before, err, ErrLeaseExpired, ErrLeaseRevoked)
		delete(w.held, id)
	}
}

// agingNode makes a node of an aging episode, as session sid.
func (w *world) agingNode(sid SessionID, parent NodeID, spec NodeSpec) (NodeID, bool) {
	before := w.e.Seq()
	v, err := w.e.CreateNode(sid, parent, spec, "")
	what := fmt.Sprintf("aging: create s%d under n%d %q: n%d", sid, parent, spec.Name, v.ID)
	w.expect(what, before, err, ErrTaskEnded, ErrExists, ErrBound, ErrInvalid)
	w.checkBoundRefusal(what, err, parent, nil, names(spec.Limits), false)
	if err != nil {
		return 0, false
	}
	w.nodes = append(w.nodes, v.ID)
	return v.ID, true
}

// agingAcquire is one acquire of an aging episode, queued or granted as
// any other; it reports whether it was granted at once.
func (w *world) agingAcquire(sid SessionID, n NodeID, class string) bool {
	before := w.e.Seq()
	g, wait, err := w.e.Acquire(sid, AcquireRequest{Node: n, Class: class})
	what := fmt.Sprintf("aging: acquire s%d n%d %s: %v queued=%v", sid, n, class, g, wait != nil)
	w.expect(what, before, err, ErrTaskEnded, ErrBound)
	w.checkBoundRefusal(what, err, n, nil, []string{class}, false)
	switch {
	case err != nil:
		return false
	case wait != nil:
		w.waits = append(w.waits, &pending{wait: wait, sid: sid})
		w.m.Enqueue(wait, sid, n, class, nil, "", false)
		return false
	}
	w.held[g.Lease] = sid
	return true
}
