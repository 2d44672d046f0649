package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/internal/faultproxy"
	"github.com/governor-project/governor/internal/pgtest"
	"github.com/governor-project/governor/server/serverconfig"
	"github.com/governor-project/governor/store"
)

// haConfig is testConfig with ha on, over the PostgreSQL store dsn.
func haConfig(dsn string, lease time.Duration) serverconfig.Config {
	cfg := testConfig()
	cfg.Store = serverconfig.StoreConfig{Driver: store.DriverPostgres, DSN: dsn}
	cfg.HA = serverconfig.HAConfig{Enabled: true, Lease: lease, DriftAllowance: min(lease/10, 100*time.Millisecond)}
	return cfg
}

// leads waits until srv leads, or fails the test.
func leads(t *testing.T, srv *Server) {
	t.Helper()
	select {
	case <-srv.Leading():
	case err := <-srv.Fatal():
		t.Fatalf("governord at %s stopped before it led: %v", srv.Addr(), err)
	case <-time.After(time.Minute):
		t.Fatalf("governord at %s never led", srv.Addr())
	}
}

// caughtUp waits until the standby has applied everything the leader has
// committed.
func caughtUp(t *testing.T, standby, leader *Server) {
	t.Helper()
	waitFor(t, func() bool { return standby.eng.Seq() == leader.events.Committed() })
}

// standbyLeader returns the leader an UNAVAILABLE from a standby names.
func standbyLeader(t *testing.T, err error) string {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != codes.Unavailable {
		t.Fatalf("a standby answered %v, want UNAVAILABLE", err)
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.Reason == StandbyReason && info.Domain == StandbyDomain {
			return info.Metadata[StandbyLeader]
		}
	}
	t.Fatalf("a standby's UNAVAILABLE carries no ErrorInfo: %v", err)
	return ""
}

func readyz(t *testing.T, srv *Server) int {
	t.Helper()
	resp, err := http.Get("http://" + srv.MetricsAddr() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func TestHAStandbyNamesTheLeader(t *testing.T) {
	dsn := pgtest.Schema(t, "governor_ha_")
	a := start(t, haConfig(dsn, time.Second))
	leads(t, a)
	b := start(t, haConfig(dsn, time.Second))
	pay := session(t, a.Addr(), "pay-key", 0)
	task := pay.task(t, "t", nil)

	c, _ := dial(t, b.Addr())
	_, err := c.OpenSession(context.Background(), &governorpb.OpenSessionRequest{ApiKey: "pay-key"})
	waitFor(t, func() bool { // until the standby has read the leadership row
		_, err = c.OpenSession(context.Background(), &governorpb.OpenSessionRequest{ApiKey: "pay-key"})
		return strings.Contains(status.Convert(err).Message(), "the leader is at")
	})
	if got := standbyLeader(t, err); got != a.Addr() {
		t.Fatalf("the standby names %q as the leader, want %q", got, a.Addr())
	}
	if !strings.Contains(status.Convert(err).Message(), a.Addr()) {
		t.Fatalf("the message does not name the leader: %v", err)
	}
	// Every call, with or without a session, and Validate in particular.
	_, err = pay.GovernorClient.Validate(pay.ctx, &governorpb.ValidateRequest{LeaseId: 1})
	if status.Code(err) == codes.Unavailable {
		t.Fatalf("the leader refused Validate: %v", err)
	}
	standbyPay := *pay
	standbyPay.GovernorClient = c
	_, err = standbyPay.Consume(standbyPay.ctx, &governorpb.ConsumeRequest{NodeId: task.Id, Resource: "calls", Amount: 1})
	if got := standbyLeader(t, err); got != a.Addr() {
		t.Fatalf("Consume at the standby names %q", got)
	}
	if ra, rb := readyz(t, a), readyz(t, b); ra != http.StatusOK || rb != http.StatusServiceUnavailable {
		t.Fatalf("/readyz: leader %d, standby %d; want 200 and 503", ra, rb)
	}
	caughtUp(t, b, a)
	if l, e := haMetric(t, a, "governor_ha_leader"), haMetric(t, a, "governor_ha_epoch"); l != 1 || e != 1 {
		t.Fatalf("the leader's metrics: leader %v, epoch %v", l, e)
	}
	if l, e, lag := haMetric(t, b, "governor_ha_leader"), haMetric(t, b, "governor_ha_epoch"),
		haMetric(t, b, "governor_ha_replication_lag_events"); l != 0 || e != 1 || lag != 0 {
		t.Fatalf("the standby's metrics: leader %v, epoch %v, lag %v", l, e, lag)
	}
}

// TestHATakeoverKeepsSessionsAndLeases: the standby that takes over serves
// the sessions, leases and spending the old leader committed; an acquire
// that waited at the old leader gets UNAVAILABLE and waits again at the new.
func TestHATakeoverKeepsSessionsAndLeases(t *testing.T) {
	dsn := pgtest.Schema(t, "governor_ha_")
	a := start(t, haConfig(dsn, time.Second))
	leads(t, a)
	b := start(t, haConfig(dsn, time.Second))
	pay := session(t, a.Addr(), "pay-key", 30*time.Second)
	task := pay.task(t, "t", map[string]int64{"calls": 3})
	if _, err := pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: task.Id, Resource: "calls", Amount: 2}); err != nil {
		t.Fatal(err)
	}
	var leases []int64
	for range 2 { // reconciliation's limit is 2, the root's 4; payments has none
		l, err := pay.Acquire(pay.ctx, &governorpb.AcquireRequest{NodeId: task.Id, Class: "db"})
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l.Id)
	}
	recon := session(t, a.Addr(), "recon-key", 30*time.Second)
	rtask := recon.task(t, "r", nil)
	for range 2 {
		if _, err := recon.Acquire(recon.ctx, &governorpb.AcquireRequest{NodeId: rtask.Id, Class: "db"}); err != nil {
			t.Fatal(err)
		}
	}
	waiting := make(chan error, 1)
	go func() { // the root's 4 slots are held: this one waits at a
		_, err := pay.Acquire(pay.ctx, &governorpb.AcquireRequest{NodeId: task.Id, Class: "db"})
		waiting <- err
	}()
	waitFor(t, func() bool { return a.eng.Stats().Waiting["db"] == 1 })
	caughtUp(t, b, a)

	if err := a.Close(); err != nil { // resigns: b need not wait out the lease
		t.Fatal(err)
	}
	if err := <-waiting; status.Code(err) != codes.Unavailable {
		t.Fatalf("the acquire waiting at the old leader: %v, want UNAVAILABLE", err)
	}
	leads(t, b)
	onB := func(c *client) *client {
		c2 := *c
		c2.GovernorClient, _ = dial(t, b.Addr())
		return &c2
	}
	pay, recon = onB(pay), onB(recon)
	if _, err := pay.Heartbeat(pay.ctx, &governorpb.HeartbeatRequest{}); err != nil {
		t.Fatalf("the session from the old leader at the new: %v", err)
	}
	for _, id := range leases {
		if _, err := pay.GovernorClient.Validate(pay.ctx, &governorpb.ValidateRequest{LeaseId: id}); err != nil {
			t.Fatalf("Validate(%d) at the new leader: %v", id, err)
		}
	}
	_, err := pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: task.Id, Resource: "calls", Amount: 2})
	wantCode(t, "a consume past what the old leader charged", err, codes.ResourceExhausted)
	if _, err := pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: task.Id, Resource: "calls", Amount: 1}); err != nil {
		t.Fatal(err)
	}
	// The waiter re-queues at the new leader and gets the slot a release frees.
	again := make(chan *governorpb.Lease, 1)
	go func() {
		l, err := pay.Acquire(pay.ctx, &governorpb.AcquireRequest{NodeId: task.Id, Class: "db"})
		if err != nil {
			t.Error(err)
		}
		again <- l
	}()
	waitFor(t, func() bool { return b.eng.Stats().Waiting["db"] == 1 })
	if _, err := pay.Release(pay.ctx, &governorpb.ReleaseRequest{LeaseId: leases[0]}); err != nil {
		t.Fatal(err)
	}
	if l := <-again; l == nil || l.Id <= leases[1] {
		t.Fatalf("the lease granted at the new leader: %v; ids must grow past %d", l, leases[1])
	}
}

// TestHADeposedLeaderStopsOnItsNextCommit: once another governord has won
// a newer epoch (here the old leader's lease is ended behind its back, as
// a long pause would), the old leader's next commit fails, the call is not
// acknowledged, and the process stops.
func TestHADeposedLeaderStopsOnItsNextCommit(t *testing.T) {
	dsn := pgtest.Schema(t, "governor_ha_")
	a := start(t, haConfig(dsn, time.Minute)) // no renewal during the test
	leads(t, a)
	pay := session(t, a.Addr(), "pay-key", time.Minute)
	task := pay.task(t, "t", nil)
	pgtest.Exec(t, dsn, "UPDATE governor_leader SET expires_at = '-infinity'")
	b := start(t, haConfig(dsn, time.Minute))
	leads(t, b)
	_, err := pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: task.Id, Resource: "calls", Amount: 1})
	if err == nil {
		t.Fatal("a deposed leader acknowledged a consume")
	}
	wantCode(t, "a consume at a deposed leader", err, codes.Unavailable)
	select {
	case err := <-a.Fatal():
		if !errors.Is(err, store.ErrDeposed) {
			t.Fatalf("the deposed leader stopped with %v, want ErrDeposed", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the deposed leader did not stop")
	}
}

// TestHALeaderCutOffFromPostgres: a leader whose connections to PostgreSQL
// go into a blackhole stops answering when its term ends, Validate
// included, and stops; the standby takes over once the lease has ended.
func TestHALeaderCutOffFromPostgres(t *testing.T) {
	dsn := pgtest.Schema(t, "governor_ha_")
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	proxy := faultproxy.New(ln, u.Host)
	defer proxy.Close()
	viaProxy := *u
	viaProxy.Host = proxy.Addr()
	const lease = time.Second
	a := start(t, haConfig(viaProxy.String(), lease))
	leads(t, a)
	b := start(t, haConfig(dsn, lease))
	pay := session(t, a.Addr(), "pay-key", 30*time.Second)
	task := pay.task(t, "t", nil)
	l, err := pay.Acquire(pay.ctx, &governorpb.AcquireRequest{NodeId: task.Id, Class: "db"})
	if err != nil {
		t.Fatal(err)
	}
	caughtUp(t, b, a)

	proxy.Blackhole(true)
	cut := time.Now()
	// Validate needs no commit: only the term stops it. Until the term
	// ends it may answer; after, never.
	for {
		_, err := pay.GovernorClient.Validate(pay.ctx, &governorpb.ValidateRequest{LeaseId: l.Id})
		if err != nil {
			wantCode(t, "Validate at a leader cut off from PostgreSQL", err, codes.Unavailable)
			break
		}
		if time.Since(cut) > lease {
			t.Fatalf("the cut-off leader still answered Validate %v after the blackhole began, past its %v lease", time.Since(cut), lease)
		}
	}
	select {
	case err := <-a.Fatal():
		if !strings.Contains(err.Error(), "lease") {
			t.Fatalf("the cut-off leader stopped with %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the cut-off leader did not stop")
	}
	leads(t, b)
	proxy.Blackhole(false)
	onB := *pay
	onB.GovernorClient, _ = dial(t, b.Addr())
	if _, err := onB.GovernorClient.Validate(onB.ctx, &governorpb.ValidateRequest{LeaseId: l.Id}); err != nil {
		t.Fatalf("Validate at the new leader: %v", err)
	}
}

// metric reads one series of srv's /metrics.
func haMetric(t *testing.T, srv *Server, series string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + srv.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body strings.Builder
	if _, err := io.Copy(&body, resp.Body); err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(body.String(), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	return 0
}

// TestHAStalledLeaderStopsAnsweringAtItsTermsEnd: a leader whose renewals
// are stuck answers nothing once its term has ended by its own clock,
// Validate included, although it has not noticed anything else; a standby
// takes over once the lease has ended by the database's clock.
func TestHAStalledLeaderStopsAnsweringAtItsTermsEnd(t *testing.T) {
	dsn := pgtest.Schema(t, "governor_ha_")
	const lease = time.Second
	held := make(chan struct{})
	defer close(held)
	cfg := haConfig(dsn, lease)
	cfg.HATestHooks = &serverconfig.HATestHooks{HoldRenewals: held}
	a := start(t, cfg)
	leads(t, a)
	b := start(t, haConfig(dsn, lease))
	pay := session(t, a.Addr(), "pay-key", time.Minute)
	task := pay.task(t, "t", nil)
	l, err := pay.Acquire(pay.ctx, &governorpb.AcquireRequest{NodeId: task.Id, Class: "db"})
	if err != nil {
		t.Fatal(err)
	}
	a.ha.mu.Lock()
	until := a.ha.term.Until
	a.ha.mu.Unlock()
	for {
		sent := time.Now()
		_, err := pay.GovernorClient.Validate(pay.ctx, &governorpb.ValidateRequest{LeaseId: l.Id})
		if err != nil {
			wantCode(t, "Validate at a leader past its term", err, codes.Unavailable)
			break
		}
		if sent.After(until) {
			t.Fatalf("the leader answered Validate %v after its term ended", sent.Sub(until))
		}
	}
	leads(t, b)
	if time.Now().Before(until) {
		t.Fatal("the standby led before the old leader's term ended")
	}
	onB := *pay
	onB.GovernorClient, _ = dial(t, b.Addr())
	if _, err := onB.GovernorClient.Validate(onB.ctx, &governorpb.ValidateRequest{LeaseId: l.Id}); err != nil {
		t.Fatalf("Validate at the new leader: %v", err)
	}
	_, err = pay.GovernorClient.Validate(pay.ctx, &governorpb.ValidateRequest{LeaseId: l.Id})
	wantCode(t, "Validate at the old leader after the takeover", err, codes.Unavailable)
}

func TestHAConfigKeys(t *testing.T) {
	for _, tc := range []struct {
		text    string
		key     string // "" when the config is good
		problem string
	}{
		{text: "ha: {enabled: true}", key: "ha.enabled", problem: "postgres"},
		{text: "store: {driver: postgres, dsn: x}\nha: {enabled: true}"},
		{text: "store: {driver: postgres, dsn: x}\nlisten: 0.0.0.0:7600\nallow_plaintext: true\nha: {enabled: true}", key: "ha.advertise_addr", problem: "single address"},
		{text: "store: {driver: postgres, dsn: x}\nlisten: 0.0.0.0:7600\nallow_plaintext: true\nha: {enabled: true, advertise_addr: \"gov-0.gov:7600\"}"},
		{text: "ha: {advertise_addr: nohostport}", key: "ha.advertise_addr", problem: "host:port"},
		{text: "ha: {lease: 10ms}", key: "ha.lease", problem: "outside"},
		{text: "ha: {lease: 1s, drift_allowance: 500ms}", key: "ha.drift_allowance", problem: "lease/2"},
		{text: "ha: {lease: 1s, drift_allowance: -1s}", key: "ha.drift_allowance", problem: "outside"},
		{text: "ha: {leese: 1s}", key: "ha.leese", problem: "unknown"},
	} {
		cfg, err := serverconfig.ParseConfig([]byte(tc.text))
		if tc.key == "" {
			if err != nil {
				t.Errorf("%q: %v", tc.text, err)
			}
			if cfg.HA.Lease != serverconfig.DefaultHALease || cfg.HA.DriftAllowance != serverconfig.DefaultHADriftAllowance {
				t.Errorf("%q: the defaults are %+v", tc.text, cfg.HA)
			}
			continue
		}
		var ce *serverconfig.ConfigError
		if !errors.As(err, &ce) || ce.Key != tc.key || !strings.Contains(ce.Problem, tc.problem) {
			t.Errorf("%q: %v; want a ConfigError on %s saying %q", tc.text, err, tc.key, tc.problem)
		}
	}
}
