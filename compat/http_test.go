package compat

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/internal/testcert"
	"github.com/governor-project/governor/proxy"
	"github.com/governor-project/governor/proxy/proxyconfig"
)

// originHost is the origins' name. Only the proxy's resolver knows it, so a
// client that ignores its proxy settings fails to resolve it instead of
// passing unproxied; and Go never proxies loopback names.
const originHost = "origin.test"

// The denial cells' origins, denied by host so that a client that tunnels
// plain HTTP through CONNECT (undici does) meets the same rules.
const quotaHost, slowHost = "quota.test", "slow.test"

// tunnelHost is denied on CONNECT: https:// through the proxy, as most
// production traffic is.
const tunnelHost = "quota-tunnel.test"

// uploadSize is what the chunked upload cell sends.
const uploadSize = 1 << 20

// originResolver is the proxy's resolver: origin.test, the denial cells'
// hosts and every host below intercept.test are this machine.
type originResolver struct{}

func (originResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	switch h := strings.ToLower(strings.TrimSuffix(host, ".")); {
	case h == originHost, h == quotaHost, h == slowHost, h == tunnelHost, strings.HasSuffix(h, "."+interceptDomain):
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// origin serves the cells: /hello, /upload, /sse with /sse-ack, and
// /slow-hold, which holds the only slow slot until the test ends.
type origin struct {
	mu     sync.Mutex
	acks   map[string]chan struct{}
	held   chan struct{}
	unhold chan struct{}
}

func (o *origin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/hello", "/secure": // /secure: the https cell's, for its own rule
		io.WriteString(w, "hello")
	case "/upload":
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		how := "with a Content-Length"
		if slices.Contains(r.TransferEncoding, "chunked") {
			how = "chunked"
		}
		w.Header().Set("Compat-Received-As", how)
		fmt.Fprintf(w, "received %d", n)
	case "/sse":
		o.sse(w, r)
	case "/sse-ack":
		o.mu.Lock()
		ack := o.acks[r.URL.Query().Get("id")]
		delete(o.acks, r.URL.Query().Get("id"))
		o.mu.Unlock()
		if ack == nil {
			http.NotFound(w, r)
			return
		}
		close(ack)
		io.WriteString(w, "ack")
	case "/slow-hold":
		o.held <- struct{}{}
		<-o.unhold
		io.WriteString(w, "released")
	default:
		http.NotFound(w, r)
	}
}

// sse sends the first event, and the second only once the client has asked
// for it at /sse-ack: a proxy that buffers the stream leaves the client
// waiting for the first one, and the cell fails.
func (o *origin) sse(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("id")
	ack := make(chan struct{})
	o.mu.Lock()
	o.acks[id] = ack
	o.mu.Unlock()
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	io.WriteString(w, "data: one\n\n")
	w.(http.Flusher).Flush()
	select {
	case <-ack:
		io.WriteString(w, "data: two\n\n")
	case <-time.After(waitFor):
		io.WriteString(w, "data: no ack\n\n")
	case <-r.Context().Done():
	}
}

// httpSetup is a sidecar in front of a plain and a TLS origin.
type httpSetup struct {
	proxy             *proxy.Sidecar
	httpURL, httpsURL string // the origins' bases, named originHost
	quotaURL, slowURL string // what the proxy denies: quota, and wait-timeout
	tunnelURL         string // an https URL whose CONNECT the proxy denies (quota)
	ca                string // the TLS origin's certificate
	tmp               string
}

func startHTTP(t *testing.T) *httpSetup {
	t.Helper()
	o := &origin{acks: map[string]chan struct{}{}, held: make(chan struct{}, 1), unhold: make(chan struct{})}
	plain := httptest.NewServer(o)
	t.Cleanup(plain.Close)
	cert := testcert.New(t, originHost)
	secure := httptest.NewUnstartedServer(o)
	secure.TLS = &tls.Config{Certificates: []tls.Certificate{cert.TLS}}
	secure.StartTLS()
	t.Cleanup(secure.Close)

	g := govtest.Start(t, nil)
	cfg, err := proxyconfig.ParseConfig(fmt.Appendf(nil, `
governor: {addr: %q, api_key: %s}
task: {name: compat-http, quotas: {never: 0}, limits: {slow: 1}}
http: {listen: 127.0.0.1:0, allow_targets: [localhost], connect_ports: [1-65535], wait_timeout: 300ms}
metrics_listen: 127.0.0.1:0
rules:
  - {name: quota, match: {host: %s}, charge: {never: 1}}
  - {name: slow, match: {host: %s}, class: slow}
  - {name: quota-tunnel, match: {host: %[6]s}, charge: {never: 1}}
  - {name: plain-hello, match: {host: %[5]s, path: /hello}, class: api, charge: {calls: 1}}
  - {name: plain-secure, match: {host: %[5]s, path: /secure}, class: api, charge: {calls: 1}}
  - {name: any, class: api, charge: {calls: 1}}
`, g.Addr(), govtest.TenantKey, quotaHost, slowHost, originHost, tunnelHost))
	if err != nil {
		t.Fatal(err)
	}
	p := startSidecar(t, cfg, proxy.Options{Resolver: originResolver{}})
	s := &httpSetup{proxy: p, httpURL: "http://" + originHost + ":" + portOf(plain.URL),
		httpsURL: "https://" + originHost + ":" + portOf(secure.URL), ca: cert.CertFile, tmp: t.TempDir(),
		quotaURL:  "http://" + quotaHost + ":" + portOf(plain.URL) + "/quota",
		slowURL:   "http://" + slowHost + ":" + portOf(plain.URL) + "/slow",
		tunnelURL: "https://" + tunnelHost + ":" + portOf(secure.URL) + "/secure"}

	// One request holds the only slow slot for the whole test, so that each
	// client's request for /slow waits wait_timeout and is denied.
	holder := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(s.proxyURL())}}
	holdDone := make(chan error, 1)
	go func() {
		resp, err := holder.Get(s.slowURL + "-hold")
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		holdDone <- err
	}()
	select {
	case <-o.held:
	case err := <-holdDone:
		t.Fatalf("the slot holder: %v", err)
	case <-time.After(waitFor):
		t.Fatal("the slot holder never reached the origin")
	}
	t.Cleanup(func() { close(o.unhold); <-holdDone; holder.CloseIdleConnections() })
	return s
}

func portOf(u string) string {
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(strings.TrimPrefix(u, "http://"), "https://"))
	return port
}

func (s *httpSetup) proxyURL() *url.URL { return &url.URL{Scheme: "http", Host: s.proxy.Addr()} }

// proxyEnv is the environment most clients read their proxy from: curl
// reads only the lower-case http_proxy, others either case.
func (s *httpSetup) proxyEnv() []string {
	u := s.proxyURL().String()
	return []string{"HTTP_PROXY=" + u, "http_proxy=" + u, "HTTPS_PROXY=" + u, "https_proxy=" + u, "NO_PROXY=", "no_proxy="}
}

// originEnv tells a client script where the origins are.
func (s *httpSetup) originEnv() []string {
	return []string{"COMPAT_HTTP_BASE=" + s.httpURL, "COMPAT_HTTPS_BASE=" + s.httpsURL, "COMPAT_CA=" + s.ca,
		"COMPAT_QUOTA_URL=" + s.quotaURL, "COMPAT_SLOW_URL=" + s.slowURL, "COMPAT_TUNNEL_URL=" + s.tunnelURL}
}

// denied is how many requests the proxy denied under rule, by its metrics.
func (s *httpSetup) denied(t *testing.T, rule string) float64 {
	return govtest.Scrape(t, s.proxy.MetricsAddr(), fmt.Sprintf(`governor_proxy_requests_total{outcome="denied",rule=%q}`, rule))
}

// cellTunnel is the column of the denied CONNECT.
const cellTunnel = "429 on CONNECT"

// tunnelErrorDetail says what an error raised for a denied CONNECT shows:
// the status, and the reason the proxy puts in the status line ("Governor
// quota ...") because most clients show only that line.
func tunnelErrorDetail(msg string) string {
	status, reason := strings.Contains(msg, "429"), strings.Contains(msg, "Governor")
	switch {
	case status && reason:
		return "raised an error that shows the status line (429 and the reason)"
	case status:
		return "raised an error that shows 429 but not the reason"
	case reason:
		return "raised an error that shows the reason but not 429"
	}
	return "raised an error that shows neither the status nor the reason"
}

// forwarded is how many requests the proxy forwarded under rule.
func (s *httpSetup) forwarded(t *testing.T, rule string) float64 {
	return govtest.Scrape(t, s.proxy.MetricsAddr(), fmt.Sprintf(`governor_proxy_requests_total{outcome="forwarded",rule=%q}`, rule))
}

// runClient runs one client's cells, adds "no retry" from the proxy's
// count of denied requests, and records the row.
func (s *httpSetup) runClient(t *testing.T, client string, run func(t *testing.T) (string, map[string]result)) {
	t.Helper()
	quota, slow, tunnel := s.denied(t, "quota"), s.denied(t, "slow"), s.denied(t, "quota-tunnel")
	plain, secure := s.forwarded(t, "plain-hello"), s.forwarded(t, "plain-secure")
	version, cells := run(t)
	quota, slow, tunnel = s.denied(t, "quota")-quota, s.denied(t, "slow")-slow, s.denied(t, "quota-tunnel")-tunnel
	plain, secure = s.forwarded(t, "plain-hello")-plain, s.forwarded(t, "plain-secure")-secure
	// The http and https cells' one request each reaches its path rule only
	// when sent as a proxy request with the whole URL; through a tunnel the
	// proxy sees the host and port alone.
	how := map[bool]string{true: "a proxy request with the whole URL (rules see the method and path)",
		false: "tunnelled through CONNECT (rules see only the host and port)"}
	for cell, n := range map[string]float64{"http": plain, "https": secure} {
		if r := cells[cell]; r.Result == "ok" {
			r.Detail = strings.TrimPrefix(r.Detail+"; "+how[n == 1], "; ")
			cells[cell] = r
		}
	}
	retry := result{Cell: "no retry", Result: "ok", Detail: "one request for each denial"}
	switch {
	case cells["429"].Result == "unsupported" && cells["503"].Result == "unsupported":
		retry = result{Cell: "no retry", Result: "skip", Detail: ""}
	case quota != 1 || slow != 1 || tunnel != 1:
		retry = result{Cell: "no retry", Result: "fail",
			Detail: fmt.Sprintf("the proxy denied %v quota, %v wait-timeout and %v CONNECT requests", quota, slow, tunnel)}
	}
	// A client's error message names ports and hosts: the doc keeps only
	// what it shows of the denial.
	if r := cells[cellTunnel]; r.Result == "error" {
		t.Logf("%s: the denied CONNECT raised: %s", client, r.Detail) // the raw message, for when a row changes
		r.Detail = tunnelErrorDetail(r.Detail)
		cells[cellTunnel] = r
	}
	cells["no retry"] = retry
	checkCells(t, client, httpClients.columns, cells)
	httpClients.record(&row{client: client, version: version, cells: cells})
}

func TestHTTPClients(t *testing.T) {
	enabled(t)
	s := startHTTP(t)
	env := append(s.proxyEnv(), s.originEnv()...)
	python := os.Getenv("COMPAT_PYTHON")
	if python == "" {
		python = "/usr/bin/python3"
	}
	script := func(env []string, name string, args ...string) func(*testing.T) (string, map[string]result) {
		return func(t *testing.T) (string, map[string]result) { return runScript(t, env, name, args...) }
	}
	t.Run("curl env", func(t *testing.T) {
		s.runClient(t, "curl, HTTP_PROXY/HTTPS_PROXY", func(t *testing.T) (string, map[string]result) {
			return s.curlCells(t, "curl-env", env, nil)
		})
	})
	t.Run("curl -x", func(t *testing.T) {
		s.runClient(t, "curl -x", func(t *testing.T) (string, map[string]result) {
			return s.curlCells(t, "curl-x", s.originEnv(), []string{"-x", s.proxyURL().String()})
		})
	})
	t.Run("requests", func(t *testing.T) {
		s.runClient(t, "Python requests", script(env, python, "python/http_clients.py", "requests"))
	})
	t.Run("urllib", func(t *testing.T) {
		s.runClient(t, "Python urllib", script(env, python, "python/http_clients.py", "urllib"))
	})
	nodeEnv := append(slices.Clone(env), "NODE_EXTRA_CA_CERTS="+s.ca)
	t.Run("undici", func(t *testing.T) {
		s.runClient(t, "Node fetch (undici EnvHttpProxyAgent)", script(nodeEnv, "node", "node/http_clients.js", "undici"))
	})
	t.Run("undici proxyTunnel false", func(t *testing.T) {
		s.runClient(t, "Node fetch (undici EnvHttpProxyAgent, proxyTunnel: false)", script(nodeEnv, "node", "node/http_clients.js", "undici-plain"))
	})
	t.Run("node builtin", func(t *testing.T) {
		s.runClient(t, "Node built-in fetch, no setting", script(append(nodeEnv, "NODE_USE_ENV_PROXY=1"), "node", "node/http_clients.js", "builtin"))
	})
	t.Run("axios", func(t *testing.T) {
		s.runClient(t, "axios", script(nodeEnv, "node", "node/http_clients.js", "axios"))
	})
	t.Run("java", func(t *testing.T) {
		host, port, _ := net.SplitHostPort(s.proxy.Addr())
		s.runClient(t, "Java HttpClient", script(s.originEnv(), "java", "-Dhttp.proxyHost="+host, "-Dhttp.proxyPort="+port,
			"-Dhttps.proxyHost="+host, "-Dhttps.proxyPort="+port, filepath.Join("java", "HttpCompat.java")))
	})
	t.Run("go", func(t *testing.T) {
		// A process of its own: net/http reads the environment once.
		child := append(slices.Clone(env), goClientEnv+"=1", "SSL_CERT_FILE="+s.ca)
		s.runClient(t, "Go net/http", script(child, os.Args[0], "-test.run=^$"))
	})
}

// curlCells runs curl once per cell, with the proxy from env or from args.
func (s *httpSetup) curlCells(t *testing.T, id string, env, args []string) (string, map[string]result) {
	t.Helper()
	curl := func(extra ...string) (string, error) {
		cmd := exec.Command("curl", append(append([]string{"-sS", "--max-time", "30", "--cacert", s.ca}, args...), extra...)...)
		cmd.Env = append(cleanEnv(), env...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return string(out), fmt.Errorf("%v: %s", err, stderr.String())
		}
		return string(out), nil
	}
	cells := map[string]result{}
	set := func(cell string, ok bool, detail string) {
		r := result{Cell: cell, Result: "ok", Detail: detail}
		if !ok {
			r.Result = "fail"
		}
		cells[cell] = r
	}
	out, err := curl(s.httpURL + "/hello")
	set("http", err == nil && out == "hello", errDetail(out, err, ""))
	out, err = curl(s.httpsURL + "/secure")
	set("https", err == nil && out == "hello", errDetail(out, err, ""))
	upload := filepath.Join(s.tmp, "upload")
	if err := os.WriteFile(upload, bytes.Repeat([]byte("x"), uploadSize), 0o644); err != nil {
		t.Fatal(err)
	}
	// curl sends a body chunked when asked to with the header.
	out, err = curl("-H", "Transfer-Encoding: chunked", "--data-binary", "@"+upload, "-w", "\n%header{Compat-Received-As}", s.httpURL+"/upload")
	body, how, _ := strings.Cut(out, "\n")
	set("chunked upload", err == nil && body == fmt.Sprintf("received %d", uploadSize), errDetail(out, err, "the origin got it "+how))
	s.curlSSE(t, id, env, args, set)
	for _, d := range []struct {
		cell, target, status, cause string
	}{{"429", s.quotaURL, "429", "quota"}, {"503", s.slowURL, "503", "wait-timeout"}} {
		out, err := curl("-o", "/dev/null", "-D", "-", d.target)
		h := parseHead(out)
		ok := err == nil && h.status == d.status && h.get("Governor-Denied") == d.cause
		set(d.cell, ok, errDetail(out, err, denialDetail(h)+"; exit status 0 (curl fails only with --fail)"))
	}
	// A denied CONNECT: curl fails (exit 56) and says why on stderr.
	out, err = curl("-o", "/dev/null", s.tunnelURL)
	if err != nil {
		cells[cellTunnel] = result{Cell: cellTunnel, Result: "error", Detail: err.Error()}
	} else {
		set(cellTunnel, false, "no error: "+out)
	}
	version, _ := exec.Command("curl", "--version").Output()
	v, _, _ := strings.Cut(string(version), " (")
	return v, cells
}

// curlSSE streams /sse with -N (no buffering) and asks for the second event
// once curl has printed the first.
func (s *httpSetup) curlSSE(t *testing.T, id string, env, args []string, set func(string, bool, string)) {
	cmd := exec.Command("curl", append(append([]string{"-sS", "-N", "--max-time", "30"}, args...), s.httpURL+"/sse?id="+id)...)
	cmd.Env = append(cleanEnv(), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var events []string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if ev, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			events = append(events, ev)
			if len(events) == 1 {
				// What a client does on reading the first event; sent
				// straight to the origin, since curl is busy streaming.
				resp, err := http.Get(strings.Replace(s.httpURL, originHost, "127.0.0.1", 1) + "/sse-ack?id=" + id)
				if err == nil {
					resp.Body.Close()
				}
			}
		}
	}
	werr := cmd.Wait()
	set("sse", werr == nil && strings.Join(events, ",") == "one,two", errDetail(strings.Join(events, ","), werr, "-N"))
}

func errDetail(out string, err error, ok string) string {
	if err != nil {
		return fmt.Sprintf("%v (output %q)", err, out)
	}
	return ok
}

// head is a response's status and headers as curl -D prints them.
type head struct {
	status string
	h      http.Header
}

func (h head) get(k string) string { return h.h.Get(k) }

func parseHead(out string) head {
	h := head{h: http.Header{}}
	for i, line := range strings.Split(strings.TrimSpace(out), "\n") {
		line = strings.TrimSpace(line)
		if i == 0 {
			if f := strings.Fields(line); len(f) > 1 {
				h.status = f[1]
			}
			continue
		}
		if k, v, ok := strings.Cut(line, ":"); ok {
			h.h.Add(strings.TrimSpace(k), strings.TrimSpace(v))
		}
	}
	return h
}

func denialDetail(h head) string {
	d := h.status + " " + h.get("Governor-Denied")
	if v := h.get("x-should-retry"); v != "" {
		d += ", x-should-retry: " + v
	}
	if h.get("Retry-After") != "" {
		d += ", Retry-After"
	}
	return d
}

// goClientEnv makes the test binary the Go client (TestMain).
const goClientEnv = "GOVERNOR_COMPAT_GO_CLIENT"

// goClientMain is a plain Go program with http.DefaultClient, which reads
// HTTP_PROXY and HTTPS_PROXY (and SSL_CERT_FILE for its roots), exactly as a
// worker would. It prints the cells as the scripts do.
func goClientMain() int {
	base, secure := os.Getenv("COMPAT_HTTP_BASE"), os.Getenv("COMPAT_HTTPS_BASE")
	quota, slow := os.Getenv("COMPAT_QUOTA_URL"), os.Getenv("COMPAT_SLOW_URL")
	c := &http.Client{Timeout: 30 * time.Second} // the default transport, as most programs have
	report := func(cell, res, detail string) {
		b, _ := json.Marshal(result{Cell: cell, Result: res, Detail: detail})
		fmt.Println(string(b))
	}
	get := func(u string) (*http.Response, string, error) {
		resp, err := c.Get(u)
		if err != nil {
			return nil, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp, string(b), err
	}
	report("version", "ok", "net/http ("+runtime.Version()+")")
	check := func(cell string, ok bool, err error, detail string) {
		switch {
		case err != nil:
			report(cell, "fail", err.Error())
		case !ok:
			report(cell, "fail", detail)
		default:
			report(cell, "ok", detail)
		}
	}
	resp, body, err := get(base + "/hello")
	check("http", err == nil && resp.StatusCode == 200 && body == "hello", err, "")
	resp, body, err = get(secure + "/secure")
	check("https", err == nil && resp.StatusCode == 200 && body == "hello", err, "")

	// An io.Reader of unknown length: net/http sends it chunked.
	pr, pw := io.Pipe()
	go func() {
		for range 16 {
			pw.Write(bytes.Repeat([]byte("x"), uploadSize/16))
		}
		pw.Close()
	}()
	if resp, err := c.Post(base+"/upload", "application/octet-stream", pr); err != nil {
		check("chunked upload", false, err, "")
	} else {
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		check("chunked upload", string(b) == fmt.Sprintf("received %d", uploadSize), err, "the origin got it "+resp.Header.Get("Compat-Received-As"))
	}

	if resp, err := c.Get(base + "/sse?id=go"); err != nil {
		check("sse", false, err, "")
	} else {
		var events []string
		sc := bufio.NewScanner(resp.Body)
		for len(events) < 2 && sc.Scan() {
			if ev, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				events = append(events, ev)
				if len(events) == 1 {
					get(base + "/sse-ack?id=go")
				}
			}
		}
		resp.Body.Close()
		ok := strings.Join(events, ",") == "one,two"
		check("sse", ok, nil, map[bool]string{true: "", false: "events " + strings.Join(events, ",")}[ok])
	}

	for _, d := range []struct {
		cell, target string
		status       int
		cause        string
	}{{"429", quota, 429, "quota"}, {"503", slow, 503, "wait-timeout"}} {
		resp, _, err := get(d.target)
		if err != nil {
			check(d.cell, false, err, "")
			continue
		}
		h := head{status: strconv.Itoa(resp.StatusCode), h: resp.Header}
		check(d.cell, resp.StatusCode == d.status && h.get("Governor-Denied") == d.cause, nil, denialDetail(h)+"; returned the response")
	}
	if resp, _, err := get(os.Getenv("COMPAT_TUNNEL_URL")); err != nil {
		report(cellTunnel, "error", err.Error())
	} else {
		report(cellTunnel, "ok", fmt.Sprintf("returned %d %s", resp.StatusCode, resp.Header.Get("Governor-Denied")))
	}
	return 0
}
