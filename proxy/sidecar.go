package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"

	"github.com/governor-project/governor/classify"
	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/internal/apikey"
	"github.com/governor-project/governor/internal/tracing"
	"github.com/governor-project/governor/pgwire"
	"github.com/governor-project/governor/proxy/budget"
	"github.com/governor-project/governor/proxy/httpproxy"
	"github.com/governor-project/governor/proxy/intercept"
	"github.com/governor-project/governor/proxy/proxyconfig"
)

// Options are what a Sidecar takes from its caller rather than from the
// config file. The zero value is the production setting.
type Options struct {
	// Logger receives one line per decision and the sidecar's own events.
	// Nil discards.
	Logger *slog.Logger
	// Resolver looks up upstream host names. Nil means net.DefaultResolver.
	Resolver httpproxy.Resolver
	// UpstreamTLS is the TLS configuration for HTTP upstreams (routes, and
	// https:// URLs sent to the proxy). Nil means the system roots.
	UpstreamTLS *tls.Config
	// ReloadInterval is how often the rule file, and the pgwire listeners'
	// TLS files, are polled. Zero means classify.DefaultInterval (and
	// tlsreload.DefaultInterval).
	ReloadInterval time.Duration
	// OnReload, if not nil, is called after each reload of the rules that
	// changed something, with the error if it failed (the old rules then
	// stay in force).
	OnReload func(error)
	// GovernorOptions are added to the SDK's options when dialing governord
	// (after the config's address and key), e.g. governor.WithTTL.
	GovernorOptions []governor.Option
}

// Sidecar is a running governor-proxy: the HTTP side and the pgwire
// listeners over one admission layer, the rule watcher, and the metrics
// and health server.
type Sidecar struct {
	cfg       proxyconfig.Config
	log       *slog.Logger
	reg       *prometheus.Registry
	reloads   *prometheus.CounterVec
	admitter  *budget.Admitter
	pgGate    gate
	pgMetrics *pgwire.Metrics
	http      *httpproxy.Proxy
	pg        []*pgListener
	watcher   *classify.Watcher
	caWatcher *intercept.Watcher // the interception CA's files; nil without interception
	static    *classify.Rules
	stopping  atomic.Bool

	// tlsReloads counts changes to the pgwire listeners' TLS files, polled
	// every reloadInterval.
	tlsReloads     *prometheus.CounterVec
	reloadInterval time.Duration

	ln, mln   net.Listener
	msrv      *http.Server
	stopRun   context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// Start builds the sidecar, listens on http.listen, metrics_listen and every
// pgwire listener, starts the session with governord in the background,
// and returns once it is listening. Until the first session is open, every
// governed request is denied (unavailable): the sidecar fails closed. A
// config problem is a *ConfigError. ctx bounds only the start: the sidecar
// then runs until Shutdown or Close.
func Start(ctx context.Context, cfg proxyconfig.Config, opts Options) (*Sidecar, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Sidecar{cfg: cfg, log: log, reg: prometheus.NewRegistry(), static: cfg.Rules, pgMetrics: pgwire.NewMetrics()}
	s.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_proxy_rule_reloads_total",
		Help: "Rule file reloads, by outcome (success, failure). A failed reload keeps the old rules."}, []string{"outcome"})
	s.tlsReloads = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_proxy_tls_reloads_total",
		Help: "Changes to the pgwire listeners' TLS certificate and key files, and to the interception CA's, by outcome (success, failure). A failure keeps the pair in force."},
		[]string{"outcome"})
	for _, o := range []string{"success", "failure"} {
		s.reloads.WithLabelValues(o)
		s.tlsReloads.WithLabelValues(o)
	}
	s.reloadInterval = opts.ReloadInterval
	s.reg.MustRegister(s.reloads, s.tlsReloads, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	if cfg.Path != "" {
		if err := s.watch(opts); err != nil {
			return nil, err
		}
	}
	s.warnUnenforced(s.rules())
	s.warnShortKey()
	s.admitter = s.newAdmitter(opts)
	s.pgGate = gate{next: s.admitter, gauge: prometheus.NewGauge(prometheus.GaugeOpts{Name: "governor_proxy_pgwire_transactions_open",
		Help: "pgwire transactions holding a slot now."})}
	upstreamTLS, err := upstreamRoots(opts.UpstreamTLS, cfg.HTTP.Intercept.UpstreamCAFile)
	if err != nil {
		s.closeWatcher()
		return nil, err
	}
	icp, err := s.startInterception()
	if err != nil {
		s.closeWatcher()
		return nil, err
	}
	hm := httpproxy.NewMetrics()
	s.http = &httpproxy.Proxy{Admitter: s.admitter, Rules: s.rules, Routes: cfg.Routes, Config: cfg.HTTP.ProxyConfig(cfg.GovernordAddrs()),
		Resolver: opts.Resolver, UpstreamTLS: upstreamTLS, Logger: log, Metrics: hm}
	if icp != nil {
		s.http.Intercept = icp
	}
	if err := hm.Register(s.reg); err != nil {
		s.closeWatcher()
		return nil, err
	}
	if err := s.listen(); err != nil {
		s.closeWatcher()
		return nil, err
	}

	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.stopRun = cancel
	go s.admitter.Run(runCtx)

	s.serve("http", func() error { return s.http.Serve(s.ln) })
	if s.mln != nil {
		s.msrv = &http.Server{Handler: s.healthHandler(), ReadHeaderTimeout: proxyconfig.DefaultReadHeaderTimeout, IdleTimeout: proxyconfig.DefaultIdleTimeout}
		s.serve("metrics", func() error { return s.msrv.Serve(s.mln) })
	}
	s.servePGWire()
	log.Info("governor-proxy listening", "http", s.Addr(), "metrics", s.MetricsAddr(), "pgwire", s.PGWireAddrs(), "task", cfg.Task.Name,
		"rules", s.rules().Len(), "routes", len(cfg.Routes), "delegation", cfg.Delegation.Enabled)
	return s, nil
}

// newAdmitter is the admission layer on one session with governord.
func (s *Sidecar) newAdmitter(opts Options) *budget.Admitter {
	dial := []governor.Option{
		governor.WithLogger(s.log),
		// The sidecar may inherit HTTPS_PROXY pointing at itself: its own
		// connection to governord must never go through it.
		governor.WithGRPCOptions(grpc.WithNoProxy()),
	}
	if h := tracing.ClientHandler(); h != nil {
		dial = append(dial, governor.WithGRPCOptions(grpc.WithStatsHandler(h))) // governord calls in the request's trace
	}
	if s.cfg.Governor.Addr != "" {
		dial = append(dial, governor.WithAddr(s.cfg.Governor.Addr))
	}
	if s.cfg.Governor.APIKey != "" {
		dial = append(dial, governor.WithAPIKey(s.cfg.Governor.APIKey))
	}
	t := s.cfg.Task
	d := s.cfg.Delegation
	m := budget.NewMetrics()
	a := budget.New(budget.Config{
		Task: governor.Spec{Name: t.Name, Quotas: t.Quotas, Limits: t.Limits, Deadline: t.Deadline},
		Dial: append(dial, opts.GovernorOptions...), Delegate: d.Enabled, Linger: d.Linger,
		MaxBlock: d.MaxBlock, MaxReservation: d.MaxReservation, SettleEvery: d.SettleEvery, SubtaskIdle: t.SubtaskIdle,
		Logger: s.log, Metrics: m,
	})
	if err := m.Register(s.reg, a); err != nil {
		panic(fmt.Sprintf("governor-proxy: metrics: %v", err)) // names are fixed: a clash is a bug
	}
	return a
}

// listen opens the HTTP, metrics and pgwire listeners; on error none is
// left open.
func (s *Sidecar) listen() error {
	var err error
	if s.ln, err = net.Listen("tcp", s.cfg.HTTP.Listen); err != nil {
		return fmt.Errorf("listen on %s (http.listen): %w", s.cfg.HTTP.Listen, err)
	}
	if s.cfg.MetricsListen != "" {
		if s.mln, err = net.Listen("tcp", s.cfg.MetricsListen); err != nil {
			s.ln.Close()
			return fmt.Errorf("listen on %s (metrics_listen): %w", s.cfg.MetricsListen, err)
		}
		s.http.AddSelf(s.mln.Addr())
	}
	if err := s.startPGWire(); err != nil {
		s.ln.Close()
		if s.mln != nil {
			s.mln.Close()
		}
		return err
	}
	// Before anything is served: a request that arrives first must find
	// the pgwire listeners refused already.
	for _, l := range s.pg {
		s.http.AddSelf(l.ln.Addr())
	}
	return nil
}

// watch loads the rules from the config file and reloads them when it
// changes.
func (s *Sidecar) watch(opts Options) error {
	// A reload must be a file that would start the proxy, not only one
	// whose rules parse.
	wopts := []classify.WatchOption{classify.WithValidate(func(text []byte) error {
		_, err := proxyconfig.ParseConfig(text)
		return err
	})}
	if opts.ReloadInterval > 0 {
		wopts = append(wopts, classify.WithInterval(opts.ReloadInterval))
	}
	w, err := classify.NewWatcher(s.cfg.Path, func(r *classify.Rules, err error) { s.reloaded(r, err, opts.OnReload) }, wopts...)
	if err != nil {
		if proxyconfig.IsConfigError(err) {
			return err
		}
		return &proxyconfig.ConfigError{Key: "rules", Problem: err.Error()}
	}
	s.watcher = w
	return nil
}

func (s *Sidecar) serve(what string, serve func() error) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := serve(); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
			s.log.Error("governor-proxy: server stopped", "server", what, "err", err)
		}
	}()
}

// rules returns the rules in force.
func (s *Sidecar) rules() *classify.Rules {
	if s.watcher != nil {
		return s.watcher.Rules()
	}
	return s.static
}

func (s *Sidecar) reloaded(r *classify.Rules, err error, hook func(error)) {
	if err != nil {
		s.reloads.WithLabelValues("failure").Inc()
		s.log.Error("governor-proxy: the rule file failed to load; the old rules stay in force", "file", s.cfg.Path, "err", err)
	} else {
		s.reloads.WithLabelValues("success").Inc()
		s.log.Info("governor-proxy: rules reloaded", "file", s.cfg.Path, "rules", r.Len())
		s.warnUnenforced(r)
	}
	if hook != nil {
		hook(err)
	}
}

// warnShortKey warns of an API key that could be guessed. It names where
// the key came from, never the key.
func (s *Sidecar) warnShortKey() {
	key, from := s.cfg.Governor.APIKey, "governor.api_key"
	if key == "" {
		key, from = os.Getenv(governor.EnvAPIKey), governor.EnvAPIKey
	}
	if key != "" && len(key) < apikey.MinLen {
		s.log.Warn(fmt.Sprintf("governor-proxy: an API key shorter than %d bytes can be guessed; use %d random bytes or more (openssl rand -hex %d)",
			apikey.MinLen, apikey.MinLen, apikey.MinLen), "key", from)
	}
}

// warnUnenforced names the rules whose charge_from_header resource has no
// upfront charge: such a budget is charged after each response, but nothing
// refuses a request once it is spent, because admission never asks for it.
func (s *Sidecar) warnUnenforced(rs *classify.Rules) {
	for _, d := range rs.Decisions() {
		if hc := d.ChargeFromHeader; hc != nil && d.Charges[hc.Resource] <= 0 {
			s.log.Warn("governor-proxy: charge_from_header without an upfront charge of the same resource: "+
				"the budget is recorded but not enforced before requests; add e.g. charge: {"+hc.Resource+": 1}",
				"rule", d.Rule, "resource", hc.Resource)
		}
	}
}

func (s *Sidecar) readiness() (bool, string) {
	switch {
	case s.stopping.Load():
		return false, "stopping"
	case !s.admitter.Up():
		return false, "no session with governord: requests are denied (fail closed)"
	}
	return true, ""
}

// Addr is the address the HTTP proxy listens on.
func (s *Sidecar) Addr() string { return s.ln.Addr().String() }

// MetricsAddr is the address of /metrics, /healthz and /readyz; "" if off.
func (s *Sidecar) MetricsAddr() string {
	if s.mln == nil {
		return ""
	}
	return s.mln.Addr().String()
}

// Settle reports every quota unit spent so far to governord now, rather
// than at the next settlement, and returns when governord has them.
func (s *Sidecar) Settle(ctx context.Context) { s.admitter.Settle(ctx) }

// Ready is closed once the first session with governord is open and the
// worker's task found or created.
func (s *Sidecar) Ready() <-chan struct{} { return s.admitter.Ready() }

// Shutdown stops the sidecar gracefully: it stops accepting, lets requests
// in flight, open tunnels and open pgwire transactions finish until ctx
// ends (a pgwire connection starts no new governed transaction meanwhile:
// 53000), then closes what is left, gives back what governord delegated
// and closes the session. The metrics server stops last, so /readyz says
// "stopping" meanwhile.
func (s *Sidecar) Shutdown(ctx context.Context) error {
	s.closeOnce.Do(func() { s.closeErr = s.shutdown(ctx) })
	return s.closeErr
}

// Close stops the sidecar at once: Shutdown with no time to finish.
func (s *Sidecar) Close() error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return s.Shutdown(ctx)
}

func (s *Sidecar) shutdown(ctx context.Context) error {
	s.stopping.Store(true)
	var errs []error
	pgDone := s.stopPGWire(ctx)
	s.http.Shutdown(ctx)
	<-pgDone // every pgwire connection closed, and its ticket ended
	s.closeWatcher()
	s.stopRun()
	// Giving back and closing get a moment of their own even when ctx has
	// run out: the session's close releases whatever is left anyway.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	if ctx.Err() == nil {
		rctx = ctx
	}
	if err := s.admitter.Close(rctx); err != nil {
		errs = append(errs, fmt.Errorf("close the session: %w", err))
	}
	if s.msrv != nil {
		mctx, mcancel := context.WithTimeout(context.Background(), time.Second)
		s.msrv.Shutdown(mctx)
		mcancel()
	}
	s.wg.Wait()
	s.log.Info("governor-proxy stopped")
	return errors.Join(errs...)
}

func (s *Sidecar) closeWatcher() {
	if s.watcher != nil {
		s.watcher.Close()
	}
	if s.caWatcher != nil {
		s.caWatcher.Close()
	}
}
