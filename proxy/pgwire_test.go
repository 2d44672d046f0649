package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/governor-project/governor/proxy/proxyconfig"
	"github.com/governor-project/governor/server/serverconfig"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/governor/engine"
	"github.com/governor-project/governor/internal/testcert"
)

// The pgwire listeners of the real sidecar (Start, the HTTP side's session
// and task, the watcher's rules) against a real PostgreSQL from
// scripts/testpg.sh and an in-process governord.

// pgUpstream is the test server's address; the test is skipped without one.
func pgUpstream(t testing.TB) string {
	t.Helper()
	if os.Getenv("GOVERNOR_TEST_PG_DSN") == "" {
		t.Skip("GOVERNOR_TEST_PG_DSN is unset: source scripts/testpg.sh (./test.sh does) for the pgwire tests against a real PostgreSQL")
	}
	return "127.0.0.1:" + os.Getenv("GOVERNOR_TEST_PG_PORT")
}

// pgDSN is the superuser's DSN through addr, with application_name app.
func pgDSN(addr, app string) string {
	u := url.URL{Scheme: "postgres", User: url.UserPassword("governor", "governor"), Host: addr, Path: "/governor"}
	q := url.Values{"sslmode": {"disable"}}
	if app != "" {
		q.Set("application_name", app)
	}
	u.RawQuery = q.Encode()
	return u.String()
}

func pgConnect(t testing.TB, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect %s: %v", dsn, err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func pgExec(t testing.TB, c *pgx.Conn, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if _, err := c.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// pgDenied runs sql and wants an ERROR with code.
func wantPGError(t testing.TB, c *pgx.Conn, code, mention, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	_, err := c.Exec(ctx, sql, args...)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != code || pe.Severity != "ERROR" || !strings.Contains(pe.Message, mention) {
		t.Fatalf("%s: %v; want an ERROR %s mentioning %q", sql, err, code, mention)
	}
}

// pgAlive checks that the connection still runs an ungoverned statement.
func pgAlive(t testing.TB, c *pgx.Conn) {
	t.Helper()
	var n int
	if err := c.QueryRow(context.Background(), "SELECT 41 + 1").Scan(&n); err != nil || n != 42 {
		t.Fatalf("the connection after the denial: %d, %v", n, err)
	}
}

// freshPGTable creates an empty table, directly on the server.
func freshPGTable(t testing.TB, name string) {
	t.Helper()
	c := pgConnect(t, os.Getenv("GOVERNOR_TEST_PG_DSN"))
	pgExec(t, c, "DROP TABLE IF EXISTS "+name)
	pgExec(t, c, "CREATE TABLE "+name+" (id int)")
}

func pgRows(t testing.TB, table string) int {
	t.Helper()
	c := pgConnect(t, os.Getenv("GOVERNOR_TEST_PG_DSN"))
	var n int
	if err := c.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// pgListener is the YAML of one pgwire listener on a free port.
func pgListenerYAML(t testing.TB, extra string) string {
	return fmt.Sprintf("pgwire:\n  - {listen: 127.0.0.1:0, upstream: %s, task_from: application_name%s}\n", pgUpstream(t), extra)
}

const pgRules = `
rules:
  - {name: api, match: {host: origin.test}, class: api, charge: {db_writes: 1}}
  - {name: writes, match: {sql: [insert, update, delete], tables: ["pgq_*"]}, class: db, charge: {db_writes: 1}}
`

// A quota of 3 db_writes lets exactly 3 inserts through pgx (simple and
// extended protocol); the 4th is an ERROR 53400 naming the cap, and the
// connection goes on.
func TestPGWireQuota(t *testing.T) {
	pgUpstream(t)
	g := startGovernord(t, nil)
	for i, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement} {
		t.Run(mode.String(), func(t *testing.T) {
			table := fmt.Sprintf("pgq_mode%d", i)
			freshPGTable(t, table)
			p := startProxy(t, proxyOpts{gaddr: g.Addr(),
				yaml: "task: {name: " + table + ", quotas: {db_writes: 3}}\n" + pgListenerYAML(t, "") + pgRules})
			cfg, err := pgx.ParseConfig(pgDSN(p.PGWireAddrs()[0], ""))
			must(t, err)
			cfg.DefaultQueryExecMode = mode
			c, err := pgx.ConnectConfig(context.Background(), cfg)
			must(t, err)
			defer c.Close(context.Background())
			for i := range 3 {
				if _, err := c.Exec(context.Background(), "INSERT INTO "+table+" VALUES ($1)", i); err != nil {
					t.Fatalf("insert %d: %v", i, err)
				}
			}
			wantPGError(t, c, "53400", "db_writes", "INSERT INTO "+table+" VALUES ($1)", 4)
			pgAlive(t, c)
			if n := pgRows(t, table); n != 3 {
				t.Errorf("rows: %d, want 3", n)
			}
			if v := p.metric(`governor_proxy_pgwire_denials_total{cause="quota"}`); v != 1 {
				t.Errorf("quota denials: %v", v)
			}
			if v := p.metric(`governor_proxy_pgwire_transactions_total{outcome="admitted",rule="writes"}`); v != 3 {
				t.Errorf("admitted transactions: %v", v)
			}
		})
	}
}

// HTTP and SQL charge the same task node, and application_name names the
// same subtask as Proxy-Authorization's username: one HTTP request and two
// inserts spend a quota of 3, so a third insert is denied.
func TestPGWireSharesTheTaskWithHTTP(t *testing.T) {
	pgUpstream(t)
	freshPGTable(t, "pgq_shared")
	g := startGovernord(t, nil)
	o := origin(t, http.HandlerFunc(hello), false, false)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: "task: {name: pod-shared, quotas: {db_writes: 3}}\n" + pgListenerYAML(t, "") + pgRules})
	resp, err := p.client("crawl-42", nil).Get(hostURL(o, "origin.test") + "/")
	must(t, err)
	if readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("HTTP: %d", resp.StatusCode)
	}
	c := pgConnect(t, pgDSN(p.PGWireAddrs()[0], "crawl-42"))
	pgExec(t, c, "INSERT INTO pgq_shared VALUES (1)")
	pgExec(t, c, "INSERT INTO pgq_shared VALUES (2)")
	wantPGError(t, c, "53400", "db_writes", "INSERT INTO pgq_shared VALUES (3)")
	pgAlive(t, c)
	a := newAdmin(t, g.Addr())
	p.settle()
	if used := a.node("payments", "pod-shared", "crawl-42").GetUsed()["db_writes"]; used != 3 {
		t.Errorf("crawl-42 used %d db_writes, want 3 (1 over HTTP, 2 over SQL)", used)
	}
	if used := a.node("payments", "pod-shared").GetUsed()["db_writes"]; used != 3 {
		t.Errorf("the task used %d db_writes, want 3", used)
	}
	// The HTTP side is refused too now: the same quota.
	resp, err = p.client("", nil).Get(hostURL(o, "origin.test") + "/")
	must(t, err)
	if readAll(t, resp); resp.StatusCode != 429 {
		t.Errorf("HTTP after the SQL spent the quota: %d", resp.StatusCode)
	}
	// Metrics never name a task, a subtask, a user or a statement.
	mresp, err := noProxyClient.Get("http://" + p.MetricsAddr() + "/metrics")
	must(t, err)
	text := readAll(t, mresp)
	if !strings.Contains(text, "governor_proxy_pgwire_transactions_total") {
		t.Errorf("no pgwire series in /metrics")
	}
	for _, bad := range []string{"pod-shared", "crawl-42", "governor\"", "INSERT", "pgq_shared"} {
		if strings.Contains(text, bad) {
			t.Errorf("/metrics mentions %q", bad)
		}
	}
}

// A rule reload changes how the next transaction is classified; a
// transaction open across the reload goes on and commits.
func TestPGWireReload(t *testing.T) {
	pgUpstream(t)
	freshPGTable(t, "pgq_reload")
	g := startGovernord(t, nil)
	path := filepath.Join(t.TempDir(), "proxy.yaml")
	head := "task: {name: pod-reload, quotas: {reads: 1}}\n" + pgListenerYAML(t, "")
	reloaded := make(chan error, 10)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), path: path, yaml: head + `
rules:
  - {name: writes, match: {sql: [insert]}, class: db}
`, opts: func(o *Options) {
		o.ReloadInterval = 10 * time.Millisecond
		o.OnReload = func(err error) { reloaded <- err }
	}})
	a := newAdmin(t, g.Addr())
	ctx := context.Background()
	open := pgConnect(t, pgDSN(p.PGWireAddrs()[0], ""))
	pgExec(t, open, "BEGIN")
	pgExec(t, open, "INSERT INTO pgq_reload VALUES (1)")
	if h := a.node("payments", "pod-reload").GetHeld()["db"]; h != 1 {
		t.Fatalf("held during the open transaction: %d", h)
	}
	c := pgConnect(t, pgDSN(p.PGWireAddrs()[0], ""))
	var one int
	must(t, c.QueryRow(ctx, "SELECT 1").Scan(&one)) // no rule for reads yet
	must(t, c.QueryRow(ctx, "SELECT 1").Scan(&one))

	text := "governor: {addr: \"" + g.Addr() + "\", api_key: " + tenantKey + "}\nmetrics_listen: 127.0.0.1:0\nhttp: {listen: 127.0.0.1:0}\n" + head + `
rules:
  - {name: reads, match: {sql: [select]}, class: db, charge: {reads: 1}}
  - {name: writes, match: {sql: [insert]}, class: db}
`
	must(t, os.WriteFile(path+".tmp", []byte(text), 0o644))
	must(t, os.Rename(path+".tmp", path))
	select {
	case err := <-reloaded:
		must(t, err)
	case <-time.After(waitFor):
		t.Fatal("no reload")
	}
	must(t, c.QueryRow(ctx, "SELECT 1").Scan(&one)) // reads: 1 of 1
	wantPGError(t, c, "53400", "reads", "SELECT 1")
	p.settle()
	if used := a.node("payments", "pod-reload").GetUsed()["reads"]; used != 1 {
		t.Errorf("reads used: %d, want 1", used)
	}
	// The transaction open across the reload is still there, and commits.
	pgExec(t, open, "INSERT INTO pgq_reload VALUES (2)")
	pgExec(t, open, "COMMIT")
	if n := pgRows(t, "pgq_reload"); n != 2 {
		t.Errorf("rows committed across the reload: %d", n)
	}
	eventually(t, "the lease's release", func() bool { return a.node("payments", "pod-reload").GetHeld()["db"] == 0 })
}

// A transaction that waits longer than pgwire's wait_timeout for its lease
// gets 55P03; with governord gone, 53000. Both leave the connection usable.
func TestPGWireWaitTimeoutAndUnavailable(t *testing.T) {
	pgUpstream(t)
	freshPGTable(t, "pgq_wait")
	g := startGovernord(t, nil)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(),
		yaml: "task: {name: pod-wait, limits: {db: 1}}\n" + pgListenerYAML(t, ", wait_timeout: 300ms") +
			fmt.Sprintf("  - {listen: 127.0.0.1:0, upstream: %s}\n", pgUpstream(t)) + pgRules,
		opts: func(o *Options) { o.GovernorOptions = []governor.Option{governor.WithTTL(500 * time.Millisecond)} }})
	holder := pgConnect(t, pgDSN(p.PGWireAddrs()[0], ""))
	pgExec(t, holder, "BEGIN")
	pgExec(t, holder, "INSERT INTO pgq_wait VALUES (1)")
	c := pgConnect(t, pgDSN(p.PGWireAddrs()[0], ""))
	began := time.Now()
	wantPGError(t, c, "55P03", "wait", "INSERT INTO pgq_wait VALUES (2)")
	if w := time.Since(began); w > 5*time.Second {
		t.Errorf("the wait took %v with wait_timeout 300ms", w)
	}
	pgAlive(t, c)
	pgExec(t, holder, "COMMIT")

	// The second listener waits http.wait_timeout (30s), longer than the
	// proxy retries an unreachable governord. Once the sidecar's local
	// deadline has passed, what it held covers nothing any more.
	c2 := pgConnect(t, pgDSN(p.PGWireAddrs()[1], ""))
	g.Close()
	eventually(t, "the proxy to give the session up", func() bool { return p.metric("governor_proxy_session_up") == 0 })
	wantPGError(t, c2, "53000", "governord", "INSERT INTO pgq_wait VALUES (3)")
	pgAlive(t, c2)
	wantPGError(t, c, "53000", "governord", "INSERT INTO pgq_wait VALUES (4)")
	pgAlive(t, c)
	if v := p.metric(`governor_proxy_pgwire_denials_total{cause="unavailable"}`); v != 2 {
		t.Errorf("unavailable denials: %v", v)
	}
	if v := p.metric(`governor_proxy_pgwire_denials_total{cause="wait-timeout"}`); v != 1 {
		t.Errorf("wait-timeout denials: %v", v)
	}
	if n := pgRows(t, "pgq_wait"); n != 1 {
		t.Errorf("rows: %d, want 1", n)
	}
}

// On shutdown the pgwire listeners stop accepting, an open transaction
// finishes and commits, an idle connection starts no new one (53000), and
// every lease is released.
func TestPGWireShutdown(t *testing.T) {
	pgUpstream(t)
	freshPGTable(t, "pgq_stop")
	g := startGovernord(t, nil)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: "task: {name: pod-stop}\n" + pgListenerYAML(t, "") + pgRules})
	addr := p.PGWireAddrs()[0]
	a := newAdmin(t, g.Addr())
	held := func() int64 { return a.node("payments", "pod-stop").GetHeld()["db"] }
	busy := pgConnect(t, pgDSN(addr, ""))
	idle := pgConnect(t, pgDSN(addr, ""))
	pgExec(t, busy, "BEGIN")
	pgExec(t, busy, "INSERT INTO pgq_stop VALUES (1)")
	if h := held(); h != 1 {
		t.Fatalf("held: %d", h)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	stopped := make(chan error, 1)
	go func() { stopped <- p.Shutdown(ctx) }()
	eventually(t, "the pgwire listener to stop accepting", func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	wantPGError(t, idle, "53000", "shutting down", "INSERT INTO pgq_stop VALUES (9)")
	select {
	case err := <-stopped:
		t.Fatalf("Shutdown returned with a transaction open: %v", err)
	default:
	}
	pgExec(t, busy, "INSERT INTO pgq_stop VALUES (2)")
	pgExec(t, busy, "COMMIT")
	if err := <-stopped; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if n := pgRows(t, "pgq_stop"); n != 2 {
		t.Errorf("rows: %d, want 2", n)
	}
	if h := held(); h != 0 {
		t.Errorf("held after Shutdown: %d", h)
	}
	if err := busy.Ping(context.Background()); err == nil {
		t.Errorf("a connection outlived Shutdown")
	}
}

// TLS on both legs: a client's SSLRequest is terminated with tls's
// certificate (md5 login, as SCRAM with TLS on both legs needs
// channel_binding=disable), and the upstream leg is TLS checked against
// the server's CA.
func TestPGWireTLS(t *testing.T) {
	up := pgUpstream(t)
	ca := os.Getenv("GOVERNOR_TEST_PG_CA")
	if ca == "" {
		t.Skip("GOVERNOR_TEST_PG_CA is unset: the test server has no TLS (openssl missing)")
	}
	cert := testcert.New(t, "127.0.0.1")
	g := startGovernord(t, nil)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: fmt.Sprintf(`task: {name: pod-tls}
pgwire:
  - listen: 127.0.0.1:0
    upstream: %s
    tls: {cert_file: %q, key_file: %q}
    upstream_tls: {enabled: true, ca_file: %q}
`, up, cert.CertFile, cert.KeyFile, ca) + pgRules})
	addr := p.PGWireAddrs()[0]
	for _, tc := range []struct {
		name, dsn string
		tls       bool
	}{
		{"md5 over TLS on both legs", fmt.Sprintf("postgres://gov_md5:md5pass@%s/governor?sslmode=verify-full&sslrootcert=%s", addr, cert.CertFile), true},
		{"scram, plain client leg", fmt.Sprintf("postgres://governor:governor@%s/governor?sslmode=disable", addr), false},
	} {
		c := pgConnect(t, tc.dsn)
		var upSSL bool
		must(t, c.QueryRow(context.Background(), "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&upSSL))
		if !upSSL {
			t.Errorf("%s: the upstream leg is not TLS", tc.name)
		}
		if _, isTLS := c.PgConn().Conn().(*tls.Conn); isTLS != tc.tls {
			t.Errorf("%s: the client leg is TLS: %v", tc.name, isTLS)
		}
	}
}

// A TLS file that cannot be read is a config error naming the key.
func TestPGWireBadTLSFile(t *testing.T) {
	cfg, err := proxyconfig.ParseConfig([]byte(fmt.Sprintf(`governor: {addr: "127.0.0.1:1", api_key: k}
task: {name: pod}
http: {listen: 127.0.0.1:0}
metrics_listen: ""
pgwire:
  - {listen: 127.0.0.1:0, upstream: 127.0.0.1:5432, upstream_tls: {enabled: true, ca_file: %q}}
`, filepath.Join(t.TempDir(), "none.pem"))))
	must(t, err)
	_, err = Start(context.Background(), cfg, Options{})
	if !proxyconfig.IsConfigError(err) || !strings.Contains(err.Error(), "pgwire[0].upstream_tls.ca_file") {
		t.Errorf("Start: %v", err)
	}
	for _, tc := range []struct{ yaml, key string }{
		{"{listen: 127.0.0.1:0, upstream: x:1, tls: {cert_file: a.pem}}", "pgwire[0].tls"},
		{"{listen: 127.0.0.1:0, upstream: x:1, upstream_tls: {ca_file: a.pem}}", "pgwire[0].upstream_tls.enabled"},
		{"{listen: 127.0.0.1:0, upstream: x:1, wait_timeout: -1s}", "pgwire[0].wait_timeout"},
	} {
		_, err := proxyconfig.ParseConfig([]byte("governor: {api_key: k}\ntask: {name: pod}\npgwire:\n  - " + tc.yaml + "\n"))
		if !proxyconfig.IsConfigError(err) || !strings.Contains(err.Error(), tc.key) {
			t.Errorf("%s: %v, want an error naming %s", tc.yaml, err, tc.key)
		}
	}
	c, err := proxyconfig.ParseConfig([]byte("governor: {api_key: k}\ntask: {name: pod}\nhttp: {wait_timeout: 7s}\npgwire:\n  - {listen: 127.0.0.1:0, upstream: x:1}\n  - {listen: 127.0.0.1:0, upstream: x:1, wait_timeout: 2s}\n"))
	must(t, err)
	if c.PGWire[0].WaitTimeout != 7*time.Second || c.PGWire[1].WaitTimeout != 2*time.Second {
		t.Errorf("wait_timeout: %v %v, want http's 7s, then 2s", c.PGWire[0].WaitTimeout, c.PGWire[1].WaitTimeout)
	}
}

// TestPGWirePacesARate: pgwire statements go through the one admission
// path, so they are paced too. Under 2 db_writes a second, 5 inserts all
// succeed, the last ones after waiting for the rate (bounded by the
// listener's wait_timeout); with on_rate: deny the third is refused at
// once with 53300.
func TestPGWirePacesARate(t *testing.T) {
	pgUpstream(t)
	for _, onRate := range []string{"wait", "deny"} {
		t.Run(onRate, func(t *testing.T) {
			g := startGovernord(t, func(c *serverconfig.Config) {
				c.Tenants[0].Rates = map[string]engine.Rate{"db_writes": {Units: 2, Per: int64(time.Second)}}
			})
			table := "pgrate_" + onRate
			freshPGTable(t, table)
			p := startProxy(t, proxyOpts{gaddr: g.Addr(), task: table, yaml: pgListenerYAML(t, ", wait_timeout: 5s") + `
rules:
  - {name: writes, match: {sql: [insert]}, charge: {db_writes: 1}, on_rate: ` + onRate + `}
`})
			c := pgConnect(t, pgDSN(p.PGWireAddrs()[0], ""))
			if onRate == "deny" {
				for i := range 2 {
					pgExec(t, c, fmt.Sprintf("INSERT INTO %s VALUES (%d)", table, i))
				}
				began := time.Now()
				wantPGError(t, c, "53300", "db_writes", "INSERT INTO "+table+" VALUES (2)")
				if took := time.Since(began); took > 400*time.Millisecond {
					t.Errorf("the refusal took %v, want at once", took)
				}
				return
			}
			began := time.Now()
			for i := range 5 {
				pgExec(t, c, fmt.Sprintf("INSERT INTO %s VALUES (%d)", table, i))
			}
			if took := time.Since(began); took < 1200*time.Millisecond {
				t.Errorf("5 inserts took %v under 2 a second with a burst of 2, want at least 1.5s", took)
			}
			if n := pgRows(t, table); n != 5 {
				t.Errorf("rows: %d, want 5", n)
			}
		})
	}
}
