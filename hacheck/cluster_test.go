package hacheck

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/governor-project/governor/internal/faultproxy"
	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/internal/hacluster"
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

// node is one member of the cluster (internal/hacluster) with the TCP
// proxy between it and PostgreSQL, through which faults are injected.
type node struct {
	*hacluster.Member
	proxy *faultproxy.Proxy
}

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
	proxy := faultproxy.New(ln, u.Host)
	t.Cleanup(func() { proxy.Close() })
	u.Host = proxy.Addr()
	m, err := hacluster.Start(hacluster.Spec{Bin: bin, Dir: t.TempDir(), Name: name, DSN: u.String(), Lease: lease, Drift: drift, Env: env,
		More: fmt.Sprintf("session_ttl: %s\nadmin_key: %s\nroot:\n  limits: {%s: 1}\ntenants:\n  - {name: payments, api_key: %s%s}\n",
			sessionTTL, adminKey, lockClass, tenantKey, tenant)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		m.Kill()
		if t.Failed() {
			t.Logf("governord %s's log (the last 40 lines):\n%s", m.Name, m.Tail(40))
		}
	})
	return &node{Member: m, proxy: proxy}
}

// buildGovernord builds the daemon once per test binary.
func buildGovernord() (string, error) { return govtest.Build("cmd/governord") }
