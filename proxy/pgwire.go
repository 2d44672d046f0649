package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/governor-project/governor/internal/tlsreload"
	"github.com/governor-project/governor/pgwire"
	"github.com/governor-project/governor/proxy/admission"
	"github.com/governor-project/governor/proxy/proxyconfig"
)

// The pgwire listeners: each pgwire[i] of the config is a pgwire.Proxy on
// its own listener, relaying to its upstream. They share the HTTP side's
// rules (the watcher's, so a reload applies from the next statement on)
// and its admission layer: a quota charged over HTTP and one charged by SQL
// are the same quota on the same node, and a subtask named by
// Proxy-Authorization and one named by application_name are the same node.

// pgListener is one served pgwire[i].
type pgListener struct {
	key   string // "pgwire[i]", for logs
	ln    net.Listener
	proxy *pgwire.Proxy
	certs *tlsreload.Reloader // the client leg's certificate; nil without TLS
}

// startPGWire listens on every pgwire[i]. On error nothing is left open.
// It does not serve yet: servePGWire does.
func (s *Sidecar) startPGWire() error {
	for i, pc := range s.cfg.PGWire {
		key := fmt.Sprintf("pgwire[%d]", i)
		upTLS, err := upstreamTLSConfig(key, pc.UpstreamTLS)
		if err != nil {
			s.closePGListeners()
			return err
		}
		certs, clientTLS, err := s.clientTLSConfig(key, pc.TLS)
		if err != nil {
			s.closePGListeners()
			return err
		}
		ln, err := net.Listen("tcp", pc.Listen)
		if err != nil {
			if certs != nil {
				certs.Close()
			}
			s.closePGListeners()
			return fmt.Errorf("listen on %s (%s.listen): %w", pc.Listen, key, err)
		}
		px := &pgwire.Proxy{
			Upstream:                pc.Upstream,
			UpstreamTLS:             upTLS,
			TLSConfig:               clientTLS,
			Rules:                   s.rules,
			Admitter:                &s.pgGate,
			WaitTimeout:             pc.WaitTimeout,
			TaskFromApplicationName: pc.TaskFrom == "application_name",
			MaxMessageSize:          pc.MaxMessageBytes,
			Caps:                    s.capNotices(pc),
			DryRun:                  s.admitter,
			WriteCheck:              s.admitter,
			Shadow:                  s.cfg.HTTP.Shadow,
			Logger:                  s.log,
			Metrics:                 s.pgMetrics,
		}
		s.pg = append(s.pg, &pgListener{key: key, ln: ln, proxy: px, certs: certs})
	}
	if len(s.pg) > 0 {
		if err := s.pgMetrics.Register(s.reg); err != nil {
			return err
		}
		s.reg.MustRegister(pgFailureCollector{s: s}, s.pgGate.gauge)
	}
	return nil
}

// servePGWire serves every listener until shutdown closes it.
func (s *Sidecar) servePGWire() {
	for _, l := range s.pg {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			err := l.proxy.Serve(l.ln)
			if err != nil && !errors.Is(err, pgwire.ErrClosed) && !errors.Is(err, net.ErrClosed) {
				s.log.Error("governor-proxy: pgwire listener stopped", "listener", l.key, "err", err)
			}
		}()
	}
}

// closePGListeners stops accepting, and stops watching the TLS files: no
// handshake is to come.
func (s *Sidecar) closePGListeners() {
	for _, l := range s.pg {
		l.ln.Close()
		if l.certs != nil {
			l.certs.Close()
		}
	}
}

// PGWireAddrs are the addresses the pgwire listeners listen on, in the
// order of the config's pgwire list.
func (s *Sidecar) PGWireAddrs() []string {
	addrs := make([]string, len(s.pg))
	for i, l := range s.pg {
		addrs[i] = l.ln.Addr().String()
	}
	return addrs
}

// stopPGWire stops accepting, admits no new transaction, lets the open ones
// finish until ctx ends, then closes every connection (which ends their
// tickets). The returned channel is closed when that is done.
func (s *Sidecar) stopPGWire(ctx context.Context) <-chan struct{} {
	done := make(chan struct{})
	if len(s.pg) == 0 {
		close(done)
		return done
	}
	drained := s.pgGate.drain()
	s.closePGListeners()
	go func() {
		defer close(done)
		select {
		case <-drained:
		case <-ctx.Done():
			s.log.Warn("governor-proxy: pgwire transactions still open at the shutdown timeout; closing their connections",
				"open", s.pgGate.open())
		}
		for _, l := range s.pg {
			l.proxy.Close()
		}
	}()
	return done
}

// clientTLSConfig is the TLS a listener answers SSLRequest with. The files
// are watched: each new handshake gets the pair in force, so a rotated
// certificate needs no restart, and connections already open keep theirs.
func (s *Sidecar) clientTLSConfig(key string, f proxyconfig.TLSFiles) (*tlsreload.Reloader, *tls.Config, error) {
	if f.CertFile == "" {
		return nil, nil, nil
	}
	certs, err := tlsreload.New(f.CertFile, f.KeyFile, tlsreload.Options{Interval: s.reloadInterval,
		OnReload: func(cert *tls.Certificate, err error) { s.certReloaded(key, f, cert, err) }})
	if err != nil {
		return nil, nil, &proxyconfig.ConfigError{Key: key + ".tls", Problem: err.Error()}
	}
	return certs, &tls.Config{GetCertificate: certs.GetCertificate, MinVersion: tls.VersionTLS12}, nil
}

// certReloaded logs and counts a change to a listener's TLS files.
func (s *Sidecar) certReloaded(key string, f proxyconfig.TLSFiles, cert *tls.Certificate, err error) {
	if err != nil {
		s.tlsReloads.WithLabelValues("failure").Inc()
		s.log.Error("governor-proxy: the TLS certificate failed to load; the one in force stays", "listener", key,
			"cert_file", f.CertFile, "key_file", f.KeyFile, "err", err)
		return
	}
	s.tlsReloads.WithLabelValues("success").Inc()
	s.log.Info("governor-proxy: TLS certificate reloaded", "listener", key, "cert_file", f.CertFile,
		"subject", cert.Leaf.Subject.String(), "not_after", cert.Leaf.NotAfter)
}

func upstreamTLSConfig(key string, u proxyconfig.UpstreamTLS) (*tls.Config, error) {
	if !u.Enabled {
		return nil, nil
	}
	c := &tls.Config{ServerName: u.ServerName, MinVersion: tls.VersionTLS12}
	if u.CAFile != "" {
		pem, err := os.ReadFile(u.CAFile)
		if err != nil {
			return nil, &proxyconfig.ConfigError{Key: key + ".upstream_tls.ca_file", Problem: err.Error()}
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, &proxyconfig.ConfigError{Key: key + ".upstream_tls.ca_file", Problem: fmt.Sprintf("%s holds no PEM certificate", u.CAFile)}
		}
	}
	return c, nil
}

// gate is the pgwire side's admitter: the sidecar's, plus a count of the
// transactions holding a slot, so that a shutdown can refuse new ones
// (53000, stopping) and wait for the open ones. A later statement of an
// open transaction is still charged while it drains: it is finishing.
type gate struct {
	next  admission.Admitter
	gauge prometheus.Gauge

	mu       sync.Mutex
	n        int
	draining bool
	idle     chan struct{} // closed once draining with n == 0
}

func (g *gate) Admit(ctx context.Context, r admission.Request) (admission.Ticket, error) {
	if r.Class == "" {
		return g.next.Admit(ctx, r)
	}
	g.mu.Lock()
	if g.draining {
		g.mu.Unlock()
		return nil, &admission.Denial{Cause: admission.CauseStopping, Class: r.Class,
			Err: errors.New("governor-proxy is shutting down and admits no new transaction")}
	}
	g.n++
	g.mu.Unlock()
	g.gauge.Inc()
	t, err := g.next.Admit(ctx, r)
	if err != nil || t == nil {
		g.end()
		return t, err
	}
	return &gateTicket{t: t, g: g}, nil
}

// TryAdmit passes the admitter's fast path through (admission.Fast): a
// gate that hid it would send every transaction the slow way, with a
// context and a timer, although its budget is in hand.
func (g *gate) TryAdmit(r admission.Request) (admission.Ticket, bool) {
	f, ok := g.next.(admission.Fast)
	if !ok {
		return nil, false
	}
	if r.Class == "" {
		return f.TryAdmit(r)
	}
	g.mu.Lock()
	if g.draining {
		g.mu.Unlock()
		return nil, false // Admit refuses it
	}
	g.n++
	g.mu.Unlock()
	g.gauge.Inc()
	t, ok := f.TryAdmit(r)
	if !ok || t == nil {
		g.end()
		return t, ok
	}
	return &gateTicket{t: t, g: g}, true
}

func (g *gate) end() {
	g.gauge.Dec()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.n--
	if g.draining && g.n == 0 {
		close(g.idle)
	}
}

func (g *gate) open() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.n
}

// drain refuses new transactions; the channel is closed when none is open.
func (g *gate) drain() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.draining {
		g.draining = true
		g.idle = make(chan struct{})
		if g.n == 0 {
			close(g.idle)
		}
	}
	return g.idle
}

type gateTicket struct {
	t    admission.Ticket
	g    *gate
	once sync.Once
}

func (t *gateTicket) End(latency time.Duration, overloaded bool) {
	t.once.Do(func() {
		t.t.End(latency, overloaded)
		t.g.end()
	})
}

// pgFailureCollector exposes the pgwire proxies' failure counts (summed
// over listeners) as governor_proxy_pgwire_failures_total{kind}. Denials
// are counted by cause in governor_proxy_pgwire_denials_total instead.
type pgFailureCollector struct{ s *Sidecar }

var pgFailuresDesc = prometheus.NewDesc("governor_proxy_pgwire_failures_total",
	"pgwire connections that failed, by kind: startup, tls, upstream, auth, too_large, protocol, cancel.",
	[]string{"kind"}, nil)

func (c pgFailureCollector) Describe(ch chan<- *prometheus.Desc) { ch <- pgFailuresDesc }

func (c pgFailureCollector) Collect(ch chan<- prometheus.Metric) {
	sum := map[string]uint64{}
	for _, l := range c.s.pg {
		for k, v := range l.proxy.Counts() {
			sum[k] += v
		}
	}
	for k, v := range sum {
		if strings.HasPrefix(k, "deny_") {
			continue
		}
		ch <- prometheus.MustNewConstMetric(pgFailuresDesc, prometheus.CounterValue, float64(v), k)
	}
}

// capNotices is what a listener reads the caps' state from for its
// notices: the session with governord, when pgwire[i].cap_notices is on.
func (s *Sidecar) capNotices(pc proxyconfig.PGWireConfig) admission.CapReader {
	if !pc.CapNotices {
		return nil
	}
	return s.admitter
}
