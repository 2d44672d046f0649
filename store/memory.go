package store

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
)

// Memory is a Store held in process memory, for tests and benchmarks. It
// keeps the same rules as the durable backends, and it can be made to fail
// (FailAppends) or "restarted" (Reopen).
type Memory struct {
	mu      sync.Mutex
	state   memState
	failErr error // returned by every Append while non-nil
	closed  bool
}

type memState struct {
	snapSeq uint64
	// snap is the snapshot in the parts it was written in, joined only
	// when loaded; nil when there is no snapshot.
	snap     [][]byte
	recs     []Record
	sessions map[uint64]string // id → token hash; replaced, never changed in place
	// A snapshot being written in parts (WriteSnapshotPart): its seq and
	// what has been written; replaced, never changed in place.
	stagedSeq uint64
	staged    [][]byte
	stagedLen int64
	// Usage rows by key (usage.go). Unlike the rest, changed in place:
	// only Usage and TrimUsage read it, under mu, and Reopen copies it. A
	// copy per Append cost a copy of every row kept, per commit.
	usage map[usageKey]UsageRow
	// Usage rollups by unit and bucket start (rollup.go); each bucket's
	// rows are replaced, never changed in place.
	rollups map[string]map[int64][]RollupRow
}

// NewMemory returns an empty Memory.
func NewMemory() *Memory { return &Memory{} }

// FailAppends makes every later Append return err and store nothing, as a
// broken disk or a lost database would; nil makes Appends work again.
func (m *Memory) FailAppends(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.failErr = err
}

// Reopen returns a new Memory holding a copy of what m has committed, as a
// restarted process would find it on disk. m may be open or closed.
func (m *Memory) Reopen() *Memory {
	m.mu.Lock()
	defer m.mu.Unlock()
	recs := make([]Record, len(m.state.recs))
	copy(recs, m.state.recs) // Data is never modified in place, so sharing it is safe.
	st := m.state
	st.recs = recs
	st.usage = maps.Clone(m.state.usage) // changed in place (memState)
	st.rollups = cloneRollups(m.state.rollups)
	return &Memory{state: st}
}

// last returns the newest Seq held. m.mu must be held.
func (m *Memory) last() uint64 {
	if n := len(m.state.recs); n > 0 {
		return m.state.recs[n-1].Seq
	}
	return m.state.snapSeq
}

// Load implements Store.
func (m *Memory) Load(ctx context.Context, fn LoadFuncs) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return fmt.Errorf("store: load: %w", ErrClosed)
	}
	// Appends only add to the end of recs, and every change to the snapshot
	// or the sessions replaces them whole, so this view stays consistent
	// after the lock is dropped; the funcs run unlocked and may take as long
	// as they like.
	st := m.state
	m.mu.Unlock()

	if st.snap != nil && fn.Snapshot != nil {
		if err := fn.Snapshot(st.snapSeq, bytes.Join(st.snap, nil)); err != nil {
			return fmt.Errorf("store: load snapshot: %w", err)
		}
	}
	if fn.Session != nil {
		for _, id := range slices.Sorted(maps.Keys(st.sessions)) {
			if err := fn.Session(Session{ID: id, TokenHash: st.sessions[id]}); err != nil {
				return fmt.Errorf("store: load sessions: session %d: %w", id, err)
			}
		}
	}
	if fn.Record == nil {
		return nil
	}
	for _, r := range st.recs {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("store: load: %w", err)
		}
		if err := fn.Record(Record{Seq: r.Seq, Data: bytes.Clone(r.Data)}); err != nil {
			return fmt.Errorf("store: load records: record %d: %w", r.Seq, err)
		}
	}
	return nil
}

// Append implements Store.
func (m *Memory) Append(ctx context.Context, recs []Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return fmt.Errorf("store: append: %w", ErrClosed)
	}
	if m.failErr != nil {
		return fmt.Errorf("store: append: %w", m.failErr)
	}
	if err := checkAppend(m.last(), recs); err != nil {
		return err
	}
	if opens, ends := sessionChanges(recs); len(opens) > 0 || len(ends) > 0 {
		if err := m.changeSessions(opens, ends); err != nil {
			return fmt.Errorf("store: append: %w", err)
		}
	}
	m.addUsage(usageRows(recs))
	for _, r := range recs {
		// Copied: the caller may reuse its buffers once Append returns.
		m.state.recs = append(m.state.recs, Record{Seq: r.Seq, Data: bytes.Clone(r.Data)})
	}
	return nil
}

// changeSessions removes the sessions ends and then adds opens, all or
// none. m.mu must be held.
func (m *Memory) changeSessions(opens []Session, ends []uint64) error {
	// A new map, not a change in place: a Load in progress keeps the old one.
	sessions := maps.Clone(m.state.sessions)
	if sessions == nil {
		sessions = make(map[uint64]string)
	}
	for _, id := range ends {
		delete(sessions, id)
	}
	hashes := make(map[string]uint64, len(sessions)+len(opens))
	for id, h := range sessions {
		hashes[h] = id
	}
	for _, o := range opens {
		// The SQL tables' keys: neither the id nor the hash may be taken.
		if _, taken := sessions[o.ID]; taken {
			return fmt.Errorf("session %d is already in the table: %w", o.ID, ErrInvalidRecord)
		}
		if id, taken := hashes[o.TokenHash]; taken {
			return fmt.Errorf("session %d has the token hash of session %d: %w", o.ID, id, ErrInvalidRecord)
		}
		sessions[o.ID], hashes[o.TokenHash] = o.TokenHash, o.ID
	}
	m.state.sessions = sessions
	return nil
}

// AddSessions implements Store.
func (m *Memory) AddSessions(ctx context.Context, rows []Session) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return fmt.Errorf("store: add sessions: %w", ErrClosed)
	}
	for _, o := range rows {
		if err := checkSession(o); err != nil {
			return fmt.Errorf("store: add sessions: %w", err)
		}
	}
	if err := m.changeSessions(rows, nil); err != nil {
		return fmt.Errorf("store: add sessions: %w", err)
	}
	return nil
}

// SaveSnapshot implements Store.
func (m *Memory) SaveSnapshot(ctx context.Context, seq uint64, data []byte) error {
	// Copied before the lock: a large snapshot took tens of milliseconds
	// to copy, and every commit waited for the lock meanwhile (issue 27).
	return m.installSnapshot(seq, [][]byte{bytes.Clone(data)})
}

// installSnapshot makes snap, whose parts no caller holds, the snapshot at
// seq.
func (m *Memory) installSnapshot(seq uint64, snap [][]byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return fmt.Errorf("store: save snapshot: %w", ErrClosed)
	}
	if err := checkSnapshot(seq, m.state.snapSeq, m.last()); err != nil {
		return err
	}
	// A new slice, not a re-slice: a Load in progress keeps the old one.
	// Nil, not recs[:0:0], which would keep the old array, and every
	// record's bytes with it, when no record comes after seq.
	var keep []Record
	for i, r := range m.state.recs {
		if r.Seq > seq {
			keep = append(keep, m.state.recs[i:]...)
			break
		}
	}
	if snap == nil {
		snap = [][]byte{} // an empty snapshot is still a snapshot
	}
	// Usage rows outlive a snapshot, as they do in the tables of the
	// durable stores; usage_retention trims them.
	m.state = memState{snapSeq: seq, snap: snap, recs: keep, sessions: m.state.sessions, usage: m.state.usage, rollups: m.state.rollups}
	return nil
}

// WriteSnapshotPart implements Store.
func (m *Memory) WriteSnapshotPart(ctx context.Context, seq uint64, off int64, part []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return fmt.Errorf("store: write snapshot part: %w", ErrClosed)
	}
	if err := checkSnapshot(seq, m.state.snapSeq, m.last()); err != nil {
		return err
	}
	have, n := m.state.staged, m.state.stagedLen
	if off == 0 || m.state.stagedSeq != seq {
		have, n = nil, 0
	}
	if n != off {
		return fmt.Errorf("part at %d of the snapshot at seq %d, which has %d bytes: %w", off, seq, n, ErrSnapshotSeq)
	}
	// Kept as the parts it came in (each copied: the caller may reuse
	// its buffer). Appended into one array, the staged snapshot was
	// copied again each time it doubled, and a large snapshot cost
	// allocations of tens of megabytes, which the collector charges to
	// the log writer, with every commit behind it (issue 27).
	m.state.stagedSeq, m.state.staged = seq, append(have, append([]byte{}, part...)) // never nil once written
	m.state.stagedLen = n + int64(len(part))
	return nil
}

// FinishSnapshot implements Store. Memory deletes the records the snapshot
// covers at once: it has nothing to gain from waiting for Tidy.
func (m *Memory) FinishSnapshot(ctx context.Context, seq uint64, size int64) error {
	m.mu.Lock()
	staged, stagedSeq, n := m.state.staged, m.state.stagedSeq, m.state.stagedLen
	m.mu.Unlock()
	if stagedSeq != seq || n != size || staged == nil {
		return fmt.Errorf("the snapshot at seq %d has %d bytes written, not %d: %w", seq, n, size, ErrSnapshotSeq)
	}
	// Not copied again: the staged parts are the store's own, and the
	// next part at offset 0 starts a new list.
	return m.installSnapshot(seq, staged)
}

// Tidy implements Store: FinishSnapshot left nothing to do.
func (m *Memory) Tidy(ctx context.Context) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return false, fmt.Errorf("store: tidy: %w", ErrClosed)
	}
	return false, nil
}

// Close implements Store.
func (m *Memory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	return nil
}
