package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// Reclaiming ended nodes (reclaim.go): what an ended node answers while it
// is kept, and after.

const testRetention = time.Minute

// newRetentionFixture is newFixture with a retention of testRetention and
// cfg edited by edit.
func newRetentionFixture(t *testing.T, edit func(*Config)) *fixture {
	t.Helper()
	f := &fixture{t: t, clock: newFakeClock(), rec: &recorder{}}
	f.cfg = Config{Clock: f.clock, Sink: f.rec, Retention: testRetention}
	if edit != nil {
		edit(&f.cfg)
	}
	e, err := New(f.cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	f.e = e
	f.acme = f.create(System, RootID, NodeSpec{Name: "acme"})
	f.job = f.create(System, f.acme, NodeSpec{Name: "job"})
	f.step = f.create(System, f.job, NodeSpec{Name: "step"})
	f.sA = f.open(f.acme, longTTL)
	return f
}

// reclaimed lists the nodes the events so far reclaimed.
func (f *fixture) reclaimed() []NodeID {
	var out []NodeID
	for _, ev := range f.rec.events {
		if ev.Kind == EvNodesReclaimed {
			out = append(out, ev.Nodes...)
		}
	}
	return out
}

func TestEndedNodeAnswersAsEndedUntilItsRetentionPasses(t *testing.T) {
	f := newRetentionFixture(t, nil)
	task, err := f.e.CreateNode(f.sA, f.acme, NodeSpec{Name: "crawl", Quotas: map[string]int64{"calls": 5}}, "create-1")
	if err != nil {
		t.Fatal(err)
	}
	sub := f.create(f.sA, task.ID, NodeSpec{Name: "page"})
	f.consume(f.sA, sub, "calls", 2)
	if _, err := f.e.EndNode(f.sA, task.ID, Closed, "end-1"); err != nil {
		t.Fatal(err)
	}
	ended := f.now()

	// Within the retention: ended, as before.
	f.clock.Advance(testRetention - time.Nanosecond)
	f.e.Reap()
	if got := f.reclaimed(); got != nil {
		t.Fatalf("reclaimed %v before the retention passed", got)
	}
	if v := f.node(task.ID); v.State != Closed || v.Ended != ended || v.Used["calls"] != 2 {
		t.Errorf("Get during the retention = %+v; want closed at %d with calls 2", v, ended)
	}
	var ee *EndedError
	if err := f.e.Consume(f.sA, sub, "calls", 1, ""); !errors.As(err, &ee) || ee.Node != task.ID {
		t.Errorf("Consume on the ended subtask = %v; want the task's EndedError", err)
	}
	if v, err := f.e.CreateNode(f.sA, f.acme, NodeSpec{Name: "crawl", Quotas: map[string]int64{"calls": 5}}, "create-1"); err != nil || v.ID != task.ID {
		t.Errorf("retried create = %d, %v; want the original node %d", v.ID, err, task.ID)
	}
	if v, err := f.e.EndNode(f.sA, task.ID, Closed, "end-1"); err != nil || v.State != Closed {
		t.Errorf("retried end = %+v, %v; want the closed node", v, err)
	}

	// Then reclaimed, subtree and all, in one recorded event.
	f.clock.Advance(time.Nanosecond)
	f.e.Reap()
	if got := f.reclaimed(); !slices.Equal(got, []NodeID{task.ID}) {
		t.Fatalf("reclaimed %v; want the task %d (with its subtask)", got, task.ID)
	}
	for _, id := range []NodeID{task.ID, sub} {
		_, err := f.e.Get(f.sA, id)
		wantErr(t, err, ErrNotFound)
		if err == nil || !strings.Contains(err.Error(), "reclaimed") {
			t.Errorf("Get(%d) after the retention = %v; want a NOT_FOUND that says ended nodes are reclaimed", id, err)
		}
		wantErr(t, f.e.Consume(f.sA, id, "calls", 1, ""), ErrNotFound)
	}
	_, err = f.e.CreateNode(f.sA, f.acme, NodeSpec{Name: "crawl", Quotas: map[string]int64{"calls": 5}}, "create-1")
	wantErr(t, err, ErrNotFound)
	_, err = f.e.EndNode(f.sA, task.ID, Closed, "end-1")
	wantErr(t, err, ErrNotFound)
	if kids, _ := f.e.Children(f.sA, f.acme, 0, 0); slices.ContainsFunc(kids, func(v NodeView) bool { return v.ID == task.ID }) {
		t.Errorf("the tenant still lists the reclaimed task among %d children", len(kids))
	}
	// Its spending stays with its ancestors, and is told apart.
	if v := f.node(f.acme); v.Used["calls"] != 2 || v.Reclaimed["calls"] != 2 {
		t.Errorf("tenant after the reclaim: used %v, reclaimed %v; want 2 and 2", v.Used, v.Reclaimed)
	}
	// Its name is free again (it was since the end), with a new id.
	if v, created, err := f.e.FindOrCreate(f.sA, f.acme, NodeSpec{Name: "crawl"}, ""); err != nil || !created || v.ID <= sub {
		t.Errorf("FindOrCreate(crawl) = %d, created %v, %v; want a new node", v.ID, created, err)
	}
	f.checkRebuilds(t)
}

// checkRebuilds checks that a restore and a replay give f's state.
func (f *fixture) checkRebuilds(t *testing.T) {
	t.Helper()
	want := f.e.Snapshot()
	for _, way := range []string{wayRestore, wayReplay} {
		if got := f.rebuild(t, way).Snapshot(); !reflect.DeepEqual(got, want) {
			t.Errorf("%s differs from the live engine:\n%s", way, diffSnapshots(want, got))
		}
	}
}

func TestPinnedEndedNodesAreKept(t *testing.T) {
	f := newRetentionFixture(t, nil)
	r, err := f.e.Reserve(f.sA, ReserveRequest{Node: f.step, Resource: "calls", Want: 4})
	if err != nil || r.Granted != 4 {
		t.Fatalf("Reserve = %+v, %v", r, err)
	}
	if _, err := f.e.EndNode(System, f.job, Cancelled, ""); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(2 * testRetention)
	f.e.Reap()
	if got := f.reclaimed(); got != nil {
		t.Fatalf("reclaimed %v while a reservation on node %d is unsettled", got, f.step)
	}
	// The holder settles what it reserved on the ended node: now nothing
	// names it.
	if _, err := f.e.Reserve(f.sA, ReserveRequest{Node: f.step, Resource: "calls", Spent: 1, Return: 3}); err != nil {
		t.Fatalf("settling on the ended node: %v", err)
	}
	f.e.Reap()
	if got := f.reclaimed(); !slices.Equal(got, []NodeID{f.job}) {
		t.Fatalf("reclaimed %v; want the task %d once settled", got, f.job)
	}

	// A tenant ended while a session is scoped to it stays until the
	// session ends.
	other := f.create(System, RootID, NodeSpec{Name: "other"})
	s := f.open(other, longTTL)
	if _, err := f.e.EndNode(System, other, Closed, ""); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(2 * testRetention)
	f.e.Reap()
	if got := f.reclaimed(); len(got) != 1 {
		t.Fatalf("reclaimed %v while session %d is scoped to the tenant", got, s)
	}
	if err := f.e.CloseSession(s); err != nil {
		t.Fatal(err)
	}
	f.e.Reap()
	if got := f.reclaimed(); !slices.Equal(got, []NodeID{f.job, other}) {
		t.Fatalf("reclaimed %v; want the tenant %d once its session closed", got, other)
	}
	f.checkRebuilds(t)
}

// A lease's tombstone outlives a short retention: once its node is
// reclaimed the lease is forgotten (not found), never outside the scope.
func TestTombstoneOfAReclaimedNode(t *testing.T) {
	f := newRetentionFixture(t, func(c *Config) { c.Retention = 10 * time.Second })
	l := f.acquire(f.sA, f.step, "db")
	if _, err := f.e.EndNode(f.sA, f.job, Closed, ""); err != nil {
		t.Fatal(err)
	}
	wantErr(t, f.e.Release(f.sA, l, 0, false, ""), ErrLeaseRevoked)
	f.clock.Advance(10 * time.Second)
	f.e.Reap()
	if len(f.reclaimed()) != 1 {
		t.Fatalf("reclaimed %v", f.reclaimed())
	}
	wantErr(t, f.e.Release(f.sA, l, 0, false, ""), ErrNotFound)
	_, err := f.e.Validate(f.sA, l)
	wantErr(t, err, ErrNotFound)
}

// A denial on an ancestor names reclaimed children's spending as such, not
// as the ancestor's own.
func TestDenialCountsReclaimedChildren(t *testing.T) {
	f := newRetentionFixture(t, nil)
	f.setCaps(f.acme, CapsEdit{Quotas: map[string]int64{"calls": 10}})
	f.consume(f.sA, f.job, "calls", 6)
	if _, err := f.e.EndNode(f.sA, f.job, Closed, ""); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(testRetention)
	f.e.Reap()
	b := f.create(f.sA, f.acme, NodeSpec{Name: "b"})
	f.consume(f.sA, b, "calls", 3)
	var d *Denial
	if err := f.e.Consume(f.sA, b, "calls", 2, ""); !errors.As(err, &d) {
		t.Fatalf("Consume = %v; want a denial", err)
	}
	if want := (Consumer{Name: ReclaimedConsumer, Used: 6}); d.Node != f.acme || d.Largest != want {
		t.Errorf("denial %v: largest %+v; want %+v on the tenant", d, d.Largest, want)
	}
}

// Churn: a tenant that creates and ends tasks without end holds a bounded
// number of nodes, and so a bounded snapshot, once the retention has
// passed; stale deadline entries do not pile up either.
func TestChurnKeepsTheTreeBounded(t *testing.T) {
	f := newRetentionFixture(t, func(c *Config) { c.Retention = 10 * time.Second })
	size := func() int {
		raw, err := json.Marshal(f.e.Snapshot())
		if err != nil {
			t.Fatal(err)
		}
		return len(raw)
	}
	churn := func(tasks int) {
		for range tasks {
			v, err := f.e.CreateNode(f.sA, f.acme, NodeSpec{Name: "t", Deadline: f.clock.Now().Add(time.Hour).UnixNano()}, "")
			if err != nil {
				t.Fatal(err)
			}
			f.consume(f.sA, v.ID, "calls", 1)
			if _, err := f.e.EndNode(f.sA, v.ID, Closed, ""); err != nil {
				t.Fatal(err)
			}
			f.clock.Advance(10 * time.Millisecond) // 100 tasks a second
			f.e.Reap()
		}
	}
	churn(2000) // 20 s: two retentions
	nodes, snap := len(f.e.nodes), size()
	churn(20000)
	// 10 s of tasks are kept (1,000), give or take the one in flight.
	if got := len(f.e.nodes); got > nodes+1 || got > 1010 {
		t.Errorf("nodes held: %d after 2,000 tasks, %d after 22,000", nodes, got)
	}
	if got := size(); got > snap+snap/20 {
		t.Errorf("snapshot: %d bytes after 2,000 tasks, %d after 22,000", snap, got)
	}
	if got := len(f.e.deadlines); got > 2*len(f.e.nodes)+64 {
		t.Errorf("the deadline heap holds %d entries for %d nodes", got, len(f.e.nodes))
	}
	if used := f.node(f.acme).Used["calls"]; used != 22000 {
		t.Errorf("the tenant's usage is %d; want every task's 22,000", used)
	}
	t.Logf("nodes %d, snapshot %d bytes, deadline entries %d", len(f.e.nodes), size(), len(f.e.deadlines))
	f.checkRebuilds(t)
}

// A snapshot written before ends were timed restores its ended nodes as
// ended at the restore, so they are kept one full retention from then.
func TestRestoreTimesUntimedEnds(t *testing.T) {
	f := newRetentionFixture(t, nil)
	if _, err := f.e.EndNode(f.sA, f.job, Closed, ""); err != nil {
		t.Fatal(err)
	}
	snap := cloneSnapshot(t, f.e.Snapshot())
	for i := range snap.Nodes {
		snap.Nodes[i].Ended = 0
	}
	f.clock.Advance(time.Hour)
	e, err := New(Config{Clock: f.clock, Retention: testRetention, Sink: f.rec})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Restore(snap); err != nil {
		t.Fatal(err)
	}
	e.Reap()
	if _, err := e.Get(System, f.step); err != nil {
		t.Fatalf("reclaimed at once after the restore: %v", err)
	}
	f.clock.Advance(testRetention)
	e.Reap()
	_, err = e.Get(System, f.step)
	wantErr(t, err, ErrNotFound)
}

// A mirror (an engine that applies another's events and is tidied instead
// of reaped) takes the same snapshots as the live engine, and holds no more
// than it: tombstones, deadline entries and reclamation entries do not pile
// up in it.
func TestAMirrorSnapshotsLikeTheLiveEngine(t *testing.T) {
	f := newRetentionFixture(t, func(c *Config) { c.Retention = 10 * time.Second })
	mirror, err := New(Config{Clock: f.clock})
	if err != nil {
		t.Fatal(err)
	}
	if err := mirror.Restore(cloneSnapshot(t, f.e.Snapshot())); err != nil {
		t.Fatal(err)
	}
	applied := len(f.rec.events)
	for i := range 3000 {
		v, err := f.e.CreateNode(f.sA, f.acme, NodeSpec{Name: "t", Deadline: f.clock.Now().Add(time.Hour).UnixNano()}, "")
		if err != nil {
			t.Fatal(err)
		}
		l := f.acquire(f.sA, v.ID, "db")
		f.release(f.sA, l)
		if _, err := f.e.EndNode(f.sA, v.ID, Closed, ""); err != nil {
			t.Fatal(err)
		}
		f.clock.Advance(50 * time.Millisecond)
		f.e.Reap()
		if i%100 == 99 {
			if err := mirror.Apply(f.rec.events[applied:]...); err != nil {
				t.Fatal(err)
			}
			applied = len(f.rec.events)
			mirror.Tidy()
			if got, want := mirror.Snapshot(), f.e.Snapshot(); !reflect.DeepEqual(got, want) {
				t.Fatalf("after %d tasks the mirror's snapshot differs:\n%s", i+1, diffSnapshots(want, got))
			}
		}
	}
	if len(mirror.tombs) > 2*len(f.e.tombs)+1 || len(mirror.deadlines) > 2*len(mirror.nodes)+64 ||
		len(mirror.endedQ)-mirror.endedHead > len(mirror.nodes) {
		t.Errorf("the mirror holds %d tombstones (live %d), %d deadline entries and %d ended entries for %d nodes",
			len(mirror.tombs), len(f.e.tombs), len(mirror.deadlines), len(mirror.endedQ)-mirror.endedHead, len(mirror.nodes))
	}
}

// SnapshotPausing captures what Snapshot captures, and pauses once for
// every SnapshotPauseEvery nodes, sessions, leases and tombstones, so that
// a caller may let other goroutines run while a large state is captured.
func TestSnapshotPausingPausesAndCapturesTheSame(t *testing.T) {
	f := newRetentionFixture(t, nil)
	for i := range 1000 {
		v, err := f.e.CreateNode(f.sA, f.acme, NodeSpec{Name: fmt.Sprint("t", i)}, "")
		if err != nil {
			t.Fatal(err)
		}
		f.release(f.sA, f.acquire(f.sA, v.ID, "db")) // a tombstone each
		f.acquire(f.sA, v.ID, "db")                  // and a live lease
	}
	pauses := 0
	got := f.e.SnapshotPausing(func() { pauses++ })
	if want := f.e.Snapshot(); !reflect.DeepEqual(got, want) {
		t.Fatalf("SnapshotPausing differs from Snapshot:\n%s", diffSnapshots(want, got))
	}
	items := len(got.Nodes) + len(got.Sessions) + len(got.Leases) + len(got.Tombstones)
	if want := items / SnapshotPauseEvery; pauses != want || want < 10 {
		t.Fatalf("paused %d times capturing %d items, want %d (one every %d)", pauses, items, want, SnapshotPauseEvery)
	}
}
