package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/websocket"

	"github.com/governor-project/governor/proxy/intercept"
	"github.com/governor-project/governor/proxy/meter/fakellm"
)

// caFiles writes a new interception CA into a folder of the test's, as
// `governor ca create` does, and returns its files and a pool trusting it.
func caFiles(t testing.TB, hosts ...string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	var h *intercept.Hosts
	if len(hosts) > 0 {
		var err error
		if h, err = intercept.ParseHosts(hosts); err != nil {
			t.Fatal(err)
		}
	}
	c, k, err := intercept.NewCA(intercept.CAOptions{Hosts: h})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	must(t, os.WriteFile(certFile, c, 0o644))
	must(t, os.WriteFile(keyFile, k, 0o600))
	pool = x509.NewCertPool()
	pool.AppendCertsFromPEM(c)
	return certFile, keyFile, pool
}

// interceptYAML is the http: block of a sidecar intercepting hosts, with
// upstreams verified against the origin's certificate.
func interceptYAML(caCert, caKey, upstreamCA string, hosts ...string) string {
	list := ""
	for i, h := range hosts {
		if i > 0 {
			list += ", "
		}
		list += h
	}
	return fmt.Sprintf(`http:
  listen: 127.0.0.1:0
  allow_targets: [localhost]
  connect_ports: [1-65535]
  intercept: {hosts: [%s], ca_cert: %s, ca_key: %s, upstream_ca_file: %s}
`, list, caCert, caKey, upstreamCA)
}

// counter is an origin that counts the requests it serves.
type counter struct{ n atomic.Int64 }

func (c *counter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.n.Add(1)
	fmt.Fprintf(w, "hello over %s\n", r.Proto)
}

// Over one keep-alive connection, HTTP/1.1 or HTTP/2, an intercepted
// HTTPS origin under a per-request quota of 5 serves exactly 5 requests;
// the 6th and later get 429 Governor-Denied: quota as real responses
// inside TLS, and the client saw a certificate from the sidecar's CA.
func TestInterceptedKeepAliveIsChargedPerRequest(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			srv := startGovernord(t, nil)
			c := &counter{}
			up := origin(t, c, true, true)
			caCert, caKey, pool := caFiles(t)
			p := startProxy(t, proxyOpts{gaddr: srv.Addr(), yaml: interceptYAML(caCert, caKey, certFile(t, up), "example.com") + `
task: {name: pod-7, quotas: {calls: 5}}
rules:
  - {name: api, match: {host: example.com}, charge: {calls: 1}}
`})
			tr := &http.Transport{Proxy: http.ProxyURL(p.url("crawl-1")), TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: h2}
			if !h2 {
				tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
			}
			t.Cleanup(tr.CloseIdleConnections)
			client := &http.Client{Transport: tr, Timeout: waitFor}
			var codes []int
			var conns sync.Map
			for range 8 {
				resp, err := client.Get(hostURL(up, "example.com") + "/x")
				if err != nil {
					t.Fatal(err)
				}
				body := readAll(t, resp)
				codes = append(codes, resp.StatusCode)
				if resp.StatusCode == 429 && resp.Header.Get("Governor-Denied") != "quota" {
					t.Errorf("a 429 without Governor-Denied: quota: %v %s", resp.Header, body)
				}
				if got := resp.TLS.PeerCertificates[0].Issuer.CommonName; got != "Governor interception CA" {
					t.Errorf("the client saw a certificate issued by %q", got)
				}
				if wantProto := map[bool]string{false: "HTTP/1.1", true: "HTTP/2.0"}[h2]; resp.Proto != wantProto {
					t.Errorf("the client spoke %s, want %s", resp.Proto, wantProto)
				}
				conns.Store(fmt.Sprint(resp.TLS.TLSUnique), true)
			}
			if fmt.Sprint(codes) != "[200 200 200 200 200 429 429 429]" {
				t.Errorf("codes %v", codes)
			}
			if n := c.n.Load(); n != 5 {
				t.Errorf("the origin served %d requests under a quota of 5", n)
			}
			n := 0
			conns.Range(func(any, any) bool { n++; return true })
			if n != 1 {
				t.Errorf("%d TLS connections for 8 requests: not one keep-alive connection", n)
			}
			if v := p.metric(`governor_proxy_intercept_handshakes_total{reason="ok"}`); v != 1 {
				t.Errorf("%v handshakes counted ok", v)
			}
			p.settle()
			if used := newAdmin(t, srv.Addr()).node("payments", "pod-7").GetUsed()["calls"]; used != 5 {
				t.Errorf("governord counts %d calls", used)
			}
		})
	}
}

// tlsThrough opens a CONNECT tunnel to target by hand and a TLS client on
// it that trusts roots, as serverName.
func tlsThrough(t *testing.T, proxyAddr, target, serverName string, roots *x509.CertPool, protos ...string) (*tls.Conn, error) {
	t.Helper()
	c, br, resp := connect(t, proxyAddr, target, "")
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT %s: %s", target, resp.Status)
	}
	tc := tls.Client(&bufferedConn{Conn: c, r: br}, &tls.Config{RootCAs: roots, ServerName: serverName, NextProtos: protos})
	tc.SetDeadline(time.Now().Add(waitFor))
	err := tc.Handshake()
	tc.SetDeadline(time.Time{})
	return tc, err
}

// Only listed hosts are intercepted: a tunnel to another host is relayed as
// bytes, the client sees the origin's own certificate, and the CONNECT-level
// rule charges the tunnel once, as before.
func TestInterceptOnlyListedHosts(t *testing.T) {
	srv := startGovernord(t, nil)
	c := &counter{}
	up := origin(t, c, true, false)
	caCert, caKey, _ := caFiles(t)
	p := startProxy(t, proxyOpts{gaddr: srv.Addr(), yaml: interceptYAML(caCert, caKey, certFile(t, up), "example.com") + `
task: {name: pod-7, quotas: {tunnels: 10}}
rules:
  - {name: tunnel, match: {host: 127.0.0.1, method: CONNECT}, charge: {tunnels: 1}}
`})
	client := p.client("", certPool(up))
	for range 3 {
		resp, err := client.Get("https://127.0.0.1:" + port(up) + "/")
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
		if cert := resp.TLS.PeerCertificates[0]; !cert.Equal(up.Certificate()) {
			t.Errorf("an unlisted host's tunnel showed %q's certificate", cert.Issuer.CommonName)
		}
	}
	p.settle()
	if used := newAdmin(t, srv.Addr()).node("payments", "pod-7").GetUsed()["tunnels"]; used != 1 {
		t.Errorf("%d tunnels charged for one keep-alive tunnel", used)
	}
	if v := p.metric(`governor_proxy_intercept_handshakes_total{reason="ok"}`); v != 0 {
		t.Errorf("%v handshakes intercepted for an unlisted host", v)
	}
}

// A client that does not trust the sidecar's CA (one that pins the
// origin's) fails its handshake cleanly: nothing reaches the origin, nothing
// falls back to an ungoverned tunnel, and the sidecar logs the host and
// the reason and counts it.
func TestInterceptPinnedClientFails(t *testing.T) {
	srv := startGovernord(t, nil)
	c := &counter{}
	up := origin(t, c, true, false)
	caCert, caKey, _ := caFiles(t)
	p := startProxy(t, proxyOpts{gaddr: srv.Addr(), yaml: interceptYAML(caCert, caKey, certFile(t, up), "example.com")})
	_, err := tlsThrough(t, p.Addr(), "example.com:"+port(up), "example.com", certPool(up))
	var unknown x509.UnknownAuthorityError
	if !errors.As(err, &unknown) {
		t.Fatalf("a pinned client's handshake: %v", err)
	}
	eventually(t, "the refused handshake to be counted", func() bool {
		return p.metric(`governor_proxy_intercept_handshakes_total{reason="client_refused_certificate"}`) == 1
	})
	if !strings.Contains(p.logs.String(), `"host":"example.com","reason":"client_refused_certificate"`) &&
		!strings.Contains(p.logs.String(), `host=example.com reason=client_refused_certificate`) {
		t.Errorf("no log line names the host and the reason:\n%s", p.logs.String())
	}
	// curl and Python (OpenSSL, TLS 1.3 by default) that do not trust the
	// CA: each counted as refusing the certificate, however its TLS
	// library says so.
	refused := 1
	for _, client := range [][]string{
		{"curl", "-sS", "--cacert", certFile(t, up), "--proxy", "http://" + p.Addr(), "https://example.com:" + port(up) + "/"},
		{"python3", "-c", "import sys,urllib.request as u; u.build_opener(u.ProxyHandler({'https': sys.argv[1]})).open(sys.argv[2])",
			"http://" + p.Addr(), "https://example.com:" + port(up) + "/"},
	} {
		if _, err := exec.LookPath(client[0]); err != nil {
			t.Logf("%s: not installed", client[0])
			continue
		}
		cmd := exec.Command(client[0], client[1:]...)
		cmd.Env = append(os.Environ(), "SSL_CERT_FILE="+certFile(t, up), "CURL_CA_BUNDLE=", "NO_PROXY=", "no_proxy=")
		if out, err := cmd.CombinedOutput(); err == nil {
			t.Errorf("%s trusted the sidecar's certificate without its CA: %s", client[0], out)
			continue
		}
		refused++
		eventually(t, client[0]+"'s refused handshake to be counted", func() bool {
			return p.metric(`governor_proxy_intercept_handshakes_total{reason="client_refused_certificate"}`) == float64(refused)
		})
	}
	if n := c.n.Load(); n != 0 {
		t.Errorf("%d requests reached the origin", n)
	}
}

// An upstream whose certificate does not verify is a 502 whose body says
// why, inside the tunnel; a request for another host than the tunnel's is
// 421; a ClientHello naming another host fails the handshake.
func TestInterceptUpstreamAndHostChecks(t *testing.T) {
	srv := startGovernord(t, nil)
	up := origin(t, &counter{}, true, false)
	caCert, caKey, pool := caFiles(t)
	other := filepath.Join(t.TempDir(), "other.pem")
	otherCert, _, _ := intercept.NewCA(intercept.CAOptions{})
	must(t, os.WriteFile(other, otherCert, 0o644))
	p := startProxy(t, proxyOpts{gaddr: srv.Addr(), yaml: interceptYAML(caCert, caKey, other, "example.com")})
	tc, err := tlsThrough(t, p.Addr(), "example.com:"+port(up), "example.com", pool)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(tc)
	get := func(host string) (*http.Response, string) {
		t.Helper()
		fmt.Fprintf(tc, "GET /x HTTP/1.1\r\nHost: %s\r\n\r\n", host)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		return resp, readAll(t, resp)
	}
	resp, body := get("example.com:" + port(up))
	if resp.StatusCode != 502 || !strings.Contains(body, "certificate") {
		t.Errorf("an upstream that does not verify: %d %q", resp.StatusCode, body)
	}
	resp, body = get("elsewhere.test")
	if resp.StatusCode != http.StatusMisdirectedRequest || !strings.Contains(body, "must open its own") {
		t.Errorf("a request for another host: %d %q", resp.StatusCode, body)
	}
	if _, err := tlsThrough(t, p.Addr(), "example.com:"+port(up), "other.example", pool); err == nil {
		t.Error("a handshake naming another host than the CONNECT's succeeded")
	}
	eventually(t, "the SNI mismatch to be counted", func() bool {
		return p.metric(`governor_proxy_intercept_handshakes_total{reason="sni_mismatch"}`) == 1
	})
}

// 100 concurrent HTTP/2 streams on one intercepted connection, under a
// quota of 40: exactly 40 reach the origin, each stream governed and
// refused on its own.
func TestInterceptedHTTP2StreamsAreGovernedOneByOne(t *testing.T) {
	srv := startGovernord(t, nil)
	c := &counter{}
	up := origin(t, c, true, true)
	caCert, caKey, pool := caFiles(t)
	p := startProxy(t, proxyOpts{gaddr: srv.Addr(), yaml: interceptYAML(caCert, caKey, certFile(t, up), "example.com") + `
task: {name: pod-7, quotas: {calls: 40}}
rules:
  - {name: api, match: {host: example.com}, charge: {calls: 1}}
`})
	tr := &http.Transport{Proxy: http.ProxyURL(p.url("")), TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr, Timeout: waitFor}
	// One request first, so that the 100 share its connection.
	resp, err := client.Get(hostURL(up, "example.com") + "/")
	must(t, err)
	readAll(t, resp)
	first := resp.TLS.TLSUnique
	var ok, denied, other atomic.Int64
	var wg sync.WaitGroup
	for range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := client.Get(hostURL(up, "example.com") + "/")
			if err != nil {
				other.Add(1)
				return
			}
			readAll(t, resp)
			switch {
			case resp.ProtoMajor != 2 || string(resp.TLS.TLSUnique) != string(first):
				other.Add(1)
			case resp.StatusCode == 200:
				ok.Add(1)
			case resp.StatusCode == 429 && resp.Header.Get("Governor-Denied") == "quota":
				denied.Add(1)
			default:
				other.Add(1)
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 39 || denied.Load() != 61 || other.Load() != 0 {
		t.Errorf("100 streams after 1: %d ok, %d denied, %d other (not on the first connection, or failed)", ok.Load(), denied.Load(), other.Load())
	}
	if n := c.n.Load(); n != 40 {
		t.Errorf("the origin served %d requests under a quota of 40", n)
	}
}

// A websocket inside an intercepted tunnel: the upgrade is governed as a
// request (its lease held while the socket is open) and the frames relayed.
func TestInterceptedWebsocket(t *testing.T) {
	g := startGovernord(t, nil)
	up := origin(t, websocket.Handler(func(ws *websocket.Conn) { io.Copy(ws, ws) }), true, false)
	caCert, caKey, pool := caFiles(t)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: interceptYAML(caCert, caKey, certFile(t, up), "example.com") + `
rules:
  - {name: ws, match: {host: example.com, path: /ws}, class: ws}
`})
	a := newAdmin(t, g.Addr())
	held := func() int64 { return a.node("payments", "pod-7").GetHeld()["ws"] }
	tc, err := tlsThrough(t, p.Addr(), "example.com:"+port(up), "example.com", pool, "http/1.1")
	must(t, err)
	cfg, err := websocket.NewConfig("wss://example.com:"+port(up)+"/ws", "https://example.com/")
	must(t, err)
	ws, err := websocket.NewClient(cfg, tc)
	if err != nil {
		t.Fatalf("a websocket handshake inside the tunnel: %v", err)
	}
	for _, msg := range []string{"ping", "pong"} {
		must(t, websocket.Message.Send(ws, msg))
		var got string
		if err := websocket.Message.Receive(ws, &got); err != nil || got != msg {
			t.Fatalf("echo %q: %q %v", msg, got, err)
		}
	}
	if held() != 1 {
		t.Errorf("held while the websocket is open: %d", held())
	}
	ws.Close()
	eventually(t, "the websocket's lease to be released", func() bool { return held() == 0 })
}

// An LLM call made straight to the provider's HTTPS host (no base URL
// changed) is metered inside the intercepted tunnel as on a route: a
// stream reaches the client a chunk at a time, governord charges exactly
// the usage the provider reported, and a call the budget cannot hold is a
// 429 in the provider's error shape, inside TLS.
func TestInterceptedLLMCallsAreMetered(t *testing.T) {
	srv := startGovernord(t, nil)
	gate := make(chan struct{})
	fake := &fakellm.Provider{Gate: gate}
	t.Cleanup(func() { close(gate) })
	up := origin(t, fake, true, true)
	caCert, caKey, pool := caFiles(t)
	p := startProxy(t, proxyOpts{gaddr: srv.Addr(), yaml: interceptYAML(caCert, caKey, certFile(t, up), "example.com") + `
task: {name: pod-7, quotas: {tokens: 3000}}
rules:
  - {name: openai, match: {host: example.com, path: /v1, method: POST}, class: llm, meter: {api: openai, reserve: 1000}}
`})
	client := p.client("agent-1", pool)
	post := func(body string) *http.Response {
		t.Helper()
		resp, err := client.Post(hostURL(up, "example.com")+"/v1/chat/completions", "application/json", strings.NewReader(body))
		must(t, err)
		return resp
	}
	resp := post(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	if resp.StatusCode != 200 || resp.TLS.PeerCertificates[0].Issuer.CommonName != "Governor interception CA" {
		t.Fatalf("a streamed call: %d", resp.StatusCode)
	}
	r := bufio.NewReader(resp.Body)
	for events := 0; ; events++ {
		ev := readEvent(t, r) // the fake holds the next event back until the gate
		if strings.HasPrefix(ev, "data: [DONE]") {
			if events < 5 {
				t.Errorf("%d events", events)
			}
			break
		}
		if strings.Contains(ev, `"usage":{`) {
			t.Errorf("the client saw the usage chunk the sidecar asked for: %s", ev)
		}
		if strings.Contains(ev, `"finish_reason":"stop"`) {
			gate <- struct{}{}
		}
		gate <- struct{}{}
	}
	resp.Body.Close()
	reported, _ := fake.Reported()
	a := newAdmin(t, srv.Addr())
	eventually(t, "the stream's settlement", func() bool {
		p.settle()
		return a.node("payments", "pod-7").GetUsed()["tokens"] == reported
	})
	resp = post(`{"model":"m","max_tokens":5000,"messages":[]}`)
	body := readAll(t, resp)
	var b struct {
		Error struct{ Type, Code, Cap string } `json:"error"`
	}
	json.Unmarshal([]byte(body), &b)
	if resp.StatusCode != 429 || resp.Header.Get("Governor-Denied") != "quota" || b.Error.Code != "quota" || b.Error.Cap != "tokens" {
		t.Errorf("a call the budget cannot hold: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	if n := fake.Requests(); n != 1 {
		t.Errorf("%d calls reached the provider", n)
	}
}

// The real governor-proxy refuses to start, with status 2 and a message
// naming the key, on a CA that cannot sign: expired, not a CA, a key that
// is another's, a file that is missing, no key at all.
func TestInterceptBadCARefusedByTheBinary(t *testing.T) {
	bin := buildSidecar(t)
	dir := t.TempDir()
	goodCert, goodKey, _ := caFiles(t)
	_, otherKey, _ := caFiles(t)
	expiredCert, expiredKey := filepath.Join(dir, "expired.pem"), filepath.Join(dir, "expired-key.pem")
	c, k, err := intercept.NewCA(intercept.CAOptions{Now: time.Now().Add(-48 * time.Hour), Validity: time.Hour})
	must(t, err)
	must(t, os.WriteFile(expiredCert, c, 0o644))
	must(t, os.WriteFile(expiredKey, k, 0o600))
	notCA := filepath.Join(dir, "leaf.pem")
	leaf := testcertLeafPEM(t)
	must(t, os.WriteFile(notCA, leaf, 0o644))
	for _, tc := range []struct {
		name, intercept, key, says string
	}{
		{"expired", fmt.Sprintf("{hosts: [example.com], ca_cert: %s, ca_key: %s}", expiredCert, expiredKey), "http.intercept.ca_cert", "not valid now"},
		{"another's key", fmt.Sprintf("{hosts: [example.com], ca_cert: %s, ca_key: %s}", goodCert, otherKey), "http.intercept.ca_key", "does not match"},
		{"not a CA", fmt.Sprintf("{hosts: [example.com], ca_cert: %s, ca_key: %s}", notCA, goodKey), "http.intercept.ca_cert", "not a CA"},
		{"missing", fmt.Sprintf("{hosts: [example.com], ca_cert: %s, ca_key: %s}", filepath.Join(dir, "nope.pem"), goodKey), "http.intercept.ca_cert", "no such file"},
		{"no key", fmt.Sprintf("{hosts: [example.com], ca_cert: %s}", goodCert), "http.intercept.ca_key", "is empty"},
		{"bad host", fmt.Sprintf("{hosts: [example.com, 'api*.x.com'], ca_cert: %s, ca_key: %s}", goodCert, goodKey), "http.intercept.hosts", "[1]"},
	} {
		path := filepath.Join(dir, "proxy.yaml")
		must(t, os.WriteFile(path, []byte("governor: {api_key: k-0123456789abcdef}\ntask: {name: pod-7}\nhttp: {listen: 127.0.0.1:0, intercept: "+tc.intercept+"}\n"), 0o600))
		var stderr strings.Builder
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cmd := exec.CommandContext(ctx, bin, "-config", path)
		cmd.Stderr = &stderr
		err := cmd.Run()
		cancel()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(stderr.String(), "config: "+tc.key+": ") || !strings.Contains(stderr.String(), tc.says) {
			t.Errorf("%s: %v, want exit 2 naming %s and saying %q:\n%s", tc.name, err, tc.key, tc.says, stderr.String())
		}
	}
}

// testcertLeafPEM is a certificate that is not a CA.
func testcertLeafPEM(t *testing.T) []byte {
	t.Helper()
	m := intercept.NewMinter(mustCA(t))
	c, err := m.Leaf("leaf.example")
	must(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate[0]})
}

func mustCA(t *testing.T) *intercept.CA {
	t.Helper()
	c, k, err := intercept.NewCA(intercept.CAOptions{})
	must(t, err)
	ca, err := intercept.ParseCA(c, k, time.Now())
	must(t, err)
	return ca
}

// Requests pipelined on one intercepted HTTP/1.1 connection are answered
// in order, each governed; a CONNECT to a port outside connect_ports, or
// to the sidecar's own listener, is refused before anything is
// intercepted, as any CONNECT is.
func TestInterceptPipeliningAndTargetSafety(t *testing.T) {
	srv := startGovernord(t, nil)
	c := &counter{}
	up := origin(t, c, true, false)
	caCert, caKey, pool := caFiles(t)
	p := startProxy(t, proxyOpts{gaddr: srv.Addr(), yaml: interceptYAML(caCert, caKey, certFile(t, up), "example.com", "127.0.0.1") + `
task: {name: pod-7, quotas: {calls: 2}}
rules:
  - {name: api, match: {host: example.com}, charge: {calls: 1}}
`})
	tc, err := tlsThrough(t, p.Addr(), "example.com:"+port(up), "example.com", pool, "http/1.1")
	must(t, err)
	// Three requests in one write, before any answer is read.
	req := fmt.Sprintf("GET /1 HTTP/1.1\r\nHost: example.com:%[1]s\r\n\r\nGET /2 HTTP/1.1\r\nHost: example.com:%[1]s\r\n\r\nGET /3 HTTP/1.1\r\nHost: example.com:%[1]s\r\n\r\n", port(up))
	_, err = io.WriteString(tc, req)
	must(t, err)
	br := bufio.NewReader(tc)
	var codes []int
	for range 3 {
		resp, err := http.ReadResponse(br, nil)
		must(t, err)
		readAll(t, resp)
		codes = append(codes, resp.StatusCode)
	}
	if fmt.Sprint(codes) != "[200 200 429]" || c.n.Load() != 2 {
		t.Errorf("three pipelined requests under a quota of 2: %v, %d at the origin", codes, c.n.Load())
	}
	_, mport, _ := net.SplitHostPort(p.MetricsAddr())
	for _, target := range []string{"127.0.0.1:" + mport, "127.0.0.1:" + func() string { _, pp, _ := net.SplitHostPort(p.Addr()); return pp }()} {
		_, _, resp := connect(t, p.Addr(), target, "")
		if resp.StatusCode != http.StatusLoopDetected || resp.Header.Get("Governor-Denied") != "forbidden-target" {
			t.Errorf("an intercepted CONNECT to the sidecar's own %s: %s %v", target, resp.Status, resp.Header)
		}
	}
	q := startProxy(t, proxyOpts{gaddr: srv.Addr(), task: "pod-8", yaml: strings.Replace(interceptYAML(caCert, caKey, certFile(t, up), "example.com"), "  connect_ports: [1-65535]\n", "", 1)})
	if _, _, resp := connect(t, q.Addr(), "example.com:"+port(up), ""); resp.StatusCode != 403 || !strings.Contains(resp.Status, "CONNECT port") {
		t.Errorf("an intercepted CONNECT to a port outside connect_ports: %s", resp.Status)
	}
	if v := p.metric(`governor_proxy_intercept_handshakes_total{reason="ok"}`); v != 1 {
		t.Errorf("%v handshakes: the refused CONNECTs must not be intercepted", v)
	}
}
