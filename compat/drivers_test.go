package compat

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/internal/pgtest"
	"github.com/governor-project/governor/proxy"
	"github.com/governor-project/governor/proxy/proxyconfig"
)

// scramUser logs in with SCRAM-SHA-256 (scripts/testpg.sh creates it).
const scramUser, scramPassword = "gov_scram", "scrampass"

// pgTarget is where a driver connects: PostgreSQL itself or the proxy.
type pgTarget struct {
	mode       string // direct or proxy
	host, port string
	database   string
}

// env is libpq's variables for the target, which psycopg reads, and which
// the Node and Java scripts read the same way.
func (p pgTarget) env() []string {
	return []string{"PGHOST=" + p.host, "PGPORT=" + p.port, "PGUSER=" + scramUser, "PGPASSWORD=" + scramPassword,
		"PGDATABASE=" + p.database, "PGSSLMODE=disable", "COMPAT_MODE=" + p.mode}
}

// pgSetup is a database of its own with the matrix's tables, and a sidecar
// whose pgwire listener leads to it.
type pgSetup struct {
	admin           string // the superuser's DSN of the database
	direct, proxied pgTarget
}

func startPG(t *testing.T) *pgSetup {
	t.Helper()
	dsn, name := pgtest.Database(t, "compat")
	pgtest.Exec(t, dsn.String(), `CREATE TABLE compat_items (id int, v text);
		CREATE TABLE compat_denied (id int);
		GRANT ALL ON compat_items, compat_denied TO `+scramUser)
	g := govtest.Start(t, nil)
	cfg, err := proxyconfig.ParseConfig(fmt.Appendf(nil, `
governor: {addr: %q, api_key: %s}
task: {name: compat-drivers, quotas: {never: 0}}
http: {listen: 127.0.0.1:0}
metrics_listen: 127.0.0.1:0
pgwire:
  - {listen: 127.0.0.1:0, upstream: %q}
rules:
  - {name: denied, match: {sql: [insert], tables: [compat_denied]}, class: db, charge: {never: 1}}
  - {name: any-sql, match: {sql: any}, class: db}
`, g.Addr(), govtest.TenantKey, dsn.Host))
	if err != nil {
		t.Fatal(err)
	}
	p := startSidecar(t, cfg, proxy.Options{})
	s := &pgSetup{admin: dsn.String()}
	host, port, _ := net.SplitHostPort(dsn.Host)
	s.direct = pgTarget{mode: "direct", host: host, port: port, database: name}
	host, port, _ = net.SplitHostPort(p.PGWireAddrs()[0])
	s.proxied = pgTarget{mode: "proxy", host: host, port: port, database: name}
	return s
}

// reset empties the tables between two runs of a script.
func (s *pgSetup) reset(t *testing.T) {
	pgtest.Exec(t, s.admin, "TRUNCATE compat_items, compat_denied")
}

// runDriver runs one driver's cells directly and through the proxy, checks
// that each passed both ways, and records the row.
func (s *pgSetup) runDriver(t *testing.T, client string, run func(t *testing.T, target pgTarget) (string, map[string]result)) {
	t.Helper()
	s.reset(t)
	_, direct := run(t, s.direct)
	s.reset(t)
	version, proxied := run(t, s.proxied)
	checkCells(t, client+" directly", drivers.columns, direct)
	checkCells(t, client+" through the proxy", drivers.columns, proxied)
	for _, col := range drivers.columns {
		d, p := direct[col], proxied[col]
		if col == "denial" {
			if d.Result != "skip" || p.Result != "ok" {
				t.Errorf("%s: denial: directly %s, through the proxy %s (%s)", client, d.Result, p.Result, p.Detail)
			}
			continue
		}
		if d.Result != p.Result {
			t.Errorf("%s: %s: directly %s (%s), through the proxy %s (%s)", client, col, d.Result, d.Detail, p.Result, p.Detail)
		}
	}
	drivers.record(&row{client: client, version: version, cells: proxied, direct: direct})
}

func TestDrivers(t *testing.T) {
	enabled(t)
	s := startPG(t)
	python := os.Getenv("COMPAT_PYTHON") // Debian's python3, which has Debian's psycopg
	if python == "" {
		python = "/usr/bin/python3"
	}
	script := func(name string, args ...string) func(*testing.T, pgTarget) (string, map[string]result) {
		return func(t *testing.T, target pgTarget) (string, map[string]result) {
			return runScript(t, target.env(), name, args...)
		}
	}
	t.Run("psycopg2", func(t *testing.T) {
		s.runDriver(t, "psycopg2", script(python, "python/drivers.py", "psycopg2"))
	})
	t.Run("psycopg", func(t *testing.T) {
		s.runDriver(t, "psycopg 3", script(python, "python/drivers.py", "psycopg"))
	})
	t.Run("node-postgres Client", func(t *testing.T) {
		s.runDriver(t, "node-postgres Client", script("node", "node/drivers.js", "client"))
	})
	t.Run("node-postgres Pool", func(t *testing.T) {
		s.runDriver(t, "node-postgres Pool", script("node", "node/drivers.js", "pool"))
	})
	t.Run("JDBC", func(t *testing.T) {
		jar := os.Getenv("COMPAT_PGJDBC_JAR") // Debian's libpostgresql-jdbc-java
		if jar == "" {
			jar = "/usr/share/java/postgresql.jar"
		}
		s.runDriver(t, "PostgreSQL JDBC", script("java", "-cp", jar, filepath.Join("java", "JdbcCompat.java")))
	})
	t.Run("lib/pq", func(t *testing.T) {
		s.runDriver(t, "lib/pq", func(t *testing.T, target pgTarget) (string, map[string]result) {
			return "lib/pq " + libpqVersion(t) + " (" + runtime.Version() + ")", libpqCells(target)
		})
	})
}

// dsn is the target as a URL for lib/pq.
func (p pgTarget) dsn() string {
	u := url.URL{Scheme: "postgres", User: url.UserPassword(scramUser, scramPassword), Host: net.JoinHostPort(p.host, p.port),
		Path: "/" + p.database, RawQuery: "sslmode=disable&application_name=compat-libpq"}
	return u.String()
}

// startSidecar starts a sidecar in this process and waits for its session
// with governord; it is shut down when the test ends.
func startSidecar(t *testing.T, cfg proxyconfig.Config, opts proxy.Options) *proxy.Sidecar {
	t.Helper()
	p, err := proxy.Start(context.Background(), cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		p.Shutdown(ctx)
	})
	select {
	case <-p.Ready():
	case <-time.After(waitFor):
		t.Fatal("the sidecar opened no session with governord")
	}
	return p
}
