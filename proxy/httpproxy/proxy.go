// Package httpproxy is governor-proxy's HTTP side: a forward proxy (plain
// HTTP and CONNECT) and a reverse proxy for base-URL routes, built on
// goproxy, that classifies each request by the rules and admits it through
// an admission.Admitter before forwarding it. Proxy is an http.Handler that
// can be built and tested with any Admitter; Serve serves it on a listener.
//
// It may import the standard library, goproxy and x/net/http2, classify,
// proxy/admission, proxy/meter, the SDK (for its overload test),
// internal/tracing with OpenTelemetry's trace API, and Prometheus' client;
// never governord's server or engine, or the pgwire side.
//
// # Files
//
//   - proxy.go: Proxy, its goproxy wiring, base-URL routes, Serve and
//     Shutdown.
//   - http.go: one plain request from admission to the end of its response
//     body, which ends its ticket.
//   - connect.go: CONNECT tunnels, admitted before goproxy takes the
//     connection over and ended when the tunnel closes; the idle watchdog.
//   - idle.go: the watchdog of a plain exchange whose client stalls.
//   - dial.go: upstream dialing that never reads HTTP(S)_PROXY and refuses
//     the targets the proxy must not reach, checked on the addresses it
//     dials: the sidecar's own listeners, governord, loopback, link-local
//     and metadata addresses (targets.go: the allow list, CONNECT's ports,
//     governord's addresses).
//   - auth.go: the proxy password, when the config names one.
//   - intercept.go: CONNECT tunnels to the hosts http.intercept lists,
//     terminated here: the handshake with a minted certificate, and the
//     decrypted connection served by net/http (HTTP/1.1 and HTTP/2), each
//     request handed to ServeHTTP as an https:// request.
//   - meter.go: metered LLM calls (a meter: rule): the estimate held before
//     forwarding, the response body read for its usage as it passes, the
//     settlement, an estimate over what is left (on_over_estimate), and
//     denials in the provider's error shape.
//   - ratelimit.go: the RateLimit headers and Governor-Warning of a
//     governed response, and the dry runs of rules in shadow mode.
//   - deny.go: the one rendering of a denial as HTTP; grpc.go: the same as a
//     gRPC status, for a gRPC call.
//   - tracing.go: the spans of a request, while tracing is on.
//   - metrics.go: the HTTP side's series.
//
// # On top of goproxy
//
// The forward proxy is github.com/elazarl/goproxy. Its known pitfalls are
// handled here: the ticket-ending body wrapper is installed in the round
// tripper, before goproxy keeps the body, so goproxy keeps Content-Length; a
// body of unknown length is marked chunked, which makes goproxy flush each
// piece (SSE, NDJSON); a failed upstream becomes 502 (504 on a timeout)
// instead of goproxy's 500; and Tr.Proxy and ConnectDial, which goproxy
// fills from HTTP(S)_PROXY, are replaced by a dialer that reads no
// environment and refuses the proxy's own listeners.
package httpproxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/elazarl/goproxy"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/net/http2"

	"github.com/governor-project/governor/classify"
	"github.com/governor-project/governor/internal/tracing"
	"github.com/governor-project/governor/proxy/admission"
)

// Config is the HTTP side's behaviour (the http: keys of the sidecar's
// configuration). Zero durations turn the matching bound off, except
// WaitTimeout and DialTimeout, which have defaults.
type Config struct {
	// WaitTimeout is the longest a request waits for admission; then 503
	// wait-timeout. Zero: DefaultWaitTimeout.
	WaitTimeout time.Duration
	// DenyUnmatched refuses requests no rule matches (403 unmatched);
	// otherwise they are forwarded ungoverned.
	DenyUnmatched bool
	// RateLimitHeaders adds to each governed response the IETF RateLimit
	// headers of the tightest quota over it and, while a cap over it is
	// near or over, Governor-Warning (ratelimit.go), read from governord
	// with one call per response; the Admitter must be an
	// admission.CapReader.
	RateLimitHeaders bool
	// Shadow puts every rule in dry run, as a rule's mode: shadow does:
	// each request is asked about (the Admitter must be an
	// admission.DryRunner), never charged or held, and always forwarded.
	Shadow bool
	// TunnelIdleTimeout closes a CONNECT tunnel idle this long in both
	// directions. Zero: never.
	TunnelIdleTimeout time.Duration
	// BodyIdleTimeout ends a plain exchange whose client neither sends nor
	// takes a byte for this long. Zero: never.
	BodyIdleTimeout time.Duration
	// AllowLinkLocal allows 169.254.0.0/16, fe80::/10 and fd00:ec2::254 as
	// upstreams.
	AllowLinkLocal bool
	// AllowTargets lifts the refusal of the loopback and link-local
	// addresses they cover, and of governord's for an entry that names its
	// port. The proxy's own listeners are refused whatever they say.
	AllowTargets []Target
	// Governord are governord's addresses (host:port), refused as targets:
	// the worker has its own way there. Names are looked up, and looked up
	// again every 30s.
	Governord []string
	// ConnectPorts are the ports a CONNECT may reach; others get 403
	// forbidden-target. Nil: DefaultConnectPorts (443 only).
	ConnectPorts []PortRange
	// Password, when not "", is the password every request's
	// Proxy-Authorization (Basic) must carry; without it the answer is 407
	// Proxy Authentication Required. The username still names the subtask.
	Password string
	// ReadHeaderTimeout, MaxHeaderBytes and IdleTimeout bound client
	// connections (http.Server's fields of the same names).
	ReadHeaderTimeout time.Duration
	MaxHeaderBytes    int
	IdleTimeout       time.Duration
	// DialTimeout bounds connecting to an upstream (504 past it). Zero:
	// DefaultDialTimeout.
	DialTimeout time.Duration
	// ResponseHeaderTimeout bounds waiting for an upstream's headers (504
	// past it). Zero: no limit (a model may think for minutes).
	ResponseHeaderTimeout time.Duration
}

// Defaults of Config's zero fields.
const (
	DefaultWaitTimeout = 30 * time.Second
	DefaultDialTimeout = 10 * time.Second
)

// Proxy is the HTTP side. Set its fields, then serve it (as an http.Handler
// or with Serve); do not change them after. Admitter is required.
type Proxy struct {
	// Admitter admits each request a rule governs. Required.
	Admitter admission.Admitter
	// Rules returns the rules in force; it is called for each request, so a
	// classify.Watcher's Rules method fits. Nil, or a nil result: no rule
	// matches.
	Rules func() *classify.Rules
	// Routes are the base-URL routes for origin-form requests.
	Routes []Route
	// Config is the side's behaviour.
	Config Config
	// Resolver looks up upstream host names. Nil: net.DefaultResolver.
	Resolver Resolver
	// UpstreamTLS is the TLS configuration for upstreams (routes, and
	// https:// URLs sent to the proxy). Nil: the system roots, which
	// SSL_CERT_FILE and SSL_CERT_DIR can point elsewhere.
	UpstreamTLS *tls.Config
	// Logger receives one line per decision. Nil discards.
	Logger *slog.Logger
	// Metrics, if not nil, receives the side's series.
	Metrics *Metrics
	// Intercept, if not nil, lists the hosts whose CONNECT tunnels are
	// terminated here and every request inside governed as plain HTTP is
	// (intercept.go), and mints their certificates. Nil: every tunnel is
	// relayed as bytes.
	Intercept Interceptor

	init      sync.Once
	log       *slog.Logger
	m         *Metrics
	dialer    *dialer
	transport *http.Transport
	gp        *goproxy.ProxyHttpServer
	tunnels   tunnelSet
	inter     *interceptor // the server of intercepted tunnels; nil without Intercept

	mu       sync.Mutex
	servers  []*http.Server
	port     string // the port of the listener Serve was given first, for isSelf
	shutdown bool   // Shutdown has begun: Serve serves nothing more
}

// Route forwards origin-form requests under Prefix to Upstream, for programs
// that take a base URL: GET /openai/v1/models becomes GET
// https://api.openai.com/v1/models, with TLS originated by the sidecar.
type Route struct {
	Prefix   string // starts and ends with "/"
	Upstream *url.URL
}

func (p *Proxy) setup() {
	p.init.Do(func() {
		p.log = p.Logger
		if p.log == nil {
			p.log = slog.New(slog.DiscardHandler)
		}
		p.m = p.Metrics
		if p.m == nil {
			p.m = NewMetrics()
		}
		p.tunnels.gauge = p.m.tunnels
		resolver := p.Resolver
		if resolver == nil {
			resolver = net.DefaultResolver
		}
		timeout := p.Config.DialTimeout
		if timeout <= 0 {
			timeout = DefaultDialTimeout
		}
		p.dialer = &dialer{resolver: resolver, allowLinkLocal: p.Config.AllowLinkLocal, allow: p.Config.AllowTargets,
			governord: &governordAddrs{configured: p.Config.Governord}, timeout: timeout}
		p.transport = newTransport(p.Config, p.dialer, p.UpstreamTLS)
		p.gp = p.newGoproxy()
		if p.Intercept != nil {
			p.inter = p.newInterceptor()
		}
	})
}

func (p *Proxy) waitTimeout() time.Duration {
	if p.Config.WaitTimeout > 0 {
		return p.Config.WaitTimeout
	}
	return DefaultWaitTimeout
}

// rules returns the rules in force, or nil.
func (p *Proxy) rules() *classify.Rules {
	if p.Rules == nil {
		return nil
	}
	return p.Rules()
}

// AddSelf marks addr as the sidecar's own (the metrics server, a pgwire
// listener): a request or tunnel to it is refused, as one to the HTTP
// listener is.
func (p *Proxy) AddSelf(addr net.Addr) {
	p.setup()
	p.dialer.addSelf(addr)
}

// Serve serves the proxy on ln until Shutdown, with the client connection
// bounds of Config. ln's address counts as the proxy's own.
func (p *Proxy) Serve(ln net.Listener) error {
	p.setup()
	p.dialer.addSelf(ln.Addr())
	srv := &http.Server{
		Handler:           p,
		ReadHeaderTimeout: p.Config.ReadHeaderTimeout,
		MaxHeaderBytes:    p.Config.MaxHeaderBytes,
		IdleTimeout:       p.Config.IdleTimeout,
		ErrorLog:          slog.NewLogLogger(p.log.Handler(), slog.LevelDebug),
		// An upgraded connection (websocket) is hijacked by goproxy, which
		// leaves it open; the response body closes it. The idle watchdogs
		// close it too.
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, clientConnKey{}, c)
		},
	}
	p.mu.Lock()
	if p.shutdown {
		p.mu.Unlock()
		ln.Close()
		return nil
	}
	p.servers = append(p.servers, srv)
	if p.port == "" {
		_, p.port, _ = net.SplitHostPort(ln.Addr().String())
	}
	p.mu.Unlock()
	err := srv.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Shutdown stops the servers Serve started gracefully: they stop
// accepting, requests in flight and open tunnels finish until ctx ends,
// then what is left is closed (ending its tickets).
func (p *Proxy) Shutdown(ctx context.Context) error {
	p.setup()
	p.mu.Lock()
	p.shutdown = true
	servers := p.servers
	p.mu.Unlock()
	var errs []error
	for _, srv := range servers {
		if err := srv.Shutdown(ctx); err != nil {
			p.log.Warn("governor-proxy: requests still in flight at the shutdown timeout; closing them", "err", err)
			srv.Close()
		}
	}
	if p.inter != nil {
		// Idle intercepted connections close now, HTTP/2 ones are told to
		// go away; those in the middle of a request finish first.
		if err := p.inter.srv.Shutdown(ctx); err != nil {
			p.inter.srv.Close()
		}
	}
	if err := p.tunnels.wait(ctx); err != nil {
		p.log.Warn("governor-proxy: tunnels still open at the shutdown timeout; closing them")
	}
	p.tunnels.closeAll()
	p.transport.CloseIdleConnections()
	return errors.Join(errs...)
}

// newTransport is the upstream transport: it never reads HTTP(S)_PROXY
// (Proxy is nil) and dials through the checking dialer. It passes bodies
// through untouched: no transparent gzip, so Content-Length and
// Content-Encoding stay the upstream's.
func newTransport(c Config, d *dialer, tlsConf *tls.Config) *http.Transport {
	t := &http.Transport{
		Proxy:                 nil,
		DialContext:           d.DialContext,
		TLSHandshakeTimeout:   d.timeout,
		ResponseHeaderTimeout: c.ResponseHeaderTimeout,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
	}
	if tlsConf != nil {
		t.TLSClientConfig = tlsConf.Clone()
	}
	// HTTP/2 to upstreams that offer it (ALPN); websockets still go over
	// HTTP/1.1, as the transport picks for requests that upgrade.
	if err := http2.ConfigureTransport(t); err != nil {
		t.ForceAttemptHTTP2 = true
	}
	return t
}

// newGoproxy wires goproxy to the proxy's hooks, and turns off what it
// would read from the environment.
func (p *Proxy) newGoproxy() *goproxy.ProxyHttpServer {
	gp := goproxy.NewProxyHttpServer()
	gp.Logger = goproxyLogger{p.log}
	gp.Tr = p.transport
	gp.ConnectDial = nil // NewProxyHttpServer set it from HTTPS_PROXY
	gp.ConnectDialWithReq = p.dialConnect
	gp.ConnectionErrHandler = p.connectErrorHandler
	gp.KeepAcceptEncoding = true
	gp.NonproxyHandler = http.HandlerFunc(p.notFound)
	gp.OnRequest().HandleConnectFunc(p.onConnect) // admits a CONNECT before goproxy hijacks it (connect.go)
	gp.OnRequest().DoFunc(p.onRequest)
	gp.OnResponse().DoFunc(p.onResponse)
	return gp
}

// goproxyLogger sends goproxy's messages (mostly copy errors of connections
// that went away) to the debug level.
type goproxyLogger struct{ log *slog.Logger }

func (l goproxyLogger) Printf(format string, v ...any) {
	if l.log.Enabled(context.Background(), slog.LevelDebug) {
		l.log.Debug("goproxy: " + strings.TrimSpace(fmt.Sprintf(format, v...)))
	}
}

// ServeHTTP serves one request to the proxy: a CONNECT, a request in
// absolute form (a forward-proxied request), or a request in origin form,
// which must fall under a base-URL route.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.setup()
	if r.Method == http.MethodConnect && p.intercepts(r.Host) {
		// Served for the tunnel's whole life, so neither a request in
		// flight nor a span: each request inside it is both.
		if p.Config.Password != "" && !p.authorized(r) {
			p.proxyAuthRequired(w, r)
			return
		}
		p.intercept(w, r)
		return
	}
	p.m.inflight.Add(1)
	defer p.m.inflight.Add(-1)
	if tracing.Enabled() {
		var span trace.Span
		r, span = traceRequest(r)
		defer span.End()
	}
	if p.Config.Password != "" && !p.authorized(r) {
		p.proxyAuthRequired(w, r)
		return
	}
	if idle := p.Config.BodyIdleTimeout; idle > 0 && r.Method != http.MethodConnect {
		iw := newIdleExchange(w, r, idle)
		defer iw.done()
		w = iw
	}
	if r.Method != http.MethodConnect && (!r.URL.IsAbs() || p.isSelf(r.URL.Host, r.URL.Scheme)) {
		// Origin form, or a client that sends even a request to the proxy
		// itself through the proxy (HTTP_PROXY set, base URL pointing at
		// the sidecar): a base-URL route.
		if !p.route(r) {
			p.notFound(w, r)
			return
		}
	}
	p.gp.ServeHTTP(w, r)
}

// isSelf reports whether an absolute URL's host:port is the proxy's own
// HTTP listener, named by an address or as localhost.
func (p *Proxy) isSelf(hostport, scheme string) bool {
	if scheme != "http" {
		return false
	}
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		host, port = hostport, "80"
	}
	p.mu.Lock()
	own := p.port
	p.mu.Unlock()
	n, err := strconv.ParseUint(port, 10, 16)
	if port != own || err != nil {
		return false
	}
	ips := loopbacks
	if !isLocalhost(host) {
		ip, err := netip.ParseAddr(trimBrackets(host))
		if err != nil {
			return false
		}
		ips = []netip.Addr{ip.Unmap()}
	}
	for _, ip := range ips {
		if p.dialer.checkSelf(ip, uint16(n)) != nil {
			return true
		}
	}
	return false
}

// route rewrites an origin-form request under a route's prefix into a
// request to the route's upstream, in place. The rules then see the
// upstream's scheme and host and the rewritten path.
func (p *Proxy) route(r *http.Request) bool {
	u, _, ok := RouteURL(p.Routes, r.URL)
	if !ok {
		return false
	}
	r.URL = u
	r.Host = u.Host
	return true
}

// RouteURL returns where a request for u (origin form: its path and query
// count) goes under the base-URL routes, and the route, or false if no
// route's prefix covers the path. The longest prefix wins.
func RouteURL(routes []Route, u *url.URL) (*url.URL, Route, bool) {
	esc := u.EscapedPath()
	best := -1
	for i, rt := range routes {
		bare := strings.TrimSuffix(rt.Prefix, "/")
		if (esc == bare || strings.HasPrefix(esc, rt.Prefix)) && (best < 0 || len(rt.Prefix) > len(routes[best].Prefix)) {
			best = i
		}
	}
	if best < 0 {
		return nil, Route{}, false
	}
	rt := routes[best]
	out := *rt.Upstream
	newEsc := rt.Upstream.EscapedPath() + strings.TrimPrefix(esc, strings.TrimSuffix(rt.Prefix, "/"))
	if newEsc == "" {
		newEsc = "/"
	}
	out.Path, out.RawPath = unescapePath(newEsc)
	out.RawQuery = u.RawQuery
	return &out, rt, true
}

func unescapePath(esc string) (path, raw string) {
	u, err := url.PathUnescape(esc)
	if err != nil {
		return esc, ""
	}
	return u, esc
}

func (p *Proxy) notFound(w http.ResponseWriter, r *http.Request) {
	p.m.requests.WithLabelValues(ruleUnmatched, outcomeRefused).Inc()
	if r.URL.IsAbs() {
		p.m.denials.WithLabelValues(causeForbiddenTarget).Inc()
		// An absolute URL naming the proxy itself, outside the routes.
		ref := &refusal{code: http.StatusLoopDetected, reason: "Loop Detected", cause: causeForbiddenTarget,
			err: fmt.Errorf("%s is governor-proxy itself, and %s is under no base-URL route; a proxy does not proxy to itself", r.URL.Host, r.URL.Path)}
		resp := ref.response(r)
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, resp.Body)
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "governor-proxy: no route for %s.\nThis is a forward proxy: point HTTP_PROXY and HTTPS_PROXY at it.\n", r.URL.Path)
	if len(p.Routes) > 0 {
		b.WriteString("Base-URL routes:\n")
		for _, rt := range p.Routes {
			fmt.Fprintf(&b, "  %s -> %s\n", rt.Prefix, rt.Upstream)
		}
	}
	http.Error(w, b.String(), http.StatusNotFound)
}
