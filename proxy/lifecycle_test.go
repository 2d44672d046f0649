package proxy

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/proxy/httpproxy"
	"github.com/governor-project/governor/proxy/proxyconfig"
	"github.com/governor-project/governor/server/serverconfig"
)

// configMap lays a file out as a Kubernetes ConfigMap volume does:
// proxy.yaml -> ..data/proxy.yaml, ..data -> ..<version>. An update writes a
// new version directory and swaps ..data with a rename.
type configMap struct {
	t       *testing.T
	dir     string
	version int
}

func newConfigMap(t *testing.T) *configMap {
	return &configMap{t: t, dir: t.TempDir()}
}

func (m *configMap) path() string { return filepath.Join(m.dir, "proxy.yaml") }

func (m *configMap) write(text string) {
	m.t.Helper()
	m.version++
	v := fmt.Sprintf("..2026_01_01_00_00_%02d", m.version)
	must(m.t, os.Mkdir(filepath.Join(m.dir, v), 0o755))
	must(m.t, os.WriteFile(filepath.Join(m.dir, v, "proxy.yaml"), []byte(text), 0o644))
	tmp := filepath.Join(m.dir, "..data_tmp")
	must(m.t, os.Symlink(v, tmp))
	must(m.t, os.Rename(tmp, filepath.Join(m.dir, "..data")))
	if m.version == 1 {
		must(m.t, os.Symlink(filepath.Join("..data", "proxy.yaml"), m.path()))
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestReloadKeepsOldRulesOnABrokenFile(t *testing.T) {
	g := startGovernord(t, nil)
	var newConns atomic.Int64
	o := httptest.NewUnstartedServer(http.HandlerFunc(hello))
	o.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			newConns.Add(1)
		}
	}
	o.Start()
	t.Cleanup(o.Close)
	head := fmt.Sprintf("governor: {addr: %q, api_key: %s}\ntask: {name: pod-7}\nhttp: {listen: 127.0.0.1:0, allow_targets: [localhost]}\nmetrics_listen: 127.0.0.1:0\n", g.Addr(), tenantKey)
	rules := func(resource string) string {
		return head + fmt.Sprintf("rules:\n  - {name: api, match: {host: origin.test}, class: api, charge: {%s: 1}}\n", resource)
	}
	cm := newConfigMap(t)
	cm.write(rules("v1"))
	reloads := make(chan error, 10)
	cfg, err := proxyconfig.LoadConfig(cm.path())
	if err != nil {
		t.Fatal(err)
	}
	w := startProxyFromConfig(t, cfg, func(o *Options) {
		o.ReloadInterval = 10 * time.Millisecond
		o.OnReload = func(err error) { reloads <- err }
	})
	a := newAdmin(t, g.Addr())
	c := w.client("", nil)
	reused := 0
	get := func() {
		t.Helper()
		trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) {
			if i.Reused {
				reused++
			}
		}}
		req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), http.MethodGet, hostURL(o, "origin.test")+"/", nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
	}
	used := func(r string) int64 { w.settle(); return a.node("payments", "pod-7").GetUsed()[r] }
	get()
	if used("v1") != 1 {
		t.Fatalf("v1 used %d", used("v1"))
	}

	cm.write(head + "rules:\n  - {name: api, match: {host: origin.test, method: FETCH}}\n")
	select {
	case err := <-reloads:
		if err == nil || !strings.Contains(err.Error(), "match.method") {
			t.Fatalf("reload of a broken file: %v", err)
		}
	case <-time.After(waitFor):
		t.Fatal("the broken file was not noticed")
	}
	get()
	if used("v1") != 2 {
		t.Errorf("after a broken reload, v1 used %d, want 2: the old rules stay", used("v1"))
	}
	if got := w.metric(`governor_proxy_rule_reloads_total{outcome="failure"}`); got != 1 {
		t.Errorf("failed reloads counted: %v", got)
	}

	cm.write(rules("v2"))
	select {
	case err := <-reloads:
		if err != nil {
			t.Fatalf("reload of a good file: %v", err)
		}
	case <-time.After(waitFor):
		t.Fatal("the new file was not noticed")
	}
	get()
	if used("v2") != 1 || used("v1") != 2 {
		t.Errorf("after a good reload: v1 %d, v2 %d; want 2 and 1", used("v1"), used("v2"))
	}
	if reused != 2 || newConns.Load() != 1 {
		t.Errorf("connections: the client reused %d of 3 requests, the origin saw %d new connections; a reload must drop none", reused, newConns.Load())
	}
}

func startProxyFromConfig(t *testing.T, cfg proxyconfig.Config, edit func(*Options)) *testProxy {
	t.Helper()
	logs := &govtest.LogBuffer{}
	opts := Options{Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})), Resolver: testHosts}
	if edit != nil {
		edit(&opts)
	}
	p, err := Start(context.Background(), cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Close()
		if t.Failed() {
			t.Logf("proxy log:\n%s", logs.String())
		}
	})
	select {
	case <-p.Ready():
	case <-time.After(waitFor):
		t.Fatal("no session")
	}
	return &testProxy{Sidecar: p, t: t, logs: logs}
}

func TestShutdownFinishesInFlightAndReleasesEverything(t *testing.T) {
	g := startGovernord(t, nil)
	arrived, gate := make(chan struct{}, 1), make(chan struct{})
	o := origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			arrived <- struct{}{}
			<-gate
		}
		hello(w, r)
	}), false, false)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: `
rules:
  - {name: any, class: api}
`})
	a := newAdmin(t, g.Addr())
	held := func() int64 { return a.node("payments", "pod-7").GetHeld()["api"] }
	c := p.client("", nil)
	done := make(chan string, 1)
	go func() {
		resp, err := c.Get(hostURL(o, "origin.test") + "/slow")
		if err != nil {
			done <- err.Error()
			return
		}
		done <- fmt.Sprint(resp.StatusCode, " ", readAll(t, resp))
	}()
	<-arrived
	tunnel, br, resp := connect(t, p.Addr(), "origin.test:"+port(o), "")
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %s", resp.Status)
	}
	if held() != 2 {
		t.Fatalf("held: %d, want 2 (a request and a tunnel)", held())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	stopped := make(chan error, 1)
	go func() { stopped <- p.Shutdown(ctx) }()
	eventually(t, "/readyz to say stopping", func() bool {
		r, err := noProxyClient.Get("http://" + p.MetricsAddr() + "/readyz")
		if err != nil {
			return false
		}
		return r.StatusCode == 503 && strings.Contains(readAll(t, r), "stopping")
	})
	close(gate) // the request in flight finishes
	if got := <-done; got != "200 hello" {
		t.Errorf("the request in flight at shutdown: %q", got)
	}
	// The tunnel outlives the shutdown timeout and is closed then.
	tunnel.SetReadDeadline(time.Now().Add(waitFor))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Errorf("the tunnel at the shutdown timeout: %v, want EOF", err)
	}
	if err := <-stopped; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		t.Errorf("the proxy still accepts connections after Shutdown")
	}
	if h := held(); h != 0 {
		t.Errorf("held after Shutdown: %d", h)
	}
}

func TestSessionLostFailsClosedThenRedials(t *testing.T) {
	g := startGovernord(t, nil)
	addr := g.Addr()
	o := origin(t, http.HandlerFunc(hello), false, false)
	p := startProxy(t, proxyOpts{gaddr: addr, yaml: `
rules:
  - {name: api, class: api, charge: {calls: 1}}
`, opts: func(o *Options) {
		o.GovernorOptions = []governor.Option{governor.WithTTL(500 * time.Millisecond)}
	}})
	c := p.client("crawl-1", nil)
	get := func() *http.Response {
		resp, err := c.Get(hostURL(o, "origin.test") + "/")
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
		return resp
	}
	if r := get(); r.StatusCode != 200 {
		t.Fatalf("before: %d", r.StatusCode)
	}
	g.Close()
	// What the sidecar holds covers requests until its local deadline;
	// then it fails closed.
	eventually(t, "requests to be denied", func() bool { return get().StatusCode == 503 })
	if r := get(); r.StatusCode != 503 || r.Header.Get(httpproxy.HeaderDenied) != "unavailable" {
		t.Fatalf("governord gone: %d %v", r.StatusCode, r.Header)
	}
	eventually(t, "the proxy to give the session up", func() bool { return p.metric("governor_proxy_session_up") == 0 })
	// A new governord on the same address, with a fresh memory store: the
	// proxy dials again and finds (creates) its task and subtask again.
	g2 := startGovernord(t, func(c *serverconfig.Config) { c.Listen = addr })
	eventually(t, "requests to be admitted again", func() bool { return get().StatusCode == 200 })
	a := newAdmin(t, g2.Addr())
	p.settle()
	if n := a.node("payments", "pod-7", "crawl-1"); n.GetUsed()["calls"] != 1 {
		t.Errorf("the new governord's crawl-1: %v", n)
	}
}
