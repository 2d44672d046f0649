package engine

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"
)

// The model's own decisions. model_test.go checks what each event did to
// the caps and counters; this file recomputes what the engine decided and
// when: which queued acquire each dispatch grants (weighted deficit round
// robin, as SPEC.md describes it), each adaptive limit's move, how an ended
// lease answers while its tombstone lasts, and which request ids a session
// still remembers. The spec's constants are written here as the spec states
// them, not taken from the engine's code, so a changed constant shows.
const (
	specTombstoneTTL  = 60 * time.Second // "a tombstone for TombstoneTTL (one minute)"
	specRequestMemory = 1024             // "Each session remembers its last 1,024 ids"
	specDecreasePct   = 70               // "multiplied by 0.7"
)

// mWaiter is a queued acquire as the model knows it, from the driver.
type mWaiter struct {
	wait      *Wait
	session   SessionID
	node      NodeID
	class     string
	charges   map[string]int64
	requestID string
	priority  int64
	arrival   uint64
	write     bool
	mark      int64 // its tenant queue's grants when it queued (the aging guard)
}

type mTenantQueue struct {
	tenant  NodeID
	waiters []*mWaiter // highest priority first, then arrival
	deficit int64
	grants  int64 // grants made from this queue (the aging guard)
}

type mClassQueue struct {
	ring   []*mTenantQueue
	cursor int
}

// mDispatch is a dispatch the engine is in the middle of, as the model
// follows it: the classes it serves in order, and the event the model
// expects next.
type mDispatch struct {
	classes []string
	idx     int
	again   bool // an end inside the dispatch asked for another round
	expect  *mWaiter
	kind    EventKind // what the expected waiter's turn brings: a grant, or its session's or node's end
	tq      *mTenantQueue
	fromMin bool // the waiter's tenant was below its minimum: outside the round robin
}

type mTomb struct {
	session SessionID
	node    NodeID
	reason  EndReason
	at      int64
}

// modelDecide is the model's state for its own decisions.
type modelDecide struct {
	weight   map[NodeID]int64
	priority map[NodeID]int64
	queues   map[string]*mClassQueue
	arrival  uint64
	disp     *mDispatch
	now      int64
	// expired reports whether a session's TTL has passed. Heartbeats are
	// not events, so the driver answers from the times it renewed them.
	expired func(SessionID, int64) bool
	// pastBound reports whether granting w now would take its tenant past
	// a bound on distinct names (the driver recounts them).
	pastBound func(w *mWaiter) bool
	// granted is the lease each dispatch grant handed to which wait.
	granted map[*Wait]LeaseID

	// Adaptive limits: each class's window of samples since its last
	// decision.
	aimd map[string]*mController

	// agedGrants counts grants to waiters the aging guard had marked
	// (passed over by AgingGrants grants of their tenant's queue): how
	// often the driver reaches the guard.
	agedGrants int

	tombs    map[LeaseID]mTomb
	requests map[SessionID][]string // remembered request ids, oldest first
	touched  map[SessionID]bool     // sessions whose memory changed this step
	// charged are the charges without a lease each session's requests
	// made, by request id: what GiveBackCharged may undo.
	charged map[SessionID]map[string]mCharged
}

// mCharged is a charge without a lease a request made: on node, at at.
type mCharged struct {
	node    NodeID
	charges []Charge
	at      int64
}

type mController struct {
	cfg   Adaptive
	last  int64 // its last decision
	cutAt int64 // its last cut
	// lastCount is how many calls its last whole interval counted.
	lastCount int
	samples   []time.Duration
	over      int
}

func (m *model) decideInit() {
	m.weight = map[NodeID]int64{RootID: 1}
	m.priority = map[NodeID]int64{}
	m.queues = map[string]*mClassQueue{}
	m.granted = map[*Wait]LeaseID{}
	m.aimd = map[string]*mController{}
	m.tombs = map[LeaseID]mTomb{}
	m.requests = map[SessionID][]string{}
	m.touched = map[SessionID]bool{}
	m.charged = map[SessionID]map[string]mCharged{}
}

// tenantOf is the depth-1 ancestor of id, or the root for the root.
func (m *model) tenantOf(id NodeID) NodeID {
	c := m.chain(id)
	if len(c) < 2 {
		return RootID
	}
	return c[len(c)-2]
}

// fits: one more lease of class fits under every limit on id's chain, and
// no count of slots on it is at MaxInt64 already.
func (m *model) fits(id NodeID, class string) bool {
	for _, a := range m.chain(id) {
		if limit, ok := m.refusesAt(a, true, class); ok && m.held[a][class] >= limit || m.held[a][class] == math.MaxInt64 {
			return false
		}
	}
	return true
}

// chargesFit: every charge fits under every quota on id's chain, counting
// what is reserved, and none would overflow a counter (I24).
func (m *model) chargesFit(id NodeID, charges map[string]int64) bool {
	for r, amount := range charges {
		if m.quotaOverflows(id, r, amount, false) {
			return false
		}
		for _, a := range m.chain(id) {
			if q, ok := m.refusesAt(a, false, r); ok && amount > q-m.spent(a, r)-m.reserved[a][r] {
				return false
			}
		}
	}
	return true
}

// Enqueue is told by the driver of each acquire that queued.
func (m *model) Enqueue(wt *Wait, sid SessionID, node NodeID, class string, charges map[string]int64, requestID string, write bool) {
	m.arrival++
	w := &mWaiter{wait: wt, session: sid, node: node, class: class, charges: maps.Clone(charges), requestID: requestID,
		priority: m.priority[node], arrival: m.arrival, write: write}
	q := m.queues[class]
	if q == nil {
		q = &mClassQueue{}
		m.queues[class] = q
	}
	t := m.tenantOf(node)
	i := slices.IndexFunc(q.ring, func(tq *mTenantQueue) bool { return tq.tenant == t })
	if i < 0 {
		q.ring = append(q.ring, &mTenantQueue{tenant: t})
		i = len(q.ring) - 1
	}
	tq := q.ring[i]
	w.mark = tq.grants
	j := slices.IndexFunc(tq.waiters, func(o *mWaiter) bool { return o.priority < w.priority })
	if j < 0 {
		j = len(tq.waiters)
	}
	tq.waiters = slices.Insert(tq.waiters, j, w)
}

// Cancel is told of a wait its caller withdrew. A wait already granted or
// failed is no longer queued, and nothing changes.
func (m *model) Cancel(wt *Wait) {
	m.dropWaiters(func(w *mWaiter) bool { return w.wait == wt })
}

func (m *model) dropWaiters(gone func(*mWaiter) bool) {
	for _, q := range m.queues {
		for _, tq := range q.ring {
			tq.waiters = slices.DeleteFunc(tq.waiters, gone)
		}
	}
}

// dropTenant forgets a reclaimed tenant's (empty) queues. The turn passes
// on to the next tenant in the ring, as if it had forfeited it.
func (m *model) dropTenant(t NodeID) {
	for _, q := range m.queues {
		i := slices.IndexFunc(q.ring, func(tq *mTenantQueue) bool { return tq.tenant == t })
		if i < 0 {
			continue
		}
		q.ring = slices.Delete(q.ring, i, i+1)
		if q.cursor > i {
			q.cursor--
		}
		if q.cursor >= len(q.ring) {
			q.cursor = 0
		}
	}
}

func (q *mClassQueue) waiting() int {
	n := 0
	for _, tq := range q.ring {
		n += len(tq.waiters)
	}
	return n
}

// next is SPEC.md's fair queue: the tenant whose turn it is takes its
// first waiter that fits; a tenant whose own cap is full, or none of whose
// waiters fits, forfeits the rest of its turn, and a new turn starts with
// the tenant's weight.
func (m *model) next(q *mClassQueue, class string) (*mTenantQueue, *mWaiter) {
	for range len(q.ring) {
		tq := q.ring[q.cursor]
		if tq.deficit <= 0 {
			tq.deficit = m.weight[tq.tenant]
		}
		if w := m.firstFit(tq, class); w != nil {
			return tq, w
		}
		tq.deficit = 0
		q.cursor = (q.cursor + 1) % len(q.ring)
	}
	return nil, nil
}

// startDispatch follows a dispatch of the classes given (nil: every class,
// in name order) that the engine runs after an event that can free
// capacity.
func (m *model) startDispatch(classes []string) {
	if m.disp != nil {
		m.disp.again = true // a nested request, served by the outermost dispatch
		return
	}
	if classes == nil {
		classes = slices.Sorted(maps.Keys(m.queues))
	}
	m.disp = &mDispatch{classes: classes}
	m.advance()
}

// advance runs the model's dispatch until it needs the engine's next
// event: a grant, or the end of a waiter's session or node found on the
// way. A waiter whose charges no longer fit fails without an event.
func (m *model) advance() {
	for d := m.disp; d != nil; d = m.disp {
		if d.idx >= len(d.classes) {
			if d.again {
				d.again, d.idx, d.classes = false, 0, slices.Sorted(maps.Keys(m.queues))
				continue
			}
			m.disp = nil
			return
		}
		class := d.classes[d.idx]
		q := m.queues[class]
		if q == nil || q.waiting() == 0 || !m.fits(RootID, class) {
			d.idx++
			continue
		}
		tq, w := m.belowMinimum(q, class)
		d.fromMin = w != nil
		if w == nil {
			tq, w = m.next(q, class)
		}
		if w == nil {
			d.idx++
			continue
		}
		switch {
		case m.expired != nil && m.expired(w.session, m.now):
			d.expect, d.kind, d.tq = w, EvSessionEnded, tq
			return
		case m.overdue(w.node):
			d.expect, d.kind, d.tq = w, EvNodeEnded, tq
			return
		case m.pastBound != nil && m.pastBound(w):
			m.dropWaiters(func(o *mWaiter) bool { return o == w })
		case !m.chargesFit(w.node, w.charges) || !m.ratesFit(w.node, w.charges, m.now):
			m.dropWaiters(func(o *mWaiter) bool { return o == w })
		default:
			d.expect, d.kind, d.tq = w, EvLeaseGranted, tq
			return
		}
	}
}

func (m *model) overdue(id NodeID) bool {
	for _, a := range m.chain(id) {
		if d := m.deadline[a]; d != 0 && m.now >= d {
			return true
		}
	}
	return false
}

// expected checks an event against the dispatch in progress. It returns
// whether the event was the one expected (to be finished by afterExpected
// once applied).
func (m *model) expected(ev Event) bool {
	d := m.disp
	if d == nil || d.expect == nil {
		return false
	}
	w := d.expect
	ok := false
	switch d.kind {
	case EvLeaseGranted:
		ok = ev.Kind == EvLeaseGranted && !ev.Block && ev.Session == w.session && ev.Node == w.node &&
			ev.Resource == w.class && ev.RequestID == w.requestID
	case EvSessionEnded:
		ok = ev.Kind == EvSessionEnded && ev.Session == w.session && ev.Reason == EndExpired
	case EvNodeEnded:
		ok = ev.Kind == EvNodeEnded && ev.State == Expired && m.inside(w.node, ev.Node)
	}
	if !ok {
		m.failf("I6 DRR: event %d (%s: session %d, node %d, %q) is not what the fair queue does next: %s for the waiter of session %d on node %d (%s, tenant %d's turn)",
			ev.Seq, ev.Kind, ev.Session, ev.Node, ev.Resource, d.kind, w.session, w.node, w.class, d.tq.tenant)
		m.disp = nil
		return false
	}
	return true
}

// afterExpected finishes the expected event once it is applied.
func (m *model) afterExpected(ev Event) {
	d := m.disp
	w, tq := d.expect, d.tq
	d.expect = nil
	if ev.Kind == EvLeaseGranted {
		m.dropWaiters(func(o *mWaiter) bool { return o == w })
		m.granted[w.wait] = ev.Lease
		q := m.queues[w.class]
		if tq.grants-w.mark >= specAgingGrants {
			m.agedGrants++
		}
		tq.grants++
		if !d.fromMin {
			if tq.deficit--; tq.deficit <= 0 {
				q.cursor = (q.cursor + 1) % len(q.ring)
			}
		}
	} else {
		d.again = true // the end asked for a dispatch of every class
	}
	m.advance()
}

// decideEvent keeps the model's decision state after an event is applied,
// and follows the dispatch the event brings. l is the lease the event
// ended (EvLeaseReleased), before it was forgotten.
func (m *model) decideEvent(ev Event, l modelLease) {
	m.now = ev.At
	switch ev.Kind {
	case EvNodeCreated:
		m.weight[ev.Node] = max(ev.Spec.Weight, 1)
		m.priority[ev.Node] = m.priority[ev.Parent]
		if ev.Spec.Priority != 0 {
			m.priority[ev.Node] = ev.Spec.Priority
		}
	case EvCapsSet:
		if ev.Caps.Weight != nil {
			m.weight[ev.Node] = *ev.Caps.Weight
			// A turn in progress ends at the new weight.
			for _, q := range m.queues {
				for _, tq := range q.ring {
					if tq.tenant == ev.Node {
						tq.deficit = min(tq.deficit, *ev.Caps.Weight)
					}
				}
			}
		}
		if ev.Caps.Priority != nil {
			m.priority[ev.Node] = *ev.Caps.Priority
		}
	case EvSessionEnded:
		m.dropWaiters(func(w *mWaiter) bool { return w.session == ev.Session })
		delete(m.requests, ev.Session)
		delete(m.charged, ev.Session)
		m.touched[ev.Session] = true
	case EvNodeEnded:
		m.dropWaiters(func(w *mWaiter) bool { return m.state[w.node] != Open })
	case EvTenantStateSet:
		m.decideTenantState(ev)
	}
	m.rememberRequest(ev)
	switch {
	case ev.Kind == EvLeaseReleased:
		m.startDispatch([]string{l.class})
	case ev.Kind == EvBlockResized && ev.Amount < 0, ev.Kind == EvLimitAdjusted:
		m.startDispatch([]string{ev.Resource})
	case ev.Kind == EvSessionEnded, ev.Kind == EvNodeEnded, ev.Kind == EvCapsSet, ev.Kind == EvCapsReverted,
		ev.Kind == EvTenantStateSet:
		m.startDispatch(nil)
	}
}

// tomb records how a lease ended.
func (m *model) tomb(id LeaseID, l modelLease, reason EndReason, at int64) {
	m.tombs[id] = mTomb{session: l.session, node: l.node, reason: reason, at: at}
}

// rememberRequest keeps each session's request memory as SPEC.md says: the
// ids its events carry, the last 1,024, minus those given back.
func (m *model) rememberRequest(ev Event) {
	if (ev.Kind == EvLeaseReleased || ev.Kind == EvCharged) && ev.Forget != "" {
		m.requests[ev.Session] = slices.DeleteFunc(m.requests[ev.Session], func(id string) bool { return id == ev.Forget })
		m.touched[ev.Session] = true
	}
	if _, open := m.scope[ev.Session]; !open || ev.RequestID == "" {
		return
	}
	m.touched[ev.Session] = true
	ids := m.requests[ev.Session]
	if slices.Contains(ids, ev.RequestID) {
		return
	}
	ids = append(ids, ev.RequestID)
	if len(ids) > specRequestMemory {
		ids = slices.Delete(ids, 0, len(ids)-specRequestMemory)
	}
	m.requests[ev.Session] = ids
}

// GivesBackCharge reports whether the model says GiveBackCharged by sid
// of request id undoes a charge: sid remembers id, which charged without
// a lease, on a node not reclaimed since.
func (m *model) GivesBackCharge(sid SessionID, id string) bool {
	c, ok := m.charged[sid][id]
	_, kept := m.state[c.node]
	return ok && m.Remembers(sid, id) && kept
}

// Remembers reports whether the model says session sid still remembers id.
func (m *model) Remembers(sid SessionID, id string) bool {
	return slices.Contains(m.requests[sid], id)
}

// leaseAnswer is what Release (release true) or Validate of lease id by a
// session scoped to scope must answer at now, when the model holds no live
// lease id: nil, or the error it must match.
func (m *model) leaseAnswer(sid SessionID, scope NodeID, id LeaseID, now int64, release bool) error {
	t, ok := m.tombs[id]
	if !ok {
		return ErrNotFound // never issued: ids are issued in order and the model tombs every end
	}
	if now >= t.at+int64(specTombstoneTTL) {
		return ErrNotFound
	}
	if _, kept := m.state[t.node]; !kept {
		return ErrNotFound // its node was reclaimed
	}
	if !m.inside(t.node, scope) {
		return ErrNotFound // to this session, as if it never existed
	}
	if t.reason == EndReleased && t.session == sid && release {
		return nil
	}
	return &LeaseEndedError{Lease: id, Reason: t.reason}
}

// sameLeaseAnswer compares an answer with the model's.
func sameLeaseAnswer(got, want error) bool {
	var gl, wl *LeaseEndedError
	switch {
	case want == nil:
		return got == nil
	case errors.As(want, &wl):
		return errors.As(got, &gl) && gl.Lease == wl.Lease && gl.Reason == wl.Reason
	default:
		return errors.Is(got, want)
	}
}

// Observe is told of each call an adaptive class counts, begun at began
// (its lease's grant, or for a block's slot its end minus its latency). A
// call that began before the class's last cut is not counted: it was
// admitted under the limit that cut replaced.
func (m *model) Observe(class string, latency time.Duration, overloaded bool, began int64) {
	c := m.aimd[class]
	if c == nil || began < c.cutAt {
		return
	}
	c.samples = append(c.samples, latency)
	if overloaded {
		c.over++
	}
}

// current is a class's root limit as its controller reads it: MaxLimit
// when the root has none.
func (m *model) current(class string) (int64, bool) {
	v, capped := m.limits[RootID][class]
	if !capped {
		v = m.aimd[class].cfg.MaxLimit
	}
	return v, capped
}

// fails is SPEC.md's test of an interval of n calls, the window's among
// them and the rest healthy: a p95 (nearest rank) over target, or an
// overloaded share over the maximum.
func (c *mController) fails(n int) bool {
	all := append(slices.Clone(c.samples), make([]time.Duration, n-len(c.samples))...)
	slices.Sort(all)
	return all[(95*n+99)/100-1] > c.cfg.TargetP95 || float64(c.over)/float64(n) > c.cfg.MaxOverload
}

// rule is SPEC.md's AIMD rule from the window's samples: the limit that
// follows current (current itself with too few samples).
func (c *mController) rule(current int64) int64 {
	n := len(c.samples)
	if n < c.cfg.MinSamples {
		return current
	}
	sorted := slices.Clone(c.samples)
	slices.Sort(sorted)
	p95 := sorted[(95*n+99)/100-1] // nearest rank
	next := current + 1
	if p95 > c.cfg.TargetP95 || float64(c.over)/float64(n) > c.cfg.MaxOverload {
		next = current * specDecreasePct / 100
	}
	return min(max(next, c.cfg.MinLimit), c.cfg.MaxLimit)
}

func (c *mController) restart(now int64) {
	c.last, c.samples, c.over = now, nil, 0
}

// CutAtOnce is what a release or an Observe batch must do to class's limit,
// given current, the limit before it: cut it at once when the window has
// MinSamples calls and fails the rule even within an interval as busy as
// the last whole one whose other calls are healthy (SPEC.md). It returns
// the EvLimitAdjusted events it must emit.
func (m *model) CutAtOnce(class string, current int64, now int64) []Event {
	c := m.aimd[class]
	if c == nil {
		return nil
	}
	expect := max(c.lastCount, len(c.samples))
	if len(c.samples) < c.cfg.MinSamples || !c.fails(expect) {
		return nil
	}
	next := min(max(current*specDecreasePct/100, c.cfg.MinLimit), c.cfg.MaxLimit)
	if next >= current {
		return nil
	}
	c.cutAt = now
	c.restart(now)
	return []Event{{Kind: EvLimitAdjusted, At: now, Node: RootID, Resource: class, Amount: next}}
}

// DecideAdaptive is what Reap must do with each adaptive limit at now:
// the EvLimitAdjusted events it must emit, recomputed from the samples and
// the controller's settings as SPEC.md states the rule.
func (m *model) DecideAdaptive(now int64) []Event {
	var out []Event
	for _, class := range slices.Sorted(maps.Keys(m.aimd)) {
		c := m.aimd[class]
		interval := c.cfg.Interval
		if interval == 0 {
			interval = time.Second
		}
		if now-c.last < int64(interval) {
			continue
		}
		current, capped := m.current(class)
		next := c.rule(current)
		if next != current || !capped {
			out = append(out, Event{Kind: EvLimitAdjusted, At: now, Node: RootID, Resource: class, Amount: next})
		}
		if next < current {
			c.cutAt = now
		}
		c.lastCount = len(c.samples)
		c.restart(now)
	}
	return out
}

func (w mWaiter) String() string {
	return fmt.Sprintf("waiter(s%d n%d %s #%d)", w.session, w.node, w.class, w.arrival)
}
