package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elazarl/goproxy"
	"golang.org/x/net/http2"

	"github.com/governor-project/governor/classify"
	"github.com/governor-project/governor/governor"
)

// Options are what a Proxy takes from its caller rather than from the
// config file. The zero value is the production setting.
type Options struct {
	// Logger receives one line per decision and the proxy's own events.
	// Nil discards.
	Logger *slog.Logger
	// Resolver looks up upstream host names. Nil means net.DefaultResolver.
	Resolver Resolver
	// UpstreamTLS is the TLS configuration for upstreams (routes, and
	// https:// URLs sent to the proxy). Nil means the system roots, which
	// SSL_CERT_FILE and SSL_CERT_DIR can point elsewhere.
	UpstreamTLS *tls.Config
	// ReloadInterval is how often the rule file is polled. Zero means
	// classify.DefaultInterval.
	ReloadInterval time.Duration
	// OnReload, if not nil, is called after each reload of the rules that
	// changed something, with the error if it failed (the old rules then
	// stay in force).
	OnReload func(error)
	// GovernorOptions are added to the SDK's options when dialing governord
	// (after the config's address and key), e.g. governor.WithTTL.
	GovernorOptions []governor.Option
}

// Proxy is governor-proxy's HTTP side: a forward proxy (plain HTTP and
// CONNECT) and a reverse proxy for base-URL routes, which admits each
// request through governord before it forwards it. It is an http.Handler;
// Start also serves it, and the metrics, on the configured listeners.
type Proxy struct {
	cfg       Config
	port      string // the HTTP listener's port, for isSelf
	log       *slog.Logger
	metrics   *metrics
	gov       *governance
	dialer    *dialer
	transport *http.Transport
	gp        *goproxy.ProxyHttpServer
	routes    []Route
	watcher   *classify.Watcher
	static    *classify.Rules
	tunnels   tunnelSet
	stopping  atomic.Bool
	pg        []*pgListener // the pgwire listeners (pgwire.go)
	pgTx      txTracker

	srv, msrv *http.Server
	ln, mln   net.Listener
	stopGov   context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// Start builds the proxy, listens on http.listen and metrics_listen, starts
// the session with governord in the background, and returns once it is
// listening. Until the first session is open, every governed request is
// denied (503, unavailable): the proxy fails closed. A config problem is a
// *ConfigError. ctx bounds only the start: the proxy then runs until
// Shutdown or Close.
func Start(ctx context.Context, cfg Config, opts Options) (*Proxy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	resolver := opts.Resolver
	if resolver == nil {
		resolver = net.DefaultResolver
	}
	p := &Proxy{cfg: cfg, log: log, metrics: newMetrics(), static: cfg.Rules}
	p.tunnels.gauge = p.metrics.tunnels
	p.pgTx.gauge = p.metrics.pgOpen
	p.routes = append([]Route(nil), cfg.Routes...)
	p.dialer = &dialer{resolver: resolver, allowLinkLocal: cfg.HTTP.AllowLinkLocal, timeout: cfg.HTTP.DialTimeout}

	if cfg.Path != "" {
		// A reload must be a file that would start the proxy, not only one
		// whose rules parse.
		wopts := []classify.WatchOption{classify.WithValidate(func(text []byte) error {
			_, err := ParseConfig(text)
			return err
		})}
		if opts.ReloadInterval > 0 {
			wopts = append(wopts, classify.WithInterval(opts.ReloadInterval))
		}
		w, err := classify.NewWatcher(cfg.Path, func(r *classify.Rules, err error) { p.reloaded(r, err, opts.OnReload) }, wopts...)
		if err != nil {
			var ce *classify.Error
			if errors.As(err, &ce) {
				return nil, &ConfigError{Key: ce.Key(), Problem: ce.Error()}
			}
			return nil, &ConfigError{Key: "rules", Problem: err.Error()}
		}
		p.watcher = w
	}
	p.warnUnenforced(p.rules())

	p.transport = newTransport(cfg.HTTP, p.dialer, opts.UpstreamTLS)
	p.gp = p.newGoproxy()

	var err error
	if p.ln, err = net.Listen("tcp", cfg.HTTP.Listen); err != nil {
		p.closeWatcher()
		return nil, fmt.Errorf("listen on %s (http.listen): %w", cfg.HTTP.Listen, err)
	}
	p.dialer.addSelf(p.ln.Addr())
	_, p.port, _ = net.SplitHostPort(p.ln.Addr().String())
	if cfg.MetricsListen != "" {
		if p.mln, err = net.Listen("tcp", cfg.MetricsListen); err != nil {
			p.ln.Close()
			p.closeWatcher()
			return nil, fmt.Errorf("listen on %s (metrics_listen): %w", cfg.MetricsListen, err)
		}
		p.dialer.addSelf(p.mln.Addr())
	}
	if err = p.startPGWire(); err != nil {
		p.ln.Close()
		if p.mln != nil {
			p.mln.Close()
		}
		p.closeWatcher()
		return nil, err
	}

	p.gov = newGovernance(cfg, log, p.metrics, opts.GovernorOptions)
	govCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p.stopGov = cancel
	go p.gov.run(govCtx)

	p.srv = &http.Server{
		Handler:           p,
		ReadHeaderTimeout: cfg.HTTP.ReadHeaderTimeout,
		MaxHeaderBytes:    cfg.HTTP.MaxHeaderBytes,
		IdleTimeout:       cfg.HTTP.IdleTimeout,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		// An upgraded connection (websocket) is hijacked by goproxy, which
		// leaves it open; the response body closes it.
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, clientConnKey{}, c)
		},
	}
	p.serve(p.srv, p.ln, "http")
	if p.mln != nil {
		p.msrv = &http.Server{Handler: p.metrics.handler(p.readiness), ReadHeaderTimeout: DefaultReadHeaderTimeout}
		p.serve(p.msrv, p.mln, "metrics")
	}
	p.servePGWire()
	log.Info("governor-proxy listening", "http", p.Addr(), "metrics", p.MetricsAddr(), "pgwire", p.PGWireAddrs(), "task", cfg.Task.Name,
		"rules", p.rules().Len(), "routes", len(p.routes))
	return p, nil
}

func (p *Proxy) serve(srv *http.Server, ln net.Listener, what string) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			p.log.Error("governor-proxy: server stopped", "server", what, "err", err)
		}
	}()
}

// newTransport is the upstream transport: it never reads HTTP(S)_PROXY
// (Proxy is nil) and dials through the checking dialer. It passes bodies
// through untouched: no transparent gzip, so Content-Length and
// Content-Encoding stay the upstream's.
func newTransport(h HTTPConfig, d *dialer, tlsConf *tls.Config) *http.Transport {
	t := &http.Transport{
		Proxy:                 nil,
		DialContext:           d.DialContext,
		TLSHandshakeTimeout:   h.DialTimeout,
		ResponseHeaderTimeout: h.ResponseHeaderTimeout,
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
	p.metrics.inflight.Add(1)
	defer p.metrics.inflight.Add(-1)
	if idle := p.cfg.HTTP.BodyIdleTimeout; idle > 0 && r.Method != http.MethodConnect {
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
	if strings.EqualFold(host, "localhost") {
		host = "127.0.0.1"
	}
	if port != p.port {
		return false
	}
	var r *refusal
	return errors.As(p.dialer.refuseLiteral(net.JoinHostPort(host, port), "80"), &r) && r.code == http.StatusLoopDetected
}

// route rewrites an origin-form request under a route's prefix into a
// request to the route's upstream, in place. The rules then see the
// upstream's scheme and host and the rewritten path.
func (p *Proxy) route(r *http.Request) bool {
	u, _, ok := RouteURL(p.routes, r.URL)
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
	p.metrics.requests.WithLabelValues(ruleUnmatched, outcomeRefused).Inc()
	if r.URL.IsAbs() {
		// An absolute URL naming the proxy itself, outside the routes.
		ref := &refusal{code: http.StatusLoopDetected, reason: "Loop Detected",
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
	if len(p.routes) > 0 {
		b.WriteString("Base-URL routes:\n")
		for _, rt := range p.routes {
			fmt.Fprintf(&b, "  %s -> %s\n", rt.Prefix, rt.Upstream)
		}
	}
	http.Error(w, b.String(), http.StatusNotFound)
}

// rules returns the rules in force.
func (p *Proxy) rules() *classify.Rules {
	if p.watcher != nil {
		return p.watcher.Rules()
	}
	return p.static
}

func (p *Proxy) reloaded(r *classify.Rules, err error, hook func(error)) {
	if err != nil {
		p.metrics.reloads.WithLabelValues("failure").Inc()
		p.log.Error("governor-proxy: the rule file failed to load; the old rules stay in force", "file", p.cfg.Path, "err", err)
	} else {
		p.metrics.reloads.WithLabelValues("success").Inc()
		p.log.Info("governor-proxy: rules reloaded", "file", p.cfg.Path, "rules", r.Len())
		p.warnUnenforced(r)
	}
	if hook != nil {
		hook(err)
	}
}

// warnUnenforced names the rules whose charge_from_header resource has no
// upfront charge: such a budget is charged after each response, but nothing
// refuses a request once it is spent, because admission never asks for it.
func (p *Proxy) warnUnenforced(rs *classify.Rules) {
	for _, d := range rs.Decisions() {
		if hc := d.ChargeFromHeader; hc != nil && d.Charges[hc.Resource] <= 0 {
			p.log.Warn("governor-proxy: charge_from_header without an upfront charge of the same resource: "+
				"the budget is recorded but not enforced before requests; add e.g. charge: {"+hc.Resource+": 1}",
				"rule", d.Rule, "resource", hc.Resource)
		}
	}
}

func (p *Proxy) readiness() (bool, string) {
	switch {
	case p.stopping.Load():
		return false, "stopping"
	case p.gov.session() == nil:
		return false, "no session with governord: requests are denied (fail closed)"
	}
	return true, ""
}

// Addr is the address the HTTP proxy listens on.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// MetricsAddr is the address of /metrics, /healthz and /readyz; "" if off.
func (p *Proxy) MetricsAddr() string {
	if p.mln == nil {
		return ""
	}
	return p.mln.Addr().String()
}

// Ready is closed once the first session with governord is open and the
// worker's task found or created.
func (p *Proxy) Ready() <-chan struct{} { return p.gov.ready }

// Shutdown stops the proxy gracefully: it stops accepting, lets requests in
// flight, open tunnels and open pgwire transactions finish until ctx ends
// (a pgwire connection starts no new governed transaction meanwhile:
// 53000), then closes what is left, releases every lease and closes the
// session. The metrics server stops last, so /readyz says "stopping"
// meanwhile.
func (p *Proxy) Shutdown(ctx context.Context) error {
	p.closeOnce.Do(func() { p.closeErr = p.shutdown(ctx) })
	return p.closeErr
}

// Close stops the proxy at once: Shutdown with no time to finish.
func (p *Proxy) Close() error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return p.Shutdown(ctx)
}

func (p *Proxy) shutdown(ctx context.Context) error {
	p.stopping.Store(true)
	var errs []error
	pgDone := p.stopPGWire(ctx)
	if err := p.srv.Shutdown(ctx); err != nil {
		p.log.Warn("governor-proxy: requests still in flight at the shutdown timeout; closing them", "err", err)
		p.srv.Close()
	}
	if err := p.tunnels.wait(ctx); err != nil {
		p.log.Warn("governor-proxy: tunnels still open at the shutdown timeout; closing them")
	}
	p.tunnels.closeAll()
	<-pgDone // every pgwire connection closed, and its lease's release queued
	p.transport.CloseIdleConnections()
	p.closeWatcher()
	p.stopGov()
	// Releases get a moment of their own even when ctx has run out: the
	// session's close releases whatever is left anyway.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	if ctx.Err() == nil {
		rctx = ctx
	}
	if err := p.gov.close(rctx); err != nil {
		errs = append(errs, fmt.Errorf("close the session: %w", err))
	}
	if p.msrv != nil {
		mctx, mcancel := context.WithTimeout(context.Background(), time.Second)
		p.msrv.Shutdown(mctx)
		mcancel()
	}
	p.wg.Wait()
	p.log.Info("governor-proxy stopped")
	return errors.Join(errs...)
}

func (p *Proxy) closeWatcher() {
	if p.watcher != nil {
		p.watcher.Close()
	}
}
