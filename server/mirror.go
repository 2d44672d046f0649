package server

import (
	"fmt"
	"runtime"
	"sync"

	"github.com/governor-project/governor/governor/engine"
)

// mirror is a second engine that applies every event the live engine
// emits, so that a snapshot is taken from it rather than from the live
// engine. Taking a snapshot holds the engine's lock for about a microsecond
// per node, and every call waits meanwhile; the mirror's lock is nobody
// else's. It costs a second copy of the state in memory, and the CPU of
// applying each event twice.
//
// Its work is done in pieces with a pause between them, in which the
// goroutines serving calls run: on one core, Go lets a goroutine run for
// 10 ms or more before it preempts it, and a snapshot of a large tree took
// up to a second, in stretches of 20–80 ms that every call in flight
// waited behind (issue 27).
//
// The mirror never decides anything: it is tidied (engine.Tidy), never
// reaped, and it tells nobody anything.
type mirror struct {
	cfg engine.Config

	mu      sync.Mutex // guards pending only: Emit appends under the live engine's lock
	pending []engine.Event

	eng *engine.Engine // used by one goroutine at a time (start, then the snapshotter)

	// pause lets calls run between two pieces of the mirror's work
	// (catching up, capturing a snapshot): runtime.Gosched, or a test's
	// counter.
	pause func()
	// encoded is the size of the last snapshot encoded from the mirror:
	// the next one is about as large.
	encoded int
}

// mirrorApplyChunk is how many queued events the mirror applies between
// two pauses: a fraction of a millisecond.
const mirrorApplyChunk = 256

// newMirror builds a mirror of live, which must not change meanwhile: the
// server builds it before it serves.
func newMirror(cfg engine.Config, live *engine.Engine) (*mirror, error) {
	cfg.Sink, cfg.Notifier = nil, nil
	m := &mirror{cfg: cfg, pause: runtime.Gosched}
	if err := m.rebuild(live); err != nil {
		return nil, err
	}
	return m, nil
}

// rebuild makes the mirror a copy of live again, from live's snapshot: what
// it had queued is in that snapshot, or after it.
func (m *mirror) rebuild(live *engine.Engine) error {
	eng, err := engine.New(m.cfg)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	snap := live.Snapshot()
	if err := eng.Restore(snap); err != nil {
		return fmt.Errorf("mirror the engine: %w", err)
	}
	m.eng = eng
	// Events emitted before the snapshot was taken are in it.
	m.pending = dropThrough(m.pending, snap.Seq)
	return nil
}

func dropThrough(evs []engine.Event, seq uint64) []engine.Event {
	i := 0
	for i < len(evs) && evs[i].Seq <= seq {
		i++
	}
	return append([]engine.Event(nil), evs[i:]...)
}

// add queues an event the live engine emitted. It is called under the live
// engine's lock, so it only appends.
func (m *mirror) add(ev engine.Event) {
	m.mu.Lock()
	m.pending = append(m.pending, ev)
	m.mu.Unlock()
}

// catchUp applies the events queued so far and tidies the mirror, pausing
// after every mirrorApplyChunk events. If they do not apply (a bug: the
// mirror went its own way), the mirror is built again from live, once,
// under live's lock.
func (m *mirror) catchUp(live *engine.Engine) error {
	m.mu.Lock()
	evs := m.pending
	m.pending = nil
	m.mu.Unlock()
	for len(evs) > 0 {
		n := min(len(evs), mirrorApplyChunk)
		if err := m.eng.Apply(evs[:n]...); err != nil {
			if rerr := m.rebuild(live); rerr != nil {
				return fmt.Errorf("the mirror failed to apply events (%v) and to be rebuilt: %w", err, rerr)
			}
			return fmt.Errorf("the mirror failed to apply events and was rebuilt from the engine: %w", err)
		}
		evs = evs[n:]
		m.pause()
	}
	m.eng.Tidy()
	return nil
}

// nodes is how many nodes the mirror holds, as of its last catch-up.
func (m *mirror) nodes() int { return m.eng.Stats().Nodes }

// snapshot catches up and returns the mirror's snapshot: the live engine's
// state as of the newest event it had emitted.
func (m *mirror) snapshot(live *engine.Engine) (engine.Snapshot, error) {
	if err := m.catchUp(live); err != nil {
		return engine.Snapshot{}, err
	}
	return m.eng.SnapshotPausing(m.pause), nil
}
