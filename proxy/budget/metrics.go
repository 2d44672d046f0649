package budget

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/governor-project/governor/proxy/admission"
)

// Metrics are the admitter's Prometheus series. Labels are classes,
// resources, kinds and outcomes, never a task or a lease.
type Metrics struct {
	sessionUp       prometheus.Gauge
	slotGrants      *prometheus.CounterVec
	blockGrants     prometheus.Counter // slotGrants{how="block"}, kept at hand for the hot path
	topUps          *prometheus.CounterVec
	notices         *prometheus.CounterVec
	denials         *prometheus.CounterVec
	releaseFailures prometheus.Counter
	subtasksIdle    prometheus.Counter
	heldOver        prometheus.Counter
	pacedTotal      *prometheus.CounterVec
	sliceAdmitted   prometheus.Counter
	pacingWait      *prometheus.HistogramVec

	a *Admitter // for the gauges read at each scrape
}

// NewMetrics returns the admitter's series, not yet registered.
func NewMetrics() *Metrics {
	m := &Metrics{}
	m.sessionUp = prometheus.NewGauge(prometheus.GaugeOpts{Name: "governor_proxy_session_up",
		Help: "1 while the sidecar has a session with governord; 0 while it fails closed."})
	m.slotGrants = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_proxy_slot_grants_total",
		Help: "Slots granted to work, by how: from a block delegated to the sidecar (no call), or as a single lease from governord's queue."}, []string{"how"})
	m.blockGrants = m.slotGrants.WithLabelValues("block")
	m.topUps = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_proxy_topups_total",
		Help: "Calls that grew a block (slots) or a reservation (quota), by outcome (granted, none, denied, failed; rated: governord reserves none of a resource a rate binds, which is then charged per request; slice: units granted with a slice of the rate, new or renewed; slice_returned: a slice given back)."}, []string{"kind", "outcome"})
	m.notices = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_proxy_notices_total",
		Help: "Notices from governord about delegated budgets, by kind, counted once acted on."}, []string{"kind"})
	m.denials = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_proxy_admission_denials_total",
		Help: "Work the admission layer refused, HTTP and SQL together, by cause."}, []string{"cause"})
	m.releaseFailures = prometheus.NewCounter(prometheus.CounterOpts{Name: "governor_proxy_release_failures_total",
		Help: "Lease releases that failed (the lease ends with its session anyway)."})
	m.subtasksIdle = prometheus.NewCounter(prometheus.CounterOpts{Name: "governor_proxy_idle_subtasks_closed_total",
		Help: "Subtasks (one per username or application_name) closed after subtask_idle with nothing held or running."})
	m.heldOver = prometheus.NewCounter(prometheus.CounterOpts{Name: "governor_proxy_held_over_estimate_total",
		Help: "Work admitted with an estimate held (metered LLM calls) that used more than it; the rest is charged as far as the caps allow."})
	m.pacedTotal = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_proxy_paced_total",
		Help: "Work a rate refused that the sidecar held until the rate had room (on_rate: wait), by resource and how it ended: admitted, refused (the wait did not fit in the wait timeout), canceled (the client went away) or denied (for another cause)."},
		[]string{"resource", "status"})
	m.sliceAdmitted = prometheus.NewCounter(prometheus.CounterOpts{Name: "governor_proxy_rate_slice_admitted_total",
		Help: "Work charging a rated resource admitted from the sidecar's slice of the rate, with no call to governord."})
	m.pacingWait = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "governor_proxy_pacing_wait_seconds",
		Help:    "How long paced work waited for a rate to have room, by resource.",
		Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}}, []string{"resource"})
	for _, cause := range admission.DeniedLabels() {
		m.denials.WithLabelValues(cause)
	}
	return m
}

// denied counts a refusal by its Governor-Denied word; a client that went
// away was refused nothing.
func (m *Metrics) denied(c admission.Cause) {
	if w := c.Wire(); w.Header != "" {
		m.denials.WithLabelValues(w.Header).Inc()
	}
}

// paced counts paced work as it ends, and how long it waited (work refused
// before it waited observes no wait).
func (m *Metrics) paced(resource, status string, waited time.Duration) {
	m.pacedTotal.WithLabelValues(resource, status).Inc()
	if status != "refused" || waited > 0 {
		m.pacingWait.WithLabelValues(resource).Observe(waited.Seconds())
	}
}

// Register registers the series, and the gauges of what is delegated now,
// read from a at each scrape.
func (m *Metrics) Register(reg prometheus.Registerer, a *Admitter) error {
	m.a = a
	for _, c := range []prometheus.Collector{m.sessionUp, m.slotGrants, m.topUps, m.notices, m.denials, m.releaseFailures, m.subtasksIdle, m.heldOver, m.pacedTotal, m.pacingWait, m.sliceAdmitted, delegated{a}} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

var (
	descSlots = prometheus.NewDesc("governor_proxy_slots", "Slots of blocks delegated to the sidecar, by class and state: in_use (held by work) or idle (delegated, not in use).",
		[]string{"class", "state"}, nil)
	descUnits = prometheus.NewDesc("governor_proxy_reserved_units", "Quota units reserved for the sidecar, by resource and state: unspent, or spent and not yet settled with governord.",
		[]string{"resource", "state"}, nil)
)

// delegated reads what the current session holds.
type delegated struct{ a *Admitter }

func (delegated) Describe(ch chan<- *prometheus.Desc) { ch <- descSlots; ch <- descUnits }

func (d delegated) Collect(ch chan<- prometheus.Metric) {
	if d.a == nil {
		return
	}
	s := d.a.cur.Load()
	if s == nil {
		return
	}
	inUse, idle := map[string]int64{}, map[string]int64{}
	unspent, spent := map[string]int64{}, map[string]int64{}
	s.each(func(n *node) {
		n.mu.Lock()
		defer n.mu.Unlock()
		for class, p := range n.pools {
			p.mu.Lock()
			inUse[class] += p.inUse
			idle[class] += p.idle()
			p.mu.Unlock()
		}
		for r, q := range n.quota {
			q.mu.Lock()
			unspent[r] += q.unspent + q.held
			spent[r] += q.spent + q.settling
			q.mu.Unlock()
		}
	})
	for class := range inUse {
		ch <- prometheus.MustNewConstMetric(descSlots, prometheus.GaugeValue, float64(inUse[class]), class, "in_use")
		ch <- prometheus.MustNewConstMetric(descSlots, prometheus.GaugeValue, float64(idle[class]), class, "idle")
	}
	for r := range unspent {
		ch <- prometheus.MustNewConstMetric(descUnits, prometheus.GaugeValue, float64(unspent[r]), r, "unspent")
		ch <- prometheus.MustNewConstMetric(descUnits, prometheus.GaugeValue, float64(spent[r]), r, "unsettled")
	}
}
