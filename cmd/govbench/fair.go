package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor"
)

// govbench fair: one tenant's flood against another tenant's latency, on
// governord's own API (issue 27; docs/governord-performance.md).
//
// Tenant A floods with -flood callers, each creating a task, consuming on
// it and closing it, over and over (an SDK client each). Tenant B runs one
// caller doing a consume and an acquire/release pair, over and over. Each
// store runs three phases of -T: B alone (its idle latency), A alone (its
// throughput alone), A and B together. Then, with -ttl-run, B opens a
// session of -ttl (2 s) and works through a flood of that long, while a
// second session of B's, of the same TTL, heartbeats every 100 ms and
// times each: no session of B may lapse, and the heartbeats' p99 must stay
// under 10% of the TTL.
//
// governord is started under taskset on -governord-cpu; run govbench
// itself under taskset on another core, so that the figures are of
// governord's fairness, not of two processes sharing a core:
//
//	taskset -c 1 govbench fair -governord-cpu 0 -store memory,sqlite,postgres
//
// -admission off gives governord admission places beyond any load (what it
// did before admission), for comparison.

const fairConfig = `admin_key: bench-admin-key
session_ttl: 10s
tenant_bounds: {max_sessions: 1000}
root: {limits: {db: 100000}}
%s
tenants:
  - {name: a, api_key: bench-a-key, weight: 1}
  - {name: b, api_key: bench-b-key, weight: 1}
`

// fairRun is one store's figures.
type fairRun struct {
	Store     string `json:"store"`
	Admission string `json:"admission"`

	BIdle    latencies `json:"b_idle"`
	BFlood   latencies `json:"b_flood"`
	BRatio   float64   `json:"b_p99_ratio"` // B's p99 under the flood / idle
	AAlone   float64   `json:"a_alone_calls_s"`
	AWithB   float64   `json:"a_with_b_calls_s"`
	ARatio   float64   `json:"a_ratio"`       // A's throughput with B / alone
	ARefused float64   `json:"a_refused"`     // A's calls refused by admission in the phase with B
	TTL      *ttlRun   `json:"ttl,omitempty"` // the TTL run
}

type ttlRun struct {
	TTL        string    `json:"ttl"`
	For        string    `json:"for"`
	Lapsed     int       `json:"lapsed"` // sessions of B that lapsed
	Heartbeats latencies `json:"heartbeats"`
	BCalls     latencies `json:"b_calls"`
	ACallsS    float64   `json:"a_calls_s"`
}

// latencies summarise one set of calls.
type latencies struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
}

func summarise(d []time.Duration) latencies {
	if len(d) == 0 {
		return latencies{}
	}
	slices.Sort(d)
	at := func(q float64) float64 { return msf(d[min(len(d)-1, int(q*float64(len(d))))]) }
	return latencies{N: len(d), P50: at(0.5), P99: at(0.99), Max: msf(d[len(d)-1])}
}

func fairMain(args []string, stdout, stderr io.Writer) int {
	fs := flagSet("fair", stderr)
	stores := fs.String("store", "memory,sqlite", "the stores to run, comma-separated: memory, sqlite, postgres")
	phase := fs.Duration("T", 15*time.Second, "how long each phase runs")
	flood := fs.Int("flood", 64, "tenant A's callers")
	ttlFor := fs.Duration("ttl-run", 60*time.Second, "how long the flood of the TTL run lasts (0: no TTL run)")
	ttl := fs.Duration("ttl", 2*time.Second, "B's session TTL in the TTL run")
	cpu := fs.String("governord-cpu", "", "the CPU list governord is pinned to with taskset (empty: not pinned)")
	goenv := fs.String("governord-env", "", "Go runtime settings for governord alone, e.g. \"GOGC=400 GOMAXPROCS=2\" (GOGC, GOMAXPROCS, GOMEMLIMIT, GODEBUG)")
	admission := fs.String("admission", "on", "on: governord's default admission; off: places beyond any load")
	tenantCap := fs.Int("tenant-max-in-flight", 0, "admission.tenant_max_in_flight (0: governord's default)")
	pgDSN := fs.String("pg-dsn", os.Getenv("GOVERNOR_TEST_PG_DSN"), "PostgreSQL to create governord's databases in")
	out := fs.String("out", "", "write the results as JSON into this directory")
	var prof fairProfile
	fs.StringVar(&prof.dir, "profile", "", "with debug.pprof on, write an execution trace, a CPU and a heap profile of governord in the TTL run into this directory")
	fs.DurationVar(&prof.For, "profile-for", 10*time.Second, "how long the trace and the CPU profile of -profile run")
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 {
		return 2
	}
	if *flood < 1 || *flood > 10_000 || *phase <= 0 || *ttlFor < 0 || *ttl < 100*time.Millisecond {
		fmt.Fprintln(stderr, "govbench fair: -flood must be in [1, 10000], -T positive, -ttl-run not negative, -ttl at least 100ms")
		return 2
	}
	if *admission != "on" && *admission != "off" {
		fmt.Fprintln(stderr, "govbench fair: -admission is on or off")
		return 2
	}
	list := strings.Split(*stores, ",")
	for _, s := range list {
		if err := checkStore(s, *pgDSN); err != nil {
			fmt.Fprintln(stderr, "govbench fair:", err)
			return 2
		}
	}

	dir, err := os.MkdirTemp("", "govbench-fair-")
	if err != nil {
		fmt.Fprintln(stderr, "govbench fair:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	bin, err := buildFairGovernord(dir, *cpu, *goenv)
	if err != nil {
		fmt.Fprintln(stderr, "govbench fair:", err)
		return 1
	}
	e := &env{dir: dir, governord: bin, pgDSN: *pgDSN, log: stderr}
	defer e.dropDatabases()
	places := admissionPlaces(*admission, *tenantCap)
	fmt.Fprintf(stdout, "govbench fair: A %d callers (create, consume, close a task), B 1 caller (consume, acquire, release); %v a phase; admission %s %s; governord on CPU %q\n\n",
		*flood, *phase, *admission, places, *cpu)

	var runs []fairRun
	for _, store := range list {
		r, err := fairOnce(context.Background(), e, store, fmt.Sprintf(fairConfig, places)+prof.configLine(), *flood, *phase, *ttlFor, *ttl, prof, stdout)
		if err != nil {
			printFair(stdout, runs) // what ran before
			fmt.Fprintf(stderr, "govbench fair: %s: %v\n", store, err)
			return 1
		}
		r.Admission = *admission
		runs = append(runs, *r)
	}
	printFair(stdout, runs)
	if *out != "" {
		data, _ := json.MarshalIndent(runs, "", "  ")
		if err := os.WriteFile(filepath.Join(*out, "fair-"+*admission+".json"), data, 0o644); err != nil {
			fmt.Fprintln(stderr, "govbench fair:", err)
			return 1
		}
	}
	return 0
}

// buildFairGovernord builds governord into dir and returns what to start
// as governord: with cpu, a wrapper that pins it there with taskset; with
// goenv, one that gives it those Go runtime settings (not to the load).
func buildFairGovernord(dir, cpu, goenv string) (string, error) {
	for _, kv := range strings.Fields(goenv) {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || !slices.Contains([]string{"GOGC", "GOMAXPROCS", "GOMEMLIMIT", "GODEBUG"}, name) ||
			strings.ContainsAny(value, "'\"$`\\;&|<>") {
			return "", fmt.Errorf("-governord-env: %q is not GOGC, GOMAXPROCS, GOMEMLIMIT or GODEBUG=value", kv)
		}
	}
	bin, err := buildGovernord(dir)
	if err != nil || (cpu == "" && goenv == "") {
		return bin, err
	}
	// A wrapper the scenario starts as if it were governord.
	wrapper := filepath.Join(dir, "governord-pinned")
	run := bin
	if cpu != "" {
		run = fmt.Sprintf("taskset -c %s %s", cpu, bin)
	}
	if goenv != "" {
		run = "env " + goenv + " " + run
	}
	script := fmt.Sprintf("#!/bin/sh\nexec %s \"$@\"\n", run)
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		return "", err
	}
	if _, err := exec.LookPath("taskset"); cpu != "" && err != nil {
		return "", fmt.Errorf("-governord-cpu needs taskset: %w", err)
	}
	return wrapper, nil
}

// admissionPlaces is the admission block of governord's config for
// -admission and -tenant-max-in-flight; empty for governord's defaults.
func admissionPlaces(admission string, tenantCap int) string {
	places := ""
	if tenantCap > 0 {
		places = fmt.Sprintf("admission: {tenant_max_in_flight: %d}", tenantCap)
	}
	if admission == "off" {
		places = "admission: {max_in_flight: 100000, tenant_max_in_flight: 100000, tenant_max_queued: 1000000}"
	}
	return places
}

func printFair(w io.Writer, runs []fairRun) {
	fmt.Fprintln(w, "| store | admission | B idle p50 / p99 ms | B under flood p50 / p99 ms | B p99 / idle | A alone calls/s | A with B calls/s | A with B / alone | A refused |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range runs {
		fmt.Fprintf(w, "| %s | %s | %.2f / %.2f | %.2f / %.2f | %.2fx | %.0f | %.0f | %.2f | %.0f |\n", r.Store, r.Admission,
			r.BIdle.P50, r.BIdle.P99, r.BFlood.P50, r.BFlood.P99, r.BRatio, r.AAlone, r.AWithB, r.ARatio, r.ARefused)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| store | admission | TTL | flood | B sessions lapsed | heartbeats | heartbeat p50 / p99 / max ms | p99 / TTL | B calls p99 ms | A calls/s |")
	fmt.Fprintln(w, "|---|---|---|---|---:|---:|---:|---:|---:|---:|")
	for _, r := range runs {
		if t := r.TTL; t != nil {
			ttl, _ := time.ParseDuration(t.TTL)
			fmt.Fprintf(w, "| %s | %s | %s | %s | %d | %d | %.2f / %.2f / %.2f | %.1f%% | %.2f | %.0f |\n", r.Store, r.Admission, t.TTL, t.For,
				t.Lapsed, t.Heartbeats.N, t.Heartbeats.P50, t.Heartbeats.P99, t.Heartbeats.Max, 100*t.Heartbeats.P99/msf(ttl), t.BCalls.P99, t.ACallsS)
		}
	}
}

// fairOnce runs the phases on one store.
func fairOnce(ctx context.Context, e *env, store, yaml string, flood int, phase, ttlFor, ttl time.Duration, prof fairProfile, log io.Writer) (*fairRun, error) {
	g, err := e.startGovernordOn(ctx, store, yaml)
	if err != nil {
		return nil, err
	}
	defer g.stop()
	r := &fairRun{Store: store}

	fmt.Fprintf(log, "%s: B alone for %v\n", store, phase)
	idle, err := runQuiet(ctx, g.addr, phase, 0)
	if err != nil {
		return nil, fmt.Errorf("B alone: %w", err)
	}
	r.BIdle = idle.Calls

	a, err := newFlood(ctx, g.addr, flood)
	if err != nil {
		return nil, err
	}
	defer a.close()
	fmt.Fprintf(log, "%s: A alone for %v\n", store, phase)
	r.AAlone, err = a.run(ctx, phase, nil)
	if err != nil {
		return nil, fmt.Errorf("A alone: %w", err)
	}
	refusedBefore, _ := g.metric(`governor_admission_refused_total{tenant="a",why="busy"}`)
	fmt.Fprintf(log, "%s: A and B together for %v\n", store, phase)
	var flooded *quietResult
	var berr error
	r.AWithB, err = a.run(ctx, phase, func(ctx context.Context) {
		flooded, berr = runQuiet(ctx, g.addr, phase, 0)
	})
	if err != nil {
		return nil, fmt.Errorf("A with B: %w", err)
	}
	if berr != nil {
		return nil, fmt.Errorf("B under the flood: %w", berr)
	}
	refusedAfter, _ := g.metric(`governor_admission_refused_total{tenant="a",why="busy"}`)
	r.ARefused = refusedAfter - refusedBefore
	r.BFlood = flooded.Calls
	r.BRatio = r.BFlood.P99 / r.BIdle.P99
	r.ARatio = r.AWithB / r.AAlone

	if ttlFor > 0 {
		fmt.Fprintf(log, "%s: the TTL run, B's sessions of %v through %v of flood\n", store, ttl, ttlFor)
		if r.TTL, err = ttlOnce(ctx, g, a, ttl, ttlFor, store, prof); err != nil {
			return nil, fmt.Errorf("the TTL run: %w", err)
		}
	}
	return r, nil
}

// quiet is tenant B: one caller, a consume and an acquire/release pair
// each round, each call timed.
type quiet struct {
	c    *governor.Client
	task *governor.Task
}

func newQuiet(ctx context.Context, addr string, ttl time.Duration) (*quiet, error) {
	opts := []governor.Option{governor.WithAddr(addr), governor.WithAPIKey("bench-b-key")}
	if ttl > 0 {
		opts = append(opts, governor.WithTTL(ttl))
	}
	c, err := governor.Dial(ctx, opts...)
	if err != nil {
		return nil, err
	}
	_, task, err := c.NewTask(ctx, governor.Spec{Name: fmt.Sprintf("b-%d", time.Now().UnixNano())})
	if err != nil {
		c.Close()
		return nil, err
	}
	return &quiet{c: c, task: task}, nil
}

// run times B's calls for d, or until ctx ends.
func (q *quiet) run(ctx context.Context, d time.Duration) ([]time.Duration, error) {
	var took []time.Duration
	end := time.Now().Add(d)
	for time.Now().Before(end) && ctx.Err() == nil {
		began := time.Now()
		if err := q.task.Consume(ctx, "calls", 1); err != nil {
			return took, err
		}
		mid := time.Now()
		lease, err := q.task.Acquire(ctx, "db")
		if err != nil {
			return took, err
		}
		acquired := time.Now()
		if err := lease.Release(ctx, 0, false); err != nil {
			return took, err
		}
		took = append(took, mid.Sub(began), acquired.Sub(mid), time.Since(acquired))
	}
	return took, nil
}

// floodA is tenant A: its callers, an SDK client each.
type floodA struct {
	clients []*governor.Client
}

func newFlood(ctx context.Context, addr string, n int) (*floodA, error) {
	f := &floodA{}
	for range n {
		c, err := governor.Dial(ctx, governor.WithAddr(addr), governor.WithAPIKey("bench-a-key"))
		if err != nil {
			f.close()
			return nil, err
		}
		f.clients = append(f.clients, c)
	}
	return f, nil
}

func (f *floodA) close() {
	for _, c := range f.clients {
		c.Close()
	}
}

// run floods for d (or, with during, while during runs, which is given the
// flood's context) and returns A's calls a second.
func (f *floodA) run(ctx context.Context, d time.Duration, during func(ctx context.Context)) (float64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var calls atomic.Int64
	var wg sync.WaitGroup
	var first error
	var once sync.Once
	for i, c := range f.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ctx.Err() == nil; n++ {
				err := churnOnce(ctx, c, fmt.Sprintf("a-%d-%d-%d", i, n, time.Now().UnixNano()), &calls)
				if err != nil && ctx.Err() == nil {
					once.Do(func() { first = err; cancel() })
				}
			}
		}()
	}
	began := time.Now()
	if during != nil {
		during(ctx)
	} else {
		select {
		case <-time.After(d):
		case <-ctx.Done():
		}
	}
	took := time.Since(began)
	n := calls.Load()
	cancel()
	wg.Wait()
	return float64(n) / took.Seconds(), first
}

// churnOnce creates a task, consumes on it and closes it: three calls.
func churnOnce(ctx context.Context, c *governor.Client, name string, calls *atomic.Int64) error {
	_, task, err := c.NewTask(ctx, governor.Spec{Name: name})
	if err != nil {
		return err
	}
	calls.Add(1)
	if err := task.Consume(ctx, "calls", 1); err != nil {
		return err
	}
	calls.Add(1)
	if err := task.Close(); err != nil {
		return err
	}
	calls.Add(1)
	return nil
}

// ttlOnce floods for d while B works on a session of ttl, in a process of
// its own, and a second session of B's heartbeats every 100 ms.
func ttlOnce(ctx context.Context, g *governord, a *floodA, ttl, d time.Duration, store string, prof fairProfile) (*ttlRun, error) {
	run := &ttlRun{TTL: ttl.String(), For: d.String()}
	var q *quietResult
	var qerr, perr error
	var err error
	run.ACallsS, err = a.run(ctx, d, func(ctx context.Context) {
		profiled := make(chan struct{})
		go func() {
			defer close(profiled)
			perr = prof.take(ctx, g, store)
		}()
		q, qerr = runQuiet(ctx, g.addr, d, ttl)
		<-profiled
	})
	if err != nil {
		return nil, err
	}
	if qerr != nil {
		return nil, qerr
	}
	if perr != nil {
		return nil, perr
	}
	run.Lapsed, run.Heartbeats, run.BCalls = q.Lapsed, q.Heartbeats, q.Calls
	return run, nil
}

// quietResult is what a fair-quiet process reports.
type quietResult struct {
	Calls      latencies `json:"calls"`
	Heartbeats latencies `json:"heartbeats"`
	Lapsed     int       `json:"lapsed"`
	Err        string    `json:"err,omitempty"`
}

// runQuiet runs tenant B in a process of its own (fair-quiet), on the same
// CPUs as this one, so that B's calls wait for governord and not for A's
// callers' goroutines in one Go scheduler. ttl > 0 is the TTL run: B's
// sessions of that TTL, and heartbeats timed.
func runQuiet(ctx context.Context, addr string, d, ttl time.Duration) (*quietResult, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, self, "fair-quiet", "-addr", addr, "-T", d.String(), "-ttl", ttl.String())
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	dieWithUs(cmd)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	defer cmd.Wait()
	lines := bufio.NewReader(out)
	if line, err := lines.ReadString('\n'); err != nil || strings.TrimSpace(line) != "ready" {
		return nil, fmt.Errorf("fair-quiet: %q, %v", line, err)
	}
	if _, err := io.WriteString(in, "go\n"); err != nil {
		return nil, err
	}
	line, err := lines.ReadString('\n')
	if err != nil {
		return nil, fmt.Errorf("fair-quiet: %v", err)
	}
	var r quietResult
	if err := json.Unmarshal([]byte(line), &r); err != nil {
		return nil, fmt.Errorf("fair-quiet: %q: %v", line, err)
	}
	if r.Err != "" {
		return &r, errors.New(r.Err)
	}
	return &r, nil
}

// fairQuiet is the process runQuiet starts: tenant B.
func fairQuiet(args []string, stdout, stderr io.Writer) int {
	fs := flagSet("fair-quiet", stderr)
	addr := fs.String("addr", "", "governord")
	d := fs.Duration("T", time.Second, "how long")
	ttl := fs.Duration("ttl", 0, "B's session TTL; with it, heartbeats are timed")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx := context.Background()
	report := func(r quietResult) int {
		data, _ := json.Marshal(r)
		fmt.Fprintf(stdout, "%s\n", data)
		return 0
	}
	b, err := newQuiet(ctx, *addr, *ttl)
	if err != nil {
		return report(quietResult{Err: err.Error()})
	}
	defer b.c.Close()
	var beats *heartbeats
	if *ttl > 0 {
		if beats, err = openHeartbeats(ctx, *addr, *ttl); err != nil {
			return report(quietResult{Err: err.Error()})
		}
		defer beats.conn.Close()
	}
	fmt.Fprintln(stdout, "ready")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return report(quietResult{Err: err.Error()})
	}
	return report(measureQuiet(ctx, b, beats, *d))
}

// heartbeats is B's second session in the TTL run, of the same TTL, whose
// heartbeats are timed.
type heartbeats struct {
	conn *grpc.ClientConn
	api  governorpb.GovernorClient
	ctx  context.Context // carries the session's token
}

func openHeartbeats(ctx context.Context, addr string, ttl time.Duration) (*heartbeats, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(1<<20), grpc.WithInitialConnWindowSize(1<<20))
	if err != nil {
		return nil, err
	}
	api := governorpb.NewGovernorClient(conn)
	open, err := api.OpenSession(ctx, &governorpb.OpenSessionRequest{ApiKey: "bench-b-key", Ttl: durationpb.New(ttl)})
	if err != nil {
		conn.Close()
		return nil, err
	}
	hctx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+open.GetSessionToken())
	return &heartbeats{conn: conn, api: api, ctx: hctx}, nil
}

// run heartbeats every 100 ms until ctx ends and returns how long each
// took, and the error of one that failed before then: the session lapsed.
func (h *heartbeats) run(ctx context.Context) ([]time.Duration, error) {
	var beats []time.Duration
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return beats, nil
		case <-tick.C:
		}
		began := time.Now()
		if _, err := h.api.Heartbeat(h.ctx, &governorpb.HeartbeatRequest{}); err != nil {
			if ctx.Err() == nil {
				return beats, err
			}
			return beats, nil // cut short by the run's end, not lapsed
		}
		beats = append(beats, time.Since(began))
	}
}

// measureQuiet is B's measured phase: its calls for d, and with beats its
// heartbeats alongside. A session of B's that lapsed counts in Lapsed; only
// another error is the result's Err.
func measureQuiet(ctx context.Context, b *quiet, beats *heartbeats, d time.Duration) quietResult {
	var r quietResult
	var beatsTook []time.Duration
	var herr error
	var wg sync.WaitGroup
	rctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	if beats != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			beatsTook, herr = beats.run(rctx)
		}()
	}
	calls, err := b.run(rctx, d)
	wg.Wait()
	if b.c.Err() != nil {
		r.Lapsed++
	}
	if herr != nil {
		r.Lapsed++
	}
	if err != nil && rctx.Err() == nil && !errors.Is(err, governor.ErrSessionLost) {
		r.Err = err.Error()
	}
	r.Calls, r.Heartbeats = summarise(calls), summarise(beatsTook)
	return r
}

// msf is d in milliseconds.
func msf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
