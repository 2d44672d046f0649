package httpproxy

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/governor-project/governor/proxy/admission"
)

// ruleUnmatched is the rule label of traffic no rule matched.
const ruleUnmatched = "(unmatched)"

// Request outcomes, the "outcome" label of governor_proxy_requests_total.
const (
	outcomeForwarded     = "forwarded"      // sent upstream and answered (any status)
	outcomeDenied        = "denied"         // refused by governance; see the denials by cause
	outcomeRefused       = "refused"        // a forbidden target, a missing proxy password; a bad request
	outcomeUpstreamError = "upstream_error" // 502: the upstream could not be reached or failed
	outcomeTimeout       = "upstream_timeout"
	outcomeCanceled      = "canceled" // the client went away first
)

// Metrics are the HTTP side's Prometheus series. Labels are rules,
// classes, causes and outcomes only, never a task, a subtask or a URL, so
// the number of series follows the configuration and not the traffic.
type Metrics struct {
	requests      *prometheus.CounterVec
	denials       *prometheus.CounterVec
	leaseWait     *prometheus.HistogramVec
	upstream      *prometheus.HistogramVec
	headerCharges *prometheus.CounterVec
	// meterSettlements and meterTokens: metered LLM calls (meter.go).
	meterSettlements *prometheus.CounterVec
	meterTokens      *prometheus.CounterVec
	meterOver        *prometheus.CounterVec
	meterOverTokens  *prometheus.CounterVec
	tunnels          prometheus.Gauge
	inflight         prometheus.Gauge
	// rateLimitErrors counts readings of the caps' state for the RateLimit
	// headers that failed (ratelimit.go).
	rateLimitErrors prometheus.Counter
	// shadowRequests and shadowDenials count requests of shadow rules, and
	// those a real rule would have refused, by cause (ratelimit.go).
	shadowRequests *prometheus.CounterVec
	shadowDenials  *prometheus.CounterVec
	// interceptHandshakes and intercepted: tunnels whose TLS the proxy
	// terminates (intercept.go).
	interceptHandshakes *prometheus.CounterVec
	intercepted         prometheus.Gauge
	// bytes and bytesCut: bytes rules (bytes.go).
	bytes    *prometheus.CounterVec
	bytesCut *prometheus.CounterVec
}

// NewMetrics returns the series, not yet registered.
func NewMetrics() *Metrics {
	m := &Metrics{}
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_proxy_requests_total",
		Help: "HTTP requests and CONNECT tunnels, by rule (\"(unmatched)\" for none) and outcome."}, []string{"rule", "outcome"})
	m.denials = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_proxy_denials_total",
		Help: "Requests and tunnels refused, by cause (the Governor-Denied value)."}, []string{"cause"})
	m.leaseWait = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "governor_proxy_lease_wait_seconds",
		Help:    "Time from a request's arrival to its admission or denial, by lease class (\"\" for charge only).",
		Buckets: prometheus.ExponentialBuckets(0.00001, 4, 12)}, []string{"class"})
	m.upstream = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "governor_proxy_upstream_seconds",
		Help:    "Time from forwarding a request to the upstream's response headers, by rule.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 4, 12)}, []string{"rule"})
	m.headerCharges = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_proxy_header_charges_total",
		Help: "charge_from_header charges after responses, by rule and outcome (charged, missing, not_a_number, failed)."}, []string{"rule", "outcome"})
	m.meterSettlements = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_proxy_meter_settlements_total",
		Help: "Metered LLM calls settled, by rule and outcome: usage (to the usage reported), no_usage (none reported: a dropped stream, an upstream error, a client gone; the reservation is spent), unmetered (a body over max_body let through)."}, []string{"rule", "outcome"})
	m.meterTokens = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_proxy_meter_tokens_total",
		Help: "Tokens metered LLM calls were settled to, by rule, each call counted up to its estimate (the rest is in governor_proxy_meter_over_estimate_tokens_total)."}, []string{"rule"})
	m.meterOver = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_proxy_meter_over_estimate_total",
		Help: "Metered LLM calls whose reported usage was above their estimate, by rule: charged as far as the caps allow, and logged at warn."}, []string{"rule"})
	m.meterOverTokens = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_proxy_meter_over_estimate_tokens_total",
		Help: "The tokens providers reported beyond the calls' estimates, by rule (charged as far as the caps allow)."}, []string{"rule"})
	m.tunnels = prometheus.NewGauge(prometheus.GaugeOpts{Name: "governor_proxy_tunnels_open",
		Help: "CONNECT tunnels and upgraded connections open now."})
	m.inflight = prometheus.NewGauge(prometheus.GaugeOpts{Name: "governor_proxy_requests_in_flight",
		Help: "HTTP requests being served now (tunnels not counted)."})
	m.rateLimitErrors = prometheus.NewCounter(prometheus.CounterOpts{Name: "governor_proxy_ratelimit_status_errors_total",
		Help: "Responses sent without RateLimit headers because reading the caps' state from governord failed (http.ratelimit_headers)."})
	m.shadowRequests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_proxy_shadow_requests_total",
		Help: "Requests of rules in dry run (mode: shadow), by rule: asked about, never charged or held, always forwarded."}, []string{"rule"})
	m.shadowDenials = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_proxy_shadow_denials_total",
		Help: "Requests of rules in dry run that governord would have refused, by rule and cause (the Governor-Denied value it would have sent; unavailable: no dry run could be made)."}, []string{"rule", "cause"})
	m.interceptHandshakes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_proxy_intercept_handshakes_total",
		Help: "TLS handshakes of intercepted CONNECT tunnels, by reason: ok, client_refused_certificate (the client does not trust the CA, or pins another), client_closed, not_tls, sni_mismatch, no_certificate (none could be minted), timeout, other."}, []string{"reason"})
	for _, r := range []string{handshakeOK, handshakeRefusedCA, handshakeClientClosed, handshakeNotTLS, handshakeSNIMismatch, handshakeNoCertificate, handshakeTimeout, handshakeOther} {
		m.interceptHandshakes.WithLabelValues(r)
	}
	m.intercepted = prometheus.NewGauge(prometheus.GaugeOpts{Name: "governor_proxy_intercepted_connections",
		Help: "Intercepted CONNECT tunnels open now, each served as a decrypted HTTP/1.1 or HTTP/2 connection."})
	m.bytes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_proxy_bytes_total",
		Help: "Bytes charged by bytes rules, by rule, resource and direction (request: request bodies and what a tunnel's client sends; response: response bodies and what a tunnel's upstream sends). A body of unknown length is charged a chunk ahead of what passes."}, []string{"rule", "resource", "direction"})
	m.bytesCut = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_proxy_bytes_cut_total",
		Help: "Transfers a bytes rule stopped midway because a chunk of their bytes was refused, by rule, resource and cause (quota, unavailable, task-ended, ...)."}, []string{"rule", "resource", "cause"})
	for _, cause := range admission.DeniedLabels() {
		m.denials.WithLabelValues(cause)
	}
	m.denials.WithLabelValues(causeForbiddenTarget)
	m.denials.WithLabelValues(causeProxyAuth)
	return m
}

// Register registers the series with reg.
func (m *Metrics) Register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.requests, m.denials, m.leaseWait, m.upstream, m.headerCharges, m.meterSettlements, m.meterTokens, m.meterOver, m.meterOverTokens, m.tunnels, m.inflight, m.rateLimitErrors, m.shadowRequests, m.shadowDenials, m.interceptHandshakes, m.intercepted, m.bytes, m.bytesCut} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
