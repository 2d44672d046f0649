// Command psp is the example's payment gateway: a simulated payment service
// provider that serves a fixed number of requests at once and answers 429
// Too Many Requests to any request beyond that, as a real gateway's rate
// limiter does. It counts what it saw (the most requests in flight at once,
// the requests it served and the ones it turned away) and serves the counts
// at /stats, which the driver reads and resets between phases.
//
//	psp -listen 10.0.0.5:0 -capacity 8 -service 25ms
//
// It logs one JSON line, "psp listening", with the address it bound.
// It imports the standard library only.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on")
	capacity := flag.Int("capacity", 8, "requests served at once; more get 429")
	service := flag.Duration("service", 25*time.Millisecond, "mean time to serve a request (uniform within ±40%)")
	flag.Parse()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if *capacity < 1 || *service <= 0 {
		fmt.Fprintln(os.Stderr, "psp: -capacity must be at least 1 and -service positive")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, log, *listen, &gateway{capacity: *capacity, service: *service}); err != nil {
		log.Error("psp failed", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, log *slog.Logger, listen string, g *gateway) error {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: g.routes(), ReadHeaderTimeout: 10 * time.Second}
	log.Info("psp listening", "addr", ln.Addr().String(), "capacity", g.capacity, "service", g.service.String())
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	if err := srv.Serve(ln); err != http.ErrServerClosed {
		return err
	}
	return nil
}

// gateway is the simulated provider's state.
type gateway struct {
	capacity int
	service  time.Duration

	mu       sync.Mutex
	inFlight int
	stats    Stats
}

// Stats is what the gateway saw since the last reset.
type Stats struct {
	Peak     int   `json:"peak"`     // the most requests in flight at once, those turned away included
	Served   int64 `json:"served"`   // requests answered 200
	Rejected int64 `json:"rejected"` // requests answered 429
}

func (g *gateway) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/payouts", g.limited(g.payout))
	mux.HandleFunc("POST /v1/charges", g.limited(g.charge))
	mux.HandleFunc("GET /stats", g.getStats)
	mux.HandleFunc("POST /stats/reset", g.resetStats)
	return mux
}

// limited admits a request if fewer than capacity are in flight, counting
// it either way: a request turned away still reached the gateway.
func (g *gateway) limited(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		g.mu.Lock()
		g.inFlight++
		g.stats.Peak = max(g.stats.Peak, g.inFlight)
		over := g.inFlight > g.capacity
		if over {
			g.stats.Rejected++
		}
		g.mu.Unlock()
		// The count drops before the response is flushed, so a client that
		// starts its next request after reading this response's end is
		// never counted together with this one.
		defer func() {
			g.mu.Lock()
			g.inFlight--
			g.mu.Unlock()
		}()
		if over {
			w.Header().Set("Retry-After", "1")
			writeJSON(w, http.StatusTooManyRequests, map[string]string{"error": "rate_limited", "message": "too many requests in flight"})
			return
		}
		// The work itself: a uniform delay around the mean.
		time.Sleep(time.Duration(float64(g.service) * (0.6 + 0.8*rand.Float64())))
		h(w, r)
		g.mu.Lock()
		g.stats.Served++
		g.mu.Unlock()
	}
}

func (g *gateway) charge(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"id": fmt.Sprintf("ch_%016x", rand.Uint64()), "status": "succeeded"})
}

func (g *gateway) payout(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"id": fmt.Sprintf("po_%016x", rand.Uint64()), "status": "paid"})
}

func (g *gateway) getStats(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	s := g.stats
	g.mu.Unlock()
	writeJSON(w, http.StatusOK, s)
}

func (g *gateway) resetStats(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	g.stats = Stats{Peak: g.inFlight}
	g.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}
