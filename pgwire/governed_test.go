package pgwire_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/governor-project/governor/classify"
	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/pgwire"
	"github.com/governor-project/governor/proxy/admission"
	"github.com/governor-project/governor/proxy/budget"
	"github.com/governor-project/governor/server"
	"github.com/governor-project/governor/server/serverconfig"
)

const testRules = `
rules:
  - name: writes
    match: {sql: [insert, update, delete, merge, copy], tables: ["payments*"]}
    class: db
    charge: {db_writes: 1}
  - name: any-sql
    match: {sql: any}
    class: db
`

// governord starts an in-process governord whose tenant may hold dbLimit
// db leases at once.
func governord(t testing.TB, dbLimit int64) *server.Server {
	return govtest.Start(t, func(c *serverconfig.Config) { c.Tenants[0].Limits = map[string]int64{"db": dbLimit} })
}

// governedProxy starts a sidecar's pgwire side on the sidecar's admission
// layer, with its own session and task (spec), delegation on, under
// testRules.
func governedProxy(t testing.TB, srv *server.Server, spec governor.Spec, tweak func(*pgwire.Proxy)) string {
	t.Helper()
	return ruledProxy(t, srv, spec, testRules, tweak)
}

// ruledProxy is governedProxy under the rules of a YAML document.
func ruledProxy(t testing.TB, srv *server.Server, spec governor.Spec, yaml string, tweak func(*pgwire.Proxy)) string {
	t.Helper()
	if spec.Name == "" {
		spec.Name = strings.ReplaceAll(t.Name(), "/", "-")
	}
	rules, err := classify.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	adm := budget.New(budget.Config{Task: spec, Delegate: true,
		Dial: []governor.Option{governor.WithAddr(srv.Addr()), governor.WithAPIKey(govtest.TenantKey)}})
	ctx, stop := context.WithCancel(context.Background())
	go adm.Run(ctx)
	select {
	case <-adm.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("no session with governord")
	}
	p := &pgwire.Proxy{Rules: func() *classify.Rules { return rules }, Admitter: adm, WaitTimeout: 5 * time.Second}
	if tweak != nil {
		tweak(p)
	}
	addr := startProxy(t, p)
	// Runs before startProxy's cleanup (LIFO): close the session after the
	// proxy ended its tickets.
	t.Cleanup(func() {
		p.Close()
		stop()
		adm.Close(context.Background())
	})
	return addr
}

func freshTable(t testing.TB, name string) {
	t.Helper()
	direct := connect(t, superDSN("127.0.0.1:"+pgPort(t)))
	exec1(t, direct, "DROP TABLE IF EXISTS "+name)
	exec1(t, direct, "CREATE TABLE "+name+" (id int)")
}

func countRows(t testing.TB, table string) int {
	t.Helper()
	direct := connect(t, superDSN("127.0.0.1:"+pgPort(t)))
	var n int
	if err := direct.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestGovernedQuota(t *testing.T) {
	pgPort(t)
	srv := governord(t, 10)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement} {
		t.Run(mode.String(), func(t *testing.T) {
			freshTable(t, "payments_q")
			addr := governedProxy(t, srv, governor.Spec{Name: "quota-" + mode.String(), Quotas: map[string]int64{"db_writes": 3}}, nil)
			ctx := context.Background()
			c := connectMode(t, superDSN(addr), mode)
			for i := range 3 {
				if _, err := c.Exec(ctx, "INSERT INTO payments_q VALUES ($1)", i); err != nil {
					t.Fatalf("insert %d: %v", i, err)
				}
			}
			_, err := c.Exec(ctx, "INSERT INTO payments_q VALUES ($1)", 4)
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != "53400" || pe.Severity != "ERROR" || !strings.Contains(pe.Message, "db_writes") {
				t.Fatalf("4th insert: %v, want ERROR 53400 naming db_writes", err)
			}
			var one int
			if err := c.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
				t.Fatalf("after the denial the connection should work: %v", err)
			}
			if n := countRows(t, "payments_q"); n != 3 {
				t.Fatalf("%d rows, want exactly 3", n)
			}
		})
	}
}

func TestDenialInsideTransaction(t *testing.T) {
	pgPort(t)
	srv := governord(t, 10)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec} {
		t.Run(mode.String(), func(t *testing.T) {
			freshTable(t, "payments_tx")
			addr := governedProxy(t, srv, governor.Spec{Name: "tx-" + mode.String(), Quotas: map[string]int64{"db_writes": 1}}, nil)
			ctx := context.Background()
			c := connectMode(t, superDSN(addr), mode)
			tx, err := c.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, "INSERT INTO payments_tx VALUES (1)"); err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, "INSERT INTO payments_tx VALUES (2)"); sqlState(err) != "53400" {
				t.Fatalf("second insert: %v, want 53400", err)
			}
			if err := tx.Commit(ctx); !errors.Is(err, pgx.ErrTxCommitRollback) {
				t.Fatalf("commit after a denial: %v, want a rollback", err)
			}
			if n := countRows(t, "payments_tx"); n != 0 {
				t.Fatalf("%d rows committed after a denial, want 0", n)
			}
			var one int
			if err := c.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestClassLimitAcrossSidecars(t *testing.T) {
	pgPort(t)
	srv := governord(t, 2)
	a := governedProxy(t, srv, governor.Spec{Name: "sidecar-a"}, nil)
	b := governedProxy(t, srv, governor.Spec{Name: "sidecar-b"}, nil)
	ctx := context.Background()
	monitor := connect(t, superDSN("127.0.0.1:"+pgPort(t)))
	var stop atomic.Bool
	var peak atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, 16)
	for i := range 8 {
		addr := a
		if i%2 == 1 {
			addr = b
		}
		c := connect(t, dsn(addr, "governor", "governor", "application_name=governed"))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 6 {
				tx, err := c.Begin(ctx)
				if err != nil {
					errc <- err
					return
				}
				if _, err := tx.Exec(ctx, "SELECT pg_sleep(0.02)"); err != nil {
					errc <- err
					return
				}
				if err := tx.Commit(ctx); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for {
		select {
		case <-done:
			stop.Store(true)
		default:
		}
		if stop.Load() {
			break
		}
		var n int64
		if err := monitor.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = 'governed' AND state IN ('active', 'idle in transaction')`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > peak.Load() {
			peak.Store(n)
		}
	}
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if peak.Load() > 2 {
		t.Fatalf("pg_stat_activity showed %d governed transactions at once; the limit is 2", peak.Load())
	}
	if peak.Load() == 0 {
		t.Fatal("never saw a governed transaction")
	}
	t.Logf("peak governed transactions: %d", peak.Load())
}

func TestWaitTimeoutAndNotice(t *testing.T) {
	pgPort(t)
	srv := governord(t, 1)
	addr := governedProxy(t, srv, governor.Spec{Name: "waiter"}, func(p *pgwire.Proxy) { p.WaitTimeout = 1500 * time.Millisecond })
	ctx := context.Background()
	holder := connect(t, superDSN(addr))
	tx, err := holder.Begin(ctx) // holds the only db lease
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	cfg, _ := pgx.ParseConfig(superDSN(addr))
	var notices atomic.Int32
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		if strings.Contains(n.Message, "waiting") {
			notices.Add(1)
		}
	}
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	_, err = c.Exec(ctx, "SELECT 1")
	if sqlState(err) != "55P03" {
		t.Fatalf("waiting past wait_timeout: %v, want 55P03", err)
	}
	if notices.Load() == 0 {
		t.Fatal("no NOTICE while waiting over a second")
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var one int
	if err := c.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		t.Fatalf("after the lease is free: %v", err)
	}
}

type failingAdmitter struct{}

func (failingAdmitter) Admit(ctx context.Context, r admission.Request) (admission.Ticket, error) {
	return nil, admission.Deny(ctx, errors.New("connection refused"), r.Class, 0)
}

func TestUnavailableFailsClosed(t *testing.T) {
	rules, _ := classify.Parse([]byte(testRules))
	p := &pgwire.Proxy{Rules: func() *classify.Rules { return rules }, Admitter: failingAdmitter{}}
	addr := startProxy(t, p)
	c := connect(t, superDSN(addr))
	for range 2 {
		if _, err := c.Exec(context.Background(), "SELECT 1"); sqlState(err) != "53000" {
			t.Fatalf("governord down: %v, want 53000", err)
		}
	}
	if p.Counts()["deny_unavailable"] != 2 {
		t.Fatalf("counts %v", p.Counts())
	}
}

func TestTaskFromApplicationName(t *testing.T) {
	pgPort(t)
	srv := governord(t, 10)
	freshTable(t, "payments_app")
	addr := governedProxy(t, srv, governor.Spec{Name: "apps", DefaultQuotas: map[string]int64{"db_writes": 1}},
		func(p *pgwire.Proxy) { p.TaskFromApplicationName = true })
	ctx := context.Background()
	for _, app := range []string{"crawl-1", "crawl-2"} {
		c := connect(t, dsn(addr, "governor", "governor", "application_name="+app))
		if _, err := c.Exec(ctx, "INSERT INTO payments_app VALUES (1)"); err != nil {
			t.Fatalf("%s: first insert: %v", app, err)
		}
		if _, err := c.Exec(ctx, "INSERT INTO payments_app VALUES (2)"); sqlState(err) != "53400" {
			t.Fatalf("%s: second insert: %v, want 53400 (each subtask has db_writes: 1)", app, err)
		}
	}
	if n := countRows(t, "payments_app"); n != 2 {
		t.Fatalf("%d rows, want 2", n)
	}
}

// TestApplicationNameFollowsTheSubtaskRule: an application_name that names
// a subtask obeys the rule a Proxy-Authorization username does, control
// characters refused (only NUL was, as "not valid UTF-8"), and a refused
// statement never runs.
func TestApplicationNameFollowsTheSubtaskRule(t *testing.T) {
	pgPort(t)
	srv := governord(t, 10)
	freshTable(t, "payments_names")
	addr := governedProxy(t, srv, governor.Spec{Name: "names", DefaultQuotas: map[string]int64{"db_writes": 10}},
		func(p *pgwire.Proxy) { p.TaskFromApplicationName = true })
	ctx := context.Background()
	for _, app := range []string{"crawl\x01", "a\tb", "esc\x1b[31m", "del\x7f"} {
		cfg, err := pgx.ParseConfig(dsn(addr, "governor", "governor", ""))
		if err != nil {
			t.Fatal(err)
		}
		cfg.RuntimeParams["application_name"] = app
		c, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatalf("%q: %v", app, err)
		}
		_, err = c.Exec(ctx, "INSERT INTO payments_names VALUES (1)")
		if sqlState(err) != "22023" || !strings.Contains(err.Error(), "control character") {
			t.Errorf("application_name %q: %v, want 22023 naming the control character", app, err)
		}
		c.Close(ctx)
	}
	if n := countRows(t, "payments_names"); n != 0 {
		t.Fatalf("%d rows written under refused subtask names", n)
	}
	c := connect(t, dsn(addr, "governor", "governor", "application_name=crawl-ß-東京"))
	if _, err := c.Exec(ctx, "INSERT INTO payments_names VALUES (2)"); err != nil {
		t.Fatalf("a subtask named in letters of any script: %v", err)
	}
}
