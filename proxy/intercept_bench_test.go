package proxy

import (
	"crypto/tls"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/elazarl/goproxy"

	"github.com/governor-project/governor/internal/testcert"
)

// BenchmarkIntercepted measures keep-alive HTTPS GETs of a 1 KiB response
// through the sidecar's interception (a rule that charges every request)
// and through bare goproxy doing MITM with the same CA and a leaf cache,
// one client at a time, all in this process: for a profile of what the
// interception adds. govbench sidecar measures them as processes.
//
//	go test -run '^$' -bench Intercepted -cpuprofile cpu.out ./proxy
func BenchmarkIntercepted(b *testing.B) {
	body := strings.Repeat("x", 1024)
	// An HTTP/1.1 origin, as govbench's gov-https target: both proxies then
	// speak HTTP/1.1 on both legs.
	o := origin(b, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, body) }), true, false)
	caCert, caKey, pool := caFiles(b)

	ca, err := tls.LoadX509KeyPair(caCert, caKey)
	if err != nil {
		b.Fatal(err)
	}
	gp := goproxy.NewProxyHttpServer()
	gp.Logger = log.New(io.Discard, "", 0)
	gp.CertStore = &testcert.LeafCache{}
	gp.Tr = &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 256, TLSClientConfig: &tls.Config{RootCAs: certPool(o)}}
	mitm := &goproxy.ConnectAction{Action: goproxy.ConnectMitm, TLSConfig: goproxy.TLSConfigFromCA(&ca)}
	gp.OnRequest().HandleConnect(goproxy.FuncHttpsHandler(func(host string, _ *goproxy.ProxyCtx) (*goproxy.ConnectAction, string) {
		return mitm, host
	}))
	gps := httptest.NewServer(gp)
	defer gps.Close()

	srv := startGovernord(b, nil)
	p := startProxy(b, proxyOpts{gaddr: srv.Addr(), opts: logAtInfo, yaml: interceptYAML(caCert, caKey, certFile(b, o), "example.com") + `
task: {name: pod-7, quotas: {calls: 1000000000000}}
rules:
  - {name: api, match: {host: example.com}, charge: {calls: 1}}
`})
	target := hostURL(o, "example.com") + "/"
	for _, tc := range []struct{ name, proxy string }{
		{"goproxy-mitm", gps.URL},
		{"sidecar", "http://" + p.Addr()},
	} {
		b.Run(tc.name, func(b *testing.B) {
			u, _ := url.Parse(tc.proxy)
			tr := &http.Transport{Proxy: http.ProxyURL(u), TLSClientConfig: &tls.Config{RootCAs: pool},
				TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{}}
			defer tr.CloseIdleConnections()
			// goproxy resolves example.com itself: send it the origin's
			// address by that name only through the sidecar's resolver.
			t := target
			if tc.name == "goproxy-mitm" {
				t = "https://127.0.0.1:" + port(o) + "/"
			}
			c := &http.Client{Transport: tr}
			b.ResetTimer()
			for range b.N {
				resp, err := c.Get(t)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
}

// logAtInfo logs as the binary does by default: the tests' debug log costs
// a line per request that a production sidecar does not write.
func logAtInfo(o *Options) {
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo}))
}
