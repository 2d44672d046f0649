package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/governor-project/governor/governor"
)

// Scenario 4: the downstream is fully down (a real HTTP server answering
// 503 to everything), and each call goes through three nested retry
// loops of three attempts, each reasonable on its own. Without Governor a
// call makes 3×3×3 = 27 requests. With it, every retry at any level draws
// on the call's one retry budget (governor.Retry), so a budget of 1 makes
// 2 requests: the free first attempt and one retry.

type retriesSide struct {
	Governor        bool    `json:"governor"`
	Calls           int     `json:"calls"`
	Requests        int64   `json:"requests"`
	PerCall         float64 `json:"requests_per_call"`
	MaxPerCall      int64   `json:"max_requests_per_call"`
	Budget          int64   `json:"retry_budget,omitempty"`
	ErrorsPreserved bool    `json:"last_error_returned"` // every call returned the downstream's error
}

const retriesConfig = `admin_key: bench-admin-key
session_ttl: 60s
tenants:
  - {name: jobs, api_key: bench-jobs-key}
`

func runRetries(ctx context.Context, e *env) (*result, error) {
	calls, budget := 20, int64(1)
	if e.short {
		calls = 5
	}
	down, err := startDownDownstream()
	if err != nil {
		return nil, err
	}
	defer down.close()

	gov, err := e.startGovernord(ctx, retriesConfig)
	if err != nil {
		return nil, err
	}
	defer gov.stop()
	client, err := governor.Dial(ctx, governor.WithAddr(gov.addr), governor.WithAPIKey("bench-jobs-key"))
	if err != nil {
		return nil, err
	}
	defer client.Close()

	var sides []retriesSide
	for _, governed := range []bool{false, true} {
		side, err := retriesSideRun(ctx, client, down, governed, calls, budget)
		if err != nil {
			return nil, err
		}
		sides = append(sides, side)
	}
	return retriesReport(sides), nil
}

// errDown is what a request to the downstream that is down returns.
var errDown = errors.New("downstream answered 503")

// downDownstream is the downstream that is down: a real HTTP server that
// answers 503 to every request and counts them.
type downDownstream struct {
	srv  *http.Server
	url  string
	hits atomic.Int64
}

func startDownDownstream() (*downDownstream, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	d := &downDownstream{url: "http://" + ln.Addr().String() + "/"}
	d.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d.hits.Add(1)
		http.Error(w, "down", http.StatusServiceUnavailable)
	})}
	go d.srv.Serve(ln)
	return d, nil
}

func (d *downDownstream) close() { d.srv.Close() }

// request is one attempt at the downstream: errDown for its 503.
func (d *downDownstream) request(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%w (%d)", errDown, resp.StatusCode)
	}
	return nil
}

// retriesSideRun makes calls calls through the nested loops, governed by a
// retry budget of budget each or not, and counts the downstream's requests.
func retriesSideRun(ctx context.Context, client *governor.Client, down *downDownstream, governed bool, calls int, budget int64) (retriesSide, error) {
	side := retriesSide{Governor: governed, Calls: calls, ErrorsPreserved: true}
	if governed {
		side.Budget = budget
	}
	for n := range calls {
		before := down.hits.Load()
		var err error
		if governed {
			err = governedCall(ctx, client, "call-"+strconv.Itoa(n), budget, down.request)
		} else {
			err = nestedLoops(ctx, 3, down.request)
		}
		if !errors.Is(err, errDown) {
			side.ErrorsPreserved = false
		}
		if ctx.Err() != nil {
			return side, ctx.Err()
		}
		side.MaxPerCall = max(side.MaxPerCall, down.hits.Load()-before)
	}
	side.Requests = down.hits.Load()
	down.hits.Store(0)
	side.PerCall = float64(side.Requests) / float64(calls)
	return side, nil
}

// retriesReport is the scenario's table: without Governor, then with it.
func retriesReport(sides []retriesSide) *result {
	r := &result{Header: []string{"", "calls", "downstream requests", "per call", "most in one call"},
		Raw: sides}
	for _, s := range sides {
		name := "without"
		if s.Governor {
			name = fmt.Sprintf("with Governor (retry budget %d)", s.Budget)
		}
		r.Rows = append(r.Rows, []string{name, strconv.Itoa(s.Calls), strconv.FormatInt(s.Requests, 10),
			strconv.FormatFloat(s.PerCall, 'f', 1, 64), strconv.FormatInt(s.MaxPerCall, 10)})
	}
	r.Notes = []string{"Three nested loops of three attempts; the downstream answers 503 to every request. Every call returned the downstream's last error: " +
		strconv.FormatBool(sides[0].ErrorsPreserved && sides[1].ErrorsPreserved) + "."}
	return r
}

// nestedLoops retries fn depth loops deep, three attempts each, with no
// budget: what each layer does on its own.
func nestedLoops(ctx context.Context, depth int, fn func(context.Context) error) error {
	var err error
	for i := range 3 {
		if i > 0 {
			time.Sleep(time.Millisecond)
		}
		if depth == 1 {
			err = fn(ctx)
		} else {
			err = nestedLoops(ctx, depth-1, fn)
		}
		if err == nil {
			return nil
		}
	}
	return err
}

// governedCall is the same three loops with governor.Retry at each level,
// drawing on one task's retry budget.
func governedCall(ctx context.Context, client *governor.Client, name string, budget int64, fn func(context.Context) error) error {
	tctx, task, err := client.NewTask(ctx, governor.Spec{Name: name, Quotas: map[string]int64{governor.ResourceRetry: budget}})
	if err != nil {
		return err
	}
	defer task.Close()
	opts := []governor.RetryOption{governor.WithMaxAttempts(3), governor.WithBackoff(time.Millisecond, 2*time.Millisecond)}
	return governor.Retry(tctx, func(ctx context.Context) error {
		return governor.Retry(ctx, func(ctx context.Context) error {
			return governor.Retry(ctx, fn, opts...)
		}, opts...)
	}, opts...)
}
