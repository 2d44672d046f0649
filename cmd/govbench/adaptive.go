package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/governor-project/governor/governor"
)

// Scenario 3: workers call a downstream whose capacity falls from 20 to 5
// mid-run, each call holding a lease of the "psp" pool. With a fixed limit
// of 20 the workers keep 20 calls in flight; the downstream refuses what
// is over its capacity and slows down the rest, since refusing costs it
// work too. With an adaptive limit governord cuts the pool to 70% each
// interval in which the releases report overload (or a p95 over target)
// and adds one otherwise, so it settles near the new capacity, probing.
//
// This runs in real time against governord's own controller, so its counts
// vary a little from run to run; the short mode checks only that adaptive
// serves more than fixed after the drop.

type adaptiveParams struct {
	Workers     int           `json:"workers"`
	Before      time.Duration `json:"before_ns"` // at capacity 20
	After       time.Duration `json:"after_ns"`  // at capacity 5
	Service     time.Duration `json:"service_ns"`
	Refuse      time.Duration `json:"refuse_ns"` // how long a refusal takes
	Interval    time.Duration `json:"interval_ns"`
	TargetP95   time.Duration `json:"target_p95_ns"`
	MaxOverload float64       `json:"max_overload"`
}

func adaptiveWorkload(short bool) adaptiveParams {
	p := adaptiveParams{Workers: 30, Before: 3 * time.Second, After: 6 * time.Second,
		Service: 20 * time.Millisecond, Refuse: 5 * time.Millisecond,
		Interval: 50 * time.Millisecond, TargetP95: 100 * time.Millisecond, MaxOverload: 0.02}
	if short {
		p.Before, p.After = time.Second, 2*time.Second
	}
	return p
}

type adaptiveSide struct {
	Adaptive     bool         `json:"adaptive"`
	ShedAfter    int          `json:"shed_after"`
	ServedAfter  int          `json:"served_after"`
	ShedBefore   int          `json:"shed_before"`
	ServedBefore int          `json:"served_before"`
	Limit        [][2]float64 `json:"limit"` // (ms since start, the pool's limit)
	MeanLimit    float64      `json:"mean_limit_after"`
}

// capDownstream serves up to capacity calls at once and refuses the rest
// at once. Refusing costs it work too: a call it serves takes longer the
// more calls are in flight, refused ones included, beyond its capacity.
type capDownstream struct {
	mu       sync.Mutex
	capacity int
	inflight int // calls in flight, served or being refused
	busy     int // calls being served
	dropped  bool
	served   [2]int // before, after the drop
	shed     [2]int
}

func (d *capDownstream) call(p adaptiveParams) (time.Duration, bool) {
	d.mu.Lock()
	phase := 0
	if d.dropped {
		phase = 1
	}
	d.inflight++
	over := d.busy >= d.capacity
	took := p.Refuse
	if over {
		d.shed[phase]++
	} else {
		d.busy++
		d.served[phase]++
		took = p.Service * time.Duration(max(d.inflight, d.capacity)) / time.Duration(d.capacity)
	}
	d.mu.Unlock()
	time.Sleep(took)
	d.mu.Lock()
	d.inflight--
	if !over {
		d.busy--
	}
	d.mu.Unlock()
	return took, over
}

func (d *capDownstream) drop(to int) {
	d.mu.Lock()
	d.capacity, d.dropped = to, true
	d.mu.Unlock()
}

const adaptiveConfigFixed = `admin_key: bench-admin-key
session_ttl: 60s
root: {limits: {psp: 20}}
tenants:
  - {name: shop, api_key: bench-shop-key}
`

const adaptiveConfigAIMD = `admin_key: bench-admin-key
session_ttl: 60s
adaptive:
  - {class: psp, target_p95: %v, max_overload: %v, min_limit: 1, max_limit: 20, interval: %v, min_samples: 10}
tenants:
  - {name: shop, api_key: bench-shop-key}
`

// adaptiveSideRun runs one side, the fixed limit or the adaptive one, on a
// governord of its own: the workers against the downstream, whose capacity
// drops after p.Before, while the pool's limit is sampled.
func adaptiveSideRun(ctx context.Context, e *env, p adaptiveParams, adaptive bool) (*adaptiveSide, error) {
	cfg := adaptiveConfigFixed
	if adaptive {
		cfg = fmt.Sprintf(adaptiveConfigAIMD, p.TargetP95, p.MaxOverload, p.Interval)
	}
	gov, err := e.startGovernord(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer gov.stop()
	client, err := governor.Dial(ctx, governor.WithAddr(gov.addr), governor.WithAPIKey("bench-shop-key"))
	if err != nil {
		return nil, err
	}
	defer client.Close()
	tctx, task, err := client.NewTask(ctx, governor.Spec{Name: "checkout"})
	if err != nil {
		return nil, err
	}
	defer task.Close()

	d := &capDownstream{capacity: 20}
	side := &adaptiveSide{Adaptive: adaptive}
	w := startAdaptiveWorkers(tctx, task, d, p)
	defer w.stop()
	if err := sampleTheLimit(ctx, gov, d, p, w, side); err != nil {
		return nil, err
	}
	if err := w.halt(); err != nil {
		return nil, err
	}
	side.ShedBefore, side.ServedBefore = d.shed[0], d.served[0]
	side.ShedAfter, side.ServedAfter = d.shed[1], d.served[1]
	return side, nil
}

// adaptiveWorkers are one side's workers: each call to the downstream
// holds a lease of the psp pool, released with how long the call took and
// whether it was refused.
type adaptiveWorkers struct {
	stop context.CancelFunc
	wg   sync.WaitGroup
	errs chan error
}

func startAdaptiveWorkers(ctx context.Context, task *governor.Task, d *capDownstream, p adaptiveParams) *adaptiveWorkers {
	ctx, stop := context.WithCancel(ctx)
	w := &adaptiveWorkers{stop: stop, errs: make(chan error, p.Workers)}
	for range p.Workers {
		w.wg.Add(1)
		go w.work(ctx, task, d, p)
	}
	return w
}

func (w *adaptiveWorkers) work(ctx context.Context, task *governor.Task, d *capDownstream, p adaptiveParams) {
	defer w.wg.Done()
	for ctx.Err() == nil {
		l, err := task.Acquire(ctx, "psp")
		if err != nil {
			if ctx.Err() == nil {
				w.errs <- fmt.Errorf("acquire: %w", err)
			}
			return
		}
		took, over := d.call(p)
		if err := l.Release(context.WithoutCancel(ctx), took, over); err != nil {
			w.errs <- fmt.Errorf("release: %w", err)
			return
		}
	}
}

// halt stops the workers, waits for them and returns what stopped one of
// them, if anything did other than the stop.
func (w *adaptiveWorkers) halt() error {
	w.stop()
	w.wg.Wait()
	select {
	case err := <-w.errs:
		if !errors.Is(err, context.Canceled) {
			return err
		}
	default:
	}
	return nil
}

// sampleTheLimit is the measured phase: for p.Before+p.After it reads the
// pool's limit from governord's metrics every 50 ms into side.Limit,
// dropping the downstream's capacity to 5 once p.Before is over, and sets
// side.MeanLimit to the mean of the samples after the drop. A worker's
// error ends it, the workers halted.
func sampleTheLimit(ctx context.Context, gov *governord, d *capDownstream, p adaptiveParams, w *adaptiveWorkers, side *adaptiveSide) error {
	began := time.Now()
	series := fmt.Sprintf("governor_pool_limit{class=%q,tenant=%q}", "psp", "")
	var sum float64
	var samples int
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for time.Since(began) < p.Before+p.After {
		select {
		case err := <-w.errs:
			w.stop()
			w.wg.Wait()
			return err
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		if !d.dropped && time.Since(began) >= p.Before {
			d.drop(5)
		}
		v, err := gov.metric(series)
		if err != nil {
			return err
		}
		at := time.Since(began)
		side.Limit = append(side.Limit, [2]float64{float64(at.Milliseconds()), v})
		if at >= p.Before {
			sum += v
			samples++
		}
	}
	if samples > 0 {
		side.MeanLimit = sum / float64(samples)
	}
	return nil
}

func runAdaptive(ctx context.Context, e *env) (*result, error) {
	p := adaptiveWorkload(e.short)
	var sides []*adaptiveSide
	for _, adaptive := range []bool{false, true} {
		s, err := adaptiveSideRun(ctx, e, p, adaptive)
		if err != nil {
			return nil, fmt.Errorf("adaptive=%v: %w", adaptive, err)
		}
		sides = append(sides, s)
	}
	r := &result{Header: []string{"limit", "served before", "shed after", "served after", "mean limit after"},
		Raw: map[string]any{"params": p, "fixed": sides[0], "adaptive": sides[1]}}
	for _, s := range sides {
		name := "fixed 20"
		if s.Adaptive {
			name = "adaptive (AIMD)"
		}
		r.Rows = append(r.Rows, []string{name, strconv.Itoa(s.ServedBefore), strconv.Itoa(s.ShedAfter),
			strconv.Itoa(s.ServedAfter), strconv.FormatFloat(s.MeanLimit, 'f', 1, 64)})
	}
	r.Notes = []string{fmt.Sprintf("%d workers; capacity 20 for %v, then 5 for %v (the counts \"after\" cover these %v); a call takes %v at or under capacity, slower in proportion to what is in flight over it, and a refusal takes %v. Adaptive: interval %v, target p95 %v, max overload %v, limit in [1, 20].",
		p.Workers, p.Before, p.After, p.After, p.Service, p.Refuse, p.Interval, p.TargetP95, p.MaxOverload)}
	return r, nil
}
