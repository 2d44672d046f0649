package proxy

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/internal/logline"
)

// A fleet is what delegated budgets are for: several governor-proxy
// processes, each a worker's sidecar, sharing one governord process. These
// helpers build both binaries once and start them as an operator would,
// from config files.

// buildSidecar builds governor-proxy once per test run.
func buildSidecar(t *testing.T) string { return govtest.Binary(t, "cmd/governor-proxy") }

// govProc is a governord process.
type govProc struct {
	t       *testing.T
	dir     string
	cfgPath string
	addr    string
	metrics string
	proc    *child
	// store is what the config says of the store (and of ha); standby
	// says that ha is on, so that the process starts as a standby.
	store   string
	standby bool
}

// startGovProc starts governord with the given config (:0 listeners,
// admin_key and a SQLite store are added) and waits until it is ready. Its
// addresses are read from its log, so no port is picked ahead and raced for.
func startGovProc(t *testing.T, yaml string) *govProc {
	t.Helper()
	g := &govProc{t: t, dir: t.TempDir()}
	g.store = fmt.Sprintf("store: {driver: sqlite, dsn: %s}\n", filepath.Join(g.dir, "governor.db"))
	g.launch(yaml)
	return g
}

// startHAGovProc starts governord with ha on (lease and drift allowance
// as given) over the PostgreSQL dsn, with the given config added, and
// waits until it stands by: it leads once it wins the election.
func startHAGovProc(t *testing.T, dsn string, lease, drift time.Duration, yaml string) *govProc {
	t.Helper()
	g := &govProc{t: t, dir: t.TempDir(), standby: true}
	g.store = fmt.Sprintf("store: {driver: postgres, dsn: %q}\nha: {enabled: true, lease: %s, drift_allowance: %s}\n", dsn, lease, drift)
	g.launch(yaml)
	return g
}

func (g *govProc) launch(yaml string) {
	g.t.Helper()
	g.cfgPath = filepath.Join(g.dir, "governor.yaml")
	g.write("127.0.0.1:0", "127.0.0.1:0", yaml)
	g.start()
	// A restart must come back on the same addresses.
	g.write(g.addr, g.metrics, yaml)
}

func (g *govProc) write(listen, metrics, yaml string) {
	text := fmt.Sprintf("listen: %s\nmetrics_listen: %s\nadmin_key: %s\n", listen, metrics, adminKey) + g.store + yaml
	must(g.t, os.WriteFile(g.cfgPath, []byte(text), 0o600))
}

func (g *govProc) start() {
	g.t.Helper()
	g.proc = startChild(g.t, "governord", exec.Command(buildGovernord(g.t), "-config", g.cfgPath))
	up := "governord ready"
	if g.standby {
		up = "governord standing by"
	}
	line := g.proc.logLine(g.t, up)
	g.addr, g.metrics = line["listen"].(string), line["metrics"].(string)
}

// kill stops governord with SIGKILL, as a crash does.
func (g *govProc) kill() {
	g.proc.cmd.Process.Kill()
	<-g.proc.exited
	g.proc.exited <- nil
}

// sidecarProc is a governor-proxy process.
type sidecarProc struct {
	http, metrics, pg string
	proc              *child
}

// startSidecarProc starts governor-proxy for task with the given API key,
// its HTTP and metrics listeners on :0, and yaml added to its config
// (rules:, delegation:, pgwire: with "listen: PG" for a listener on :0), and
// waits until it is ready. Its addresses are read from its log.
func startSidecarProc(t *testing.T, g *govProc, key, task, yaml string) *sidecarProc {
	t.Helper()
	return startSidecarProcAt(t, g.addr, key, task, yaml)
}

// startSidecarProcAt is startSidecarProc for governord at addr, which may
// list several (governords with standbys).
func startSidecarProcAt(t *testing.T, addr, key, task, yaml string) *sidecarProc {
	t.Helper()
	text := fmt.Sprintf("governor: {addr: %q, api_key: %s}\ntask: {name: %s}\nmetrics_listen: 127.0.0.1:0\n", addr, key, task)
	if !strings.Contains(yaml, "\nhttp:") && !strings.HasPrefix(yaml, "http:") {
		text += "http: {listen: 127.0.0.1:0, allow_targets: [localhost], connect_ports: [1-65535], shutdown_timeout: 2s}\n"
	}
	text += strings.ReplaceAll(yaml, "listen: PG", "listen: 127.0.0.1:0")
	cfgPath := filepath.Join(t.TempDir(), "proxy.yaml")
	must(t, os.WriteFile(cfgPath, []byte(text), 0o600))
	cmd := exec.Command(buildSidecar(t), "-config", cfgPath)
	cmd.Env = append(os.Environ(), "HTTP_PROXY=", "HTTPS_PROXY=", "http_proxy=", "https_proxy=")
	s := &sidecarProc{proc: startChild(t, "governor-proxy "+task, cmd)}
	line := s.proc.logLine(t, "governor-proxy listening")
	s.http, s.metrics = line["http"].(string), line["metrics"].(string)
	if pg, _ := line["pgwire"].([]any); len(pg) > 0 {
		s.pg = pg[0].(string)
	}
	eventually(t, "governor-proxy's /readyz", func() bool { return ready(s.metrics) })
	return s
}

// logLine waits for the child's JSON log line whose msg is msg, and
// returns it.
func (c *child) logLine(t *testing.T, msg string) map[string]any {
	t.Helper()
	var found map[string]any
	eventually(t, c.name+"'s "+strconv.Quote(msg), func() bool {
		var ok bool
		found, ok = logline.Find(c.logs.String(), msg)
		return ok
	})
	return found
}

// client is an HTTP client that uses the sidecar, with its own connections.
func (s *sidecarProc) client(t *testing.T) *http.Client {
	tr := &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: s.http}), MaxIdleConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: waitFor}
}

// metric reads one series from the sidecar's /metrics; 0 when absent.
func (s *sidecarProc) metric(t *testing.T, series string) float64 {
	return scrape(t, s.metrics, series)
}

func ready(addr string) bool {
	r, err := noProxyClient.Get("http://" + addr + "/readyz")
	if err != nil {
		return false
	}
	r.Body.Close()
	return r.StatusCode == 200
}

// scrape reads one series of a /metrics endpoint; 0 when absent.
func scrape(t *testing.T, addr, series string) float64 { return govtest.Scrape(t, addr, series) }

// meter is an origin that counts the requests it serves, in all and by a
// header, and how many it serves at once.
type meter struct {
	mu       sync.Mutex
	inFlight int
	max      int
	served   int
	by       map[string]int
	delay    time.Duration
}

func (m *meter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m.mu.Lock()
	m.inFlight++
	m.served++
	m.max = max(m.max, m.inFlight)
	if m.by == nil {
		m.by = map[string]int{}
	}
	m.by[r.Header.Get("X-Tenant")]++
	delay := m.delay
	m.mu.Unlock()
	time.Sleep(delay)
	m.mu.Lock()
	m.inFlight--
	m.mu.Unlock()
	io := "ok"
	w.Header().Set("Content-Length", strconv.Itoa(len(io)))
	w.Write([]byte(io))
}

func (m *meter) stats() (served, maxInFlight int, by map[string]int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]int{}
	for k, v := range m.by {
		out[k] = v
	}
	return m.served, m.max, out
}

func (m *meter) setDelay(d time.Duration) {
	m.mu.Lock()
	m.delay = d
	m.mu.Unlock()
}

// originURL is the meter's URL by IP, which a sidecar process can resolve.
func originURL(t *testing.T, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}
