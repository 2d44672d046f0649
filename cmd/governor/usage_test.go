package main

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/server"
	"github.com/governor-project/governor/server/serverconfig"
)

type usageDoc struct {
	Lines []usageRow
}

// governor usage reports what a tenant's task spent, held and was refused,
// from records that outlive the events (snapshots every few events delete
// them) and a restart; a tenant's key sees its own tenant only.
func TestUsageReport(t *testing.T) {
	dbPath := filepath.Join(t.TempDir(), "governor.db")
	start := func() *server.Server {
		cfg := govtest.Config()
		cfg.Store = serverconfig.StoreConfig{Driver: "sqlite", DSN: dbPath, SnapshotEvery: 3}
		cfg.Tenants = append(cfg.Tenants, serverconfig.TenantConfig{Name: "other", APIKey: "other-key-for-tests", Weight: 1})
		srv := govtest.StartConfig(t, cfg)
		t.Setenv("GOVERNOR_ADDR", srv.Addr())
		return srv
	}
	srv := start()
	ctx := context.Background()
	began := time.Now()
	tenant, err := governor.Dial(ctx, governor.WithAddr(srv.Addr()), governor.WithAPIKey(govtest.TenantKey))
	if err != nil {
		t.Fatal(err)
	}
	rpc := tenant.Raw()
	task, err := rpc.CreateNode(ctx, &governorpb.CreateNodeRequest{ParentId: tenant.ScopeID(),
		Spec: &governorpb.NodeSpec{Name: "crawl", Quotas: map[string]int64{"tokens": 1000}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, amount := range []int64{300, 400, 500} { // the last is refused
		_, err := rpc.Consume(ctx, &governorpb.ConsumeRequest{NodeId: task.GetId(), Resource: "tokens", Amount: amount})
		if (err != nil) != (amount == 500) {
			t.Fatalf("consume %d: %v", amount, err)
		}
	}
	lease, err := rpc.Acquire(ctx, &governorpb.AcquireRequest{NodeId: task.GetId(), Class: "db"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rpc.Release(ctx, &governorpb.ReleaseRequest{LeaseId: lease.GetId()}); err != nil {
		t.Fatal(err)
	}
	held := time.Since(began)
	tenant.Close()
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	srv = start()
	t.Cleanup(func() { srv.Close() })

	t.Setenv("GOVERNOR_API_KEY", govtest.TenantKey)
	code, out, errOut := cli(t, "usage", "-since", "1h", "-format", "json")
	if code != 0 {
		t.Fatalf("usage: exit %d: %s", code, errOut)
	}
	var doc usageDoc
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(doc.Lines) != 2 {
		t.Fatalf("the tenant's key sees %d lines, want its tenant and its task:\n%s", len(doc.Lines), out)
	}
	for _, l := range doc.Lines {
		if l.Tenant != "payments" || l.Spend["tokens"] != 700 || l.Peak["db"] != 1 || l.Denied["quota:tokens"] != 1 ||
			l.LeaseSeconds["db"] <= 0 || l.LeaseSeconds["db"] > held.Seconds() {
			t.Errorf("line %+v: want payments, tokens 700, peak db 1, one quota:tokens denial, 0 < db lease-seconds <= %v", l, held)
		}
	}
	if doc.Lines[1].Task != "crawl" {
		t.Errorf("the second line is task %q, want crawl", doc.Lines[1].Task)
	}

	code, out, _ = cli(t, "usage", "-format", "csv", "-by", "tenant")
	recs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if code != 0 || err != nil {
		t.Fatalf("usage csv: %d %v\n%s", code, err, out)
	}
	want := map[string]string{"spend/tokens": "700", "peak/db": "1", "denied/quota:tokens": "1"}
	for _, r := range recs[1:] {
		if r[0] != "payments" || r[1] != "" {
			t.Errorf("csv row %v: want payments' tenant line only", r)
		}
		if w, ok := want[r[2]+"/"+r[3]]; ok && w != r[4] {
			t.Errorf("csv %s/%s = %s, want %s", r[2], r[3], r[4], w)
		}
		delete(want, r[2]+"/"+r[3])
	}
	if len(want) != 0 || recs[0][2] != "figure" {
		t.Errorf("csv lacks %v:\n%s", want, out)
	}

	code, out, _ = cli(t, "usage")
	for _, w := range []string{"TENANT", "payments  (all)", "payments  crawl", "tokens=700", "quota:tokens=1"} {
		if code != 0 || !strings.Contains(out, w) {
			t.Errorf("usage table lacks %q:\n%s", w, out)
		}
	}

	// Per day: the day the work was done, summed from its hours (still
	// open, so from the minutes); the table and the CSV name each bucket.
	day := began.UTC().Truncate(24 * time.Hour)
	code, out, errOut = cli(t, "usage", "-per", "day", "-by", "tenant", "-format", "json")
	doc = usageDoc{}
	if err := json.Unmarshal([]byte(out), &doc); code != 0 || err != nil {
		t.Fatalf("usage -per day: exit %d, %v: %s%s", code, err, out, errOut)
	}
	var found bool
	for _, l := range doc.Lines {
		if l.Start != nil && l.Start.Equal(day) {
			found = l.Spend["tokens"] == 700 && l.End.Equal(day.Add(24*time.Hour)) && l.Denied["quota:tokens"] == 1
		}
	}
	if !found {
		t.Errorf("usage -per day: no line of %v spending 700 tokens:\n%s", day, out)
	}
	code, out, _ = cli(t, "usage", "-per", "hour", "-by", "tenant", "-since", "1h")
	hour := began.UTC().Truncate(time.Hour).Format("2006-01-02 15:04")
	if code != 0 || !strings.Contains(out, "START (UTC)") || !strings.Contains(out, hour+"  payments") {
		t.Errorf("usage -per hour lacks the hour %s:\n%s", hour, out)
	}
	code, out, _ = cli(t, "usage", "-per", "month", "-by", "tenant", "-format", "csv")
	if recs, err := csv.NewReader(strings.NewReader(out)).ReadAll(); code != 0 || err != nil || recs[0][0] != "start" || len(recs) < 2 ||
		!strings.HasPrefix(recs[1][0], began.UTC().Format("2006-01")+"-01T00:00:00Z") {
		t.Errorf("usage -per month -format csv:\n%s", out)
	}

	// Another tenant's key sees nothing of payments; a window before it all
	// is empty.
	t.Setenv("GOVERNOR_API_KEY", "other-key-for-tests")
	if _, out, _ = cli(t, "usage", "-format", "json"); strings.Contains(out, "payments") {
		t.Errorf("another tenant sees payments:\n%s", out)
	}
	t.Setenv("GOVERNOR_API_KEY", govtest.AdminKey)
	_, out, _ = cli(t, "usage", "-to", began.Add(-2*time.Minute).UTC().Format(time.RFC3339), "-format", "json")
	if strings.Contains(out, "payments") {
		t.Errorf("a window before the work shows it:\n%s", out)
	}
	for _, args := range [][]string{{"usage", "-by", "x"}, {"usage", "-format", "xml"}, {"usage", "-since", "-1h"},
		{"usage", "-from", "yesterday"}, {"usage", "extra"}, {"usage", "-per", "week"}, {"usage", "-per", "Day"}, {"usage", "-per", "day", "-by", "task"}, {"usage", "-from", "2026-01-02T00:00:00Z", "-to", "2026-01-01T00:00:00Z"}} {
		if code, _, _ := cli(t, args...); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
}

// -tenant with a name that is no tenant says so and exits 1, rather than
// printing an empty report as for a quiet tenant; a quiet tenant still
// gets its empty report, and a tenant's key is not told whether another
// tenant exists.
func TestUsageUnknownTenant(t *testing.T) {
	srv := govtest.Start(t, func(c *serverconfig.Config) {
		c.Tenants = append(c.Tenants, serverconfig.TenantConfig{Name: "other", APIKey: "other-key-for-tests", Weight: 1})
	})
	t.Setenv("GOVERNOR_ADDR", srv.Addr())
	t.Setenv("GOVERNOR_API_KEY", govtest.AdminKey)
	if _, err := adminRPC(t, srv.Addr()).CreateNode(context.Background(), &governorpb.CreateNodeRequest{ParentId: 2,
		Spec: &governorpb.NodeSpec{Name: "crawl"}}); err != nil {
		t.Fatal(err)
	}
	for _, format := range []string{"table", "json", "csv"} {
		code, out, errOut := gov(t, "usage", "-tenant", "nosuch", "-format", format)
		if code != 1 || out != "" || !strings.Contains(errOut, `-tenant "nosuch": no such tenant`) {
			t.Errorf("-tenant nosuch -format %s: exit %d, want 1 and no such tenant\n%s%s", format, code, out, errOut)
		}
	}
	if code, out, errOut := gov(t, "usage", "-tenant", "payments/crawl"); code != 1 || !strings.Contains(errOut, "that is a task, not a tenant") {
		t.Errorf("-tenant payments/crawl: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := gov(t, "usage", "-tenant", "other"); code != 0 || !strings.Contains(out, "(no usage in this window)") {
		t.Errorf("-tenant other, which spent nothing: exit %d\n%s%s", code, out, errOut)
	}
	t.Setenv("GOVERNOR_API_KEY", govtest.TenantKey)
	if code, out, errOut := gov(t, "usage", "-tenant", "other"); code != 1 || !strings.Contains(errOut, "not one this key can see") {
		t.Errorf("another tenant with a tenant's key: exit %d\n%s%s", code, out, errOut)
	}
}
