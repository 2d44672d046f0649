package store

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultMaxBatch is the most records one Append carries when
// LogOptions.MaxBatch is 0. Larger backlogs go out in several transactions,
// back to back.
const DefaultMaxBatch = 8192

// DefaultSnapshotPart is the size of the parts a snapshot is written in
// when LogOptions.SnapshotPart is 0: a few milliseconds of writing, so that
// a commit waits at most about that long behind a snapshot.
const DefaultSnapshotPart = 256 << 10

// LogOptions configures a Log. The zero value is ready to use on an empty
// Store.
type LogOptions struct {
	// Committed is the newest Seq already in the Store (the snapshot's or
	// the last record's, as Load reported). The first event emitted must
	// encode to Committed+1, the next to Committed+2, and so on.
	Committed uint64

	// MaxBatch caps the records in one Append; 0 means DefaultMaxBatch.
	MaxBatch int

	// Observe, if not nil, is called by Run after each successful commit
	// with the number of records and the time the Append took. It runs on
	// the writer goroutine, so it must be quick.
	Observe func(batch int, d time.Duration)

	// SnapshotPart is the size of the parts snapshots are written in; 0
	// means DefaultSnapshotPart.
	SnapshotPart int

	// OnError, if not nil, receives the errors that do not stop the Log: a
	// Tidy that failed (the next snapshot tidies again).
	OnError func(error)
}

// Log commits events to a Store with group commit: the engine Emits events
// under its own lock without waiting, one writer goroutine (Run) commits
// everything pending in one transaction, and callers WaitDurable before they
// reply. While one transaction is in flight new events pile up, so batches
// grow by themselves with load.
//
// Events must be emitted in Seq order, one Seq each, with no gaps: the Log
// and the Store both rely on it. The first failed commit is fatal: the Log
// stops, every waiter gets the error, and nothing more is committed. The
// process is expected to exit and replay the Store on restart.
type Log[E any] struct {
	st       Store
	encode   func(E) (Record, error)
	observe  func(int, time.Duration)
	onError  func(error)
	maxBatch int
	part     int

	committed atomic.Uint64 // written under mu; read without it on fast paths
	wake      chan struct{} // capacity 1: "there may be work" for Run

	mu       sync.Mutex
	pending  []E           // emitted, not yet taken by Run
	spare    []E           // an emptied batch buffer, handed back by Run
	emitted  uint64        // Seq of the newest event emitted
	snaps    []*snapReq    // SaveSnapshot requests, oldest first
	changed  chan struct{} // closed and replaced whenever committed, err or stopped change
	running  bool
	draining bool  // ctx of Run is done: no new events, flush what is pending
	stopped  bool  // Run returned after a clean shutdown
	err      error // the fatal error, once a commit failed
}

type snapReq struct {
	seq  uint64
	data []byte
	done chan error // capacity 1, so Run never waits for a caller that left
}

// NewLog returns a Log that commits to st, turning events into records with
// encode. encode runs on the writer goroutine, outside the engine's lock.
func NewLog[E any](st Store, encode func(E) (Record, error), opts LogOptions) *Log[E] {
	l := &Log[E]{
		st:       st,
		encode:   encode,
		observe:  opts.Observe,
		onError:  opts.OnError,
		maxBatch: opts.MaxBatch,
		part:     opts.SnapshotPart,
		wake:     make(chan struct{}, 1),
		emitted:  opts.Committed,
		changed:  make(chan struct{}),
	}
	if l.maxBatch <= 0 {
		l.maxBatch = DefaultMaxBatch
	}
	if l.part <= 0 {
		l.part = DefaultSnapshotPart
	}
	l.committed.Store(opts.Committed)
	return l
}

// Emit queues e for the next commit. It never blocks on I/O, so it may be
// called under the engine's lock, which is what keeps events in Seq order.
// e is encoded later, on the writer goroutine: it must not share anything
// the engine goes on changing. After the Log has stopped or failed, e is
// dropped, and WaitDurable on its Seq reports why.
func (l *Log[E]) Emit(e E) {
	l.mu.Lock()
	if l.draining || l.stopped || l.err != nil {
		l.mu.Unlock()
		return
	}
	l.pending = append(l.pending, e)
	l.emitted++
	l.mu.Unlock()
	l.poke()
}

// poke wakes Run if it is idle.
func (l *Log[E]) poke() {
	select {
	case l.wake <- struct{}{}:
	default: // a wake-up is already queued
	}
}

// Committed returns the Seq of the newest committed record.
func (l *Log[E]) Committed() uint64 { return l.committed.Load() }

// WaitDurable returns nil once every record with Seq <= seq is committed. It
// returns the fatal error if the Log failed first, an error wrapping
// ErrLogStopped if Run returned without committing seq, or ctx's error.
func (l *Log[E]) WaitDurable(ctx context.Context, seq uint64) error {
	for {
		if l.committed.Load() >= seq {
			return nil
		}
		l.mu.Lock()
		if l.committed.Load() >= seq {
			l.mu.Unlock()
			return nil
		}
		if l.err != nil {
			err := l.err
			l.mu.Unlock()
			return err
		}
		if l.stopped || (l.draining && seq > l.emitted) {
			l.mu.Unlock()
			return fmt.Errorf("store: seq %d not committed: %w", seq, ErrLogStopped)
		}
		ch := l.changed
		l.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// SaveSnapshot saves data as the snapshot at seq, taken by the caller after
// the event with that Seq was emitted. Run saves it once every record up to
// seq is committed, so no record the snapshot depends on can be lost, and
// the Store deletes the records it covers. Run writes it in parts, one
// between each commit and the next (Store.WriteSnapshotPart, then
// FinishSnapshot), and then tidies away what it replaced (Store.Tidy) the
// same way, so that no commit waits long behind a snapshot however large.
// SaveSnapshot returns once the snapshot is the one a restart loads.
//
// data must not change until SaveSnapshot returns. A failed snapshot is
// returned to the caller and does not stop the Log: the Store is left as it
// was. If ctx ends first, SaveSnapshot returns ctx's error and the snapshot
// may still be saved.
func (l *Log[E]) SaveSnapshot(ctx context.Context, seq uint64, data []byte) error {
	req := &snapReq{seq: seq, data: data, done: make(chan error, 1)}
	l.mu.Lock()
	switch {
	case l.err != nil:
		err := l.err
		l.mu.Unlock()
		return err
	case l.stopped || l.draining:
		l.mu.Unlock()
		return fmt.Errorf("store: snapshot at seq %d: %w", seq, ErrLogStopped)
	case seq > l.emitted:
		emitted := l.emitted
		l.mu.Unlock()
		// It would never become ready: Run would hold it forever.
		return fmt.Errorf("store: snapshot at seq %d, newest emitted is %d: %w", seq, emitted, ErrSnapshotSeq)
	}
	l.snaps = append(l.snaps, req)
	l.mu.Unlock()
	l.poke()

	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Run is the Log's single writer. It takes everything pending, encodes it,
// commits it as one Append, and repeats; between commits it takes one step
// of saving the snapshots whose records are all committed (a part, or their
// finish), or of tidying after them.
//
// When ctx is cancelled Run stops taking events (later Emits are dropped and
// their WaitDurable returns ErrLogStopped), commits what was emitted before,
// saves the snapshots that are then ready, and returns nil. A commit already
// started is never cancelled: abandoning it would leave callers unsure
// whether their events are durable.
//
// On the first failed commit Run returns the error and the Log is dead:
// from then on WaitDurable (for anything not committed before), SaveSnapshot
// and Run return that error, and Emit drops its event.
func (l *Log[E]) Run(ctx context.Context) error {
	l.mu.Lock()
	switch {
	case l.err != nil:
		err := l.err
		l.mu.Unlock()
		return err
	case l.stopped:
		l.mu.Unlock()
		return fmt.Errorf("store: run: %w", ErrLogStopped)
	case l.running:
		l.mu.Unlock()
		return fmt.Errorf("store: run: %w", ErrLogRunning)
	}
	l.running = true
	l.mu.Unlock()

	wctx := context.WithoutCancel(ctx)
	var recs []Record // reused between batches
	var saving []*snapWrite
	tidy := false
	for {
		// While a snapshot is being saved, or tidied after, Run does not
		// wait for events; on the way out it finishes saving, and leaves
		// tidying to the next run.
		busy := len(saving) > 0 || (tidy && ctx.Err() == nil)
		batch, snaps, ok := l.next(ctx, busy)
		if !ok {
			return nil
		}
		if len(batch) > 0 {
			var err error
			if recs, err = l.commit(wctx, batch, recs[:0]); err != nil {
				for _, w := range saving {
					w.req.done <- err
				}
				l.fail(err)
				return err
			}
		}
		for _, s := range snaps {
			saving = append(saving, &snapWrite{req: s})
		}
		switch {
		case len(saving) > 0:
			w := saving[0]
			if done, err := l.snapshotStep(wctx, w); done {
				w.req.done <- err
				// Emptied, a re-slice keeps its array, and the array this
				// snapshot's bytes: held until the next snapshot, which an
				// idle governord may never take.
				saving[0] = nil
				saving = saving[1:]
				tidy = tidy || err == nil
			}
		case tidy && ctx.Err() == nil:
			more, err := l.st.Tidy(wctx)
			if err != nil && l.onError != nil {
				l.onError(err)
			}
			tidy = more && err == nil
		}
	}
}

// snapWrite is a snapshot being written, part by part.
type snapWrite struct {
	req   *snapReq
	off   int64 // how much is written
	wrote bool  // a part is written (an empty snapshot has one, empty)
}

// snapshotStep writes the next part of w's snapshot, or, once every part is
// written, finishes it. done says w is over, with err.
func (l *Log[E]) snapshotStep(ctx context.Context, w *snapWrite) (done bool, err error) {
	data := w.req.data
	if !w.wrote || w.off < int64(len(data)) {
		end := min(w.off+int64(l.part), int64(len(data)))
		if err := l.st.WriteSnapshotPart(ctx, w.req.seq, w.off, data[w.off:end]); err != nil {
			return true, err
		}
		w.off, w.wrote = end, true
		return false, nil
	}
	return true, l.st.FinishSnapshot(ctx, w.req.seq, int64(len(data)))
}

// next waits for work and takes it: up to maxBatch pending events, and the
// snapshot requests whose Seq is already committed. When busy (Run has a
// snapshot step to take) it does not wait. It returns ok=false, with the
// Log marked stopped, once ctx is done and nothing is left.
func (l *Log[E]) next(ctx context.Context, busy bool) (batch []E, snaps []*snapReq, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		if ctx.Err() != nil && !l.draining {
			// Close the door first, or a steady stream of Emits would keep
			// the flush going forever.
			l.draining = true
			l.broadcast()
		}
		snaps = l.takeSnaps()
		if len(l.pending) > 0 {
			batch = l.takeBatch()
		}
		if len(batch) > 0 || len(snaps) > 0 || busy {
			return batch, snaps, true
		}
		if l.draining {
			l.stop()
			return nil, nil, false
		}
		l.mu.Unlock()
		select {
		case <-l.wake:
		case <-ctx.Done():
		}
		l.mu.Lock()
	}
}

// takeBatch removes up to maxBatch events from pending. l.mu must be held.
func (l *Log[E]) takeBatch() []E {
	if len(l.pending) <= l.maxBatch {
		// The common case: swap buffers, copy nothing.
		batch := l.pending
		l.pending, l.spare = l.spare, nil
		return batch
	}
	batch := append(l.spare, l.pending[:l.maxBatch]...)
	n := copy(l.pending, l.pending[l.maxBatch:])
	clear(l.pending[n:])
	l.pending = l.pending[:n]
	l.spare = nil
	return batch
}

// takeSnaps removes the snapshot requests that are ready. l.mu must be held.
func (l *Log[E]) takeSnaps() []*snapReq {
	committed := l.committed.Load()
	var ready []*snapReq
	keep := l.snaps[:0]
	for _, s := range l.snaps {
		if s.seq <= committed {
			ready = append(ready, s)
		} else {
			keep = append(keep, s)
		}
	}
	clear(l.snaps[len(keep):])
	l.snaps = keep
	return ready
}

// commit encodes batch into recs and appends it as one transaction.
func (l *Log[E]) commit(ctx context.Context, batch []E, recs []Record) ([]Record, error) {
	for _, e := range batch {
		r, err := l.encode(e)
		if err != nil {
			return recs, fmt.Errorf("store: encode event %d: %w", l.committed.Load()+uint64(len(recs))+1, err)
		}
		recs = append(recs, r)
	}
	start := time.Now()
	if err := l.st.Append(ctx, recs); err != nil {
		return recs, fmt.Errorf("store: commit seq %d..%d: %w", recs[0].Seq, recs[len(recs)-1].Seq, err)
	}
	d := time.Since(start)
	last := recs[len(recs)-1].Seq
	clear(recs) // drop references to the encoded data
	clear(batch)

	l.mu.Lock()
	l.committed.Store(last)
	l.spare = batch[:0]
	l.broadcast()
	l.mu.Unlock()

	if l.observe != nil {
		l.observe(len(batch), d)
	}
	return recs, nil
}

// fail makes err the Log's fatal error.
func (l *Log[E]) fail(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.err = err
	l.running = false
	l.pending, l.spare = nil, nil
	for _, s := range l.snaps {
		s.done <- err
	}
	l.snaps = nil
	l.broadcast()
}

// stop marks a clean shutdown. l.mu must be held.
func (l *Log[E]) stop() {
	l.stopped = true
	l.running = false
	for _, s := range l.snaps {
		s.done <- fmt.Errorf("store: snapshot at seq %d: %w", s.seq, ErrLogStopped)
	}
	l.snaps = nil
	l.broadcast()
}

// broadcast wakes every WaitDurable. l.mu must be held.
func (l *Log[E]) broadcast() {
	close(l.changed)
	l.changed = make(chan struct{})
}
