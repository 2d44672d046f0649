package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/governor-project/governor/pgwire"
)

// The pgwire listeners: each pgwire[i] of the config is a pgwire.Proxy on
// its own listener, relaying to its upstream. They share the HTTP side's
// rules (the watcher's, so a reload applies from the next statement on),
// its session with governord and its task: pgAdmitter is a pgwire.Admitter
// on top of governance.admit, so a quota charged over HTTP and one charged
// by SQL are the same quota on the same node, and a subtask named by
// Proxy-Authorization and one named by application_name are the same node.

// pgListener is one served pgwire[i].
type pgListener struct {
	key   string // "pgwire[i]", for logs
	ln    net.Listener
	proxy *pgwire.Proxy
}

// Outcomes of the pgwire metrics.
const (
	pgAdmitted = "admitted" // a transaction's lease (and charges) granted
	pgCharged  = "charged"  // a statement's charges inside a transaction granted
	pgDenied   = "denied"   // refused; see governor_proxy_pgwire_denials_total
)

// causeStopping is a pgwire denial cause: the sidecar is shutting down and
// admits no new transaction (SQLSTATE 53000, as when governord is away).
const causeStopping = "stopping"

// startPGWire listens on every pgwire[i]. On error nothing is left open.
// It does not serve yet: servePGWire does, once governance exists.
func (p *Proxy) startPGWire() error {
	for i, pc := range p.cfg.PGWire {
		key := fmt.Sprintf("pgwire[%d]", i)
		clientTLS, err := clientTLSConfig(key, pc.TLS)
		if err != nil {
			p.closePGListeners()
			return err
		}
		upTLS, err := upstreamTLSConfig(key, pc.UpstreamTLS)
		if err != nil {
			p.closePGListeners()
			return err
		}
		wait := pc.WaitTimeout
		if wait <= 0 {
			wait = p.cfg.HTTP.WaitTimeout
		}
		ln, err := net.Listen("tcp", pc.Listen)
		if err != nil {
			p.closePGListeners()
			return fmt.Errorf("listen on %s (%s.listen): %w", pc.Listen, key, err)
		}
		adm := &pgAdmitter{p: p, wait: wait}
		px := &pgwire.Proxy{
			Upstream:    pc.Upstream,
			UpstreamTLS: upTLS,
			TLSConfig:   clientTLS,
			Rules:       p.rules,
			Admitter:    adm,
			// The admitter bounds its own wait by wait_timeout (and says
			// 55P03 itself); pgwire's bound is only a backstop.
			WaitTimeout:             wait + pgWaitSlack,
			TaskFromApplicationName: pc.TaskFrom == "application_name",
			Logger:                  p.log,
		}
		p.pg = append(p.pg, &pgListener{key: key, ln: ln, proxy: px})
	}
	if len(p.pg) > 0 {
		p.metrics.reg.MustRegister(pgFailureCollector{p: p})
	}
	return nil
}

// pgWaitSlack is how much longer pgwire waits than the admitter, so that
// the admitter's own wait_timeout decides.
const pgWaitSlack = time.Second

// servePGWire serves every listener until shutdown closes it.
func (p *Proxy) servePGWire() {
	for _, l := range p.pg {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			err := l.proxy.Serve(l.ln)
			if err != nil && !errors.Is(err, pgwire.ErrClosed) && !errors.Is(err, net.ErrClosed) {
				p.log.Error("governor-proxy: pgwire listener stopped", "listener", l.key, "err", err)
			}
		}()
	}
}

func (p *Proxy) closePGListeners() {
	for _, l := range p.pg {
		l.ln.Close()
	}
}

// PGWireAddrs are the addresses the pgwire listeners listen on, in the
// order of the config's pgwire list.
func (p *Proxy) PGWireAddrs() []string {
	addrs := make([]string, len(p.pg))
	for i, l := range p.pg {
		addrs[i] = l.ln.Addr().String()
	}
	return addrs
}

// stopPGWire stops accepting, admits no new transaction, lets the open ones
// finish until ctx ends, then closes every connection (which releases the
// leases left). The returned channel is closed when that is done.
func (p *Proxy) stopPGWire(ctx context.Context) <-chan struct{} {
	done := make(chan struct{})
	if len(p.pg) == 0 {
		close(done)
		return done
	}
	drained := p.pgTx.drain()
	p.closePGListeners()
	go func() {
		defer close(done)
		select {
		case <-drained:
		case <-ctx.Done():
			p.log.Warn("governor-proxy: pgwire transactions still open at the shutdown timeout; closing their connections",
				"open", p.pgTx.open())
		}
		for _, l := range p.pg {
			l.proxy.Close()
		}
	}()
	return done
}

func clientTLSConfig(key string, f TLSFiles) (*tls.Config, error) {
	if f.CertFile == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
	if err != nil {
		return nil, &ConfigError{Key: key + ".tls", Problem: err.Error()}
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

func upstreamTLSConfig(key string, u UpstreamTLS) (*tls.Config, error) {
	if !u.Enabled {
		return nil, nil
	}
	c := &tls.Config{ServerName: u.ServerName, MinVersion: tls.VersionTLS12}
	if u.CAFile != "" {
		pem, err := os.ReadFile(u.CAFile)
		if err != nil {
			return nil, &ConfigError{Key: key + ".upstream_tls.ca_file", Problem: err.Error()}
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, &ConfigError{Key: key + ".upstream_tls.ca_file", Problem: fmt.Sprintf("%s holds no PEM certificate", u.CAFile)}
		}
	}
	return c, nil
}

// txTracker counts the governed transactions holding a lease, so that a
// shutdown can wait for them and refuse new ones.
type txTracker struct {
	mu       sync.Mutex
	n        int
	draining bool
	idle     chan struct{} // closed once draining with n == 0
	gauge    prometheus.Gauge
}

// begin reserves a place for a transaction; false once draining.
func (t *txTracker) begin() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.draining {
		return false
	}
	t.n++
	t.gauge.Inc()
	return true
}

func (t *txTracker) end() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.n--
	t.gauge.Dec()
	if t.draining && t.n == 0 {
		close(t.idle)
	}
}

func (t *txTracker) open() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n
}

// drain refuses new transactions; the channel is closed when none is open.
func (t *txTracker) drain() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.draining {
		t.draining = true
		t.idle = make(chan struct{})
		if t.n == 0 {
			close(t.idle)
		}
	}
	return t.idle
}

// pgAdmitter is a pgwire.Admitter on the sidecar's own session and task.
type pgAdmitter struct {
	p    *Proxy
	wait time.Duration // this listener's wait_timeout
}

// BeginTx takes the transaction's lease, with its first statement's
// charges, on the task or on the subtask named by application_name.
func (a *pgAdmitter) BeginTx(ctx context.Context, tx pgwire.Tx) (pgwire.Ticket, error) {
	m := a.p.metrics
	if err := checkSubtask(tx.Subtask); err != nil {
		return nil, a.deny(tx, m.pgTransactions, &denial{cause: causeBadRequest, class: tx.Class, err: err}, 0)
	}
	if !a.p.pgTx.begin() {
		return nil, a.deny(tx, m.pgTransactions, &denial{cause: causeStopping, class: tx.Class,
			err: errors.New("governor-proxy is shutting down and admits no new transaction")}, 0)
	}
	wctx, cancel := context.WithTimeoutCause(ctx, a.wait, errWaitTimeout)
	defer cancel()
	began := time.Now()
	l, err := a.p.gov.admit(wctx, tx.Subtask, tx.Class, tx.Charges)
	wait := time.Since(began)
	m.pgLeaseWait.WithLabelValues(tx.Class).Observe(wait.Seconds())
	if err != nil {
		a.p.pgTx.end()
		return nil, a.deny(tx, m.pgTransactions, err, wait)
	}
	m.pgTransactions.WithLabelValues(tx.Rule, pgAdmitted).Inc()
	a.log(tx, pgAdmitted, wait, l)
	if l == nil {
		a.p.pgTx.end()
		return nil, nil
	}
	return &pgTicket{l: l, t: &a.p.pgTx}, nil
}

// Charge charges a later statement's quotas inside a transaction. It is
// allowed while the proxy stops: the transaction is finishing.
func (a *pgAdmitter) Charge(ctx context.Context, tx pgwire.Tx, charges map[string]int64) error {
	m := a.p.metrics
	if err := checkSubtask(tx.Subtask); err != nil {
		return a.deny(tx, m.pgStatements, &denial{cause: causeBadRequest, err: err}, 0)
	}
	wctx, cancel := context.WithTimeoutCause(ctx, a.wait, errWaitTimeout)
	defer cancel()
	began := time.Now()
	_, err := a.p.gov.admit(wctx, tx.Subtask, "", charges)
	wait := time.Since(began)
	if err != nil {
		return a.deny(tx, m.pgStatements, err, wait)
	}
	m.pgStatements.WithLabelValues(tx.Rule, pgCharged).Inc()
	a.log(tx, pgCharged, wait, nil)
	return nil
}

// deny counts and logs a refusal and turns it into the SQLSTATE DESIGN.md
// fixes, with a message naming the cap.
func (a *pgAdmitter) deny(tx pgwire.Tx, counter *prometheus.CounterVec, err error, wait time.Duration) error {
	var d *denial
	if !errors.As(err, &d) {
		d = &denial{cause: causeUnavailable, class: tx.Class, err: err}
	}
	d.wait = a.wait
	if d.cause == causeWaitTimeout && status.Code(d.err) == codes.Unavailable {
		// The wait ran out while governord could not be reached (retrying
		// UNAVAILABLE): that is governord away, not a full limit.
		d.cause = causeUnavailable
	}
	if d.class == "" {
		d.class = tx.Class
	}
	var code, msg string
	switch d.cause {
	case causeQuota, causeTaskEnded:
		code, msg = pgwire.SQLStateQuota, d.message()
	case causeWaitTimeout:
		code, msg = pgwire.SQLStateWaitTimeout, d.message()
	case causeBadRequest:
		code, msg = "22023", d.message() // invalid_parameter_value: application_name
	case causeStopping:
		code, msg = pgwire.SQLStateUnavailable, "governor: "+d.err.Error()
	default: // unavailable; canceled (the client is gone and sees nothing)
		code, msg = pgwire.SQLStateUnavailable, d.message()
	}
	if d.cause != causeCanceled {
		a.p.metrics.pgDenials.WithLabelValues(d.cause).Inc()
	}
	counter.WithLabelValues(tx.Rule, pgDenied).Inc()
	a.p.log.LogAttrs(context.Background(), slog.LevelInfo, "decision",
		slog.String("kind", "pgwire"), slog.String("rule", tx.Rule), slog.String("class", tx.Class),
		slog.String("subtask", tx.Subtask), slog.String("outcome", "denied"), slog.String("cause", d.cause),
		slog.String("sqlstate", code), slog.Duration("wait", wait), slog.String("database", tx.Database),
		slog.String("err", d.Error()))
	return &pgwire.Denial{Code: code, Message: msg, Err: d}
}

// log records an admission at debug level: a database client may run
// thousands of transactions a second.
func (a *pgAdmitter) log(tx pgwire.Tx, outcome string, wait time.Duration, l *lease) {
	if !a.p.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	var id int64
	if l != nil {
		id = l.id
	}
	a.p.log.LogAttrs(context.Background(), slog.LevelDebug, "decision",
		slog.String("kind", "pgwire"), slog.String("rule", tx.Rule), slog.String("class", tx.Class),
		slog.String("subtask", tx.Subtask), slog.String("outcome", outcome), slog.Duration("wait", wait),
		slog.Int64("lease", id), slog.String("database", tx.Database), slog.String("kinds", strings.Join(tx.Kinds, ",")))
}

// checkSubtask applies the rules of a Proxy-Authorization username to an
// application_name used as a subtask name.
func checkSubtask(name string) error {
	switch {
	case len(name) > 255:
		return errors.New("application_name names the subtask and is longer than 255 bytes")
	case !utf8.ValidString(name) || strings.IndexByte(name, 0) >= 0:
		return errors.New("application_name names the subtask and is not valid UTF-8")
	}
	return nil
}

// pgTicket is a transaction's lease; End releases it in the background.
type pgTicket struct {
	l *lease
	t *txTracker
}

func (k *pgTicket) End(latency time.Duration, overloaded bool) {
	k.l.release(latency, overloaded)
	k.t.end()
}

// pgFailureCollector exposes the pgwire proxies' failure counts (summed
// over listeners) as governor_proxy_pgwire_failures_total{kind}. Denials
// are counted by cause in governor_proxy_pgwire_denials_total instead.
type pgFailureCollector struct{ p *Proxy }

var pgFailuresDesc = prometheus.NewDesc("governor_proxy_pgwire_failures_total",
	"pgwire connections that failed, by kind: startup, tls, upstream, auth, too_large, protocol, cancel.",
	[]string{"kind"}, nil)

func (c pgFailureCollector) Describe(ch chan<- *prometheus.Desc) { ch <- pgFailuresDesc }

func (c pgFailureCollector) Collect(ch chan<- prometheus.Metric) {
	sum := map[string]uint64{}
	for _, l := range c.p.pg {
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
