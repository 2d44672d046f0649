package proxy

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/proxy/httpproxy"
)

// The real governord binary, as an operator runs it: built once, started
// with a config file and a SQLite store, stopped with SIGTERM.

func buildGovernord(t *testing.T) string { return govtest.Binary(t, "cmd/governord") }

// freePort picks a port for a daemon that does not report the one it bound.
func freePort(t *testing.T) string { return govtest.FreeAddr(t) }

func TestAgainstTheGovernordProcess(t *testing.T) {
	bin := buildGovernord(t)
	dir := t.TempDir()
	addr := freePort(t)
	cfg := fmt.Sprintf(`listen: %s
metrics_listen: ""
session_ttl: 2s
admin_key: %s
store: {driver: sqlite, dsn: %s}
tenants:
  - {name: payments, api_key: %s, limits: {llm: 1}}
`, addr, adminKey, filepath.Join(dir, "governor.db"), tenantKey)
	cfgPath := filepath.Join(dir, "governor.yaml")
	must(t, os.WriteFile(cfgPath, []byte(cfg), 0o600))
	cmd := exec.Command(bin, "-config", cfgPath)
	child := startChild(t, "governord", cmd)

	o := origin(t, http.HandlerFunc(hello), false, false)
	// Ready (the proxy's first session) is the signal that governord is up:
	// the SDK keeps dialing while it starts.
	p := startProxy(t, proxyOpts{gaddr: addr, yaml: `
task: {name: pod-7, quotas: {llm_calls: 2}}
rules:
  - {name: llm, match: {host: origin.test}, class: llm, charge: {llm_calls: 1}}
`})
	c := p.client("crawl-1", nil)
	codes := []int{}
	for range 3 {
		resp, err := c.Get(hostURL(o, "origin.test") + "/")
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
		codes = append(codes, resp.StatusCode)
	}
	if fmt.Sprint(codes) != "[200 200 429]" {
		t.Errorf("a quota of 2 through the governord process: %v", codes)
	}
	child.stop(t)
	resp, err := c.Get(hostURL(o, "origin.test") + "/")
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp)
	if resp.StatusCode != 503 || resp.Header.Get(httpproxy.HeaderDenied) != "unavailable" || resp.Header.Get("Retry-After") == "" {
		t.Errorf("with governord stopped: %d %v %q", resp.StatusCode, resp.Header, body)
	}
	_, _, cresp := connect(t, p.Addr(), "origin.test:"+port(o), "")
	if cresp.Status != "503 Governor unavailable" || cresp.Header.Get(httpproxy.HeaderDenied) != "unavailable" {
		t.Errorf("CONNECT with governord stopped: %q %v", cresp.Status, cresp.Header)
	}
}

// child is a process a test started; it is killed at cleanup and its log
// shown if the test failed.
type child struct {
	name   string
	cmd    *exec.Cmd
	logs   *govtest.LogBuffer
	exited chan error
}

func startChild(t *testing.T, name string, cmd *exec.Cmd) *child {
	t.Helper()
	c := &child{name: name, cmd: cmd, logs: &govtest.LogBuffer{}, exited: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = c.logs, c.logs
	must(t, cmd.Start())
	go func() { c.exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-c.exited
		if t.Failed() {
			t.Logf("%s log:\n%s", name, c.logs.String())
		}
	})
	return c
}

// stop sends SIGTERM and requires a clean exit.
func (c *child) stop(t *testing.T) {
	t.Helper()
	must(t, c.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-c.exited:
		if err != nil {
			t.Fatalf("%s exited with %v", c.name, err)
		}
	case <-time.After(waitFor):
		t.Fatal(c.name + " did not stop on SIGTERM")
	}
	c.exited <- nil // for the cleanup
}
