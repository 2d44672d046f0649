package governor_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor"
)

// origin is a downstream that records how many requests it serves at once.
// The first `gate` requests are held until that many are in flight
// together, so a limit of gate is reached for certain, and any request past
// the limit would be seen in flight alongside them.
type origin struct {
	*httptest.Server
	mu       sync.Mutex
	inFlight int
	max      int
	served   int
	gate     int
	opened   bool
	reached  chan struct{}
}

func newOrigin(t *testing.T, gate int, handler http.HandlerFunc) *origin {
	o := &origin{gate: gate, reached: make(chan struct{})}
	o.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.enter()
		defer o.leave()
		if handler != nil {
			handler(w, r)
		}
	}))
	t.Cleanup(o.Close)
	return o
}

// enter counts the request in; leave counts it out.
func (o *origin) enter() {
	o.mu.Lock()
	o.inFlight++
	o.served++
	o.max = max(o.max, o.inFlight)
	if o.inFlight == o.gate && !o.opened {
		o.opened = true
		close(o.reached)
	}
	o.mu.Unlock()
	select {
	case <-o.reached:
	case <-time.After(5 * time.Second): // the limit is lower than the gate: fail below
	}
}

func (o *origin) leave() {
	o.mu.Lock()
	o.inFlight--
	o.mu.Unlock()
}

func (o *origin) stats() (maxInFlight, served int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.max, o.served
}

func TestTransportChargesAndHoldsALeasePerRequest(t *testing.T) {
	const body = "hello from the origin"
	o := newOrigin(t, 1, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		io.WriteString(w, body)
	})
	c := dialReal(t)
	ctx, task := newTask(t, t.Context(), c, governor.Spec{Quotas: map[string]int64{"http": 2}})
	hc := &http.Client{Transport: governor.Transport(o.Client().Transport)}

	for i := range 2 {
		req, _ := http.NewRequestWithContext(ctx, "GET", o.URL, nil)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.ContentLength != int64(len(body)) {
			t.Errorf("ContentLength = %d, want %d", resp.ContentLength, len(body))
		}
		// The lease is held until the body is done with.
		if held := heldOn(t, c, task.ID(), "http"); held != 1 {
			t.Errorf("request %d: held = %d while the body is open, want 1", i, held)
		}
		var got []byte
		if i == 0 {
			got, err = io.ReadAll(resp.Body) // read to the end: released at EOF
		} else {
			got = make([]byte, 5)
			_, err = io.ReadFull(resp.Body, got) // closed early: released at Close
		}
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			if string(got) != body {
				t.Fatalf("body = %q, want %q", got, body)
			}
			if held := heldOn(t, c, task.ID(), "http"); held != 0 {
				t.Errorf("held = %d after the body was read, want 0", held)
			}
		}
		if err := resp.Body.Close(); err != nil {
			t.Fatal(err)
		}
		if held := heldOn(t, c, task.ID(), "http"); held != 0 {
			t.Errorf("request %d: held = %d after Close, want 0", i, held)
		}
	}

	// The quota is spent: the request is refused before it is sent.
	req, _ := http.NewRequestWithContext(ctx, "GET", o.URL, nil)
	_, err := hc.Do(req)
	var d *governor.Denial
	if !errors.As(err, &d) || d.Resource != "http" || d.NodeID != task.ID() {
		t.Fatalf("third request: %v, want a denial of http on the task", err)
	}
	if _, served := o.stats(); served != 2 {
		t.Fatalf("origin served %d requests, want 2", served)
	}

	// Without a task in the context the request is refused, not sent
	// ungoverned.
	req, _ = http.NewRequestWithContext(t.Context(), "GET", o.URL, nil)
	if _, err := hc.Do(req); !errors.Is(err, governor.ErrNoTask) {
		t.Fatalf("request without a task: %v, want ErrNoTask", err)
	}
}

func TestTransportLimitsConcurrencyAtTheOrigin(t *testing.T) {
	const limit, requests = 2, 8
	o := newOrigin(t, limit, nil)
	c := dialReal(t)
	ctx, _ := newTask(t, t.Context(), c, governor.Spec{Limits: map[string]int64{"http": limit}})
	hc := &http.Client{Transport: governor.Transport(o.Client().Transport)}
	var wg sync.WaitGroup
	errs := make(chan error, requests)
	for range requests {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, "GET", o.URL, nil)
			resp, err := hc.Do(req)
			if err != nil {
				errs <- err
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if maxInFlight, served := o.stats(); maxInFlight != limit || served != requests {
		t.Fatalf("origin saw at most %d at once over %d requests, want %d over %d", maxInFlight, served, limit, requests)
	}
}

func TestGroupLimitsConcurrencyToTheClassLimit(t *testing.T) {
	const limit, jobs = 3, 12
	o := newOrigin(t, limit, nil)
	c := dialReal(t)
	ctx, parent := newTask(t, t.Context(), c, governor.Spec{Limits: map[string]int64{governor.ClassAgents: limit}})
	plain := o.Client()

	g, gctx := governor.NewGroup(ctx, governor.ClassAgents)
	var subtasks sync.Map
	for i := range jobs {
		g.Go(governor.Spec{Name: fmt.Sprintf("job-%d", i)}, func(ctx context.Context) error {
			task := governor.TaskFromContext(ctx)
			if task == nil || task == parent {
				return errors.New("fn does not run in its own subtask")
			}
			subtasks.Store(task.ID(), true)
			req, _ := http.NewRequestWithContext(ctx, "GET", o.URL, nil)
			resp, err := plain.Do(req)
			if err != nil {
				return err
			}
			return resp.Body.Close()
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	if gctx.Err() == nil {
		t.Error("the group's context is not cancelled after Wait")
	}
	if maxInFlight, served := o.stats(); maxInFlight != limit || served != jobs {
		t.Fatalf("origin saw at most %d at once over %d jobs, want %d over %d", maxInFlight, served, limit, jobs)
	}
	// Every subtask was closed and its lease released.
	resp, err := c.Raw().ListChildren(ctx, &governorpb.ListChildrenRequest{NodeId: parent.ID()})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetNodes()) != jobs {
		t.Fatalf("%d subtasks, want %d", len(resp.GetNodes()), jobs)
	}
	for _, n := range resp.GetNodes() {
		if _, ok := subtasks.Load(n.GetId()); !ok || n.GetState() != governorpb.NodeState_NODE_STATE_CLOSED {
			t.Errorf("subtask %d %q is %v", n.GetId(), n.GetName(), n.GetState())
		}
	}
	if held := heldOn(t, c, parent.ID(), governor.ClassAgents); held != 0 {
		t.Fatalf("held = %d after Wait, want 0", held)
	}
}

func TestGroupFirstErrorCancelsTheRest(t *testing.T) {
	c := dialReal(t)
	ctx, _ := newTask(t, t.Context(), c, governor.Spec{Limits: map[string]int64{"agents": 1}})
	g, gctx := governor.NewGroup(ctx, "agents")
	boom := errors.New("boom")
	started := make(chan struct{})
	g.Go(governor.Spec{Name: "fails"}, func(ctx context.Context) error {
		close(started)
		return boom
	})
	// This one waits for the single slot, or starts after the failure: either
	// way its context ends and it returns.
	<-started
	g.Go(governor.Spec{Name: "waits"}, func(ctx context.Context) error {
		<-ctx.Done()
		return ctx.Err()
	})
	if err := g.Wait(); !errors.Is(err, boom) {
		t.Fatalf("Wait = %v, want boom", err)
	}
	if !errors.Is(context.Cause(gctx), boom) {
		t.Fatalf("group cause = %v, want boom", context.Cause(gctx))
	}
}

func TestGroupWithoutTaskRunsNothing(t *testing.T) {
	g, _ := governor.NewGroup(t.Context(), "agents")
	var ran atomic.Bool
	g.Go(governor.Spec{}, func(context.Context) error { ran.Store(true); return nil })
	if err := g.Wait(); !errors.Is(err, governor.ErrNoTask) || ran.Load() {
		t.Fatalf("Wait = %v, ran = %v; want ErrNoTask and nothing run", err, ran.Load())
	}
}

func TestRetryDrawsFromTheRetryQuota(t *testing.T) {
	c := dialReal(t)
	// The tenant's defaults give every task retry: 3.
	ctx, task := newTask(t, t.Context(), c, governor.Spec{})
	boom := errors.New("downstream down")
	attempts := 0
	err := governor.Retry(ctx, func(context.Context) error {
		attempts++
		return boom
	}, governor.WithBackoff(time.Millisecond, 5*time.Millisecond))
	if attempts != 4 {
		t.Fatalf("%d attempts, want 4: one free and three from the budget", attempts)
	}
	if !errors.Is(err, boom) || !errors.Is(err, governor.ErrQuotaExhausted) {
		t.Fatalf("Retry = %v, want the last error and the denial", err)
	}
	n, err := c.Raw().GetNode(ctx, &governorpb.GetNodeRequest{NodeId: task.ID()})
	if err != nil {
		t.Fatal(err)
	}
	if used := n.GetUsed()["retry"]; used != 3 {
		t.Fatalf("retry used = %d, want 3", used)
	}

	// The budget is shared: a subtask's retries come out of the same quota.
	subCtx, _ := newTask(t, ctx, c, governor.Spec{Name: "sub"})
	attempts = 0
	err = governor.Retry(subCtx, func(context.Context) error { attempts++; return boom })
	if attempts != 1 || !errors.Is(err, governor.ErrQuotaExhausted) {
		t.Fatalf("subtask: %d attempts, %v; want 1 and a denial", attempts, err)
	}
}

func TestRetryStopsOnSuccessAndOnPermanentErrors(t *testing.T) {
	c := dialReal(t)
	ctx, task := newTask(t, t.Context(), c, governor.Spec{Quotas: map[string]int64{"retry": 10}})
	attempts := 0
	err := governor.Retry(ctx, func(context.Context) error {
		if attempts++; attempts < 3 {
			return errors.New("flaky")
		}
		return nil
	}, governor.WithBackoff(time.Millisecond, time.Millisecond))
	if err != nil || attempts != 3 {
		t.Fatalf("Retry = %v after %d attempts, want success after 3", err, attempts)
	}

	// A governor refusal is not retried.
	attempts = 0
	err = governor.Retry(ctx, func(context.Context) error { attempts++; return governor.ErrQuotaExhausted })
	if attempts != 1 || !errors.Is(err, governor.ErrQuotaExhausted) {
		t.Fatalf("refusal: %d attempts, %v", attempts, err)
	}

	// WithMaxAttempts caps attempts below the budget.
	attempts = 0
	governor.Retry(ctx, func(context.Context) error { attempts++; return errors.New("x") },
		governor.WithMaxAttempts(2), governor.WithBackoff(time.Millisecond, time.Millisecond))
	if attempts != 2 {
		t.Fatalf("%d attempts, want 2", attempts)
	}

	n, err := c.Raw().GetNode(ctx, &governorpb.GetNodeRequest{NodeId: task.ID()})
	if err != nil {
		t.Fatal(err)
	}
	if used := n.GetUsed()["retry"]; used != 3 {
		t.Fatalf("retry used = %d, want 3 (2 + 0 + 1)", used)
	}

	// It stops when its context ends, with the last error.
	cctx, cancel := context.WithCancel(ctx)
	attempts = 0
	err = governor.Retry(cctx, func(context.Context) error {
		attempts++
		cancel()
		return errors.New("late")
	})
	if attempts != 1 || !errors.Is(err, context.Canceled) || err.Error() == "" {
		t.Fatalf("cancelled: %d attempts, %v", attempts, err)
	}
}

func TestRetryWithoutTaskDoesNotRun(t *testing.T) {
	ran := false
	err := governor.Retry(t.Context(), func(context.Context) error { ran = true; return nil })
	if !errors.Is(err, governor.ErrNoTask) || ran {
		t.Fatalf("Retry = %v, ran = %v; want ErrNoTask and fn not called", err, ran)
	}
}

// WithRetryResource draws retries from another quota, and WithRetryIf
// returns at once an error it does not deem worth a retry.
func TestRetryResourceAndRetryIf(t *testing.T) {
	c := dialReal(t)
	ctx, task := newTask(t, t.Context(), c, governor.Spec{Quotas: map[string]int64{"retry": 10, "db_retry": 2}})
	attempts := 0
	err := governor.Retry(ctx, func(context.Context) error { attempts++; return errors.New("x") },
		governor.WithRetryResource("db_retry"), governor.WithBackoff(time.Millisecond, time.Millisecond))
	if attempts != 3 || !errors.Is(err, governor.ErrQuotaExhausted) {
		t.Fatalf("%d attempts, %v; want 3 (one free, two from db_retry) and the denial", attempts, err)
	}
	permanent := errors.New("bad request")
	attempts = 0
	err = governor.Retry(ctx, func(context.Context) error { attempts++; return permanent },
		governor.WithRetryIf(func(err error) bool { return !errors.Is(err, permanent) }))
	if attempts != 1 || !errors.Is(err, permanent) {
		t.Fatalf("%d attempts, %v; want 1 and the permanent error", attempts, err)
	}
	n, err := c.Raw().GetNode(ctx, &governorpb.GetNodeRequest{NodeId: task.ID()})
	if err != nil {
		t.Fatal(err)
	}
	if n.GetUsed()["db_retry"] != 2 || n.GetUsed()["retry"] != 0 {
		t.Fatalf("used %v; want db_retry 2 and no retry", n.GetUsed())
	}
}

// TenantRefusalError reads a refusal's detail as the SDK's error: nil for
// none, else naming the tenant, its state and what was refused.
func TestTenantRefusalError(t *testing.T) {
	if err := governor.TenantRefusalError(nil); err != nil {
		t.Fatalf("no detail: %v", err)
	}
	err := governor.TenantRefusalError(&governorpb.TenantRefusal{Tenant: "payments", State: "suspended", Reason: "incident 42", Refused: "new work"})
	if !errors.Is(err, governor.ErrTenantState) || err.Tenant != "payments" || err.State != "suspended" || err.Reason != "incident 42" || err.Refused != "new work" {
		t.Fatalf("TenantRefusalError = %+v", err)
	}
}
