package server

import (
	"context"
	"net/http"
	"net/http/pprof"
	"path"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/governor-project/governor/governor/engine"
)

// metrics are governord's Prometheus series. Labels are tenants, classes,
// resources, methods and codes only, never a task or a lease, so the number
// of series follows the configuration and not the work.
type metrics struct {
	s        *Server
	reg      *prometheus.Registry
	calls    *prometheus.CounterVec
	events   [engine.EvSliceEnded + 1]prometheus.Counter
	commit   prometheus.Histogram
	batch    prometheus.Histogram
	waitTime prometheus.Histogram
	waiters  prometheus.Gauge
	notices  *prometheus.CounterVec
	given    *prometheus.CounterVec
	snapSize prometheus.Gauge

	// tlsReloads counts changes to the TLS files, by outcome.
	tlsReloads *prometheus.CounterVec
	// warnings counts caps passed without a refusal, and dryRuns the
	// answers to DryRun (policy.go).
	warnings *prometheus.CounterVec
	dryRuns  *prometheus.CounterVec

	// Admission (admission.go): each call's time by tenant and lane, and
	// the calls refused.
	callSeconds *prometheus.HistogramVec
	refusals    *prometheus.CounterVec
	rateRefused *prometheus.CounterVec
}

func newMetrics(s *Server) *metrics {
	m := &metrics{s: s, reg: prometheus.NewRegistry()}
	m.calls = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_calls_total",
		Help: "gRPC calls by method and status code."}, []string{"method", "code"})
	events := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_events_total",
		Help: "State changes recorded, by kind."}, []string{"kind"})
	for k := engine.EvSessionOpened; k <= engine.EvSliceEnded; k++ {
		m.events[k] = events.WithLabelValues(k.String())
	}
	m.commit = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "governor_commit_seconds",
		Help: "Time to commit one batch of events to the store.", Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16)})
	m.batch = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "governor_commit_batch_size",
		Help: "Events per commit (group commit).", Buckets: prometheus.ExponentialBuckets(1, 2, 14)})
	m.waitTime = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "governor_acquire_wait_seconds",
		Help: "Time a queued acquire waited for its outcome.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)})
	m.waiters = prometheus.NewGauge(prometheus.GaugeOpts{Name: "governor_acquires_waiting",
		Help: "Acquire calls blocked in the fair queue right now."})
	m.notices = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_notices_total",
		Help: "Notices sent on Watch streams to holders of delegated budgets, by kind."}, []string{"kind"})
	m.tlsReloads = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_tls_reloads_total",
		Help: "Changes to the TLS certificate and key files, by outcome (success, failure). A failure keeps the pair in force."}, []string{"outcome"})
	m.reg.MustRegister(m.tlsReloads)
	m.snapSize = prometheus.NewGauge(prometheus.GaugeOpts{Name: "governor_snapshot_bytes",
		Help: "Size of the newest snapshot saved, encoded."})
	m.given = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_given_back_total",
		Help: "Grants given back because their callers never learned of them: the caller's context ended before the answer was committed (caller_gone), or the caller abandoned the request (abandoned)."}, []string{"why"})
	m.warnings, m.dryRuns = newWarnings(), newDryRuns()
	m.callSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "governor_call_seconds",
		Help:    "Time governord took to answer a call, from its arrival to its answer, waiting for its turn included, by tenant (\"\" is the admin key's sessions) and lane (work, control).",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16)}, []string{"tenant", "lane"})
	m.refusals = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_admission_refused_total",
		Help: "Calls refused with RESOURCE_EXHAUSTED and a RetryInfo by admission, by tenant and why (busy: its calls in flight and queue were full; api_rate: over its api_rate)."}, []string{"tenant", "why"})
	m.rateRefused = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "governor_rate_refusals_total",
		Help: "Calls refused for rate (a token bucket on the caller's node or an ancestor had no room), by the caller's tenant (\"\" is the admin key's sessions) and resource."}, []string{"tenant", "resource"})
	m.reg.MustRegister(m.callSeconds, m.refusals, m.rateRefused, admissionCollector{s})
	m.reg.MustRegister(m.warnings, m.dryRuns, policyCollector{s})
	m.reg.MustRegister(m.calls, events, m.commit, m.batch, m.waitTime, m.waiters, m.notices, m.given, m.snapSize, treeCollector{m}, haCollector{m},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (m *metrics) event(k engine.EventKind) {
	if int(k) < len(m.events) && m.events[k] != nil {
		m.events[k].Inc()
	}
}

func (m *metrics) observeCommit(batch int, d time.Duration) {
	m.batch.Observe(float64(batch))
	m.commit.Observe(d.Seconds())
	m.s.lastCommit.Store(int64(d))
}

func (m *metrics) callTime(tenant, lane string, d time.Duration) {
	m.callSeconds.WithLabelValues(tenant, lane).Observe(d.Seconds())
}
func (m *metrics) refused(tenant, why string) { m.refusals.WithLabelValues(tenant, why).Inc() }
func (m *metrics) rateRefusal(tenant, resource string) {
	m.rateRefused.WithLabelValues(tenant, resource).Inc()
}
func (m *metrics) waiting(d float64)              { m.waiters.Add(d) }
func (m *metrics) noticeSent(k engine.NoticeKind) { m.notices.WithLabelValues(k.String()).Inc() }
func (m *metrics) waited(d time.Duration)         { m.waitTime.Observe(d.Seconds()) }
func (m *metrics) givenBack(why string)           { m.given.WithLabelValues(why).Inc() }
func (m *metrics) count(method string, err error) {
	m.calls.WithLabelValues(path.Base(method), status.Code(err).String()).Inc()
}

func (m *metrics) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	resp, err := h(ctx, req)
	m.count(info.FullMethod, err)
	return resp, err
}

func (m *metrics) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	err := h(srv, ss)
	m.count(info.FullMethod, err)
	return err
}

// handler serves /metrics, /healthz (the process is up) and /readyz (it is
// serving: recovered, configured and not stopping).
func (m *metrics) handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	if m.s.cfg.PProf {
		servePProf(mux)
	}
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		select {
		case <-m.s.stopping:
			http.Error(w, "stopping", http.StatusServiceUnavailable)
		default:
			if err := m.s.servingErr(); err != nil {
				// A standby, or a leader whose lease ran out (ha.go).
				http.Error(w, status.Convert(err).Message(), http.StatusServiceUnavailable)
				return
			}
			w.Write([]byte("ready\n"))
		}
	})
	return mux
}

// treeCollector reads the root and the tenants once per scrape.
type treeCollector struct{ m *metrics }

var (
	descQueue    = prometheus.NewDesc("governor_queue_depth", "Acquires waiting in the fair queue, by class.", []string{"class"}, nil)
	descRateQ    = prometheus.NewDesc("governor_rate_queue_depth", "Charges waiting for a rate at governord (wait_for_rate, as the sidecar paces), by tenant and the resource whose rate holds them.", []string{"tenant", "resource"}, nil)
	descHeld     = prometheus.NewDesc("governor_pool_held", "Leases held, by tenant (\"\" is the root, which counts everyone) and class.", []string{"tenant", "class"}, nil)
	descLimit    = prometheus.NewDesc("governor_pool_limit", "Concurrency limits, by tenant (\"\" is the root) and class.", []string{"tenant", "class"}, nil)
	descUsed     = prometheus.NewDesc("governor_spend_total", "Quota spent so far, by tenant (\"\" is the root) and resource.", []string{"tenant", "resource"}, nil)
	descQuota    = prometheus.NewDesc("governor_quota", "Quota caps, by tenant (\"\" is the root) and resource.", []string{"tenant", "resource"}, nil)
	descReserved = prometheus.NewDesc("governor_reserved", "Quota reserved by sessions and not yet spent, by tenant (\"\" is the root) and resource.", []string{"tenant", "resource"}, nil)
	descBlocks   = prometheus.NewDesc("governor_delegated_slots", "Slots held in blocks delegated to sessions (sidecars), by class; also counted in governor_pool_held.", []string{"class"}, nil)
	descRateLeft = prometheus.NewDesc("governor_rate_available", "Units in a rate's token bucket now, by tenant (\"\" is the root) and resource: 0 while the rate refuses.", []string{"tenant", "resource"}, nil)
	descRateSize = prometheus.NewDesc("governor_rate_burst", "The size of a rate's token bucket (its burst), by tenant (\"\" is the root) and resource.", []string{"tenant", "resource"}, nil)
	descRatePerS = prometheus.NewDesc("governor_rate_per_second", "A rate's refill in units a second, by tenant (\"\" is the root) and resource.", []string{"tenant", "resource"}, nil)
	descSessions = prometheus.NewDesc("governor_sessions", "Open sessions.", nil, nil)
	descLeases   = prometheus.NewDesc("governor_leases", "Live leases.", nil, nil)
	descNodes    = prometheus.NewDesc("governor_nodes", "Nodes held: open, and ended but not yet reclaimed (node_retention).", nil, nil)
	descSeq      = prometheus.NewDesc("governor_event_seq", "Sequence number of the newest event, and of the newest committed one.", []string{"state"}, nil)
)

func (treeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descQueue, descRateQ, descHeld, descLimit, descUsed, descQuota, descReserved, descBlocks, descRateLeft, descRateSize, descRatePerS, descSessions, descLeases, descNodes, descSeq} {
		ch <- d
	}
}

func (c treeCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.m.s
	if s.eng == nil {
		return
	}
	st := s.eng.Stats()
	for class, n := range st.Waiting {
		ch <- prometheus.MustNewConstMetric(descQueue, prometheus.GaugeValue, float64(n), class)
	}
	for k, n := range st.WaitingRate {
		ch <- prometheus.MustNewConstMetric(descRateQ, prometheus.GaugeValue, float64(n), k.Tenant, k.Resource)
	}
	emit := func(tenant string, v engine.NodeView) {
		for class, n := range v.Held {
			ch <- prometheus.MustNewConstMetric(descHeld, prometheus.GaugeValue, float64(n), tenant, class)
		}
		for class, n := range v.Limits {
			ch <- prometheus.MustNewConstMetric(descLimit, prometheus.GaugeValue, float64(n), tenant, class)
		}
		for r, n := range v.Used {
			ch <- prometheus.MustNewConstMetric(descUsed, prometheus.CounterValue, float64(n), tenant, r)
		}
		for r, n := range v.Quotas {
			ch <- prometheus.MustNewConstMetric(descQuota, prometheus.GaugeValue, float64(n), tenant, r)
		}
		for r, n := range v.Reserved {
			ch <- prometheus.MustNewConstMetric(descReserved, prometheus.GaugeValue, float64(n), tenant, r)
		}
	}
	for class, n := range st.Delegated {
		ch <- prometheus.MustNewConstMetric(descBlocks, prometheus.GaugeValue, float64(n), class)
	}
	emit("", st.Root)
	for _, t := range st.Tenants {
		emit(t.Name, t)
	}
	for _, r := range st.Rates {
		tenant := r.NodeName
		if r.Node == st.Root.ID {
			tenant = ""
		}
		ch <- prometheus.MustNewConstMetric(descRateLeft, prometheus.GaugeValue, float64(r.Level), tenant, r.Name)
		ch <- prometheus.MustNewConstMetric(descRateSize, prometheus.GaugeValue, float64(r.Size), tenant, r.Name)
		if r.Rate.Per > 0 {
			ch <- prometheus.MustNewConstMetric(descRatePerS, prometheus.GaugeValue, float64(r.Rate.Units)/time.Duration(r.Rate.Per).Seconds(), tenant, r.Name)
		}
	}
	ch <- prometheus.MustNewConstMetric(descSessions, prometheus.GaugeValue, float64(st.Sessions))
	ch <- prometheus.MustNewConstMetric(descLeases, prometheus.GaugeValue, float64(st.Leases))
	ch <- prometheus.MustNewConstMetric(descNodes, prometheus.GaugeValue, float64(st.Nodes))
	ch <- prometheus.MustNewConstMetric(descSeq, prometheus.GaugeValue, float64(s.eng.Seq()), "emitted")
	if s.leading() && s.events != nil { // leading is set after events, at a takeover
		ch <- prometheus.MustNewConstMetric(descSeq, prometheus.GaugeValue, float64(s.events.Committed()), "committed")
	}
}

// MetricsCollector is governord's registry, for its Describe: every series
// /metrics can serve, so that dashboards and alert rules (deploy/) are
// checked against the real names and labels rather than a list.
func (s *Server) MetricsCollector() prometheus.Collector { return s.metrics.reg }

// admissionCollector reads admission's lanes once per scrape.
type admissionCollector struct{ s *Server }

var (
	descAdmQueued   = prometheus.NewDesc("governor_admission_queued", "Calls waiting for their turn in admission, by tenant (\"\" is the admin key's sessions).", []string{"tenant"}, nil)
	descAdmInFlight = prometheus.NewDesc("governor_admission_in_flight", "Calls holding a place in admission (in the engine or waiting for their commit), by tenant.", []string{"tenant"}, nil)
)

func (admissionCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descAdmQueued
	ch <- descAdmInFlight
}

func (c admissionCollector) Collect(ch chan<- prometheus.Metric) {
	if c.s.adm == nil {
		return
	}
	for _, l := range c.s.adm.stats() {
		ch <- prometheus.MustNewConstMetric(descAdmQueued, prometheus.GaugeValue, float64(l.queued), l.name)
		ch <- prometheus.MustNewConstMetric(descAdmInFlight, prometheus.GaugeValue, float64(l.inFlight), l.name)
	}
}

// servePProf serves Go's profiles under /debug/pprof/ (debug.pprof), for
// an operator diagnosing a stall: a CPU profile or an execution trace of a
// live governord. They are off by default, as they tell anyone who can
// reach the listener about the process, and a trace costs CPU while taken.
func servePProf(mux *http.ServeMux) {
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
}
