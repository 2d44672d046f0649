package usage

import (
	"testing"

	"github.com/governor-project/governor/governor/engine"
)

// A burst of tasks, reclaimed, leaves the fold's node maps built again
// for what is left, rather than keeping the burst's room.
func TestFoldShrinksAfterABurstIsReclaimed(t *testing.T) {
	const tenant, burst = engine.NodeID(2), 3 * shrinkAbove
	f := New(engine.Snapshot{})
	f.Add(engine.Event{Kind: engine.EvNodeCreated, Node: tenant, Parent: engine.RootID, Spec: &engine.NodeSpec{Name: "t"}})
	var tasks []engine.NodeID
	for i := range burst {
		id := tenant + 1 + engine.NodeID(i)
		f.Add(engine.Event{Kind: engine.EvNodeCreated, Node: id, Parent: tenant})
		tasks = append(tasks, id)
	}
	for len(tasks) > 0 {
		k := min(len(tasks), 512)
		f.Add(engine.Event{Kind: engine.EvNodesReclaimed, Nodes: tasks[:k]})
		tasks = tasks[k:]
	}
	if len(f.nodes) != 1 || len(f.kids[tenant]) != 0 {
		t.Fatalf("%d nodes and %d children of the tenant left, want 1 and 0", len(f.nodes), len(f.kids[tenant]))
	}
	// Built again once a quarter full, and not below shrinkAbove: what is
	// left is room for fewer than that.
	if f.nodesMost >= shrinkAbove {
		t.Errorf("the node maps keep room for %d nodes, with %d held", f.nodesMost, len(f.nodes))
	}
}
