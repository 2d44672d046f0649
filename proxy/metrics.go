package proxy

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// ruleUnmatched is the rule label of traffic no rule matched.
const ruleUnmatched = "(unmatched)"

// Request outcomes, the "outcome" label of governor_proxy_requests_total.
const (
	outcomeForwarded     = "forwarded"      // sent upstream and answered (any status)
	outcomeDenied        = "denied"         // refused by governance; see the denials by cause
	outcomeRefused       = "refused"        // link-local, metadata or the proxy itself; a bad request
	outcomeUpstreamError = "upstream_error" // 502: the upstream could not be reached or failed
	outcomeTimeout       = "upstream_timeout"
	outcomeCanceled      = "canceled" // the client went away first
)

// metrics are governor-proxy's Prometheus series. Labels are rules, classes,
// causes and outcomes only, never a task, a subtask or a URL, so the number
// of series follows the configuration and not the traffic. Metrics are
// never quota authority: quota lives only in governord.
type metrics struct {
	reg             *prometheus.Registry
	requests        *prometheus.CounterVec
	denials         *prometheus.CounterVec
	leaseWait       *prometheus.HistogramVec
	upstream        *prometheus.HistogramVec
	reloads         *prometheus.CounterVec
	headerCharges   *prometheus.CounterVec
	tunnels         prometheus.Gauge
	inflight        prometheus.Gauge
	sessionUp       prometheus.Gauge
	releaseFailures prometheus.Counter

	// pgwire (see pgwire.go; failures by kind are a collector there).
	pgTransactions *prometheus.CounterVec
	pgStatements   *prometheus.CounterVec
	pgDenials      *prometheus.CounterVec
	pgLeaseWait    *prometheus.HistogramVec
	pgOpen         prometheus.Gauge
}

func newMetrics() *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_proxy_requests_total",
		Help: "HTTP requests and CONNECT tunnels, by rule (\"(unmatched)\" for none) and outcome."}, []string{"rule", "outcome"})
	m.denials = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_proxy_denials_total",
		Help: "Requests and tunnels refused by governance, by cause (the Governor-Denied value)."}, []string{"cause"})
	m.leaseWait = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "governor_proxy_lease_wait_seconds",
		Help:    "Time from a request's arrival to its admission or denial by governord, by lease class (\"\" for charge only).",
		Buckets: prometheus.ExponentialBuckets(0.0001, 4, 12)}, []string{"class"})
	m.upstream = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "governor_proxy_upstream_seconds",
		Help:    "Time from forwarding a request to the upstream's response headers, by rule.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 4, 12)}, []string{"rule"})
	m.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_proxy_rule_reloads_total",
		Help: "Rule file reloads, by outcome (success, failure). A failed reload keeps the old rules."}, []string{"outcome"})
	m.headerCharges = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_proxy_header_charges_total",
		Help: "charge_from_header charges after responses, by rule and outcome (charged, missing, not_a_number, denied, failed)."}, []string{"rule", "outcome"})
	m.tunnels = prometheus.NewGauge(prometheus.GaugeOpts{Name: "governor_proxy_tunnels_open",
		Help: "CONNECT tunnels and upgraded connections open now."})
	m.inflight = prometheus.NewGauge(prometheus.GaugeOpts{Name: "governor_proxy_requests_in_flight",
		Help: "HTTP requests being served now (tunnels not counted)."})
	m.sessionUp = prometheus.NewGauge(prometheus.GaugeOpts{Name: "governor_proxy_session_up",
		Help: "1 while the sidecar has a session with governord; 0 while it fails closed."})
	m.releaseFailures = prometheus.NewCounter(prometheus.CounterOpts{Name: "governor_proxy_release_failures_total",
		Help: "Lease releases that failed (the lease ends with its session anyway)."})
	m.pgTransactions = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_proxy_pgwire_transactions_total",
		Help: "pgwire transactions that asked for a lease, by rule and outcome (admitted, denied)."}, []string{"rule", "outcome"})
	m.pgStatements = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_proxy_pgwire_statement_charges_total",
		Help: "Quota charges of later statements inside a pgwire transaction, by rule and outcome (charged, denied)."}, []string{"rule", "outcome"})
	m.pgDenials = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_proxy_pgwire_denials_total",
		Help: "pgwire statements refused, by cause: quota and task-ended (53400), wait-timeout (55P03), unavailable and stopping (53000), bad-request (22023)."}, []string{"cause"})
	m.pgLeaseWait = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "governor_proxy_pgwire_lease_wait_seconds",
		Help:    "Time a pgwire transaction waited for its lease (admitted or denied), by lease class.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 4, 12)}, []string{"class"})
	m.pgOpen = prometheus.NewGauge(prometheus.GaugeOpts{Name: "governor_proxy_pgwire_transactions_open",
		Help: "pgwire transactions holding a lease now."})
	for _, c := range []string{causeQuota, causeWaitTimeout, causeUnavailable, causeTaskEnded, causeStopping} {
		m.pgDenials.WithLabelValues(c)
	}
	for _, o := range []string{"success", "failure"} {
		m.reloads.WithLabelValues(o)
	}
	for _, c := range []string{causeQuota, causeWaitTimeout, causeUnavailable, causeTaskEnded} {
		m.denials.WithLabelValues(c)
	}
	m.reg.MustRegister(m.requests, m.denials, m.leaseWait, m.upstream, m.reloads, m.headerCharges,
		m.tunnels, m.inflight, m.sessionUp, m.releaseFailures,
		m.pgTransactions, m.pgStatements, m.pgDenials, m.pgLeaseWait, m.pgOpen,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// handler serves /metrics, /healthz (the process is up) and /readyz (a
// session with governord is open, so requests can be admitted, and the
// proxy is not stopping).
func (m *metrics) handler(ready func() (bool, string)) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if ok, why := ready(); !ok {
			http.Error(w, why, http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ready\n"))
	})
	return mux
}
