package main

// The ha scenario (docs/ha.md): governords with standbys over one
// PostgreSQL.
//
//	go run ./cmd/govbench ha [-dsn DSN] [-failovers 50] [-T 10] [-rounds 3] [-out docs/bench]
//
// Two figures:
//
//   - failover: the leader is killed with SIGKILL under load (and started
//     again, as a standby), over and over. For each failover it times, from
//     the kill, the first request that succeeds through a sidecar (which
//     may be served from the budgets delegated to it), the first consume
//     that succeeds through the SDK (which needs a leader), and when the
//     new leader says it leads (/readyz).
//   - standbys: consumes per second at the leader with 0, 1 and 2 standbys
//     following, in one run, the three interleaved round by round.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/internal/hacluster"
)

const haKey = "ha-bench-tenant-key-0123456789"

func haMain(args []string, stdout, stderr io.Writer) int {
	fs := flagSet("ha", stderr)
	dsn := fs.String("dsn", os.Getenv("GOVERNOR_TEST_PG_DSN"), "the PostgreSQL the governords share (default $GOVERNOR_TEST_PG_DSN)")
	failovers := fs.Int("failovers", 50, "how many times the leader is killed (0: none, only the standbys' figure)")
	seconds := fs.Int("T", 10, "seconds of load per throughput measurement")
	rounds := fs.Int("rounds", 3, "rounds of the throughput comparison")
	clients := fs.Int("clients", 32, "concurrent consumers in the throughput comparison")
	out := fs.String("out", "", "a folder for the raw results (ha.json)")
	if fs.Parse(args) != nil {
		return 2
	}
	if *dsn == "" {
		fmt.Fprintln(stderr, "govbench ha: no PostgreSQL: pass -dsn or set GOVERNOR_TEST_PG_DSN (source scripts/testpg.sh)")
		return 2
	}
	dir, err := os.MkdirTemp("", "govbench-ha-")
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	gd, proxy, err := binaries(dir)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	b := &haBench{governord: gd, proxy: proxy, dir: dir, stdout: stdout}
	res := haResults{}
	if *failovers > 0 { // -failovers 0: the standbys' figure alone
		if res.Failovers, err = b.failovers(*dsn, *failovers); err != nil {
			fmt.Fprintln(stderr, "govbench ha: failovers:", err)
			return 1
		}
	}
	if res.Standbys, err = b.standbys(*dsn, *rounds, *clients, time.Duration(*seconds)*time.Second); err != nil {
		fmt.Fprintln(stderr, "govbench ha: standbys:", err)
		return 1
	}
	if *out != "" {
		data, _ := json.MarshalIndent(res, "", "  ")
		if err := os.WriteFile(filepath.Join(*out, "ha.json"), data, 0o644); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
	}
	return 0
}

type haResults struct {
	Failovers []haFailover      `json:"failovers"`
	Standbys  map[int][]float64 `json:"consumes_per_second_by_standbys"`
}

type haFailover struct {
	Sidecar time.Duration `json:"sidecar_ns"` // kill to the first request through the sidecar that succeeded
	SDK     time.Duration `json:"sdk_ns"`     // kill to the first consume through the SDK that succeeded
	Leads   time.Duration `json:"leads_ns"`   // kill to the new leader's /readyz
}

type haBench struct {
	governord, proxy, dir string
	stdout                io.Writer
}

// node starts a member of the cluster, named name, over dsn.
func (b *haBench) node(dsn, name string) (*hacluster.Member, error) {
	return hacluster.Start(hacluster.Spec{Bin: b.governord, Dir: b.dir, Name: name, DSN: dsn,
		More: fmt.Sprintf("session_ttl: 10s\nroot: {limits: {bench: 1000000}}\ntenants:\n  - {name: bench, api_key: %s}\n", haKey)})
}

// freshSchema gives the run a schema of its own in the database dsn names.
func freshSchema(dsn, name string) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return "", err
	}
	schema := fmt.Sprintf("govbench_%s_%d", name, time.Now().UnixNano())
	psql := exec.Command("psql", dsn, "-v", "ON_ERROR_STOP=1", "-qc", "CREATE SCHEMA "+schema)
	if bin := os.Getenv("GOVERNOR_TEST_PG_BIN"); bin != "" {
		psql.Path = filepath.Join(bin, "psql")
	}
	if out, err := psql.CombinedOutput(); err != nil {
		return "", fmt.Errorf("create schema: %v: %s", err, out)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// failovers kills the leader n times under load and times each failover.
func (b *haBench) failovers(dsn string, n int) ([]haFailover, error) {
	dsn, err := freshSchema(dsn, "failover")
	if err != nil {
		return nil, err
	}
	var nodes []*hacluster.Member
	defer func() {
		for _, nd := range nodes {
			nd.Stop()
		}
	}()
	for _, name := range []string{"a", "b"} {
		nd, err := b.node(dsn, name)
		if err != nil {
			return nil, err
		}
		nodes = append(nodes, nd)
	}
	if _, err := hacluster.Leader(nodes, time.Minute); err != nil {
		return nil, err
	}
	load, err := b.startFailoverLoad(nodes[0].Addr + "," + nodes[1].Addr)
	if err != nil {
		return nil, err
	}
	defer load.stop()
	fmt.Fprintf(b.stdout, "failover: the leader killed with SIGKILL %d times (lease 2s, drift allowance 250ms)\n", n)
	var res []haFailover
	for i := 0; i < n; i++ {
		time.Sleep(2 * time.Second) // load at the leader before the next kill
		f, err := killLeader(nodes, load)
		if err != nil {
			return nil, fmt.Errorf("failover %d: %w", i+1, err)
		}
		res = append(res, f)
	}
	reportFailovers(b.stdout, res)
	return res, nil
}

// failoverLoad is the load a failover is timed by: one HTTP client through
// a sidecar and one SDK consumer, each keeping the time of its newest
// success.
type failoverLoad struct {
	viaSidecar, viaSDK atomic.Int64
	lastSDKErr         atomic.Value
	stops              []func()
}

func (l *failoverLoad) stop() {
	for i := len(l.stops) - 1; i >= 0; i-- {
		l.stops[i]()
	}
}

// startFailoverLoad starts the origin, a sidecar over governords addrs,
// and the two loops.
func (b *haBench) startFailoverLoad(addrs string) (_ *failoverLoad, err error) {
	l := &failoverLoad{}
	defer func() {
		if err != nil {
			l.stop()
		}
	}()
	origin, originAddr, err := startSelf("serve-origin")
	if err != nil {
		return nil, err
	}
	l.stops = append(l.stops, origin.stop)
	sc, err := startSidecar(b.proxy, b.dir, "sidecar", fmt.Sprintf("governor: {addr: %q, api_key: %s}\ntask: {name: failover}\n", addrs, haKey)+
		"rules:\n  - {name: http, match: {host: 127.0.0.1}, class: bench, charge: {calls: 1}}\n")
	if err != nil {
		return nil, err
	}
	l.stops = append(l.stops, sc.stop)
	c, err := governor.Dial(context.Background(), governor.WithAddr(addrs), governor.WithAPIKey(haKey))
	if err != nil {
		return nil, err
	}
	l.stops = append(l.stops, func() { c.Close() })
	ctx, task, _, err := c.FindOrCreateTask(context.Background(), governor.Spec{Name: "sdk"})
	if err != nil {
		return nil, err
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	l.stops = append(l.stops, func() { close(stop); wg.Wait() })
	proxyURL, _ := url.Parse("http://" + sc.addr)
	hc := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL)}, Timeout: 5 * time.Second}
	wg.Add(2)
	go func() {
		defer wg.Done()
		for running(stop) {
			r, err := hc.Get("http://" + originAddr + "/")
			if err == nil {
				io.Copy(io.Discard, r.Body)
				r.Body.Close()
				if r.StatusCode == http.StatusOK {
					l.viaSidecar.Store(time.Now().UnixNano())
				}
			}
		}
	}()
	go func() {
		defer wg.Done()
		for running(stop) {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			if err := task.Consume(cctx, "calls", 1); err == nil {
				l.viaSDK.Store(time.Now().UnixNano())
			} else {
				l.lastSDKErr.Store(err.Error())
			}
			cancel()
		}
	}()
	return l, nil
}

// running reports whether stop is still open.
func running(stop <-chan struct{}) bool {
	select {
	case <-stop:
		return false
	default:
		return true
	}
}

// killLeader kills the leader with SIGKILL, starts it again (as a
// standby), and times the first success through the sidecar and through
// the SDK after the kill, and the new leader's /readyz.
func killLeader(nodes []*hacluster.Member, load *failoverLoad) (haFailover, error) {
	leader, err := hacluster.Leader(nodes, time.Minute)
	if err != nil {
		return haFailover{}, err
	}
	killed := time.Now()
	leader.Kill()
	if err := leader.Start(); err != nil {
		return haFailover{}, err
	}
	var f haFailover
	deadline := time.Now().Add(time.Minute)
	for f.Sidecar == 0 || f.SDK == 0 || f.Leads == 0 {
		if time.Now().After(deadline) {
			return f, fmt.Errorf("no success within a minute: %+v (the SDK's last error: %v)\n%s:\n%s\n%s:\n%s", f, load.lastSDKErr.Load(),
				nodes[0].Config, nodes[0].Tail(15), nodes[1].Config, nodes[1].Tail(15))
		}
		if t := load.viaSidecar.Load(); f.Sidecar == 0 && t > killed.UnixNano() {
			f.Sidecar = time.Duration(t - killed.UnixNano())
		}
		if t := load.viaSDK.Load(); f.SDK == 0 && t > killed.UnixNano() {
			f.SDK = time.Duration(t - killed.UnixNano())
		}
		if f.Leads == 0 {
			for _, nd := range nodes {
				if nd.Leads() { // the restarted one may win again
					f.Leads = time.Since(killed)
				}
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	return f, nil
}

// reportFailovers prints each timing's median and maximum.
func reportFailovers(w io.Writer, res []haFailover) {
	row := func(name string, pick func(haFailover) time.Duration) {
		var d []time.Duration
		for _, f := range res {
			d = append(d, pick(f))
		}
		slices.Sort(d)
		fmt.Fprintf(w, "  %-46s median %7v   max %7v\n", name, d[len(d)/2].Round(time.Millisecond), d[len(d)-1].Round(time.Millisecond))
	}
	row("kill to the new leader's /readyz", func(f haFailover) time.Duration { return f.Leads })
	row("kill to the first consume via the SDK", func(f haFailover) time.Duration { return f.SDK })
	row("kill to the first request via the sidecar", func(f haFailover) time.Duration { return f.Sidecar })
}

// standbys measures consumes per second at the leader with 0, 1 and 2
// standbys following, interleaved round by round.
func (b *haBench) standbys(dsn string, rounds, clients int, d time.Duration) (map[int][]float64, error) {
	dsn, err := freshSchema(dsn, "standbys")
	if err != nil {
		return nil, err
	}
	leader, err := b.node(dsn, "leader")
	if err != nil {
		return nil, err
	}
	defer leader.Stop()
	if _, err := hacluster.Leader([]*hacluster.Member{leader}, time.Minute); err != nil {
		return nil, err
	}
	tasks, closeClients, err := consumerTasks(leader.Addr, clients)
	defer closeClients()
	if err != nil {
		return nil, err
	}
	set := &standbySet{b: b, dsn: dsn}
	defer set.resize(0)
	res := map[int][]float64{}
	// CPU used meanwhile, in cores: the leader's and each standby's (the
	// machine's cores are shared by all of them, the clients and PostgreSQL).
	leaderCPU, standbyCPU := map[int][]float64{}, map[int][]float64{}
	fmt.Fprintf(b.stdout, "standbys: consumes/s at the leader, %d clients, %v per measurement, %d rounds\n", clients, d, rounds)
	for r := 0; r < rounds; r++ {
		for _, k := range []int{0, 1, 2} {
			if err := set.resize(k); err != nil {
				return nil, err
			}
			l0, s0 := cpuOf(leader.Pid()), set.cpu()
			res[k] = append(res[k], consumeFor(tasks, d))
			leaderCPU[k] = append(leaderCPU[k], (cpuOf(leader.Pid())-l0).Seconds()/d.Seconds())
			if k > 0 {
				standbyCPU[k] = append(standbyCPU[k], (set.cpu()-s0).Seconds()/d.Seconds()/float64(k))
			}
		}
	}
	reportStandbys(b.stdout, res, leaderCPU, standbyCPU)
	return res, nil
}

// consumerTasks opens n SDK clients at addr, each with a task of its own.
func consumerTasks(addr string, n int) ([]*governor.Task, func(), error) {
	var cs []*governor.Client
	closeAll := func() {
		for _, c := range cs {
			c.Close()
		}
	}
	var tasks []*governor.Task
	for i := 0; i < n; i++ {
		c, err := governor.Dial(context.Background(), governor.WithAddr(addr), governor.WithAPIKey(haKey))
		if err != nil {
			return nil, closeAll, err
		}
		cs = append(cs, c)
		_, t, _, err := c.FindOrCreateTask(context.Background(), governor.Spec{Name: fmt.Sprint("c", i)})
		if err != nil {
			return nil, closeAll, err
		}
		tasks = append(tasks, t)
	}
	return tasks, closeAll, nil
}

// consumeFor has every task consume as fast as it can for d and returns
// the consumes a second.
func consumeFor(tasks []*governor.Task, d time.Duration) float64 {
	var n atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wg sync.WaitGroup
	for _, t := range tasks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if t.Consume(ctx, "calls", 1) == nil {
					n.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return float64(n.Load()) / d.Seconds()
}

// standbySet is the standbys following the leader, started and stopped
// to a number.
type standbySet struct {
	b     *haBench
	dsn   string
	nodes []*hacluster.Member
}

// resize stops or starts standbys until k follow.
func (s *standbySet) resize(k int) error {
	for len(s.nodes) > k {
		s.nodes[len(s.nodes)-1].Stop()
		s.nodes = s.nodes[:len(s.nodes)-1]
	}
	for len(s.nodes) < k {
		n, err := s.b.node(s.dsn, fmt.Sprint("standby", len(s.nodes)))
		if err != nil {
			return err
		}
		s.nodes = append(s.nodes, n)
		if err := n.StandingBy(time.Minute); err != nil {
			return err
		}
	}
	return nil
}

// cpu is the CPU time the standbys have used.
func (s *standbySet) cpu() time.Duration {
	var t time.Duration
	for _, n := range s.nodes {
		t += cpuOf(n.Pid())
	}
	return t
}

// reportStandbys prints each number of standbys' median rate against
// none, with the CPU the leader and each standby used.
func reportStandbys(w io.Writer, res, leaderCPU, standbyCPU map[int][]float64) {
	base := median(res[0])
	for _, k := range []int{0, 1, 2} {
		m := median(res[k])
		fmt.Fprintf(w, "  %d standbys: median %8.0f/s  (%+.1f%%)  rounds %s; leader %.2f cores", k, m, (m/base-1)*100, fmtRates(res[k]), median(leaderCPU[k]))
		if k > 0 {
			fmt.Fprintf(w, ", each standby %.2f cores", median(standbyCPU[k]))
		}
		fmt.Fprintln(w)
	}
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func fmtRates(v []float64) string {
	var parts []string
	for _, x := range v {
		parts = append(parts, fmt.Sprintf("%.0f", x))
	}
	return strings.Join(parts, " ")
}
