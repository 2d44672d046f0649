package hacheck

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/governor-project/governor/internal/faultproxy"
	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/internal/pgtest"
)

// The cluster's settings: a short lease, so that failovers are quick, and
// a session TTL far longer than a failover, so that no session expires
// during one.
const (
	lease      = time.Second
	drift      = 100 * time.Millisecond
	sessionTTL = 20 * time.Second
	tenantKey  = "ha-checker-tenant-key"
	adminKey   = "ha-checker-admin-key"
	// lockClass is the limit-1 class whose leases the downstream judges.
	lockClass = "lock"
)

// pgServer is a PostgreSQL of the test's own (scripts/testpg-ctl.sh), so
// that restarting it touches no other test.
type pgServer struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines *bufio.Scanner
	dsn   string
}

func startPG(t *testing.T) *pgServer {
	t.Helper()
	pgtest.Base(t) // skips without a test PostgreSQL, as every PostgreSQL test does
	cmd := exec.Command("bash", filepath.Join("..", "scripts", "testpg-ctl.sh"))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &pgServer{cmd: cmd, stdin: stdin, lines: bufio.NewScanner(stdout)}
	t.Cleanup(func() {
		stdin.Close()
		cmd.Wait()
	})
	if !p.lines.Scan() || !strings.HasPrefix(p.lines.Text(), "dsn=") {
		t.Fatalf("testpg-ctl.sh did not start a server (%q)", p.lines.Text())
	}
	p.dsn = strings.TrimPrefix(p.lines.Text(), "dsn=")
	return p
}

// restart stops the server at once and starts it again.
func (p *pgServer) restart(t *testing.T) {
	t.Helper()
	if _, err := io.WriteString(p.stdin, "restart\n"); err != nil {
		t.Fatal(err)
	}
	if !p.lines.Scan() || p.lines.Text() != "restarted" {
		t.Fatalf("the PostgreSQL restart failed (%q)", p.lines.Text())
	}
}

// node is one governord process slot: its address, config and the TCP
// proxy between it and PostgreSQL. The process in it may be replaced.
type node struct {
	t       *testing.T
	name    string
	addr    string
	metrics string
	config  string
	env     []string
	proxy   *faultproxy.Proxy

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	logs   bytes.Buffer
}

func freeAddr(t *testing.T) string { return govtest.FreeAddr(t) }

func newNode(t *testing.T, bin, name, dsn string, env []string) *node {
	t.Helper()
	return newNodeWith(t, bin, name, dsn, env, "")
}

// newNodeWith is newNode with tenant, more keys of the tenant's mapping
// in the config (", quotas: {...}"), since the config is the source of
// truth for the tenant's caps on every start and takeover.
func newNodeWith(t *testing.T, bin, name, dsn string, env []string, tenant string) *node {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n := &node{t: t, name: name, addr: freeAddr(t), metrics: freeAddr(t), env: env, proxy: faultproxy.New(ln, u.Host)}
	t.Cleanup(func() { n.proxy.Close() })
	u.Host = n.proxy.Addr()
	n.config = filepath.Join(t.TempDir(), "governor.yaml")
	cfg := fmt.Sprintf(`listen: %s
metrics_listen: %s
session_ttl: %s
admin_key: %s
store: {driver: postgres, dsn: %q}
ha: {enabled: true, advertise_addr: %s, lease: %s, drift_allowance: %s}
root:
  limits: {%s: 1}
tenants:
  - {name: payments, api_key: %s%s}
`, n.addr, n.metrics, sessionTTL, adminKey, u.String(), n.addr, lease, drift, lockClass, tenantKey, tenant)
	if err := os.WriteFile(n.config, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	n.start(bin)
	t.Cleanup(func() {
		n.signal(syscall.SIGCONT)
		n.signal(syscall.SIGKILL)
		n.wait()
		if t.Failed() {
			n.mu.Lock()
			t.Logf("governord %s's log (the last 40 lines):\n%s", n.name, lastLines(n.logs.String(), 40))
			n.mu.Unlock()
		}
	})
	return n
}

func lastLines(s string, k int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-k):], "\n")
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// start starts a process in the slot; it stands by until it wins.
func (n *node) start(bin string) {
	cmd := exec.Command(bin, "-config", n.config)
	cmd.Env = append(os.Environ(), n.env...)
	cmd.Stderr = lockedWriter{&n.mu, &n.logs}
	if err := cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	n.mu.Lock()
	n.cmd, n.exited = cmd, exited
	n.mu.Unlock()
}

func (n *node) signal(sig syscall.Signal) {
	n.mu.Lock()
	cmd := n.cmd
	n.mu.Unlock()
	if cmd != nil {
		cmd.Process.Signal(sig)
	}
}

// running reports whether the slot's process still runs.
func (n *node) running() bool {
	n.mu.Lock()
	exited := n.exited
	n.mu.Unlock()
	select {
	case <-exited:
		return false
	default:
		return true
	}
}

// wait waits for the slot's process to exit.
func (n *node) wait() {
	n.mu.Lock()
	exited := n.exited
	n.mu.Unlock()
	<-exited
}

// leads reports whether the slot's process says it leads (/readyz).
func (n *node) leads() bool {
	c := http.Client{Timeout: 200 * time.Millisecond}
	resp, err := c.Get("http://" + n.metrics + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// buildGovernord builds the daemon once per test binary.
func buildGovernord() (string, error) { return govtest.Build("cmd/governord") }
