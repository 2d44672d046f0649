package store_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/governor-project/governor/store"
)

// event stands in for the engine's events.
type event struct {
	seq  uint64
	note string
}

func encodeEvent(e event) (store.Record, error) {
	return store.Record{Seq: e.seq, Data: fmt.Appendf(nil, "e%d%s", e.seq, e.note)}, nil
}

// engine stands in for the engine: a mutex, a seq counter and a Log it
// emits to under the mutex, as the real one does.
type engine struct {
	mu  sync.Mutex
	seq uint64
	log *store.Log[event]
}

// apply makes one change and returns its seq.
func (e *engine) apply() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.seq++
	e.log.Emit(event{seq: e.seq})
	return e.seq
}

// batchSizes collects what LogOptions.Observe reports.
type batchSizes struct {
	mu    sync.Mutex
	sizes []int
}

func (b *batchSizes) observe(n int, _ time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.sizes = append(b.sizes, n)
}

func (b *batchSizes) get() []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.sizes)
}

// running is a Log's Run in its own goroutine, owned by the test.
type running struct {
	cancel context.CancelFunc
	done   chan error
}

// startRun starts l.Run; the test must stop it, and cleanup makes sure.
func startRun[E any](t testing.TB, l *store.Log[E]) *running {
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- l.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-r.done // a second receive after stop() would block: done is refilled there
	})
	return r
}

// stop cancels Run and returns what it returned.
func (r *running) stop() error {
	r.cancel()
	err := <-r.done
	r.done <- err // for the cleanup
	return err
}

// wait returns what Run returned without cancelling it.
func (r *running) wait() error {
	err := <-r.done
	r.done <- err
	return err
}

// gateStore holds every Append until the test lets it through, and keeps
// the order of what reached the inner store.
type gateStore struct {
	store.Store
	entered chan []uint64 // the seqs of an Append now waiting
	release chan struct{}

	mu  sync.Mutex
	ops []string
}

func newGateStore(inner store.Store) *gateStore {
	return &gateStore{Store: inner, entered: make(chan []uint64), release: make(chan struct{})}
}

func (g *gateStore) Append(ctx context.Context, recs []store.Record) error {
	var seqs []uint64
	for _, r := range recs {
		seqs = append(seqs, r.Seq)
	}
	g.entered <- seqs
	<-g.release
	err := g.Store.Append(ctx, recs)
	if err == nil {
		g.note("append %d..%d", recs[0].Seq, recs[len(recs)-1].Seq)
	}
	return err
}

func (g *gateStore) SaveSnapshot(ctx context.Context, seq uint64, data []byte) error {
	err := g.Store.SaveSnapshot(ctx, seq, data)
	if err == nil {
		g.note("snapshot %d", seq)
	}
	return err
}

// FinishSnapshot is where a snapshot the Log saves in parts takes effect.
func (g *gateStore) FinishSnapshot(ctx context.Context, seq uint64, size int64) error {
	err := g.Store.FinishSnapshot(ctx, seq, size)
	if err == nil {
		g.note("snapshot %d", seq)
	}
	return err
}

func (g *gateStore) note(format string, args ...any) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.ops = append(g.ops, fmt.Sprintf(format, args...))
}

func (g *gateStore) getOps() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.ops)
}

// pass lets the next Append through and returns its seqs.
func (g *gateStore) pass(t testing.TB) []uint64 {
	t.Helper()
	seqs := <-g.entered
	g.release <- struct{}{}
	return seqs
}

// watchStore records the newest seq whose Append has returned, to check
// that WaitDurable never returns before its record is in the store.
type watchStore struct {
	store.Store
	durable atomic.Uint64
}

func (w *watchStore) Append(ctx context.Context, recs []store.Record) error {
	err := w.Store.Append(ctx, recs)
	if err == nil && len(recs) > 0 {
		w.durable.Store(recs[len(recs)-1].Seq)
	}
	return err
}

func seqRange(from, to uint64) []uint64 {
	var s []uint64
	for i := from; i <= to; i++ {
		s = append(s, i)
	}
	return s
}

// TestStoreLogConcurrent: many goroutines change the engine and wait for
// durability, on every backend; every wait ends after its record is stored,
// batches form by themselves, and the log is whole after a restart.
func TestStoreLogConcurrent(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			const workers = 32
			perWorker := 200
			if testing.Short() {
				perWorker = 20
			}
			open := b.fresh(t)
			st := open()
			w := &watchStore{Store: st}
			var sizes batchSizes
			e := &engine{}
			e.log = store.NewLog(w, encodeEvent, store.LogOptions{Observe: sizes.observe})
			run := startRun(t, e.log)

			var wg sync.WaitGroup
			errc := make(chan error, workers)
			for range workers {
				wg.Go(func() {
					for range perWorker {
						seq := e.apply()
						if err := e.log.WaitDurable(context.Background(), seq); err != nil {
							errc <- fmt.Errorf("WaitDurable(%d): %w", seq, err)
							return
						}
						if d := w.durable.Load(); d < seq {
							errc <- fmt.Errorf("WaitDurable(%d) returned with only %d stored", seq, d)
							return
						}
					}
				})
			}
			wg.Wait()
			close(errc)
			for err := range errc {
				t.Error(err)
			}
			if err := run.stop(); err != nil {
				t.Fatalf("Run = %v, want nil", err)
			}

			n := uint64(workers * perWorker)
			if got := e.log.Committed(); got != n {
				t.Errorf("Committed = %d, want %d", got, n)
			}
			got := sizes.get()
			total, most := 0, 0
			for _, s := range got {
				total += s
				most = max(most, s)
			}
			t.Logf("%d records in %d commits, largest batch %d", total, len(got), most)
			if total != int(n) {
				t.Errorf("Observe saw %d records, want %d", total, n)
			}
			// A durable commit takes long enough for the other workers to
			// pile up behind it. (In memory a commit can outrun them.)
			if b.name != "memory" && most < 2 {
				t.Errorf("largest batch %d: no group commit happened", most)
			}

			st.Close()
			st = open()
			defer st.Close()
			v := loadAll(t, st)
			if len(v.recs) != int(n) || v.recs[0].Seq != 1 || v.recs[n-1].Seq != n || string(v.recs[n-1].Data) != fmt.Sprintf("e%d", n) {
				t.Errorf("after reopen: %s, want 1..%d", fmtRecs(v.recs), n)
			}
		})
	}
}

// TestStoreLogBatching: what is emitted while a commit is in flight goes out
// together in the next one, and MaxBatch splits a backlog.
func TestStoreLogBatching(t *testing.T) {
	for _, tc := range []struct {
		maxBatch int
		want     [][]uint64
	}{
		{0, [][]uint64{{1}, seqRange(2, 101)}},
		{40, [][]uint64{{1}, seqRange(2, 41), seqRange(42, 81), seqRange(82, 101)}},
	} {
		t.Run(fmt.Sprintf("MaxBatch=%d", tc.maxBatch), func(t *testing.T) {
			g := newGateStore(store.NewMemory())
			var sizes batchSizes
			e := &engine{}
			e.log = store.NewLog(g, encodeEvent, store.LogOptions{MaxBatch: tc.maxBatch, Observe: sizes.observe})
			run := startRun(t, e.log)

			e.apply()
			var got [][]uint64
			got = append(got, <-g.entered) // the first commit is in flight
			for range 100 {
				e.apply()
			}
			g.release <- struct{}{}
			for len(got) < len(tc.want) {
				got = append(got, g.pass(t))
			}
			if err := e.log.WaitDurable(context.Background(), 101); err != nil {
				t.Fatalf("WaitDurable(101): %v", err)
			}
			if !slices.EqualFunc(got, tc.want, slices.Equal) {
				t.Errorf("batches = %v, want %v", got, tc.want)
			}
			var wantSizes []int
			for _, w := range tc.want {
				wantSizes = append(wantSizes, len(w))
			}
			if s := sizes.get(); !slices.Equal(s, wantSizes) {
				t.Errorf("Observe saw %v, want %v", s, wantSizes)
			}
			if err := run.stop(); err != nil {
				t.Errorf("Run = %v", err)
			}
		})
	}
}

// TestStoreLogFailedCommit: the first failed Append stops Run with its
// error, every waiter gets it, and nothing is committed after it.
func TestStoreLogFailedCommit(t *testing.T) {
	ctx := context.Background()
	errDisk := errors.New("disk on fire")
	mem := store.NewMemory()
	e := &engine{}
	e.log = store.NewLog(mem, encodeEvent, store.LogOptions{})
	run := startRun(t, e.log)

	for range 5 {
		e.apply()
	}
	if err := e.log.WaitDurable(ctx, 5); err != nil {
		t.Fatalf("WaitDurable(5): %v", err)
	}

	mem.FailAppends(errDisk)
	var wg sync.WaitGroup
	waitErrs := make(chan error, 10)
	for range 10 {
		seq := e.apply()
		wg.Go(func() { waitErrs <- e.log.WaitDurable(ctx, seq) })
	}
	if err := run.wait(); !errors.Is(err, errDisk) {
		t.Fatalf("Run = %v, want errDisk", err)
	}
	wg.Wait()
	close(waitErrs)
	for err := range waitErrs {
		if !errors.Is(err, errDisk) {
			t.Errorf("WaitDurable after the failure = %v, want errDisk", err)
		}
	}

	// The disk comes back, but the Log stays dead.
	mem.FailAppends(nil)
	seq := e.apply()
	if err := e.log.WaitDurable(ctx, seq); !errors.Is(err, errDisk) {
		t.Errorf("WaitDurable(%d) after the failure = %v, want errDisk", seq, err)
	}
	if err := e.log.WaitDurable(ctx, 5); err != nil {
		t.Errorf("WaitDurable(5), committed before the failure = %v, want nil", err)
	}
	if err := e.log.SaveSnapshot(ctx, 5, []byte("s")); !errors.Is(err, errDisk) {
		t.Errorf("SaveSnapshot after the failure = %v, want errDisk", err)
	}
	if err := e.log.Run(ctx); !errors.Is(err, errDisk) {
		t.Errorf("Run again = %v, want errDisk", err)
	}
	if got := e.log.Committed(); got != 5 {
		t.Errorf("Committed = %d, want 5", got)
	}
	v := loadAll(t, mem)
	if len(v.recs) != 5 || v.recs[4].Seq != 5 {
		t.Errorf("store holds %s, want 1..5", fmtRecs(v.recs))
	}
}

// TestStoreLogEncodeError: an event that cannot be encoded is a failed
// commit too; the log must not skip it and leave a hole.
func TestStoreLogEncodeError(t *testing.T) {
	errBad := errors.New("cannot encode")
	encode := func(e event) (store.Record, error) {
		if e.seq == 3 {
			return store.Record{}, errBad
		}
		return encodeEvent(e)
	}
	e := &engine{}
	e.log = store.NewLog(store.NewMemory(), encode, store.LogOptions{})
	run := startRun(t, e.log)
	for range 4 {
		e.apply()
	}
	if err := e.log.WaitDurable(context.Background(), 4); !errors.Is(err, errBad) {
		t.Errorf("WaitDurable(4) = %v, want errBad", err)
	}
	if err := run.wait(); !errors.Is(err, errBad) {
		t.Errorf("Run = %v, want errBad", err)
	}
	if c := e.log.Committed(); c > 2 {
		t.Errorf("Committed = %d, want at most 2", c)
	}
}

// TestStoreLogSnapshotOrder: a snapshot waits for the records it covers,
// then replaces them.
func TestStoreLogSnapshotOrder(t *testing.T) {
	ctx := context.Background()
	mem := store.NewMemory()
	g := newGateStore(mem)
	e := &engine{}
	e.log = store.NewLog(g, encodeEvent, store.LogOptions{})
	run := startRun(t, e.log)

	e.apply()
	<-g.entered // append 1 in flight
	e.apply()
	e.apply()
	snapDone := make(chan error, 1)
	go func() { snapDone <- e.log.SaveSnapshot(ctx, 3, []byte("s3")) }()

	// A snapshot past what was emitted could never be saved.
	if err := e.log.SaveSnapshot(ctx, 4, []byte("s4")); !errors.Is(err, store.ErrSnapshotSeq) {
		t.Errorf("SaveSnapshot(4) with 3 emitted = %v, want ErrSnapshotSeq", err)
	}

	g.release <- struct{}{} // append 1 done
	if got := g.pass(t); !slices.Equal(got, []uint64{2, 3}) {
		t.Errorf("second batch = %v, want [2 3]", got)
	}
	if err := <-snapDone; err != nil {
		t.Fatalf("SaveSnapshot(3): %v", err)
	}
	if ops, want := g.getOps(), []string{"append 1..1", "append 2..3", "snapshot 3"}; !slices.Equal(ops, want) {
		t.Errorf("store saw %q, want %q", ops, want)
	}

	// A snapshot of what is already committed goes straight through, and
	// the log goes on after it.
	e.apply()
	g.pass(t)
	if err := e.log.SaveSnapshot(ctx, 4, []byte("s4")); err != nil {
		t.Fatalf("SaveSnapshot(4): %v", err)
	}
	e.apply()
	g.pass(t)
	if err := e.log.WaitDurable(ctx, 5); err != nil {
		t.Fatal(err)
	}
	if err := run.stop(); err != nil {
		t.Errorf("Run = %v", err)
	}
	v := loadAll(t, mem)
	if !v.hasSnap || v.snapSeq != 4 || string(v.snap) != "s4" || len(v.recs) != 1 || v.recs[0].Seq != 5 {
		t.Errorf("store holds snapshot (%v, %d, %q) and %s, want s4 at 4 then record 5", v.hasSnap, v.snapSeq, v.snap, fmtRecs(v.recs))
	}
}

// TestStoreLogShutdown: cancelling Run commits what was emitted before,
// then everything later is refused with ErrLogStopped.
func TestStoreLogShutdown(t *testing.T) {
	ctx := context.Background()
	g := newGateStore(store.NewMemory())
	e := &engine{}
	e.log = store.NewLog(g, encodeEvent, store.LogOptions{})
	run := startRun(t, e.log)

	e.apply()
	<-g.entered
	for range 4 {
		e.apply()
	}
	snapDone := make(chan error, 1)
	go func() { snapDone <- e.log.SaveSnapshot(ctx, 5, []byte("s5")) }()
	run.cancel()
	g.release <- struct{}{}
	if got := g.pass(t); !slices.Equal(got, seqRange(2, 5)) {
		t.Errorf("flushed %v, want 2..5", got)
	}
	if err := run.wait(); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	if err := e.log.WaitDurable(ctx, 5); err != nil {
		t.Errorf("WaitDurable(5) = %v, want nil", err)
	}
	// The snapshot was asked for before the shutdown: saved or refused, but
	// answered.
	if err := <-snapDone; err != nil && !errors.Is(err, store.ErrLogStopped) {
		t.Errorf("SaveSnapshot(5) = %v", err)
	}

	seq := e.apply()
	if err := e.log.WaitDurable(ctx, seq); !errors.Is(err, store.ErrLogStopped) {
		t.Errorf("WaitDurable(%d) after shutdown = %v, want ErrLogStopped", seq, err)
	}
	if err := e.log.SaveSnapshot(ctx, 5, nil); !errors.Is(err, store.ErrLogStopped) {
		t.Errorf("SaveSnapshot after shutdown = %v, want ErrLogStopped", err)
	}
	if err := e.log.Run(ctx); !errors.Is(err, store.ErrLogStopped) {
		t.Errorf("Run after shutdown = %v, want ErrLogStopped", err)
	}
}

// TestStoreLogShutdownUnderLoad: Run stops even while events keep coming.
func TestStoreLogShutdownUnderLoad(t *testing.T) {
	mem := store.NewMemory()
	e := &engine{}
	e.log = store.NewLog(mem, encodeEvent, store.LogOptions{})
	run := startRun(t, e.log)

	var quit atomic.Bool
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for i := 0; i < 1_000_000 && !quit.Load(); i++ {
				e.apply()
			}
		})
	}
	// Let the emitters get going, then shut down while they run.
	if err := e.log.WaitDurable(context.Background(), 1000); err != nil {
		t.Fatal(err)
	}
	if err := run.stop(); err != nil {
		t.Errorf("Run = %v, want nil", err)
	}
	quit.Store(true)
	wg.Wait()

	c := e.log.Committed()
	if err := e.log.WaitDurable(context.Background(), c+1); !errors.Is(err, store.ErrLogStopped) {
		t.Errorf("WaitDurable(%d) = %v, want ErrLogStopped", c+1, err)
	}
	v := loadAll(t, mem)
	if uint64(len(v.recs)) != c || (c > 0 && v.recs[c-1].Seq != c) {
		t.Errorf("store holds %d records, last %s; Committed = %d", len(v.recs), fmtRecs(v.recs[max(0, len(v.recs)-1):]), c)
	}
}

func TestStoreLogRunTwice(t *testing.T) {
	g := newGateStore(store.NewMemory())
	e := &engine{}
	e.log = store.NewLog(g, encodeEvent, store.LogOptions{})
	run := startRun(t, e.log)
	e.apply()
	<-g.entered // Run is surely running
	if err := e.log.Run(context.Background()); !errors.Is(err, store.ErrLogRunning) {
		t.Errorf("second Run = %v, want ErrLogRunning", err)
	}
	g.release <- struct{}{}
	if err := run.stop(); err != nil {
		t.Errorf("Run = %v", err)
	}
}

func TestStoreLogWaitDurable(t *testing.T) {
	l := store.NewLog(store.NewMemory(), encodeEvent, store.LogOptions{Committed: 7})
	if err := l.WaitDurable(context.Background(), 7); err != nil {
		t.Errorf("WaitDurable(7) with Committed 7 = %v, want nil", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := l.WaitDurable(ctx, 8); !errors.Is(err, context.Canceled) {
		t.Errorf("WaitDurable(8) with a cancelled ctx = %v, want context.Canceled", err)
	}
	if c := l.Committed(); c != 7 {
		t.Errorf("Committed = %d, want 7", c)
	}
}

// TestStoreLogResume: a Log started from what Load reported continues the
// stored log.
func TestStoreLogResume(t *testing.T) {
	ctx := context.Background()
	mem := store.NewMemory()
	mustAppend(t, mem, recs(1, 3))
	if err := mem.SaveSnapshot(ctx, 2, []byte("s2")); err != nil {
		t.Fatal(err)
	}
	var last uint64
	err := mem.Load(ctx, store.LoadFuncs{
		Snapshot: func(seq uint64, _ []byte) error { last = seq; return nil },
		Record:   func(r store.Record) error { last = r.Seq; return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	e := &engine{seq: last}
	e.log = store.NewLog(mem, encodeEvent, store.LogOptions{Committed: last})
	run := startRun(t, e.log)
	seq := e.apply()
	if err := e.log.WaitDurable(ctx, seq); err != nil || seq != 4 {
		t.Errorf("WaitDurable(%d) = %v, want seq 4 committed", seq, err)
	}
	if err := run.stop(); err != nil {
		t.Error(err)
	}
	v := loadAll(t, mem)
	if v.snapSeq != 2 || len(v.recs) != 2 || v.recs[1].Seq != 4 {
		t.Errorf("store holds snapshot %d and %s, want 2 then 3..4", v.snapSeq, fmtRecs(v.recs))
	}
}

// stepStore notes the steps of saving a snapshot between Appends, and can
// hold the first part of a snapshot until the test lets it through.
type stepStore struct {
	store.Store
	hold    bool
	entered chan struct{}
	release chan struct{}
	failAt  atomic.Int64 // a part at this offset fails; -1: none

	mu  sync.Mutex
	ops []string
}

func newStepStore(inner store.Store) *stepStore {
	s := &stepStore{Store: inner, entered: make(chan struct{}), release: make(chan struct{})}
	s.failAt.Store(-1)
	return s
}

func (s *stepStore) note(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ops = append(s.ops, fmt.Sprintf(format, args...))
}

func (s *stepStore) getOps() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.ops)
}

var errPartFailed = errors.New("part failed")

func (s *stepStore) Append(ctx context.Context, recs []store.Record) error {
	err := s.Store.Append(ctx, recs)
	if err == nil {
		s.note("append %d..%d", recs[0].Seq, recs[len(recs)-1].Seq)
	}
	return err
}

func (s *stepStore) WriteSnapshotPart(ctx context.Context, seq uint64, off int64, part []byte) error {
	if off == 0 && s.hold {
		s.entered <- struct{}{}
		<-s.release
	}
	if off == s.failAt.Load() {
		return errPartFailed
	}
	err := s.Store.WriteSnapshotPart(ctx, seq, off, part)
	if err == nil {
		s.note("part %d@%d", seq, off)
	}
	return err
}

func (s *stepStore) FinishSnapshot(ctx context.Context, seq uint64, size int64) error {
	err := s.Store.FinishSnapshot(ctx, seq, size)
	if err == nil {
		s.note("finish %d", seq)
	}
	return err
}

func (s *stepStore) Tidy(ctx context.Context) (bool, error) {
	more, err := s.Store.Tidy(ctx)
	s.note("tidy")
	return more, err
}

// TestStoreLogSnapshotInPartsBetweenCommits: a snapshot is written a part
// at a time, and a commit waiting meanwhile goes between two parts, not
// after the whole snapshot.
func TestStoreLogSnapshotInPartsBetweenCommits(t *testing.T) {
	ctx := context.Background()
	st := newStepStore(store.NewMemory())
	st.hold = true
	e := &engine{}
	e.log = store.NewLog(st, encodeEvent, store.LogOptions{SnapshotPart: 4})
	startRun(t, e.log)
	for range 3 {
		if err := e.log.WaitDurable(ctx, e.apply()); err != nil {
			t.Fatal(err)
		}
	}
	saved := make(chan error, 1)
	go func() { saved <- e.log.SaveSnapshot(ctx, 3, []byte("twelve bytes")) }()
	<-st.entered // the first part is being written
	seq := e.apply()
	st.release <- struct{}{}
	if err := e.log.WaitDurable(ctx, seq); err != nil {
		t.Fatal(err)
	}
	if err := <-saved; err != nil {
		t.Fatalf("SaveSnapshot: %v", err)
	}
	want := []string{"append 1..1", "append 2..2", "append 3..3", "part 3@0", "append 4..4", "part 3@4", "part 3@8", "finish 3"}
	if ops := st.getOps(); !slices.Equal(ops[:min(len(ops), len(want))], want) {
		t.Errorf("store saw %q, want %q first", ops, want)
	}
	// Then it tidies, and stops once there is nothing more.
	e.log.WaitDurable(ctx, e.apply())
	if ops := st.getOps(); !slices.Contains(ops, "tidy") {
		t.Errorf("store saw %q: no tidy after the snapshot", ops)
	}
	var got []byte
	if err := st.Load(ctx, store.LoadFuncs{Snapshot: func(_ uint64, d []byte) error { got = d; return nil }}); err != nil || string(got) != "twelve bytes" {
		t.Errorf("Load: snapshot %q, %v", got, err)
	}
}

// TestStoreLogSnapshotPartFails: a part that fails fails SaveSnapshot, not
// the Log, and the snapshot before it stays.
func TestStoreLogSnapshotPartFails(t *testing.T) {
	ctx := context.Background()
	st := newStepStore(store.NewMemory())
	st.failAt.Store(4)
	e := &engine{}
	e.log = store.NewLog(st, encodeEvent, store.LogOptions{SnapshotPart: 4})
	startRun(t, e.log)
	seq := e.apply()
	if err := e.log.SaveSnapshot(ctx, seq, []byte("twelve bytes")); !errors.Is(err, errPartFailed) {
		t.Fatalf("SaveSnapshot with a failing part = %v, want errPartFailed", err)
	}
	if err := e.log.WaitDurable(ctx, e.apply()); err != nil {
		t.Fatalf("the Log stopped after a failed snapshot: %v", err)
	}
	st.failAt.Store(-1)
	if err := e.log.SaveSnapshot(ctx, 2, []byte("ok")); err != nil {
		t.Fatal(err)
	}
}
