package engine

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"
)

// NodeID names a node. The root is RootID; ids are never reused.
type NodeID int64

// SessionID names a session. System is the engine's own, scoped to the root.
type SessionID int64

// LeaseID is both a lease's name and its fencing token: ids come from one
// counter that only grows, so a larger id is always a later grant.
type LeaseID int64

const (
	// RootID is the id of the root node, which every engine starts with.
	RootID NodeID = 1
	// System is the session of the operator's configuration. It may edit any
	// node, including the root. A server must never let a remote caller act
	// as System; remote callers always hold a real session.
	System SessionID = 0
	// NoCap, given as a quota or limit in an edit or spec, removes that cap.
	NoCap int64 = -1
	// TombstoneTTL is how long an ended lease is remembered.
	TombstoneTTL = time.Minute
	// RequestMemory is how many request ids a session remembers.
	RequestMemory = 1024
	// MaxDepth bounds the tree's depth so every chain walk stays short.
	MaxDepth = 16
	// MaxNameLen bounds node names, resources and classes.
	MaxNameLen = 256
	// DefaultRetention is how long an ended node is kept when
	// Config.Retention is zero (see reclaim.go).
	DefaultRetention = 5 * time.Minute
)

// Clock tells the engine the time. Tests inject a fake one.
type Clock interface {
	Now() time.Time
}

// Sink receives every event, in sequence order, while the engine's lock is
// held. Emit must queue and return; it must never block on I/O.
type Sink interface {
	Emit(Event)
}

// WallClock is the Clock of production: time.Now.
type WallClock struct{}

// Now returns time.Now().
func (WallClock) Now() time.Time { return time.Now() }

// Adaptive configures an AIMD controller for one lease class. It moves the
// root's limit of that class.
type Adaptive struct {
	Class       string
	TargetP95   time.Duration // cut when the p95 latency of releases is above this
	MaxOverload float64       // cut when the share of overloaded releases is above this
	MinLimit    int64
	MaxLimit    int64
	// Interval between decisions. Zero means DefaultAdaptiveInterval.
	Interval time.Duration
	// MinSamples is how many releases an interval needs before the limit
	// moves. Zero means DefaultMinSamples.
	MinSamples int
}

const (
	// DefaultAdaptiveInterval is how often an adaptive limit decides.
	DefaultAdaptiveInterval = time.Second
	// DefaultMinSamples is how many releases an interval needs to decide.
	DefaultMinSamples = 10
	// AdaptiveDecrease is the multiplicative cut.
	AdaptiveDecrease = 0.7
)

// Config is what an engine is built with. It is configuration, not state:
// it is not part of snapshots.
type Config struct {
	Clock    Clock    // nil means WallClock
	Sink     Sink     // nil discards events
	Notifier Notifier // nil tells nobody about changes to delegated budgets
	// Wake, when set, is called when something may fall due sooner than
	// DueIn last said: a charge starts waiting for a rate, queued as it
	// arrives or moved there at its turn in a lease queue (ratewait.go),
	// which a call that releases a slot may do. The caller's timer should
	// read DueIn again. It is called with the engine's lock held, so it
	// must return at once and never call back into the engine.
	Wake     func()
	Adaptive []Adaptive
	// Retention is how long an ended node is kept, answering as ended,
	// before Reap reclaims it (reclaim.go). Zero means DefaultRetention.
	Retention time.Duration
	// Bounds are what each tenant may hold (bounds.go); a zero field is no
	// bound. TenantBounds replaces them for the tenants it names.
	Bounds       Bounds
	TenantBounds map[string]Bounds
	// Near are the near-limit thresholds in percent of a cap, ascending
	// (policy.go); empty means DefaultNear (80 and 90).
	Near []int
	// Location is the time zone of calendar periods (period.go); nil means
	// UTC. The caller resolves it (binaries embed time/tzdata, so that
	// every machine computes the same boundaries); replay never reads it.
	Location *time.Location
}

// Engine is the governed tree. All methods are safe for concurrent use; they
// serialize on one mutex (see SPEC.md for why one lock is enough).
type Engine struct {
	mu       sync.Mutex
	clock    Clock
	sink     Sink
	notifier Notifier
	wake     func()

	seq         uint64
	nextNode    NodeID
	nextSession SessionID
	nextLease   LeaseID

	nodes     map[NodeID]*node
	root      *node
	sessions  map[SessionID]*session
	byToken   map[string]*session
	leases    map[LeaseID]*lease
	tombs     map[LeaseID]tombstone
	tombOrder []LeaseID // tombstones in the order they were made, for purging
	deadlines deadlineHeap
	blocks    map[string]map[LeaseID]*lease        // live blocks by class
	reserved  map[string]map[*reservation]struct{} // live reservations by resource
	slices    map[uint64]*slice                    // live slices of rates by id (slice.go)
	// overridden holds the nodes with a temporary override still to revert
	// (override.go).
	overridden map[NodeID]*node
	// The most nodes and tombstones held since their maps were built
	// (shrink.go).
	nodesMost, tombsMost highWater

	// soonest is when the first open session expires, or earlier: Reap
	// makes it exact, opening a session lowers it, and heartbeats, which
	// only move expiries later, leave it early. Restore zeroes it until the
	// next Reap.
	soonest int64
	// nextReset is when the first quota window of an open node ends, or
	// earlier: resetDue makes it exact, a new window lowers it
	// (period.go). Every live call compares it with its clock.
	nextReset int64

	// Ended nodes waiting for their retention to pass (reclaim.go), oldest
	// first from endedHead, and those found due but still pinned.
	endedQ    []endedEntry
	endedHead int
	pinnedQ   []endedEntry

	// Configuration, not state.
	retention    time.Duration
	bounds       Bounds
	tenantBounds map[string]Bounds
	near         []int
	loc          *time.Location

	// Not state: rebuilt empty by a restart.
	queues   map[string]*classQueue
	adaptive map[string]*controller
	system   *session
	arrival  uint64 // orders waiters of equal priority

	dispatching   bool
	dispatchAgain bool

	// Rate waiters (ratewait.go), not state either: the queues by
	// resource, how many wait in them, and when one may fit next (0:
	// decide at the next tick).
	rateQueues      map[string]*classQueue
	rateWaiting     int
	rateDue         int64
	rateDispatching bool
	rateAgain       bool // a nested dispatchRates asked the outer one to go round again
	replaying       bool // Apply is running: tell nobody anything
}

type discard struct{}

func (discard) Emit(Event) {}

// New returns an engine holding only the root.
func New(cfg Config) (*Engine, error) {
	e := &Engine{
		clock:      cfg.Clock,
		sink:       cfg.Sink,
		notifier:   cfg.Notifier,
		wake:       cfg.Wake,
		nextNode:   RootID + 1,
		nextLease:  1,
		nodes:      make(map[NodeID]*node),
		sessions:   make(map[SessionID]*session),
		byToken:    make(map[string]*session),
		leases:     make(map[LeaseID]*lease),
		tombs:      make(map[LeaseID]tombstone),
		blocks:     make(map[string]map[LeaseID]*lease),
		reserved:   make(map[string]map[*reservation]struct{}),
		slices:     make(map[uint64]*slice),
		queues:     make(map[string]*classQueue),
		rateQueues: make(map[string]*classQueue),
		adaptive:   make(map[string]*controller),
		soonest:    math.MaxInt64,
		nextReset:  math.MaxInt64,
		loc:        cfg.Location,

		retention:    cfg.Retention,
		bounds:       cfg.Bounds,
		tenantBounds: cfg.TenantBounds,
	}
	e.nextSession = 1
	if e.loc == nil {
		e.loc = time.UTC
	}
	e.overridden = make(map[NodeID]*node)
	if e.retention < 0 {
		return nil, invalid("retention %v is negative", e.retention)
	}
	if e.retention == 0 {
		e.retention = DefaultRetention
	}
	for name, b := range cfg.TenantBounds {
		if err := b.validate(); err != nil {
			return nil, fmt.Errorf("tenant %q: %w", name, err)
		}
	}
	if err := cfg.Bounds.validate(); err != nil {
		return nil, err
	}
	if err := validNear(cfg.Near); err != nil {
		return nil, err
	}
	e.near = slices.Clone(cfg.Near)
	if len(e.near) == 0 {
		e.near = slices.Clone(DefaultNear)
	}
	if e.clock == nil {
		e.clock = WallClock{}
	}
	if e.sink == nil {
		e.sink = discard{}
	}
	e.root = newNode(RootID, nil, "root")
	e.nodes[RootID] = e.root
	e.system = &session{id: System, scope: e.root}
	for _, a := range cfg.Adaptive {
		c, err := newController(a, e.now())
		if err != nil {
			return nil, err
		}
		if _, dup := e.adaptive[a.Class]; dup {
			return nil, invalid("adaptive class %q configured twice", a.Class)
		}
		e.adaptive[a.Class] = c
	}
	e.startAdaptive()
	return e, nil
}

// Seq is the sequence number of the last event. A caller that has just read
// or changed state must wait until the store has made Seq durable before it
// replies.
func (e *Engine) Seq() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.seq
}

func (e *Engine) now() int64 { return e.clock.Now().UnixNano() }

// emit numbers ev, applies it and hands it to the sink. Events built by the
// live path are valid by construction, so a failure here is a bug in the
// engine; carrying on would let memory and the record diverge.
func (e *Engine) emit(ev Event) {
	ev.Seq = e.seq + 1
	if err := e.apply(&ev); err != nil {
		panic(fmt.Sprintf("governor/engine: live event %d (%s) failed to apply: %v", ev.Seq, ev.Kind, err))
	}
	e.seq = ev.Seq
	e.sink.Emit(ev)
}

// Apply replays recorded events onto the state, in order, through the same
// code the live path uses. It does not pass them to the sink. Sessions it
// opens get one fresh TTL from the clock, since heartbeats are not recorded.
func (e *Engine) Apply(events ...Event) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.replaying = true
	defer func() { e.replaying = false }()
	for i := range events {
		ev := events[i]
		if ev.Seq != e.seq+1 {
			return fmt.Errorf("%w: event %d follows %d", ErrCorrupt, ev.Seq, e.seq)
		}
		if err := e.apply(&ev); err != nil {
			return fmt.Errorf("event %d (%s): %w", ev.Seq, ev.Kind, err)
		}
		e.seq = ev.Seq
	}
	return nil
}

// Reap ends whatever is overdue: sessions past their TTL, nodes past their
// deadline, and tombstones older than TombstoneTTL. It reclaims nodes ended
// longer ago than the retention (reclaim.go), and lets adaptive limits
// decide. It returns how many sessions and nodes it ended.
func (e *Engine) Reap() (sessions, nodes int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.tick()
	// Only the expired sessions are sorted (by id, so the events come in a
	// deterministic order); this runs every reap interval under the lock.
	var expired []*session
	e.soonest = math.MaxInt64
	for _, s := range e.sessions {
		if s.expired(now) {
			expired = append(expired, s)
		} else if s.id != System {
			e.soonest = min(e.soonest, s.expires)
		}
	}
	slices.SortFunc(expired, func(a, b *session) int { return cmp.Compare(a.id, b.id) })
	for _, s := range expired {
		if e.sessions[s.id] == s { // an earlier end may have dispatched past it
			e.endSession(s, now, EndExpired)
			sessions++
		}
	}
	for e.deadlines.Len() > 0 {
		top := e.deadlines.peek()
		if top.at > now {
			break
		}
		e.deadlines.pop()
		n := e.nodes[top.node]
		if n != nil && n.state == Open && n.deadline == top.at {
			e.endNode(n, Expired, now)
			nodes++
		}
	}
	e.purgeTombstones(now)
	e.endDueSlices(now)
	e.rateChanged() // an ended slice refills its buckets faster
	e.dispatchRates(now)
	e.revertOverrides(now)
	e.reclaim(now)
	e.compactDeadlines()
	e.shrink()
	for _, class := range e.sortedAdaptive() {
		e.adaptive[class].tick(e, now)
	}
	return sessions, nodes
}

// DueIn is how long until Reap next has something to do: the soonest
// session expiry, node deadline, period reset, slice's end or instant a
// rate waiter may fit (ratewait.go) the engine knows of. It may come early (a
// heartbeat has since moved a session on), never late, so a server that
// reaps then ends a dead worker's session when its TTL is up rather than up
// to a reap interval later. ok is false when nothing is due.
func (e *Engine) DueIn() (d time.Duration, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	next := e.soonest
	if e.deadlines.Len() > 0 {
		next = min(next, e.deadlines.peek().at)
	}
	next = e.nextRevert(next)
	next = min(next, e.nextReset)
	next = e.nextSliceEnd(next)
	next = e.nextRateDue(next)
	if next == math.MaxInt64 {
		return 0, false
	}
	return time.Duration(max(0, next-e.now())), true
}
