package server

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor/engine"
	"github.com/governor-project/governor/server/serverconfig"
)

// The mapping form of a cap in governord's YAML: a plain number stays a
// hard cap, {cap, mode, burst} sets how it is enforced, and every mistake
// names its key.
func TestConfigCapModes(t *testing.T) {
	cfg, err := serverconfig.ParseConfig([]byte(`
near_thresholds: [75, 95]
root:
  quotas:
    tokens: {cap: 1000, mode: soft, burst: 100}
  limits: {db: 4}
tenants:
  - name: payments
    api_key: payments-key-long-enough-0123456789
    quotas:
      calls: {cap: 10, mode: warn_only}
      retry: 3
    limits:
      db: {cap: 2, mode: soft, burst: 1}
`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Root.Quotas["tokens"] != 1000 || cfg.Root.QuotaModes["tokens"] != (engine.CapMode{Mode: engine.ModeSoft, Burst: 100}) {
		t.Fatalf("root: %v %v", cfg.Root.Quotas, cfg.Root.QuotaModes)
	}
	p := cfg.Tenants[0]
	if p.Quotas["calls"] != 10 || p.Quotas["retry"] != 3 || p.QuotaModes["calls"] != (engine.CapMode{Mode: engine.ModeWarnOnly}) ||
		len(p.QuotaModes) != 1 || p.LimitModes["db"] != (engine.CapMode{Mode: engine.ModeSoft, Burst: 1}) {
		t.Fatalf("tenant: %+v", p)
	}
	if len(cfg.Near) != 2 || cfg.Near[0] != 75 {
		t.Fatalf("near_thresholds %v", cfg.Near)
	}

	for _, c := range []struct{ yaml, key string }{
		{"root: {quotas: {tokens: {cap: 5, mode: lenient}}}", "root.quotas.tokens.mode"},
		{"root: {quotas: {tokens: {cap: 5, mode: hard, burst: 2}}}", "root.quotas.tokens.burst"},
		{"root: {quotas: {tokens: {mode: soft}}}", "root.quotas.tokens.cap"},
		{"root: {quotas: {tokens: {cap: 5, brust: 2}}}", "root.quotas.tokens.brust"},
		{"root: {limits: {db: -3}}", "root.limits.db"},
		{"root: {limits: {db: many}}", "root.limits.db"},
		{"tenants: [{name: a, defaults: {quotas: {retry: {cap: 3, mode: soft}}}}]", "tenants[0].defaults.quotas.retry"},
		{"near_thresholds: [90, 80]", "near_thresholds[1]"},
		{"near_thresholds: [0]", "near_thresholds[0]"},
	} {
		_, err := serverconfig.ParseConfig([]byte(c.yaml))
		if !serverconfig.IsConfigError(err) || !strings.Contains(err.Error(), c.key+":") {
			t.Errorf("%s: %v, want a config error naming %s", c.yaml, err, c.key)
		}
	}
}

// Modes through the API: the config's modes reach the engine, SetCaps
// changes them (audited), a soft cap admits up to cap plus burst and then
// denies, GetCapStatus reports each cap's state, and the metrics show the
// tenant's state and count the warnings.
func TestCapModesThroughTheAPI(t *testing.T) {
	cfg := testConfig()
	cfg.Tenants[0].Quotas = map[string]int64{"tokens": 100}
	cfg.Tenants[0].QuotaModes = map[string]engine.CapMode{"tokens": {Mode: engine.ModeSoft, Burst: 10}}
	srv := start(t, cfg)
	pay := session(t, srv.Addr(), "pay-key", 0)
	admin := session(t, srv.Addr(), "admin-key", 0)
	tenant, err := admin.GetNode(admin.ctx, &governorpb.GetNodeRequest{NodeId: pay.scope})
	if err != nil {
		t.Fatal(err)
	}
	if m := tenant.GetQuotaModes()["tokens"]; m.GetMode() != "soft" || m.GetBurst() != 10 {
		t.Fatalf("the tenant's tokens mode is %v, want soft with a burst of 10", m)
	}
	task := pay.task(t, "job", nil)
	consume := func(n int64) error {
		_, err := pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: task.Id, Resource: "tokens", Amount: n})
		return err
	}
	if err := consume(85); err != nil {
		t.Fatal(err)
	}
	rep, err := pay.GetCapStatus(pay.ctx, &governorpb.GetCapStatusRequest{NodeId: task.Id})
	if err != nil {
		t.Fatal(err)
	}
	var tok *governorpb.CapStatus
	for _, c := range rep.GetCaps() {
		if c.GetName() == "tokens" && c.GetNodeId() == pay.scope {
			tok = c
		}
	}
	if tok == nil || tok.GetState() != "near" || tok.GetThreshold() != 80 || tok.GetRemaining() != 15 || tok.GetUsed() != 85 {
		t.Fatalf("status of tokens at 85 of 100: %v", tok)
	}
	if err := consume(20); err != nil { // 105: past the cap, within the burst
		t.Fatal(err)
	}
	if err := consume(5); err != nil { // 110: exactly cap plus burst
		t.Fatal(err)
	}
	_, d := denialOf(t, "past cap plus burst", consume(1))
	if d.GetLimit() != 110 || d.GetUsed() != 110 {
		t.Fatalf("denial %v, want used 110 of 110 (cap plus burst)", d)
	}
	rep, err = pay.GetCapStatus(pay.ctx, &governorpb.GetCapStatusRequest{NodeId: task.Id})
	if err != nil || rep.GetState() != "hard_exceeded" {
		t.Fatalf("status after the burst: %v, %v", rep, err)
	}
	body := scrape(t, srv)
	for _, want := range []string{`governor_overage_state{state="hard_exceeded",tenant="payments"} 1`,
		`governor_overage_state{state="within",tenant="payments"} 0`,
		`governor_cap_warnings_total{kind="quota",mode="soft"} 2`} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	// The admin makes it warn_only: never refused, and audited.
	if _, err := admin.SetCaps(admin.ctx, &governorpb.SetCapsRequest{NodeId: pay.scope, Reason: "roll out",
		QuotaModes: map[string]*governorpb.CapMode{"tokens": {Mode: "warn_only"}}}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := consume(50); err != nil {
			t.Fatalf("a warn_only cap refused: %v", err)
		}
	}
	hist, err := admin.GetCapsHistory(admin.ctx, &governorpb.GetCapsHistoryRequest{NodeId: pay.scope})
	if err != nil {
		t.Fatal(err)
	}
	last := hist.GetChanges()[len(hist.GetChanges())-1]
	if last.GetOld().GetQuotaModes()["tokens"].GetMode() != "soft" || last.GetNew().GetQuotaModes()["tokens"].GetMode() != "warn_only" {
		t.Fatalf("the audit trail's last change %v, want tokens soft -> warn_only", last)
	}
	// A mode without a cap, and an unknown mode, are refused.
	_, err = admin.SetCaps(admin.ctx, &governorpb.SetCapsRequest{NodeId: pay.scope, QuotaModes: map[string]*governorpb.CapMode{"nothing": {Mode: "soft"}}})
	wantCode(t, "a mode without a cap", err, codes.InvalidArgument)
	_, err = admin.SetCaps(admin.ctx, &governorpb.SetCapsRequest{NodeId: pay.scope, QuotaModes: map[string]*governorpb.CapMode{"tokens": {Mode: "lenient"}}})
	wantCode(t, "an unknown mode", err, codes.InvalidArgument)
}

// Modes survive a restart: one set by SetCaps on a task is replayed from
// the store; a configured one is put back by the configuration (the source
// of truth for tenants' caps).
func TestCapModesSurviveARestart(t *testing.T) {
	cfg, _, srv := startSQLite(t)
	recon := session(t, srv.Addr(), "recon-key", 0)
	task := recon.task(t, "batch", nil)
	if _, err := recon.SetCaps(recon.ctx, &governorpb.SetCapsRequest{NodeId: task.Id, Reason: "incident",
		Quotas: map[string]int64{"calls": 5}, QuotaModes: map[string]*governorpb.CapMode{"calls": {Mode: "soft", Burst: 2}}}); err != nil {
		t.Fatal(err)
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	cfg.Tenants[0].Quotas = map[string]int64{"tokens": 10}
	cfg.Tenants[0].QuotaModes = map[string]engine.CapMode{"tokens": {Mode: engine.ModeWarnOnly}}
	srv2, err := Start(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv2.Close() })
	admin := session(t, srv2.Addr(), "admin-key", 0)
	for path, want := range map[string]string{"reconciliation/batch": "calls=soft/2", "payments": "tokens=warn_only/0"} {
		n, err := admin.GetNode(admin.ctx, &governorpb.GetNodeRequest{Path: path})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for k, m := range n.GetQuotaModes() {
			got = append(got, k+"="+m.GetMode()+"/"+strconv.FormatInt(m.GetBurst(), 10))
		}
		if strings.Join(got, ",") != want {
			t.Errorf("%s after a restart: modes %v, want %s", path, got, want)
		}
	}
}

func scrape(t *testing.T, srv *Server) string {
	t.Helper()
	r, err := http.Get("http://" + srv.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Tenant states through the API: only the admin key sets them; a refused
// call is FAILED_PRECONDITION with a TenantRefusal detail; running leases
// stay unless revoked; the audit trail has who and why; and the state
// survives a restart on the same store.
func TestTenantStatesThroughTheAPI(t *testing.T) {
	cfg, _, srv := startSQLite(t)
	pay := session(t, srv.Addr(), "pay-key", 0)
	admin := session(t, srv.Addr(), "admin-key", 0)
	task := pay.task(t, "job", nil)
	lease, err := pay.Acquire(pay.ctx, &governorpb.AcquireRequest{NodeId: task.Id, Class: "db"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = pay.SetTenantState(pay.ctx, &governorpb.SetTenantStateRequest{NodeId: pay.scope, State: "suspended", Reason: "self"})
	wantCode(t, "a tenant suspending itself", err, codes.PermissionDenied)
	_, err = admin.SetTenantState(admin.ctx, &governorpb.SetTenantStateRequest{NodeId: pay.scope, State: "frozen"})
	wantCode(t, "an unknown state", err, codes.InvalidArgument)
	n, err := admin.SetTenantState(admin.ctx, &governorpb.SetTenantStateRequest{NodeId: pay.scope, State: "suspended", Reason: "incident 12"})
	if err != nil || n.GetTenantState() != "suspended" || n.GetTenantStateReason() != "incident 12" {
		t.Fatalf("suspend: %v %v", n, err)
	}
	_, err = pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: task.Id, Resource: "tokens", Amount: 1})
	wantCode(t, "a consume while suspended", err, codes.FailedPrecondition)
	var refusal *governorpb.TenantRefusal
	for _, d := range status.Convert(err).Details() {
		if r, ok := d.(*governorpb.TenantRefusal); ok {
			refusal = r
		}
	}
	if refusal.GetTenant() != "payments" || refusal.GetState() != "suspended" || refusal.GetReason() != "incident 12" || refusal.GetRefused() != "new work" {
		t.Fatalf("refusal detail %v", refusal)
	}
	if _, err := pay.Validate(pay.ctx, &governorpb.ValidateRequest{LeaseId: lease.Id}); err != nil {
		t.Fatalf("the running lease after a suspension: %v", err)
	}
	// read_only: a read goes on, a write is refused.
	if _, err := admin.SetTenantState(admin.ctx, &governorpb.SetTenantStateRequest{NodeId: pay.scope, State: "read_only", Reason: "migration"}); err != nil {
		t.Fatal(err)
	}
	if _, err := pay.ChargeAndAcquire(pay.ctx, &governorpb.ChargeAndAcquireRequest{NodeId: task.Id, Charges: map[string]int64{"tokens": 1}}); err != nil {
		t.Fatalf("a read while read_only: %v", err)
	}
	_, err = pay.ChargeAndAcquire(pay.ctx, &governorpb.ChargeAndAcquireRequest{NodeId: task.Id, Charges: map[string]int64{"tokens": 1}, Write: true})
	wantCode(t, "a write while read_only", err, codes.FailedPrecondition)
	// Delegated budgets still grow for reads, and their answers carry the
	// refusal a write gets, for the holder to refuse writes from them.
	b, err := pay.ResizeBlock(pay.ctx, &governorpb.ResizeBlockRequest{NodeId: task.Id, Class: "db", Want: 1})
	if ro := b.GetReadOnly(); err != nil || ro.GetTenant() != "payments" || ro.GetState() != "read_only" || ro.GetReason() != "migration" || ro.GetRefused() != "a write" {
		t.Fatalf("a block's growth while read_only: %v %v", b, err)
	}
	res, err := pay.Reserve(pay.ctx, &governorpb.ReserveRequest{NodeId: task.Id, Resource: "tokens", Want: 2})
	if err != nil || res.GetGranted() == 0 || res.GetReadOnly().GetRefused() != "a write" {
		t.Fatalf("a reservation while read_only: %v %v", res, err)
	}
	hist, err := admin.GetCapsHistory(admin.ctx, &governorpb.GetCapsHistoryRequest{NodeId: pay.scope})
	if err != nil {
		t.Fatal(err)
	}
	last := hist.GetChanges()[len(hist.GetChanges())-1]
	if last.GetWho() != "admin" || last.GetOldState() != "suspended" || last.GetNewState() != "read_only" || last.GetReason() != "migration" {
		t.Fatalf("the audit trail's last entry %v", last)
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	srv2, err := Start(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv2.Close() })
	admin = session(t, srv2.Addr(), "admin-key", 0)
	n, err = admin.GetNode(admin.ctx, &governorpb.GetNodeRequest{Path: "payments"})
	if err != nil || n.GetTenantState() != "read_only" || n.GetTenantStateReason() != "migration" {
		t.Fatalf("after a restart: %v %v", n, err)
	}
	if _, err := admin.SetTenantState(admin.ctx, &governorpb.SetTenantStateRequest{NodeId: n.GetId(), State: "active"}); err != nil {
		t.Fatal(err)
	}
	pay = session(t, srv2.Addr(), "pay-key", 0)
	if res, err := pay.Reserve(pay.ctx, &governorpb.ReserveRequest{NodeId: task.Id, Resource: "tokens", Want: 1}); err != nil || res.GetReadOnly() != nil {
		t.Fatalf("a reservation after resuming: %v %v", res, err)
	}
}

// Reserved minimums in governord's YAML: a number or {min, valid_from,
// valid_until}; their sum per class is checked against root.limits at
// load; they reach the tenants, and a restart that lowers one and raises
// another in the same pool is applied in an order that never passes it.
func TestConfigMinimums(t *testing.T) {
	cfg, err := serverconfig.ParseConfig([]byte(`
root: {limits: {db: 4}}
tenants:
  - {name: payments, api_key: payments-key-long-enough-0123456789, minimums: {db: 3}}
  - name: reconciliation
    api_key: recon-key-long-enough-0123456789
    minimums: {db: {min: 1, valid_from: "2026-12-01T00:00:00Z", valid_until: "2026-12-02T00:00:00Z"}}
`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Tenants[0].Minimums["db"].Min != 3 || cfg.Tenants[1].Minimums["db"].From == 0 || cfg.Tenants[1].Minimums["db"].Until == 0 {
		t.Fatalf("minimums: %+v %+v", cfg.Tenants[0].Minimums, cfg.Tenants[1].Minimums)
	}
	for _, c := range []struct{ yaml, key string }{
		{"root: {limits: {db: 4}}\ntenants: [{name: a, minimums: {db: 3}}, {name: b, minimums: {db: 2}}]", "tenants[1].minimums.db"},
		{"tenants: [{name: a, minimums: {db: {min: 1, valid_from: tomorrow}}}]", "tenants[0].minimums.db.valid_from"},
		{"tenants: [{name: a, minimums: {db: {min: 1, valid_from: \"2026-12-02T00:00:00Z\", valid_until: \"2026-12-01T00:00:00Z\"}}}]", "tenants[0].minimums.db.valid_until"},
		{"tenants: [{name: a, minimums: {db: {minimum: 1}}}]", "tenants[0].minimums.db.minimum"},
	} {
		if _, err := serverconfig.ParseConfig([]byte(c.yaml)); !serverconfig.IsConfigError(err) || !strings.Contains(err.Error(), c.key+":") {
			t.Errorf("%s: %v, want a config error naming %s", c.yaml, err, c.key)
		}
	}

	base := testConfig()
	base.Root.Limits = map[string]int64{"db": 4}
	base.Tenants[0].Minimums = map[string]engine.Minimum{"db": {Min: 3}}
	base.Tenants[1].Limits = nil
	base.Tenants[1].Minimums = map[string]engine.Minimum{"db": {Min: 1}}
	base.Store = serverconfig.StoreConfig{Driver: "sqlite", DSN: t.TempDir() + "/governor.db"}
	srv, err := Start(context.Background(), base, nil)
	if err != nil {
		t.Fatal(err)
	}
	admin := session(t, srv.Addr(), "admin-key", 0)
	pay, err := admin.GetNode(admin.ctx, &governorpb.GetNodeRequest{Path: "payments"})
	if err != nil || pay.GetMinimums()["db"].GetMin() != 3 {
		t.Fatalf("payments' minimums: %v %v", pay.GetMinimums(), err)
	}
	_, err = admin.SetCaps(admin.ctx, &governorpb.SetCapsRequest{NodeId: pay.Id, Minimums: map[string]*governorpb.Minimum{"db": {Min: 4}}})
	wantCode(t, "a minimum over the pool", err, codes.InvalidArgument)
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	// Swap them: payments 3 -> 1, reconciliation 1 -> 3, in one restart.
	base.Tenants[0].Minimums = map[string]engine.Minimum{"db": {Min: 1}}
	base.Tenants[1].Minimums = map[string]engine.Minimum{"db": {Min: 3}}
	srv, err = Start(context.Background(), base, nil)
	if err != nil {
		t.Fatalf("a restart that swaps the minimums: %v", err)
	}
	defer srv.Close()
	admin = session(t, srv.Addr(), "admin-key", 0)
	recon, err := admin.GetNode(admin.ctx, &governorpb.GetNodeRequest{Path: "reconciliation"})
	if err != nil || recon.GetMinimums()["db"].GetMin() != 3 {
		t.Fatalf("reconciliation's minimums after the restart: %v %v", recon.GetMinimums(), err)
	}
}
