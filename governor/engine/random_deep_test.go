package engine

import (
	"fmt"
	"math/rand"
	"slices"
)

// The randomized driver below the tenants: sessions scoped to tasks and
// subtasks, and chains of subtasks made deeper, so that what pins a node
// (a session's scope, a reservation) sits two and more levels below a
// node that ends, and reclamation must look that far down (I15, I16).

// depthOf is id's depth in the model's tree: 0 for the root.
func (m *model) depthOf(id NodeID) int { return len(m.chain(id)) - 1 }

// openBelowTenants lists the open nodes at depth 2 and below (tasks and
// subtasks), by id.
func (w *world) openBelowTenants() []NodeID {
	var out []NodeID
	for _, id := range w.nodes {
		if st, kept := w.m.state[id]; kept && st == Open && w.m.depthOf(id) >= 2 {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// deepOp is, now and then, a session opened scoped to a task or a subtask
// (the deeper the likelier), a subtask made under one, or the end of the
// node two levels above something that pins: a session's scope or a
// reservation. It draws from deep, a stream of its own, so that each
// seed's other draws stay as they were.
func (w *world) deepOp() {
	if w.deep.Intn(6) != 0 {
		return
	}
	switch w.deep.Intn(4) {
	case 0:
		w.endAbovePin()
		return
	case 1:
		w.deepen()
		return
	}
	if n, ok := w.deepNode(); ok {
		w.openSessionDrawing(n, w.deep)
	}
}

// deepNode picks an open task or subtask, the deeper the likelier.
func (w *world) deepNode() (NodeID, bool) {
	open := w.openBelowTenants()
	if len(open) == 0 {
		return 0, false
	}
	n := open[w.deep.Intn(len(open))]
	if o := open[w.deep.Intn(len(open))]; w.m.depthOf(o) > w.m.depthOf(n) {
		n = o
	}
	return n, true
}

// sessionAboveFrom picks, drawing from rng, an open session whose scope
// holds n but is not n, or reports there is none.
func (w *world) sessionAboveFrom(n NodeID, rng *rand.Rand) (SessionID, bool) {
	var above []SessionID
	for _, sid := range w.sessions {
		if scope := w.scope[sid]; scope != n && w.m.inside(n, scope) {
			above = append(above, sid)
		}
	}
	if len(above) == 0 {
		return 0, false
	}
	slices.Sort(above)
	return above[rng.Intn(len(above))], true
}

// deepen makes a subtask under a deep node, as a session above it.
func (w *world) deepen() {
	n, ok := w.deepNode()
	if !ok {
		return
	}
	sid, ok := w.sessionAboveFrom(n, w.deep)
	if !ok {
		return
	}
	spec := NodeSpec{Name: fmt.Sprintf("d%d", w.deep.Intn(4))}
	before := w.e.Seq()
	v, err := w.e.CreateNode(sid, n, spec, "")
	what := fmt.Sprintf("deepen s%d under n%d %q: n%d", sid, n, spec.Name, v.ID)
	w.expect(what, before, err, ErrTaskEnded, ErrExists, ErrInvalid, ErrBound)
	w.checkBoundRefusal(what, err, n, nil, nil, false)
	if err == nil {
		w.nodes = append(w.nodes, v.ID)
	}
}

// endAbovePin ends, as a session above it, the node two levels above an
// open session's scope or a reservation, so that what pins it sits below
// its children.
func (w *world) endAbovePin() {
	var pinned []NodeID
	for _, sid := range sortedKeys(w.m.scope) {
		pinned = append(pinned, w.m.scope[sid])
	}
	for k := range w.m.reservations {
		pinned = append(pinned, k.node)
	}
	slices.Sort(pinned)
	pinned = slices.DeleteFunc(slices.Compact(pinned), func(id NodeID) bool { return w.m.depthOf(id) < 3 })
	if len(pinned) == 0 {
		return
	}
	x := w.m.chain(pinned[w.deep.Intn(len(pinned))])[2]
	sid, ok := w.sessionAboveFrom(x, w.deep)
	if !ok {
		return
	}
	before := w.e.Seq()
	_, err := w.e.EndNode(sid, x, Closed, "")
	w.expect(fmt.Sprintf("end s%d n%d, two levels above a pin", sid, x), before, err)
}

// pinDepth is how far below id the nearest pin of its subtree sits, as
// the model has it (0: id itself; -1: none): an open session's scope, or
// a reservation.
func (m *model) pinDepth(id NodeID) int {
	var pins []NodeID
	for _, scope := range m.scope {
		pins = append(pins, scope)
	}
	for k := range m.reservations {
		pins = append(pins, k.node)
	}
	for _, sl := range m.slices {
		pins = append(pins, sl.node)
	}
	best := -1
	for _, p := range pins {
		if d := slices.Index(m.chain(p), id); d >= 0 && (best < 0 || d < best) {
			best = d
		}
	}
	return best
}
