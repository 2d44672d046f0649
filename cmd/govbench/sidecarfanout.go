package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Scenario 7: scenario 1's workload again, in real time, but the workers
// are plain net/http clients that know nothing of Governor: their one
// setting is the proxy, which is what HTTP_PROXY gives a Go program. The
// busy tenant fans each job out into subtasks that call the downstream
// inside two nested retry loops of three attempts; the quiet tenant makes
// one call per job. Without Governor they call the downstream directly;
// with it each tenant's calls go through a governor-proxy of its own,
// whose rule puts them in a pool as large as the downstream's capacity,
// shared by the fair queue. Nothing limits retries on this side: the
// sidecar cannot tell a retry from a first attempt, and the clients retry
// whatever they are refused, as naive clients do.

// realDownstream is scenario 1's downstream as an HTTP server: it serves
// Capacity calls at once, each slower the fuller it is, refuses the rest
// with 429 and fails some with 500.
type realDownstream struct {
	p        fanoutParams
	mu       sync.Mutex
	rng      *rand.Rand
	began    time.Time
	side     *fanoutSide
	inflight int
}

func (d *realDownstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	tenant := r.URL.Query().Get("tenant")
	d.mu.Lock()
	now := time.Since(d.began)
	d.side.Calls[tenant]++
	d.side.calledAt = append(d.side.calledAt, servedCall{now, tenant})
	d.inflight++
	d.side.Peak = max(d.side.Peak, d.inflight)
	d.trace(now)
	status, took := http.StatusOK, time.Duration(0)
	switch {
	case d.inflight > d.p.Capacity:
		status, took = http.StatusTooManyRequests, 2*time.Millisecond
		d.side.Overloaded[tenant]++
	case d.rng.Float64() < d.p.FailRate:
		status, took = http.StatusInternalServerError, d.p.Service/2
		d.side.Errors[tenant]++
	default:
		load := time.Duration(d.inflight-1) * d.p.Service / time.Duration(d.p.Capacity)
		took = d.p.Service + load + time.Duration(d.rng.Int64N(int64(d.p.Service/2)))
		d.side.Served[tenant]++
		d.side.servedAt = append(d.side.servedAt, servedCall{now + took, tenant})
	}
	d.mu.Unlock()
	time.Sleep(took)
	d.mu.Lock()
	d.inflight--
	d.trace(time.Since(d.began))
	d.mu.Unlock()
	w.WriteHeader(status)
}

func (d *realDownstream) trace(at time.Duration) {
	d.side.Concurrency = append(d.side.Concurrency, [2]float64{float64(at) / 1e6, float64(d.inflight)})
}

// plainClient is one tenant's worker: net/http and nothing else.
type plainClient struct {
	http   *http.Client
	target string // the downstream's URL, with the tenant in its query
	mu     sync.Mutex
	denied int // answers the sidecar gave (Governor-Denied), not the downstream
}

// call is one attempt; any answer but 200 is an error to retry.
func (c *plainClient) call(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.target, nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.Header.Get("Governor-Denied") != "" {
		c.mu.Lock()
		c.denied++
		c.mu.Unlock()
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// retries runs call in loops nested depth deep, three attempts each, with
// scenario 1's backoff.
func (c *plainClient) retries(ctx context.Context, depth int) error {
	var err error
	for i := range 3 {
		if i > 0 {
			time.Sleep(time.Duration(5<<i) * time.Millisecond)
		}
		if depth == 1 {
			err = c.call(ctx)
		} else {
			err = c.retries(ctx, depth-1)
		}
		if err == nil || ctx.Err() != nil {
			return err
		}
	}
	return err
}

// sidecarFanoutSide runs one side of scenario 7: through sidecars when
// proxies holds one proxy URL per tenant, directly when it is nil.
func sidecarFanoutSide(ctx context.Context, p fanoutParams, seed int64, proxies map[string]*url.URL) (*fanoutSide, map[string]int, error) {
	side := newFanoutSide(proxies != nil)
	d := &realDownstream{p: p, rng: rand.New(rand.NewPCG(uint64(seed), 7)), side: side}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	srv := &http.Server{Handler: d}
	go srv.Serve(ln)
	defer srv.Close()

	clients := map[string]*plainClient{}
	for _, tenant := range []string{"busy", "quiet"} {
		tr := &http.Transport{MaxIdleConnsPerHost: 256}
		if proxies != nil {
			tr.Proxy = http.ProxyURL(proxies[tenant])
		}
		defer tr.CloseIdleConnections()
		clients[tenant] = &plainClient{http: &http.Client{Transport: tr},
			target: fmt.Sprintf("http://%s/pay?tenant=%s", ln.Addr(), tenant)}
	}
	var mu sync.Mutex
	done := func(tenant string, began time.Time, failed bool) {
		mu.Lock()
		defer mu.Unlock()
		side.latencies[tenant] = append(side.latencies[tenant], time.Since(began))
		if failed {
			side.JobsFailed[tenant]++
		}
	}
	d.began = time.Now()
	var jobs sync.WaitGroup
	var schedules sync.WaitGroup
	schedule := func(n int, every time.Duration, job func()) {
		schedules.Add(1)
		go func() {
			defer schedules.Done()
			next := time.Now()
			for range n {
				jobs.Add(1)
				go func() { defer jobs.Done(); job() }()
				next = next.Add(every)
				time.Sleep(time.Until(next))
			}
		}()
	}
	schedule(p.BusyJobs, p.BusyEvery, func() {
		began := time.Now()
		var sub sync.WaitGroup
		var failed sync.Once
		bad := false
		for range p.Fanout {
			sub.Add(1)
			go func() {
				defer sub.Done()
				if clients["busy"].retries(ctx, 2) != nil {
					failed.Do(func() { bad = true })
				}
			}()
		}
		sub.Wait()
		done("busy", began, bad)
	})
	schedule(p.QuietJobs, p.QuietEvery, func() {
		began := time.Now()
		done("quiet", began, clients["quiet"].retries(ctx, 1) != nil)
	})
	schedules.Wait()
	jobs.Wait()
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	side.summarize()
	denied := map[string]int{"busy": clients["busy"].denied, "quiet": clients["quiet"].denied}
	return side, denied, nil
}

// buildProxy builds governor-proxy into the env's folder, once.
func (e *env) buildProxy() (string, error) {
	if e.proxy != "" {
		return e.proxy, nil
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(e.dir, "governor-proxy")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/governor-proxy")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/governor-proxy: %v\n%s", err, out)
	}
	e.proxy = bin
	return bin, nil
}

const sidecarFanoutRules = `rules:
  - {name: downstream, match: {host: 127.0.0.1}, class: down}
`

// sidecarFanoutGoverned starts governord and one sidecar per tenant and
// runs the governed side through them.
func sidecarFanoutGoverned(ctx context.Context, e *env, p fanoutParams) (*fanoutSide, map[string]int, error) {
	proxyBin, err := e.buildProxy()
	if err != nil {
		return nil, nil, err
	}
	gov, err := e.startGovernord(ctx, fmt.Sprintf(fanoutConfig, downClass, p.Capacity))
	if err != nil {
		return nil, nil, err
	}
	defer gov.stop()
	proxies := map[string]*url.URL{}
	for tenant, key := range map[string]string{"busy": "bench-busy-key", "quiet": "bench-quiet-key"} {
		e.starts++
		name := fmt.Sprintf("sidecar-%s-%d", tenant, e.starts)
		s, err := startSidecar(proxyBin, e.dir, name,
			fmt.Sprintf("governor: {addr: %q, api_key: %s}\ntask: {name: %s}\n", gov.addr, key, name)+sidecarFanoutRules)
		if err != nil {
			return nil, nil, err
		}
		defer s.stop()
		proxies[tenant] = &url.URL{Scheme: "http", Host: s.addr}
	}
	return sidecarFanoutSide(ctx, p, e.seed, proxies)
}

func runSidecarFanout(ctx context.Context, e *env) (*result, error) {
	p := fanoutWorkload(e.short)
	without, deniedWithout, err := sidecarFanoutSide(ctx, p, e.seed, nil)
	if err != nil {
		return nil, fmt.Errorf("without: %w", err)
	}
	with, denied, err := sidecarFanoutGoverned(ctx, e, p)
	if err != nil {
		return nil, fmt.Errorf("with governor-proxy: %w", err)
	}
	if deniedWithout["busy"]+deniedWithout["quiet"] > 0 {
		return nil, errors.New("a Governor denial without Governor")
	}
	r := &result{Header: []string{"", "peak / capacity", "calls", "overloaded (429)", "errors (500)", "denied by the sidecar", "jobs failed",
		"busy p50 / p99 ms", "quiet p50 / p99 ms", "quiet share of calls / served"},
		Raw: map[string]any{"params": p, "seed": e.seed, "without": without, "with": with, "denied": denied}}
	for _, side := range []*fanoutSide{without, with} {
		name, n := "without", 0
		if side.Governor {
			name, n = "through governor-proxy", denied["busy"]+denied["quiet"]
		}
		r.Rows = append(r.Rows, []string{name,
			fmt.Sprintf("%d / %d", side.Peak, p.Capacity),
			strconv.Itoa(side.Calls["busy"] + side.Calls["quiet"]),
			strconv.Itoa(side.Overloaded["busy"] + side.Overloaded["quiet"]),
			strconv.Itoa(side.Errors["busy"] + side.Errors["quiet"]),
			strconv.Itoa(n),
			fmt.Sprintf("%d busy, %d quiet", side.JobsFailed["busy"], side.JobsFailed["quiet"]),
			fmt.Sprintf("%.0f / %.0f", side.P50ms["busy"], side.P99ms["busy"]),
			fmt.Sprintf("%.0f / %.0f", side.P50ms["quiet"], side.P99ms["quiet"]),
			fmt.Sprintf("%.0f%% / %.0f%%", 100*side.QuietCalls, 100*side.QuietShare)})
	}
	raw := r.Raw.(map[string]any)
	if os.Getenv("GOVERNOR_TEST_PG_PORT") == "" || e.short {
		r.Notes = append(r.Notes, "pgbench part: not run (it needs the PostgreSQL of scripts/testpg.sh, and runs only in the full mode).")
	} else {
		seconds, busyClients, pool := 10, 16, 4
		pg, err := sidecarFanoutPG(ctx, e, seconds, busyClients, pool)
		if err != nil {
			return nil, fmt.Errorf("pgbench: %w", err)
		}
		raw["pgbench"] = pg
		r.Notes = append(r.Notes, "", "pgbench, both tenants at once for "+strconv.Itoa(seconds)+" s:", "")
		r.Notes = append(r.Notes, "| | busy TPS | quiet TPS | quiet latency average | failed |", "|---|---|---|---|---|")
		for _, s := range pg {
			name := "direct"
			if s.Governor {
				name = "through governor-proxy"
			}
			r.Notes = append(r.Notes, fmt.Sprintf("| %s | %.0f | %.0f | %.2f ms | %d |", name, s.BusyTPS, s.QuietTPS, s.QuietLatMs, s.Failed))
		}
		r.Notes = append(r.Notes, "", fmt.Sprintf("The busy tenant runs %d pgbench clients of a CPU-bound query (%s), the quiet one pgbench -S with 2; through governor-proxy every transaction holds a lease of a pool of %d at governord, shared by weight 1:1.",
			busyClients, strings.TrimSpace(busySQL), pool))
	}
	r.Notes = append([]string{fmt.Sprintf("Real time (the counts vary from run to run). Plain net/http clients whose one setting is the proxy; %d busy jobs of %d subtasks (2 nested retry loops of 3 attempts, on any refusal) every %v, %d quiet jobs of one call every %v; downstream capacity %d; a pool of %d at governord shared by weight 1:1, each tenant behind its own governor-proxy.",
		p.BusyJobs, p.Fanout, p.BusyEvery, p.QuietJobs, p.QuietEvery, p.Capacity, p.Capacity)}, r.Notes...)
	return r, nil
}

// pgSide is one side of scenario 7's pgbench part.
type pgSide struct {
	Governor   bool    `json:"governor"`
	BusyTPS    float64 `json:"busy_tps"`
	QuietTPS   float64 `json:"quiet_tps"`
	QuietLatMs float64 `json:"quiet_latency_ms"` // pgbench's latency average
	Failed     int64   `json:"failed"`
}

var reLatency = regexp.MustCompile(`(?m)^latency average = ([0-9.]+) ms`)

// busySQL is the busy tenant's transaction: a query that keeps a core busy
// for a few milliseconds, where the quiet one's is pgbench -S's lookup.
const busySQL = "SELECT count(*) FROM generate_series(1, 100000);\n"

// sidecarFanoutPG runs pgbench for both tenants at once: the busy one with
// many clients, the quiet one with two, directly and then each through its
// own sidecar's pgwire listener, whose rule puts every transaction in a
// pool of pool connections at governord.
func sidecarFanoutPG(ctx context.Context, e *env, seconds, busyClients, pool int) ([]*pgSide, error) {
	port := os.Getenv("GOVERNOR_TEST_PG_PORT")
	load, err := preparePgbench(ctx, e, port, seconds, busyClients)
	if err != nil {
		return nil, err
	}
	without, err := load.bothTenants(ctx, false, port, port)
	if err != nil {
		return nil, fmt.Errorf("without: %w", err)
	}
	with, err := pgbenchThroughSidecars(ctx, e, load, port, pool)
	if err != nil {
		return nil, err
	}
	return []*pgSide{without, with}, nil
}

// pgbenchLoad is what the pgbench part runs: on which database, the busy
// tenant's script, for how long and with how many busy clients.
type pgbenchLoad struct {
	dbname      string
	script      string // busySQL, as a file for pgbench -f
	seconds     int
	busyClients int
}

// preparePgbench creates the part's database in the PostgreSQL on port and
// fills it with pgbench -i.
func preparePgbench(ctx context.Context, e *env, port string, seconds, busyClients int) (*pgbenchLoad, error) {
	db, err := e.freshDatabase(ctx, "fanout")
	if err != nil {
		return nil, err
	}
	u, _ := url.Parse(db)
	load := &pgbenchLoad{dbname: strings.TrimPrefix(u.Path, "/"), script: filepath.Join(e.dir, "busy.sql"),
		seconds: seconds, busyClients: busyClients}
	if err := os.WriteFile(load.script, []byte(busySQL), 0o644); err != nil {
		return nil, err
	}
	if _, err := load.pgbench(ctx, port, "-i", "-q", "-s", "1"); err != nil {
		return nil, err
	}
	return load, nil
}

// pgbench runs pgbench with args against the database through port and
// returns its output.
func (l *pgbenchLoad) pgbench(ctx context.Context, port string, args ...string) (string, error) {
	bin := "pgbench"
	if d := os.Getenv("GOVERNOR_TEST_PG_BIN"); d != "" {
		bin = filepath.Join(d, "pgbench")
	}
	cmd := exec.CommandContext(ctx, bin, append([]string{"-h", "127.0.0.1", "-p", port, "-U", "governor"}, append(args, l.dbname)...)...)
	cmd.Env = append(os.Environ(), "PGPASSWORD=governor")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("pgbench %v: %v: %s", args, err, lastLines(string(out), 3))
	}
	return string(out), nil
}

// bothTenants runs the busy tenant's pgbench through busyPort and the quiet
// one's through quietPort at once, and reads their figures.
func (l *pgbenchLoad) bothTenants(ctx context.Context, governed bool, busyPort, quietPort string) (*pgSide, error) {
	var wg sync.WaitGroup
	var busyOut, quietOut string
	var busyErr, quietErr error
	T := strconv.Itoa(l.seconds)
	wg.Add(2)
	go func() {
		defer wg.Done()
		busyOut, busyErr = l.pgbench(ctx, busyPort, "-n", "-f", l.script, "-T", T, "-c", strconv.Itoa(l.busyClients), "-j", "2")
	}()
	go func() {
		defer wg.Done()
		quietOut, quietErr = l.pgbench(ctx, quietPort, "-n", "-S", "-T", T, "-c", "2", "-j", "1")
	}()
	wg.Wait()
	if err := errors.Join(busyErr, quietErr); err != nil {
		return nil, err
	}
	return parsePgbench(governed, busyOut, quietOut)
}

// parsePgbench reads both tenants' TPS, their failed transactions and the
// quiet one's latency from pgbench's outputs.
func parsePgbench(governed bool, busyOut, quietOut string) (*pgSide, error) {
	side := &pgSide{Governor: governed}
	for _, x := range []struct {
		out string
		tps *float64
	}{{busyOut, &side.BusyTPS}, {quietOut, &side.QuietTPS}} {
		m := reTPS.FindStringSubmatch(x.out)
		if m == nil {
			return nil, fmt.Errorf("no tps in pgbench's output: %s", lastLines(x.out, 3))
		}
		*x.tps, _ = strconv.ParseFloat(m[1], 64)
		if f := reFailed.FindStringSubmatch(x.out); f != nil {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			side.Failed += n
		}
	}
	if m := reLatency.FindStringSubmatch(quietOut); m != nil {
		side.QuietLatMs, _ = strconv.ParseFloat(m[1], 64)
	}
	return side, nil
}

// pgbenchThroughSidecars is the governed side: a governord with a pool of
// pool db connections, and each tenant's pgbench through the pgwire
// listener of a governor-proxy of its own, in front of the PostgreSQL on
// port.
func pgbenchThroughSidecars(ctx context.Context, e *env, load *pgbenchLoad, port string, pool int) (*pgSide, error) {
	proxyBin, err := e.buildProxy()
	if err != nil {
		return nil, err
	}
	gov, err := e.startGovernord(ctx, fmt.Sprintf(fanoutConfig, "db", pool))
	if err != nil {
		return nil, err
	}
	defer gov.stop()
	ports := map[string]string{}
	for tenant, key := range map[string]string{"busy": "bench-busy-key", "quiet": "bench-quiet-key"} {
		e.starts++
		name := fmt.Sprintf("sidecar-pg-%s-%d", tenant, e.starts)
		s, err := startSidecar(proxyBin, e.dir, name, fmt.Sprintf("governor: {addr: %q, api_key: %s}\ntask: {name: %s}\n", gov.addr, key, name)+
			fmt.Sprintf("pgwire:\n  - {listen: 127.0.0.1:0, upstream: 127.0.0.1:%s}\nrules:\n  - {name: sql, match: {sql: any}, class: db}\n", port))
		if err != nil {
			return nil, err
		}
		defer s.stop()
		ports[tenant] = portOf(s.pg)
	}
	with, err := load.bothTenants(ctx, true, ports["busy"], ports["quiet"])
	if err != nil {
		return nil, fmt.Errorf("through governor-proxy: %w", err)
	}
	return with, nil
}
