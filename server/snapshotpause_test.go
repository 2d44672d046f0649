package server

import (
	"encoding/json"
	"fmt"
	"reflect"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/governor-project/governor/governor/engine"
)

// busyEngine is an engine with n tasks under one tenant, each with a
// consume (a request id remembered), a lease given back (a tombstone)
// and a lease held.
func busyEngine(t testing.TB, n int, sink engine.Sink) *engine.Engine {
	t.Helper()
	eng, err := engine.New(engine.Config{Clock: engine.WallClock{}, Sink: sink})
	if err != nil {
		t.Fatal(err)
	}
	tenant, err := eng.CreateNode(engine.System, engine.RootID, engine.NodeSpec{Name: "acme <&>",
		Limits: map[string]int64{"db": int64(2 * n)}, Quotas: map[string]int64{"calls": int64(2 * n)}}, "")
	if err != nil {
		t.Fatal(err)
	}
	sid, err := eng.OpenSession(tenant.ID, "hash", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		v, err := eng.CreateNode(sid, tenant.ID, engine.NodeSpec{Name: fmt.Sprint("task-", i)}, fmt.Sprint("c", i))
		if err != nil {
			t.Fatal(err)
		}
		if err := eng.Consume(sid, v.ID, "calls", 1, fmt.Sprint("r", i)); err != nil {
			t.Fatal(err)
		}
		for held := range 2 {
			g, _, err := eng.Acquire(sid, engine.AcquireRequest{Node: v.ID, Class: "db"})
			if err != nil {
				t.Fatal(err)
			}
			if held == 0 {
				if err := eng.Release(sid, g.Lease, time.Millisecond, false, ""); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	return eng
}

// A snapshot is encoded in pieces, with a pause after every
// snapshotEncodePause items, into exactly the bytes json.Marshal gives
// (what every stored snapshot was, and what decodeSnapshot reads): with
// arrays nil, empty and full, and text that JSON escapes.
func TestSnapshotEncodesInPiecesAsJSONMarshalDoes(t *testing.T) {
	fresh, err := engine.New(engine.Config{Clock: engine.WallClock{}})
	if err != nil {
		t.Fatal(err)
	}
	busy := busyEngine(t, 700, nil)
	for _, c := range []struct {
		name string
		snap engine.Snapshot
	}{
		{"fresh engine (nil arrays)", fresh.Snapshot()},
		{"empty arrays", engine.Snapshot{Seq: 3, Nodes: []engine.NodeView{}, Sessions: []engine.SessionSnapshot{},
			Leases: []engine.LeaseSnapshot{}, Tombstones: []engine.TombstoneSnapshot{}, Audit: []engine.NodeAudit{{Node: 1}}}},
		{"700 tasks", busy.Snapshot()},
	} {
		want, err := json.Marshal(c.snap)
		if err != nil {
			t.Fatal(err)
		}
		for _, hint := range []int{0, len(want), -1} {
			pauses := 0
			got, err := encodeSnapshot(c.snap, hint, func() { pauses++ })
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			if string(got) != string(want) {
				t.Fatalf("%s, hint %d: encoded differs from json.Marshal:\n got %.300s\nwant %.300s", c.name, hint, got, want)
			}
			items := len(c.snap.Nodes) + len(c.snap.Sessions) + len(c.snap.Leases) + len(c.snap.Tombstones)
			if wantPauses := items / snapshotEncodePause; pauses != wantPauses {
				t.Fatalf("%s: paused %d times for %d items, want %d", c.name, pauses, items, wantPauses)
			}
		}
		back, err := decodeSnapshot(c.snap.Seq, want)
		if err != nil || !reflect.DeepEqual(back.Nodes, c.snap.Nodes) && len(c.snap.Nodes) > 0 {
			t.Fatalf("%s: does not decode back: %v", c.name, err)
		}
	}
}

// sinkFunc is an engine.Sink.
type sinkFunc func(engine.Event)

func (f sinkFunc) Emit(ev engine.Event) { f(ev) }

// The mirror pauses while it catches up (after every mirrorApplyChunk
// events) and while it captures a snapshot, so that calls run between
// the pieces of a long job on one core; what it captures is the engine's
// state all the same.
func TestMirrorPausesWhileItCatchesUpAndCaptures(t *testing.T) {
	var m *mirror
	live := busyEngine(t, 10, sinkFunc(func(ev engine.Event) {
		if m != nil {
			m.add(ev)
		}
	}))
	var err error
	if m, err = newMirror(engine.Config{Clock: engine.WallClock{}}, live); err != nil {
		t.Fatal(err)
	}
	pauses := 0
	m.pause = func() { pauses++ }
	tenant := live.Snapshot().Nodes[1].ID
	sid, err := live.OpenSession(tenant, "hash2", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	before := live.Seq()
	for i := range 1000 {
		if _, err := live.CreateNode(sid, tenant, engine.NodeSpec{Name: fmt.Sprint("more-", i)}, ""); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.catchUp(live); err != nil {
		t.Fatal(err)
	}
	events := int(live.Seq() - before)
	if want := (events + mirrorApplyChunk - 1) / mirrorApplyChunk; pauses != want || want < 3 {
		t.Fatalf("caught up on %d events with %d pauses, want %d", events, pauses, want)
	}
	pauses = 0
	snap, err := m.snapshot(live)
	if err != nil {
		t.Fatal(err)
	}
	if want := live.Snapshot(); !reflect.DeepEqual(snap, want) {
		t.Fatal("the mirror's snapshot differs from the engine's")
	}
	items := len(snap.Nodes) + len(snap.Sessions) + len(snap.Leases) + len(snap.Tombstones)
	if want := items / engine.SnapshotPauseEvery; pauses != want || want < 3 {
		t.Fatalf("captured %d items with %d pauses, want %d", items, pauses, want)
	}
}

// BenchmarkSnapshotStall takes a snapshot of a large tree the way
// housekeeping does (the mirror catches up, captures, encodes) on one P,
// as a governord pinned to one core runs, while a probe goroutine wakes
// every 200 µs, as a call's goroutines do: the probe's lateness is how long
// calls wait behind the snapshot. "pausing" is governord's way (a Gosched
// between pieces); "one-piece" gives the same work no pauses, as before
// (issue 27). Run with -benchtime 3x.
func BenchmarkSnapshotStall(b *testing.B) {
	for _, c := range []struct {
		name  string
		pause func()
	}{{"one-piece", func() {}}, {"pausing", runtime.Gosched}} {
		b.Run(c.name, func(b *testing.B) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
			var m *mirror
			live := busyEngine(b, 20_000, sinkFunc(func(ev engine.Event) {
				if m != nil {
					m.add(ev)
				}
			}))
			var err error
			if m, err = newMirror(engine.Config{Clock: engine.WallClock{}}, live); err != nil {
				b.Fatal(err)
			}
			m.pause = c.pause
			var late []time.Duration
			tenant := live.Snapshot().Nodes[1].ID
			for round := 0; b.Loop(); round++ {
				sid, err := live.OpenSession(tenant, fmt.Sprint("round-", round), time.Hour)
				if err != nil {
					b.Fatal(err)
				}
				for i := range 20_000 { // events for the mirror to catch up on
					if _, err := live.CreateNode(sid, tenant, engine.NodeSpec{Name: fmt.Sprint("e", i, "-", sid)}, ""); err != nil {
						b.Fatal(err)
					}
				}
				stop := make(chan struct{})
				probed := make(chan []time.Duration)
				go probe(stop, probed)
				snap, err := m.snapshot(live)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := encodeSnapshot(snap, 0, m.pause); err != nil {
					b.Fatal(err)
				}
				close(stop)
				late = append(late, <-probed...)
			}
			slices.Sort(late)
			b.ReportMetric(float64(late[len(late)*99/100].Microseconds())/1000, "probe-p99-ms")
			b.ReportMetric(float64(late[len(late)-1].Microseconds())/1000, "probe-max-ms")
		})
	}
}

// probe wakes every 200 µs until stop and sends how late each wake-up was.
func probe(stop <-chan struct{}, out chan<- []time.Duration) {
	var late []time.Duration
	for {
		due := time.Now().Add(200 * time.Microsecond)
		select {
		case <-stop:
			out <- late
			return
		case <-time.After(200 * time.Microsecond):
			late = append(late, time.Since(due))
		}
	}
}
