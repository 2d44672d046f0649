package sidecar

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/governor-project/governor/sidecar/intercept"
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
