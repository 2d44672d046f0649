package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
)

// A scenario is one of govbench's numbered scenarios. It runs against
// governords it starts through its env and returns what it measured.
type scenario struct {
	name  string
	title string
	run   func(ctx context.Context, env *env) (*result, error)
}

// scenarios in the order they run; the numbers are the issue's.
var all = []scenario{
	{"fanout", "1. Fan-out, without and with Governor", runFanout},
	{"deadworker", "2. Dead worker", runDeadWorker},
	{"adaptive", "3. Adaptive limit after a capacity drop", runAdaptive},
	{"retries", "4. Retries with the downstream down", runRetries},
	{"durable", "5. Durable throughput", runDurable},
	{"crash", "6. kill -9 under load", runCrash},
	{"fanout-sidecar", "7. Fan-out through governor-proxy", runSidecarFanout},
}

// A result is a scenario's table and its raw figures.
type result struct {
	Scenario string     `json:"scenario"`
	Header   []string   `json:"header"`
	Rows     [][]string `json:"rows"`
	Notes    []string   `json:"notes,omitempty"`
	Raw      any        `json:"raw"`
}

// env is what a scenario runs with: where governord is, which store it
// uses, how long to run.
type env struct {
	governord string // the binary
	proxy     string // governor-proxy's binary, built when a scenario first needs it
	dir       string // scratch space, removed at the end
	store     string // memory, sqlite or postgres
	pgDSN     string // the PostgreSQL to create databases in, for postgres
	short     bool   // the CI mode: smaller, checks properties
	runs      int    // repeats of the timed scenarios
	seed      int64
	log       io.Writer // progress
	starts    int       // governords started, for names
	databases []string  // created in pgDSN's server, dropped at the end
}

// benchMain runs the numbered scenarios: govbench [-out DIR] [-only NAMES]...
func benchMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("govbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "", "a folder to write each scenario's raw results to, as NAME.json (empty: none)")
	only := fs.String("only", "", "comma-separated scenarios to run (default all): "+names())
	short := fs.Bool("short", false, "small runs that check the properties quickly (what CI runs)")
	store := fs.String("store", "memory", "governord's store: memory, sqlite or postgres")
	pgDSN := fs.String("pg-dsn", os.Getenv("GOVERNOR_TEST_PG_DSN"), "PostgreSQL to create throwaway databases in, for -store postgres")
	runs := fs.Int("runs", 5, "repeats of the timed scenarios (median and range are reported)")
	seed := fs.Int64("seed", 1, "the simulations' seed")
	if fs.Parse(args) != nil {
		return 2
	}
	picked, err := pick(*only)
	if err == nil && fs.NArg() > 0 {
		err = fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if err == nil {
		err = checkStore(*store, *pgDSN)
	}
	if err == nil && *runs < 1 {
		err = fmt.Errorf("-runs %d: want at least 1", *runs)
	}
	if err != nil {
		fmt.Fprintln(stderr, "govbench:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	e := &env{store: *store, pgDSN: *pgDSN, short: *short, runs: *runs, seed: *seed, log: stderr}
	results, err := runScenarios(ctx, e, picked)
	for _, r := range results {
		printResult(stdout, r)
		if *out != "" {
			if werr := writeResult(*out, r); werr != nil && err == nil {
				err = werr
			}
		}
	}
	if err != nil {
		fmt.Fprintln(stderr, "govbench:", err)
		return 1
	}
	return 0
}

func names() string {
	var n []string
	for _, s := range all {
		n = append(n, s.name)
	}
	return strings.Join(n, ", ")
}

// pick returns the scenarios only names, in their usual order.
func pick(only string) ([]scenario, error) {
	if only == "" {
		return all, nil
	}
	want := map[string]bool{}
	for _, n := range strings.Split(only, ",") {
		n = strings.TrimSpace(n)
		if !slices.ContainsFunc(all, func(s scenario) bool { return s.name == n }) {
			return nil, fmt.Errorf("-only: no scenario %q (there are %s)", n, names())
		}
		want[n] = true
	}
	var picked []scenario
	for _, s := range all {
		if want[s.name] {
			picked = append(picked, s)
		}
	}
	return picked, nil
}

func checkStore(store, pgDSN string) error {
	switch store {
	case "memory", "sqlite":
		return nil
	case "postgres":
		if pgDSN == "" {
			return errors.New("-store postgres needs -pg-dsn or GOVERNOR_TEST_PG_DSN")
		}
		return nil
	}
	return fmt.Errorf("-store %q: want memory, sqlite or postgres", store)
}

// runScenarios builds governord and runs each scenario; it returns the
// results of those that finished, and the first error.
func runScenarios(ctx context.Context, e *env, picked []scenario) ([]*result, error) {
	dir, err := os.MkdirTemp("", "govbench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	defer e.dropDatabases()
	e.dir = dir
	if e.governord, err = buildGovernord(dir); err != nil {
		return nil, err
	}
	var results []*result
	for _, s := range picked {
		fmt.Fprintf(e.log, "govbench: %s\n", s.title)
		began := time.Now()
		r, err := s.run(ctx, e)
		if err != nil {
			return results, fmt.Errorf("%s: %w", s.name, err)
		}
		r.Scenario = s.title
		results = append(results, r)
		fmt.Fprintf(e.log, "govbench: %s took %v\n", s.name, time.Since(began).Round(time.Millisecond))
	}
	return results, nil
}

// buildGovernord builds governord from this module into dir.
func buildGovernord(dir string) (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "governord")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/governord")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/governord: %v\n%s", err, out)
	}
	return bin, nil
}

// governord is a governord a scenario started, and how to reach it.
type governord struct {
	*daemon
	cfg  string // its config, so that it can be started again on the same store
	name string
}

// startGovernord starts a governord on a fresh store of the env's kind
// with yaml (the rest of its config: keys, caps, tenants).
func (e *env) startGovernord(ctx context.Context, yaml string) (*governord, error) {
	return e.startGovernordOn(ctx, e.store, yaml)
}

// startGovernordOn is startGovernord on a fresh store of the kind named
// (memory, sqlite or postgres), whatever the env's.
func (e *env) startGovernordOn(ctx context.Context, kind, yaml string) (*governord, error) {
	e.starts++
	name := fmt.Sprintf("governord-%d", e.starts)
	var store string
	switch kind {
	case "memory":
		store = "store: {driver: memory}\n"
	case "sqlite":
		store = fmt.Sprintf("store: {driver: sqlite, dsn: %q}\n", filepath.Join(e.dir, name+".db"))
	case "postgres":
		dsn, err := e.freshDatabase(ctx, name)
		if err != nil {
			return nil, err
		}
		store = fmt.Sprintf("store: {driver: postgres, dsn: %q}\n", dsn)
	}
	g := &governord{cfg: store + yaml, name: name}
	return g, g.start(e)
}

// start (re)starts g on its config and store.
func (g *governord) start(e *env) error {
	d, err := startGovernord(e.governord, e.dir, g.name, g.cfg)
	if err != nil {
		return err
	}
	g.daemon = d
	return nil
}

// freshDatabase creates a database of its own for one governord, so that
// no run replays another's log, and returns its DSN. dropDatabases drops
// them at the end.
func (e *env) freshDatabase(ctx context.Context, name string) (string, error) {
	u, err := url.Parse(e.pgDSN)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("-pg-dsn must be a postgres:// URL")
	}
	db := fmt.Sprintf("govbench_%d_%s", time.Now().UnixNano(), strings.ReplaceAll(name, "-", "_"))
	if err := pgExec(ctx, e.pgDSN, "CREATE DATABASE "+db); err != nil {
		return "", err
	}
	e.databases = append(e.databases, db)
	u.Path = "/" + db
	return u.String(), nil
}

func (e *env) dropDatabases() {
	for _, db := range e.databases {
		if err := pgExec(context.Background(), e.pgDSN, "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)"); err != nil {
			fmt.Fprintln(e.log, "govbench:", err)
		}
	}
}

func pgExec(ctx context.Context, dsn, sql string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("connect to -pg-dsn: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("%s: %w", sql, err)
	}
	return nil
}

// metric reads one sample of governord's /metrics: name with labels as
// Prometheus prints them (e.g. `governor_queue_depth{class="db"}`). An
// absent series reads 0.
func (g *governord) metric(series string) (float64, error) {
	resp, err := http.Get("http://" + g.metrics + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, nil
}

func printResult(w io.Writer, r *result) {
	fmt.Fprintf(w, "\n## %s\n\n", r.Scenario)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(r.Header, "\t"))
	for _, row := range r.Rows {
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	tw.Flush()
	for _, n := range r.Notes {
		fmt.Fprintln(w, n)
	}
}

func writeResult(dir string, r *result) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	name := r.Scenario
	for _, s := range all {
		if s.title == r.Scenario {
			name = s.name
		}
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, name+".json"), append(b, '\n'), 0o644)
}

// spread is the median and range of repeated timings.
func spread(ds []time.Duration) (median, lo, hi time.Duration) {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2], s[0], s[len(s)-1]
}

func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 0, 64)
}
