package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"gopkg.in/yaml.v3"
)

// schema holds the example's tables; each run recreates it.
const schema = "checkout_example"

// env is what a run set up: the binaries, PostgreSQL, the gateway, and how
// to take them down.
type env struct {
	opts     options
	log      io.Writer
	root     string // the module's folder
	dir      string // a temporary folder for the binaries
	bins     map[string]string
	pg       *postgres // nil when the DSN came from the environment
	dsn      *url.URL  // PostgreSQL, as the driver reaches it
	capacity int       // the gateway's, from governor.yaml's psp limit
	psp      *process
	pspAddr  string
	client   *http.Client // the driver's own: never through a proxy
	keys     map[string]string
}

func setUp(ctx context.Context, opts options, log io.Writer) (e *env, err error) {
	e = &env{opts: opts, log: log, client: &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 256}, Timeout: time.Minute}}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	if e.root, err = moduleRoot(); err != nil {
		return nil, err
	}
	if e.capacity, err = pspLimit(filepath.Join(e.root, "examples", "checkout", "governor.yaml")); err != nil {
		return nil, err
	}
	host, err := pspHost()
	if err != nil {
		return nil, err
	}
	if e.dir, err = os.MkdirTemp("", "checkout-example-"); err != nil {
		return nil, err
	}
	fmt.Fprintln(log, "checkout: building governord, governor-proxy and the example's programs")
	if e.bins, err = build(ctx, e.root, e.dir); err != nil {
		return nil, err
	}
	if err := e.openDatabase(ctx); err != nil {
		return nil, err
	}
	e.psp, err = start("psp", e.bins["psp"], cleanEnv(), "-listen", net.JoinHostPort(host, "0"), "-capacity", fmt.Sprint(e.capacity))
	if err != nil {
		return nil, err
	}
	line, err := e.psp.waitFor(ctx, "psp listening", startTimeout)
	if err != nil {
		return nil, err
	}
	e.pspAddr = fmt.Sprint(line["addr"])
	e.keys = map[string]string{"checkout": randomKey(), "batch": randomKey()}
	return e, nil
}

func (e *env) close() {
	if e.psp != nil {
		e.psp.stop()
	}
	if e.pg != nil {
		e.pg.stop()
	}
	if e.dir != "" {
		os.RemoveAll(e.dir)
	}
}

// openDatabase finds or starts PostgreSQL and creates the example's schema.
func (e *env) openDatabase(ctx context.Context) error {
	dsn := os.Getenv("CHECKOUT_DATABASE_URL")
	if dsn == "" {
		dsn = os.Getenv("GOVERNOR_TEST_PG_DSN")
	}
	if dsn == "" {
		fmt.Fprintln(e.log, "checkout: starting a throwaway PostgreSQL with scripts/testpg.sh")
		pg, err := startPostgres(ctx, e.root, e.log)
		if err != nil {
			return err
		}
		e.pg, dsn = pg, pg.dsn
	}
	u, err := url.Parse(dsn)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") || u.Host == "" {
		return errors.New("the database's DSN must be a postgres://user:password@host:port/db URL")
	}
	e.dsn = u
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("database: %w", err)
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `DROP SCHEMA IF EXISTS `+schema+` CASCADE;
CREATE SCHEMA `+schema+`;
CREATE TABLE `+schema+`.orders (id bigserial PRIMARY KEY, amount int NOT NULL, status text NOT NULL,
	charge_id text, created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE `+schema+`.payouts (id bigserial PRIMARY KEY, amount int NOT NULL, status text NOT NULL);
CREATE INDEX payouts_pending ON `+schema+`.payouts (id) WHERE status = 'pending';`)
	if err != nil {
		return fmt.Errorf("create the schema %s: %w", schema, err)
	}
	return nil
}

// resetData empties the orders and seeds the batch's pending payouts, so
// that each mode starts from the same data.
func (e *env) resetData(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, e.dsn.String())
	if err != nil {
		return fmt.Errorf("database: %w", err)
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `TRUNCATE `+schema+`.orders, `+schema+`.payouts RESTART IDENTITY`)
	if err == nil {
		_, err = conn.Exec(ctx, `INSERT INTO `+schema+`.payouts (amount, status)
			SELECT 100 + g % 9000, 'pending' FROM generate_series(1, $1) g`, e.opts.Payouts)
	}
	if err != nil {
		return fmt.Errorf("reset the example's tables: %w", err)
	}
	return nil
}

// serviceDSN is the DSN a service is given: PostgreSQL itself, or the
// address of a pgwire listener in front of it.
func (e *env) serviceDSN(addr, app string) string {
	u := *e.dsn
	if addr != "" {
		u.Host = addr
	}
	q := u.Query()
	q.Set("search_path", schema)
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	return u.String()
}

// sidecar is a governor-proxy the driver started, and its listeners.
type sidecar struct {
	*process
	http, pgwire string
}

// startGovernord runs governord on governor.yaml.
func (e *env) startGovernord(ctx context.Context) (*process, string, error) {
	p, err := start("governord", e.bins["governord"], cleanEnv(
		"GOVERNORD_LISTEN=127.0.0.1:0", "GOVERNORD_METRICS=127.0.0.1:0",
		"CHECKOUT_KEY="+e.keys["checkout"], "BATCH_KEY="+e.keys["batch"],
	), "-config", filepath.Join(e.root, "examples", "checkout", "governor.yaml"))
	if err != nil {
		return nil, "", err
	}
	line, err := p.waitFor(ctx, "governord ready", startTimeout)
	if err != nil {
		p.stop()
		return nil, "", err
	}
	return p, fmt.Sprint(line["listen"]), nil
}

// startSidecar runs governor-proxy on proxy.yaml for one tenant, and waits
// until its session with governord is open.
func (e *env) startSidecar(ctx context.Context, tenant, governord string) (*sidecar, error) {
	p, err := start("governor-proxy ("+tenant+")", e.bins["governor-proxy"], cleanEnv(
		"GOVERNOR_ADDR="+governord, "GOVERNOR_API_KEY="+e.keys[tenant], "POD_NAME="+tenant+"-1",
		"PROXY_LISTEN=127.0.0.1:0", "PROXY_METRICS=127.0.0.1:0", "PGWIRE_LISTEN=127.0.0.1:0",
		"PG_UPSTREAM="+e.dsn.Host, "PSP_HOST="+hostOf(e.pspAddr),
	), "-config", filepath.Join(e.root, "examples", "checkout", "proxy.yaml"))
	if err != nil {
		return nil, err
	}
	line, err := p.waitFor(ctx, "governor-proxy listening", startTimeout)
	if err == nil {
		_, err = p.waitFor(ctx, "governor-proxy: session open", startTimeout)
	}
	if err != nil {
		p.stop()
		return nil, err
	}
	s := &sidecar{process: p, http: fmt.Sprint(line["http"])}
	if pg, ok := line["pgwire"].([]any); ok && len(pg) == 1 {
		s.pgwire = fmt.Sprint(pg[0])
	}
	if s.pgwire == "" {
		p.stop()
		return nil, fmt.Errorf("%s reported no pgwire listener: %v", p.name, line["pgwire"])
	}
	return s, nil
}

// serviceEnv is a service's whole environment: where its database and the
// gateway are and, under Governor, its sidecar as its proxy.
func (e *env) serviceEnv(app string, side *sidecar, extra ...string) []string {
	pgAddr := ""
	var proxy []string
	if side != nil {
		pgAddr = side.pgwire
		proxy = []string{"HTTP_PROXY=http://" + side.http, "HTTPS_PROXY=http://" + side.http}
	}
	vars := append([]string{"DATABASE_URL=" + e.serviceDSN(pgAddr, app), "PSP_URL=http://" + e.pspAddr}, proxy...)
	return cleanEnv(append(vars, extra...)...)
}

// pspStats reads the gateway's counts since the last reset.
func (e *env) pspStats(ctx context.Context) (gatewayStats, error) {
	var s gatewayStats
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+e.pspAddr+"/stats", nil)
	resp, err := e.client.Do(req)
	if err != nil {
		return s, fmt.Errorf("the gateway's stats: %w", err)
	}
	defer resp.Body.Close()
	return s, json.NewDecoder(resp.Body).Decode(&s)
}

func (e *env) resetPSP(ctx context.Context) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+e.pspAddr+"/stats/reset", nil)
	resp, err := e.client.Do(req)
	if err != nil {
		return fmt.Errorf("reset the gateway's stats: %w", err)
	}
	resp.Body.Close()
	return nil
}

// gatewayStats is what the gateway saw in a phase.
type gatewayStats struct {
	Peak     int   `json:"peak"`
	Served   int64 `json:"served"`
	Rejected int64 `json:"rejected"`
}

// cleanEnv is this process's environment without the variables the
// programs read, plus vars: a child inherits no proxy or database by
// accident.
func cleanEnv(vars ...string) []string {
	drop := map[string]bool{"HTTP_PROXY": true, "HTTPS_PROXY": true, "NO_PROXY": true, "ALL_PROXY": true,
		"DATABASE_URL": true, "PSP_URL": true, "LISTEN": true, "WORKERS": true}
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if !drop[strings.ToUpper(k)] {
			env = append(env, kv)
		}
	}
	return append(env, vars...)
}

// pspLimit reads the root's psp limit from governor.yaml: the gateway is
// given that capacity, so that the two cannot drift apart.
func pspLimit(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	var cfg struct {
		Root struct {
			Limits map[string]int `yaml:"limits"`
		} `yaml:"root"`
	}
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	n := cfg.Root.Limits["psp"]
	if n < 1 {
		return 0, fmt.Errorf("%s: root.limits.psp must be at least 1", path)
	}
	return n, nil
}

func hostOf(addr string) string {
	h, _, _ := net.SplitHostPort(addr)
	return h
}

func randomKey() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}
