package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor/engine"
	"github.com/governor-project/governor/server/serverconfig"
	"github.com/governor-project/governor/store"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/golang/glog.(*fileSink).flushDaemon"))
}

func testConfig() serverconfig.Config {
	return serverconfig.Config{Listen: "127.0.0.1:0", MetricsListen: "127.0.0.1:0", SessionTTL: 5 * time.Second,
		AdminKey: "admin-key", Store: serverconfig.StoreConfig{Driver: "memory"}, ReapInterval: 20 * time.Millisecond,
		Root: serverconfig.Caps{Limits: map[string]int64{"db": 4}, Quotas: map[string]int64{"tokens": 1000}},
		Tenants: []serverconfig.TenantConfig{
			{Name: "payments", APIKey: "pay-key", Weight: 4, Defaults: serverconfig.Caps{Quotas: map[string]int64{"retry": 3}}},
			{Name: "reconciliation", APIKey: "recon-key", Weight: 1, Limits: map[string]int64{"db": 2}},
		}}
}

func start(t *testing.T, cfg serverconfig.Config, opts ...Option) *Server {
	t.Helper()
	srv, err := Start(context.Background(), cfg, nil, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv
}

type client struct {
	governorpb.GovernorClient
	conn  *grpc.ClientConn
	ctx   context.Context // carries the session token
	scope int64
	token string
}

func dial(t *testing.T, addr string) (governorpb.GovernorClient, *grpc.ClientConn) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return governorpb.NewGovernorClient(conn), conn
}

func session(t *testing.T, addr, key string, ttl time.Duration) *client {
	t.Helper()
	c, conn := dial(t, addr)
	resp, err := c.OpenSession(context.Background(), &governorpb.OpenSessionRequest{ApiKey: key, Ttl: durationpb.New(ttl)})
	if err != nil {
		t.Fatalf("open session with %q: %v", key, err)
	}
	return &client{GovernorClient: c, conn: conn, scope: resp.ScopeNodeId, token: resp.SessionToken,
		ctx: metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+resp.SessionToken)}
}

func wantCode(t *testing.T, what string, err error, code codes.Code) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("%s: got %v, want %s", what, err, code)
	}
}

func (c *client) task(t *testing.T, name string, quotas map[string]int64) *governorpb.Node {
	t.Helper()
	n, err := c.CreateNode(c.ctx, &governorpb.CreateNodeRequest{ParentId: c.scope,
		Spec: &governorpb.NodeSpec{Name: name, Quotas: quotas}})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestDenialCarriesDetails(t *testing.T) {
	srv := start(t, testConfig())
	pay := session(t, srv.Addr(), "pay-key", 0)
	task := pay.task(t, "checkout-42", nil)
	for range 3 {
		if _, err := pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: task.Id, Resource: "retry", Amount: 1}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: task.Id, Resource: "retry", Amount: 1})
	wantCode(t, "fourth retry", err, codes.ResourceExhausted)
	var d *governorpb.Denial
	for _, det := range status.Convert(err).Details() {
		if x, ok := det.(*governorpb.Denial); ok {
			d = x
		}
	}
	if d == nil || d.Resource != "retry" || d.NodeId != task.Id || d.Used != 3 || d.Limit != 3 || d.Amount != 1 {
		t.Fatalf("denial detail %+v", d)
	}
	// The task inherited retry: 3 from the tenant's defaults.
	if task.Quotas["retry"] != 3 {
		t.Fatalf("task quotas %v, want retry 3 from the tenant's defaults", task.Quotas)
	}
	// A root quota: the largest consumer is named.
	other := pay.task(t, "bulk", nil)
	if _, err := pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: other.Id, Resource: "tokens", Amount: 900}); err != nil {
		t.Fatal(err)
	}
	_, err = pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: task.Id, Resource: "tokens", Amount: 200})
	wantCode(t, "over the root's tokens", err, codes.ResourceExhausted)
	d = status.Convert(err).Details()[0].(*governorpb.Denial)
	if d.NodeId != 1 || d.LargestConsumerName != "payments" || d.LargestConsumerUsed != 900 || d.Used != 900 || d.Limit != 1000 {
		t.Fatalf("root denial %+v", d)
	}
}

func TestStatusCodes(t *testing.T) {
	srv := start(t, testConfig())
	pay := session(t, srv.Addr(), "pay-key", 0)
	task := pay.task(t, "t", nil)
	_, err := pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: task.Id, Resource: "x", Amount: -1})
	wantCode(t, "negative amount", err, codes.InvalidArgument)
	_, err = pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: 999, Resource: "x", Amount: 1})
	wantCode(t, "unknown node", err, codes.NotFound)
	_, err = pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: 0, Resource: "x", Amount: 1})
	wantCode(t, "node id 0", err, codes.InvalidArgument)
	_, err = pay.Release(pay.ctx, &governorpb.ReleaseRequest{LeaseId: 0})
	wantCode(t, "lease id 0", err, codes.InvalidArgument)
	_, err = pay.Consume(context.Background(), &governorpb.ConsumeRequest{NodeId: task.Id, Resource: "x", Amount: 1})
	wantCode(t, "no token", err, codes.Unauthenticated)
	bad := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer nope")
	_, err = pay.Consume(bad, &governorpb.ConsumeRequest{NodeId: task.Id, Resource: "x", Amount: 1})
	wantCode(t, "bad token", err, codes.Unauthenticated)
	_, err = pay.OpenSession(context.Background(), &governorpb.OpenSessionRequest{ApiKey: "wrong"})
	wantCode(t, "bad key", err, codes.Unauthenticated)
	_, err = pay.CreateNode(pay.ctx, &governorpb.CreateNodeRequest{ParentId: pay.scope, Spec: &governorpb.NodeSpec{Name: "t"}})
	wantCode(t, "duplicate name", err, codes.AlreadyExists)
	_, err = pay.Consume(pay.ctx, &governorpb.ConsumeRequest{RequestId: strings.Repeat("x", 200), NodeId: task.Id, Resource: "x", Amount: 1})
	wantCode(t, "long request id", err, codes.InvalidArgument)
	if _, err := pay.Consume(pay.ctx, &governorpb.ConsumeRequest{RequestId: "r1", NodeId: task.Id, Resource: "x", Amount: 1}); err != nil {
		t.Fatal(err)
	}
	_, err = pay.Consume(pay.ctx, &governorpb.ConsumeRequest{RequestId: "r1", NodeId: task.Id, Resource: "x", Amount: 2})
	wantCode(t, "request id reused", err, codes.InvalidArgument)

	lease, err := pay.Acquire(pay.ctx, &governorpb.AcquireRequest{NodeId: task.Id, Class: "db"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pay.CloseNode(pay.ctx, &governorpb.CloseNodeRequest{NodeId: task.Id}); err != nil {
		t.Fatal(err)
	}
	_, err = pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: task.Id, Resource: "x", Amount: 1})
	wantCode(t, "consume on a closed task", err, codes.FailedPrecondition)
	if det, ok := status.Convert(err).Details()[0].(*governorpb.NodeEnded); !ok || det.NodeId != task.Id ||
		det.State != governorpb.NodeState_NODE_STATE_CLOSED {
		t.Fatalf("node ended detail %+v", status.Convert(err).Details())
	}
	_, err = pay.Release(pay.ctx, &governorpb.ReleaseRequest{LeaseId: lease.Id})
	wantCode(t, "release of a revoked lease", err, codes.FailedPrecondition)
	if det, ok := status.Convert(err).Details()[0].(*governorpb.LeaseEnded); !ok ||
		det.Reason != governorpb.LeaseEndReason_LEASE_END_REASON_REVOKED {
		t.Fatalf("lease ended detail %+v", status.Convert(err).Details())
	}
	_, err = pay.SetCaps(pay.ctx, &governorpb.SetCapsRequest{NodeId: pay.scope, Quotas: map[string]int64{"x": 1}})
	wantCode(t, "edit own scope", err, codes.PermissionDenied)
}

// Every call that names another tenant's node or lease is refused.
func TestIsolationAcrossTenants(t *testing.T) {
	srv := start(t, testConfig())
	pay := session(t, srv.Addr(), "pay-key", 0)
	recon := session(t, srv.Addr(), "recon-key", 0)
	theirs := recon.task(t, "theirs", nil)
	lease, err := recon.Acquire(recon.ctx, &governorpb.AcquireRequest{NodeId: theirs.Id, Class: "db"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := pay.ctx
	calls := map[string]func() error{
		"CreateNode": func() error {
			_, err := pay.CreateNode(ctx, &governorpb.CreateNodeRequest{ParentId: theirs.Id, Spec: &governorpb.NodeSpec{Name: "x"}})
			return err
		},
		"CreateNode under their tenant": func() error {
			_, err := pay.CreateNode(ctx, &governorpb.CreateNodeRequest{ParentId: recon.scope, Spec: &governorpb.NodeSpec{Name: "x"}})
			return err
		},
		"GetNode": func() error { _, err := pay.GetNode(ctx, &governorpb.GetNodeRequest{NodeId: theirs.Id}); return err },
		"GetNode root": func() error {
			_, err := pay.GetNode(ctx, &governorpb.GetNodeRequest{NodeId: 1})
			return err
		},
		"FindOrCreateNode": func() error {
			_, err := pay.FindOrCreateNode(ctx, &governorpb.FindOrCreateNodeRequest{ParentId: theirs.Id, Spec: &governorpb.NodeSpec{Name: "x"}})
			return err
		},
		"ListChildren": func() error {
			_, err := pay.ListChildren(ctx, &governorpb.ListChildrenRequest{NodeId: recon.scope})
			return err
		},
		"CancelNode": func() error {
			_, err := pay.CancelNode(ctx, &governorpb.CancelNodeRequest{NodeId: theirs.Id})
			return err
		},
		"CloseNode": func() error {
			_, err := pay.CloseNode(ctx, &governorpb.CloseNodeRequest{NodeId: theirs.Id})
			return err
		},
		"Consume": func() error {
			_, err := pay.Consume(ctx, &governorpb.ConsumeRequest{NodeId: theirs.Id, Resource: "r", Amount: 1})
			return err
		},
		"Acquire": func() error {
			_, err := pay.Acquire(ctx, &governorpb.AcquireRequest{NodeId: theirs.Id, Class: "db"})
			return err
		},
		"ChargeAndAcquire": func() error {
			_, err := pay.ChargeAndAcquire(ctx, &governorpb.ChargeAndAcquireRequest{NodeId: theirs.Id, Class: "db", Charges: map[string]int64{"r": 1}})
			return err
		},
		"Release":  func() error { _, err := pay.Release(ctx, &governorpb.ReleaseRequest{LeaseId: lease.Id}); return err },
		"Validate": func() error { _, err := pay.Validate(ctx, &governorpb.ValidateRequest{LeaseId: lease.Id}); return err },
		"SetCaps": func() error {
			_, err := pay.SetCaps(ctx, &governorpb.SetCapsRequest{NodeId: theirs.Id, Quotas: map[string]int64{"r": 1}})
			return err
		},
	}
	for name, call := range calls { // as if none of it existed (tenants_test.go compares the messages)
		wantCode(t, name, call(), codes.NotFound)
	}
	// Nothing changed: their task is open and their lease still held.
	admin := session(t, srv.Addr(), "admin-key", 0)
	n, err := admin.GetNode(admin.ctx, &governorpb.GetNodeRequest{NodeId: theirs.Id})
	if err != nil || n.State != governorpb.NodeState_NODE_STATE_OPEN || n.Held["db"] != 1 || len(n.Used) != 0 || len(n.Quotas) != 0 {
		t.Fatalf("their task after the attempts: %+v, %v", n, err)
	}
	if _, err := recon.Validate(recon.ctx, &governorpb.ValidateRequest{LeaseId: lease.Id}); err != nil {
		t.Fatal(err)
	}
	// The operator can edit a tenant but not the root it is scoped to.
	if _, err := admin.SetCaps(admin.ctx, &governorpb.SetCapsRequest{NodeId: recon.scope, Quotas: map[string]int64{"r": 5}}); err != nil {
		t.Fatal(err)
	}
	_, err = admin.SetCaps(admin.ctx, &governorpb.SetCapsRequest{NodeId: 1, Quotas: map[string]int64{"r": 5}})
	wantCode(t, "admin edits the root", err, codes.PermissionDenied)
}

// A retry that races its first attempt waits for it and gets the same lease;
// only one lease is granted.
func TestRetryRacingFirstAttemptSharesItsAnswer(t *testing.T) {
	srv := start(t, testConfig())
	recon := session(t, srv.Addr(), "recon-key", 0)
	task := recon.task(t, "t", nil)
	var held []int64
	for range 2 { // the tenant's db limit is 2
		l, err := recon.Acquire(recon.ctx, &governorpb.AcquireRequest{NodeId: task.Id, Class: "db"})
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l.Id)
	}
	var wg sync.WaitGroup
	got := make([]int64, 2)
	errs := make([]error, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := recon.Acquire(recon.ctx, &governorpb.AcquireRequest{RequestId: "same", NodeId: task.Id, Class: "db"})
			if err == nil {
				got[i] = l.Id
			}
			errs[i] = err
		}()
	}
	// Both are in flight once the queue holds one waiter and the gauge says 2.
	waitFor(t, func() bool { return srv.eng.Stats().Waiting["db"] == 1 && srv.flights.waiting() == 1 })
	if _, err := recon.Release(recon.ctx, &governorpb.ReleaseRequest{LeaseId: held[0]}); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if errs[0] != nil || errs[1] != nil || got[0] != got[1] || got[0] == 0 {
		t.Fatalf("racing retries got leases %v, errors %v; want one lease, twice", got, errs)
	}
	n, _ := recon.GetNode(recon.ctx, &governorpb.GetNodeRequest{NodeId: task.Id})
	if n.Held["db"] != 2 {
		t.Fatalf("held %d db leases, want 2", n.Held["db"])
	}
}

// waitFor polls a condition that another goroutine will make true; it is a
// bounded wait for a signal, not a sleep for readiness.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 5s")
		}
		time.Sleep(time.Millisecond)
	}
}

// An Acquire whose caller goes away leaves no lease and no waiter behind.
func TestAcquireCancelledCleanly(t *testing.T) {
	srv := start(t, testConfig())
	recon := session(t, srv.Addr(), "recon-key", 0)
	task := recon.task(t, "t", nil)
	for range 2 {
		if _, err := recon.Acquire(recon.ctx, &governorpb.AcquireRequest{NodeId: task.Id, Class: "db"}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(recon.ctx, 50*time.Millisecond)
	defer cancel()
	_, err := recon.Acquire(ctx, &governorpb.AcquireRequest{NodeId: task.Id, Class: "db"})
	wantCode(t, "acquire past its deadline", err, codes.DeadlineExceeded)
	waitFor(t, func() bool { return srv.eng.Stats().Waiting["db"] == 0 })
	if st := srv.eng.Stats(); st.Leases != 2 {
		t.Fatalf("%d leases held after a cancelled acquire, want 2", st.Leases)
	}
}

// A restart on the same SQLite file rebuilds the same state; sessions keep
// working with their tokens and lease ids resume above the largest on record.
func TestRestartReplaysState(t *testing.T) {
	cfg := testConfig()
	cfg.Store = serverconfig.StoreConfig{Driver: "sqlite", DSN: filepath.Join(t.TempDir(), "governor.db"), SnapshotEvery: 1}
	srv, err := Start(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	pay := session(t, srv.Addr(), "pay-key", 0)
	task := pay.task(t, "t", map[string]int64{"calls": 10})
	for range 4 {
		if _, err := pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: task.Id, Resource: "calls", Amount: 2}); err != nil {
			t.Fatal(err)
		}
	}
	l1, err := pay.Acquire(pay.ctx, &governorpb.AcquireRequest{NodeId: task.Id, Class: "db"})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.snapshot(context.Background()); err != nil { // half on a snapshot, half in events
		t.Fatal(err)
	}
	if _, err := pay.Consume(pay.ctx, &governorpb.ConsumeRequest{RequestId: "late", NodeId: task.Id, Resource: "calls", Amount: 1}); err != nil {
		t.Fatal(err)
	}
	before := srv.eng.Snapshot()
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	srv2 := start(t, cfg)
	after := srv2.eng.Snapshot()
	if fmt.Sprintf("%+v", before) != fmt.Sprintf("%+v", after) {
		t.Fatalf("state after restart differs:\nbefore %+v\nafter  %+v", before, after)
	}
	pay2 := session(t, srv2.Addr(), "pay-key", 0)
	pay2.ctx = metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+pay.token)
	if _, err := pay2.Heartbeat(pay2.ctx, &governorpb.HeartbeatRequest{}); err != nil {
		t.Fatalf("the old session's token after a restart: %v", err)
	}
	// The retry of an acknowledged consume is recognised after the restart.
	if _, err := pay2.Consume(pay2.ctx, &governorpb.ConsumeRequest{RequestId: "late", NodeId: task.Id, Resource: "calls", Amount: 1}); err != nil {
		t.Fatal(err)
	}
	n, _ := pay2.GetNode(pay2.ctx, &governorpb.GetNodeRequest{NodeId: task.Id})
	if n.Used["calls"] != 9 {
		t.Fatalf("used %d calls after the restart and a retry, want 9", n.Used["calls"])
	}
	l2, err := pay2.Acquire(pay2.ctx, &governorpb.AcquireRequest{NodeId: task.Id, Class: "db"})
	if err != nil {
		t.Fatal(err)
	}
	if l2.Id <= l1.Id {
		t.Fatalf("lease id %d after a restart is not above %d", l2.Id, l1.Id)
	}
	if _, err := pay2.Validate(pay2.ctx, &governorpb.ValidateRequest{LeaseId: l1.Id}); err != nil {
		t.Fatalf("a lease held across the restart: %v", err)
	}
}

// gatedStore commits normally until closed; then its next Append signals
// entered, waits for the test to release it, and fails.
type gatedStore struct {
	*store.Memory
	mu      sync.Mutex
	gated   bool
	entered chan struct{}
	release chan struct{}
}

func (g *gatedStore) Append(ctx context.Context, recs []store.Record) error {
	g.mu.Lock()
	gated := g.gated
	g.mu.Unlock()
	if !gated {
		return g.Memory.Append(ctx, recs)
	}
	close(g.entered)
	<-g.release
	return errors.New("disk on fire")
}

// A reply waits for its commit, and a commit that fails stops the server:
// Fatal fires, and the call whose event could not be recorded is never
// acknowledged.
func TestCommitFailureStopsServing(t *testing.T) {
	mem := store.NewMemory()
	gate := &gatedStore{Memory: mem, entered: make(chan struct{}), release: make(chan struct{})}
	cfg := testConfig()
	srv := start(t, cfg, WithStore(func(context.Context) (store.Store, error) { return gate, nil }))
	var once sync.Once
	release := func() { once.Do(func() { close(gate.release) }) }
	t.Cleanup(release) // runs before the server's Close, so a failure cannot hang
	pay := session(t, srv.Addr(), "pay-key", 0)
	task := pay.task(t, "t", nil)
	if _, err := pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: task.Id, Resource: "calls", Amount: 1}); err != nil {
		t.Fatal(err)
	}
	gate.mu.Lock()
	gate.gated = true
	gate.mu.Unlock()
	reply := make(chan error, 1)
	go func() {
		_, err := pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: task.Id, Resource: "calls", Amount: 1})
		reply <- err
	}()
	<-gate.entered // the event is being committed
	select {
	case err := <-reply:
		t.Fatalf("the consume was answered (%v) before its commit finished", err)
	case <-time.After(200 * time.Millisecond): // proving a negative needs a bound
	}
	release()
	if err := <-reply; err == nil {
		t.Fatal("a consume whose event failed to commit was acknowledged")
	}
	select {
	case err := <-srv.Fatal():
		if !strings.Contains(err.Error(), "disk on fire") {
			t.Fatalf("fatal error %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the server did not report the failed commit")
	}
	// Nothing further is served.
	_, err := pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: task.Id, Resource: "calls", Amount: 1})
	if err == nil {
		t.Fatal("served a call after a failed commit")
	}
	// What was acknowledged is on record: one consume.
	e, _ := engine.New(engine.Config{})
	var evs []engine.Event
	mem.Reopen().Load(context.Background(), store.LoadFuncs{Record: func(r store.Record) error {
		ev, err := decodeEvent(r, nil)
		evs = append(evs, ev)
		return err
	}})
	if err := e.Apply(evs...); err != nil {
		t.Fatal(err)
	}
	if v, _ := e.Get(engine.System, engine.NodeID(task.Id)); v.Used["calls"] != 1 {
		t.Fatalf("on record: %d calls, want the 1 acknowledged", v.Used["calls"])
	}
}

func TestHealthAndMetrics(t *testing.T) {
	srv := start(t, testConfig())
	_, conn := dial(t, srv.Addr())
	resp, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", resp, err)
	}
	pay := session(t, srv.Addr(), "pay-key", 0)
	task := pay.task(t, "t", nil)
	pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: task.Id, Resource: "retry", Amount: 1})
	for _, path := range []string{"/healthz", "/readyz"} {
		r, err := http.Get("http://" + srv.MetricsAddr() + path)
		if err != nil || r.StatusCode != 200 {
			t.Fatalf("%s: %v %v", path, r, err)
		}
		r.Body.Close()
	}
	r, err := http.Get("http://" + srv.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(r.Body)
	r.Body.Close()
	for _, want := range []string{
		`governor_calls_total{code="OK",method="Consume"} 1`,
		`governor_events_total{kind="consumed"} 1`,
		`governor_spend_total{resource="retry",tenant="payments"} 1`,
		`governor_pool_limit{class="db",tenant=""} 4`,
		`governor_pool_limit{class="db",tenant="reconciliation"} 2`,
		`governor_commit_batch_size_count`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(string(body), `tenant="t"`) || strings.Contains(string(body), "lease=") {
		t.Error("/metrics has a task or lease label")
	}
}
