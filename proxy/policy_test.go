package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/governor/engine"
	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/proxy/httpproxy"
	"github.com/governor-project/governor/server"
	"github.com/governor-project/governor/server/serverconfig"
)

// policyProxy starts governord with the tenant's quotas and modes, and a
// sidecar with one rule per resource (GET /RESOURCE charges 1 of it) and
// the RateLimit headers on; delegate false makes each request one call.
func policyProxy(t *testing.T, quotas map[string]int64, modes map[string]engine.CapMode, delegate bool) (*server.Server, *testProxy, string) {
	t.Helper()
	g := startGovernord(t, func(c *serverconfig.Config) {
		c.Tenants[0].Quotas, c.Tenants[0].QuotaModes = quotas, modes
	})
	o := origin(t, http.HandlerFunc(hello), false, false)
	var rules strings.Builder
	rules.WriteString("rules:\n")
	for r := range quotas {
		fmt.Fprintf(&rules, "  - {name: %s, match: {host: origin.test, path: /%s}, charge: {%s: 1}}\n", r, r, r)
	}
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: "http: {listen: 127.0.0.1:0, allow_targets: [localhost], connect_ports: [1-65535], ratelimit_headers: true}\n" +
		fmt.Sprintf("delegation: {enabled: %t}\n", delegate) + rules.String()})
	return g, p, hostURL(o, "origin.test")
}

// get sends GET base/path through p and returns the status, the
// Governor-Denied header and the response's headers.
func get(t *testing.T, p *testProxy, base, path string) (int, string, http.Header) {
	t.Helper()
	resp, err := p.client("", nil).Get(base + path)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	return resp.StatusCode, resp.Header.Get(httpproxy.HeaderDenied), resp.Header
}

// A soft quota lets requests through the sidecar up to cap plus burst, the
// ones past the cap with a Governor-Warning, and then denies them with 429
// quota; a warn_only quota never denies, and governord counts every
// would-be denial (one per request past the cap, with delegation off: one
// call, one event each). With delegation on, the soft cap still admits
// exactly cap plus burst.
func TestSoftAndWarnOnlyThroughTheSidecar(t *testing.T) {
	for _, delegate := range []bool{false, true} {
		t.Run(fmt.Sprintf("delegation=%t", delegate), func(t *testing.T) {
			g, p, base := policyProxy(t, map[string]int64{"soft_calls": 10, "warn_calls": 4},
				map[string]engine.CapMode{"soft_calls": {Mode: engine.ModeSoft, Burst: 5}, "warn_calls": {Mode: engine.ModeWarnOnly}}, delegate)
			ok, warned := 0, 0
			for i := 1; i <= 20; i++ {
				code, denied, h := get(t, p, base, "/soft_calls")
				switch {
				case code == 200:
					ok++
					if strings.HasPrefix(h.Get(httpproxy.HeaderWarning), "soft_exceeded") || strings.HasPrefix(h.Get(httpproxy.HeaderWarning), "hard_exceeded") {
						warned++
					}
				case code != 429 || denied != "quota":
					t.Fatalf("request %d: %d %q", i, code, denied)
				}
			}
			if ok != 15 {
				t.Errorf("a soft quota of 10 with a burst of 5 admitted %d of 20, want 15", ok)
			}
			if !delegate && warned != 5 {
				t.Errorf("%d of the admitted requests carried an exceeded warning, want the 5 past the cap", warned)
			}
			for i := 1; i <= 10; i++ {
				if code, denied, _ := get(t, p, base, "/warn_calls"); code != 200 {
					t.Fatalf("warn_only request %d: %d %q", i, code, denied)
				}
			}
			if !delegate {
				if n := govtest.Scrape(t, g.MetricsAddr(), `governor_cap_warnings_total{kind="quota",mode="warn_only"}`); n != 6 {
					t.Errorf("governord counted %v warn_only would-be denials, want 6 (requests 5 to 10 of a cap of 4)", n)
				}
				if n := govtest.Scrape(t, g.MetricsAddr(), `governor_cap_warnings_total{kind="quota",mode="soft"}`); n != 5 {
					t.Errorf("governord counted %v soft warnings, want 5", n)
				}
			}
		})
	}
}

// The RateLimit headers carry governord's own numbers: after each request
// the remaining quota the sidecar reports is what GetCapStatus tells the
// operator, for the tightest cap over the request (here the task's own,
// under the tenant's looser one), and Governor-Warning appears exactly
// when that cap is near (80% and 90%) or over.
func TestRateLimitHeadersMatchGovernord(t *testing.T) {
	g, p, base := policyProxy(t, map[string]int64{"calls": 100}, nil, false)
	a := newAdmin(t, g.Addr())
	// The task's own cap, 10, is the tightest.
	code, _, _ := get(t, p, base, "/calls")
	if code != 200 {
		t.Fatalf("first request: %d", code)
	}
	task := a.node("payments", "pod-7")
	if _, err := a.c.Raw().SetCaps(context.Background(), &governorpb.SetCapsRequest{NodeId: task.GetId(), Quotas: map[string]int64{"calls": 10}, Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	for i := 2; i <= 10; i++ {
		code, denied, h := get(t, p, base, "/calls")
		if code != 200 {
			t.Fatalf("request %d: %d %q", i, code, denied)
		}
		rep, err := a.c.Raw().GetCapStatus(context.Background(), &governorpb.GetCapStatusRequest{NodeId: task.GetId()})
		if err != nil {
			t.Fatal(err)
		}
		own := rep.GetCaps()[0] // the task's own quota comes first
		name := strconv.Quote("calls@pod-7")
		if got, want := h.Get("RateLimit-Policy"), name+";q=10"; got != want {
			t.Errorf("request %d: RateLimit-Policy %q, want %q", i, got, want)
		}
		if got, want := h.Get("RateLimit"), fmt.Sprintf("%s;r=%d", name, own.GetRemaining()); got != want || own.GetRemaining() != int64(10-i) {
			t.Errorf("request %d: RateLimit %q; governord says %d remain (want %d); want %q", i, got, own.GetRemaining(), 10-i, want)
		}
		warning := h.Get(httpproxy.HeaderWarning)
		switch {
		case i < 8 && warning != "":
			t.Errorf("request %d (%d of 10): Governor-Warning %q, want none", i, i, warning)
		case i >= 8 && i < 10 && !strings.HasPrefix(warning, "near; quota=\"calls\"; node=\"pod-7\"; used="+strconv.Itoa(i)+"; cap=10; threshold="):
			t.Errorf("request %d: Governor-Warning %q, want near on pod-7", i, warning)
		case i == 10 && !strings.HasPrefix(warning, "hard_exceeded; quota=\"calls\""):
			t.Errorf("request %d: Governor-Warning %q, want hard_exceeded", i, warning)
		}
	}
}

// An upstream cannot send Governor-Warning: only the proxy says it.
func TestUpstreamCannotSpoofGovernorWarning(t *testing.T) {
	g := startGovernord(t, nil)
	o := origin(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set(httpproxy.HeaderWarning, "hard_exceeded; quota=\"made-up\"")
		w.Write([]byte("ok"))
	}), false, false)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: "rules:\n  - {name: any, match: {host: origin.test}, charge: {calls: 1}}\n"})
	_, _, h := get(t, p, hostURL(o, "origin.test"), "/")
	if w := h.Get(httpproxy.HeaderWarning); w != "" {
		t.Fatalf("the upstream's Governor-Warning %q reached the client", w)
	}
}

// pgwire: the first time a transaction runs near or over a cap the client
// gets one NOTICE naming it; a statement in the same transaction gets no
// second one, and the next transaction gets its own.
func TestPGWireCapNotice(t *testing.T) {
	pgUpstream(t)
	table := "pgq_notice"
	freshPGTable(t, table)
	g := startGovernord(t, nil)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(),
		yaml: "task: {name: " + table + ", quotas: {db_writes: 10}}\n" + pgListenerYAML(t, ", cap_notices: true") + pgRules})
	cfg, err := pgx.ParseConfig(pgDSN(p.PGWireAddrs()[0], ""))
	must(t, err)
	var notices []string
	var mu sync.Mutex
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		mu.Lock()
		notices = append(notices, n.Message)
		mu.Unlock()
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	c, err := pgx.ConnectConfig(context.Background(), cfg)
	must(t, err)
	defer c.Close(context.Background())
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(notices) }
	exec := func(sql string) {
		t.Helper()
		if _, err := c.Exec(context.Background(), sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	for i := range 7 { // 7 of 10: within
		exec(fmt.Sprintf("INSERT INTO %s VALUES (%d)", table, i))
	}
	if n := count(); n != 0 {
		t.Fatalf("%d notices within the cap: %v", n, notices)
	}
	exec("BEGIN")
	exec("INSERT INTO " + table + " VALUES (8)") // 8 of 10: near
	exec("INSERT INTO " + table + " VALUES (9)") // 9 of 10: the same transaction
	exec("COMMIT")
	if n := count(); n != 1 || !strings.Contains(notices[0], "quota db_writes on "+table+" is near its cap") {
		t.Fatalf("notices of one transaction near the cap: %v, want one", notices)
	}
	exec("INSERT INTO " + table + " VALUES (10)") // 10 of 10: a new transaction, at the cap
	if n := count(); n != 2 || !strings.Contains(notices[1], "is at its cap") {
		t.Fatalf("notices after the next transaction: %v", notices)
	}
}

// Suspending a tenant mid-load, through the real sidecar: with delegation
// off every request is one call, so the first request after the
// suspension is denied (403, Governor-Denied: suspended) while a request
// already running keeps its lease and finishes; with delegation on, what
// the sidecar holds is recalled and a request is denied as soon as the
// recall has arrived. Resuming lets work in again; read-only refuses POST
// but not GET, nor a POST a rule marks as a read, both ways (with
// delegation, from what its top-ups said: TestReadOnlyMidLoad).
func TestTenantStatesThroughTheSidecar(t *testing.T) {
	for _, delegate := range []bool{false, true} {
		t.Run(fmt.Sprintf("delegation=%t", delegate), func(t *testing.T) {
			g := startGovernord(t, nil)
			arrived, release := make(chan struct{}, 1), make(chan struct{})
			o := origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/slow" {
					arrived <- struct{}{}
					<-release
				}
				w.Write([]byte("ok"))
			}), false, false)
			base := hostURL(o, "origin.test")
			p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: fmt.Sprintf("delegation: {enabled: %t}\n", delegate) + `rules:
  - {name: search, match: {host: origin.test, path: /search}, class: api, charge: {calls: 1}, read: true}
  - {name: api, match: {host: origin.test}, class: api, charge: {calls: 1}}
`})
			a := newAdmin(t, g.Addr())
			tenant := a.node("payments")
			setState := func(state string) {
				t.Helper()
				if _, err := a.c.Raw().SetTenantState(context.Background(), &governorpb.SetTenantStateRequest{NodeId: tenant.GetId(), State: state, Reason: "test " + state}); err != nil {
					t.Fatal(err)
				}
			}
			if code, _, _ := get(t, p, base, "/"); code != 200 {
				t.Fatalf("before: %d", code)
			}
			slow := make(chan int, 1)
			go func() {
				resp, err := p.client("", nil).Get(base + "/slow")
				if err != nil {
					slow <- 0
					return
				}
				resp.Body.Close()
				slow <- resp.StatusCode
			}()
			<-arrived
			setState("suspended")
			if delegate {
				eventually(t, "a request denied as suspended", func() bool {
					code, denied, _ := get(t, p, base, "/")
					return code == 403 && denied == "suspended"
				})
			} else if code, denied, _ := get(t, p, base, "/"); code != 403 || denied != "suspended" {
				t.Fatalf("the first request after the suspension: %d %q, want 403 suspended", code, denied)
			}
			if held := a.node("payments").GetHeld()["api"]; held < 1 {
				t.Fatalf("the running request's lease is gone after a suspension without revoke (held %d)", held)
			}
			close(release)
			if code := <-slow; code != 200 {
				t.Fatalf("the request running during the suspension ended %d, want 200", code)
			}
			setState("read_only")
			if code, denied, _ := get(t, p, base, "/"); code != 200 {
				t.Fatalf("a GET while read-only: %d %q", code, denied)
			}
			post := func(path string) (int, string) {
				resp, err := p.client("", nil).Post(base+path, "text/plain", strings.NewReader("x"))
				if err != nil {
					t.Fatal(err)
				}
				readAll(t, resp)
				return resp.StatusCode, resp.Header.Get(httpproxy.HeaderDenied)
			}
			if code, denied := post("/"); code != 403 || denied != "read-only" {
				t.Fatalf("a POST while read-only: %d %q, want 403 read-only", code, denied)
			}
			if code, denied := post("/search"); code != 200 {
				t.Fatalf("a POST a rule marks as a read, while read-only: %d %q", code, denied)
			}
			setState("active")
			if delegate { // once the recall at the change has arrived
				eventually(t, "a POST admitted after resuming", func() bool { code, _ := post("/"); return code == 200 })
			} else if code, denied := post("/"); code != 200 {
				t.Fatalf("a POST after resuming: %d %q", code, denied)
			}
		})
	}
}

// pgwire: a read-only tenant's SELECT runs and its INSERT is an ERROR
// 25006; a suspended tenant's statements are ERROR 53400; the connection
// stays usable; both ways.
func TestTenantStatesThroughPGWire(t *testing.T) {
	for _, delegate := range []bool{false, true} {
		t.Run(fmt.Sprintf("delegation=%t", delegate), func(t *testing.T) { tenantStatesThroughPGWire(t, delegate) })
	}
}

func tenantStatesThroughPGWire(t *testing.T, delegate bool) {
	pgUpstream(t)
	table := "pgq_tstate"
	freshPGTable(t, table)
	g := startGovernord(t, nil)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: fmt.Sprintf("delegation: {enabled: %t}\n", delegate) + pgListenerYAML(t, "") +
		"rules:\n  - {name: any-sql, match: {sql: any}, class: db}\n"})
	a := newAdmin(t, g.Addr())
	tenant := a.node("payments")
	c := pgConnect(t, pgDSN(p.PGWireAddrs()[0], ""))
	setState := func(state string) {
		t.Helper()
		if _, err := a.c.Raw().SetTenantState(context.Background(), &governorpb.SetTenantStateRequest{NodeId: tenant.GetId(), State: state, Reason: "test"}); err != nil {
			t.Fatal(err)
		}
	}
	setState("read_only")
	var n int
	if err := c.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatalf("a SELECT while read-only: %v", err)
	}
	// In the simple protocol too (psql's), where a rule that decides by the
	// connection alone needs no look at the text for its lease.
	if err := c.QueryRow(context.Background(), "SELECT count(*) FROM "+table, pgx.QueryExecModeSimpleProtocol).Scan(&n); err != nil {
		t.Fatalf("a SELECT in the simple protocol while read-only: %v", err)
	}
	if psql := filepath.Join(os.Getenv("GOVERNOR_TEST_PG_BIN"), "psql"); psqlExists(psql) {
		dsn := pgDSN(p.PGWireAddrs()[0], "")
		if out, err := exec.Command(psql, dsn, "-Atc", "SELECT count(*) FROM "+table).CombinedOutput(); err != nil {
			t.Fatalf("psql's SELECT while read-only: %v\n%s", err, out)
		}
		out, err := exec.Command(psql, dsn, "-v", "VERBOSITY=verbose", "-Atc", "INSERT INTO "+table+" VALUES (1)").CombinedOutput()
		if err == nil || !strings.Contains(string(out), "25006") {
			t.Fatalf("psql's INSERT while read-only: %v\n%s", err, out)
		}
	}
	if _, err := c.Exec(context.Background(), "INSERT INTO "+table+" VALUES (1)", pgx.QueryExecModeSimpleProtocol); err == nil {
		t.Fatal("an INSERT in the simple protocol while read-only was let through")
	}
	wantPGError(t, c, "25006", "read-only", "INSERT INTO "+table+" VALUES (1)")
	pgAlive(t, c)
	// A transaction whose lease a SELECT took may not write either, though
	// the write has no lease of its own to ask for.
	txWrite := func() error {
		ctx := context.Background()
		tx, err := c.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, "SELECT count(*) FROM "+table); err != nil {
			t.Fatalf("a SELECT in a transaction: %v", err)
		}
		if _, err := tx.Exec(ctx, "INSERT INTO "+table+" VALUES (2)"); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	if err := txWrite(); !isPGCode(err, "25006") {
		t.Fatalf("an INSERT after a SELECT in a transaction while read-only: %v, want 25006", err)
	}
	pgAlive(t, c)
	setState("suspended")
	if delegate { // once the recall at the change has arrived
		eventually(t, "a SELECT refused as suspended", func() bool {
			var pe *pgconn.PgError
			_, err := c.Exec(context.Background(), "SELECT count(*) FROM "+table)
			return errors.As(err, &pe) && pe.Code == "53400"
		})
	}
	wantPGError(t, c, "53400", "suspended", "SELECT count(*) FROM "+table)
	setState("active")
	pgAlive(t, c)
	insert := func() error { _, err := c.Exec(context.Background(), "INSERT INTO "+table+" VALUES (1)"); return err }
	if delegate {
		eventually(t, "an INSERT after resuming", func() bool { return insert() == nil })
	} else if err := insert(); err != nil {
		t.Fatalf("an INSERT after resuming: %v", err)
	}
	if err := txWrite(); err != nil {
		t.Fatalf("an INSERT after a SELECT in a transaction after resuming: %v", err)
	}
}

func isPGCode(err error, code string) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == code
}

// Policy survives a crash: a governord process on SQLite gets a soft cap
// with its mode set through the API, a warn_only cap from its config, a
// suspended tenant, a reserved minimum from its config, and a shadow
// ledger; it is killed with SIGKILL and started again on the same store,
// and the modes, the state and its reason, the minimum and the ledger are
// all back and enforced (the ledger only against dry runs).
func TestPolicySurvivesKill9(t *testing.T) {
	const otherKey = "recon-key-for-kill9-tests"
	g := startGovProc(t, "root: {limits: {db: 4}}\ntenants:\n  - {name: payments, api_key: "+tenantKey+", quotas: {calls: {cap: 3, mode: warn_only}}, minimums: {db: 3}}\n"+
		"  - {name: reconciliation, api_key: "+otherKey+"}\n")
	a := newAdmin(t, g.addr)
	pay, recon := a.node("payments"), a.node("reconciliation")
	c, err := governor.Dial(context.Background(), governor.WithAddr(g.addr), governor.WithAPIKey(tenantKey))
	must(t, err)
	_, task, err := c.NewTask(context.Background(), governor.Spec{Name: "job"})
	must(t, err)
	if _, err := a.c.Raw().SetCaps(context.Background(), &governorpb.SetCapsRequest{NodeId: task.ID(), Reason: "roll out",
		Quotas: map[string]int64{"tokens": 10}, QuotaModes: map[string]*governorpb.CapMode{"tokens": {Mode: "soft", Burst: 2}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.c.Raw().SetTenantState(context.Background(), &governorpb.SetTenantStateRequest{NodeId: recon.GetId(), State: "suspended", Reason: "incident 5"}); err != nil {
		t.Fatal(err)
	}
	// A shadow rule's request: 11 tokens go into the shadow ledger.
	if r, err := c.Raw().DryRun(context.Background(), &governorpb.DryRunRequest{NodeId: task.ID(),
		Charges: map[string]int64{"tokens": 11}, Record: true, RequestId: "shadow-1"}); err != nil || r.GetOutcome() != "admitted" {
		t.Fatalf("a recorded dry run: %v, %v", r, err)
	}
	c.Close()
	g.kill()
	g.start()

	a = newAdmin(t, g.addr)
	n, err := a.c.Raw().GetNode(context.Background(), &governorpb.GetNodeRequest{NodeId: task.ID()})
	must(t, err)
	if sh := n.GetShadow()["tokens"]; sh != 11 {
		t.Fatalf("the shadow ledger after kill -9: %d tokens, want 11", sh)
	}
	if r, err := a.c.Raw().DryRun(context.Background(), &governorpb.DryRunRequest{NodeId: task.ID(),
		Charges: map[string]int64{"tokens": 2}, Record: true}); err != nil || r.GetOutcome() != "quota" || r.GetDenial().GetUsed() != 11 {
		t.Fatalf("a recorded dry run past the ledger after kill -9: %v, %v; want quota with 11 used", r, err)
	}
	if m := n.GetQuotaModes()["tokens"]; m.GetMode() != "soft" || m.GetBurst() != 2 || n.GetQuotas()["tokens"] != 10 {
		t.Fatalf("the task's tokens after kill -9: cap %d mode %v", n.GetQuotas()["tokens"], m)
	}
	p, err := a.c.Raw().GetNode(context.Background(), &governorpb.GetNodeRequest{NodeId: pay.GetId()})
	must(t, err)
	if m := p.GetQuotaModes()["calls"]; m.GetMode() != "warn_only" {
		t.Fatalf("payments' calls mode after kill -9: %v", m)
	}
	if m := p.GetMinimums()["db"]; m.GetMin() != 3 {
		t.Fatalf("payments' minimum of db after kill -9: %v", m)
	}
	// Still checked against the pool: reconciliation cannot reserve 2 more.
	if _, err := a.c.Raw().SetCaps(context.Background(), &governorpb.SetCapsRequest{NodeId: recon.GetId(), Reason: "r",
		Minimums: map[string]*governorpb.Minimum{"db": {Min: 2}}}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a minimum past the pool after kill -9: %v", err)
	}
	r, err := a.c.Raw().GetNode(context.Background(), &governorpb.GetNodeRequest{NodeId: recon.GetId()})
	must(t, err)
	if r.GetTenantState() != "suspended" || r.GetTenantStateReason() != "incident 5" {
		t.Fatalf("reconciliation after kill -9: %q (%q)", r.GetTenantState(), r.GetTenantStateReason())
	}
	// Enforced: 12 tokens fit under the soft 10 + 2, the 13th does not; the
	// suspended tenant is refused.
	c, err = governor.Dial(context.Background(), governor.WithAddr(g.addr), governor.WithAPIKey(tenantKey))
	must(t, err)
	defer c.Close()
	_, task, _, err = c.FindOrCreateTask(context.Background(), governor.Spec{Name: "job"})
	must(t, err)
	must(t, task.Consume(context.Background(), "tokens", 12))
	var d *governor.Denial
	if err := task.Consume(context.Background(), "tokens", 1); !errors.As(err, &d) || d.Limit != 12 {
		t.Fatalf("the 13th token after kill -9: %v, want a denial at cap plus burst (12)", err)
	}
	rc, err := governor.Dial(context.Background(), governor.WithAddr(g.addr), governor.WithAPIKey(otherKey))
	must(t, err)
	defer rc.Close()
	if _, _, err := rc.NewTask(context.Background(), governor.Spec{Name: "batch"}); !errors.Is(err, governor.ErrTenantState) {
		t.Fatalf("a suspended tenant's new task after kill -9: %v", err)
	}
}

// The same request sequence through a sidecar with its rules enforced and
// through one with them in shadow (per rule, and the whole sidecar): the
// shadow one forwards every request, charges nothing, and counts exactly
// the denials the enforcing one made, by rule and cause, whether the quota
// was spent by other work or by the rule's own requests (the shadow
// ledger); governord counts the same dry runs.
func TestShadowCountsWhatHardDenies(t *testing.T) {
	for _, mode := range []string{"hard", "rule", "sidecar"} {
		t.Run(mode, func(t *testing.T) {
			g := startGovernord(t, func(c *serverconfig.Config) {
				c.Tenants[0].Quotas = map[string]int64{"spent": 4, "free": 100}
			})
			// Another task of the tenant has spent one of the 4: the rule's
			// own requests spend (or, in shadow, would spend) the other 3.
			other, err := governor.Dial(context.Background(), governor.WithAddr(g.Addr()), governor.WithAPIKey(tenantKey))
			must(t, err)
			defer other.Close()
			_, pre, err := other.NewTask(context.Background(), governor.Spec{Name: "pre"})
			must(t, err)
			must(t, pre.Consume(context.Background(), "spent", 1))
			var served atomic.Int64
			o := origin(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { served.Add(1); w.Write([]byte("ok")) }), false, false)
			ruleMode, top := "", ""
			switch mode {
			case "rule":
				ruleMode = ", mode: shadow"
			case "sidecar":
				top = "mode: shadow\n"
			}
			p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: top + "delegation: {enabled: false}\nrules:\n" +
				"  - {name: spent, match: {host: origin.test, path: /spent}, class: api, charge: {spent: 1}" + ruleMode + "}\n" +
				"  - {name: free, match: {host: origin.test, path: /free}, class: api, charge: {free: 1}" + ruleMode + "}\n"})
			base := hostURL(o, "origin.test")
			var denials []int // which requests were (or would have been) refused
			for i := range 10 {
				path := "/free"
				if i%2 == 0 {
					path = "/spent"
				}
				before := p.metric(`governor_proxy_shadow_denials_total{cause="quota",rule="spent"}`)
				code, cause, _ := get(t, p, base, path)
				switch {
				case code == 429 && cause == "quota":
					denials = append(denials, i)
				case code != 200:
					t.Fatalf("%s %s: %d %q", mode, path, code, cause)
				case p.metric(`governor_proxy_shadow_denials_total{cause="quota",rule="spent"}`) > before:
					denials = append(denials, i)
				}
			}
			a := newAdmin(t, g.Addr())
			tenant := a.node("payments")
			free, spent := tenant.GetUsed()["free"], tenant.GetUsed()["spent"]
			// 5 requests of spent: 3 fit beside the 1 spent before, the
			// last 2 (the 8th and 10th request) do not.
			if want := []int{6, 8}; !slices.Equal(denials, want) {
				t.Fatalf("%s: requests %v refused, want %v", mode, denials, want)
			}
			if mode == "hard" {
				if served.Load() != 8 || free != 5 || spent != 4 || len(tenant.GetShadow()) != 0 {
					t.Fatalf("hard: %d served, %d of free and %d of spent charged, shadow %v; want 8, 5, 4, none", served.Load(), free, spent, tenant.GetShadow())
				}
				return
			}
			if served.Load() != 10 || free != 0 || spent != 1 {
				t.Fatalf("shadow: %d served, %d of free and %d of spent charged; want 10, 0, 1 (the other task's)", served.Load(), free, spent)
			}
			if sh := tenant.GetShadow(); sh["spent"] != 3 || sh["free"] != 5 {
				t.Fatalf("the shadow ledger holds %v, want spent 3 and free 5 (what hard charged)", sh)
			}
			if p.metric(`governor_proxy_shadow_denials_total{cause="quota",rule="free"}`) != 0 ||
				p.metric(`governor_proxy_shadow_requests_total{rule="spent"}`) != 5 {
				t.Fatalf("shadow counted %v would-be denials of free and %v requests of spent, want 0 and 5",
					p.metric(`governor_proxy_shadow_denials_total{cause="quota",rule="free"}`), p.metric(`governor_proxy_shadow_requests_total{rule="spent"}`))
			}
			if n := govtest.Scrape(t, g.MetricsAddr(), `governor_dry_runs_total{outcome="quota"}`); n != 2 {
				t.Fatalf("governord counted %v dry runs refused for quota, want 2", n)
			}
			if !strings.Contains(p.logs.String(), "shadow_denied") {
				t.Fatalf("no would-be denial in the sidecar's log:\n%s", p.logs.String())
			}
		})
	}
}

// pgwire shadow: a rule in dry run lets every statement run, charges
// nothing, and counts each statement the same rule enforced refuses.
func TestPGWireShadow(t *testing.T) {
	pgUpstream(t)
	for _, mode := range []string{"enforce", "shadow"} {
		t.Run(mode, func(t *testing.T) {
			table := "pgq_shadow_" + mode
			freshPGTable(t, table)
			g := startGovernord(t, nil)
			p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: "task: {name: " + table + ", quotas: {db_writes: 2}}\n" + pgListenerYAML(t, "") +
				"rules:\n  - {name: writes, match: {sql: [insert]}, class: db, charge: {db_writes: 1}, mode: " + mode + "}\n"})
			c := pgConnect(t, pgDSN(p.PGWireAddrs()[0], ""))
			denied := 0
			for i := range 5 {
				if _, err := c.Exec(context.Background(), fmt.Sprintf("INSERT INTO %s VALUES (%d)", table, i)); err != nil {
					denied++
				}
			}
			shadowed := p.metric(`governor_proxy_pgwire_shadow_denials_total{cause="quota",rule="writes"}`)
			switch mode {
			case "enforce":
				if denied != 3 || pgRows(t, table) != 2 {
					t.Fatalf("enforced: %d denied, %d rows; want 3 and 2", denied, pgRows(t, table))
				}
			case "shadow":
				// Nothing is charged; the shadow ledger counts what was
				// admitted, so the same 3 would have been refused.
				if denied != 0 || pgRows(t, table) != 5 || shadowed != 3 {
					t.Fatalf("shadow: %d denied, %d rows, %v would-be denials; want 0, 5, 3", denied, pgRows(t, table), shadowed)
				}
				task := newAdmin(t, g.Addr()).node("payments", table)
				if task.GetUsed()["db_writes"] != 0 || task.GetShadow()["db_writes"] != 2 {
					t.Fatalf("shadow: %v used, %v in the shadow ledger; want nothing and 2 db_writes", task.GetUsed(), task.GetShadow())
				}
				// A connection named for a subtask is dry-run on it.
				sc := pgConnect(t, pgDSN(p.PGWireAddrs()[0], "crawler-1"))
				if _, err := sc.Exec(context.Background(), fmt.Sprintf("INSERT INTO %s VALUES (9)", table)); err != nil {
					t.Fatalf("a shadow rule refused: %v", err)
				}
				if !strings.Contains(p.logs.String(), "subtask=crawler-1 outcome=shadow_denied") {
					t.Fatalf("the subtask's would-be denial is not logged on it:\n%s", p.logs.String())
				}
			}
		})
	}
}

// A tenant's reserved minimum through real sidecars, with delegation off
// and on: another tenant's sidecar floods the pool of 4 slots (4 requests
// running, 6 more waiting); the reserved tenant (minimum 2) sends 2
// requests; each of the next two slots the flood frees goes to the
// reserved tenant, whatever the round robin's turn, and only then does
// the flood get one back. The flood's running requests are never cut.
func TestMinimumHoldsUnderAFloodThroughTheSidecars(t *testing.T) {
	const batchKey = "batch-key-for-minimum-tests"
	for _, delegate := range []bool{false, true} {
		t.Run(fmt.Sprintf("delegation=%t", delegate), func(t *testing.T) {
			g := startGovernord(t, func(c *serverconfig.Config) {
				c.Root.Limits = map[string]int64{"api": 4}
				c.Tenants[0].Minimums = map[string]engine.Minimum{"api": {Min: 2}}
				c.Tenants = append(c.Tenants, serverconfig.TenantConfig{Name: "batch", APIKey: batchKey, Weight: 1})
			})
			arrived := make(chan string, 32)
			release := map[string]chan struct{}{"/pay": make(chan struct{}, 16), "/batch": make(chan struct{}, 16)}
			o := origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				arrived <- r.URL.Path
				<-release[r.URL.Path]
				w.Write([]byte("ok"))
			}), false, false)
			base := hostURL(o, "origin.test")
			yaml := fmt.Sprintf("delegation: {enabled: %t}\nrules:\n  - {name: api, match: {host: origin.test}, class: api}\n", delegate)
			batch := startProxy(t, proxyOpts{gaddr: g.Addr(), key: batchKey, task: "flood", yaml: yaml})
			pay := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: yaml})
			t.Cleanup(func() { // let every request finish before the proxies stop
				close(release["/pay"])
				close(release["/batch"])
			})
			send := func(p *testProxy, path string, n int) {
				for range n {
					go func() {
						if resp, err := p.client("", nil).Get(base + path); err == nil {
							resp.Body.Close()
						}
					}()
				}
			}
			next := func() string {
				t.Helper()
				select {
				case path := <-arrived:
					return path
				case <-time.After(10 * time.Second):
					t.Fatal("no request reached the origin in 10s")
					return ""
				}
			}
			send(batch, "/batch", 10)
			for range 4 {
				if path := next(); path != "/batch" {
					t.Fatalf("the flood's first 4: got %s", path)
				}
			}
			a := newAdmin(t, g.Addr())
			payments := a.node("payments")
			queued := func() bool { // payments has an acquire queued at governord
				r, err := a.c.Raw().Inspect(context.Background(), &governorpb.InspectRequest{NodeId: payments.GetId()})
				return err == nil && r.GetWaiterCount() > 0
			}
			send(pay, "/pay", 2)
			for i := range 2 {
				eventually(t, "payments' request queued at governord", queued)
				release["/batch"] <- struct{}{} // one of the flood's requests ends
				if path := next(); path != "/pay" {
					t.Fatalf("slot %d freed by the flood went to %s, want payments (below its minimum of 2)", i+1, path)
				}
			}
			// At its minimum, with nothing waiting, payments takes no more:
			// the next slot goes back to the flood.
			release["/batch"] <- struct{}{}
			if path := next(); path != "/batch" {
				t.Fatalf("the slot freed after payments reached its minimum went to %s, want the flood", path)
			}
			select {
			case path := <-arrived:
				t.Fatalf("a fifth request (%s) is running in a pool of 4", path)
			default:
			}
		})
	}
}

func psqlExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
