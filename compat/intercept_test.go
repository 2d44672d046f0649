package compat

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/internal/testcert"
	"github.com/governor-project/governor/proxy"
	"github.com/governor-project/governor/proxy/intercept"
	"github.com/governor-project/governor/proxy/proxyconfig"
)

// interceptDomain is where the intercepted origins are: each client asks
// for a host of its own below it (curl.intercept.test), which its own rule
// charges to a quota of its own, so that every row starts from 5.
const interceptDomain = "intercept.test"

// interceptQuota is each client's quota of requests.
const interceptQuota = 5

// The cells of the intercepted rows.
const (
	cellHandshake = "handshake"
	cellServed    = "5 reach the origin"
	cellDenied    = "6th: 429 quota"
	cellKeepAlive = "keep-alive"
	cellNoRetry   = "no retry"
)

// hostCounter is the intercepted origin: it counts the requests it serves
// by host.
type hostCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *hostCounter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	host, _, err := net.SplitHostPort(r.Host)
	if err != nil {
		host = r.Host
	}
	c.mu.Lock()
	c.n[host]++
	c.mu.Unlock()
	io.WriteString(w, "hello")
}

func (c *hostCounter) served(host string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[host]
}

// interceptSetup is a sidecar that intercepts every host below
// interceptDomain, with a CA of its own, in front of one TLS origin.
type interceptSetup struct {
	proxy  *proxy.Sidecar
	origin *hostCounter
	port   string // the origin's
	ca     string // the interception CA's certificate, which clients trust
	tmp    string
}

// interceptClient is one row: a client, the host it asks for, and how it
// runs (its version, and its cells as its script reports them).
type interceptClient struct {
	row, label string // label: its host, label.intercept.test
	trust      string // how it trusts the CA; "" for the client that must refuse it
	run        func(t *testing.T, s *interceptSetup, url string) (string, map[string]result)
}

func startIntercept(t *testing.T, clients []interceptClient) *interceptSetup {
	t.Helper()
	s := &interceptSetup{origin: &hostCounter{n: map[string]int{}}, tmp: t.TempDir()}
	cert := testcert.New(t, "*."+interceptDomain)
	up := httptest.NewUnstartedServer(s.origin)
	up.TLS = &tls.Config{Certificates: []tls.Certificate{cert.TLS}}
	up.StartTLS()
	t.Cleanup(up.Close)
	s.port = portOf(up.URL)

	caPEM, keyPEM, err := intercept.NewCA(intercept.CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.ca = filepath.Join(s.tmp, "ca.pem")
	caKey := filepath.Join(s.tmp, "ca-key.pem")
	if err := os.WriteFile(s.ca, caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(caKey, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}

	var quotas, rules []string
	for _, c := range clients {
		quotas = append(quotas, fmt.Sprintf("%s: %d", c.label, interceptQuota))
		rules = append(rules, fmt.Sprintf("  - {name: %[1]s, match: {host: %[1]s.%[2]s}, charge: {%[1]s: 1}}", c.label, interceptDomain))
	}
	g := govtest.Start(t, nil)
	cfg, err := proxyconfig.ParseConfig(fmt.Appendf(nil, `
governor: {addr: %q, api_key: %s}
task: {name: compat-intercept, quotas: {%s}}
http:
  listen: 127.0.0.1:0
  allow_targets: [localhost]
  connect_ports: [1-65535]
  intercept: {hosts: ["*.%s"], ca_cert: %s, ca_key: %s, upstream_ca_file: %s}
metrics_listen: 127.0.0.1:0
rules:
%s
`, g.Addr(), govtest.TenantKey, strings.Join(quotas, ", "), interceptDomain, s.ca, caKey, cert.CertFile, strings.Join(rules, "\n")))
	if err != nil {
		t.Fatal(err)
	}
	p := startSidecar(t, cfg, proxy.Options{Resolver: originResolver{}})
	s.proxy = p
	return s
}

func (s *interceptSetup) proxyEnv() []string {
	u := "http://" + s.proxy.Addr()
	return []string{"HTTP_PROXY=" + u, "http_proxy=" + u, "HTTPS_PROXY=" + u, "https_proxy=" + u, "NO_PROXY=", "no_proxy="}
}

func (s *interceptSetup) metric(t *testing.T, series string) float64 {
	return govtest.Scrape(t, s.proxy.MetricsAddr(), series)
}

// handshakesOK counts the intercepted handshakes that completed.
const handshakesOK = `governor_proxy_intercept_handshakes_total{reason="ok"}`

// refusedReason is how the sidecar counts a client that refused its
// certificate; handshakeFailureReasons are every reason a handshake fails.
const refusedReason = "client_refused_certificate"

var handshakeFailureReasons = []string{refusedReason, "client_closed", "not_tls", "sni_mismatch", "no_certificate", "timeout", "other"}

// handshakeFailures is the sidecar's count of failed handshakes by reason,
// less before's; reasons that did not move are left out.
func (s *interceptSetup) handshakeFailures(t *testing.T, before map[string]float64) map[string]float64 {
	m := map[string]float64{}
	for _, reason := range handshakeFailureReasons {
		n := s.metric(t, fmt.Sprintf(`governor_proxy_intercept_handshakes_total{reason=%q}`, reason)) - before[reason]
		if n != 0 || before == nil {
			m[reason] = n
		}
	}
	return m
}

// runClient runs one client's six requests, judges them by what the
// client saw and by the sidecar's and the origin's counts, and records the
// row.
func (s *interceptSetup) runClient(t *testing.T, c interceptClient) {
	t.Helper()
	host := c.label + "." + interceptDomain
	denied := fmt.Sprintf(`governor_proxy_requests_total{outcome="denied",rule=%q}`, c.label)
	ok0, denied0, before := s.metric(t, handshakesOK), s.metric(t, denied), s.handshakeFailures(t, nil)
	version, got := c.run(t, s, "https://"+host+":"+s.port+"/hello")
	handshakes, deniedN := s.metric(t, handshakesOK)-ok0, s.metric(t, denied)-denied0
	statuses := got["statuses"]
	cells := map[string]result{}
	set := func(cell string, ok bool, detail string) {
		cells[cell] = result{Cell: cell, Result: map[bool]string{true: "ok", false: "fail"}[ok], Detail: detail}
	}

	if c.trust == "" {
		// The client must refuse the sidecar's certificate. The sidecar
		// counts the failed handshake, by reason, once its side has ended,
		// which may be after the client has exited: wait for the count.
		var failed map[string]float64
		deadline := time.Now().Add(waitFor)
		for {
			failed = s.handshakeFailures(t, before)
			if len(failed) > 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		var counted []string
		for _, reason := range handshakeFailureReasons {
			if n := failed[reason]; n != 0 {
				counted = append(counted, fmt.Sprintf("%v %s", n, reason))
			}
		}
		if len(counted) == 0 {
			counted = []string{"no failure"}
		}
		served := s.origin.served(host)
		ok := statuses.Result == "error" && len(failed) == 1 && failed[refusedReason] == 1 && handshakes == 0 && served == 0
		set(cellHandshake, ok, fmt.Sprintf("refused by the client (%s); the sidecar counted %s (want 1 %s); the origin served %d",
			statuses.Detail, strings.Join(counted, ", "), refusedReason, served))
		for _, cell := range []string{cellServed, cellDenied, cellKeepAlive, cellNoRetry} {
			cells[cell] = result{Cell: cell, Result: "skip"}
		}
	} else {
		if statuses.Result == "error" {
			set(cellHandshake, false, statuses.Detail)
		} else {
			set(cellHandshake, handshakes >= 1, fmt.Sprintf("trusts the CA through %s", c.trust))
		}
		served := s.origin.served(host)
		set(cellServed, served == interceptQuota, map[bool]string{true: "", false: fmt.Sprintf("the origin served %d", served)}[served == interceptQuota])
		want := strings.TrimSpace(strings.Repeat("200 ", interceptQuota) + "429")
		ok := statuses.Result == "ok" && statuses.Detail == want && got["denied"].Detail == "quota"
		detail := "over " + got["protocol"].Detail
		if !ok {
			detail = fmt.Sprintf("%s (%s), the last with Governor-Denied: %q; %s", statuses.Detail, statuses.Result, got["denied"].Detail, detail)
		}
		set(cellDenied, ok, detail)
		// How many connections a pooling client opens for six sequential
		// requests varies with timing (undici may open a second while it
		// releases the first), so the doc records only that it reused one;
		// the count goes to the test's log.
		t.Logf("%s: %d TLS handshakes with the sidecar for six requests", c.row, int(handshakes))
		switch n := int(handshakes); {
		case n >= 1 && n < interceptQuota+1:
			set(cellKeepAlive, true, "")
		case n == interceptQuota+1:
			// The client's own way, as through a tunnel that is not
			// intercepted: each request was still charged.
			cells[cellKeepAlive] = result{Cell: cellKeepAlive, Result: "unsupported", Detail: "a TLS connection for each request"}
		default:
			set(cellKeepAlive, false, fmt.Sprintf("%d TLS handshakes with the sidecar for six requests", n))
		}
		set(cellNoRetry, deniedN == 1, map[bool]string{true: "", false: fmt.Sprintf("the sidecar refused %v requests", deniedN)}[deniedN == 1])
	}
	checkCells(t, c.row, intercepted.columns, cells)
	intercepted.record(&row{client: c.row, version: version, cells: cells})
}

// Each client, configured as in production to use the proxy and trust the
// sidecar's CA, sends six requests over keep-alive to an intercepted HTTPS
// origin under a per-request quota of 5: exactly 5 reach the origin and the
// 6th is a 429 Governor-Denied: quota inside TLS. A client given no CA
// refuses the sidecar's certificate, and the sidecar counts it.
func TestInterceptedHTTPS(t *testing.T) {
	enabled(t)
	python := os.Getenv("COMPAT_PYTHON")
	if python == "" {
		python = "/usr/bin/python3"
	}
	script := func(env func(*interceptSetup) []string, name string, args ...string) func(*testing.T, *interceptSetup, string) (string, map[string]result) {
		return func(t *testing.T, s *interceptSetup, url string) (string, map[string]result) {
			return runScript(t, append(append(s.proxyEnv(), env(s)...), "COMPAT_INTERCEPT_URL="+url), name, args...)
		}
	}
	nodeEnv := func(s *interceptSetup) []string { return []string{"NODE_EXTRA_CA_CERTS=" + s.ca} }
	clients := []interceptClient{
		{row: "curl --cacert --http1.1", label: "curl", trust: "--cacert", run: curlIntercepted("--cacert", "--http1.1")},
		{row: "curl --cacert --http2", label: "curl-h2", trust: "--cacert", run: curlIntercepted("--cacert", "--http2")},
		{row: "Python requests", label: "requests", trust: "REQUESTS_CA_BUNDLE",
			run: script(func(s *interceptSetup) []string { return []string{"REQUESTS_CA_BUNDLE=" + s.ca} }, python, "python/intercept.py")},
		{row: "Node fetch (undici EnvHttpProxyAgent)", label: "undici", trust: "NODE_EXTRA_CA_CERTS",
			run: script(nodeEnv, "node", "node/intercept.js", "undici")},
		{row: "axios", label: "axios", trust: "NODE_EXTRA_CA_CERTS", run: script(nodeEnv, "node", "node/intercept.js", "axios")},
		{row: "Java HttpClient", label: "java", trust: "a truststore made by keytool (-Djavax.net.ssl.trustStore)", run: javaIntercepted},
		{row: "Go net/http", label: "go", trust: "SSL_CERT_FILE", run: func(t *testing.T, s *interceptSetup, url string) (string, map[string]result) {
			// A process of its own: net/http reads the proxy variables, and
			// crypto/x509 SSL_CERT_FILE, once per process.
			env := append(s.proxyEnv(), goClientEnv+"="+goInterceptMode, "SSL_CERT_FILE="+s.ca, "COMPAT_INTERCEPT_URL="+url)
			return runScript(t, env, os.Args[0], "-test.run=^$")
		}},
		// Clients given no CA, which must refuse the sidecar's certificate:
		// OpenSSL's curl, and Node's own TLS.
		{row: "curl without the CA (must refuse)", label: "curl-refuse", run: curlIntercepted()},
		{row: "Node fetch (undici) without the CA (must refuse)", label: "undici-refuse",
			run: script(func(*interceptSetup) []string { return nil }, "node", "node/intercept.js", "undici")},
	}
	s := startIntercept(t, clients)
	for _, c := range clients {
		t.Run(c.label, func(t *testing.T) { s.runClient(t, c) })
	}
}

// curlIntercepted runs curl once for six URLs, which it sends over one
// connection, with the proxy from the environment and args (--cacert is
// given the CA).
func curlIntercepted(args ...string) func(*testing.T, *interceptSetup, string) (string, map[string]result) {
	return func(t *testing.T, s *interceptSetup, url string) (string, map[string]result) {
		t.Helper()
		// Each transfer's body is followed by a line of its own: its
		// status, Governor-Denied and HTTP version.
		argv := []string{"-sS", "--max-time", "30", "-w", `\n` + curlMark + `%{http_code}|%header{governor-denied}|%{http_version}\n`}
		for _, a := range args {
			argv = append(argv, a)
			if a == "--cacert" {
				argv = append(argv, s.ca)
			}
		}
		n := interceptQuota + 1
		if !slices.Contains(args, "--cacert") {
			n = 1 // it must fail at once
		}
		for range n {
			argv = append(argv, url)
		}
		cmd := exec.Command("curl", argv...)
		cmd.Env = append(cleanEnv(), s.proxyEnv()...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		cells := map[string]result{}
		if err != nil {
			msg, _, _ := strings.Cut(strings.TrimSpace(stderr.String()), "\n")
			cells["statuses"] = result{Result: "error", Detail: fmt.Sprintf("%v: %s", err, msg)}
		} else {
			cells = curlTransfers(string(out))
		}
		version, _ := exec.Command("curl", "--version").Output()
		v, _, _ := strings.Cut(string(version), " (")
		return v, cells
	}
}

// curlMark starts the line curl writes after each transfer's body.
const curlMark = "COMPAT-TRANSFER "

// curlTransfers reads curl's output as the scripts' cells: each body, then
// its transfer's line.
func curlTransfers(out string) map[string]result {
	var statuses []string
	var denied, proto string
	ok := true
	for {
		i := strings.Index(out, "\n"+curlMark)
		if i < 0 {
			break
		}
		body, line := out[:i], out[i+1+len(curlMark):]
		line, out, _ = strings.Cut(line, "\n")
		f := strings.Split(line, "|")
		if len(f) != 3 {
			ok = false
			break
		}
		if f[0] == "200" && body != "hello" {
			ok = false
		}
		statuses, denied, proto = append(statuses, f[0]), f[1], "HTTP/"+f[2]
	}
	return map[string]result{
		"statuses": {Result: map[bool]string{true: "ok", false: "fail"}[ok], Detail: strings.Join(statuses, " ")},
		"denied":   {Result: "ok", Detail: denied},
		"protocol": {Result: "ok", Detail: proto},
	}
}

// javaIntercepted imports the CA into a PKCS#12 truststore with keytool
// and runs the Java script with it as the JVM's truststore.
func javaIntercepted(t *testing.T, s *interceptSetup, url string) (string, map[string]result) {
	t.Helper()
	store := filepath.Join(s.tmp, "truststore.p12")
	out, err := exec.Command("keytool", "-importcert", "-noprompt", "-alias", "governor-interception",
		"-file", s.ca, "-keystore", store, "-storetype", "PKCS12", "-storepass", "changeit").CombinedOutput()
	if err != nil {
		t.Fatalf("keytool: %v\n%s", err, out)
	}
	host, port, _ := net.SplitHostPort(s.proxy.Addr())
	return runScript(t, []string{"COMPAT_INTERCEPT_URL=" + url}, "java", "-Dhttps.proxyHost="+host, "-Dhttps.proxyPort="+port,
		"-Djavax.net.ssl.trustStore="+store, "-Djavax.net.ssl.trustStorePassword=changeit", filepath.Join("java", "InterceptCompat.java"))
}

// goInterceptMode makes the test binary the Go client of TestInterceptedHTTPS.
const goInterceptMode = "intercept"

// goInterceptMain is a plain Go program with http.DefaultClient, which
// reads HTTPS_PROXY, and the system roots, which SSL_CERT_FILE replaces. It
// prints the cells as the scripts do.
func goInterceptMain() int {
	report := func(cell, res, detail string) {
		b, _ := json.Marshal(result{Cell: cell, Result: res, Detail: detail})
		fmt.Println(string(b))
	}
	report("version", "ok", "net/http ("+runtime.Version()+")")
	var statuses []string
	var last *http.Response
	ok := true
	for range interceptQuota + 1 {
		resp, err := http.Get(os.Getenv("COMPAT_INTERCEPT_URL"))
		if err != nil {
			report("statuses", "error", err.Error())
			return 0
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			report("statuses", "error", err.Error())
			return 0
		}
		if resp.StatusCode == 200 && string(body) != "hello" {
			ok = false
		}
		statuses, last = append(statuses, fmt.Sprint(resp.StatusCode)), resp
	}
	report("statuses", map[bool]string{true: "ok", false: "fail"}[ok], strings.Join(statuses, " "))
	report("denied", "ok", last.Header.Get("Governor-Denied"))
	report("protocol", "ok", strings.TrimSuffix(last.Proto, ".0")) // HTTP/2.0: as the others write it
	return 0
}
