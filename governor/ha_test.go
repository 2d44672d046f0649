package governor_test

import (
	"context"
	"errors"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/internal/faultproxy"
	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/internal/pgtest"
	"github.com/governor-project/governor/server"
	"github.com/governor-project/governor/server/serverconfig"
)

// startHA starts a governord with ha on over the PostgreSQL store dsn.
func startHA(t *testing.T, dsn string) *server.Server {
	t.Helper()
	cfg := serverconfig.Config{
		Listen: "127.0.0.1:0", MetricsListen: "127.0.0.1:0", SessionTTL: 10 * time.Second,
		AdminKey: adminKey, Store: serverconfig.StoreConfig{Driver: "postgres", DSN: dsn},
		Root:    serverconfig.Caps{Limits: map[string]int64{"db": 4}},
		Tenants: []serverconfig.TenantConfig{{Name: "payments", APIKey: paymentsKey, Weight: 4}},
		HA:      serverconfig.HAConfig{Enabled: true, Lease: time.Second, DriftAllowance: 100 * time.Millisecond},
	}
	return govtest.StartConfig(t, cfg)
}

func waitLeads(t *testing.T, srv *server.Server) {
	t.Helper()
	select {
	case <-srv.Leading():
	case <-time.After(time.Minute):
		t.Fatalf("governord at %s never led", srv.Addr())
	}
}

// TestSessionFollowsTheLeader: a client given the standby's address first
// finds the leader by the standby's hint, and when the leader stops, its
// calls go on at the new leader with the same session, the same task and
// the same lease, and no consume it was told of is lost.
func TestSessionFollowsTheLeader(t *testing.T) {
	dsn := pgtest.Schema(t, "governor_sdk_ha_")
	a := startHA(t, dsn)
	waitLeads(t, a)
	b := startHA(t, dsn)
	c := dialReal(t, governor.WithAddr(b.Addr()+","+a.Addr()))
	ctx, task := newTask(t, t.Context(), c, governor.Spec{Name: "follow", Quotas: map[string]int64{"calls": 1_000_000}})
	lease, err := task.Acquire(ctx, "db")
	if err != nil {
		t.Fatal(err)
	}

	acked := make(chan int64)
	stop := make(chan struct{})
	go func() {
		var n int64
		defer func() { acked <- n }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := task.Consume(ctx, "calls", 1); err != nil {
				t.Errorf("a consume across the failover: %v", err)
				return
			}
			n++
		}
	}()
	// Some consumes at a, then a stops (and resigns); b takes over.
	waitUsed(t, c, task.ID(), 20)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	waitLeads(t, b)
	before := int64(-1)
	for before < 0 {
		before = used(t, c, task.ID())
	}
	waitUsed(t, c, task.ID(), before+20) // consumes go on at b
	close(stop)
	n := <-acked
	if err := c.Err(); err != nil {
		t.Fatalf("the session was lost across the failover: %v", err)
	}
	if err := lease.Validate(ctx); err != nil {
		t.Fatalf("the lease from the old leader at the new: %v", err)
	}
	if got := used(t, c, task.ID()); got < n {
		t.Fatalf("the new leader counts %d calls; the client was told of %d", got, n)
	}
	if err := lease.Release(ctx, 0, false); err != nil {
		t.Fatal(err)
	}
}

// used reads a task's spending of "calls"; -1 while governord answers
// UNAVAILABLE (Raw calls are not retried).
func used(t *testing.T, c *governor.Client, id int64) int64 {
	t.Helper()
	n, err := c.Raw().GetNode(t.Context(), &governorpb.GetNodeRequest{NodeId: id})
	if status.Code(err) == codes.Unavailable {
		return -1
	}
	if err != nil {
		t.Fatal(err)
	}
	return n.GetUsed()["calls"]
}

func waitUsed(t *testing.T, c *governor.Client, id, atLeast int64) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for used(t, c, id) < atLeast {
		if time.Now().After(deadline) {
			t.Fatalf("the task never reached %d calls", atLeast)
		}
		time.Sleep(5 * time.Millisecond) // polling a count, not waiting for readiness
	}
}

func TestAddrListRefusesAnEmptyEntry(t *testing.T) {
	_, err := governor.Dial(t.Context(), governor.WithAddr("127.0.0.1:1,,127.0.0.1:2"))
	if !errors.Is(err, governor.ErrInvalidArgument) || !strings.Contains(err.Error(), "empty address") {
		t.Fatalf("Dial with an empty entry in the list: %v", err)
	}
}

// TestStandbyHintFindsALeaderNotInTheList: given only a standby's address,
// the client reaches the leader the standby names.
func TestStandbyHintFindsALeaderNotInTheList(t *testing.T) {
	dsn := pgtest.Schema(t, "governor_sdk_ha_")
	a := startHA(t, dsn)
	waitLeads(t, a)
	b := startHA(t, dsn)
	// Until b has read the leadership row it names no leader; Dial keeps
	// trying meanwhile.
	c := dialReal(t, governor.WithAddr(b.Addr()))
	ctx, task := newTask(t, t.Context(), c, governor.Spec{Name: "hinted", Quotas: map[string]int64{"calls": 10}})
	if err := task.Consume(ctx, "calls", 3); err != nil {
		t.Fatal(err)
	}
	if got := used(t, c, task.ID()); got != 3 {
		t.Fatalf("the leader counts %d calls, want 3", got)
	}
}

// TestHeartbeatMovesOnFromAnAddressThatAnswersNothing: the address the
// session uses stops answering (a blackhole, as a paused leader's would);
// the heartbeats go to the next address and follow its hint to the leader,
// and the session outlives its local deadline many times over.
func TestHeartbeatMovesOnFromAnAddressThatAnswersNothing(t *testing.T) {
	dsn := pgtest.Schema(t, "governor_sdk_ha_")
	a := startHA(t, dsn)
	waitLeads(t, a)
	b := startHA(t, dsn)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	proxy := faultproxy.New(ln, a.Addr())
	defer proxy.Close()
	const ttl = 2 * time.Second
	c := dialReal(t, governor.WithAddr(proxy.Addr()+","+b.Addr()), governor.WithTTL(ttl))
	ctx, task := newTask(t, t.Context(), c, governor.Spec{Name: "blackholed", Quotas: map[string]int64{"calls": 10}})
	if err := task.Consume(ctx, "calls", 1); err != nil {
		t.Fatal(err)
	}
	proxy.Blackhole(true)
	// Only the heartbeats run meanwhile: nothing else moves the client on.
	select {
	case <-c.Done():
		t.Fatalf("the session was lost: %v", c.Err())
	case <-time.After(3 * ttl): // proving a negative needs a bound
	}
	if err := task.Consume(ctx, "calls", 1); err != nil {
		t.Fatalf("a consume after the address went dark: %v", err)
	}
}

// TestAcquireWaitingAtAFailoverQueuesAtTheNewLeader: an Acquire waiting in
// the leader's queue when the leader dies (cut off from PostgreSQL, it
// stops at its term's end, and a standby takes over once the lease has run
// out: a failover of about a lease) queues again at the new leader and is
// granted there, within its caller's wait, even by a client that fails
// closed after 50 ms without governord (WithUnavailableRetry, as the
// sidecar sets it): the standby answered meanwhile.
func TestAcquireWaitingAtAFailoverQueuesAtTheNewLeader(t *testing.T) {
	dsn := pgtest.Schema(t, "governor_sdk_ha_")
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pg := faultproxy.New(ln, u.Host)
	t.Cleanup(func() { pg.Close() })
	viaProxy := *u
	viaProxy.Host = pg.Addr()
	a := startHA(t, viaProxy.String())
	waitLeads(t, a)
	b := startHA(t, dsn)
	c := dialReal(t, governor.WithAddr(a.Addr()+","+b.Addr()), governor.WithUnavailableRetry(50*time.Millisecond))
	ctx, task := newTask(t, t.Context(), c, governor.Spec{Name: "waits", Limits: map[string]int64{"db": 1}})
	holder, err := task.Acquire(ctx, "db")
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		lease *governor.Lease
		err   error
	}
	waited := make(chan result, 1)
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	go func() {
		l, err := task.Acquire(waitCtx, "db")
		waited <- result{l, err}
	}()
	waitMetric(t, a, "governor_acquires_waiting", 1)

	pg.Blackhole(true)
	select {
	case err := <-a.Fatal():
		t.Logf("the leader stopped: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("the leader cut off from PostgreSQL did not stop")
	}
	pg.Close() // its connections to PostgreSQL reset, so that it closes at once
	a.Close()  // as the process exits on a fatal error: its queue is gone
	waitLeads(t, b)
	// Queued again at b, or failed: the holder has not released.
	for deadline := time.Now().Add(time.Minute); govtest.Metric(t, b, "governor_acquires_waiting") < 1; {
		select {
		case r := <-waited:
			t.Fatalf("the Acquire that waited at the failover ended before it could be granted: %v, %v", r.lease, r.err)
		case <-time.After(5 * time.Millisecond): // polling a count, not waiting for readiness
		}
		if time.Now().After(deadline) {
			t.Fatal("the Acquire that waited at the failover never queued at the new leader")
		}
	}
	if err := holder.Release(ctx, 0, false); err != nil {
		t.Fatalf("releasing the holder's lease at the new leader: %v", err)
	}
	r := <-waited
	if r.err != nil {
		t.Fatalf("the Acquire that waited across the failover: %v", r.err)
	}
	if r.lease.ID() <= holder.ID() {
		t.Fatalf("the lease granted across the failover has id %d, not above the holder's %d", r.lease.ID(), holder.ID())
	}
	if err := r.lease.Release(ctx, 0, false); err != nil {
		t.Fatal(err)
	}
}

// waitMetric waits until srv's series is at least atLeast.
func waitMetric(t *testing.T, srv *server.Server, series string, atLeast float64) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for govtest.Metric(t, srv, series) < atLeast {
		if time.Now().After(deadline) {
			t.Fatalf("%s at %s never reached %v", series, srv.Addr(), atLeast)
		}
		time.Sleep(5 * time.Millisecond) // polling a count, not waiting for readiness
	}
}
