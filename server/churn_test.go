package server_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/governor/engine"
	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/server"
	"github.com/governor-project/governor/server/serverconfig"
)

// TestTaskChurnStaysFlat is issue 10's test of growth: tasks created,
// charged and closed through the SDK without end, on SQLite with
// snapshots. Once a retention has passed, the live heap, the nodes held
// and the snapshot stay flat, and another tenant's p99 call latency stays
// within 2x of its value before the load.
//
// By default it runs 20,000 tasks with a 2 s retention, in about 30 s, and
// checks that they stay flat; it reports the other tenant's latency without
// judging it, since a few hundred calls a window on a shared machine (and
// beside the other packages' tests) make no steady p99. The long run is on
// demand, and judges both:
//
//	GOVERNOR_CHURN_TASKS=1000000 go test ./server -run TestTaskChurnStaysFlat -v -timeout 2h
//
// with node_retention 1m and snapshot_every 100000, as a file would set
// them. GOVERNOR_CHURN_RATE sets the tasks per second (default 1,000; 0:
// as fast as they go), so that the probe measures growth, not a saturated
// machine. docs/governord-performance.md has its figures.
func TestTaskChurnStaysFlat(t *testing.T) {
	if testing.Short() {
		t.Skip("a load test")
	}
	c := churnConfig{tasks: 20_000, retention: 2 * time.Second, snapEvery: 6_000, rate: 1000, idleFor: 3 * time.Second}
	if v := os.Getenv("GOVERNOR_CHURN_TASKS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1000 {
			t.Fatalf("GOVERNOR_CHURN_TASKS=%q: want a number of tasks, at least 1000", v)
		}
		c = churnConfig{tasks: n, retention: time.Minute, snapEvery: 100_000, rate: c.rate, idleFor: 10 * time.Second, long: true}
	}
	if v := os.Getenv("GOVERNOR_CHURN_RATE"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			t.Fatalf("GOVERNOR_CHURN_RATE=%q: want tasks per second (0: no cap)", v)
		}
		c.rate = n
	}

	cfg := govtest.Config()
	cfg.Store = serverconfig.StoreConfig{Driver: "sqlite", DSN: filepath.Join(t.TempDir(), "churn.db"), SnapshotEvery: c.snapEvery}
	cfg.NodeRetention = c.retention
	cfg.ReapInterval = 100 * time.Millisecond
	cfg.Tenants = append(cfg.Tenants, serverconfig.TenantConfig{Name: "probe", APIKey: "probe-key-0123456789", Weight: 1})
	snaps := &snapshotLog{}
	srv, err := server.Start(context.Background(), cfg, slog.New(snaps))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	dial := func(key string) *governor.Client {
		c, err := governor.Dial(context.Background(), governor.WithAddr(srv.Addr()), governor.WithAPIKey(key))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}

	// The other tenant, alone first: its idle latency.
	p := newProbe(dial("probe-key-0123456789"))
	_, p.task, err = p.c.NewTask(context.Background(), governor.Spec{Name: "probe"})
	if err != nil {
		t.Fatal(err)
	}
	stopProbe := make(chan struct{})
	probeDone := make(chan struct{})
	go p.run(stopProbe, probeDone)
	defer func() {
		close(stopProbe)
		<-probeDone
		if err := p.failed(); err != nil {
			t.Errorf("the other tenant's call failed: %v", err)
		}
	}()
	idle, err := p.takeAtLeast(int(c.idleFor / probeEvery))
	if err != nil {
		t.Fatalf("the other tenant, idle: %v", err)
	}
	idleP50, idleP99 := percentile(tookOf(idle, nil), 0.5), percentile(tookOf(idle, nil), 0.99)
	t.Logf("idle: %d probe calls, p50 %v, p99 %v", len(idle), idleP50, idleP99)

	clients := make([]*governor.Client, churnWorkers)
	for i := range clients {
		clients[i] = dial(govtest.TenantKey)
	}
	rows, elapsed := c.load(t, clients, func(done int64, at time.Duration) churnWindow {
		calls := p.take()
		lat := tookOf(calls, nil)
		calm := tookOf(calls, func(c probeCall) bool { return !snaps.during(c.due, c.due.Add(c.took)) })
		return churnWindow{tasks: done, at: at, heap: liveHeap(t), nodes: govtest.Metric(t, srv, "governor_nodes"),
			snapshot: govtest.Metric(t, srv, "governor_snapshot_bytes"), calls: len(lat),
			p50: percentile(lat, 0.5), p99: percentile(lat, 0.99), calmP99: percentile(calm, 0.99), snaps: snaps.take()}
	})
	t.Logf("%d tasks in %v (%.0f tasks/s), %d workers, node_retention %v, snapshot_every %d",
		c.tasks, elapsed.Round(time.Millisecond), float64(c.tasks)/elapsed.Seconds(), churnWorkers, c.retention, c.snapEvery)
	logChurn(t, rows, idleP50, idleP99)

	c.checkFlat(t, rows)
	if !c.long {
		return
	}
	for _, r := range rows {
		if r.p99 > 2*idleP99 {
			t.Errorf("the other tenant's p99 was %v at %d tasks, over 2x its idle %v", r.p99, r.tasks, idleP99)
		}
	}
}

const (
	churnWorkers = 16
	churnWindows = 20
	probeEvery   = 2 * time.Millisecond
)

// churnConfig is one run's shape.
type churnConfig struct {
	tasks     int
	retention time.Duration
	snapEvery int
	rate      int // tasks per second, all workers together; 0: no cap
	idleFor   time.Duration
	long      bool // judge the other tenant's latency too
}

// churnWindow is what was measured at the end of one twentieth of the tasks.
type churnWindow struct {
	tasks                 int64
	at                    time.Duration
	heap, nodes, snapshot float64
	calls                 int
	p50, p99              time.Duration
	calmP99               time.Duration // of the calls no snapshot was being taken during
	snaps                 []snapshotSaved
}

// load runs c.tasks tasks' lives on clients, one worker each, and calls
// measure each time another twentieth of them is done.
func (c churnConfig) load(t *testing.T, clients []*governor.Client, measure func(done int64, at time.Duration) churnWindow) ([]churnWindow, time.Duration) {
	per := int64(c.tasks / churnWindows)
	marks := make(chan int64, churnWindows)
	failed := make(chan error, len(clients))
	stop := make(chan struct{})
	var next, done atomic.Int64
	var wg sync.WaitGroup
	defer func() {
		close(stop)
		wg.Wait()
	}()
	began := time.Now()
	for _, cl := range clients {
		wg.Go(func() {
			due := time.Now()
			for next.Add(1) <= int64(c.tasks) {
				if c.rate > 0 {
					// Each worker's share of the rate, without catching up
					// after a stall: a burst would hold more nodes for a
					// retention than the rate does.
					select {
					case <-stop:
						return
					case <-time.After(time.Until(due)):
					}
					if due = due.Add(time.Duration(len(clients)) * time.Second / time.Duration(c.rate)); due.Before(time.Now()) {
						due = time.Now()
					}
				}
				if err := churnOne(cl); err != nil {
					failed <- err
					return
				}
				if n := done.Add(1); n%per == 0 && n/per <= churnWindows {
					marks <- n
				}
			}
		})
	}
	var rows []churnWindow
	for range churnWindows {
		select {
		case n := <-marks:
			rows = append(rows, measure(n, time.Since(began)))
		case err := <-failed:
			t.Fatalf("a worker failed: %v", err)
		}
	}
	elapsed := time.Since(began)
	return rows, elapsed
}

// checkFlat checks that nothing grows once the load is steady: a retention
// (and the reaper's interval) has passed since it began, so ended tasks
// are being reclaimed, and each worker's session remembers as many request
// ids as it ever will (three a task). The largest figures of the first
// three such windows are the reference, and no later window grows past it
// by more than a quarter (plus a little, for small figures). A reference
// of three windows, rather than one, keeps a window whose rate dipped (a
// loaded machine) from setting the bar low.
func (c churnConfig) checkFlat(t *testing.T, rows []churnWindow) {
	const refWindows = 3
	warm := int64(churnWorkers * engine.RequestMemory / 3)
	ref := slices.IndexFunc(rows, func(r churnWindow) bool {
		return r.at > c.retention+time.Second && r.tasks > warm && r.snapshot > 0
	})
	if ref < 0 || ref+refWindows > len(rows)-4 {
		t.Fatalf("the load was too short for its retention %v: too few windows after it", c.retention)
	}
	base := rows[ref]
	for _, r := range rows[ref+1 : ref+refWindows] {
		base.heap, base.nodes, base.snapshot = max(base.heap, r.heap), max(base.nodes, r.nodes), max(base.snapshot, r.snapshot)
	}
	for i := ref + refWindows; i < len(rows); i++ {
		r := rows[i]
		for _, f := range []struct {
			what       string
			got, base  float64
			slack      float64
			whatsSlack string
		}{
			{"live heap", heapAround(rows, i), base.heap, 8e6, "8 MB"},
			{"nodes held", r.nodes, base.nodes, 1000, "1,000"},
			{"snapshot", r.snapshot, base.snapshot, 256e3, "256 kB"},
		} {
			if f.got > 1.25*f.base+f.slack {
				t.Errorf("%s grew from %.0f (the most from %d to %d tasks) to %.0f at %d tasks (more than 25%% + %s)",
					f.what, f.base, rows[ref].tasks, rows[ref+refWindows-1].tasks, f.got, r.tasks, f.whatsSlack)
			}
		}
	}
}

// heapAround is the median of the live heap at window i and its two
// neighbours (the lesser of two at the end). The live heap is what the
// last collection found, and a snapshot being taken then holds its copy
// of the state and its encoding for a moment (two to three times its size:
// 139 MB in one window of the long run, against 85-128 MB around it);
// growth shows in every window, so it shows in the median too.
func heapAround(rows []churnWindow, i int) float64 {
	var hs []float64
	for _, r := range rows[max(0, i-1):min(len(rows), i+2)] {
		hs = append(hs, r.heap)
	}
	slices.Sort(hs)
	return hs[(len(hs)-1)/2]
}

func logChurn(t *testing.T, rows []churnWindow, idleP50, idleP99 time.Duration) {
	t.Logf("%10s %9s %8s %8s %9s %7s %9s %9s %6s %9s  %s", "tasks", "elapsed", "heap MB", "nodes", "snap MB", "probes",
		"probe p50", "probe p99", "/idle", "p99 calm", "snapshots saved (capture+encode+save ms)")
	for _, r := range rows {
		var ss []string
		for _, x := range r.snaps {
			ss = append(ss, fmt.Sprintf("%.0f+%.0f+%.0f", ms(x.capture), ms(x.encode), ms(x.save)))
		}
		t.Logf("%10d %9v %8.1f %8.0f %9.2f %7d %9v %9v %5.1fx %9v  %s", r.tasks, r.at.Round(100*time.Millisecond), r.heap/1e6,
			r.nodes, r.snapshot/1e6, r.calls, r.p50.Round(10*time.Microsecond), r.p99.Round(10*time.Microsecond),
			float64(r.p99)/float64(idleP99), r.calmP99.Round(10*time.Microsecond), strings.Join(ss, " "))
	}
	t.Logf("idle: p50 %v, p99 %v; p99 calm: of the calls during which no snapshot was being taken",
		idleP50.Round(10*time.Microsecond), idleP99.Round(10*time.Microsecond))
}

// churnOne is one task's life: created, charged once, closed.
func churnOne(c *governor.Client) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, task, err := c.NewTask(ctx, governor.Spec{})
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	if err := task.Consume(ctx, "calls", 1); err != nil {
		return fmt.Errorf("consume: %w", err)
	}
	if err := task.Close(); err != nil {
		return fmt.Errorf("close: %w", err)
	}
	return nil
}

// probe is the other tenant: it starts one consume every probeEvery,
// whether or not the ones before have been answered (as independent
// callers would), and times each from when it was due, so that a stall
// shows in every call it holds up rather than in one.
type probe struct {
	c    *governor.Client
	task *governor.Task

	mu   sync.Mutex
	more *sync.Cond // signalled when a latency or an error comes in
	lat  []probeCall
	err  error // the first call that failed
}

func newProbe(c *governor.Client) *probe {
	p := &probe{c: c}
	p.more = sync.NewCond(&p.mu)
	return p
}

func (p *probe) run(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	var calls sync.WaitGroup
	defer calls.Wait()
	began := time.Now()
	for i := 1; ; i++ {
		due := began.Add(time.Duration(i) * probeEvery)
		select {
		case <-stop:
			return
		case <-time.After(time.Until(due)):
		}
		calls.Go(func() {
			err := p.task.Consume(context.Background(), "probes", 1)
			d := time.Since(due)
			p.mu.Lock()
			defer p.mu.Unlock()
			if err != nil && p.err == nil {
				p.err = err
			} else if err == nil {
				p.lat = append(p.lat, probeCall{due: due, took: d})
			}
			p.more.Broadcast()
		})
	}
}

// take returns the latencies since the last take.
func (p *probe) take() []probeCall {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.lat
	p.lat = nil
	return out
}

// takeAtLeast waits until n latencies are in, and takes them.
func (p *probe) takeAtLeast(n int) ([]probeCall, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.lat) < n && p.err == nil {
		p.more.Wait()
	}
	if p.err != nil {
		return nil, p.err
	}
	out := p.lat
	p.lat = nil
	return out, nil
}

func (p *probe) failed() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// probeCall is one of the other tenant's calls: when it was due, and how
// long after that its answer came.
type probeCall struct {
	due  time.Time
	took time.Duration
}

// tookOf is the latencies of the calls keep keeps (nil: all).
func tookOf(calls []probeCall, keep func(probeCall) bool) []time.Duration {
	var out []time.Duration
	for _, c := range calls {
		if keep == nil || keep(c) {
			out = append(out, c.took)
		}
	}
	return out
}

func percentile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// snapshotLog is governord's logger: it keeps the timings of the snapshots
// saved, and drops the rest.
type snapshotLog struct {
	mu    sync.Mutex
	saved []snapshotSaved
	spans [][2]time.Time // when each snapshot began and was saved; kept
}

type snapshotSaved struct {
	bytes                 int64
	capture, encode, save time.Duration
	took                  time.Duration // the three, and what came between
}

func (l *snapshotLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *snapshotLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *snapshotLog) WithGroup(string) slog.Handler            { return l }

func (l *snapshotLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "snapshot saved" {
		return nil
	}
	var s snapshotSaved
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "bytes":
			s.bytes = a.Value.Int64()
		case "capture":
			s.capture = a.Value.Duration()
		case "encode":
			s.encode = a.Value.Duration()
		case "save":
			s.save = a.Value.Duration()
		case "took":
			s.took = a.Value.Duration()
		}
		return true
	})
	l.mu.Lock()
	l.saved = append(l.saved, s)
	l.spans = append(l.spans, [2]time.Time{r.Time.Add(-s.took), r.Time})
	l.mu.Unlock()
	return nil
}

// during reports whether a snapshot was being taken at some moment from
// from to to.
func (l *snapshotLog) during(from, to time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, sp := range l.spans {
		if sp[0].Before(to) && from.Before(sp[1]) {
			return true
		}
	}
	return false
}

func (l *snapshotLog) take() []snapshotSaved {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.saved
	l.saved = nil
	return out
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// liveHeap is the heap the last garbage collection found live: what the
// process (governord, its clients and this test) holds. It reads the
// runtime's figure rather than forcing a collection, which would load the
// machine the other tenant's latency is measured on.
func liveHeap(t *testing.T) float64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		t.Fatal("the runtime has no /gc/heap/live:bytes")
	}
	return float64(s[0].Value.Uint64())
}
