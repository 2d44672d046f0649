package governor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/internal/retry"
)

const (
	// DefaultDialTimeout bounds how long Dial keeps trying to reach an
	// unavailable governord when ctx has no earlier deadline.
	DefaultDialTimeout = 10 * time.Second

	// localDeadlineShare is the part of the TTL after which the client gives
	// its session up; the rest covers clock drift and work that is slow to
	// notice its context ended.
	localDeadlineShare = 0.8

	// Backoff between attempts of a call that met UNAVAILABLE.
	retryBaseDelay = 25 * time.Millisecond
	retryMaxDelay  = time.Second

	// serverCancelRetries bounds how often a call the server cancelled while
	// the caller still waits is tried again under a new request id.
	serverCancelRetries = 3

	// cleanupTimeout bounds releases and closes that run after the caller's
	// context ended, so that a hung server cannot hang a deferred Close.
	cleanupTimeout = 10 * time.Second

	// grpcWindow is the HTTP/2 flow-control window the client grants each
	// stream and the connection; governord's answers are far smaller.
	grpcWindow = 1 << 20
)

// Client is a session with governord. It keeps the session alive with
// heartbeats, attaches its token to every call, and gives the session up at
// its local deadline. It is safe for concurrent use. Close it when done.
type Client struct {
	conn  *leaderConn // one connection per address (leader.go)
	rpc   governorpb.GovernorClient
	log   *slog.Logger
	token string
	scope int64
	ttl   time.Duration
	every time.Duration // how often to heartbeat
	// unavailableFor bounds a call's retries of UNAVAILABLE (WithUnavailableRetry).
	unavailableFor time.Duration

	// life is the session's lifetime, not a request context. It is cancelled,
	// with the reason as its cause, when the session is lost or closed, and
	// every call and task context of this client is tied to it.
	life context.Context
	end  context.CancelCauseFunc

	mu       sync.Mutex
	deadline time.Time   // local deadline; carries a monotonic reading
	watchdog *time.Timer // fires at deadline
	closing  bool        // Close has begun: heartbeat failures are expected

	loopDone  chan struct{}
	abandons  sync.WaitGroup // abandon calls running in the background
	closeOnce sync.Once
	closeErr  error
}

// Dial opens a session with governord. It reads GOVERNOR_ADDR,
// GOVERNOR_API_KEY, GOVERNOR_TLS and GOVERNOR_CA_FILE; options override them.
// While governord is unavailable it keeps trying until ctx ends or
// DefaultDialTimeout passes, whichever is first. The session is not tied to
// ctx: it lasts until Close or until it is lost.
func Dial(ctx context.Context, opts ...Option) (*Client, error) {
	cfg, err := loadConfig(opts)
	if err != nil {
		return nil, err
	}
	creds, err := cfg.credentials()
	if err != nil {
		return nil, err
	}
	c := &Client{log: cfg.logger, loopDone: make(chan struct{}), unavailableFor: cfg.unavailableFor}
	c.life, c.end = context.WithCancelCause(context.Background())
	dialOpts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithChainUnaryInterceptor(c.unaryInterceptor),
		grpc.WithChainStreamInterceptor(c.streamInterceptor),
		// Fixed flow-control windows turn off gRPC's BDP estimation, which
		// otherwise pings governord after nearly every response (and makes
		// it answer) when calls are small and one at a time: extra writes
		// and wake-ups on both sides for every call.
		grpc.WithStaticStreamWindowSize(grpcWindow),
		grpc.WithStaticConnWindowSize(grpcWindow),
	}, cfg.grpcOpts...)
	addrs, err := splitAddrs(cfg.addr)
	if err != nil {
		c.end(err)
		return nil, err
	}
	conn, err := newLeaderConn(addrs, func(addr string) (*grpc.ClientConn, error) { return grpc.NewClient(addr, dialOpts...) })
	if err != nil {
		c.end(err)
		return nil, err
	}
	c.conn = conn
	c.rpc = governorpb.NewGovernorClient(conn)

	resp, sent, err := c.openSession(ctx, cfg)
	if err != nil {
		c.end(err)
		conn.Close()
		return nil, fmt.Errorf("%w (governord at %s)", err, cfg.addr)
	}
	c.token = resp.GetSessionToken()
	c.scope = resp.GetScopeNodeId()
	c.ttl = resp.GetTtl().AsDuration()
	c.every = resp.GetHeartbeatInterval().AsDuration()
	if c.token == "" || c.scope == 0 || c.ttl <= 0 {
		c.end(ErrSessionLost)
		conn.Close()
		return nil, fmt.Errorf("governor: open a session at %s: the server sent no token, scope or TTL", cfg.addr)
	}
	if c.every <= 0 || c.every > c.ttl/2 {
		c.every = c.ttl / 3
	}
	// OpenSession counts as the first heartbeat.
	c.mu.Lock() // the watchdog may fire at once if OpenSession was slow
	c.deadline = sent.Add(localDeadline(c.ttl))
	c.watchdog = time.AfterFunc(time.Until(c.deadline), c.checkDeadline)
	c.mu.Unlock()
	go c.heartbeatLoop()
	c.log.Debug("governor: session open", "addr", cfg.addr, "scope", c.scope, "ttl", c.ttl)
	return c, nil
}

// openSession trades the API key for a session, trying again while the
// server is unavailable. It returns when the successful attempt was sent.
func (c *Client) openSession(ctx context.Context, cfg *config) (*governorpb.OpenSessionResponse, time.Time, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultDialTimeout)
		defer cancel()
	}
	req := &governorpb.OpenSessionRequest{ApiKey: cfg.apiKey}
	if cfg.ttl > 0 {
		req.Ttl = durationpb.New(cfg.ttl)
	}
	for try := 0; ; try++ {
		sent := time.Now()
		resp, err := c.rpc.OpenSession(ctx, req)
		if err == nil {
			return resp, sent, nil
		}
		// An orphaned session from a lost reply is harmless: it expires
		// after one TTL and holds nothing.
		wait, busy := throttled(err)
		if (status.Code(err) != codes.Unavailable && !busy) || ctx.Err() != nil {
			return nil, time.Time{}, fromStatus("OpenSession", err)
		}
		if busy {
			try-- // governord's wait stands for the backoff
			if werr := sleep(ctx, nil, throttleWait(wait)); werr != nil {
				return nil, time.Time{}, &gaveUpError{op: "OpenSession", why: werr, last: fromStatus("OpenSession", err)}
			}
			continue
		}
		if werr := pause(ctx, nil, try); werr != nil {
			return nil, time.Time{}, &gaveUpError{op: "OpenSession", why: werr, last: fromStatus("OpenSession", err)}
		}
	}
}

// localDeadline is how long after a heartbeat was sent the client keeps its
// session without another success.
func localDeadline(ttl time.Duration) time.Duration {
	return time.Duration(float64(ttl) * localDeadlineShare)
}

// ScopeID is the id of the node the session is scoped to: the API key's
// tenant. Tasks created from a context without a task are its children.
func (c *Client) ScopeID() int64 { return c.scope }

// TTL is the session TTL the server granted.
func (c *Client) TTL() time.Duration { return c.ttl }

// Done is closed when the session ends: given up at its local deadline,
// forgotten by the server, or closed by Close. Err says which.
func (c *Client) Done() <-chan struct{} { return c.life.Done() }

// Err is nil while the session is alive. After Done is closed it returns an
// error wrapping ErrSessionLost (with the reason) or ErrClosed.
func (c *Client) Err() error {
	if c.life.Err() == nil {
		return nil
	}
	return context.Cause(c.life)
}

// Raw returns the generated gRPC client for the calls the SDK does not wrap
// (GetNode, SetCaps, ListChildren, ...). It shares the session: the token is
// attached to every call, and calls fail once the session has ended. Raw
// calls are not retried and carry no request id unless the caller sets one.
func (c *Client) Raw() governorpb.GovernorClient { return c.rpc }

// Close ends the session at the server, which releases every lease it holds,
// cancels every task context from this client and closes the connection.
// Tasks are not closed: close them first. Calling Close again returns the
// first result.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		alive := c.life.Err() == nil
		c.closing = true
		deadline := c.deadline
		c.mu.Unlock()
		if alive {
			if limit := time.Now().Add(cleanupTimeout); limit.Before(deadline) {
				deadline = limit
			}
			ctx, cancel := context.WithDeadline(context.Background(), deadline)
			err := c.call(ctx, "CloseSession", func(ctx context.Context, id string) error {
				_, err := c.rpc.CloseSession(ctx, &governorpb.CloseSessionRequest{RequestId: id})
				return err
			})
			cancel()
			// UNAUTHENTICATED means the session is already gone, which is
			// what Close wants (the API says a retry may see it).
			if err != nil && !errors.Is(err, ErrUnauthenticated) {
				c.closeErr = err
			}
		}
		c.mu.Lock() // abandon starts no call once the session has ended
		c.end(ErrClosed)
		c.mu.Unlock()
		c.watchdog.Stop()
		<-c.loopDone
		c.abandons.Wait()
		if err := c.conn.Close(); err != nil && c.closeErr == nil {
			c.closeErr = fmt.Errorf("governor: close connection: %w", err)
		}
	})
	return c.closeErr
}

// heartbeatLoop renews the session every interval until it ends. A failed
// heartbeat is tried again sooner, with backoff; the watchdog, not this loop,
// decides when the session is lost.
func (c *Client) heartbeatLoop() {
	defer close(c.loopDone)
	t := time.NewTimer(c.every)
	defer t.Stop()
	failures := 0
	for {
		select {
		case <-c.life.Done():
			return
		case <-t.C:
		}
		if c.heartbeat() {
			failures = 0
			t.Reset(c.every)
			continue
		}
		failures++
		// At most a quarter of the interval apart: a failover leaves
		// short windows in which the new leader answers, and the session
		// must not reach its local deadline between them.
		t.Reset(retry.Backoff(c.every/8, c.every/4, failures-1))
	}
}

// heartbeat sends one heartbeat and moves the local deadline if it succeeds.
func (c *Client) heartbeat() bool {
	c.mu.Lock()
	deadline := c.deadline
	c.mu.Unlock()
	// A reply after the local deadline is useless: the session is given up.
	ctx, cancel := context.WithDeadline(c.life, deadline)
	defer cancel()
	resp, sent, err := c.hedgedHeartbeat(ctx)
	if err == nil {
		ttl := resp.GetTtl().AsDuration()
		if ttl <= 0 {
			ttl = c.ttl
		}
		c.extend(sent.Add(localDeadline(ttl)))
		return true
	}
	if c.life.Err() != nil {
		return false
	}
	if status.Code(err) == codes.Unauthenticated {
		c.giveUp(forgotten(err))
		return false
	}
	c.mu.Lock()
	closing := c.closing
	c.mu.Unlock()
	if !closing {
		c.log.Warn("governor: heartbeat failed", "err", err, "session_given_up_in", time.Until(deadline).Round(time.Millisecond))
	}
	return false
}

// heartbeatAnswer is one attempt's outcome and when it was sent.
type heartbeatAnswer struct {
	resp *governorpb.HeartbeatResponse
	sent time.Time
	err  error
}

// hedgedHeartbeat sends a heartbeat, and when no answer has come within half
// an interval sends a second one to the next address, so that a governord
// that answers nothing (a paused leader, one cut off) cannot hold the
// session until its local deadline, while a slow answer still counts. It
// returns the first success, with when that attempt was sent; heartbeats
// are idempotent.
func (c *Client) hedgedHeartbeat(ctx context.Context) (*governorpb.HeartbeatResponse, time.Time, error) {
	answers := make(chan heartbeatAnswer, 2)
	send := func() {
		sent := time.Now() // monotonic: a wall-clock jump does not move the deadline
		resp, err := c.rpc.Heartbeat(ctx, &governorpb.HeartbeatRequest{})
		answers <- heartbeatAnswer{resp, sent, err}
	}
	from, _ := c.conn.current()
	go send()
	hedge := time.NewTimer(c.every / 2)
	defer hedge.Stop()
	pending := 1
	var last error
	for {
		select {
		case a := <-answers:
			pending--
			if a.err == nil {
				return a.resp, a.sent, nil
			}
			last = a.err
			if pending == 0 {
				return nil, time.Time{}, last
			}
		case <-hedge.C:
			if c.conn.skip(from) {
				pending++
				go send()
			}
		}
	}
}

// extend moves the local deadline later, unless the session has ended.
func (c *Client) extend(deadline time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.life.Err() != nil || !deadline.After(c.deadline) {
		return
	}
	c.deadline = deadline
	c.watchdog.Reset(time.Until(deadline))
}

// checkDeadline runs when the watchdog fires. The decision is made under the
// lock so that it cannot interleave with extend.
func (c *Client) checkDeadline() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.life.Err() != nil || c.closing {
		return
	}
	if left := time.Until(c.deadline); left > 0 {
		c.watchdog.Reset(left) // extended while the timer fired
		return
	}
	err := fmt.Errorf("%w: no heartbeat succeeded in time (local deadline: %.0f%% of the %v TTL after the last good one was sent)",
		ErrSessionLost, localDeadlineShare*100, c.ttl)
	c.end(err)
	c.log.Error("governor: session given up; no new work is admitted", "err", err)
}

// giveUp ends the session because it is known to be lost.
func (c *Client) giveUp(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.life.Err() != nil || c.closing {
		return
	}
	c.end(err)
	c.log.Error("governor: session given up; no new work is admitted", "err", err)
}

// unaryInterceptor attaches the session token to every call but OpenSession,
// refuses calls once the session has ended, and cuts calls short when it
// ends while they run.
func (c *Client) unaryInterceptor(ctx context.Context, method string, req, reply any,
	cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if method == governorpb.Governor_OpenSession_FullMethodName {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	if err := c.Err(); err != nil {
		return fmt.Errorf("governor: %s: %w", method, err)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(c.life, func() { cancel(context.Cause(c.life)) })
	defer func() {
		stop()
		cancel(nil)
	}()
	return invoker(c.withToken(ctx), method, req, reply, cc, opts...)
}

// streamInterceptor attaches the token to streaming calls (the API has none
// today) and refuses them once the session has ended.
func (c *Client) streamInterceptor(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn,
	method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if err := c.Err(); err != nil {
		return nil, fmt.Errorf("governor: %s: %w", method, err)
	}
	return streamer(c.withToken(ctx), desc, cc, method, opts...)
}

func (c *Client) withToken(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+c.token)
}

// call runs one API call until it succeeds or fails for good. attempt is
// given the request id to send; every attempt of one call gets the same id,
// so the server applies the call at most once.
//
// UNAVAILABLE is retried with backoff until ctx ends or the session is lost
// (the local deadline bounds it), or, with WithUnavailableRetry, until its
// bound passes with no standby answering (unreachable). A call the server
// cancelled while ctx is still live did nothing, by the API's contract, so
// it is tried again under a new id: the old id may be remembered as
// cancelled. UNAUTHENTICATED means the server has forgotten the session,
// which is then given up.
func (c *Client) call(ctx context.Context, op string, attempt func(ctx context.Context, requestID string) error) error {
	return c.run(ctx, op, attempt, nil, true)
}

// giveBack is call for a call that frees what the session holds (a
// release; units settled or given back; slots given back): the bound of
// WithUnavailableRetry does not apply to it. The bound is there so that new
// work fails closed at once; a give-back failed as fast would leave what it
// frees held until the session ends, while governord restarts or fails over.
// ctx and the session still bound it.
func (c *Client) giveBack(ctx context.Context, op string, attempt func(ctx context.Context, requestID string) error) error {
	return c.run(ctx, op, attempt, nil, false)
}

// grant is call for a call that grants something (a lease, slots, units),
// which must not be left granted when the caller never learns of it. When
// the call ends without an answer it may have been granted anyway: the
// caller's context ended while it was on its way back, or governord was
// unreachable after it arrived. abandon then sends the same request again
// with abandon set, so that governord gives back whatever it granted. The
// caller waits for that (up to cleanupTimeout) when governord was
// reachable, so that once the call returns nothing is held; when governord
// is unreachable it goes on in the background, until it is done or the
// session ends, and the call fails closed at once. A nil abandon makes
// grant call.
func (c *Client) grant(ctx context.Context, op string, attempt, abandon func(ctx context.Context, requestID string) error) error {
	return c.run(ctx, op, attempt, abandon, true)
}

// run is call, grant and giveBack: bounded says whether
// WithUnavailableRetry's bound applies.
func (c *Client) run(ctx context.Context, op string, attempt, abandon func(ctx context.Context, requestID string) error, bounded bool) error {
	id := retry.RequestID()
	var last error // the last transient failure, to explain a give-up
	var unavailableSince time.Time
	cancels := 0
	unanswered := false // an attempt under id may have been applied unseen
	fail := func(err error) error {
		if unanswered && abandon != nil {
			c.abandon(op, id, abandon, status.Code(last) != codes.Unavailable)
		}
		return err
	}
	for try := 0; ; try++ {
		if err := c.Err(); err != nil {
			return sessionEnded(op, err, last)
		}
		err := attempt(ctx, id)
		if err == nil {
			return nil
		}
		unanswered = unanswered || unanswering(ctx, err)
		if cause := c.Err(); cause != nil {
			if code := status.Code(err); last != nil && (code == codes.Canceled || code == codes.DeadlineExceeded) {
				// The session's end cut this attempt off; the failures
				// before it are what explain the end.
				err = last
			}
			return sessionEnded(op, cause, err) // what it held ends with it
		}
		if ctx.Err() != nil {
			last = err
			return fail(fromStatus(op, err))
		}
		switch status.Code(err) {
		case codes.Unavailable:
			last = err
			if unavailableSince.IsZero() {
				unavailableSince = time.Now()
			} else if bounded && c.unreachable(unavailableSince) {
				return fail(fromStatus(op, err))
			}
		case codes.Canceled, codes.DeadlineExceeded:
			last = err
			if cancels++; cancels > serverCancelRetries {
				return fail(fromStatus(op, err))
			}
			id = retry.RequestID()
		case codes.Unauthenticated:
			c.giveUp(forgotten(err))
			return fromStatus(op, err)
		case codes.ResourceExhausted:
			wait, ok := throttled(err)
			if !ok {
				return fromStatus(op, err) // a quota denial: final
			}
			// Not applied: the same id again, once governord's wait is up.
			last = err
			if werr := sleep(ctx, c.life.Done(), throttleWait(wait)); werr != nil {
				if cause := c.Err(); cause != nil {
					return sessionEnded(op, cause, last)
				}
				return fail(&gaveUpError{op: op, why: werr, last: fromStatus(op, last)})
			}
			try-- // governord's wait stands for the backoff
			continue
		default:
			// A definite answer: the server remembers the id's outcome, so
			// an earlier attempt that went unanswered did not grant.
			return fromStatus(op, err)
		}
		if werr := pause(ctx, c.life.Done(), try); werr != nil {
			if cause := c.Err(); cause != nil {
				return sessionEnded(op, cause, last)
			}
			return fail(&gaveUpError{op: op, why: werr, last: fromStatus(op, last)})
		}
	}
}

// unreachable reports whether a call that has met UNAVAILABLE since
// failing has done so for longer than its bound (WithUnavailableRetry)
// with no standby answering. A standby that answered since then means
// that governord is between leaders, not gone: the bound is lifted, so
// that a waiting call keeps trying and queues again at the new leader,
// within its caller's time; the session's local deadline still bounds it,
// since the standby refuses heartbeats too, should no leader follow.
func (c *Client) unreachable(failing time.Time) bool {
	if c.unavailableFor <= 0 || c.conn.standbyAnswered().After(failing) {
		return false
	}
	return time.Since(failing) >= c.unavailableFor
}

// unanswering reports whether an attempt that failed with err may have
// been applied by governord without its answer reaching the caller: it
// was cut off by ctx's end, or by the connection. A CANCELLED or
// DEADLINE_EXCEEDED while ctx is live is governord's own answer, which
// says that nothing was granted.
func unanswering(ctx context.Context, err error) bool {
	switch status.Code(err) {
	case codes.Canceled, codes.DeadlineExceeded:
		return ctx.Err() != nil
	case codes.Unavailable, codes.Unknown, codes.Internal:
		return true
	}
	return false
}

// abandon runs send, which sends the request with requestID again with
// abandon set, until governord has answered it or the session ends. wait
// makes the caller wait for it, up to cleanupTimeout.
func (c *Client) abandon(op, requestID string, send func(ctx context.Context, requestID string) error, wait bool) {
	c.mu.Lock()
	if c.life.Err() != nil {
		c.mu.Unlock()
		return // the session's end gives back whatever it held
	}
	c.abandons.Add(1)
	c.mu.Unlock()
	done := make(chan struct{})
	go func() {
		defer c.abandons.Done()
		defer close(done)
		for try := 0; ; try++ {
			ctx, cancel := context.WithTimeout(c.life, cleanupTimeout)
			err := send(ctx, requestID)
			unanswered := unanswering(ctx, err)
			cancel()
			if err == nil || c.life.Err() != nil {
				return
			}
			if status.Code(err) == codes.Unauthenticated {
				c.giveUp(forgotten(err))
				return
			}
			if !unanswered {
				c.log.Warn("governor: giving back what an abandoned call was granted failed; it is held until the session ends",
					"op", op, "err", err)
				return
			}
			if pause(c.life, nil, try) != nil {
				return
			}
		}
	}()
	if wait {
		t := time.NewTimer(cleanupTimeout)
		defer t.Stop()
		select {
		case <-done:
		case <-t.C:
		}
	}
}

// forgotten is why a session was given up when the server answered
// UNAUTHENTICATED.
func forgotten(err error) error {
	return fmt.Errorf("%w: the server no longer knows it (%w: %s)", ErrSessionLost, ErrUnauthenticated, status.Convert(err).Message())
}

// sessionEnded is the error for a call refused or cut short because the
// session ended; last, if not nil, is the failure that preceded it.
func sessionEnded(op string, cause, last error) error {
	if last == nil {
		return fmt.Errorf("governor: %s: %w", op, cause)
	}
	return &gaveUpError{op: op, why: cause, last: fromStatus(op, last)}
}

// pause waits before attempt try+1: jittered exponential backoff. It
// returns ctx's error if ctx ends first, or ErrSessionLost if stop closes.
func pause(ctx context.Context, stop <-chan struct{}, try int) error {
	return sleep(ctx, stop, retry.Backoff(retryBaseDelay, retryMaxDelay, try))
}
