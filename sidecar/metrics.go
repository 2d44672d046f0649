package sidecar

import (
	"net/http"

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
