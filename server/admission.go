package server

import (
	"context"
	"sync"
	"time"

	"github.com/governor-project/governor/server/serverconfig"
)

// Admission: governord's own fair share of its engine and its commit
// pipeline, per tenant, by weight (issue 27).
//
// Every call that may change state (new work: creating and ending nodes,
// consumes, acquires, reservations that grow, cap edits, ...) enters
// through its tenant's lane before it reaches the engine, and holds its
// place until its answer is durable. Sessions opened with the admin key
// have a lane of their own, with admission.admin_weight. At most
// admission.max_in_flight calls hold a place at once, across all lanes; a
// lane holds at most its tenant's max_in_flight. A call that finds no
// place waits in its lane's queue, and when a place frees the next lane is
// chosen by weighted round robin among the lanes with calls waiting and
// room under their own cap: a lane of weight w is served w calls in a row,
// then the next lane's turn comes. Work conserving: a tenant alone uses
// every place its cap allows.
//
// Past the cap and a queue of max_queued, or over the tenant's api_rate, a
// call is refused with RESOURCE_EXHAUSTED and a RetryInfo saying when to
// try again (refusal.go); the SDK waits that long and sends it again.
//
// What keeps sessions alive and frees capacity has its own lane and never
// waits here (control calls: heartbeats, releases, give-backs, closing a
// session; see laneOf in admitcall.go). An acquire that waits in the
// engine's fair queue for a slot gives its place back while it waits, so
// that held-up acquires never keep others' calls out.
//
// Because every place is held until the call's events are committed, the
// events pending commit at any moment come from at most max_in_flight
// calls, mixed across the tenants in the round robin's order: one
// tenant's backlog waits in its own queue, not in the commit pipeline, and
// a group commit takes everything pending, so a call's event is in the
// batch after the one in flight when it was emitted.

// admission is the scheduler of the lanes. Its methods are safe for
// concurrent use; it does no I/O and reads the time only from now.
type admission struct {
	now func() time.Time

	mu    sync.Mutex
	slots int // places across all lanes (admission.max_in_flight)
	used  int
	lanes []*lane // in round robin order; the admin lane first
	next  int     // the lane whose turn it is
	// byScope maps a session's scope node to its lane; filled as the
	// tenants are configured.
	byScope map[int64]*lane
	// trace, when a test sets it, is told of each ticket as it queues,
	// is admitted and finishes, under a.mu, so that the round robin's
	// order can be checked.
	trace func(what string, t *ticket)
}

// What trace is told.
const (
	traceQueued   = "queued"
	traceAdmitted = "admitted"
	traceFinished = "finished"
)

// lane is one tenant's (or the admin's) queue and counts.
type lane struct {
	name        string // the tenant's name; "" for the admin's lane
	weight      int
	maxInFlight int
	maxQueued   int
	bucket      *tokenBucket // api_rate; nil when none

	credit   int // calls left in the lane's current turn
	inFlight int
	queue    []*ticket // waiting, oldest first
	// service is a moving average of how long an admitted call holds its
	// place, for the wait a refused call is told.
	service time.Duration
}

// ticket is one call's place: waiting, admitted, then done.
type ticket struct {
	a        *admission
	l        *lane
	ready    chan struct{} // closed when admitted
	admitted bool
	done     bool
	since    time.Time // when it was admitted
}

// laneLimits are what admission allows one lane.
type laneLimits struct {
	Weight      int
	MaxInFlight int
	MaxQueued   int
	Rate        *serverconfig.APIRate // nil: no api_rate
}

func newAdmission(slots int, now func() time.Time) *admission {
	return &admission{now: now, slots: slots, byScope: map[int64]*lane{}}
}

// addLane adds a lane at the end of the round robin.
func (a *admission) addLane(name string, lim laneLimits) *lane {
	l := &lane{name: name, weight: max(lim.Weight, 1), maxInFlight: lim.MaxInFlight, maxQueued: lim.MaxQueued}
	if lim.Rate != nil {
		l.bucket = newTokenBucket(*lim.Rate, a.now())
	}
	a.mu.Lock()
	a.lanes = append(a.lanes, l)
	a.mu.Unlock()
	return l
}

// bind makes l the lane of the sessions scoped to node.
func (a *admission) bind(node int64, l *lane) {
	a.mu.Lock()
	a.byScope[node] = l
	a.mu.Unlock()
}

// laneOf returns the lane of sessions scoped to node, or nil.
func (a *admission) laneOf(node int64) *lane {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.byScope[node]
}

// enter takes a place in l for one call, waiting in l's queue if there is
// none. It returns the ticket to finish once the call is answered, or a
// *refusal (over the rate, or past the cap and the queue), or ctx's error.
func (a *admission) enter(ctx context.Context, l *lane) (*ticket, error) {
	t := &ticket{a: a, l: l}
	a.mu.Lock()
	if l.bucket != nil {
		if wait, ok := l.bucket.take(a.now()); !ok {
			a.mu.Unlock()
			return nil, &refusal{lane: l.name, why: refusedRate, retryAfter: wait}
		}
	}
	if a.used < a.slots && l.inFlight < l.maxInFlight && len(l.queue) == 0 {
		a.admit(t)
		a.mu.Unlock()
		return t, nil
	}
	if len(l.queue) >= l.maxQueued {
		if l.bucket != nil {
			l.bucket.giveBack() // the rate is not charged for a call refused
		}
		wait := l.busyWait()
		a.mu.Unlock()
		return nil, &refusal{lane: l.name, why: refusedBusy, retryAfter: wait}
	}
	t.ready = make(chan struct{})
	l.queue = append(l.queue, t)
	if a.trace != nil {
		a.trace(traceQueued, t)
	}
	a.mu.Unlock()
	select {
	case <-t.ready:
		return t, nil
	case <-ctx.Done():
		a.mu.Lock()
		if t.admitted {
			a.mu.Unlock()
			t.finish()
			return nil, ctx.Err()
		}
		for i, q := range l.queue {
			if q == t {
				l.queue = append(l.queue[:i], l.queue[i+1:]...)
				break
			}
		}
		a.mu.Unlock()
		return nil, ctx.Err()
	}
}

// admit gives t its place. a.mu is held.
func (a *admission) admit(t *ticket) {
	t.admitted, t.since = true, a.now()
	t.l.inFlight++
	a.used++
	if a.trace != nil {
		a.trace(traceAdmitted, t)
	}
	if t.ready != nil {
		close(t.ready)
	}
}

// finish gives t's place back, once; the next waiting call, by the round
// robin, takes it. It is safe to call on a nil ticket.
func (t *ticket) finish() {
	if t == nil {
		return
	}
	a := t.a
	a.mu.Lock()
	defer a.mu.Unlock()
	if t.done || !t.admitted {
		return
	}
	t.done = true
	l := t.l
	l.inFlight--
	a.used--
	held := a.now().Sub(t.since)
	if l.service == 0 {
		l.service = held
	} else {
		l.service += (held - l.service) / 8
	}
	if a.trace != nil {
		a.trace(traceFinished, t)
	}
	a.dispatch()
}

// dispatch fills the free places from the queues, by weighted round
// robin. a.mu is held.
func (a *admission) dispatch() {
	for a.used < a.slots {
		l := a.pick()
		if l == nil {
			return
		}
		t := l.queue[0]
		l.queue[0] = nil
		l.queue = l.queue[1:]
		if len(l.queue) == 0 {
			l.queue = nil // an emptied slice keeps its array
		}
		a.admit(t)
	}
}

// pick returns the lane to serve next, or nil when none may be served: the
// lane whose turn it is, if it has calls waiting and room under its cap,
// for up to its weight in calls in a row; else the next such lane. A lane
// passed over loses the rest of its turn.
func (a *admission) pick() *lane {
	n := len(a.lanes)
	for range n {
		l := a.lanes[a.next]
		if len(l.queue) > 0 && l.inFlight < l.maxInFlight {
			if l.credit <= 0 {
				l.credit = l.weight
			}
			if l.credit--; l.credit == 0 {
				a.next = (a.next + 1) % n
			}
			return l
		}
		l.credit = 0
		a.next = (a.next + 1) % n
	}
	return nil
}

// busyWait is how long a call refused for a full queue is told to wait:
// about how long the calls ahead of it take to be served, from the lane's
// recent calls, within [minBusyWait, maxBusyWait]. a.mu is held.
func (l *lane) busyWait() time.Duration {
	ahead := 1 + len(l.queue)/max(l.maxInFlight, 1)
	return min(max(l.service*time.Duration(ahead), minBusyWait), maxBusyWait)
}

// The wait a refusal for a full queue carries: never so short that the
// retry comes back at once, never so long that a client idles while
// governord has room.
const (
	minBusyWait = 5 * time.Millisecond
	maxBusyWait = time.Second
)

// laneStats is one lane as the metrics read it.
type laneStats struct {
	name             string
	inFlight, queued int
}

// stats reads every lane's counts.
func (a *admission) stats() []laneStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]laneStats, len(a.lanes))
	for i, l := range a.lanes {
		out[i] = laneStats{name: l.name, inFlight: l.inFlight, queued: len(l.queue)}
	}
	return out
}
