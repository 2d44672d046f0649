package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/governor-project/governor/governor"
)

// Scenario 1: two tenants share one downstream of fixed capacity. The busy
// one fans each job out into subtasks, each calling the downstream inside
// two nested retry loops of three attempts; the quiet one makes one call
// per job. Without Governor everyone calls at once and retries on
// overload; with it each call holds a lease of a pool as large as the
// downstream's capacity, retries draw on a per-job budget, and the fair
// queue alternates the tenants. The downstream runs on the sim's virtual
// clock, so the counts are the same on every run of a seed.

const downClass = "down"

// fanoutParams shape the workload.
type fanoutParams struct {
	Capacity    int           `json:"capacity"`     // calls the downstream serves at once
	Service     time.Duration `json:"service_ns"`   // a call's time at no load
	FailRate    float64       `json:"fail_rate"`    // transient errors among served calls
	BusyJobs    int           `json:"busy_jobs"`    // jobs of the busy tenant
	Fanout      int           `json:"fanout"`       // subtasks per busy job
	BusyEvery   time.Duration `json:"busy_every"`   // between busy jobs
	QuietJobs   int           `json:"quiet_jobs"`   // jobs of the quiet tenant, one call each
	QuietEvery  time.Duration `json:"quiet_every"`  // between quiet jobs
	BusyBudget  int64         `json:"busy_budget"`  // retries per busy job, with Governor
	QuietBudget int64         `json:"quiet_budget"` // retries per quiet job, with Governor
}

func fanoutWorkload(short bool) fanoutParams {
	p := fanoutParams{Capacity: 10, Service: 20 * time.Millisecond, FailRate: 0.05,
		BusyJobs: 40, Fanout: 10, BusyEvery: 10 * time.Millisecond,
		QuietJobs: 60, QuietEvery: 20 * time.Millisecond, BusyBudget: 4, QuietBudget: 2}
	if short {
		p.BusyJobs, p.QuietJobs = 8, 12
	}
	return p
}

// fanoutSide is what one side (without or with Governor) measured.
type fanoutSide struct {
	Governor    bool                 `json:"governor"`
	Peak        int                  `json:"peak_concurrency"`
	Calls       map[string]int       `json:"calls"`      // downstream calls by tenant
	Served      map[string]int       `json:"served"`     // calls served
	Overloaded  map[string]int       `json:"overloaded"` // calls refused for overload
	Errors      map[string]int       `json:"errors"`     // transient errors
	JobsFailed  map[string]int       `json:"jobs_failed"`
	P50ms       map[string]float64   `json:"p50_ms"`
	P99ms       map[string]float64   `json:"p99_ms"`
	QuietShare  float64              `json:"quiet_share"`      // of the calls served while the quiet tenant had work
	QuietCalls  float64              `json:"quiet_call_share"` // of the calls made while the quiet tenant had work
	Concurrency [][2]float64         `json:"concurrency"`      // (ms, calls in flight) at each change
	LatencyMs   map[string][]float64 `json:"latency_ms"`       // each job's, by tenant, sorted
	latencies   map[string][]time.Duration
	servedAt    []servedCall
	calledAt    []servedCall
}

type servedCall struct {
	at     time.Duration
	tenant string
}

var (
	errOverloaded = errors.New("downstream overloaded (429)")
	errTransient  = errors.New("downstream failed (500)")
)

// downstream is the simulated service: it serves Capacity calls at once,
// each slower the fuller it is, and refuses the rest at once.
type downstream struct {
	s        *sim
	p        fanoutParams
	inflight int
	side     *fanoutSide
}

func (d *downstream) call(tenant string) (time.Duration, error) {
	d.side.Calls[tenant]++
	d.side.calledAt = append(d.side.calledAt, servedCall{d.s.now, tenant})
	d.inflight++
	d.side.Peak = max(d.side.Peak, d.inflight)
	d.trace()
	var took time.Duration
	var err error
	switch {
	case d.inflight > d.p.Capacity:
		took, err = 2*time.Millisecond, errOverloaded
		d.side.Overloaded[tenant]++
	case d.s.rng.Float64() < d.p.FailRate:
		took, err = d.p.Service/2, errTransient
		d.side.Errors[tenant]++
	default:
		load := time.Duration(d.inflight-1) * d.p.Service / time.Duration(d.p.Capacity)
		took = d.p.Service + load + time.Duration(d.s.rng.Int64N(int64(d.p.Service/2)))
		d.side.Served[tenant]++
		d.side.servedAt = append(d.side.servedAt, servedCall{d.s.now + took, tenant})
	}
	d.s.sleep(took)
	d.inflight--
	d.trace()
	return took, err
}

func (d *downstream) trace() {
	d.side.Concurrency = append(d.side.Concurrency, [2]float64{float64(d.s.now) / 1e6, float64(d.inflight)})
}

// fanoutRun is one side's run.
type fanoutRun struct {
	s      *sim
	d      *downstream
	p      fanoutParams
	side   *fanoutSide
	busy   *governor.Client // nil without Governor
	quiet  *governor.Client
	failed error // a failure of governord (not of the downstream): the run is void
}

func (r *fanoutRun) fail(err error) {
	if r.failed == nil {
		r.failed = err
	}
}

// attempt is one call: straight to the downstream, or holding a lease.
func (r *fanoutRun) attempt(ctx context.Context, task *governor.Task, tenant string) error {
	if task == nil {
		_, err := r.d.call(tenant)
		return err
	}
	l, err := r.s.acquire(ctx, task)
	if err != nil {
		r.fail(fmt.Errorf("acquire: %w", err))
		return err
	}
	took, cerr := r.d.call(tenant)
	if err := r.s.release(ctx, l, took, errors.Is(cerr, errOverloaded)); err != nil {
		r.fail(fmt.Errorf("release: %w", err))
	}
	return cerr
}

// retries runs attempt in loops nested depth deep, three attempts each,
// with backoff between them. With Governor each retry, at any level, first
// draws one unit of the task's retry budget, and a refusal ends every loop.
func (r *fanoutRun) retries(ctx context.Context, task *governor.Task, tenant string, depth int) error {
	var err error
	for i := range 3 {
		if i > 0 {
			if task != nil {
				if cerr := task.Consume(ctx, governor.ResourceRetry, 1); cerr != nil {
					if !errors.Is(cerr, governor.ErrQuotaExhausted) {
						r.fail(fmt.Errorf("consume: %w", cerr))
					}
					return fmt.Errorf("%w (not retried: %w)", err, cerr)
				}
			}
			r.s.sleep(time.Duration(5<<i) * time.Millisecond)
		}
		if depth == 1 {
			err = r.attempt(ctx, task, tenant)
		} else {
			err = r.retries(ctx, task, tenant, depth-1)
		}
		if err == nil || errors.Is(err, governor.ErrQuotaExhausted) {
			return err
		}
	}
	return err
}

// newTask makes a task (under the one ctx carries), or nothing without Governor.
func (r *fanoutRun) newTask(ctx context.Context, c *governor.Client, name string, budget int64) (context.Context, *governor.Task) {
	if c == nil {
		return ctx, nil
	}
	spec := governor.Spec{Name: name}
	if budget > 0 {
		spec.Quotas = map[string]int64{governor.ResourceRetry: budget}
	}
	tctx, t, err := c.NewTask(ctx, spec)
	if err != nil {
		r.fail(fmt.Errorf("new task %s: %w", name, err))
		return ctx, nil
	}
	return tctx, t
}

func (r *fanoutRun) closeTask(t *governor.Task) {
	if t != nil {
		if err := t.Close(); err != nil {
			r.fail(fmt.Errorf("close task: %w", err))
		}
	}
}

func (r *fanoutRun) busyJob(ctx context.Context, n int) {
	began := r.s.now
	jctx, job := r.newTask(ctx, r.busy, "job-"+strconv.Itoa(n), r.p.BusyBudget)
	g := &group{s: r.s}
	failed := false
	for i := range r.p.Fanout {
		g.goFn(func() {
			sctx, sub := r.newTask(jctx, r.busy, "sub-"+strconv.Itoa(i), 0)
			if r.retries(sctx, sub, "busy", 2) != nil {
				failed = true
			}
			r.closeTask(sub)
		})
	}
	g.wait()
	r.closeTask(job)
	r.jobDone("busy", began, failed)
}

func (r *fanoutRun) quietJob(ctx context.Context, n int) {
	began := r.s.now
	jctx, job := r.newTask(ctx, r.quiet, "job-"+strconv.Itoa(n), r.p.QuietBudget)
	failed := r.retries(jctx, job, "quiet", 1) != nil
	r.closeTask(job)
	r.jobDone("quiet", began, failed)
}

func (r *fanoutRun) jobDone(tenant string, began time.Duration, failed bool) {
	r.side.latencies[tenant] = append(r.side.latencies[tenant], r.s.now-began)
	if failed {
		r.side.JobsFailed[tenant]++
	}
}

// workload starts both tenants' jobs on their schedules and waits for all.
func (r *fanoutRun) workload(ctx context.Context) {
	g := &group{s: r.s}
	g.goFn(func() {
		jobs := &group{s: r.s}
		for n := range r.p.BusyJobs {
			jobs.goFn(func() { r.busyJob(ctx, n) })
			r.s.sleep(r.p.BusyEvery)
		}
		jobs.wait()
	})
	g.goFn(func() {
		jobs := &group{s: r.s}
		for n := range r.p.QuietJobs {
			jobs.goFn(func() { r.quietJob(ctx, n) })
			r.s.sleep(r.p.QuietEvery)
		}
		jobs.wait()
	})
	g.wait()
}

// fanoutConfig is governord's config for two tenants of equal weight under
// a root limit of one class (formatted with the class and the limit).
const fanoutConfig = `admin_key: bench-admin-key
session_ttl: 60s
root: {limits: {%s: %d}}
tenants:
  - {name: busy, api_key: bench-busy-key, weight: 1}
  - {name: quiet, api_key: bench-quiet-key, weight: 1}
`

func newFanoutSide(governed bool) *fanoutSide {
	return &fanoutSide{Governor: governed, Calls: map[string]int{}, Served: map[string]int{},
		Overloaded: map[string]int{}, Errors: map[string]int{}, JobsFailed: map[string]int{},
		P50ms: map[string]float64{}, P99ms: map[string]float64{}, latencies: map[string][]time.Duration{}}
}

// fanoutSideRun runs one side of scenario 1.
func fanoutSideRun(ctx context.Context, e *env, p fanoutParams, governed bool) (*fanoutSide, error) {
	side := newFanoutSide(governed)
	var gov *governord
	r := &fanoutRun{p: p, side: side}
	if governed {
		var err error
		if gov, err = e.startGovernord(ctx, fmt.Sprintf(fanoutConfig, downClass, p.Capacity)); err != nil {
			return nil, err
		}
		defer gov.stop()
		for _, c := range []struct {
			key string
			to  **governor.Client
		}{{"bench-busy-key", &r.busy}, {"bench-quiet-key", &r.quiet}} {
			cl, err := governor.Dial(ctx, governor.WithAddr(gov.addr), governor.WithAPIKey(c.key))
			if err != nil {
				return nil, err
			}
			defer cl.Close()
			*c.to = cl
		}
	}
	r.s = newSim(e.seed, gov, downClass)
	r.d = &downstream{s: r.s, p: p, side: side}
	if err := r.s.run(func() { r.workload(ctx) }); err != nil {
		return nil, err
	}
	if r.failed != nil {
		return nil, r.failed
	}
	side.summarize()
	return side, nil
}

func (side *fanoutSide) summarize() {
	side.LatencyMs = map[string][]float64{}
	for tenant, l := range side.latencies {
		slices.Sort(l)
		for _, d := range l {
			side.LatencyMs[tenant] = append(side.LatencyMs[tenant], float64(d)/1e6)
		}
		side.P50ms[tenant] = float64(percentile(l, 0.50)) / 1e6
		side.P99ms[tenant] = float64(percentile(l, 0.99)) / 1e6
	}
	side.QuietShare = quietShare(side.servedAt)
	side.QuietCalls = quietShare(side.calledAt)
}

// quietShare is the quiet tenant's share of calls between its first and
// its last.
func quietShare(calls []servedCall) float64 {
	lo, hi := time.Duration(1<<62), time.Duration(-1)
	for _, c := range calls {
		if c.tenant == "quiet" {
			lo, hi = min(lo, c.at), max(hi, c.at)
		}
	}
	var quiet, all int
	for _, c := range calls {
		if c.at >= lo && c.at <= hi {
			all++
			if c.tenant == "quiet" {
				quiet++
			}
		}
	}
	if all == 0 {
		return 0
	}
	return float64(quiet) / float64(all)
}

// percentile is the nearest-rank p-th of sorted.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(p*float64(len(sorted))+0.999999) - 1
	return sorted[min(max(rank, 0), len(sorted)-1)]
}

func runFanout(ctx context.Context, e *env) (*result, error) {
	p := fanoutWorkload(e.short)
	var sides []*fanoutSide
	for _, governed := range []bool{false, true} {
		side, err := fanoutSideRun(ctx, e, p, governed)
		if err != nil {
			return nil, fmt.Errorf("governed=%v: %w", governed, err)
		}
		sides = append(sides, side)
	}
	r := &result{Header: []string{"", "peak / capacity", "calls", "overloaded", "errors", "jobs failed",
		"busy p50 / p99 ms", "quiet p50 / p99 ms", "quiet share of calls / served"},
		Raw: map[string]any{"params": p, "seed": e.seed, "without": sides[0], "with": sides[1]}}
	for _, side := range sides {
		name := "without"
		if side.Governor {
			name = "with Governor"
		}
		r.Rows = append(r.Rows, []string{name,
			fmt.Sprintf("%d / %d", side.Peak, p.Capacity),
			strconv.Itoa(side.Calls["busy"] + side.Calls["quiet"]),
			strconv.Itoa(side.Overloaded["busy"] + side.Overloaded["quiet"]),
			strconv.Itoa(side.Errors["busy"] + side.Errors["quiet"]),
			fmt.Sprintf("%d busy, %d quiet", side.JobsFailed["busy"], side.JobsFailed["quiet"]),
			fmt.Sprintf("%.0f / %.0f", side.P50ms["busy"], side.P99ms["busy"]),
			fmt.Sprintf("%.0f / %.0f", side.P50ms["quiet"], side.P99ms["quiet"]),
			fmt.Sprintf("%.0f%% / %.0f%%", 100*side.QuietCalls, 100*side.QuietShare)})
	}
	r.Notes = []string{fmt.Sprintf("Seed %d; virtual time: the same seed gives the same counts. %d busy jobs of %d subtasks (2 nested retry loops of 3 attempts) every %v, %d quiet jobs of one call every %v; downstream capacity %d.",
		e.seed, p.BusyJobs, p.Fanout, p.BusyEvery, p.QuietJobs, p.QuietEvery, p.Capacity)}
	return r, nil
}
