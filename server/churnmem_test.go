package server_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/server"
)

// TestChurnMemoryComesBack is issue 25's test: the memory an ended task
// took comes back once node_retention and usage_retention have passed, on
// an idle governord, however many tasks came before. Three rounds of
// churn (16 workers create, charge and close tasks through the SDK, on the
// memory store), with the retentions passed after each; the live heap
// after the third is within 10% of the live heap after the first. The
// second round is a burst, three times the first: what governord kept was
// sized by its busiest moment (maps, queues, the last snapshot), so rounds
// of one size would leave equal heaps, kept or not.
//
// The retentions are a minute each, as the governord had them,
// and pass at once: the engine and the usage records read a clock the test
// moves on, rather than the test waiting for them. By default the first
// round is 4,000 tasks, and the test takes about 10 s; the figures
// came from 20,000 (100,000 in all), with a heap profile after each round:
//
//	GOVERNOR_MEM_CHURN_TASKS=20000 GOVERNOR_MEM_CHURN_PROFILES=DIR go test ./server -run TestChurnMemoryComesBack -v -timeout 30m
func TestChurnMemoryComesBack(t *testing.T) {
	if testing.Short() {
		t.Skip("a load test")
	}
	tasks := 4000
	if v := os.Getenv("GOVERNOR_MEM_CHURN_TASKS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1000 {
			t.Fatalf("GOVERNOR_MEM_CHURN_TASKS=%q: want the first round's tasks, at least 1000", v)
		}
		tasks = n
	}
	profiles := os.Getenv("GOVERNOR_MEM_CHURN_PROFILES")
	if profiles != "" {
		// One sample per 4 KiB rather than 512: the heap left is a few MB.
		defer func(rate int) { runtime.MemProfileRate = rate }(runtime.MemProfileRate)
		runtime.MemProfileRate = 4096
	}

	clock := &skipClock{}
	snaps := &reclaimedSnapshots{saved: make(chan struct{}, 1)}
	cfg := govtest.Config()
	cfg.Clock = clock
	cfg.Store.SnapshotEvery = 10_000
	cfg.Store.UsageRetention = time.Minute
	cfg.NodeRetention = time.Minute
	srv, err := server.Start(context.Background(), cfg, slog.New(snaps))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })

	var heaps []heapFigures
	done := 0
	for round, n := range []int{tasks, 3 * tasks, tasks} {
		took := churnRound(t, srv, n)
		done += n
		// Past node_retention, and past usage_retention by more than the
		// minute its records are kept by.
		clock.skip(3 * time.Minute)
		waitForReclaim(t, srv, snaps)
		h := readHeap(t, srv)
		heaps = append(heaps, h)
		t.Logf("round %d: %d tasks in %v (%d in all); idle after the retentions: %v", round+1, n, took.Round(time.Millisecond), done, h)
		if profiles != "" {
			writeHeapProfile(t, fmt.Sprintf("%s/heap-round%d.pb.gz", profiles, round+1))
		}
	}
	// The live heap, not the heap in use, which adds the room of spans
	// partly used: that moves with where the collector found room, not
	// with what is kept.
	first, third := heaps[0].live, heaps[2].live
	if float64(third) > 1.1*float64(first) {
		t.Errorf("the live heap after the third round is %.1f MB, more than 10%% over the %.1f MB after the first",
			mb(third), mb(first))
	}
}

// churnRound runs n tasks' lives on churnWorkers clients of their own,
// closed after the round: a session's request ids last as long as it
// does, not a retention, and a client kept past its round would weigh on
// the heap measured after the next.
func churnRound(t *testing.T, srv *server.Server, n int) time.Duration {
	t.Helper()
	clients := make([]*governor.Client, 0, churnWorkers)
	defer func() {
		for _, c := range clients {
			if err := c.Close(); err != nil {
				t.Errorf("close a client: %v", err)
			}
		}
	}()
	for range churnWorkers {
		c, err := governor.Dial(context.Background(), governor.WithAddr(srv.Addr()), governor.WithAPIKey(govtest.TenantKey))
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
	}
	_, took := churnConfig{tasks: n}.load(t, clients, func(int64, time.Duration) churnWindow { return churnWindow{} })
	return took
}

// skipClock is the wall clock, moved on by what the test skips: time
// passes as it does (heartbeats, waits), and a retention can pass at once.
type skipClock struct{ skipped atomic.Int64 }

func (c *skipClock) Now() time.Time       { return time.Now().Add(time.Duration(c.skipped.Load())) }
func (c *skipClock) skip(d time.Duration) { c.skipped.Add(int64(d)) }

// reclaimedSnapshots is governord's logger: it signals each snapshot saved
// of the root and the tenant alone (what is left once every task is
// reclaimed), and drops the rest.
type reclaimedSnapshots struct{ saved chan struct{} }

// untasked is how many nodes governord holds without tasks: the root and
// the tenant.
const untasked = 2

func (l *reclaimedSnapshots) Enabled(context.Context, slog.Level) bool { return true }
func (l *reclaimedSnapshots) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *reclaimedSnapshots) WithGroup(string) slog.Handler            { return l }

func (l *reclaimedSnapshots) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "snapshot saved" {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "nodes" && a.Value.Int64() <= untasked {
			select {
			case l.saved <- struct{}{}:
			default: // one is waiting to be taken already; never block governord
			}
		}
		return true
	})
	return nil
}

// waitForReclaim waits until governord holds the root and the tenant only,
// and has saved a snapshot of that: what an idle governord does once the
// retentions have passed.
func waitForReclaim(t *testing.T, srv *server.Server, snaps *reclaimedSnapshots) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for govtest.Metric(t, srv, "governor_nodes") > untasked {
		<-tick.C
	}
	// The snapshot comes with governord's next second; a governord that
	// never takes it still gets its heap measured, and fails for it.
	select {
	case <-snaps.saved:
	case <-time.After(30 * time.Second):
		t.Errorf("no snapshot of the %d nodes left was saved within 30 s of their reclaim", untasked)
	}
}

// heapFigures is the process's heap after a collection.
type heapFigures struct {
	live, inUse, released, rss uint64
}

func (h heapFigures) String() string {
	return fmt.Sprintf("heap live %.1f MB, in use %.1f MB, released to the OS %.1f MB; RSS %.1f MB",
		mb(h.live), mb(h.inUse), mb(h.released), mb(h.rss))
}

func mb(b uint64) float64 { return float64(b) / 1e6 }

// readHeap collects twice (the second frees what the first's finalizers
// let go) and reads the heap: governord's, its clients' and the test's,
// all in this process.
func readHeap(t *testing.T, srv *server.Server) heapFigures {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return heapFigures{live: ms.HeapAlloc, inUse: ms.HeapInuse, released: ms.HeapReleased,
		rss: uint64(govtest.Metric(t, srv, "process_resident_memory_bytes"))}
}

func writeHeapProfile(t *testing.T, path string) {
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		t.Fatalf("heap profile: %v", err)
	}
}
