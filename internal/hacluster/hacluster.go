// Package hacluster runs governord with standbys (ha.enabled) as real
// processes over one PostgreSQL, for the HA checker (package hacheck) and
// the ha scenario of govbench: each Member is a slot on fixed addresses
// whose process may be killed, stopped and started again, and Leader finds
// the member that leads. It may import the standard library and
// internal/logline only.
package hacluster

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/governor-project/governor/internal/logline"
)

// Spec is one member's configuration.
type Spec struct {
	Bin  string // the governord binary
	Dir  string // a folder for the member's configuration file
	Name string // the member's name, and its configuration file's
	DSN  string // the PostgreSQL the members share
	// Lease and Drift are ha.lease and ha.drift_allowance; 0 leaves
	// governord's defaults.
	Lease, Drift time.Duration
	// More is the rest of the configuration (session_ttl, root, tenants,
	// ...), top-level YAML.
	More string
	// Env is more environment for the process.
	Env []string
}

// Member is one governord slot: its addresses and configuration stay, the
// process in it may be replaced (Start).
type Member struct {
	Name    string
	Addr    string // the gRPC listener, which it advertises as leader
	Metrics string // the metrics listener, which serves /readyz
	Config  string // the configuration file's path

	bin string
	env []string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	logs   bytes.Buffer // every process's output, in turn
}

// Start writes the member's configuration on two free addresses and
// starts its process, which stands by until it wins the leadership.
func Start(s Spec) (*Member, error) {
	addr, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	metrics, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	m := &Member{Name: s.Name, Addr: addr, Metrics: metrics, Config: filepath.Join(s.Dir, s.Name+".yaml"), bin: s.Bin, env: s.Env}
	if err := os.WriteFile(m.Config, []byte(config(s, addr, metrics)), 0o600); err != nil {
		return nil, err
	}
	return m, m.Start()
}

// config is a member's configuration file.
func config(s Spec, addr, metrics string) string {
	ha := "enabled: true, advertise_addr: " + addr
	if s.Lease > 0 {
		ha += ", lease: " + s.Lease.String()
	}
	if s.Drift > 0 {
		ha += ", drift_allowance: " + s.Drift.String()
	}
	return fmt.Sprintf("listen: %s\nmetrics_listen: %s\nstore: {driver: postgres, dsn: %q}\nha: {%s}\n%s",
		addr, metrics, s.DSN, ha, s.More)
}

// Start starts a process in the slot, whose last one must have exited;
// it stands by until it wins. The process is killed if this one dies.
func (m *Member) Start() error {
	cmd := exec.Command(m.bin, "-config", m.Config)
	cmd.Env = append(os.Environ(), m.env...)
	cmd.Stdout, cmd.Stderr = m, m
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start governord %s: %w", m.Name, err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	m.mu.Lock()
	m.cmd, m.exited = cmd, exited
	m.mu.Unlock()
	return nil
}

// Write keeps the process's output (Logs).
func (m *Member) Write(p []byte) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.logs.Write(p)
}

// Logs is what the slot's processes have written so far.
func (m *Member) Logs() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.logs.String()
}

// Tail is the last n lines of Logs.
func (m *Member) Tail(n int) string {
	lines := strings.Split(strings.TrimRight(m.Logs(), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// Signal sends sig to the slot's process.
func (m *Member) Signal(sig syscall.Signal) {
	m.mu.Lock()
	cmd := m.cmd
	m.mu.Unlock()
	if cmd != nil {
		cmd.Process.Signal(sig)
	}
}

// Pid is the slot's process's id.
func (m *Member) Pid() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cmd.Process.Pid
}

// Kill kills the slot's process, stopped or not, at once and waits for it.
func (m *Member) Kill() {
	m.Signal(syscall.SIGCONT)
	m.Signal(syscall.SIGKILL)
	m.Wait()
}

// Stop asks the slot's process to stop (SIGTERM), kills it after five
// seconds, and waits for it.
func (m *Member) Stop() {
	m.Signal(syscall.SIGTERM)
	select {
	case <-m.done():
	case <-time.After(5 * time.Second):
		m.Kill()
	}
}

func (m *Member) done() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.exited
}

// Wait waits for the slot's process to exit.
func (m *Member) Wait() { <-m.done() }

// Running reports whether the slot's process still runs.
func (m *Member) Running() bool {
	select {
	case <-m.done():
		return false
	default:
		return true
	}
}

// Leads reports whether the slot's process says it leads (/readyz).
func (m *Member) Leads() bool {
	c := http.Client{Timeout: 200 * time.Millisecond}
	resp, err := c.Get("http://" + m.Metrics + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// StandingBy waits until the slot's process logs that it stands by.
func (m *Member) StandingBy(within time.Duration) error {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if _, ok := logline.Find(m.Logs(), "governord standing by"); ok {
			return nil
		}
		if !m.Running() {
			return fmt.Errorf("governord %s exited:\n%s", m.Name, m.Tail(10))
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("governord %s did not stand by within %v:\n%s", m.Name, within, m.Tail(10))
}

// ErrNoLeader is Leader's error when no member led in time.
var ErrNoLeader = errors.New("no governord led")

// Leader waits until a running member leads and returns it.
func Leader(members []*Member, within time.Duration) (*Member, error) {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		for _, m := range members {
			if m.Running() && m.Leads() {
				return m, nil
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil, fmt.Errorf("%w within %v", ErrNoLeader, within)
}

// FreeAddr is a loopback address no one listened on a moment ago, for a
// process that must be told its address before it listens.
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
