package proxy

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// healthHandler serves /metrics, /healthz (the process is up) and /readyz (a
// session with governord is open, so requests can be admitted, and the
// sidecar is not stopping). Metrics are never quota authority: quota lives
// only in governord.
func (s *Sidecar) healthHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if ok, why := s.readiness(); !ok {
			http.Error(w, why, http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ready\n"))
	})
	return mux
}

// MetricsCollector is the sidecar's registry, for its Describe: every
// series /metrics can serve (the pgwire ones only with a pgwire listener),
// so that dashboards and alert rules (deploy/) are checked against the real
// names and labels rather than a list.
func (s *Sidecar) MetricsCollector() prometheus.Collector { return s.reg }
