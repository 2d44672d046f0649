package engine

import (
	"slices"
	"testing"
	"time"
)

// Inspect lists a subtree's leases (oldest first), queued acquires with
// when they queued, and sessions by their last heartbeat, inside the
// caller's scope only, and emits nothing.
func TestInspectListsASubtree(t *testing.T) {
	f := newFixture(t)
	f.setCaps(f.job, CapsEdit{Limits: map[string]int64{"db": 1}})
	first := f.acquire(f.sA, f.step, "db")
	f.clock.Advance(time.Second)
	w := f.enqueue(f.sA, f.job, "db")
	queued := f.now()
	f.acquire(f.sB, f.otherJob, "db")
	var in Inspection
	err := unchanged(t, f.e, func() error {
		var err error
		in, err = f.e.Inspect(f.sA, f.acme, 0)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(in.Leases) != 1 || in.Leases[0].ID != first || in.Leases[0].Node != f.step || in.Leases[0].Session != f.sA {
		t.Fatalf("leases under acme: %+v, want only lease %d on step", in.Leases, first)
	}
	if len(in.Waiters) != 1 || in.Waiters[0].Node != f.job || in.Waiters[0].Since != queued {
		t.Fatalf("waiters under acme: %+v, want one on job queued at %d", in.Waiters, queued)
	}
	if len(in.Sessions) != 1 || in.Sessions[0].ID != f.sA || in.Sessions[0].Expires != in.Now-int64(time.Second)+int64(longTTL) {
		t.Fatalf("sessions under acme: %+v", in.Sessions)
	}
	if in, err := f.e.Inspect(f.sA, f.acme, 0); err != nil || in.WaiterCount != 1 {
		t.Fatalf("again: %+v, %v", in, err)
	}
	_, err = f.e.Inspect(f.sA, f.other, 0)
	wantErr(t, err, ErrNotFound)
	if all, _ := f.e.Inspect(System, RootID, 1); all.LeaseCount != 2 || len(all.Leases) != 1 {
		t.Fatalf("the root, cut at 1: %d leases listed of %d", len(all.Leases), all.LeaseCount)
	}
	f.e.CancelWait(w)
}

// Subtree lists open nodes depth first from the top, inside the scope, cut
// at the limit, with the acquires queued on each node and when each node
// was made.
func TestSubtreeListsDepthFirst(t *testing.T) {
	f := newFixture(t)
	f.clock.Advance(time.Second)
	late := f.create(System, f.acme, NodeSpec{Name: "late"})
	f.setCaps(f.job2, CapsEdit{Limits: map[string]int64{"db": 0}})
	w := f.enqueue(f.sA, f.job2, "db")
	defer f.e.CancelWait(w)
	if _, err := f.e.EndNode(System, f.step, Closed, ""); err != nil {
		t.Fatal(err)
	}
	nodes, waiting, more, err := f.e.Subtree(f.sA, f.acme, 0)
	if err != nil || more {
		t.Fatal(err, more)
	}
	var ids []NodeID
	for _, n := range nodes {
		ids = append(ids, n.ID)
	}
	if want := []NodeID{f.acme, f.job, f.job2, late}; !slices.Equal(ids, want) {
		t.Fatalf("subtree of acme: %v, want %v (step is closed)", ids, want)
	}
	if waiting[f.job2] != 1 || len(waiting) != 1 {
		t.Fatalf("waiting %v, want one on job2", waiting)
	}
	if nodes[3].Created != f.now() || nodes[1].Created >= nodes[3].Created {
		t.Fatalf("created times: job %d, late %d (now %d)", nodes[1].Created, nodes[3].Created, f.now())
	}
	if cut, _, more, _ := f.e.Subtree(System, RootID, 2); len(cut) != 2 || !more {
		t.Fatalf("cut at 2: %d nodes, more %v", len(cut), more)
	}
	_, _, _, err = f.e.Subtree(f.sB, f.acme, 0)
	wantErr(t, err, ErrNotFound)
}
