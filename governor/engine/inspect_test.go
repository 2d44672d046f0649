package engine

import (
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
