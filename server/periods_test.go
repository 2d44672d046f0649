package server

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/governor/engine"
	"github.com/governor-project/governor/server/serverconfig"
)

// Periods in governord's YAML: {cap, period} on quotas of the root,
// tenants and defaults, time_zone at the top; a bare number stays a
// quota that never resets; every mistake names its key.
func TestConfigPeriods(t *testing.T) {
	cfg, err := serverconfig.ParseConfig([]byte(`
time_zone: America/New_York
root:
  quotas: {tokens: {cap: 50000, period: month}, retry: 3}
tenants:
  - name: payments
    api_key: payments-key-long-enough-0123456789
    quotas:
      calls: {cap: 10, period: 10s, mode: soft, burst: 2}
    defaults:
      quotas: {calls: {cap: 5, period: day}}
`))
	if err != nil {
		t.Fatal(err)
	}
	p := cfg.Tenants[0]
	if cfg.Location.String() != "America/New_York" || cfg.Root.QuotaPeriods["tokens"] != (engine.Period{Unit: "month"}) ||
		len(cfg.Root.QuotaPeriods) != 1 || cfg.Root.Quotas["retry"] != 3 || cfg.Root.Quotas["tokens"] != 50000 ||
		p.QuotaPeriods["calls"] != (engine.Period{Every: int64(10 * time.Second)}) || p.Defaults.QuotaPeriods["calls"] != (engine.Period{Unit: "day"}) {
		t.Fatalf("parsed: %+v %+v %+v", cfg.Location, cfg.Root, p)
	}
	for _, c := range []struct{ yaml, key string }{
		{"root: {quotas: {t: {cap: 1, period: fortnight}}}", "root.quotas.t.period"},
		{"root: {quotas: {t: {cap: 1, period: 0s}}}", "root.quotas.t.period"},
		{"root: {quotas: {t: {cap: 1, period: -1s}}}", "root.quotas.t.period"},
		{"root: {quotas: {t: {cap: 1, period: 500ms}}}", "root.quotas.t.period"},
		{"root: {quotas: {t: {cap: 1, period: 9223372036854775807ns}}}", "root.quotas.t.period"},
		{"root: {quotas: {t: {cap: 1, period: 8809h}}}", "root.quotas.t.period"},
		{"root: {quotas: {t: {cap: 1, period: none}}}", "root.quotas.t.period"},
		{"root: {quotas: {t: {cap: 1, period: 10}}}", "root.quotas.t.period"},
		{"root: {quotas: {t: {cap: 1, period: [day]}}}", "root.quotas.t.period"},
		{"root: {quotas: {t: {period: day}}}", "root.quotas.t.cap"},
		{"root: {quotas: {t: {cap: 1, perod: day}}}", "root.quotas.t.perod"},
		{"root: {limits: {db: {cap: 1, period: day}}}", "root.limits.db.period"},
		{"tenants: [{name: a, quotas: {t: {cap: 1, period: year}}}]", "tenants[0].quotas.t.period"},
		{"tenants: [{name: a, defaults: {quotas: {t: {cap: 1, period: 1ns}}}}]", "tenants[0].defaults.quotas.t.period"},
		{"time_zone: Mars/Olympus_Mons", "time_zone"},
		{"time_zone: Local", "time_zone"},
	} {
		_, err := serverconfig.ParseConfig([]byte(c.yaml))
		if !serverconfig.IsConfigError(err) || !strings.Contains(err.Error(), c.key+":") {
			t.Errorf("%s: %v, want a config error naming %s", c.yaml, err, c.key)
		}
	}
}

// setClock is an engine clock a test moves by hand.
type setClock struct{ ns atomic.Int64 }

func (c *setClock) Now() time.Time { return time.Unix(0, c.ns.Load()) }

// Periods through the API on governord's clock: the config's 10s quota
// refuses past its cap with a denial carrying reset_at, GetCapStatus
// tells the period and the reset, the boundary admits again with a reset
// in the log first, SetCaps and CreateNode set periods and refuse bad
// ones, and the SDK's Denial carries ResetAt.
func TestPeriodsThroughTheAPI(t *testing.T) {
	clock := &setClock{}
	start0 := time.Date(2026, 1, 1, 0, 0, 8, 0, time.UTC) // a session's TTL is 5s
	clock.ns.Store(start0.UnixNano())
	cfg := testConfig()
	cfg.Clock = clock
	cfg.Tenants[0].Quotas = map[string]int64{"calls": 10}
	cfg.Tenants[0].QuotaPeriods = map[string]engine.Period{"calls": {Every: int64(10 * time.Second)}}
	srv := start(t, cfg)
	pay := session(t, srv.Addr(), "pay-key", 0)
	task := pay.task(t, "job", nil)
	consume := func(n int64) error {
		_, err := pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: task.Id, Resource: "calls", Amount: n})
		return err
	}
	if err := consume(10); err != nil {
		t.Fatal(err)
	}
	boundary := start0.Add(2 * time.Second)
	err := consume(1)
	sdkErr := governor.RawError("consume", err)
	var d *governor.Denial
	if !errors.As(sdkErr, &d) || !d.ResetAt.Equal(boundary) || d.Used != 10 {
		t.Fatalf("refusal %v (%v); want a denial of 10 used resetting at %v", err, sdkErr, boundary)
	}
	rep, err := pay.GetCapStatus(pay.ctx, &governorpb.GetCapStatusRequest{NodeId: task.Id})
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, c := range rep.GetCaps() {
		if c.GetName() == "calls" && c.GetNodeId() == pay.scope {
			found = c.GetPeriod() == "10s" && c.GetResetAt().AsTime().Equal(boundary) && c.GetUsed() == 10
		}
	}
	if !found {
		t.Fatalf("cap status: %v", rep.GetCaps())
	}
	clock.ns.Store(boundary.UnixNano())
	if err := consume(4); err != nil {
		t.Fatalf("at the boundary: %v", err)
	}
	// Bad periods are INVALID_ARGUMENT naming the field; a period without
	// its quota too.
	for _, bad := range []string{"", "fortnight", "0s", "-1s", "500ms", "9223372036854775807ns", "8809h", "10"} {
		_, err := pay.SetCaps(pay.ctx, &governorpb.SetCapsRequest{NodeId: task.Id, Quotas: map[string]int64{"x": 1},
			QuotaPeriods: map[string]string{"x": bad}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "quota_periods[x]") {
			t.Errorf("period %q: %v", bad, err)
		}
		_, err = pay.CreateNode(pay.ctx, &governorpb.CreateNodeRequest{ParentId: pay.scope,
			Spec: &governorpb.NodeSpec{Name: "bad", DefaultQuotas: map[string]int64{"x": 1}, DefaultQuotaPeriods: map[string]string{"x": bad}}})
		wantCode(t, "default period "+bad, err, codes.InvalidArgument)
	}
	_, err = pay.SetCaps(pay.ctx, &governorpb.SetCapsRequest{NodeId: task.Id, QuotaPeriods: map[string]string{"nothing": "day"}})
	wantCode(t, "a period without its quota", err, codes.InvalidArgument)
	n, err := pay.SetCaps(pay.ctx, &governorpb.SetCapsRequest{NodeId: task.Id, Quotas: map[string]int64{"x": 1},
		QuotaPeriods: map[string]string{"x": "week"}})
	if err != nil || n.GetQuotaPeriods()["x"] != "week" {
		t.Fatalf("a weekly period: %v %v", n.GetQuotaPeriods(), err)
	}
	n, err = pay.SetCaps(pay.ctx, &governorpb.SetCapsRequest{NodeId: task.Id, QuotaPeriods: map[string]string{"x": "none"}})
	if err != nil || n.GetQuotaPeriods()["x"] != "" {
		t.Fatalf("a period removed: %v %v", n.GetQuotaPeriods(), err)
	}
}

// A window is state: after a restart on the same SQLite store the quota
// is still spent until its boundary, and resets at it, not a period
// after the restart.
func TestPeriodsSurviveARestart(t *testing.T) {
	clock := &setClock{}
	start0 := time.Date(2026, 1, 1, 0, 0, 8, 0, time.UTC) // a session's TTL is 5s
	clock.ns.Store(start0.UnixNano())
	cfg := testConfig()
	cfg.Clock = clock
	cfg.Tenants[0].Quotas = map[string]int64{"calls": 10}
	cfg.Tenants[0].QuotaPeriods = map[string]engine.Period{"calls": {Every: int64(10 * time.Second)}}
	cfg.Store = serverconfig.StoreConfig{Driver: "sqlite", DSN: filepath.Join(t.TempDir(), "governor.db")}
	srv, err := Start(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	pay := session(t, srv.Addr(), "pay-key", 0)
	task := pay.task(t, "job", nil)
	if _, err := pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: task.Id, Resource: "calls", Amount: 10}); err != nil {
		t.Fatal(err)
	}
	srv.Close()
	clock.ns.Add(int64(time.Second)) // restarted a second before the boundary
	srv = start(t, cfg)
	pay = session(t, srv.Addr(), "pay-key", 0)
	_, err = pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: task.Id, Resource: "calls", Amount: 1})
	wantCode(t, "a second before the boundary, after a restart", err, codes.ResourceExhausted)
	clock.ns.Add(int64(time.Second))
	if _, err := pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: task.Id, Resource: "calls", Amount: 10}); err != nil {
		t.Fatalf("at the boundary after a restart: %v", err)
	}
}
