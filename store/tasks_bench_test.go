package store_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/governor-project/governor/internal/pgtest"
	"github.com/governor-project/governor/store"
)

// BenchmarkLogTasks is issue 19's workload, run for long: a service whose
// 16 workers each create a task, charge it once and close it, three events
// per task, through a Log with group commit, with a snapshot every
// snapshotEvery events. Each event is emitted under the engine's lock and
// waited for (WaitDurable) before the worker's next one, as governord
// replies only once the event is committed; snapshots are taken as
// governord's ticker takes them (at the engine's newest seq, once
// snapshotEvery events have been committed since the last) and saved by the
// Log's writer between commits.
//
// It logs a table (in full with -v), one line per tenth of the tasks: tasks/s, the mean
// commit time and batch, the longest a worker waited for one commit, the
// snapshots saved and how long saving them took (in parts, between
// commits), and the files' sizes at the end of the segment (SQLite: the
// file and its WAL; PostgreSQL: the three tables with their TOAST and
// indexes).
//
// Two snapshot shapes:
//   - size=8MB: every snapshot the size of the first one in issue 19, as
//     the live state of a daemon whose ended tasks are reclaimed would be.
//   - size=grows: 225 bytes per task ever created, on top of 1.3 MB, as
//     governord's engine writes them today (it keeps ended tasks).
//
// By default it runs 30,000 tasks with a snapshot every 9,000 events, the
// same shape in seconds. GOVERNOR_BENCH_LONG=1 runs the full length:
// 1,000,000 tasks and a snapshot every 100,000 events (governord's
// default), 30 snapshots. Run one case at a time, and nothing else heavy
// beside it:
//
//	GOVERNOR_BENCH_LONG=1 go test ./store -run '^$' -bench 'LogTasks/sqlite/size=8MB' -benchtime 1x -timeout 2h -v
func BenchmarkLogTasks(b *testing.B) {
	tasks, every := 30_000, uint64(9_000)
	if os.Getenv("GOVERNOR_BENCH_LONG") != "" {
		tasks, every = 1_000_000, 100_000
	}
	for _, be := range []taskBackend{taskSQLite(), taskPostgres()} {
		b.Run(be.name, func(b *testing.B) {
			for _, shape := range []snapShape{{"8MB", 8 << 20, 0}, {"grows", 1300 << 10, 225}} {
				b.Run("size="+shape.name, func(b *testing.B) {
					for range b.N {
						runTasks(b, be, shape, tasks, every)
					}
				})
			}
		})
	}
}

const (
	taskWorkers  = 16
	taskSegments = 10
)

// snapShape says how large a snapshot is after a number of tasks.
type snapShape struct {
	name    string
	base    int
	perTask int
}

func (s snapShape) size(tasks int) int { return s.base + s.perTask*tasks }

// taskBackend opens a fresh store and reports its size on disk.
type taskBackend struct {
	name string
	open func(b *testing.B) (st store.Store, size func() (db, wal int64))
}

func taskSQLite() taskBackend {
	return taskBackend{name: "sqlite", open: func(b *testing.B) (store.Store, func() (int64, int64)) {
		path := filepath.Join(b.TempDir(), "governor.db")
		st, err := store.OpenSQLite(path)
		if err != nil {
			b.Fatal(err)
		}
		return st, func() (int64, int64) { return statSize(b, path), statSize(b, path+"-wal") }
	}}
}

func taskPostgres() taskBackend {
	return taskBackend{name: "postgres", open: func(b *testing.B) (store.Store, func() (int64, int64)) {
		dsn := pgtest.Schema(b, "governor_bench_")
		ctx := context.Background()
		st, err := store.OpenPostgres(ctx, dsn)
		if err != nil {
			b.Fatal(err)
		}
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { conn.Close(ctx) })
		return st, func() (int64, int64) {
			var n int64
			err := conn.QueryRow(ctx, `SELECT pg_total_relation_size('governor_events') +
				pg_total_relation_size('governor_snapshot') + pg_total_relation_size('governor_sessions')`).Scan(&n)
			if err != nil {
				b.Fatal(err)
			}
			return n, 0 // PostgreSQL's WAL is the server's, not this log's
		}
	}}
}

func statSize(b *testing.B, path string) int64 {
	fi, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		b.Fatal(err)
	}
	return fi.Size()
}

// taskSegment is what happened during one tenth of the tasks.
type taskSegment struct {
	tasks         int
	took          time.Duration
	commits       int64
	events        int64
	commitTime    time.Duration
	snapshots     int
	snapshotTime  time.Duration
	snapshotBytes int
	db, wal       int64
	// maxWait is the longest a worker waited for one event to commit: what
	// a snapshot holds a commit up by shows here.
	maxWait time.Duration
}

// taskStats gathers the Log's commits and the snapshots, by segment.
type taskStats struct {
	mu      sync.Mutex
	current taskSegment
}

func (s *taskStats) observe(n int, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.current.commits++
	s.current.events += int64(n)
	s.current.commitTime += d
}

func (s *taskStats) waited(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.current.maxWait = max(s.current.maxWait, d)
}

func (s *taskStats) snapshot(bytes int, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.current.snapshots++
	s.current.snapshotTime += d
	s.current.snapshotBytes = bytes
}

// cut ends the current segment and starts the next.
func (s *taskStats) cut() taskSegment {
	s.mu.Lock()
	defer s.mu.Unlock()
	seg := s.current
	s.current = taskSegment{}
	return seg
}

func runTasks(b *testing.B, be taskBackend, shape snapShape, tasks int, every uint64) {
	st, size := be.open(b)
	defer st.Close()
	stats := &taskStats{}
	e := &engine{}
	e.log = store.NewLog(st, encodeTaskEvent, store.LogOptions{Observe: stats.observe})
	run := startRun(b, e.log)
	snapData := []byte(snapshotJSON(shape.size(tasks)))

	// The workers: each task is three events, each waited for.
	segment := tasks / taskSegments
	marks := make(chan time.Time, taskSegments)
	var next, done atomic.Int64
	var workers sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	for range taskWorkers {
		workers.Go(func() {
			for next.Add(1) <= int64(tasks) {
				for range 3 {
					began := time.Now()
					if err := e.log.WaitDurable(ctx, e.apply()); err != nil {
						b.Error(err)
						cancel()
						return
					}
					stats.waited(time.Since(began))
				}
				if n := done.Add(1); n%int64(segment) == 0 {
					marks <- time.Now()
				}
			}
		})
	}

	// The snapshots, as governord's ticker takes them.
	var snapper sync.WaitGroup
	snapper.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		var last uint64
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if e.log.Committed() < last+every {
				continue
			}
			e.mu.Lock()
			seq := e.seq
			e.mu.Unlock()
			data := snapData[:shape.size(int(done.Load()))]
			began := time.Now()
			if err := e.log.SaveSnapshot(ctx, seq, data); err != nil {
				if ctx.Err() == nil {
					b.Error(err)
				}
				return
			}
			stats.snapshot(len(data), time.Since(began))
			last = seq
		}
	})

	// The segments, as the workers reach them.
	var segs []taskSegment
	prev := start
	for range taskSegments {
		var at time.Time
		select {
		case at = <-marks:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		seg := stats.cut()
		seg.tasks, seg.took = segment, at.Sub(prev)
		seg.db, seg.wal = size()
		segs = append(segs, seg)
		prev = at
	}
	workers.Wait()
	cancel()
	snapper.Wait()
	elapsed := time.Since(start)
	if err := run.stop(); err != nil {
		b.Fatalf("Run: %v", err)
	}
	logTaskTable(b, segs, every)

	b.ReportMetric(float64(tasks)/elapsed.Seconds(), "tasks/s")
	b.ReportMetric(0, "ns/op") // tasks/s says it
	if len(segs) == taskSegments {
		// How much slower the slowest segment after the first was: the
		// first has no snapshot before it.
		slowest := segs[1].rate()
		var maxDB, maxWAL int64
		for i, s := range segs {
			if i > 0 {
				slowest = min(slowest, s.rate())
			}
			maxDB, maxWAL = max(maxDB, s.db), max(maxWAL, s.wal)
		}
		b.ReportMetric(segs[0].rate()/slowest, "first/slowest")
		b.ReportMetric(float64(maxDB)/1e6, "max-db-MB")
		b.ReportMetric(float64(maxWAL)/1e6, "max-wal-MB")
	}
}

func (s taskSegment) rate() float64 { return float64(s.tasks) / s.took.Seconds() }

func logTaskTable(b *testing.B, segs []taskSegment, every uint64) {
	var t strings.Builder
	fmt.Fprintf(&t, "snapshot every %d events, %d workers\n", every, taskWorkers)
	fmt.Fprintf(&t, "%-17s %8s %9s %10s %11s %5s %11s %10s %9s %9s\n",
		"tasks", "tasks/s", "commit-ms", "ev/commit", "max-wait-ms", "snaps", "snap-s", "snap-MB", "db-MB", "wal-MB")
	done := 0
	for _, s := range segs {
		perCommit, batch := 0.0, 0.0
		if s.commits > 0 {
			perCommit = s.commitTime.Seconds() * 1000 / float64(s.commits)
			batch = float64(s.events) / float64(s.commits)
		}
		fmt.Fprintf(&t, "%7d-%-9d %8.0f %9.2f %10.1f %11.1f %5d %11.2f %10.1f %9.1f %9.1f\n",
			done, done+s.tasks, s.rate(), perCommit, batch, float64(s.maxWait.Microseconds())/1000, s.snapshots, s.snapshotTime.Seconds(),
			float64(s.snapshotBytes)/1e6, float64(s.db)/1e6, float64(s.wal)/1e6)
		done += s.tasks
	}
	b.Log("\n" + t.String())
}

// encodeTaskEvent makes a record about the size of governord's: a task
// created, charged, closed, in turn (130 bytes on average).
func encodeTaskEvent(e event) (store.Record, error) {
	const at = 1796136887885592669
	var data []byte
	switch e.seq % 3 {
	case 0:
		data = fmt.Appendf(nil, `{"seq":%d,"k":3,"at":%d,"s":7,"n":%d,"p":2,"spec":{"name":"task-%d","q":{"http":10}},"rid":"req-%dc","fp":12864257995193528472}`,
			e.seq, at+e.seq, e.seq/3+3, e.seq/3, e.seq/3)
	case 1:
		data = fmt.Appendf(nil, `{"seq":%d,"k":6,"at":%d,"s":7,"n":%d,"res":"http","amt":1,"rid":"req-%du","fp":4460380592637409874}`,
			e.seq, at+e.seq, e.seq/3+3, e.seq/3)
	default:
		data = fmt.Appendf(nil, `{"seq":%d,"k":4,"at":%d,"s":7,"n":%d,"st":2,"rid":"req-%de"}`,
			e.seq, at+e.seq, e.seq/3+3, e.seq/3)
	}
	return store.Record{Seq: e.seq, Data: data}, nil
}

// snapshotJSON is size bytes of text shaped like governord's snapshot, one
// ended task after another, so that PostgreSQL compresses it about as well.
func snapshotJSON(size int) string {
	var s strings.Builder
	s.Grow(size + 256)
	s.WriteString(`{"seq":1,"nodes":[`)
	for i := 0; s.Len() < size; i++ {
		fmt.Fprintf(&s, `{"id":%d,"p":2,"st":2,"spec":{"name":"task-%d","q":{"http":10}},"used":{"http":1},"at":%d,"end":%d,"rid":["req-%dc","req-%du","req-%de"]},`,
			i+3, i, 1796136887885592669+i, 1796136887985592669+i, i, i, i)
	}
	return s.String()[:size]
}
