package pgwire

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/governor-project/governor/proxy/admission"
)

// Metrics are the PostgreSQL side's Prometheus series. Labels are rules,
// classes, causes and outcomes, never a database object. A nil *Metrics
// counts nothing.
type Metrics struct {
	transactions *prometheus.CounterVec
	charges      *prometheus.CounterVec
	denials      *prometheus.CounterVec
	wait         *prometheus.HistogramVec
	// shadow counts statements of rules in dry run that governord would
	// have refused, by rule and cause (notice.go).
	shadow *prometheus.CounterVec
	// resultRows and resultBytes: what statements of result rules
	// returned, as charged (result.go).
	resultRows, resultBytes *prometheus.CounterVec
}

// NewMetrics returns the series, not yet registered.
func NewMetrics() *Metrics {
	m := &Metrics{}
	m.transactions = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_proxy_pgwire_transactions_total",
		Help: "pgwire transactions that asked for a slot, by rule and outcome (admitted, denied)."}, []string{"rule", "outcome"})
	m.charges = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_proxy_pgwire_statement_charges_total",
		Help: "Quota charges of later statements inside a pgwire transaction, by rule and outcome (charged, denied)."}, []string{"rule", "outcome"})
	m.denials = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_proxy_pgwire_denials_total",
		Help: "pgwire statements refused, by cause (the Governor-Denied word of admission's table of causes, whose SQLSTATEs docs/proxy.md lists: quota, task-ended and suspended 53400, rate 53300, wait-timeout 55P03, unavailable 53000 (the proxy stopping too), read-only 25006, bad-request 22023)."}, []string{"cause"})
	m.wait = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "governor_proxy_pgwire_lease_wait_seconds",
		Help:    "Time a pgwire transaction waited for its slot (admitted or denied), by lease class.",
		Buckets: prometheus.ExponentialBuckets(0.00001, 4, 12)}, []string{"class"})
	m.shadow = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_proxy_pgwire_shadow_denials_total",
		Help: "pgwire statements of rules in dry run (mode: shadow) that governord would have refused, by rule and cause; they ran all the same."}, []string{"rule", "cause"})
	m.resultRows = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_proxy_pgwire_result_rows_total",
		Help: "Rows (DataRow messages) statements of rules with result: returned, charged to result.rows, by rule: asked as far as the caps allow."}, []string{"rule"})
	m.resultBytes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_proxy_pgwire_result_bytes_total",
		Help: "Bytes of the DataRow messages statements of rules with result: returned, charged to result.bytes, by rule: asked as far as the caps allow."}, []string{"rule"})
	for _, cause := range admission.DeniedLabels() {
		m.denials.WithLabelValues(cause)
	}
	return m
}

// Register registers the series with reg.
func (m *Metrics) Register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.transactions, m.charges, m.denials, m.wait, m.shadow, m.resultRows, m.resultBytes} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// ruleSeries are the series of one rule and class, looked up once per
// connection rather than per statement.
type ruleSeries struct {
	rule, class string
	admitted    prometheus.Counter
	charged     prometheus.Counter
	wait        prometheus.Observer
}

func (m *Metrics) series(rule, class string) *ruleSeries {
	return &ruleSeries{rule: rule, class: class, admitted: m.transactions.WithLabelValues(rule, "admitted"),
		charged: m.charges.WithLabelValues(rule, "charged"), wait: m.wait.WithLabelValues(class)}
}

// admitted counts an admitted statement; last is the caller's cache of the
// series it used last, for the next call.
func (m *Metrics) admitted(last **ruleSeries, rule, class string, waited time.Duration) {
	if m == nil {
		return
	}
	rs := *last
	if rs == nil || rs.rule != rule || rs.class != class {
		rs = m.series(rule, class)
		*last = rs
	}
	if class != "" {
		rs.admitted.Inc()
		rs.wait.Observe(waited.Seconds())
		return
	}
	rs.charged.Inc()
}

func (m *Metrics) denied(rule, class string, cause admission.Cause, waited time.Duration) {
	if m == nil {
		return
	}
	if w := cause.Wire(); w.Header != "" { // not a client that went away
		m.denials.WithLabelValues(w.Header).Inc()
	}
	if class != "" {
		m.transactions.WithLabelValues(rule, "denied").Inc()
		m.wait.WithLabelValues(class).Observe(waited.Seconds())
		return
	}
	m.charges.WithLabelValues(rule, "denied").Inc()
}

// result counts rows and bytes of results asked to be charged.
func (m *Metrics) result(rule string, rows, bytes int64) {
	if rows > 0 {
		m.resultRows.WithLabelValues(rule).Add(float64(rows))
	}
	if bytes > 0 {
		m.resultBytes.WithLabelValues(rule).Add(float64(bytes))
	}
}
