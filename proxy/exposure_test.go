package proxy

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/governor-project/governor/proxy/httpproxy"
	"github.com/governor-project/governor/proxy/proxyconfig"
)

// The HTTP side is not an open proxy: it listens off loopback only when the
// config opts in, and then only for clients that know its password; it
// refuses governord, itself and this host's loopback services as targets
// unless the config lists them; and it tunnels to port 443 only unless the
// config names others.

func TestListenOffLoopbackNeedsOptInAndPassword(t *testing.T) {
	for _, tc := range []struct{ http, key string }{
		{"{listen: 0.0.0.0:7700}", "http.listen"},
		{"{listen: \":7700\"}", "http.listen"},
		{"{listen: \"[::]:7700\"}", "http.listen"},
		{"{listen: 10.1.2.3:7700}", "http.listen"},
		{"{listen: pod.example:7700}", "http.listen"},
		{"{listen: 0.0.0.0:7700, password: pw}", "http.listen"},
		{"{listen: 0.0.0.0:7700, allow_remote_clients: true}", "http.password"},
		{"{listen: 0.0.0.0:7700, allow_remote_clients: true, password: ${UNSET_PROXY_PASSWORD}}", "http.password"},
		{"{allow_targets: [example.com]}", "http.allow_targets[0]"},
		{"{allow_targets: [\"127.0.0.1:0\"]}", "http.allow_targets[0]"},
		{"{connect_ports: [0]}", "http.connect_ports[0]"},
		{"{connect_ports: [443, 9-8]}", "http.connect_ports[1]"},
	} {
		_, err := proxyconfig.ParseConfig([]byte(minimal + "http: " + tc.http + "\n"))
		var ce *proxyconfig.ConfigError
		if !errors.As(err, &ce) || ce.Key != tc.key {
			t.Errorf("http: %s: got %v, want an error for %s", tc.http, err, tc.key)
		}
	}
	for _, h := range []string{"{listen: 127.0.0.1:7700}", "{listen: \"[::1]:7700\"}", "{listen: localhost:7700}",
		"{listen: 0.0.0.0:7700, allow_remote_clients: true, password: pw}"} {
		if _, err := proxyconfig.ParseConfig([]byte(minimal + "http: " + h + "\n")); err != nil {
			t.Errorf("http: %s: %v", h, err)
		}
	}
	cfg, err := proxyconfig.ParseConfig([]byte(minimal + "http: {allow_targets: [localhost, 10.0.0.0/8, \"127.0.0.1:5432\"], connect_ports: [443, 8443-8450]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.HTTP.AllowTargets) != 4 || fmt.Sprint(cfg.HTTP.ConnectPorts) != "[443 8443-8450]" {
		t.Errorf("allow_targets %v, connect_ports %v", cfg.HTTP.AllowTargets, cfg.HTTP.ConnectPorts)
	}
	if cfg, _ := proxyconfig.ParseConfig([]byte(minimal)); cfg.HTTP.ConnectPorts != nil || cfg.HTTP.AllowTargets != nil {
		t.Errorf("defaults: allow_targets %v, connect_ports %v; want none (443 only)", cfg.HTTP.AllowTargets, cfg.HTTP.ConnectPorts)
	}
}

// TestOpenProxyRefusedByTheBinary starts the real governor-proxy on an
// address other hosts reach, without opting in: it exits 2 naming the key,
// before it listens.
func TestOpenProxyRefusedByTheBinary(t *testing.T) {
	bin := buildSidecar(t)
	dir := t.TempDir()
	for _, tc := range []struct{ http, key string }{
		{"{listen: 0.0.0.0:0}", "http.listen"},
		{"{listen: 0.0.0.0:0, allow_remote_clients: true}", "http.password"},
	} {
		path := filepath.Join(dir, "proxy.yaml")
		must(t, os.WriteFile(path, []byte("governor: {api_key: k-0123456789abcdef}\ntask: {name: pod-7}\nhttp: "+tc.http+"\n"), 0o600))
		var stderr bytes.Buffer
		// A proxy that starts instead runs until it is killed, at 30s.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cmd := exec.CommandContext(ctx, bin, "-config", path)
		cmd.Stderr = &stderr
		err := cmd.Run()
		cancel()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(stderr.String(), "config: "+tc.key+": ") {
			t.Errorf("http: %s: %v\n%s", tc.http, err, stderr.String())
		}
	}
}

// TestProxyPassword: with a password in the config (from ${VAR}, with a
// ":" in it), a request without it, or with a wrong one, gets 407 and a
// Basic challenge, plain and CONNECT alike, and nothing reaches the
// origin; with it, the request goes through, charged to the subtask the
// username names, and the credentials go no further. curl answers the
// challenge as any client does.
func TestProxyPassword(t *testing.T) {
	const password = "s3cr#t: pass-0123456789"
	t.Setenv("PROXY_PASSWORD", password)
	g := startGovernord(t, nil)
	var served atomic.Int64
	var seenAuth atomic.Value
	seenAuth.Store("")
	o := origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		seenAuth.Store(r.Header.Get("Proxy-Authorization"))
		hello(w, r)
	}), false, false)
	tlsO := origin(t, http.HandlerFunc(hello), true, false)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: `
http: {listen: 0.0.0.0:0, allow_remote_clients: true, password: "${PROXY_PASSWORD}", allow_targets: [localhost], connect_ports: [1-65535]}
rules:
  - {name: api, match: {host: origin.test}, class: api, charge: {calls: 1}}
`})
	a := newAdmin(t, g.Addr())
	_, pport, _ := net.SplitHostPort(p.Addr())
	addr := "127.0.0.1:" + pport
	target := hostURL(o, "origin.test") + "/"
	for _, auth := range []string{"", "Basic " + basic("crawl-42"), "Basic " + base64.StdEncoding.EncodeToString([]byte("crawl-42:wrong")), "Bearer " + password} {
		resp, body := rawGet(t, addr, target, auth)
		if resp.StatusCode != http.StatusProxyAuthRequired || resp.Header.Get("Proxy-Authenticate") != `Basic realm="governor-proxy"` ||
			resp.Header.Get(httpproxy.HeaderDenied) != "proxy-auth" || !strings.Contains(body, "http.password") {
			t.Errorf("Proxy-Authorization %q: %d %v %q; want 407 with a Basic challenge", auth, resp.StatusCode, resp.Header, body)
		}
		_, _, cresp := connect(t, addr, "example.com:"+port(tlsO), "")
		if cresp.StatusCode != http.StatusProxyAuthRequired || cresp.Header.Get("Proxy-Authenticate") == "" {
			t.Errorf("CONNECT without the password: %s %v", cresp.Status, cresp.Header)
		}
	}
	if served.Load() != 0 {
		t.Fatalf("the origin served %d requests without the password", served.Load())
	}
	resp, body := rawGet(t, addr, target, "Basic "+base64.StdEncoding.EncodeToString([]byte("crawl-42:"+password)))
	if resp.StatusCode != 200 || body != "hello" {
		t.Fatalf("with the password: %d %q", resp.StatusCode, body)
	}
	if seenAuth.Load() != "" {
		t.Errorf("the origin got Proxy-Authorization %q", seenAuth.Load())
	}
	p.settle()
	if sub := a.node("payments", "pod-7", "crawl-42"); sub == nil || sub.GetUsed()["calls"] != 1 {
		t.Errorf("the subtask the username names: %v, want calls used 1", sub)
	}

	// curl, through the proxy, for a plain request and a tunnel; it sends
	// the credentials given with --proxy-user.
	ca := certFile(t, tlsO)
	for _, u := range []string{target, hostURL(tlsO, "example.com") + "/"} {
		args := []string{"-sS", "--max-time", "10", "--cacert", ca, "-x", "http://" + addr, "--resolve", "example.com:" + port(tlsO) + ":127.0.0.1",
			"-o", "/dev/null", "-w", "%{http_code} %{http_connect}", u}
		out, err := exec.Command("curl", args...).CombinedOutput()
		if !strings.HasPrefix(string(out), "407") && !strings.Contains(string(out), "407") {
			t.Errorf("curl %s without the password: %s %v", u, out, err)
		}
		out, err = exec.Command("curl", append([]string{"--proxy-user", "crawl-43:" + password}, args...)...).CombinedOutput()
		if err != nil || !strings.HasPrefix(string(out), "200") {
			t.Errorf("curl %s with the password: %s %v", u, out, err)
		}
	}
	if strings.Contains(p.logs.String(), password) || strings.Contains(p.logs.String(), "s3cr") {
		t.Errorf("the log shows the password:\n%s", p.logs.String())
	}
	if got := p.metric(`governor_proxy_denials_total{cause="proxy-auth"}`); got < 8 {
		t.Errorf("proxy-auth denials counted: %v, want 8 or more", got)
	}
}

// TestTargetsRefused: governord, the sidecar's own listeners (HTTP,
// metrics, pgwire) and loopback are refused as targets, by literal and by a
// name that resolves to them, before anything is charged for a literal;
// listing loopback lets it through but never governord; CONNECT reaches
// only the ports the config names.
func TestTargetsRefused(t *testing.T) {
	g := startGovernord(t, nil)
	var served atomic.Int64
	o := origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served.Add(1); hello(w, r) }), false, false)
	tlsO := origin(t, http.HandlerFunc(hello), true, false)
	rules := "\nrules:\n  - {name: any, class: api, charge: {calls: 1}}\n"
	strict := startProxy(t, proxyOpts{gaddr: g.Addr(), task: "pod-strict", yaml: "http: {listen: 127.0.0.1:0}" + rules})
	a := newAdmin(t, g.Addr())
	_, gport, _ := net.SplitHostPort(g.Addr())

	check := func(p *testProxy, target string, code int) {
		t.Helper()
		resp, body := rawGet(t, p.Addr(), target, "")
		if resp.StatusCode != code || resp.Header.Get(httpproxy.HeaderDenied) != "forbidden-target" ||
			!strings.Contains(body, `"cause":"forbidden-target"`) {
			t.Errorf("GET %s: %d %v %q; want %d forbidden-target", target, resp.StatusCode, resp.Header, body, code)
		}
	}
	const forbidden = http.StatusForbidden
	for _, target := range []string{"http://127.0.0.1:" + port(o) + "/", "http://localhost:" + port(o) + "/", "http://[::1]:" + port(o) + "/",
		"http://0.0.0.0:" + port(o) + "/", "http://" + g.Addr() + "/", "http://localhost:" + gport + "/"} {
		check(strict, target, forbidden)
	}
	strict.settle()
	if used := a.node("payments", "pod-strict").GetUsed()["calls"]; used != 0 {
		t.Errorf("calls charged for literal targets refused: %d, want 0", used)
	}
	// A name that resolves to loopback is refused where it is dialed.
	check(strict, hostURL(o, "origin.test")+"/", forbidden)
	if served.Load() != 0 {
		t.Fatalf("the loopback origin was reached %d times", served.Load())
	}
	for _, target := range []string{"origin.test:443", "127.0.0.1:443", g.Addr()} {
		_, _, resp := connect(t, strict.Addr(), target, "")
		if resp.StatusCode != 403 || resp.Header.Get(httpproxy.HeaderDenied) != "forbidden-target" {
			t.Errorf("CONNECT %s: %s %v, want 403 forbidden-target", target, resp.Status, resp.Header)
		}
	}
	// Only 443 by default: the tunnel to the origin's port is refused
	// before anything is looked up or charged, with the reason in the
	// status line.
	_, _, resp := connect(t, strict.Addr(), "example.com:"+port(tlsO), "")
	if resp.StatusCode != 403 || resp.Status != "403 Forbidden CONNECT port" || resp.Header.Get(httpproxy.HeaderDenied) != "forbidden-target" {
		t.Errorf("CONNECT to port %s: %s %v", port(tlsO), resp.Status, resp.Header)
	}
	if got := strict.metric(`governor_proxy_denials_total{cause="forbidden-target"}`); got != 11 {
		t.Errorf("forbidden-target denials counted: %v, want 11", got)
	}

	// Loopback listed, and the origin's port for CONNECT: the origins
	// work, governord still does not, and neither does the sidecar itself
	// on any of its listeners (508).
	open := startProxy(t, proxyOpts{gaddr: g.Addr(), task: "pod-open", yaml: fmt.Sprintf(`
http: {listen: 127.0.0.1:0, allow_targets: ["127.0.0.0/8"], connect_ports: [443, %s]}
pgwire:
  - {listen: 127.0.0.1:0, upstream: 127.0.0.1:1}`, port(tlsO)) + rules})
	if resp, body := rawGet(t, open.Addr(), hostURL(o, "origin.test")+"/", ""); resp.StatusCode != 200 || body != "hello" {
		t.Errorf("an allowed loopback origin: %d %q", resp.StatusCode, body)
	}
	c := open.client("", certPool(tlsO))
	if resp, err := c.Get(hostURL(tlsO, "example.com") + "/"); err != nil || readAll(t, resp) != "hello" {
		t.Errorf("a tunnel to a port connect_ports names: %v", err)
	}
	check(open, "http://"+g.Addr()+"/", forbidden)
	_, _, resp = connect(t, open.Addr(), "127.0.0.1:"+port(o), "")
	if resp.StatusCode != 403 || resp.Status != "403 Forbidden CONNECT port" {
		t.Errorf("CONNECT to a port connect_ports does not name: %s", resp.Status)
	}
	for _, self := range []string{open.Addr(), open.MetricsAddr(), open.PGWireAddrs()[0]} {
		check(open, "http://"+self+"/", http.StatusLoopDetected)
	}
}
