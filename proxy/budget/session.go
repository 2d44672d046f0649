package budget

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/proxy/admission"
)

// session is one session with governord, the nodes it charges and what is
// delegated to it on each. Everything it holds dies with it: governord ends
// a lost session's blocks, and counts its unspent reservations as spent,
// when its TTL passes.
type session struct {
	a      *Admitter
	client *governor.Client
	task   *node

	life context.Context // ends at stop
	stop func()
	wg   sync.WaitGroup // the watch and tick loops

	mu    sync.Mutex
	nodes map[string]*node // by subtask name; "" is the task
	byID  map[int64]*node

	use useReporter // what governord was last told of the blocks' use (usereport.go)
}

// node is the task or a subtask: what work is charged to.
type node struct {
	s    *session
	name string
	t    *governor.Task
	// ctx ends when the node does (Close, a deadline, a notice or a call
	// that says so, the session's end), with the reason as its cause.
	ctx  context.Context
	end  context.CancelCauseFunc
	done chan struct{} // closed once t is known (or err)
	err  error

	// A subtask's use, so that an idle one can be ended (idle.go): the
	// requests between finding it and their end, and when the last ended.
	users   atomic.Int64
	lastUse atomic.Int64 // unix nanoseconds
	// retiring, set under s.mu, is closed once the subtask is ended at
	// governord and forgotten here; a request for its name waits for it.
	retiring chan struct{}

	mu    sync.Mutex
	pools map[string]*pool        // by class
	quota map[string]*reservation // by resource

	// ts is what the top-ups on the node said of its tenant's state
	// (tenantstate.go).
	ts tenantView
}

func newSession(a *Admitter, c *governor.Client, tctx context.Context, t *governor.Task) *session {
	s := &session{a: a, client: c, nodes: map[string]*node{}, byID: map[int64]*node{}}
	s.life, s.stop = context.WithCancel(context.Background())
	s.task = s.newNode("", t, tctx)
	s.nodes[""] = s.task
	s.byID[t.ID()] = s.task
	return s
}

func (s *session) newNode(name string, t *governor.Task, tctx context.Context) *node {
	n := &node{s: s, name: name, t: t, done: make(chan struct{}), pools: map[string]*pool{}, quota: map[string]*reservation{}}
	n.ctx, n.end = context.WithCancelCause(tctx)
	close(n.done)
	return n
}

// start runs the session's loops: the notices of its Watch stream (with
// delegation), and the ticks that close idle subtasks and (with delegation)
// give back idle slots and units, settle spent ones and report calls made
// in slots.
func (s *session) start() {
	if s.a.cfg.Delegate {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			err := s.client.Watch(s.life, s.onNotice)
			if err != nil && s.life.Err() == nil && s.client.Err() == nil {
				s.a.log.Warn("governor-proxy: the notice stream ended; delegated budgets go back more slowly", "err", err)
			}
		}()
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		every := min(s.a.cfg.Linger/2, sampleEvery)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-s.life.Done():
				return
			case now := <-t.C:
				s.tick(now)
			}
		}
	}()
}

// node returns the node for subtask name ("" is the task), finding or
// creating the subtask the first time, once however many requests ask at
// the same time. A creation carries on when the request that started it
// gives up, so that a later request finds it done.
//
// A subtask it returns is in use (n.use) until the caller's unuse: nil with
// an error.
func (s *session) node(ctx context.Context, name string) (*node, error) {
	if name == "" {
		return s.task, s.task.alive()
	}
	for {
		s.mu.Lock()
		n, ok := s.nodes[name]
		if ok && n.retiring != nil {
			// Ended for idleness right now: wait until it is gone at
			// governord too, so that finding it again cannot find it
			// still open and have it closed under the request.
			s.mu.Unlock()
			select {
			case <-n.retiring:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		if !ok {
			if len(s.nodes) > MaxSubtasks {
				s.mu.Unlock()
				return nil, &admission.Denial{Cause: admission.CauseBadRequest, Err: errTooManySubtasks}
			}
			n = &node{s: s, name: name, done: make(chan struct{}), pools: map[string]*pool{}, quota: map[string]*reservation{}}
			s.nodes[name] = n
			s.a.bg.Spawn(func() { s.resolve(n) }) // s.mu is held
		}
		n.use()
		s.mu.Unlock()
		select {
		case <-n.done:
		case <-ctx.Done():
			n.unuse()
			return nil, ctx.Err()
		}
		if n.err == nil {
			if err := n.alive(); err != nil {
				n.unuse()
				return nil, err
			}
			return n, nil
		}
		n.unuse()
		var ended *governor.TaskEndedError
		if errors.As(n.err, &ended) || s.client.Err() != nil {
			return nil, n.err
		}
		// It failed for a reason of its own (governord unreachable): let
		// the next request try again.
		s.mu.Lock()
		if s.nodes[name] == n {
			delete(s.nodes, name)
		}
		s.mu.Unlock()
		return nil, n.err
	}
}

var errTooManySubtasks = fmt.Errorf("more than %d subtask names in use", MaxSubtasks)

// resolve finds or creates subtask n under the task.
func (s *session) resolve(n *node) {
	defer close(n.done)
	tctx, t, _, err := s.client.FindOrCreateTask(s.task.ctx, governor.Spec{Name: n.name})
	if err != nil {
		n.err = fmt.Errorf("find or create subtask %q: %w", n.name, err)
		return
	}
	n.t = t
	n.ctx, n.end = context.WithCancelCause(tctx)
	n.lastUse.Store(time.Now().UnixNano())
	s.mu.Lock()
	s.byID[t.ID()] = n
	s.mu.Unlock()
}

// alive returns why nothing more may be granted on n, or nil.
func (n *node) alive() error {
	if n.ctx.Err() == nil {
		return nil
	}
	if err := context.Cause(n.ctx); err != nil {
		return err
	}
	return governor.ErrTaskEnded
}

// ended marks n, and so every node under it, as ended.
func (n *node) ended(why error) { n.end(why) }

// admit charges r's charges and takes a slot of its class on its node,
// and says which node that is (0 when it is not known). With waitRate, a
// charge made at governord waits there for a rate that refuses it
// (pace.go).
func (s *session) admit(ctx context.Context, r admission.Request, waitRate bool) (admission.Ticket, int64, error) {
	if err := s.client.Err(); err != nil {
		return nil, s.task.t.ID(), err
	}
	n, err := s.node(ctx, r.Subtask)
	if err != nil {
		return nil, s.task.t.ID(), err // the subtask could not be had: counted on the task
	}
	t, err := s.admitOn(ctx, n, r, waitRate)
	if t == nil {
		n.unuse() // a ticket unuses its node when its work ends
	}
	return t, n.t.ID(), err
}

// admitOn is admit on node n, found.
func (s *session) admitOn(ctx context.Context, n *node, r admission.Request, waitRate bool) (admission.Ticket, error) {
	if !s.a.cfg.Delegate {
		return n.admitDirect(ctx, r, waitRate)
	}
	resources := slices.Sorted(maps.Keys(r.Charges))
	if r.Spent {
		for _, res := range resources {
			n.reservation(res).spendUpTo(ctx, r.Charges[res])
		}
		return nil, nil
	}
	// All of the charges or none: each is held until the slot is granted.
	for i, res := range resources {
		err := n.reservation(res).take(ctx, r.Charges[res])
		if errors.Is(err, errShortTopUp) {
			// Near the quota's edge a charge of several units is decided
			// whole at governord, with its slot, in one ChargeAndAcquire,
			// so that a charge the quota cannot hold is refused at once
			// rather than after its whole wait timeout. The reservations'
			// unspent units go back first, so as not to stand in its way.
			// A held estimate is held exactly at governord instead, and
			// settled there to what the work used (admitHeld).
			n.untake(resources[:i], r.Charges)
			for _, res := range resources {
				n.reservation(res).settleNow(ctx, true)
			}
			return n.admitDirect(ctx, r, waitRate)
		}
		if errors.Is(err, errRated) {
			// A rate binds the resource, so governord delegates none of
			// it: the request is charged there, with its slot, as with
			// delegation off, and the rate decides it exactly.
			n.untake(resources[:i], r.Charges)
			t, err := n.admitDirect(ctx, r, waitRate)
			return t, n.sliceRetry(err, r.Charges)
		}
		if err != nil {
			n.untake(resources[:i], r.Charges)
			return nil, err
		}
	}
	var slot ticket
	if r.Class != "" {
		pt, err := n.pool(r.Class).take(ctx, r.Write)
		if err != nil {
			n.untake(resources, r.Charges)
			return nil, err
		}
		slot = pt
	}
	if err := n.writable(r, slot); err != nil {
		n.untake(resources, r.Charges)
		return nil, err
	}
	return n.granted(r, slot, resources), nil
}

// granted is r's ticket once it holds slot (nil: none) and has taken its
// charges from the reservations of resources: held until it settles
// (r.Held), or spent now.
func (n *node) granted(r admission.Request, slot ticket, resources []string) admission.Ticket {
	var t admission.Ticket
	if slot != nil { // a nil slot must be a nil Ticket, not a Ticket holding a nil
		t = slot
	}
	if r.Held {
		return n.held(t, r.Charges, false)
	}
	n.spend(resources, r.Charges)
	return t
}

// writable refuses r, once it has taken what it needs (slot, if any), when
// it is a write and the node's tenant is read_only as the answers to its
// top-ups said (tenantstate.go); the slot then goes back unused.
func (n *node) writable(r admission.Request, slot ticket) error {
	if !r.Write {
		return nil
	}
	if _, ok := slot.(*leaseTicket); ok {
		return nil // a lease governord granted as a write: its answer is the newer one
	}
	err := n.ts.refusesWrites()
	if err != nil && slot != nil {
		slot.abandon()
	}
	return err
}

// untake puts back the units taken for resources.
func (n *node) untake(resources []string, charges map[string]int64) {
	for _, res := range resources {
		n.reservation(res).untake(charges[res])
	}
}

// spend spends the units taken for resources, once the slot is granted.
func (n *node) spend(resources []string, charges map[string]int64) {
	for _, res := range resources {
		n.reservation(res).spend(charges[res])
	}
}

// tryAdmit is admit when everything is in hand; ok is false, with nothing
// taken, when anything would need a wait or a call.
func (s *session) tryAdmit(r admission.Request) (admission.Ticket, bool) {
	n := s.task
	if r.Subtask != "" {
		s.mu.Lock()
		n = s.nodes[r.Subtask]
		if n == nil || n.retiring != nil {
			s.mu.Unlock()
			return nil, false
		}
		n.use()
		s.mu.Unlock()
		select {
		case <-n.done:
		default:
			n.unuse()
			return nil, false
		}
	}
	t, ok := s.tryAdmitOn(n, r)
	if t == nil {
		n.unuse()
	}
	return t, ok
}

// tryAdmitOn is tryAdmit on node n, found.
func (s *session) tryAdmitOn(n *node, r admission.Request) (admission.Ticket, bool) {
	if n.err != nil || n.alive() != nil || s.client.Err() != nil {
		return nil, false
	}
	var taken [4]string // most requests charge one resource or none
	resources := taken[:0]
	for res, amount := range r.Charges {
		if !n.reservation(res).tryTake(amount) {
			n.untake(resources, r.Charges)
			return nil, false
		}
		resources = append(resources, res)
	}
	var slot ticket
	if r.Class != "" {
		pt, ok := n.pool(r.Class).tryTake()
		if !ok {
			n.untake(resources, r.Charges)
			return nil, false
		}
		slot = pt
	}
	if n.writable(r, slot) != nil {
		n.untake(resources, r.Charges)
		return nil, false // Admit refuses it, and counts the refusal
	}
	return n.granted(r, slot, resources), true
}

// holdings lists n's pools and reservations as they are now.
func (n *node) holdings() ([]*pool, []*reservation) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Collect(maps.Values(n.pools)), slices.Collect(maps.Values(n.quota))
}

func (n *node) pool(class string) *pool {
	n.mu.Lock()
	defer n.mu.Unlock()
	p := n.pools[class]
	if p == nil {
		p = &pool{n: n, class: class}
		n.pools[class] = p
	}
	return p
}

func (n *node) reservation(resource string) *reservation {
	n.mu.Lock()
	defer n.mu.Unlock()
	q := n.quota[resource]
	if q == nil {
		q = &reservation{n: n, resource: resource}
		n.quota[resource] = q
	}
	return q
}

// each calls f for every resolved node, the task first.
func (s *session) each(f func(*node)) {
	s.mu.Lock()
	nodes := make([]*node, 0, len(s.nodes))
	for _, name := range slices.Sorted(maps.Keys(s.nodes)) {
		n := s.nodes[name]
		select {
		case <-n.done:
			if n.err == nil && n.retiring == nil {
				nodes = append(nodes, n)
			}
		default:
		}
	}
	s.mu.Unlock()
	for _, n := range nodes {
		f(n)
	}
}

// under lists the resolved nodes at or below the node with id: one
// subtask, or the task and its subtasks, or (an ancestor of the task)
// all of them.
func (s *session) under(id int64) []*node {
	s.mu.Lock()
	n := s.byID[id]
	s.mu.Unlock()
	if n != nil && n != s.task {
		return []*node{n}
	}
	var out []*node
	s.each(func(n *node) { out = append(out, n) })
	return out
}

// onNotice acts on one notice of the Watch stream.
func (s *session) onNotice(nt governor.Notice) {
	// Counted once acted on: a count that moved is a notice in force.
	defer s.a.m.notices.WithLabelValues(nt.Kind.String()).Inc()
	switch nt.Kind {
	case governor.NoticeContended, governor.NoticeUncontended:
		for _, n := range s.under(nt.NodeID) {
			if n.t.ID() == nt.NodeID {
				n.pool(nt.Class).setContended(nt.Kind == governor.NoticeContended)
			}
		}
	case governor.NoticeRecall:
		for _, n := range s.under(nt.NodeID) {
			if nt.Class == "" && nt.Resource == "" {
				// Everything: perhaps the tenant's state changed
				// (tenantstate.go).
				n.ts.recalled()
			}
			n.giveBack(nt.Class, nt.Resource)
		}
	case governor.NoticeEnded:
		for _, n := range s.under(nt.NodeID) {
			if n.t.ID() != nt.NodeID {
				continue
			}
			n.ended(&governor.TaskEndedError{NodeID: nt.NodeID, NodeName: n.t.Name(), State: governor.NodeClosed})
			if nt.Class != "" {
				n.pool(nt.Class).revoked()
			}
			if nt.Resource != "" {
				n.reservation(nt.Resource).settle(true)
			}
		}
	}
}

// giveBack gives back the idle slots and unspent units held on n: of class
// only, of resource only, or (both empty) all.
func (n *node) giveBack(class, resource string) {
	pools, quota := n.holdings()
	if resource == "" {
		for _, p := range pools {
			if class == "" || p.class == class {
				p.recall()
			}
		}
	}
	if class == "" {
		for _, q := range quota {
			if resource == "" || q.resource == resource {
				q.recall()
			}
		}
	}
}

// tick closes idle subtasks (idle.go) and reports the refusals decided
// here (denials.go); with delegation it also gives back
// what has been idle for the linger, settles what was spent a settle
// interval ago, and reports calls made in slots and how the blocks' slots
// are used (usereport.go).
func (s *session) tick(now time.Time) {
	s.retireIdle(now)
	s.reportDenials()
	if !s.a.cfg.Delegate {
		return
	}
	linger, settle := s.a.cfg.Linger, s.a.cfg.SettleEvery
	s.each(func(n *node) {
		pools, quota := n.holdings()
		for _, p := range pools {
			p.tick(now, linger)
		}
		for _, q := range quota {
			q.tick(now, linger, settle)
		}
	})
	s.report()
	s.reportUse(now)
}

// maxSamples bounds what one pool notes between reports; the engine keeps
// only so many of an interval anyway.
const maxSamples = 4096

// report sends the calls made in slots since the last report, one batch
// per class.
func (s *session) report() {
	batches := map[string][]governor.Sample{}
	s.each(func(n *node) {
		pools, _ := n.holdings()
		for _, p := range pools {
			if got := p.takeSamples(); len(got) > 0 {
				batches[p.class] = append(batches[p.class], got...)
			}
		}
	})
	for _, class := range slices.Sorted(maps.Keys(batches)) {
		batch := batches[class]
		if len(batch) > maxSamples {
			batch = batch[len(batch)-maxSamples:]
		}
		ctx, cancel := context.WithTimeout(s.life, callTimeout)
		if err := s.client.ReportSamples(ctx, class, batch); err != nil && s.life.Err() == nil {
			s.a.log.Debug("governor-proxy: reporting calls for adaptive limits failed", "class", class, "err", err)
		}
		cancel()
	}
}

// giveBackAll gives back every idle slot and settles and returns every
// reservation, waiting until ctx ends: a sidecar that stops leaves nothing
// unspent behind.
func (s *session) giveBackAll(ctx context.Context) {
	s.settleEach(ctx, true)
	s.report()
}

// settleAll reports every spent unit now and waits for the answers.
func (s *session) settleAll(ctx context.Context) { s.settleEach(ctx, false) }

// settleEach settles every reservation, all at once; with all it also
// gives back every unspent unit and idle slot.
func (s *session) settleEach(ctx context.Context, all bool) {
	if !s.a.cfg.Delegate {
		return
	}
	var wg sync.WaitGroup
	s.each(func(n *node) {
		pools, quota := n.holdings()
		for _, p := range pools {
			if all {
				wg.Go(func() { p.returnIdle(ctx) })
			}
		}
		for _, q := range quota {
			wg.Go(func() { q.settleNow(ctx, all) })
		}
	})
	wg.Wait()
}
