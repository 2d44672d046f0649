// Package budget is governor-proxy's Admitter: the sidecar's one session
// with governord, on the Go SDK, and the budgets governord delegates to it.
//
// With delegation on (the default) a request costs no call to governord at
// all in the common case. For each node (the worker's task, a subtask) and
// lease class the session holds a block of slots, and for each node and
// resource a reservation of quota units; both are charged against every
// cap above at once, so caps hold at every instant across any number of
// sidecars. Admit grants from them under a mutex. When local demand
// outgrows a block it is topped up in one call (never waiting); after a
// linger with no demand, idle slots go back. While acquires of a class
// queue at governord anywhere (a Watch notice, or the answer to a top-up),
// idle slots go back at once and each request takes a single lease through
// governord's fair queue, so weights hold exactly under contention.
// A resource that a rate binds on the node's chain is delegated only with
// a slice of the rate (slice.go): while nobody contends for the rate,
// governord answers a top-up with units and a share of the rate's refill
// and burst for a short term, which requests spend from a local bucket
// with no call, and later top-ups renew. Under contention it answers with
// nothing reserved and Rated, since units spent here later would escape
// the rate's buckets and the fleet could pass the rate; each request then
// charges it at governord, as with delegation off, and a top-up asks again
// after RatedRecheck.
// Reservations are spent locally, settled every settle interval, topped up
// in one call, given back when idle and at shutdown, and given back at
// once when governord recalls them for someone else: a quota of N admits
// exactly N requests across sidecars. Calls made in slots are reported in
// batches for adaptive limits, and how many of each block's slots hold
// work, and since when, for governor doctor and top (usereport.go). Each
// top-up's answer says whether the
// tenant is read_only, and a write is refused from what the answers said;
// a change of the tenant's state recalls everything, and nothing held
// before the recall is granted after it (tenantstate.go).
//
// With delegation off, each request is one ChargeAndAcquire and one Release,
// as before delegation existed.
//
// Work a rate refuses is paced (pace.go): held, in arrival order per
// subtask and resource, until the rate has room, as long as its ctx allows,
// unless its rule says on_rate: deny.
//
// When the session is lost (governord unreachable past the SDK's local
// deadline) every admission fails closed until a new session is open. During
// a short outage the sidecar goes on granting from what it holds.
//
// It may import the standard library, the Go SDK, package admission and
// Prometheus' client.
package budget

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/internal/retry"
	"github.com/governor-project/governor/proxy/admission"
)

// Defaults of Config's zero fields.
const (
	DefaultLinger         = 250 * time.Millisecond
	DefaultMaxBlock       = 64
	DefaultMaxReservation = 1000
	DefaultSettleEvery    = time.Second
	// DefaultUnavailableRetry is how long one call keeps retrying while
	// governord is unreachable before the request fails closed, rather than
	// holding it for its whole wait. A standby's answer lifts it: governord
	// is failing over, and a waiting request queues again at the new
	// leader within its wait (governor.WithUnavailableRetry, docs/ha.md).
	DefaultUnavailableRetry = time.Second
	// sampleEvery is how often calls made in slots are reported.
	sampleEvery = 100 * time.Millisecond
	// callTimeout bounds a call made on the sidecar's own behalf (a top-up
	// a caller waits on, a give-back, a settlement).
	callTimeout = 30 * time.Second
	// MaxSubtasks bounds the subtask names one session resolves, so that a
	// client inventing names cannot grow the sidecar (or the tree) without
	// end.
	MaxSubtasks = 10_000
	// DefaultSubtaskIdle is how long a subtask may hold nothing and run
	// nothing before the sidecar ends it.
	DefaultSubtaskIdle = 5 * time.Minute
	// DefaultRatedRecheck is how long a resource that governord would not
	// reserve, because a rate binds it, is charged per request before a
	// top-up asks again, so that delegation resumes once the rate is gone.
	DefaultRatedRecheck = 10 * time.Second
)

// Config is what the Admitter is built with.
type Config struct {
	// Task is the worker's task, found or created under the tenant.
	Task governor.Spec
	// Dial are the SDK's options (address, key, TLS, ...).
	Dial []governor.Option
	// Delegate turns delegated budgets on. Off: one ChargeAndAcquire and one
	// Release per unit of work.
	Delegate bool
	// Linger is how long idle slots and unspent units are kept without
	// demand before they go back. Zero: DefaultLinger.
	Linger time.Duration
	// MaxBlock and MaxReservation bound one node's block of one class and
	// reservation of one resource. Zero: the defaults.
	MaxBlock       int64
	MaxReservation int64
	// SettleEvery is how often spent units are reported. Zero:
	// DefaultSettleEvery.
	SettleEvery time.Duration
	// SubtaskIdle is how long a subtask (one per Proxy-Authorization
	// username or application_name) may hold nothing and run nothing
	// before the sidecar closes it at governord and forgets it; its next
	// use finds or creates it again. Zero: DefaultSubtaskIdle.
	SubtaskIdle time.Duration
	// RatedRecheck is how long a resource a rate binds (governord reserves
	// none of it) is charged per request before the sidecar asks again.
	// Zero: DefaultRatedRecheck.
	RatedRecheck time.Duration
	// Logger receives the session's events. Nil discards.
	Logger *slog.Logger
	// Metrics, if not nil, receives the admitter's series.
	Metrics *Metrics
}

func (c *Config) fill() {
	if c.Linger <= 0 {
		c.Linger = DefaultLinger
	}
	if c.MaxBlock <= 0 {
		c.MaxBlock = DefaultMaxBlock
	}
	if c.MaxReservation <= 0 {
		c.MaxReservation = DefaultMaxReservation
	}
	if c.SettleEvery <= 0 {
		c.SettleEvery = DefaultSettleEvery
	}
	if c.SubtaskIdle <= 0 {
		c.SubtaskIdle = DefaultSubtaskIdle
	}
	if c.RatedRecheck <= 0 {
		c.RatedRecheck = DefaultRatedRecheck
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Metrics == nil {
		c.Metrics = NewMetrics()
	}
}

// Admitter admits work on the worker's task through governord. Build it
// with New, run its session with Run, and Close it at shutdown.
type Admitter struct {
	cfg Config
	log *slog.Logger
	m   *Metrics

	cur   atomic.Pointer[session] // nil while there is no session
	ready chan struct{}           // closed when the first session is up
	once  sync.Once
	done  chan struct{} // closed when Run has returned

	// idle workers run the calls that follow a ticket's end (a release, a
	// give-back), so that End never waits on governord.
	bg background

	local localDenials // refusals decided here, not yet reported (denials.go)

	pace pacer // work a rate refused, waiting for room (pace.go)
}

// New returns an Admitter with no session yet: until Run opens one, every
// admission fails closed.
func New(cfg Config) *Admitter {
	cfg.fill()
	return &Admitter{cfg: cfg, log: cfg.Logger, m: cfg.Metrics, ready: make(chan struct{}), done: make(chan struct{}),
		bg: background{idle: make(chan func())}, pace: pacer{m: cfg.Metrics}}
}

// Ready is closed once the first session is open and the task found.
func (a *Admitter) Ready() <-chan struct{} { return a.ready }

// Up reports whether a session is open now.
func (a *Admitter) Up() bool { return a.cur.Load() != nil }

// Backoff between attempts to open a session.
const (
	redialBase = 100 * time.Millisecond
	redialMax  = 10 * time.Second
)

// Run keeps a session open until ctx ends, dialing again with backoff when
// it is lost. The session in force when ctx ends is left open for Close.
func (a *Admitter) Run(ctx context.Context) {
	defer close(a.done)
	for attempt := 0; ; attempt++ {
		s, err := a.connect(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			delay := retry.Backoff(redialBase, redialMax, attempt)
			a.log.Error("governor-proxy: cannot open a session with governord; new work is denied (fail closed)",
				"err", err, "retry_in", delay.Round(time.Millisecond))
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return
			}
			continue
		}
		attempt = 0
		a.cur.Store(s)
		a.m.sessionUp.Set(1)
		a.once.Do(func() { close(a.ready) })
		a.log.Info("governor-proxy: session open", "task", s.task.t.Name(), "task_id", s.task.t.ID(),
			"scope", s.client.ScopeID(), "delegation", a.cfg.Delegate)
		select {
		case <-ctx.Done():
			return
		case <-s.client.Done():
			a.log.Error("governor-proxy: session lost; dialing again, and new work is denied meanwhile", "err", s.client.Err())
		}
		a.cur.CompareAndSwap(s, nil)
		a.m.sessionUp.Set(0)
		s.stop()
		a.bg.Go(func() { s.client.Close() })
	}
}

// connect opens a session and finds or creates the worker's task.
func (a *Admitter) connect(ctx context.Context) (*session, error) {
	opts := append([]governor.Option{governor.WithUnavailableRetry(DefaultUnavailableRetry)}, a.cfg.Dial...)
	c, err := governor.Dial(ctx, opts...)
	if err != nil {
		return nil, err
	}
	// The task's context lives as long as the session, not as ctx; the
	// call is bounded by the SDK's retry of an unreachable governord.
	tctx, t, created, err := c.FindOrCreateTask(context.Background(), a.cfg.Task)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("find or create task %q: %w", a.cfg.Task.Name, err)
	}
	if created {
		a.log.Info("governor-proxy: created the task", "task", t.Name(), "task_id", t.ID())
	}
	s := newSession(a, c, tctx, t)
	s.start()
	return s, nil
}

// Admit admits one unit of work: the charges from the node's reservations,
// then a slot of the class from its block (or a single lease while the
// class is contended). Work a rate refuses waits for room in arrival order
// as long as ctx allows, unless r.DenyRate (pace.go). See
// admission.Admitter.
func (a *Admitter) Admit(ctx context.Context, r admission.Request) (admission.Ticket, error) {
	var err error
	if r, err = checkCharges(r); err != nil {
		d := &admission.Denial{Cause: admission.CauseBadRequest, Class: r.Class, Err: err}
		a.m.denied(d.Cause)
		return nil, d
	}
	s := a.cur.Load()
	if s == nil {
		return nil, &admission.Denial{Cause: admission.CauseUnavailable, Class: r.Class, Err: errNoSession}
	}
	var t admission.Ticket
	var node int64
	err = a.pace.admit(ctx, r, func(waitRate bool) error {
		var err error
		t, node, err = s.admit(ctx, r, waitRate)
		return err
	})
	if err != nil {
		d := admission.Deny(ctx, err, r.Class, 0)
		a.m.denied(d.Cause)
		a.noteDenial(node, err, d)
		return nil, d
	}
	return t, nil
}

var errNoSession = errors.New("no session with governord")

// TryAdmit admits r from what the session holds, when that needs no wait and
// no call to governord: the node known, its reservations and its block with
// room, and the class not contended. See admission.Fast.
func (a *Admitter) TryAdmit(r admission.Request) (admission.Ticket, bool) {
	s := a.cur.Load()
	if s == nil || !a.cfg.Delegate || r.Spent {
		return nil, false
	}
	if _, err := checkCharges(r); err != nil {
		return nil, false // Admit refuses it
	}
	return s.tryAdmit(r)
}

// checkCharges refuses charges no work can make, before anything is taken
// for them: a negative amount, or one over governor.MaxAmount, which
// governord would refuse too, but only after a local budget had been
// counted with it. Charges of 0 are dropped. A Spent request's charges
// (what work that already ran used, as a response said) are cut to
// MaxAmount instead: the work ran, and is charged as far as the caps allow.
func checkCharges(r admission.Request) (admission.Request, error) {
	ok := true
	for _, v := range r.Charges {
		ok = ok && v > 0 && v <= governor.MaxAmount
	}
	if ok {
		return r, nil
	}
	charges := make(map[string]int64, len(r.Charges))
	for _, res := range slices.Sorted(maps.Keys(r.Charges)) {
		switch v := r.Charges[res]; {
		case v < 0:
			return r, fmt.Errorf("a charge of %d %s is negative", v, res)
		case v > governor.MaxAmount && !r.Spent:
			return r, fmt.Errorf("a charge of %d %s is over %d, the most one request may charge", v, res, governor.MaxAmount)
		case v > 0:
			charges[res] = min(v, governor.MaxAmount)
		}
	}
	r.Charges = charges
	return r, nil
}

// Settle reports every unit spent so far to governord now, as the periodic
// settlement does, and returns when governord has them (or ctx ends).
// Usage read from governord afterwards includes them.
func (a *Admitter) Settle(ctx context.Context) {
	if s := a.cur.Load(); s != nil {
		s.settleAll(ctx)
	}
}

// Close gives back what is delegated and idle, waits (until ctx ends) for
// the calls that follow tickets, and closes the session, which releases at
// governord whatever is still held. Run must have returned (its ctx ended).
func (a *Admitter) Close(ctx context.Context) error {
	<-a.done
	s := a.cur.Swap(nil)
	if s != nil {
		s.giveBackAll(ctx)
		s.stop()
		s.wg.Wait()
	}
	drained := make(chan struct{})
	go func() { a.bg.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-ctx.Done():
		a.log.Warn("governor-proxy: closing the session with releases still running; governord releases what they held")
	}
	var err error
	if s != nil {
		err = s.client.Close()
	}
	<-drained // each call is bounded by callTimeout, and the session is closed
	a.m.sessionUp.Set(0)
	return err
}

// background runs calls off the request's path. Idle workers are reused, so
// each call does not pay for a new goroutine's stack to grow through gRPC;
// when none is idle a goroutine is started, so nothing waits in a queue.
type background struct {
	idle chan func()
	wg   sync.WaitGroup

	mu      sync.RWMutex
	closed  bool
	workers int
}

// maxIdleWorkers bounds the workers kept waiting for background calls.
const maxIdleWorkers = 32

// Go runs f in the background; once closed, in the caller, so that what
// follows a ticket still happens during a shutdown. A caller that holds a
// lock f takes uses Spawn.
func (b *background) Go(f func()) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		f()
		return
	}
	b.start(f)
}

// Spawn is Go that never runs f in the caller: once closed, f gets a
// goroutine of its own.
func (b *background) Spawn(f func()) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		go f()
		return
	}
	b.start(f)
}

// start hands f to an idle worker, or to a new one. b.mu is read-locked.
func (b *background) start(f func()) {
	select {
	case b.idle <- f:
		return
	default:
	}
	b.wg.Add(1)
	go b.work(f)
}

func (b *background) work(f func()) {
	defer b.wg.Done()
	f()
	b.mu.Lock()
	if b.closed || b.workers >= maxIdleWorkers {
		b.mu.Unlock()
		return
	}
	b.workers++
	b.mu.Unlock()
	for f := range b.idle {
		f()
	}
}

// Wait stops the workers once every call has run, and waits for them.
func (b *background) Wait() {
	b.mu.Lock()
	if !b.closed {
		b.closed = true
		close(b.idle)
	}
	b.mu.Unlock()
	b.wg.Wait()
}
