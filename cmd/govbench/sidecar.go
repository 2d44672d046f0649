package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"
)

// The sidecar scenario: see the package comment.

const (
	heavyKey = "bench-heavy-key-0123456789"
	lightKey = "bench-light-key-0123456789"
)

// sample is one run against one target.
type sample struct {
	Kind    string  `json:"kind"` // pgbench, wrk, pgbench-contended, wrk-contended
	Target  string  `json:"target"`
	Clients int     `json:"clients"`
	Round   int     `json:"round"`
	Rate    float64 `json:"rate"`              // transactions or requests per second
	P50us   float64 `json:"p50_us,omitempty"`  // wrk's median latency
	CPUus   float64 `json:"cpu_us,omitempty"`  // the middle tier's CPU per transaction or request
	Share   float64 `json:"share,omitempty"`   // contended: this tenant's share of the total
	Failed  int64   `json:"failed,omitempty"`  // pgbench's failed transactions, wrk's non-2xx and errors
	Comment string  `json:"comment,omitempty"` // what else to know
}

type sidecarBench struct {
	stdout     io.Writer
	seconds    int
	dir        string
	governord  string
	proxy      string
	pgPort     string
	samples    []sample
	stops      []func()
	stopOnce   sync.Once
	originAddr string
	httpPeers  map[string]*peer // ungoverned HTTP targets by name (sidecarpeers.go)
	// The interception runs (intercept.go).
	withHTTPS       bool
	caCert, caKey   string
	httpsOrigin     string
	httpsOriginH2   string
	httpsGoproxy    string
	httpsGoproxyCPU func() time.Duration
	httpsGoproxyPID int
	httpsSidecar    *daemon
	httpTargets     map[string]*daemon // governed sidecars by name
	pgTargets       []pgTarget
	contendedHeavy  *daemon
	contendedLight  *daemon
	contendedOrigin string
}

type pgTarget struct {
	name string
	port string
	cpu  func() time.Duration // the middle tier's; nil for direct
	pid  int                  // the middle tier's, to profile; 0 for direct
}

func sidecarMain(args []string, stdout, stderr io.Writer) int {
	fs := flagSet("sidecar", stderr)
	seconds := fs.Int("T", 10, "seconds per run")
	rounds := fs.Int("rounds", 3, "rounds; each runs every target once, interleaved")
	pgClients := fs.String("clients", "8,32", "pgbench client counts")
	httpClients := fs.String("http-clients", "1,32", "wrk connection counts")
	stores := fs.String("stores", "memory,sqlite", "governord stores of the governed targets")
	out := fs.String("out", "", "a folder to write sidecar.json to (empty: none)")
	noPG := fs.Bool("no-pg", false, "skip the PostgreSQL runs")
	noHTTP := fs.Bool("no-http", false, "skip the HTTP runs")
	noHTTPS := fs.Bool("no-https", false, "skip the intercepted HTTPS runs")
	profileDir := fs.String("profile", "", "after the runs, write a CPU profile (perf) of each -profile-targets target into this folder")
	profileTargets := fs.String("profile-targets", "http:fasthttp,http:squid,http:gov-memory,pg:relay-gnet,pg:relay-gnet-p1,pg:pgbouncer,pg:gov-memory",
		"the targets -profile profiles: http:NAME under wrk with 1 connection, pg:NAME under pgbench -S with 8 clients")
	if fs.Parse(args) != nil {
		return 2
	}
	b := &sidecarBench{stdout: stdout, seconds: *seconds, httpTargets: map[string]*daemon{}, httpPeers: map[string]*peer{},
		withHTTPS: !*noHTTP && !*noHTTPS}
	defer b.stop()
	// An interrupt stops the run cleanly: the daemons and the temporary
	// folder go with it.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sig)
	go func() {
		if _, ok := <-sig; ok {
			b.stop()
			os.Exit(130)
		}
	}()
	err := b.run(*rounds, ints(*pgClients), ints(*httpClients), strings.Split(*stores, ","), !*noPG, !*noHTTP)
	if err == nil && *out != "" {
		err = b.write(*out)
	}
	if err == nil && *profileDir != "" {
		err = b.profileAll(*profileDir, strings.Split(*profileTargets, ","))
	}
	if err != nil {
		fmt.Fprintln(stderr, "govbench sidecar:", err)
		return 1
	}
	return 0
}

func ints(s string) []int {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(f)); err == nil && n > 0 {
			out = append(out, n)
		}
	}
	return out
}

func (b *sidecarBench) stop() {
	b.stopOnce.Do(func() {
		for i := len(b.stops) - 1; i >= 0; i-- {
			b.stops[i]()
		}
		if b.dir != "" {
			os.RemoveAll(b.dir)
		}
	})
}

func (b *sidecarBench) printf(format string, args ...any) { fmt.Fprintf(b.stdout, format, args...) }

func (b *sidecarBench) run(rounds int, pgClients, httpClients []int, stores []string, pg, web bool) error {
	var err error
	if b.dir, err = os.MkdirTemp("", "govbench-"); err != nil {
		return err
	}
	// pgbouncer runs as another user, and must reach its folder inside.
	if err := os.Chmod(b.dir, 0o755); err != nil {
		return err
	}
	if b.governord, b.proxy, err = binaries(b.dir); err != nil {
		return err
	}
	b.pgPort = os.Getenv("GOVERNOR_TEST_PG_PORT")
	if pg && b.pgPort == "" {
		b.printf("govbench: GOVERNOR_TEST_PG_PORT is unset (source scripts/testpg.sh, or run scripts/sidecarbench.sh): no PostgreSQL runs\n")
		pg = false
	}
	if err := b.setup(stores, pg, web); err != nil {
		return err
	}
	b.printf("govbench: %d rounds of %ds runs; load average %s\n", rounds, b.seconds, loadavg())
	for r := 1; r <= rounds; r++ {
		if pg {
			for _, c := range pgClients {
				for _, t := range b.pgTargets {
					b.pgbench(t, c, r)
				}
			}
		}
		if web {
			for _, c := range httpClients {
				for _, name := range b.httpOrder() {
					b.wrk(name, c, r)
				}
			}
		}
		if pg {
			b.pgContended(r)
		}
		if web {
			b.wrkContended(r)
		}
		if b.withHTTPS {
			for _, c := range httpClients {
				for _, name := range b.httpsTargets() {
					b.https(name, c, r)
				}
			}
			for _, name := range []string{"goproxy-mitm", "gov-https"} {
				b.httpsFirst(name, r, min(50, firstHosts/rounds))
			}
		}
	}
	if b.withHTTPS {
		for _, name := range []string{"goproxy-mitm", "gov-https"} {
			b.httpsConns(name, 200)
		}
	}
	b.printf("govbench: load average %s\n\n", loadavg())
	b.report(pg, web)
	return nil
}

// The tenants every governord of the sidecar runs has: two of weights 3
// and 1, whose quotas never bind.
var sidecarBenchTenants = fmt.Sprintf(`admin_key: bench-admin-key-0123456789
tenants:
  - {name: heavy, api_key: %s, weight: 3, quotas: {calls: 1000000000000}}
  - {name: light, api_key: %s, weight: 1, quotas: {calls: 1000000000000}}
`, heavyKey, lightKey)

// setup starts every process the runs need.
func (b *sidecarBench) setup(stores []string, pg, web bool) error {
	if web {
		if err := b.startOrigins(); err != nil {
			return err
		}
	}
	pgwire := ""
	if pg {
		pgwire = fmt.Sprintf("pgwire:\n  - {listen: 127.0.0.1:0, upstream: 127.0.0.1:%s}\n", b.pgPort)
	}
	governed := pgwire + `rules:
  - {name: sql, match: {sql: any}, class: db}
  - {name: http, match: {host: 127.0.0.1}, class: bench, charge: {calls: 1}}
`
	memory, err := b.startGoverned(stores, governed)
	if err != nil {
		return err
	}
	if pg {
		if err := b.startPGTargets(stores, memory, pgwire); err != nil {
			return err
		}
	}
	return b.startContended(governed)
}

// later stops f's process when the runs end.
func (b *sidecarBench) later(f func()) { b.stops = append(b.stops, f) }

// startOrigins starts the HTTP origin, the ungoverned proxies in front of
// it (bare goproxy, the floors, the peers), and a slow origin for the
// contended runs.
func (b *sidecarBench) startOrigins() error {
	o, addr, err := startSelf("serve-origin")
	if err != nil {
		return err
	}
	b.later(o.stop)
	b.originAddr = addr
	if err := b.startHTTPPeers(); err != nil {
		return err
	}
	slow, addr, err := startSelf("serve-origin", "-delay", "5ms")
	if err != nil {
		return err
	}
	b.later(slow.stop)
	b.contendedOrigin = addr
	return nil
}

// startGoverned starts a governord on each store and a governed sidecar in
// front of each, and returns the memory store's governord (nil without
// one).
func (b *sidecarBench) startGoverned(stores []string, governed string) (*daemon, error) {
	var memory *daemon
	for _, store := range stores {
		st := "store: {driver: memory}\n"
		if store == "sqlite" {
			st = fmt.Sprintf("store: {driver: sqlite, dsn: %s}\n", filepath.Join(b.dir, "governor.db"))
		} else if store != "memory" {
			return nil, fmt.Errorf("unknown store %q", store)
		}
		g, err := startGovernord(b.governord, b.dir, "governord-"+store, st+"root:\n  limits: {db: 1000, bench: 1000}\n"+sidecarBenchTenants)
		if err != nil {
			return nil, err
		}
		b.later(g.stop)
		if store == "memory" {
			memory = g
			if b.withHTTPS {
				if err := b.httpsSetup(governed, g); err != nil {
					return nil, err
				}
			}
		}
		s, err := startSidecar(b.proxy, b.dir, "gov-"+store, b.sidecarYAML(g, heavyKey, "gov-"+store)+governed)
		if err != nil {
			return nil, err
		}
		b.later(s.stop)
		b.httpTargets["gov-"+store] = s
	}
	return memory, nil
}

// startPGTargets fills pgbench's database and lists the pgwire targets:
// PostgreSQL directly, pgbouncer when it can start, a passthrough sidecar
// over the memory store's governord, and each governed sidecar.
func (b *sidecarBench) startPGTargets(stores []string, memory *daemon, pgwire string) error {
	b.pgTargets = append(b.pgTargets, pgTarget{name: "direct", port: b.pgPort})
	if out, err := b.pgbenchCmd(b.pgPort, "-i", "-q", "-s", "10"); err != nil {
		return fmt.Errorf("pgbench -i: %v\n%s", err, out)
	}
	if bp, port, err := startPgbouncer(b.dir, b.pgPort); err != nil {
		b.printf("govbench: no pgbouncer target: %v\n", err)
	} else {
		b.later(bp.stop)
		b.pgTargets = append(b.pgTargets, pgTarget{name: "pgbouncer", port: port, cpu: bp.cpu, pid: bp.cmd.Process.Pid})
	}
	if memory != nil {
		// Passing through: the same sidecar, whose rules match no SQL.
		s, err := startSidecar(b.proxy, b.dir, "passthrough", b.sidecarYAML(memory, lightKey, "passthrough")+pgwire+
			"rules:\n  - {name: http, match: {host: nowhere.invalid}, class: bench}\n")
		if err != nil {
			return err
		}
		b.later(s.stop)
		b.pgTargets = append(b.pgTargets, pgTarget{name: "passthrough", port: portOf(s.pg), cpu: s.cpu, pid: s.cmd.Process.Pid})
	}
	if err := b.startRelayFloors(); err != nil {
		return err
	}
	for _, store := range stores {
		s := b.httpTargets["gov-"+store]
		b.pgTargets = append(b.pgTargets, pgTarget{name: "gov-" + store, port: portOf(s.pg), cpu: s.cpu, pid: s.cmd.Process.Pid})
	}
	return nil
}

// startContended starts the contended runs' processes: a pool smaller than
// the clients, two tenants of weights 3 and 1, each behind its own
// sidecar.
func (b *sidecarBench) startContended(governed string) error {
	g, err := startGovernord(b.governord, b.dir, "governord-contended", "store: {driver: memory}\nroot:\n  limits: {db: 4, bench: 4}\n"+sidecarBenchTenants)
	if err != nil {
		return err
	}
	b.later(g.stop)
	for _, t := range []struct {
		key  string
		into **daemon
	}{{heavyKey, &b.contendedHeavy}, {lightKey, &b.contendedLight}} {
		name := "contended-" + map[string]string{heavyKey: "heavy", lightKey: "light"}[t.key]
		s, err := startSidecar(b.proxy, b.dir, name, b.sidecarYAML(g, t.key, name)+governed)
		if err != nil {
			return err
		}
		b.later(s.stop)
		*t.into = s
	}
	return nil
}

func (b *sidecarBench) sidecarYAML(g *daemon, key, task string) string {
	return fmt.Sprintf("governor: {addr: %q, api_key: %s}\ntask: {name: %s}\n", g.addr, key, task)
}

func portOf(addr string) string {
	_, port, _ := strings.Cut(addr, ":")
	return port
}

func (b *sidecarBench) httpOrder() []string {
	names := []string{"direct"}
	for _, name := range httpPeerNames {
		if b.httpPeers[name] != nil {
			names = append(names, name)
		}
	}
	for _, store := range []string{"memory", "sqlite"} {
		if b.httpTargets["gov-"+store] != nil {
			names = append(names, "gov-"+store)
		}
	}
	return names
}

var (
	reTPS    = regexp.MustCompile(`(?m)^tps = ([0-9.]+)`)
	reTxs    = regexp.MustCompile(`(?m)^number of transactions actually processed: ([0-9]+)`)
	reFailed = regexp.MustCompile(`(?m)^number of failed transactions: ([0-9]+)`)
)

func (b *sidecarBench) pgbenchCmd(port string, args ...string) (string, error) {
	bin := "pgbench"
	if d := os.Getenv("GOVERNOR_TEST_PG_BIN"); d != "" {
		bin = filepath.Join(d, "pgbench")
	}
	cmd := exec.Command(bin, append([]string{"-h", "127.0.0.1", "-p", port, "-U", "governor"}, append(args, "governor")...)...)
	cmd.Env = append(os.Environ(), "PGPASSWORD=governor")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (b *sidecarBench) pgbenchRun(port string, clients int) (tps float64, txs, failed int64, err error) {
	out, err := b.pgbenchCmd(port, "-n", "-S", "-T", strconv.Itoa(b.seconds), "-c", strconv.Itoa(clients), "-j", strconv.Itoa(min(2, clients)))
	if err != nil {
		return 0, 0, 0, fmt.Errorf("%v: %s", err, lastLines(out, 3))
	}
	m, x := reTPS.FindStringSubmatch(out), reTxs.FindStringSubmatch(out)
	if m == nil || x == nil {
		return 0, 0, 0, fmt.Errorf("no tps in pgbench's output: %s", lastLines(out, 3))
	}
	tps, _ = strconv.ParseFloat(m[1], 64)
	txs, _ = strconv.ParseInt(x[1], 10, 64)
	if f := reFailed.FindStringSubmatch(out); f != nil {
		failed, _ = strconv.ParseInt(f[1], 10, 64)
	}
	return tps, txs, failed, nil
}

func (b *sidecarBench) pgbench(t pgTarget, clients, round int) {
	var cpu0 time.Duration
	if t.cpu != nil {
		cpu0 = t.cpu()
	}
	tps, txs, failed, err := b.pgbenchRun(t.port, clients)
	if err != nil {
		b.printf("pgbench -S  %-13s c=%-3d round %d: FAILED: %v\n", t.name, clients, round, err)
		return
	}
	s := sample{Kind: "pgbench", Target: t.name, Clients: clients, Round: round, Rate: tps, Failed: failed}
	if t.cpu != nil && txs > 0 {
		s.CPUus = float64(t.cpu()-cpu0) / float64(txs) / 1e3
	}
	b.samples = append(b.samples, s)
	b.printf("pgbench -S  %-13s c=%-3d round %d: %8.0f tps  %s\n", t.name, clients, round, tps, cpuNote(s.CPUus, "tx"))
}

var (
	reRPS  = regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`)
	reP50  = regexp.MustCompile(`(?m)^\s+50%\s+([0-9.]+)(us|ms|s)`)
	reReqs = regexp.MustCompile(`(?m)^\s+([0-9]+) requests in`)
	reNon2 = regexp.MustCompile(`Non-2xx or 3xx responses: ([0-9]+)`)
)

// wrkRun runs wrk through proxy (empty: straight at the origin) for
// b.seconds.
func (b *sidecarBench) wrkRun(origin, proxy string, clients int) (rps, p50us float64, reqs, bad int64, err error) {
	args := []string{"-t", strconv.Itoa(min(2, clients)), "-c", strconv.Itoa(clients), "-d", strconv.Itoa(b.seconds) + "s", "--latency"}
	target := "http://" + origin + "/"
	if proxy != "" {
		// wrk speaks to the proxy and asks it for the origin's URL in
		// absolute form, as an HTTP_PROXY client does.
		script := filepath.Join(b.dir, "absolute-"+origin+".lua")
		if err := os.WriteFile(script, []byte(fmt.Sprintf("wrk.path = %q\n", target)), 0o644); err != nil {
			return 0, 0, 0, 0, err
		}
		args = append(args, "-s", script)
		target = "http://" + proxy + "/"
	}
	out, err := exec.Command("wrk", append(args, target)...).CombinedOutput()
	if err != nil {
		return 0, 0, 0, 0, fmt.Errorf("wrk: %v: %s", err, lastLines(string(out), 3))
	}
	m, l, n := reRPS.FindStringSubmatch(string(out)), reP50.FindStringSubmatch(string(out)), reReqs.FindStringSubmatch(string(out))
	if m == nil || l == nil || n == nil {
		return 0, 0, 0, 0, fmt.Errorf("no requests/s in wrk's output: %s", lastLines(string(out), 5))
	}
	rps, _ = strconv.ParseFloat(m[1], 64)
	p50us, _ = strconv.ParseFloat(l[1], 64)
	p50us *= map[string]float64{"us": 1, "ms": 1e3, "s": 1e6}[l[2]]
	reqs, _ = strconv.ParseInt(n[1], 10, 64)
	if x := reNon2.FindStringSubmatch(string(out)); x != nil {
		bad, _ = strconv.ParseInt(x[1], 10, 64)
	}
	return rps, p50us, reqs, bad, nil
}

func (b *sidecarBench) wrk(name string, clients, round int) {
	proxy := b.httpAddr(name)
	var cpu func() time.Duration
	switch {
	case b.httpPeers[name] != nil:
		cpu = b.httpPeers[name].cpu
	case b.httpTargets[name] != nil:
		cpu = b.httpTargets[name].cpu
	}
	var cpu0 time.Duration
	if cpu != nil {
		cpu0 = cpu()
	}
	rps, p50, reqs, bad, err := b.wrkRun(b.originAddr, proxy, clients)
	if err != nil {
		b.printf("wrk 1 KiB   %-13s c=%-3d round %d: FAILED: %v\n", name, clients, round, err)
		return
	}
	s := sample{Kind: "wrk", Target: name, Clients: clients, Round: round, Rate: rps, P50us: p50, Failed: bad}
	if cpu != nil && reqs > 0 {
		s.CPUus = float64(cpu()-cpu0) / float64(reqs) / 1e3
	}
	b.samples = append(b.samples, s)
	b.printf("wrk 1 KiB   %-13s c=%-3d round %d: %8.0f req/s  p50 %6.0f µs  %s\n", name, clients, round, rps, p50, cpuNote(s.CPUus, "request"))
}

// httpAddr is the proxy address of an HTTP target (empty: direct).
func (b *sidecarBench) httpAddr(name string) string {
	if p := b.httpPeers[name]; p != nil {
		return p.addr
	}
	if s := b.httpTargets[name]; s != nil {
		return s.addr
	}
	return ""
}

// pgContended runs pgbench -S with 8 clients through each tenant's sidecar
// at once, against a db pool of 4.
func (b *sidecarBench) pgContended(round int) {
	b.both(round, "pgbench-contended", 8, func(s *daemon, clients int) (float64, int64, error) {
		tps, _, failed, err := b.pgbenchRun(portOf(s.pg), clients)
		return tps, failed, err
	})
}

// wrkContended runs wrk with 16 connections through each tenant's sidecar
// at once, against a pool of 4 and an origin that takes 5 ms.
func (b *sidecarBench) wrkContended(round int) {
	b.both(round, "wrk-contended", 16, func(s *daemon, clients int) (float64, int64, error) {
		rps, _, _, bad, err := b.wrkRun(b.contendedOrigin, s.addr, clients)
		return rps, bad, err
	})
}

func (b *sidecarBench) both(round int, kind string, clients int, run func(*daemon, int) (float64, int64, error)) {
	var wg sync.WaitGroup
	rates := make([]float64, 2)
	fails := make([]int64, 2)
	errs := make([]error, 2)
	for i, s := range []*daemon{b.contendedHeavy, b.contendedLight} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rates[i], fails[i], errs[i] = run(s, clients)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		b.printf("%-20s round %d: FAILED: %v\n", kind, round, err)
		return
	}
	total := rates[0] + rates[1]
	for i, name := range []string{"heavy (w3)", "light (w1)"} {
		b.samples = append(b.samples, sample{Kind: kind, Target: name, Clients: clients, Round: round, Rate: rates[i],
			Share: rates[i] / total, Failed: fails[i]})
	}
	b.printf("%-20s round %d: heavy %7.0f/s, light %7.0f/s: %.2f:1, %7.0f/s together\n", kind, round, rates[0], rates[1], rates[0]/rates[1], total)
}

// stat is the median and range of some samples' values.
type stat struct{ med, lo, hi float64 }

func statOf(vals []float64) stat {
	if len(vals) == 0 {
		return stat{}
	}
	s := slices.Clone(vals)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return stat{med, s[0], s[len(s)-1]}
}

func (s stat) String() string {
	if s.lo == s.hi {
		return fmt.Sprintf("%.0f", s.med)
	}
	return fmt.Sprintf("%.0f (%.0f–%.0f)", s.med, s.lo, s.hi)
}

// values picks one field of the samples of kind, target and clients.
func (b *sidecarBench) values(kind, target string, clients int, field func(sample) float64) []float64 {
	var out []float64
	for _, s := range b.samples {
		if s.Kind == kind && s.Target == target && s.Clients == clients {
			out = append(out, field(s))
		}
	}
	return out
}

// ratio is the median over rounds of a/b, both taken in the same round, so
// that a slow round slows both.
func (b *sidecarBench) ratio(kind, target, base string, clients int, field func(sample) float64) string {
	byRound := map[int]float64{}
	for _, s := range b.samples {
		if s.Kind == kind && s.Target == base && s.Clients == clients && field(s) != 0 {
			byRound[s.Round] = field(s)
		}
	}
	var rs []float64
	for _, s := range b.samples {
		if s.Kind == kind && s.Target == target && s.Clients == clients {
			if d, ok := byRound[s.Round]; ok {
				rs = append(rs, field(s)/d)
			}
		}
	}
	if len(rs) == 0 {
		return "-"
	}
	st := statOf(rs)
	if st.lo == st.hi {
		return fmt.Sprintf("%.2f", st.med)
	}
	return fmt.Sprintf("%.2f (%.2f–%.2f)", st.med, st.lo, st.hi)
}

func cpuNote(us float64, per string) string {
	if us == 0 {
		return ""
	}
	return fmt.Sprintf("%5.1f µs of middle CPU per %s", us, per)
}

func rate(s sample) float64 { return s.Rate }
func cpu(s sample) float64  { return s.CPUus }
func p50(s sample) float64  { return s.P50us }

func (b *sidecarBench) report(pg, web bool) {
	w := tabwriter.NewWriter(b.stdout, 0, 0, 2, ' ', 0)
	if pg {
		fmt.Fprintln(w, "pgbench -S\tclients\tTPS, median (range)\t/direct\t/pgbouncer\t/passthrough\tmiddle CPU/tx µs")
		for _, c := range b.clientCounts("pgbench") {
			for _, t := range b.pgTargets {
				fmt.Fprintf(w, "%s\t%d\t%v\t%s\t%s\t%s\t%v\n", t.name, c, statOf(b.values("pgbench", t.name, c, rate)),
					b.ratio("pgbench", t.name, "direct", c, rate), b.ratio("pgbench", t.name, "pgbouncer", c, rate),
					b.ratio("pgbench", t.name, "passthrough", c, rate), statOf(b.values("pgbench", t.name, c, cpu)))
			}
		}
		fmt.Fprintln(w)
	}
	if web {
		b.reportWRK(w)
	}
	if b.withHTTPS {
		b.httpsReport(w)
	}
	fmt.Fprintln(w, "contended\tclients each\tper second, median (range)\tshare, median (range)")
	for _, kind := range []string{"pgbench-contended", "wrk-contended"} {
		for _, t := range []string{"heavy (w3)", "light (w1)"} {
			vals := b.values(kind, t, b.firstClients(kind), rate)
			if len(vals) == 0 {
				continue
			}
			shares := b.values(kind, t, b.firstClients(kind), func(s sample) float64 { return s.Share * 100 })
			fmt.Fprintf(w, "%s %s\t%d\t%v\t%v%%\n", kind, t, b.firstClients(kind), statOf(vals), statOf(shares))
		}
	}
	w.Flush()
}

// reportWRK prints the wrk table: each target's rate and added median
// latency, against bare goproxy (the library the sidecar is built on) and
// against Squid (what users run).
func (b *sidecarBench) reportWRK(w io.Writer) {
	fmt.Fprintln(w, "wrk 1 KiB\tclients\treq/s, median (range)\t/goproxy\t/squid\tp50 µs\tadded p50 µs\tadded p50 /goproxy's\t/squid's\tmiddle CPU/req µs")
	for _, c := range b.clientCounts("wrk") {
		direct := statOf(b.values("wrk", "direct", c, p50)).med
		added := func(name string) float64 { return statOf(b.values("wrk", name, c, p50)).med - direct }
		relative := func(name, base string) string {
			if name == "direct" || len(b.values("wrk", base, c, p50)) == 0 || added(base) <= 0 {
				return "-"
			}
			return fmt.Sprintf("%.2f", added(name)/added(base))
		}
		for _, name := range b.httpOrder() {
			fmt.Fprintf(w, "%s\t%d\t%v\t%s\t%s\t%v\t%.0f\t%s\t%s\t%v\n", name, c, statOf(b.values("wrk", name, c, rate)),
				b.ratio("wrk", name, "goproxy", c, rate), b.ratio("wrk", name, "squid", c, rate),
				statOf(b.values("wrk", name, c, p50)), added(name), relative(name, "goproxy"), relative(name, "squid"),
				statOf(b.values("wrk", name, c, cpu)))
		}
	}
	fmt.Fprintln(w)
}

func (b *sidecarBench) clientCounts(kind string) []int {
	var out []int
	for _, s := range b.samples {
		if s.Kind == kind && !slices.Contains(out, s.Clients) {
			out = append(out, s.Clients)
		}
	}
	return out
}

func (b *sidecarBench) firstClients(kind string) int {
	if cs := b.clientCounts(kind); len(cs) > 0 {
		return cs[0]
	}
	return 0
}

func (b *sidecarBench) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	data, err := json.MarshalIndent(struct {
		When    time.Time `json:"when"`
		Seconds int       `json:"seconds_per_run"`
		Samples []sample  `json:"samples"`
	}{time.Now().UTC(), b.seconds, b.samples}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "sidecar.json"), append(data, '\n'), 0o644)
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}
