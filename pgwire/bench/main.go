// Command bench compares pgbench through the pgwire proxy with PostgreSQL
// directly and with pgbouncer, in one run on one machine (issue 5,
// "Performance"). It is a benchmark, not a test: ./test.sh does not run it.
//
//	source scripts/testpg.sh && go run ./pgwire/bench      (or: bash scripts/pgbench.sh)
//
// It initialises pgbench's tables once on the direct server (pgbench -i),
// then runs pgbench -S (select-only) and the default TPC-B-like script at
// each client count against every target, one run at a time:
//
//   - direct: the PostgreSQL of scripts/testpg.sh;
//   - passthrough: a pgwire.Proxy with no Admitter, in this process;
//   - gov-memory, gov-sqlite: a pgwire.Proxy whose Admitter takes a lease per
//     transaction (rule `sql: any`, class db, limit 64, so nothing queues)
//     from a governord started in this process, its store in memory or in
//     SQLite in a temporary folder;
//   - pgbouncer: the system's pgbouncer in session mode, run as the postgres
//     user when we are root (pgbouncer refuses root).
//
// The runs are interleaved (for each test and client count, every target in
// turn) so that load from other jobs on the machine falls on all targets
// alike. Before each group it samples the machine's CPU for a second with
// nothing of ours running ("bg busy"). Besides pgbench's tps and latency it
// reports the middle tier's CPU per transaction: this process's user+system
// time for the in-process targets (relay, SDK and governord together), the
// pgbouncer process's for pgbouncer.
//
// With -profile DIR it then repeats select-only at 8 clients against
// passthrough and the governed targets with the Go CPU profiler on and
// writes DIR/<target>.pprof (go tool pprof -top DIR/gov-memory.pprof).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/governor-project/governor/classify"
	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/pgwire"
	"github.com/governor-project/governor/server"
)

const rulesYAML = `
rules:
  - name: any-sql
    match: {sql: any}
    class: db
`

var (
	flagT        = flag.Int("T", 10, "seconds per pgbench run")
	flagClients  = flag.String("clients", "1,8,32", "client counts")
	flagScale    = flag.Int("scale", 10, "pgbench -i scale factor")
	flagTests    = flag.String("tests", "select-only,tpcb", "tests to run: select-only, tpcb")
	flagTargets  = flag.String("targets", "direct,passthrough,gov-memory,gov-sqlite,pgbouncer", "targets to run")
	flagLimit    = flag.Int64("limit", 64, "the db class limit of the governed targets")
	flagProfile  = flag.String("profile", "", "folder for CPU profiles of an extra select-only run at 8 clients (empty: none)")
	flagBouncer  = flag.String("pgbouncer", "pgbouncer", "the pgbouncer binary")
	flagNoBounce = flag.Bool("no-pgbouncer", false, "skip pgbouncer")
)

// target is one thing pgbench connects to.
type target struct {
	name string
	port string
	// cpu returns the middle tier's cumulative CPU time; nil for direct.
	cpu  func() time.Duration
	stop func()
}

type result struct {
	test, target string
	clients      int
	tps, latMS   float64
	failed       int64
	txs          int64
	cpuPerTx     time.Duration // middle tier; -1 when not measured
	bgBusy       float64       // machine busy fraction in the idle sample before the group
	busy         float64       // machine busy fraction during the run
	err          error
}

var (
	pgPort, pgBin string
	tmpRoot       string
)

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run() error {
	pgPort, pgBin = os.Getenv("GOVERNOR_TEST_PG_PORT"), os.Getenv("GOVERNOR_TEST_PG_BIN")
	if pgPort == "" || pgBin == "" {
		return errors.New("GOVERNOR_TEST_PG_PORT and GOVERNOR_TEST_PG_BIN are unset: source scripts/testpg.sh first (or run scripts/pgbench.sh)")
	}
	var err error
	if tmpRoot, err = os.MkdirTemp("", "governor-pgbench-"); err != nil {
		return err
	}
	defer os.RemoveAll(tmpRoot)
	clients, err := ints(*flagClients)
	if err != nil {
		return err
	}
	tests := strings.Split(*flagTests, ",")
	wanted := map[string]bool{}
	for _, t := range strings.Split(*flagTargets, ",") {
		wanted[strings.TrimSpace(t)] = true
	}
	if *flagNoBounce {
		wanted["pgbouncer"] = false
	}

	start := time.Now()
	fmt.Printf("bench: pgbench -i -s %d on the direct server (port %s)\n", *flagScale, pgPort)
	if out, err := pgbench(pgPort, "-i", "-q", "-s", strconv.Itoa(*flagScale)); err != nil {
		return fmt.Errorf("pgbench -i: %v\n%s", err, out)
	}

	var targets []*target
	defer func() {
		for i := len(targets) - 1; i >= 0; i-- {
			targets[i].stop()
		}
	}()
	add := func(name string, mk func() (*target, error)) {
		if !wanted[name] {
			return
		}
		t, err := mk()
		if err != nil {
			fmt.Printf("bench: %s: not run: %v\n", name, err)
			return
		}
		t.name = name
		targets = append(targets, t)
	}
	add("direct", func() (*target, error) { return &target{port: pgPort, stop: func() {}}, nil })
	add("passthrough", func() (*target, error) { return startProxy(nil, nil) })
	add("gov-memory", func() (*target, error) { return startGoverned("memory") })
	add("gov-sqlite", func() (*target, error) { return startGoverned("sqlite") })
	add("pgbouncer", startPgbouncer)
	if len(targets) == 0 {
		return errors.New("no target to run")
	}
	names := make([]string, len(targets))
	for i, t := range targets {
		names[i] = fmt.Sprintf("%s(:%s)", t.name, t.port)
	}
	fmt.Printf("bench: targets %s; %d tests x %d client counts x %d targets x %ds\n",
		strings.Join(names, " "), len(tests), len(clients), len(targets), *flagT)
	fmt.Printf("bench: load average at start: %s\n", loadavg())

	var results []result
	for _, test := range tests {
		for _, c := range clients {
			bg := sampleBusy(time.Second)
			for _, t := range targets {
				r := runOne(t, test, c)
				r.bgBusy = bg
				results = append(results, r)
				if r.err != nil {
					fmt.Printf("bench: %-11s %-11s c=%-2d FAILED: %v\n", test, t.name, c, r.err)
					continue
				}
				fmt.Printf("bench: %-11s %-11s c=%-2d tps %9.1f  lat %7.3f ms  mid-cpu %s/tx  busy %3.0f%% (bg %3.0f%%)\n",
					test, t.name, c, r.tps, r.latMS, fmtCPU(r.cpuPerTx), 100*r.busy, 100*bg)
			}
		}
	}
	fmt.Printf("bench: load average at end: %s\n", loadavg())
	fmt.Println()
	printTable(results)

	if *flagProfile != "" {
		if err := profile(targets); err != nil {
			return err
		}
	}
	fmt.Printf("\nbench: done in %s\n", time.Since(start).Round(time.Second))
	return nil
}

// runOne runs one pgbench against t.
func runOne(t *target, test string, clients int) result {
	r := result{test: test, target: t.name, clients: clients, cpuPerTx: -1}
	args := []string{"-n", "-T", strconv.Itoa(*flagT), "-c", strconv.Itoa(clients), "-j", strconv.Itoa(min(2, clients))}
	switch test {
	case "select-only":
		args = append(args, "-S")
	case "tpcb":
		// The same starting state for every run: pgbench -n skips its own
		// vacuum, so do it here, on the direct server, outside the timing.
		if out, err := psql("VACUUM pgbench_branches", "VACUUM pgbench_tellers", "TRUNCATE pgbench_history"); err != nil {
			r.err = fmt.Errorf("vacuum: %v: %s", err, out)
			return r
		}
	default:
		r.err = fmt.Errorf("unknown test %q", test)
		return r
	}
	var cpu0 time.Duration
	if t.cpu != nil {
		cpu0 = t.cpu()
	}
	busy0 := readStat()
	out, err := pgbench(t.port, args...)
	r.busy = busyBetween(busy0, readStat())
	if err != nil {
		r.err = fmt.Errorf("%v: %s", err, lastLines(out, 5))
		return r
	}
	r.tps, r.latMS, r.txs, r.failed, err = parsePgbench(out)
	if err != nil {
		r.err = fmt.Errorf("%v: %s", err, lastLines(out, 5))
		return r
	}
	if t.cpu != nil && r.txs > 0 {
		r.cpuPerTx = (t.cpu() - cpu0) / time.Duration(r.txs)
	}
	return r
}

var (
	reTPS    = regexp.MustCompile(`(?m)^tps = ([0-9.]+)`)
	reLat    = regexp.MustCompile(`(?m)^latency average = ([0-9.]+) ms`)
	reTxs    = regexp.MustCompile(`(?m)^number of transactions actually processed: ([0-9]+)`)
	reFailed = regexp.MustCompile(`(?m)^number of failed transactions: ([0-9]+)`)
)

func parsePgbench(out string) (tps, lat float64, txs, failed int64, err error) {
	m := reTPS.FindStringSubmatch(out)
	l := reLat.FindStringSubmatch(out)
	x := reTxs.FindStringSubmatch(out)
	if m == nil || l == nil || x == nil {
		return 0, 0, 0, 0, errors.New("no tps, latency average or transaction count in pgbench's output")
	}
	tps, _ = strconv.ParseFloat(m[1], 64)
	lat, _ = strconv.ParseFloat(l[1], 64)
	txs, _ = strconv.ParseInt(x[1], 10, 64)
	if f := reFailed.FindStringSubmatch(out); f != nil {
		failed, _ = strconv.ParseInt(f[1], 10, 64)
	}
	return tps, lat, txs, failed, nil
}

func printTable(results []result) {
	type key struct {
		test, target string
		clients      int
	}
	by := map[key]result{}
	for _, r := range results {
		by[key{r.test, r.target, r.clients}] = r
	}
	ratio := func(r result, other string) string {
		o, ok := by[key{r.test, other, r.clients}]
		if !ok || o.err != nil || r.err != nil || o.tps == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f", r.tps/o.tps)
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "test\tclients\ttarget\tTPS\tlat ms\tmid CPU/tx\t/direct\t/pgbouncer\tbusy\tbg busy\t")
	for _, r := range results {
		if r.err != nil {
			fmt.Fprintf(w, "%s\t%d\t%s\tfailed\t\t\t\t\t\t\t\n", r.test, r.clients, r.target)
			continue
		}
		fail := ""
		if r.failed > 0 {
			fail = fmt.Sprintf(" (%d failed)", r.failed)
		}
		fmt.Fprintf(w, "%s\t%d\t%s\t%.0f%s\t%.3f\t%s\t%s\t%s\t%.0f%%\t%.0f%%\t\n", r.test, r.clients, r.target, r.tps, fail, r.latMS,
			fmtCPU(r.cpuPerTx), ratio(r, "direct"), ratio(r, "pgbouncer"), 100*r.busy, 100*r.bgBusy)
	}
	w.Flush()
}

func fmtCPU(d time.Duration) string {
	if d < 0 {
		return "-"
	}
	return fmt.Sprintf("%.1fµs", float64(d)/1e3)
}

// profile repeats select-only at 8 clients against the in-process targets
// with the CPU profiler on.
func profile(targets []*target) error {
	if err := os.MkdirAll(*flagProfile, 0o755); err != nil {
		return err
	}
	fmt.Printf("\nbench: CPU profiles (select-only, 8 clients) in %s\n", *flagProfile)
	for _, t := range targets {
		if t.cpu == nil || t.name == "pgbouncer" {
			continue
		}
		path := filepath.Join(*flagProfile, t.name+".pprof")
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return err
		}
		r := runOne(t, "select-only", 8)
		pprof.StopCPUProfile()
		f.Close()
		if r.err != nil {
			fmt.Printf("bench: profile %s: %v\n", t.name, r.err)
			continue
		}
		fmt.Printf("bench: profile %-11s tps %9.1f  mid-cpu %s/tx  -> %s\n", t.name, r.tps, fmtCPU(r.cpuPerTx), path)
	}
	return nil
}

// startProxy serves a pgwire.Proxy on 127.0.0.1:0 in this process.
func startProxy(adm pgwire.Admitter, rules *classify.Rules) (*target, error) {
	p := &pgwire.Proxy{Upstream: "127.0.0.1:" + pgPort, Admitter: adm, WaitTimeout: 30 * time.Second}
	if rules != nil {
		p.Rules = func() *classify.Rules { return rules }
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	errc := make(chan error, 1)
	go func() { errc <- p.Serve(ln) }()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return &target{port: port, cpu: selfCPU, stop: func() {
		p.Close()
		<-errc
	}}, nil
}

// startGoverned starts a governord on driver and a governed proxy on it.
func startGoverned(driver string) (*target, error) {
	ctx := context.Background()
	store := server.StoreConfig{Driver: driver}
	if driver == "sqlite" {
		dir, err := os.MkdirTemp(tmpRoot, "sqlite-")
		if err != nil {
			return nil, err
		}
		store.DSN = filepath.Join(dir, "governor.db")
	}
	srv, err := server.Start(ctx, server.Config{Listen: "127.0.0.1:0", SessionTTL: 10 * time.Second, Store: store,
		Tenants: []server.TenantConfig{{Name: "bench", APIKey: "bench-key", Weight: 1, Limits: map[string]int64{"db": *flagLimit}}}}, nil)
	if err != nil {
		return nil, fmt.Errorf("governord: %w", err)
	}
	client, err := governor.Dial(ctx, governor.WithAddr(srv.Addr()), governor.WithAPIKey("bench-key"))
	if err != nil {
		srv.Close()
		return nil, fmt.Errorf("dial governord: %w", err)
	}
	_, task, err := client.NewTask(ctx, governor.Spec{Name: "pgbench-" + driver})
	if err != nil {
		client.Close()
		srv.Close()
		return nil, fmt.Errorf("task: %w", err)
	}
	rules, err := classify.Parse([]byte(rulesYAML))
	if err != nil {
		return nil, err
	}
	t, err := startProxy(&pgwire.TaskAdmitter{Task: task}, rules)
	if err != nil {
		return nil, err
	}
	stopProxy := t.stop
	t.stop = func() {
		stopProxy()
		task.Close()
		client.Close()
		srv.Close()
	}
	return t, nil
}

// startPgbouncer runs the system's pgbouncer in session mode in front of
// the direct server, with its ini and userlist in a temporary folder.
func startPgbouncer() (*target, error) {
	bin, err := exec.LookPath(*flagBouncer)
	if err != nil {
		if _, e := os.Stat("/usr/sbin/pgbouncer"); e != nil {
			return nil, fmt.Errorf("pgbouncer not found (install it: apt-get install pgbouncer): %w", err)
		}
		bin = "/usr/sbin/pgbouncer"
	}
	dir, err := os.MkdirTemp(tmpRoot, "pgbouncer-")
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	ini := fmt.Sprintf(`[databases]
governor = host=127.0.0.1 port=%s dbname=governor

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %s
unix_socket_dir =
auth_type = md5
auth_file = %[3]s/userlist.txt
pool_mode = session
max_client_conn = 100
default_pool_size = 40
max_db_connections = 0
server_tls_sslmode = disable
logfile = %[3]s/pgbouncer.log
pidfile = %[3]s/pgbouncer.pid
`, pgPort, port, dir)
	files := map[string]string{"pgbouncer.ini": ini, "userlist.txt": `"governor" "governor"` + "\n"}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			return nil, err
		}
	}
	var cmd *exec.Cmd
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("pgbouncer refuses root and there is no postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		for _, p := range []string{dir, filepath.Join(dir, "pgbouncer.ini"), filepath.Join(dir, "userlist.txt")} {
			if err := os.Chown(p, uid, gid); err != nil {
				return nil, err
			}
		}
		// tmpRoot is ours and 0700: let postgres through it.
		if err := os.Chmod(tmpRoot, 0o711); err != nil {
			return nil, err
		}
		cmd = exec.Command("runuser", "-u", "postgres", "--", bin, filepath.Join(dir, "pgbouncer.ini"))
	} else {
		cmd = exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	}
	cmd.Dir = dir
	logf, err := os.Create(filepath.Join(tmpRoot, "pgbouncer.out"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(exited) }()
	// Wait for the pid file and the port.
	var pid int
	deadline := time.Now().Add(15 * time.Second)
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "pgbouncer.pid")); err == nil {
			pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		}
		if pid > 0 {
			if c, err := net.DialTimeout("tcp", "127.0.0.1:"+port, time.Second); err == nil {
				c.Close()
				break
			}
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(tmpRoot, "pgbouncer.out"))
			log2, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			return nil, fmt.Errorf("pgbouncer exited: %s%s", lastLines(string(log), 5), lastLines(string(log2), 5))
		default:
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			return nil, errors.New("pgbouncer did not start listening within 15s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	version := ""
	if out, err := exec.Command(bin, "--version").CombinedOutput(); err == nil {
		version = strings.SplitN(strings.TrimSpace(string(out)), "\n", 2)[0]
	}
	fmt.Printf("bench: %s, session mode, pid %d, port %s\n", version, pid, port)
	return &target{port: port, cpu: func() time.Duration { return procCPU(pid) }, stop: func() {
		// SIGINT: pgbouncer's "safe shutdown"; SIGTERM stops it at once.
		syscall.Kill(pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	}}, nil
}

func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port, nil
}

// pgbench runs the server's pgbench against 127.0.0.1:port as governor.
func pgbench(port string, args ...string) (string, error) {
	full := append([]string{"-h", "127.0.0.1", "-p", port, "-U", "governor"}, args...)
	full = append(full, "governor")
	cmd := exec.Command(filepath.Join(pgBin, "pgbench"), full...)
	cmd.Env = pgEnv()
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func psql(sqls ...string) (string, error) {
	args := []string{"-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", pgPort, "-U", "governor", "-d", "governor"}
	for _, s := range sqls {
		args = append(args, "-c", s)
	}
	cmd := exec.Command(filepath.Join(pgBin, "psql"), args...)
	cmd.Env = pgEnv()
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// pgEnv: the same plain-TCP connection for every target (the direct server
// also speaks TLS; the proxy answers SSLRequest 'N').
func pgEnv() []string {
	return append(os.Environ(), "PGPASSWORD=governor", "PGSSLMODE=disable", "PGGSSENCMODE=disable", "PGAPPNAME=pgbench")
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procCPU is a process's user+system time from /proc/PID/stat.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ is 100 on Linux
}

type cpuStat struct{ busy, total int64 }

// readStat reads the machine's CPU counters from /proc/stat.
func readStat() cpuStat {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return cpuStat{}
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return cpuStat{}
	}
	fields := strings.Fields(sc.Text())
	var s cpuStat
	for i, v := range fields[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		if i == 8 || i == 9 { // guest time is already counted in user
			continue
		}
		s.total += n
		if i != 3 && i != 4 { // idle, iowait
			s.busy += n
		}
	}
	return s
}

func busyBetween(a, b cpuStat) float64 {
	if b.total <= a.total {
		return 0
	}
	return float64(b.busy-a.busy) / float64(b.total-a.total)
}

func sampleBusy(d time.Duration) float64 {
	a := readStat()
	time.Sleep(d)
	return busyBetween(a, readStat())
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bad client count %q", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
