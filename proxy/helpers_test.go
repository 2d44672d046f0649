package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/governor-project/governor/proxy/proxyconfig"
	"github.com/governor-project/governor/server/serverconfig"

	"go.uber.org/goleak"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/server"
)

func TestMain(m *testing.M) {
	// A child process started by TestProxyFromEnvironment acts as a plain
	// Go client and exits; see clientMain.
	if os.Getenv(childEnv) != "" {
		os.Exit(clientMain())
	}
	code := m.Run()
	govtest.RemoveBinaries()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

const (
	tenantKey = govtest.TenantKey // of the tenant "payments"
	adminKey  = govtest.AdminKey
	// waitFor bounds every wait for a condition in these tests.
	waitFor = 10 * time.Second
	// minimal is the least config file that loads.
	minimal = "governor: {api_key: k}\ntask: {name: pod-7}\n"
)

// startGovernord starts an in-process governord with one tenant,
// "payments" (internal/govtest), changed by edit.
func startGovernord(t testing.TB, edit func(*serverconfig.Config)) *server.Server {
	return govtest.Start(t, edit)
}

// hosts is the proxy's resolver in tests: names that look like anyone's
// (so that clients do send them to the proxy) but lead to test servers.
type hosts map[string]string

func (h hosts) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if ip, ok := h[strings.TrimSuffix(strings.ToLower(host), ".")]; ok {
		return []netip.Addr{netip.MustParseAddr(ip)}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

var testHosts = hosts{
	"origin.test":      "127.0.0.1",
	"example.com":      "127.0.0.1", // the name httptest's certificate is for
	"metadata.test":    "169.254.169.254",
	"metadata6.test":   "fd00:ec2::254",
	"localhost":        "127.0.0.1",
	"nowhere.test":     "127.0.0.1",
	"mapped-meta.test": "::ffff:169.254.169.254",
}

// testProxy is a governor-proxy under test.
type testProxy struct {
	*Sidecar
	t    testing.TB
	logs *govtest.LogBuffer
}

type proxyOpts struct {
	gaddr  string
	key    string // governor.api_key as written in the file; default the tenant's key
	yaml   string // added to the generated config (rules:, routes:, task: ...)
	task   string // task.name; default "pod-7"
	tls    *x509.CertPool
	path   string // write the config here and watch it
	edit   func(*proxyconfig.Config)
	opts   func(*Options)
	noWait bool // do not wait for the session
}

func startProxy(t testing.TB, o proxyOpts) *testProxy {
	t.Helper()
	if o.task == "" {
		o.task = "pod-7"
	}
	if o.key == "" {
		o.key = tenantKey
	}
	text := fmt.Sprintf("governor: {addr: %q, api_key: %s}\nmetrics_listen: 127.0.0.1:0\n", o.gaddr, o.key)
	if !strings.Contains(o.yaml, "task:") {
		text += fmt.Sprintf("task: {name: %s}\n", o.task)
	}
	if !strings.Contains(o.yaml, "http:") {
		text += "http: {listen: 127.0.0.1:0, allow_targets: [localhost], connect_ports: [1-65535]}\n"
	}
	text += o.yaml
	var cfg proxyconfig.Config
	var err error
	if o.path != "" {
		if err := os.WriteFile(o.path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		cfg, err = proxyconfig.LoadConfig(o.path)
	} else {
		cfg, err = proxyconfig.ParseConfig([]byte(text))
	}
	if err != nil {
		t.Fatalf("config: %v\n%s", err, text)
	}
	if o.edit != nil {
		o.edit(&cfg)
	}
	logs := &govtest.LogBuffer{}
	opts := Options{Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Resolver: testHosts, GovernorOptions: []governor.Option{governor.WithTTL(5 * time.Second)}}
	if o.tls != nil {
		opts.UpstreamTLS = &tls.Config{RootCAs: o.tls}
	}
	if o.opts != nil {
		o.opts(&opts)
	}
	p, err := Start(context.Background(), cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		p.Shutdown(ctx)
		if t.Failed() {
			t.Logf("proxy log:\n%s", logs.String())
		}
	})
	if !o.noWait {
		select {
		case <-p.Ready():
		case <-time.After(waitFor):
			t.Fatalf("no session with governord within %v; log:\n%s", waitFor, logs.String())
		}
	}
	return &testProxy{Sidecar: p, t: t, logs: logs}
}

// settle has the sidecar report the quota it spent to governord now, so
// that the usage governord shows is the sidecar's.
func (p *testProxy) settle() {
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	p.Settle(ctx)
}

// url is the proxy URL with a subtask as the username ("" for none).
func (p *testProxy) url(subtask string) *url.URL {
	u := &url.URL{Scheme: "http", Host: p.Addr()}
	if subtask != "" {
		u.User = url.UserPassword(subtask, "")
	}
	return u
}

// client is a Go client that uses the proxy, as a program with HTTP_PROXY
// would; roots, if not nil, are trusted for https origins.
func (p *testProxy) client(subtask string, roots *x509.CertPool) *http.Client {
	tr := &http.Transport{Proxy: http.ProxyURL(p.url(subtask)), ForceAttemptHTTP2: true}
	if roots != nil {
		tr.TLSClientConfig = &tls.Config{RootCAs: roots}
	}
	p.t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: waitFor}
}

// metric returns the value of one series from /metrics, 0 if absent.
func (p *testProxy) metric(name string) float64 {
	p.t.Helper()
	resp, err := noProxyClient.Get("http://" + p.MetricsAddr() + "/metrics")
	if err != nil {
		p.t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			var v float64
			fmt.Sscan(rest, &v)
			return v
		}
	}
	return 0
}

// noProxyClient never uses a proxy (http.DefaultClient would read the
// environment, which some tests point at the proxy).
var noProxyClient = &http.Client{Transport: &http.Transport{Proxy: nil}, Timeout: waitFor}

// admin is an operator's session, to look at the tree the way the admin
// API shows it.
type admin struct {
	c *governor.Client
	t testing.TB
}

func newAdmin(t testing.TB, addr string) *admin {
	t.Helper()
	c, err := governor.Dial(context.Background(), governor.WithAddr(addr), governor.WithAPIKey(adminKey))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &admin{c: c, t: t}
}

// node finds a node by its path of names under the root, e.g.
// ("payments", "pod-7", "crawl-42"); nil if there is none.
func (a *admin) node(path ...string) *governorpb.Node {
	a.t.Helper()
	id := int64(1)
	var found *governorpb.Node
	for _, name := range path {
		resp, err := a.c.Raw().ListChildren(context.Background(), &governorpb.ListChildrenRequest{NodeId: id, PageSize: 1000})
		if err != nil {
			a.t.Fatal(err)
		}
		found = nil
		for _, n := range resp.GetNodes() {
			if n.GetName() == name && n.GetState() == governorpb.NodeState_NODE_STATE_OPEN {
				found = n
			}
		}
		if found == nil {
			return nil
		}
		id = found.GetId()
	}
	return found
}

// waiters counts the acquires queued at governord in the subtree of the
// node at path (0 if there is no such node).
func (a *admin) waiters(path ...string) int {
	a.t.Helper()
	n := a.node(path...)
	if n == nil {
		return 0
	}
	resp, err := a.c.Raw().Inspect(context.Background(), &governorpb.InspectRequest{NodeId: n.GetId()})
	if err != nil {
		a.t.Fatal(err)
	}
	return len(resp.GetWaiters())
}

// eventually waits until cond holds, polling governord's state: a lease is
// released in the background after the response, so the test waits for the
// fact rather than for a fixed time.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	govtest.Eventually(t, waitFor, what, cond)
}

// origin starts an httptest origin; tls selects HTTPS (and HTTP/2 if h2).
func origin(t testing.TB, h http.Handler, tlsOn, h2 bool) *httptest.Server {
	t.Helper()
	s := httptest.NewUnstartedServer(h)
	s.EnableHTTP2 = h2
	if tlsOn {
		s.StartTLS()
	} else {
		s.Start()
	}
	t.Cleanup(s.Close)
	return s
}

// hostURL is the origin's URL with its IP replaced by a name the proxy's
// resolver knows.
func hostURL(s *httptest.Server, name string) string {
	u, _ := url.Parse(s.URL)
	return u.Scheme + "://" + name + ":" + u.Port()
}

func port(s *httptest.Server) string {
	u, _ := url.Parse(s.URL)
	return u.Port()
}

// certPool trusts the origin's certificate.
func certPool(s *httptest.Server) *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(s.Certificate())
	return p
}

// certFile writes the origin's certificate as PEM, for curl.
func certFile(t testing.TB, s *httptest.Server) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "origin.pem")
	if err := os.WriteFile(f, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

func readAll(t testing.TB, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// connect opens a CONNECT tunnel through the proxy by hand and returns the
// connection and the proxy's response to the CONNECT.
func connect(t testing.TB, proxyAddr, target, subtask string) (net.Conn, *bufio.Reader, *http.Response) {
	t.Helper()
	c, err := net.DialTimeout("tcp", proxyAddr, waitFor)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	req := &http.Request{Method: http.MethodConnect, URL: &url.URL{Opaque: target}, Host: target, Header: http.Header{}}
	if subtask != "" {
		req.Header.Set("Proxy-Authorization", "Basic "+basic(subtask))
	}
	if err := req.Write(c); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	c.SetReadDeadline(time.Now().Add(waitFor))
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Time{})
	return c, br, resp
}

func basic(user string) string { return base64.StdEncoding.EncodeToString([]byte(user + ":")) }

type serverConfig = serverconfig.Config

// bufferedConn reads first what a bufio.Reader already holds.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func bufioReader(r io.Reader) *bufio.Reader { return bufio.NewReader(r) }

func dialRaw(t testing.TB, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, waitFor)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
