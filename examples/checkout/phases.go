package main

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/governor-project/governor/internal/logline"
)

// phase is what one phase measured.
type phase struct {
	Governor bool   `json:"governor"`
	Batch    bool   `json:"batch"` // the batch ran during the phase
	Name     string `json:"name"`

	Checkout checkoutStats `json:"checkout"`
	Nightly  *batchStats   `json:"nightly,omitempty"`
	Gateway  gatewayStats  `json:"gateway"`
}

// checkoutStats is what the checkout's customers saw: every request the
// driver sent, and how long each took, failed ones included.
type checkoutStats struct {
	Requests int            `json:"requests"`
	OK       int            `json:"ok"`
	Failed   map[string]int `json:"failed"` // by status ("503"), or "error" when no answer came
	P50ms    float64        `json:"p50_ms"`
	P99ms    float64        `json:"p99_ms"`
	MaxMs    float64        `json:"max_ms"`
}

func (c checkoutStats) failures() int { return c.Requests - c.OK }

// batchStats is what the nightly batch reported when it was stopped.
type batchStats struct {
	Paid     int64   `json:"paid"`     // payouts the gateway accepted
	Got429   int64   `json:"got_429"`  // 429s it was answered
	Deferred int64   `json:"deferred"` // payouts put back after five 429s
	Failed   int64   `json:"failed"`   // other failures
	Seconds  float64 `json:"seconds"`
}

// runMode starts the checkout service (under Governor, behind its sidecar)
// and runs its two phases: alone, then with the batch.
func (e *env) runMode(ctx context.Context, governed bool) ([]phase, error) {
	var stops []func()
	defer func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}()
	if err := e.resetData(ctx); err != nil {
		return nil, err
	}
	var ckSide, batchSide *sidecar
	if governed {
		fmt.Fprintln(e.log, "checkout: starting governord and a governor-proxy for each service")
		g, addr, err := e.startGovernord(ctx)
		if err != nil {
			return nil, err
		}
		stops = append(stops, g.stop)
		if ckSide, err = e.startSidecar(ctx, "checkout", addr); err != nil {
			return nil, err
		}
		stops = append(stops, ckSide.stop)
		if batchSide, err = e.startSidecar(ctx, "batch", addr); err != nil {
			return nil, err
		}
		stops = append(stops, batchSide.stop)
	}
	svc, err := start("checkoutd", e.bins["checkoutd"], e.serviceEnv("checkout", ckSide, "LISTEN=127.0.0.1:0"))
	if err != nil {
		return nil, err
	}
	stops = append(stops, svc.stop)
	line, err := svc.waitFor(ctx, "checkout listening", startTimeout)
	if err != nil {
		return nil, err
	}
	url := "http://" + fmt.Sprint(line["addr"]) + "/checkout"
	mode := map[bool]string{false: "without Governor", true: "with Governor"}[governed]

	fmt.Fprintf(e.log, "checkout: %s: the checkout alone, %v\n", mode, e.opts.Phase)
	alone, err := e.phase(ctx, url, nil)
	if err != nil {
		return nil, err
	}
	alone.Governor, alone.Name = governed, "checkout alone"

	fmt.Fprintf(e.log, "checkout: %s: the checkout while the batch runs, %v\n", mode, e.opts.Phase)
	batch, err := start("nightly", e.bins["nightly"], e.serviceEnv("nightly", batchSide, fmt.Sprintf("WORKERS=%d", e.opts.Workers)))
	if err != nil {
		return nil, err
	}
	stops = append(stops, batch.stop)
	if _, err := batch.waitFor(ctx, "nightly started", startTimeout); err != nil {
		return nil, err
	}
	busy, err := e.phase(ctx, url, batch)
	if err != nil {
		return nil, err
	}
	busy.Governor, busy.Batch, busy.Name = governed, true, "while the batch runs"
	return []phase{alone, busy}, nil
}

// phase sends the checkout orders for one phase and gathers what the
// checkout, the gateway and the batch (if it runs) saw. It stops the batch.
func (e *env) phase(ctx context.Context, url string, batch *process) (phase, error) {
	var p phase
	if err := e.resetPSP(ctx); err != nil {
		return p, err
	}
	p.Checkout = e.drive(ctx, url)
	if ctx.Err() != nil {
		return p, ctx.Err()
	}
	var err error
	if p.Gateway, err = e.pspStats(ctx); err != nil {
		return p, err
	}
	if batch != nil {
		batch.stop()
		line, ok := logline.Find(batch.output(), "nightly done")
		if !ok {
			return p, fmt.Errorf("the batch did not report what it did: %s", batch.tail(10))
		}
		p.Nightly = &batchStats{Paid: num(line["paid"]), Got429: num(line["psp_429"]), Deferred: num(line["deferred"]),
			Failed: num(line["failed"])}
		p.Nightly.Seconds, _ = line["seconds"].(float64)
	}
	return p, nil
}

// drive sends the checkout opts.Rate orders a second for opts.Phase, each
// on its own as customers' orders arrive (not waiting for the one before),
// and times them.
func (e *env) drive(ctx context.Context, url string) checkoutStats {
	type result struct {
		status  int // 0: no answer
		elapsed time.Duration
	}
	var (
		mu      sync.Mutex
		results []result
		wg      sync.WaitGroup
	)
	// Orders are sent on a fixed schedule; one the driver could not send on
	// time (the cores were busy) goes out late rather than not at all, so
	// that every phase sends the same number.
	interval := time.Second / time.Duration(e.opts.Rate)
	total := int(e.opts.Phase / interval)
	start := time.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for n := range total {
		timer.Reset(time.Until(start.Add(time.Duration(n) * interval)))
		select {
		case <-timer.C:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func(amount int) {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("%s?amount=%d", url, amount), nil)
			start := time.Now()
			r := result{}
			if resp, err := e.client.Do(req); err == nil {
				resp.Body.Close()
				r.status = resp.StatusCode
			}
			r.elapsed = time.Since(start)
			mu.Lock()
			results = append(results, r)
			mu.Unlock()
		}(100 + n%5000)
	}
	wg.Wait()

	s := checkoutStats{Requests: len(results), Failed: map[string]int{}}
	lat := make([]time.Duration, 0, len(results))
	for _, r := range results {
		lat = append(lat, r.elapsed)
		switch r.status {
		case http.StatusOK:
			s.OK++
		case 0:
			s.Failed["error"]++
		default:
			s.Failed[fmt.Sprint(r.status)]++
		}
	}
	slices.Sort(lat)
	s.P50ms, s.P99ms = ms(quantile(lat, 0.50)), ms(quantile(lat, 0.99))
	if len(lat) > 0 {
		s.MaxMs = ms(lat[len(lat)-1])
	}
	return s
}

// quantile is the q-th quantile of sorted values: the smallest value that
// at least a share q of them do not exceed.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func ms(d time.Duration) float64 { return math.Round(float64(d)/float64(time.Millisecond)*10) / 10 }

// num reads a count from a parsed JSON log line.
func num(v any) int64 {
	if f, ok := v.(float64); ok {
		return int64(f)
	}
	return 0
}
