package proxy

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The real governord binary, as an operator runs it: built once, started
// with a config file and a SQLite store, stopped with SIGTERM.

var (
	buildOnce   sync.Once
	buildDir    string
	governordEx string
	buildErr    error
)

func buildGovernord(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "governor-proxy-test-")
		if buildErr != nil {
			return
		}
		governordEx = filepath.Join(buildDir, "governord")
		goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
		if _, err := os.Stat(goTool); err != nil {
			goTool = "go"
		}
		out, err := exec.Command(goTool, "build", "-o", governordEx, "../cmd/governord").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build ../cmd/governord: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return governordEx
}

// freePort picks a port for a daemon that does not report the one it bound.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

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
	logs := &logBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	must(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("governord log:\n%s", logs.String())
		}
	})

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
	must(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("governord exited with %v", err)
		}
	case <-time.After(waitFor):
		t.Fatal("governord did not stop on SIGTERM")
	}
	exited <- nil // for the cleanup
	resp, err := c.Get(hostURL(o, "origin.test") + "/")
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp)
	if resp.StatusCode != 503 || resp.Header.Get(HeaderDenied) != "unavailable" || resp.Header.Get("Retry-After") == "" {
		t.Errorf("with governord stopped: %d %v %q", resp.StatusCode, resp.Header, body)
	}
	_, _, cresp := connect(t, p.Addr(), "origin.test:"+port(o), "")
	if cresp.Status != "503 Governor unavailable" || cresp.Header.Get(HeaderDenied) != "unavailable" {
		t.Errorf("CONNECT with governord stopped: %q %v", cresp.Status, cresp.Header)
	}
}
