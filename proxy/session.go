package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/internal/retry"
)

const (
	// unavailableRetry bounds how long one call keeps retrying, under one
	// request id, while governord answers UNAVAILABLE. It covers a blip; a
	// longer outage fails closed at once instead of holding every request
	// for its whole wait_timeout.
	unavailableRetry = time.Second

	// releaseTimeout bounds a release or an after-the-response charge that
	// runs in the background.
	releaseTimeout = 10 * time.Second

	// Backoff between attempts to open a session.
	redialBase = 100 * time.Millisecond
	redialMax  = 10 * time.Second

	// maxSubtasks bounds the subtask names one session remembers, so that a
	// client inventing names cannot grow the sidecar (or the tree) without
	// end.
	maxSubtasks = 10_000
)

// governance keeps the sidecar's one session with governord and the nodes
// it charges: the worker's task, and a subtask per Proxy-Authorization
// username. When the session is lost it dials again in the background, with
// backoff; meanwhile every admission fails closed.
//
// It talks to governord through Client.Raw: the SDK's Task type can only be
// created (CreateNode), not found, and a sidecar that restarts must find its
// task. So the request-id retries the SDK does for Task calls are done here.
type governance struct {
	log      *slog.Logger
	dialOpts []governor.Option
	task     TaskConfig
	metrics  *metrics

	cur   atomic.Pointer[session] // nil while there is no session
	ready chan struct{}           // closed when the first session is up
	once  sync.Once

	bg   background    // releases and charges after the response
	done chan struct{} // closed when the loop has returned
}

// background runs the calls that follow a response (releases, charges from
// headers) off the request's path. Idle workers are reused, so each call
// does not pay for a new goroutine's stack to grow through gRPC; when none
// is idle a goroutine is started, so nothing waits in a queue (a release
// that waited would hold its slot longer).
type background struct {
	idle chan func()
	wg   sync.WaitGroup

	mu      sync.RWMutex
	closed  bool
	workers int
}

// maxIdleWorkers bounds the workers kept waiting for background calls.
const maxIdleWorkers = 32

// Go runs f in the background.
func (b *background) Go(f func()) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		f()
		return
	}
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

// session is one governord session and the node ids resolved under it.
type session struct {
	client *governor.Client
	rpc    governorpb.GovernorClient
	task   int64
	name   string

	// forgotten is closed when governord answers that it no longer knows
	// the session, so that the loop dials again without waiting for the
	// SDK's next heartbeat to find out.
	forgotten  chan struct{}
	forgetOnce sync.Once

	mu       sync.Mutex
	subtasks map[string]*subtask
}

func (s *session) forget() { s.forgetOnce.Do(func() { close(s.forgotten) }) }

// subtask is a name being resolved, or resolved, to a node id.
type subtask struct {
	done chan struct{}
	id   int64
	err  error
}

func newGovernance(cfg Config, log *slog.Logger, m *metrics, extra []governor.Option) *governance {
	opts := []governor.Option{
		governor.WithLogger(log),
		// The sidecar may inherit HTTPS_PROXY pointing at itself: its own
		// connection to governord must never go through it.
		governor.WithGRPCOptions(grpc.WithNoProxy()),
	}
	if cfg.Governor.Addr != "" {
		opts = append(opts, governor.WithAddr(cfg.Governor.Addr))
	}
	if cfg.Governor.APIKey != "" {
		opts = append(opts, governor.WithAPIKey(cfg.Governor.APIKey))
	}
	return &governance{log: log, dialOpts: append(opts, extra...), task: cfg.Task, metrics: m,
		ready: make(chan struct{}), done: make(chan struct{}), bg: background{idle: make(chan func())}}
}

// run keeps a session open until ctx ends. The session in force when ctx
// ends is left open: close waits for the releases, then closes it.
func (g *governance) run(ctx context.Context) {
	defer close(g.done)
	for attempt := 0; ; attempt++ {
		s, err := g.connect(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			delay := backoff(attempt)
			g.log.Error("governor-proxy: cannot open a session with governord; new work is denied (fail closed)",
				"err", err, "retry_in", delay.Round(time.Millisecond))
			if !sleep(ctx, delay) {
				return
			}
			continue
		}
		attempt = 0
		g.cur.Store(s)
		g.metrics.sessionUp.Set(1)
		g.once.Do(func() { close(g.ready) })
		g.log.Info("governor-proxy: session open", "task", s.name, "task_id", s.task, "scope", s.client.ScopeID())
		select {
		case <-ctx.Done():
			return
		case <-s.client.Done():
			g.log.Error("governor-proxy: session lost; dialing again, and new work is denied meanwhile", "err", s.client.Err())
		case <-s.forgotten:
			g.log.Error("governor-proxy: governord no longer knows the session; dialing again")
		}
		g.cur.CompareAndSwap(s, nil)
		g.metrics.sessionUp.Set(0)
		g.bg.Go(func() { s.client.Close() })
	}
}

// connect opens a session and finds or creates the worker's task.
func (g *governance) connect(ctx context.Context) (*session, error) {
	c, err := governor.Dial(ctx, g.dialOpts...)
	if err != nil {
		return nil, err
	}
	s := &session{client: c, rpc: c.Raw(), subtasks: map[string]*subtask{}, forgotten: make(chan struct{})}
	spec := &governorpb.NodeSpec{Name: g.task.Name, Quotas: g.task.Quotas, Limits: g.task.Limits}
	if !g.task.Deadline.IsZero() {
		spec.Deadline = timestamppb.New(g.task.Deadline)
	}
	fctx, cancel := context.WithTimeout(ctx, governor.DefaultDialTimeout)
	defer cancel()
	resp, err := s.findOrCreate(fctx, c.ScopeID(), spec)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("find or create task %q: %w", g.task.Name, err)
	}
	s.task, s.name = resp.GetNode().GetId(), resp.GetNode().GetName()
	if resp.GetCreated() {
		g.log.Info("governor-proxy: created the task", "task", s.name, "task_id", s.task)
	}
	return s, nil
}

// close waits (until ctx ends) for the background releases, then closes the
// session, which releases at the server whatever is still held.
func (g *governance) close(ctx context.Context) error {
	<-g.done
	drained := make(chan struct{})
	go func() { g.bg.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-ctx.Done():
		g.log.Warn("governor-proxy: closing the session with releases still running; governord releases what they held")
	}
	var err error
	if s := g.cur.Swap(nil); s != nil {
		err = s.client.Close()
	}
	<-drained // each is bounded by releaseTimeout, and the session is closed
	return err
}

// session returns the session in force, or nil.
func (g *governance) session() *session { return g.cur.Load() }

// node returns the node id to charge for subtask name (the task itself for
// ""), finding or creating the subtask the first time, once however many
// requests ask at the same time.
func (s *session) node(ctx context.Context, name string) (int64, error) {
	if name == "" {
		return s.task, nil
	}
	for {
		s.mu.Lock()
		st, ok := s.subtasks[name]
		if !ok {
			if len(s.subtasks) >= maxSubtasks {
				s.mu.Unlock()
				return 0, errTooManySubtasks
			}
			st = &subtask{done: make(chan struct{})}
			s.subtasks[name] = st
			s.mu.Unlock()
			resp, err := s.findOrCreate(ctx, s.task, &governorpb.NodeSpec{Name: name})
			st.id, st.err = resp.GetNode().GetId(), err
			if st.err != nil {
				s.mu.Lock()
				delete(s.subtasks, name) // the next request tries again
				s.mu.Unlock()
			}
			close(st.done)
			return st.id, st.err
		}
		s.mu.Unlock()
		select {
		case <-st.done:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		if st.err == nil {
			return st.id, nil
		}
		// The request that resolved it went away or failed: our own
		// attempt decides.
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if !isContextErr(st.err) {
			return 0, st.err
		}
	}
}

// findOrCreate finds the open child of parent named by spec, or creates it.
func (s *session) findOrCreate(ctx context.Context, parent int64, spec *governorpb.NodeSpec) (*governorpb.FindOrCreateNodeResponse, error) {
	var resp *governorpb.FindOrCreateNodeResponse
	err := retryUnavailable(ctx, func(ctx context.Context, id string) error {
		var err error
		resp, err = s.rpc.FindOrCreateNode(ctx, &governorpb.FindOrCreateNodeRequest{RequestId: id, ParentId: parent, Spec: spec})
		return err
	})
	return resp, err
}

var errTooManySubtasks = fmt.Errorf("more than %d subtask names in use", maxSubtasks)

// lease is a lease the proxy holds for a request or a tunnel. Its release
// runs in the background, once.
type lease struct {
	g     *governance
	s     *session
	id    int64
	class string
	once  sync.Once
}

// admit charges and takes a lease on the subtask's node in one call. class
// may be empty (charge only; no lease is returned). It returns a *denial
// when governord says no, cannot be reached, or the wait runs out.
func (g *governance) admit(ctx context.Context, subtaskName, class string, charges map[string]int64) (*lease, error) {
	s := g.session()
	if s == nil {
		return nil, &denial{cause: causeUnavailable, err: errors.New("no session with governord")}
	}
	node, err := s.node(ctx, subtaskName)
	if err != nil {
		return nil, g.denialFor(ctx, s, class, err)
	}
	var resp *governorpb.ChargeAndAcquireResponse
	err = retryUnavailable(ctx, func(ctx context.Context, id string) error {
		var err error
		resp, err = s.rpc.ChargeAndAcquire(ctx, &governorpb.ChargeAndAcquireRequest{RequestId: id, NodeId: node, Class: class, Charges: charges})
		return err
	})
	if err != nil {
		return nil, g.denialFor(ctx, s, class, err)
	}
	if resp.GetLease() == nil {
		return nil, nil
	}
	return &lease{g: g, s: s, id: resp.GetLease().GetId(), class: class}, nil
}

// release frees the lease in the background, reporting latency (time to the
// response headers; 0 for none) and whether the upstream was overloaded.
// Only the first call counts.
func (l *lease) release(latency time.Duration, overloaded bool) {
	if l == nil {
		return
	}
	l.once.Do(func() {
		l.g.bg.Go(func() {
			if l.s.client.Err() != nil {
				return // the session ended, and its leases with it
			}
			ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
			defer cancel()
			req := &governorpb.ReleaseRequest{LeaseId: l.id, Overloaded: overloaded}
			if latency > 0 {
				req.Latency = durationpb.New(latency)
			}
			err := retryUnavailable(ctx, func(ctx context.Context, id string) error {
				req.RequestId = id
				_, err := l.s.rpc.Release(ctx, req)
				return err
			})
			if err != nil {
				l.g.metrics.releaseFailures.Inc()
				l.g.log.Warn("governor-proxy: release failed", "lease", l.id, "class", l.class, "err", err)
			}
		})
	})
}

// remainder is what is left under the cap a quota denial names, or 0.
func remainder(err error) int64 {
	if status.Code(err) != codes.ResourceExhausted {
		return 0
	}
	for _, d := range status.Convert(err).Details() {
		if den, ok := d.(*governorpb.Denial); ok {
			return den.Limit - den.Used
		}
	}
	return 0
}

// consumeFor charges amount of resource to the subtask (the task for "")
// in the background, after a response: the request has been served, so a
// refusal is only logged and counted.
func (g *governance) consumeFor(subtaskName, rule, resource string, amount int64) {
	s := g.session()
	if s == nil {
		g.metrics.headerCharges.WithLabelValues(rule, "failed").Inc()
		return
	}
	g.bg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
		defer cancel()
		node, err := s.node(ctx, subtaskName)
		outcome := "charged"
		// What was spent was spent: when all of it would go over a cap,
		// charge what is left under the cap (a few times, for caps higher
		// up), so the budget is recorded as spent and later requests that
		// charge it upfront are refused.
		for try := 0; err == nil && try < 4; try++ {
			err = retryUnavailable(ctx, func(ctx context.Context, id string) error {
				_, err := s.rpc.Consume(ctx, &governorpb.ConsumeRequest{RequestId: id, NodeId: node, Resource: resource, Amount: amount})
				return err
			})
			left := remainder(err)
			if left <= 0 || left >= amount {
				break
			}
			amount, err, outcome = left, nil, "capped"
		}
		if err != nil {
			outcome = "failed"
			if status.Code(err) == codes.ResourceExhausted {
				outcome = "denied"
			}
			g.log.Warn("governor-proxy: charge after the response failed", "rule", rule, "resource", resource, "amount", amount, "err", err)
		}
		g.metrics.headerCharges.WithLabelValues(rule, outcome).Inc()
	})
}

// denialFor turns a failed admission into a denial, and kicks a session the
// server has forgotten.
func (g *governance) denialFor(ctx context.Context, s *session, class string, err error) error {
	d := &denial{class: class, err: err}
	st, isStatus := status.FromError(err)
	switch {
	case errors.Is(err, errTooManySubtasks):
		d.cause = causeBadRequest
	case s.client.Err() != nil || errors.Is(err, governor.ErrSessionLost) || errors.Is(err, governor.ErrClosed):
		d.cause = causeUnavailable
	case isStatus && st.Code() == codes.ResourceExhausted:
		d.cause = causeQuota
		for _, det := range st.Details() {
			if x, ok := det.(*governorpb.Denial); ok {
				d.quota = x
			}
		}
	case isStatus && st.Code() == codes.FailedPrecondition:
		d.cause = causeTaskEnded
		for _, det := range st.Details() {
			if x, ok := det.(*governorpb.NodeEnded); ok {
				d.ended = x
			}
		}
	case ctx.Err() != nil && errors.Is(context.Cause(ctx), errWaitTimeout),
		// governord may see the deadline (sent as grpc-timeout) a moment
		// before this process does; the only deadline is the wait's.
		isStatus && st.Code() == codes.DeadlineExceeded:
		d.cause = causeWaitTimeout
	case ctx.Err() != nil:
		d.cause = causeCanceled
	case isStatus && st.Code() == codes.Unauthenticated:
		d.cause = causeUnavailable
		s.forget()
	default:
		d.cause = causeUnavailable
		g.log.Error("governor-proxy: governord refused an admission", "err", err)
	}
	return d
}

// errWaitTimeout is the cause of an admission context whose wait_timeout ran
// out, which tells it apart from a client that went away.
var errWaitTimeout = errors.New("wait_timeout passed")

// retryUnavailable runs one call until it succeeds or fails for good. Every
// attempt carries the same request id, so governord applies it at most once
// even when a reply was lost. UNAVAILABLE is retried, with backoff, for up
// to unavailableRetry.
func retryUnavailable(ctx context.Context, attempt func(ctx context.Context, requestID string) error) error {
	id := retry.RequestID()
	giveUp := time.Now().Add(unavailableRetry)
	var unavailable error
	for try := 0; ; try++ {
		err := attempt(ctx, id)
		if err != nil && unavailable != nil && ctx.Err() != nil {
			// The wait ran out while governord was unreachable: say so,
			// rather than only that time ran out.
			return unavailable
		}
		if err == nil || status.Code(err) != codes.Unavailable || ctx.Err() != nil || time.Now().After(giveUp) {
			return err
		}
		unavailable = err
		if !sleep(ctx, retry.Backoff(25*time.Millisecond, 200*time.Millisecond, try)) {
			return err
		}
	}
}

func isContextErr(err error) bool {
	c := status.Code(err)
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		c == codes.Canceled || c == codes.DeadlineExceeded
}

func backoff(attempt int) time.Duration {
	return retry.Backoff(redialBase, redialMax, attempt)
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
