package server

import (
	"context"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor/engine"
	"github.com/governor-project/governor/server/serverconfig"
)

// Rates in governord's YAML: "N/PERIOD" or {rate, burst}, on the root,
// tenants and tenants' defaults; every mistake names its key.
func TestConfigRates(t *testing.T) {
	cfg, err := serverconfig.ParseConfig([]byte(`
root:
  rates: {requests: 100/s}
tenants:
  - name: payments
    api_key: payments-key-long-enough-0123456789
    rates:
      tokens: 40000/min
      calls: {rate: 5/h, burst: 20}
    defaults:
      rates: {requests: 10/s}
`))
	if err != nil {
		t.Fatal(err)
	}
	if r := cfg.Root.Rates["requests"]; r != (engine.Rate{Units: 100, Per: int64(time.Second)}) {
		t.Fatalf("root: %+v", cfg.Root.Rates)
	}
	p := cfg.Tenants[0]
	if p.Rates["tokens"] != (engine.Rate{Units: 40000, Per: int64(time.Minute)}) ||
		p.Rates["calls"] != (engine.Rate{Units: 5, Per: int64(time.Hour), Burst: 20}) ||
		p.Defaults.Rates["requests"] != (engine.Rate{Units: 10, Per: int64(time.Second)}) {
		t.Fatalf("tenant: %+v", p)
	}
	for _, c := range []struct{ yaml, key string }{
		{"root: {rates: {requests: 0/s}}", "root.rates.requests"},
		{"root: {rates: {requests: -1/s}}", "root.rates.requests"},
		{"root: {rates: {requests: abc}}", "root.rates.requests"},
		{"root: {rates: {requests: 1/fortnight}}", "root.rates.requests"},
		{"root: {rates: {requests: 99999999999999999999/s}}", "root.rates.requests"},
		{"root: {rates: {requests: 9007199254740993/s}}", "root.rates.requests"},
		{"root: {rates: {requests: 9223372036854775807/s}}", "root.rates.requests"},
		{"root: {rates: {requests: 1/0s}}", "root.rates.requests"},
		{"root: {rates: {requests: 1/-1s}}", "root.rates.requests"},
		{"root: {rates: {requests: 1/2562048h}}", "root.rates.requests"},
		{"root: {rates: {requests: 100}}", "root.rates.requests"},
		{"root: {rates: {requests: [1, s]}}", "root.rates.requests"},
		{"root: {rates: {requests: {burst: 5}}}", "root.rates.requests.rate"},
		{"root: {rates: {requests: {rate: 1/s, brust: 5}}}", "root.rates.requests.brust"},
		{"root: {rates: {requests: {rate: 1/s, burst: 0}}}", "root.rates.requests.burst"},
		{"root: {rates: {requests: {rate: 1/s, burst: -1}}}", "root.rates.requests.burst"},
		{"root: {rates: {requests: {rate: 1/s, burst: 9223372036854775807}}}", "root.rates.requests.burst"},
		{"root: {rates: {requests: {rate: 1/s, burst: many}}}", "root.rates.requests.burst"},
		{"tenants: [{name: a, rates: {calls: 2/fortnight}}]", "tenants[0].rates.calls"},
		{"tenants: [{name: a, defaults: {rates: {calls: 0/min}}}]", "tenants[0].defaults.rates.calls"},
	} {
		_, err := serverconfig.ParseConfig([]byte(c.yaml))
		if !serverconfig.IsConfigError(err) || !strings.Contains(err.Error(), c.key+":") {
			t.Errorf("%s: %v, want a config error naming %s", c.yaml, err, c.key)
		}
	}
}

// rateRefusal asserts err is RESOURCE_EXHAUSTED for rate, with a
// RateLimited and a RetryInfo of the same wait, and returns the wait.
func rateRefusal(t *testing.T, err error) (*governorpb.RateLimited, time.Duration) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted {
		t.Fatalf("got %v, want RESOURCE_EXHAUSTED for rate", err)
	}
	var rl *governorpb.RateLimited
	var ri *errdetails.RetryInfo
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *governorpb.RateLimited:
			rl = d
		case *errdetails.RetryInfo:
			ri = d
		case *governorpb.Denial:
			t.Fatalf("a refusal for rate carries a quota Denial: %v", d)
		}
	}
	if rl == nil || ri == nil || rl.GetRetryAfter().AsDuration() != ri.GetRetryDelay().AsDuration() {
		t.Fatalf("details %v, want a RateLimited and a RetryInfo of the same wait", st.Details())
	}
	return rl, ri.GetRetryDelay().AsDuration()
}

// Rates through the API: the config's rate on a tenant refuses a charge
// past its bucket as a retryable RESOURCE_EXHAUSTED carrying the wait,
// GetCapStatus tells each bucket's fill, SetCaps and CreateNode set rates
// and refuse hostile ones, and a charge larger than a bucket is invalid.
func TestRatesThroughTheAPI(t *testing.T) {
	cfg := testConfig()
	cfg.Tenants[0].Rates = map[string]engine.Rate{"calls": {Units: 2, Per: int64(time.Minute)}}
	cfg.Tenants[0].Defaults.Rates = map[string]engine.Rate{"calls": {Units: 100, Per: int64(time.Second), Burst: 3}}
	srv := start(t, cfg)
	pay := session(t, srv.Addr(), "pay-key", 0)
	task := pay.task(t, "job", nil)
	if r := task.GetRates()["calls"]; r.GetUnits() != 100 || r.GetBurst() != 3 || r.GetPer().AsDuration() != time.Second {
		t.Fatalf("the task's default rate: %v", task.GetRates())
	}
	consume := func(id, n int64) error {
		_, err := pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: id, Resource: "calls", Amount: n})
		return err
	}
	if err := consume(task.Id, 2); err != nil {
		t.Fatal(err)
	}
	rl, wait := rateRefusal(t, consume(task.Id, 1))
	if rl.GetNodeId() != pay.scope || rl.GetResource() != "calls" || rl.GetLevel() != 0 || rl.GetAmount() != 1 ||
		wait <= 29*time.Second || wait > 30*time.Second {
		t.Fatalf("refusal %v after %v; want the tenant's bucket, empty, a unit in about 30s", rl, wait)
	}
	rep, err := pay.GetCapStatus(pay.ctx, &governorpb.GetCapStatusRequest{NodeId: task.Id})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.GetRates()) != 2 || rep.Rates[0].GetNodeId() != task.Id || rep.Rates[0].GetLevel() != 1 ||
		rep.Rates[1].GetNodeId() != pay.scope || rep.Rates[1].GetLevel() != 0 || rep.Rates[1].GetSize() != 2 ||
		rep.Rates[1].GetFullIn().AsDuration() <= 59*time.Second {
		t.Fatalf("rates in the cap status: %v", rep.GetRates())
	}
	// Larger than the task's bucket: never fits.
	wantCode(t, "a charge larger than the burst", consume(task.Id, 4), codes.InvalidArgument)

	sec := durationpb.New(time.Second)
	for _, bad := range []*governorpb.Rate{nil, {Units: 0, Per: sec}, {Units: -2, Per: sec}, {Units: governorpb.MaxAmount + 1, Per: sec},
		{Units: math.MaxInt64, Per: sec}, {Units: 1}, {Units: 1, Per: durationpb.New(0)}, {Units: 1, Per: durationpb.New(-time.Second)},
		{Units: 1, Per: durationpb.New(25 * time.Hour)}, {Units: 1, Per: &durationpb.Duration{Seconds: 315576000000}},
		{Units: 1, Per: &durationpb.Duration{Seconds: 315576000001}}, {Units: 1, Per: sec, Burst: -1},
		{Units: 1, Per: sec, Burst: math.MaxInt64}, {Units: -1, Per: sec}} {
		_, err := pay.SetCaps(pay.ctx, &governorpb.SetCapsRequest{NodeId: task.Id, Rates: map[string]*governorpb.Rate{"calls": bad}})
		wantCode(t, "rate "+bad.String(), err, codes.InvalidArgument)
		_, err = pay.CreateNode(pay.ctx, &governorpb.CreateNodeRequest{ParentId: pay.scope,
			Spec: &governorpb.NodeSpec{Name: "bad", DefaultRates: map[string]*governorpb.Rate{"calls": bad}}})
		wantCode(t, "default rate "+bad.String(), err, codes.InvalidArgument)
	}
	// The largest rate the edge takes, then its removal.
	n, err := pay.SetCaps(pay.ctx, &governorpb.SetCapsRequest{NodeId: task.Id, Rates: map[string]*governorpb.Rate{
		"tokens": {Units: governorpb.MaxAmount, Per: durationpb.New(time.Millisecond), Burst: governorpb.MaxAmount}}})
	if err != nil || n.GetRates()["tokens"].GetUnits() != governorpb.MaxAmount {
		t.Fatalf("the largest rate: %v %v", n.GetRates(), err)
	}
	n, err = pay.SetCaps(pay.ctx, &governorpb.SetCapsRequest{NodeId: task.Id, Rates: map[string]*governorpb.Rate{"tokens": {Units: -1}}})
	if err != nil || n.GetRates()["tokens"] != nil {
		t.Fatalf("a rate removed: %v %v", n.GetRates(), err)
	}
}

// A bucket is state: after a restart of governord on the same SQLite
// store it is as empty as it was, not refilled.
func TestRatesSurviveARestart(t *testing.T) {
	cfg := testConfig()
	cfg.Tenants[0].Rates = map[string]engine.Rate{"calls": {Units: 3, Per: int64(time.Hour)}}
	cfg.Store = serverconfig.StoreConfig{Driver: "sqlite", DSN: filepath.Join(t.TempDir(), "governor.db")}
	srv, err := Start(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	pay := session(t, srv.Addr(), "pay-key", 0)
	task := pay.task(t, "job", nil)
	if _, err := pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: task.Id, Resource: "calls", Amount: 3}); err != nil {
		t.Fatal(err)
	}
	srv.Close()
	srv = start(t, cfg)
	pay = session(t, srv.Addr(), "pay-key", 0)
	_, err = pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: task.Id, Resource: "calls", Amount: 1})
	if _, wait := rateRefusal(t, err); wait <= 19*time.Minute {
		t.Fatalf("after a restart the bucket refills in %v; want about 20m", wait)
	}
}

// What /metrics says of rates is what the buckets hold: the root's and
// each tenant's rates with their units left, burst and refill a second,
// and each refusal for rate counted for the caller's tenant and resource
// (what the alert GovernorRateSaturated reads).
func TestRateMetricsTellTheTruth(t *testing.T) {
	cfg := testConfig()
	cfg.Root.Rates = map[string]engine.Rate{"requests": {Units: 600, Per: int64(time.Minute), Burst: 50}}
	cfg.Tenants[0].Rates = map[string]engine.Rate{"calls": {Units: 3, Per: int64(time.Hour)}}
	srv := start(t, cfg)
	pay := session(t, srv.Addr(), "pay-key", 0)
	task := pay.task(t, "job", nil)
	consume := func(resource string, n int64) error {
		_, err := pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: task.Id, Resource: resource, Amount: n})
		return err
	}
	if err := consume("calls", 2); err != nil {
		t.Fatal(err)
	}
	if err := consume("requests", 20); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		rateRefusal(t, consume("calls", 2))
	}
	text := scrape(t, srv)
	for _, want := range []string{
		`governor_rate_available{resource="calls",tenant="payments"} 1`,
		`governor_rate_burst{resource="calls",tenant="payments"} 3`,
		`governor_rate_burst{resource="requests",tenant=""} 50`,
		`governor_rate_per_second{resource="requests",tenant=""} 10`,
		`governor_rate_refusals_total{resource="calls",tenant="payments"} 3`,
	} {
		if !strings.Contains(text, want+"\n") {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	// The root's bucket refills at 10 a second from 30 left: read it
	// whole, as the scrape saw it.
	var left float64
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, `governor_rate_available{resource="requests",tenant=""} `); ok {
			left, _ = strconv.ParseFloat(v, 64)
		}
	}
	if left < 30 || left > 50 {
		t.Errorf("the root's requests bucket reads %v, want 30 left plus what refilled since, at most its burst of 50", left)
	}
	if strings.Contains(text, `governor_rate_refusals_total{resource="requests"`) {
		t.Error("a refusal counted for a resource that refused nothing")
	}
}
