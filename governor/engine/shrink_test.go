package engine

import (
	"fmt"
	"testing"
	"time"
)

// A burst of tasks, ended and reclaimed, leaves no room behind: the live
// engine's Reap, and a mirror's Tidy, build again what the burst grew (the
// nodes, the tombstones, the queue of ended nodes, the tenant's children).
func TestBurstLeavesNoRoomOnceReclaimed(t *testing.T) {
	const burst = 3 * shrinkAbove
	clock := newFakeClock()
	rec := &recorder{}
	e, err := New(Config{Clock: clock, Sink: rec, Retention: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	tenant, err := e.CreateNode(System, RootID, NodeSpec{Name: "t"}, "")
	if err != nil {
		t.Fatal(err)
	}
	sid, err := e.OpenSession(tenant.ID, "tok", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for i := range burst {
		task, err := e.CreateNode(System, tenant.ID, NodeSpec{Name: fmt.Sprintf("task%d", i)}, "")
		if err != nil {
			t.Fatal(err)
		}
		g, _, err := e.Acquire(sid, AcquireRequest{Node: task.ID, Class: "db"})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Release(sid, g.Lease, 0, false, ""); err != nil {
			t.Fatal(err)
		}
		if _, err := e.EndNode(System, task.ID, Closed, ""); err != nil {
			t.Fatal(err)
		}
		if i%1000 == 0 {
			e.Reap() // as a server does, every 100 ms: it sees the burst grow
		}
	}
	mirror, err := New(Config{Clock: clock, Retention: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := mirror.Apply(rec.events...); err != nil {
		t.Fatal(err)
	}
	mirror.Tidy()                  // as the server's mirror is, every second: it sees the burst
	clock.Advance(2 * time.Minute) // past the retention and the tombstones' TTL
	for len(e.nodes) > 2 {
		e.Reap()
	}
	if err := mirror.Apply(rec.events[mirror.Seq():]...); err != nil {
		t.Fatal(err)
	}
	mirror.Tidy()
	for name, x := range map[string]*Engine{"live": e, "mirror": mirror} {
		tn := x.nodes[tenant.ID]
		if len(x.nodes) != 2 || len(x.tombs) != 0 {
			t.Fatalf("%s: %d nodes and %d tombstones left, want 2 and 0", name, len(x.nodes), len(x.tombs))
		}
		// Built again once a quarter full, and not below shrinkAbove: what
		// is left is room for fewer than that.
		if x.nodesMost.most >= shrinkAbove || x.tombsMost.most >= shrinkAbove {
			t.Errorf("%s: the maps keep room for %d nodes and %d tombstones", name, x.nodesMost.most, x.tombsMost.most)
		}
		if c := cap(tn.children); c >= shrinkAbove {
			t.Errorf("%s: the tenant's children keep room for %d", name, c)
		}
		if c := cap(x.endedQ); c >= shrinkAbove {
			t.Errorf("%s: the queue of ended nodes keeps room for %d", name, c)
		}
	}
}
