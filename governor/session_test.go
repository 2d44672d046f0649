package governor_test

import (
	"context"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/governor-project/governor/governor"
)

func TestDroppedReplyIsRetriedWithTheSameRequestID(t *testing.T) {
	f := newFake(time.Minute)
	// The first Consume is applied, but its reply is lost.
	f.consume = func(n int) error {
		if n == 0 {
			return status.Error(codes.Unavailable, "connection reset")
		}
		return nil
	}
	c := dialFake(t, f)
	ctx, task, err := c.NewTask(t.Context(), governor.Spec{Name: "t"})
	if err != nil {
		t.Fatal(err)
	}
	if err := task.Consume(ctx, "calls", 2); err != nil {
		t.Fatalf("Consume = %v, want success on the retry", err)
	}
	ids := f.requestIDs("Consume")
	if len(ids) != 2 || ids[0] != ids[1] {
		t.Fatalf("request ids %q, want the same id twice", ids)
	}
	if b, err := hex.DecodeString(ids[0]); err != nil || len(b) != 16 {
		t.Fatalf("request id %q is not 16 bytes in hex", ids[0])
	}
	f.mu.Lock()
	charged := len(f.consumed)
	f.mu.Unlock()
	if charged != 1 {
		t.Fatalf("charged %d times, want once", charged)
	}
	// The next call is a new request.
	if err := task.Consume(ctx, "calls", 1); err != nil {
		t.Fatal(err)
	}
	if ids := f.requestIDs("Consume"); len(ids) != 3 || ids[2] == ids[0] {
		t.Fatalf("request ids %q, want a fresh id for a new call", ids)
	}
}

func TestAcquireRetryGetsTheOriginalLease(t *testing.T) {
	f := newFake(time.Minute)
	// Granted, then the reply is lost; and the retry meets UNAVAILABLE once
	// more before it gets through.
	f.acquire = func(n int, granted bool) error {
		if (n == 0 && granted) || n == 1 {
			return status.Error(codes.Unavailable, "lost")
		}
		return nil
	}
	c := dialFake(t, f)
	ctx, task, err := c.NewTask(t.Context(), governor.Spec{Name: "t"})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := task.Acquire(ctx, "db")
	if err != nil {
		t.Fatal(err)
	}
	ids := f.requestIDs("Acquire")
	if len(ids) != 3 || ids[0] != ids[1] || ids[1] != ids[2] {
		t.Fatalf("request ids %q, want one id for all three attempts", ids)
	}
	f.mu.Lock()
	granted, first := len(f.leases), f.leases[ids[0]]
	f.mu.Unlock()
	if granted != 1 || lease.ID() != first {
		t.Fatalf("got lease %d, want %d, the one lease granted (of %d)", lease.ID(), first, granted)
	}
}

func TestCallCancelledByTheServerIsRetriedAsANewRequest(t *testing.T) {
	f := newFake(time.Minute)
	// The server dropped the first wait (as when it saw the connection go);
	// the caller still wants the lease.
	f.acquire = func(n int, granted bool) error {
		if n == 0 && !granted {
			return status.Error(codes.Canceled, "the wait was withdrawn")
		}
		return nil
	}
	c := dialFake(t, f)
	ctx, task, err := c.NewTask(t.Context(), governor.Spec{Name: "t"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := task.Acquire(ctx, "db"); err != nil {
		t.Fatal(err)
	}
	if ids := f.requestIDs("Acquire"); len(ids) != 2 || ids[0] == ids[1] {
		t.Fatalf("request ids %q, want a new id after the server cancelled", ids)
	}
}

func TestUnavailableIsBoundedByTheContext(t *testing.T) {
	f := newFake(time.Minute)
	c := dialFake(t, f)
	ctx, task, err := c.NewTask(t.Context(), governor.Spec{Name: "t"})
	if err != nil {
		t.Fatal(err)
	}
	f.down.Store(true)
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	err = task.Consume(cctx, "calls", 1)
	if !errors.Is(err, governor.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Consume = %v, want UNAVAILABLE then the deadline", err)
	}
	if n := f.count("Consume"); n != 0 {
		t.Fatalf("%d consumes reached the fake while it was down", n)
	}
	f.down.Store(false)
	if c.Err() != nil {
		t.Fatalf("session lost by a short outage: %v", c.Err())
	}
}

func TestLocalDeadlineWhenHeartbeatsStop(t *testing.T) {
	const ttl = 600 * time.Millisecond
	f := newFake(ttl)
	f.heartbeat = func(_ context.Context, n int) error {
		if n >= 2 {
			return status.Error(codes.Unavailable, "no answer")
		}
		return nil
	}
	c := dialFake(t, f)
	ctx, task, err := c.NewTask(t.Context(), governor.Spec{Name: "t"})
	if err != nil {
		t.Fatal(err)
	}
	<-c.Done()
	lost := time.Now()
	last := f.lastHeartbeat()
	if last.IsZero() {
		t.Fatal("no heartbeat succeeded")
	}
	// Given up 80% of the TTL after the last good heartbeat was sent: not
	// before (allowing for the trip to the fake), and before the server
	// would expire the session.
	if since := lost.Sub(last); since < ttl*8/10-50*time.Millisecond || since >= ttl {
		t.Fatalf("given up %v after the last good heartbeat, want about %v and under %v", since, ttl*8/10, ttl)
	}
	if !errors.Is(c.Err(), governor.ErrSessionLost) {
		t.Fatalf("Err = %v, want ErrSessionLost", c.Err())
	}
	// Every task context from the client is cancelled, and calls fail closed
	// without reaching the server.
	<-ctx.Done()
	if !errors.Is(context.Cause(ctx), governor.ErrSessionLost) {
		t.Fatalf("task cause = %v, want ErrSessionLost", context.Cause(ctx))
	}
	before := f.count("Consume")
	if err := task.Consume(t.Context(), "calls", 1); !errors.Is(err, governor.ErrSessionLost) {
		t.Fatalf("Consume after losing the session: %v, want ErrSessionLost", err)
	}
	if _, _, err := c.NewTask(t.Context(), governor.Spec{Name: "u"}); !errors.Is(err, governor.ErrSessionLost) {
		t.Fatalf("NewTask after losing the session: %v, want ErrSessionLost", err)
	}
	if _, err := c.Raw().GetNode(t.Context(), nil); !errors.Is(err, governor.ErrSessionLost) {
		t.Fatalf("Raw call after losing the session: %v, want ErrSessionLost", err)
	}
	if f.count("Consume") != before {
		t.Fatal("a call reached the server after the session was given up")
	}
}

// The deadline is measured from when the heartbeat was sent, not from when
// its reply came: a slow reply must not push it past the server's expiry.
func TestLocalDeadlineIsMeasuredFromTheSendTime(t *testing.T) {
	const ttl, slow = 600 * time.Millisecond, 250 * time.Millisecond
	f := newFake(ttl)
	f.heartbeat = func(ctx context.Context, n int) error {
		if n > 0 {
			return status.Error(codes.Unavailable, "no answer")
		}
		select {
		case <-time.After(slow):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	c := dialFake(t, f)
	<-c.Done()
	lost := time.Now()
	sent := f.lastHeartbeat() // it arrived at once; only the reply was slow
	if sent.IsZero() {
		t.Fatal("the slow heartbeat did not succeed")
	}
	if since := lost.Sub(sent); since < ttl*8/10-50*time.Millisecond || since >= ttl {
		t.Fatalf("given up %v after the heartbeat was sent, want about %v (from the reply it would be %v)",
			since, ttl*8/10, slow+ttl*8/10)
	}
}

func TestOutageEndsAtTheLocalDeadline(t *testing.T) {
	const ttl = 600 * time.Millisecond
	f := newFake(ttl)
	c := dialFake(t, f)
	ctx, task, err := c.NewTask(t.Context(), governor.Spec{Name: "t"})
	if err != nil {
		t.Fatal(err)
	}
	f.down.Store(true)
	// No deadline of its own: the session's local deadline ends the retries.
	start := time.Now()
	err = task.Consume(ctx, "calls", 1)
	if !errors.Is(err, governor.ErrSessionLost) || !errors.Is(err, governor.ErrUnavailable) {
		t.Fatalf("Consume during an outage: %v, want ErrSessionLost after UNAVAILABLE", err)
	}
	if waited := time.Since(start); waited >= ttl {
		t.Fatalf("Consume returned after %v, want within the %v TTL", waited, ttl)
	}
}

func TestSessionForgottenByTheServerIsGivenUp(t *testing.T) {
	t.Run("heartbeat", func(t *testing.T) {
		const ttl = 600 * time.Millisecond
		f := newFake(ttl)
		f.heartbeat = func(context.Context, int) error {
			return status.Error(codes.Unauthenticated, "unknown or expired session")
		}
		c := dialFake(t, f)
		start := time.Now()
		<-c.Done()
		// At the first heartbeat, not at the local deadline.
		if waited := time.Since(start); waited >= ttl*8/10 {
			t.Fatalf("given up after %v, want at the first heartbeat (%v)", waited, ttl/3)
		}
		if !errors.Is(c.Err(), governor.ErrSessionLost) || !errors.Is(c.Err(), governor.ErrUnauthenticated) {
			t.Fatalf("Err = %v, want ErrSessionLost because of UNAUTHENTICATED", c.Err())
		}
	})
	t.Run("call", func(t *testing.T) {
		f := newFake(time.Minute)
		f.consume = func(int) error { return status.Error(codes.Unauthenticated, "unknown or expired session") }
		c := dialFake(t, f)
		ctx, task, err := c.NewTask(t.Context(), governor.Spec{Name: "t"})
		if err != nil {
			t.Fatal(err)
		}
		if err := task.Consume(ctx, "calls", 1); !errors.Is(err, governor.ErrUnauthenticated) {
			t.Fatalf("Consume = %v, want ErrUnauthenticated", err)
		}
		<-c.Done()
		<-ctx.Done()
		if !errors.Is(c.Err(), governor.ErrSessionLost) {
			t.Fatalf("Err = %v, want ErrSessionLost", c.Err())
		}
	})
}

func TestTransportReportsOverload(t *testing.T) {
	f := newFake(time.Minute)
	c := dialFake(t, f)
	ctx, _, err := c.NewTask(t.Context(), governor.Spec{Name: "t"})
	if err != nil {
		t.Fatal(err)
	}
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/busy":
			w.WriteHeader(http.StatusTooManyRequests)
		case "/down":
			w.WriteHeader(http.StatusServiceUnavailable)
		case "/overloaded":
			w.WriteHeader(529)
		case "/later":
			w.Header().Set("Retry-After", "1")
		}
	}))
	defer origin.Close()
	hc := &http.Client{Transport: governor.Transport(origin.Client().Transport)}
	paths := []string{"/ok", "/busy", "/down", "/overloaded", "/later"}
	for _, p := range paths {
		req, _ := http.NewRequestWithContext(ctx, "GET", origin.URL+p, nil)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.releases) != len(paths) {
		t.Fatalf("%d releases, want %d", len(f.releases), len(paths))
	}
	for i, r := range f.releases {
		if want := i > 0; r.GetOverloaded() != want {
			t.Errorf("%s: overloaded = %v, want %v", paths[i], r.GetOverloaded(), want)
		}
		if r.GetLatency().AsDuration() <= 0 {
			t.Errorf("%s: no latency reported", paths[i])
		}
	}
}

func TestDialConfigErrors(t *testing.T) {
	t.Setenv(governor.EnvTLS, "yes")
	_, err := governor.Dial(t.Context())
	if err == nil || !strings.Contains(err.Error(), governor.EnvTLS) || !errors.Is(err, governor.ErrInvalidArgument) {
		t.Fatalf("Dial with GOVERNOR_TLS=yes: %v, want an error naming %s", err, governor.EnvTLS)
	}
	t.Setenv(governor.EnvTLS, "")
	t.Setenv(governor.EnvAPIKey, "")
	_, err = governor.Dial(t.Context())
	if err == nil || !strings.Contains(err.Error(), governor.EnvAPIKey) {
		t.Fatalf("Dial without a key: %v, want an error naming %s", err, governor.EnvAPIKey)
	}
	_, err = governor.Dial(t.Context(), governor.WithAPIKey("k"), governor.WithCAFile(t.TempDir()+"/missing.pem"))
	if err == nil || !strings.Contains(err.Error(), governor.EnvCAFile) {
		t.Fatalf("Dial with a missing CA file: %v, want an error naming %s", err, governor.EnvCAFile)
	}
}
