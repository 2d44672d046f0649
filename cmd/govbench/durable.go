package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/governor-project/governor/api/governorpb"
)

// Scenario 5: consumes per second at 1, 16 and 64 callers on each store,
// every consume committed before it is answered, against a call that does
// nothing (the standard gRPC health check) on the same governord, the same
// connections and the same callers. Each caller has a session and a
// connection of its own, and sends every consume with a request id, as the
// SDK does. The two kinds of call take turns, round after round, so that
// the shared machine's noise falls on both alike; the figure is the ratio
// of their medians.

type durableRun struct {
	Store    string    `json:"store"`
	Callers  int       `json:"callers"`
	Consumes []float64 `json:"consumes_per_s"` // one per round
	Noops    []float64 `json:"noops_per_s"`
	Ratio    float64   `json:"ratio"` // median consumes over median no-ops
	RoundS   float64   `json:"round_s"`
}

const durableConfig = `admin_key: bench-admin-key
session_ttl: 60s
tenants:
  - {name: jobs, api_key: bench-jobs-key}
`

// durableGoals are the issue's: the share of the no-op call's rate a
// durable store keeps at 64 callers.
var durableGoals = map[string]float64{"postgres": 0.85, "sqlite": 0.7}

func runDurable(ctx context.Context, e *env) (*result, error) {
	stores := []string{"memory", "sqlite"}
	if e.pgDSN != "" {
		stores = append(stores, "postgres")
	}
	callers, round := []int{1, 16, 64}, 2*time.Second
	if e.short {
		callers, round = []int{1, 8}, 200*time.Millisecond
	}
	var runs []*durableRun
	for _, store := range stores {
		for _, n := range callers {
			r, err := durableOnce(ctx, e, store, n, round)
			if err != nil {
				return nil, fmt.Errorf("%s, %d callers: %w", store, n, err)
			}
			runs = append(runs, r)
			fmt.Fprintf(e.log, "govbench: %s, %d callers: %.0f consumes/s against %.0f no-op calls/s (%.2f)\n",
				store, n, statOf(r.Consumes).med, statOf(r.Noops).med, r.Ratio)
		}
	}
	res := &result{Header: []string{"store", "callers", "consumes/s (median, range)", "no-op calls/s (median, range)", "ratio", "goal at 64"},
		Raw: runs}
	for _, r := range runs {
		goal := ""
		if g, ok := durableGoals[r.Store]; ok && r.Callers == 64 {
			goal = fmt.Sprintf("≥ %.2f: %s", g, metOrNot(r.Ratio >= g))
		}
		res.Rows = append(res.Rows, []string{r.Store, strconv.Itoa(r.Callers), statOf(r.Consumes).String(), statOf(r.Noops).String(),
			fmt.Sprintf("%.2f", r.Ratio), goal})
	}
	res.Notes = []string{fmt.Sprintf("%d rounds of %v per kind of call, taking turns; each caller its own session and connection; every consume has a request id and is committed before its answer. The original reached 3,600-7,200 consumes/s.", len(runs[0].Consumes), round)}
	return res, nil
}

func metOrNot(met bool) string {
	if met {
		return "met"
	}
	return "not met"
}

// durableOnce measures one store at one number of callers, on a governord
// of its own.
func durableOnce(ctx context.Context, e *env, store string, callers int, round time.Duration) (*durableRun, error) {
	gov, err := e.startGovernordOn(ctx, store, durableConfig)
	if err != nil {
		return nil, err
	}
	defer gov.stop()
	clients := make([]*durableCaller, callers)
	for i := range clients {
		if clients[i], err = dialDurable(ctx, gov.addr); err != nil {
			return nil, err
		}
		defer clients[i].conn.Close()
	}
	r := &durableRun{Store: store, Callers: callers, RoundS: round.Seconds()}
	consume := func(c *durableCaller, i int64) error {
		_, err := c.gov.Consume(c.ctx, &governorpb.ConsumeRequest{RequestId: strconv.FormatInt(i, 10),
			NodeId: c.scope, Resource: "tokens", Amount: 1})
		return err
	}
	noop := func(c *durableCaller, _ int64) error {
		_, err := c.health.Check(c.ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	// A warm-up of each, unmeasured: connections, the store's first pages.
	for _, call := range []func(*durableCaller, int64) error{noop, consume} {
		if _, err := callRate(ctx, clients, round/4, call); err != nil {
			return nil, err
		}
	}
	for i := range max(e.runs, 1) {
		first, second := &r.Noops, &r.Consumes
		calls := [2]func(*durableCaller, int64) error{noop, consume}
		if i%2 == 1 { // alternate which goes first
			first, second = second, first
			calls[0], calls[1] = calls[1], calls[0]
		}
		for k, into := range []*[]float64{first, second} {
			v, err := callRate(ctx, clients, round, calls[k])
			if err != nil {
				return nil, err
			}
			*into = append(*into, v)
		}
	}
	r.Ratio = statOf(r.Consumes).med / statOf(r.Noops).med
	return r, nil
}

// durableCaller is one caller: a connection and a session of its own.
type durableCaller struct {
	conn   *grpc.ClientConn
	gov    governorpb.GovernorClient
	health healthpb.HealthClient
	ctx    context.Context // carries the session token
	scope  int64
	next   int64 // its next request id
}

func dialDurable(ctx context.Context, addr string) (*durableCaller, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	c := &durableCaller{conn: conn, gov: governorpb.NewGovernorClient(conn), health: healthpb.NewHealthClient(conn)}
	s, err := c.gov.OpenSession(ctx, &governorpb.OpenSessionRequest{ApiKey: "bench-jobs-key"})
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("open a session: %w", err)
	}
	c.ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+s.GetSessionToken())
	c.scope = s.GetScopeNodeId()
	return c, nil
}

// callRate runs call in a loop on every caller for d and returns calls per
// second; the first error stops it.
func callRate(ctx context.Context, callers []*durableCaller, d time.Duration, call func(*durableCaller, int64) error) (float64, error) {
	var done atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	began := time.Now()
	deadline := began.Add(d)
	for _, c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) && ctx.Err() == nil {
				c.next++
				if err := call(c, c.next); err != nil {
					once.Do(func() { first = err })
					return
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	if first != nil {
		return 0, first
	}
	return float64(done.Load()) / time.Since(began).Seconds(), ctx.Err()
}
