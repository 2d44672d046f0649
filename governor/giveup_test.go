package governor_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/internal/pgtest"
	"github.com/governor-project/governor/server"
	"github.com/governor-project/governor/server/serverconfig"
)

// Callers that give up must leave nothing held: a grant made as the
// caller's context ends is given back, by governord when it sees the end
// before the grant is committed, and by the SDK when the answer is lost
// after that (it abandons the request id, and governord gives back what the
// id got).

// giveUpsEnv sets how many acquires TestGivingUpLeavesNothingHeld makes per
// store: the 5,000 by default (about a second per store on an idle
// machine).
const giveUpsEnv = "GOVERNOR_GIVEUP_ACQUIRES"

func giveUps(t *testing.T) int {
	if v := os.Getenv(giveUpsEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q is not a positive count", giveUpsEnv, v)
		}
		return n
	}
	return 5000
}

// startGiveUpServer starts governord on the store named ("sqlite" or
// "postgres") with a root limit of 1 on class db, as in the issue.
func startGiveUpServer(t *testing.T, driver string) *server.Server {
	t.Helper()
	var st serverconfig.StoreConfig
	switch driver {
	case "sqlite":
		st = serverconfig.StoreConfig{Driver: "sqlite", DSN: filepath.Join(t.TempDir(), "governor.db")}
	case "postgres":
		st = serverconfig.StoreConfig{Driver: "postgres", DSN: pgtest.Schema(t, "giveup_")}
	}
	return govtest.Start(t, func(c *serverconfig.Config) {
		c.Store = st
		c.Root.Limits = map[string]int64{"db": 1}
	})
}

// Many callers of Acquire give up at random instants between 0.2 and 3 ms
// against a root limit of 1: afterwards governord holds no lease, queues no
// acquire, and a patient acquire is granted at once, without queueing.
func TestGivingUpLeavesNothingHeld(t *testing.T) {
	for _, driver := range []string{"sqlite", "postgres"} {
		t.Run(driver, func(t *testing.T) {
			srv := startGiveUpServer(t, driver)
			// A long TTL: a loaded machine must not cost the session.
			c := dialReal(t, governor.WithAddr(srv.Addr()), governor.WithAPIKey(govtest.TenantKey), governor.WithTTL(time.Minute))
			_, task := newTask(t, t.Context(), c, governor.Spec{})
			n := giveUps(t)
			var granted, gaveUp atomic.Int64
			var overrun atomic.Int64 // the longest a caller waited past its deadline
			var wg sync.WaitGroup
			inFlight := make(chan struct{}, 64)
			began := time.Now()
			for range n {
				inFlight <- struct{}{}
				wg.Go(func() {
					defer func() { <-inFlight }()
					patience := 200*time.Microsecond + rand.N(2800*time.Microsecond)
					ctx, cancel := context.WithTimeout(context.Background(), patience)
					defer cancel()
					l, err := task.Acquire(ctx, "db")
					if err != nil {
						deadline, _ := ctx.Deadline()
						for late := int64(time.Since(deadline)); ; {
							was := overrun.Load()
							if late <= was || overrun.CompareAndSwap(was, late) {
								break
							}
						}
						if !errors.Is(err, context.DeadlineExceeded) {
							t.Errorf("an acquire failed for another reason than its deadline: %v", err)
						}
						gaveUp.Add(1)
						return
					}
					granted.Add(1)
					if err := l.Release(context.Background(), 0, false); err != nil {
						t.Errorf("release: %v", err)
					}
				})
			}
			wg.Wait()
			took := time.Since(began)
			t.Logf("%d acquires in %v: %d granted, %d gave up (returning at most %v after their deadline); governord gave back %v (caller gone) and %v (abandoned)",
				n, took.Round(time.Millisecond), granted.Load(), gaveUp.Load(), time.Duration(overrun.Load()).Round(time.Microsecond),
				govtest.Metric(t, srv, `governor_given_back_total{why="caller_gone"}`),
				govtest.Metric(t, srv, `governor_given_back_total{why="abandoned"}`))
			if leases := govtest.Metric(t, srv, "governor_leases"); leases != 0 {
				t.Errorf("governord holds %v leases after every caller released or gave up", leases)
			}
			if held := heldOn(t, c, task.ID(), "db"); held != 0 {
				t.Errorf("the task holds %d leases of db", held)
			}
			if waiting := govtest.Metric(t, srv, "governor_acquires_waiting"); waiting != 0 {
				t.Errorf("%v acquires still wait at governord", waiting)
			}
			queued := govtest.Metric(t, srv, "governor_acquire_wait_seconds_count")
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			l, err := task.Acquire(ctx, "db")
			if err != nil {
				t.Fatalf("the patient acquire: %v", err)
			}
			if now := govtest.Metric(t, srv, "governor_acquire_wait_seconds_count"); now != queued {
				t.Errorf("the patient acquire queued: the slot was held")
			}
			if err := l.Release(ctx, 0, false); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// answerLost makes the first call of each method it names reach governord
// and be answered there, while the caller never sees the answer: the
// caller's context is cancelled as the answer arrives, as when its deadline
// passes at that instant. Abandons pass through untouched.
type answerLost struct {
	mu      sync.Mutex
	methods map[string]bool
	cancel  context.CancelFunc // the caller's
	lost    []string           // methods whose answer was lost
}

type abandoning interface{ GetAbandon() bool }

func (a *answerLost) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	a.mu.Lock()
	lose := a.methods[method] && !req.(abandoning).GetAbandon()
	if lose {
		delete(a.methods, method)
		a.lost = append(a.lost, method)
	}
	a.mu.Unlock()
	if !lose {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	if err := invoker(context.WithoutCancel(ctx), method, req, reply, cc, opts...); err != nil {
		return err
	}
	a.cancel()
	return status.FromContextError(context.Canceled).Err()
}

// A grant whose answer the caller's end made it miss is given back before
// the call returns: the lease with its charges, a charge without a lease,
// a block's new slots, a reservation's new units.
func TestGrantWhoseAnswerWasLostIsGivenBack(t *testing.T) {
	srv := govtest.Start(t, func(c *serverconfig.Config) {
		c.Root.Limits = map[string]int64{"db": 4}
		c.Root.Quotas = map[string]int64{"tokens": 1000}
	})
	cases := []struct {
		method string
		call   func(ctx context.Context, task *governor.Task) error
		left   func(n *governorpb.Node) int64 // what the task still holds
	}{
		{governorpb.Governor_Acquire_FullMethodName, func(ctx context.Context, task *governor.Task) error {
			_, err := task.Acquire(ctx, "db")
			return err
		}, func(n *governorpb.Node) int64 { return n.Held["db"] }},
		{governorpb.Governor_ChargeAndAcquire_FullMethodName, func(ctx context.Context, task *governor.Task) error {
			_, err := task.ChargeAndAcquire(ctx, "db", map[string]int64{"tokens": 5})
			return err
		}, func(n *governorpb.Node) int64 { return n.Held["db"] + n.Used["tokens"] }},
		{governorpb.Governor_ChargeAndAcquire_FullMethodName, func(ctx context.Context, task *governor.Task) error {
			_, err := task.ChargeAndAcquire(ctx, "", map[string]int64{"tokens": 5}) // a charge without a lease
			return err
		}, func(n *governorpb.Node) int64 { return n.Used["tokens"] }},
		{governorpb.Governor_ResizeBlock_FullMethodName, func(ctx context.Context, task *governor.Task) error {
			_, err := task.ResizeBlock(ctx, "db", 3, 0)
			return err
		}, func(n *governorpb.Node) int64 { return n.Held["db"] }},
		{governorpb.Governor_Reserve_FullMethodName, func(ctx context.Context, task *governor.Task) error {
			_, err := task.Reserve(ctx, "tokens", 0, 0, 40)
			return err
		}, func(n *governorpb.Node) int64 { return n.Reserved["tokens"] + n.Used["tokens"] }},
	}
	for _, tc := range cases {
		t.Run(filepath.Base(tc.method), func(t *testing.T) {
			lost := &answerLost{methods: map[string]bool{tc.method: true}}
			c := dialReal(t, governor.WithAddr(srv.Addr()), governor.WithAPIKey(govtest.TenantKey),
				governor.WithGRPCOptions(grpc.WithChainUnaryInterceptor(lost.intercept)))
			_, task := newTask(t, t.Context(), c, governor.Spec{})
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			lost.cancel = cancel
			err := tc.call(ctx, task)
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("the call whose answer was lost returned %v, want context.Canceled", err)
			}
			if len(lost.lost) != 1 {
				t.Fatalf("no answer was lost (%v): the test did not run its case", lost.lost)
			}
			n, err := c.Raw().GetNode(t.Context(), &governorpb.GetNodeRequest{NodeId: task.ID()})
			if err != nil {
				t.Fatal(err)
			}
			if left := tc.left(n); left != 0 {
				t.Errorf("%d left held after the call returned", left)
			}
		})
	}
}

// unreachable makes every grant call of one method reach governord and be
// granted there, while the caller only ever sees UNAVAILABLE, as when the
// connection breaks after each request arrives. It reports on abandoned
// when an abandon of that method has been answered.
type unreachable struct {
	method    string
	abandoned chan error
}

func (u *unreachable) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	if method != u.method {
		return err
	}
	if req.(abandoning).GetAbandon() {
		select {
		case u.abandoned <- err:
		default:
		}
		return err
	}
	return status.Error(codes.Unavailable, "the connection broke after the request arrived")
}

// A call given up after its UNAVAILABLE retries (WithUnavailableRetry) may
// have been granted by an attempt whose answer was lost: what it got is
// given back once governord can be told, and the call fails closed
// meanwhile.
func TestGrantGivenUpAsUnavailableIsGivenBack(t *testing.T) {
	srv := govtest.Start(t, func(c *serverconfig.Config) { c.Root.Limits = map[string]int64{"db": 1} })
	u := &unreachable{method: governorpb.Governor_Acquire_FullMethodName, abandoned: make(chan error, 1)}
	c := dialReal(t, governor.WithAddr(srv.Addr()), governor.WithAPIKey(govtest.TenantKey),
		governor.WithUnavailableRetry(50*time.Millisecond), governor.WithGRPCOptions(grpc.WithChainUnaryInterceptor(u.intercept)))
	_, task := newTask(t, t.Context(), c, governor.Spec{})
	_, err := task.Acquire(t.Context(), "db")
	if !errors.Is(err, governor.ErrUnavailable) {
		t.Fatalf("Acquire through a connection that breaks: %v, want ErrUnavailable", err)
	}
	select {
	case err := <-u.abandoned:
		if err != nil {
			t.Fatalf("the abandon: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the acquire that was given up was never abandoned")
	}
	if held := heldOn(t, c, task.ID(), "db"); held != 0 {
		t.Errorf("the task holds %d leases after the acquire was given up and abandoned", held)
	}
}

// flaky answers UNAVAILABLE to the give-backs of method for a while from
// the first, as a governord restarting does, then lets them through.
type flaky struct {
	method string
	for_   time.Duration
	mu     sync.Mutex
	since  time.Time
	failed int
}

func (f *flaky) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	giveBack := false
	switch r := req.(type) {
	case *governorpb.ReleaseRequest:
		giveBack = true
	case *governorpb.ReserveRequest:
		giveBack = r.GetWant() == 0
	case *governorpb.ResizeBlockRequest:
		giveBack = r.GetWant() == 0
	}
	if method == f.method && giveBack {
		f.mu.Lock()
		if f.since.IsZero() {
			f.since = time.Now()
		}
		down := time.Since(f.since) < f.for_
		if down {
			f.failed++
		}
		f.mu.Unlock()
		if down {
			return status.Error(codes.Unavailable, "governord is restarting")
		}
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// A give-back (a Release, a settlement, slots returned) keeps trying
// through an outage longer than WithUnavailableRetry's bound, within its
// caller's time: failed fast, it would leave what it frees held until the
// session ends, and the limit full meanwhile.
func TestGiveBacksOutlastTheUnavailableBound(t *testing.T) {
	srv := govtest.Start(t, func(c *serverconfig.Config) {
		c.Root.Limits = map[string]int64{"db": 1}
		c.Tenants[0].Quotas = map[string]int64{"calls": 100}
	})
	for _, tc := range []struct {
		method   string
		giveBack func(ctx context.Context, task *governor.Task) error
	}{
		{governorpb.Governor_Release_FullMethodName, func(ctx context.Context, task *governor.Task) error {
			l, err := task.Acquire(ctx, "db")
			if err != nil {
				return err
			}
			return l.Release(ctx, 0, false)
		}},
		{governorpb.Governor_Reserve_FullMethodName, func(ctx context.Context, task *governor.Task) error {
			if _, err := task.Reserve(ctx, "calls", 0, 0, 10); err != nil {
				return err
			}
			_, err := task.Reserve(ctx, "calls", 2, 8, 0)
			return err
		}},
		{governorpb.Governor_ResizeBlock_FullMethodName, func(ctx context.Context, task *governor.Task) error {
			b, err := task.ResizeBlock(ctx, "db", 1, 0)
			if err != nil || b.Granted != 1 {
				return fmt.Errorf("the block: %+v %w", b, err)
			}
			_, err = task.ResizeBlock(ctx, "db", 0, 1)
			return err
		}},
	} {
		t.Run(tc.method, func(t *testing.T) {
			f := &flaky{method: tc.method, for_: 300 * time.Millisecond}
			c := dialReal(t, governor.WithAddr(srv.Addr()), governor.WithAPIKey(govtest.TenantKey),
				governor.WithUnavailableRetry(50*time.Millisecond), governor.WithGRPCOptions(grpc.WithChainUnaryInterceptor(f.intercept)))
			_, task := newTask(t, t.Context(), c, governor.Spec{})
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			if err := tc.giveBack(ctx, task); err != nil {
				t.Fatalf("a give-back through a %v outage with a 50ms bound: %v", f.for_, err)
			}
			if f.failed < 2 {
				t.Errorf("the outage was met %d times", f.failed)
			}
			if held := heldOn(t, c, task.ID(), "db"); held != 0 {
				t.Errorf("%d slots held after the give-back", held)
			}
		})
	}
}
