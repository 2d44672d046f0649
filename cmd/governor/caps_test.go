package main

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/governor/engine"
	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/server"
	"github.com/governor-project/governor/server/serverconfig"
)

// cli runs the governor command in process and returns its exit code and
// output.
func cli(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(args, strings.NewReader(""), &out, &errOut)
	return code, out.String(), errOut.String()
}

// startDurable starts governord on a SQLite file, so that a second start on
// the same file is a restart, and points the CLI's environment at it.
func startDurable(t *testing.T, dbPath string) *server.Server {
	t.Helper()
	cfg := govtest.Config()
	cfg.Store = serverconfig.StoreConfig{Driver: "sqlite", DSN: dbPath}
	srv := govtest.StartConfig(t, cfg)
	t.Setenv("GOVERNOR_ADDR", srv.Addr())
	return srv
}

func adminRPC(t *testing.T, addr string) governorpb.GovernorClient {
	t.Helper()
	c, err := governor.Dial(context.Background(), governor.WithAddr(addr), governor.WithAPIKey(govtest.AdminKey))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.Raw()
}

type capsGetJSON struct {
	ID     int64
	Path   string
	Quotas []struct {
		Name string
		Used int64
		Cap  *int64
	}
	Limits []struct {
		Name string
		Used int64
		Cap  *int64
	}
	Effective []effective
}

// A tenant's key overrides a task's caps for a while; governord is stopped
// and started again on the same store while the override runs and is past
// its end when it comes back; the new process reverts it by itself, and
// the audit trail holds both changes, who made them, why, and the old and
// new values.
func TestCapsOverrideRevertsAcrossARestart(t *testing.T) {
	dbPath := filepath.Join(t.TempDir(), "governor.db")
	srv := startDurable(t, dbPath)
	ctx := context.Background()
	admin := adminRPC(t, srv.Addr())
	task, err := admin.FindOrCreateNode(ctx, &governorpb.FindOrCreateNodeRequest{ParentId: 2,
		Spec: &governorpb.NodeSpec{Name: "checkout-42", Quotas: map[string]int64{"tokens": 1000}, Limits: map[string]int64{"db": 4}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Consume(ctx, &governorpb.ConsumeRequest{NodeId: task.GetNode().GetId(), Resource: "tokens", Amount: 300}); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GOVERNOR_API_KEY", govtest.TenantKey)

	code, out, errOut := cli(t, "caps", "set", "payments/checkout-42", "quota.tokens=50000", "limit.db=none",
		"-reason", "incident 7: backlog", "-for", "2s")
	if code != 0 {
		t.Fatalf("caps set: exit %d: %s%s", code, out, errOut)
	}
	for _, want := range []string{"quota.tokens: 1000 -> 50000", "limit.db: 4 -> none", "temporary: reverts by itself in 2s"} {
		if !strings.Contains(out, want) {
			t.Errorf("caps set output lacks %q:\n%s", want, out)
		}
	}
	code, out, _ = cli(t, "caps", "get", "payments/checkout-42")
	for _, want := range []string{"payments/checkout-42  (id", "task, open", "tokens  300/50000", "quota tokens  49700 left  at payments/checkout-42 (300/50000)",
		"caps above payments are outside this key's scope"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("caps get (exit %d) lacks %q:\n%s", code, want, out)
		}
	}
	h, err := admin.GetCapsHistory(ctx, &governorpb.GetCapsHistoryRequest{NodeId: task.GetNode().GetId()})
	if err != nil || len(h.GetPending()) != 2 {
		t.Fatalf("pending overrides before the restart: %v, %v; want tokens and db", h.GetPending(), err)
	}
	until := h.GetPending()[0].GetUntil().AsTime()

	// Stop governord, stay down past the override's end, start it again.
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	<-time.After(time.Until(until)) // the override ends while governord is down
	restarted := time.Now()
	srv = startDurable(t, dbPath)
	t.Cleanup(func() { srv.Close() })

	var got capsGetJSON
	for deadline := time.Now().Add(time.Minute); ; {
		code, out, errOut = cli(t, "caps", "get", "-json", "payments/checkout-42")
		if code != 0 {
			t.Fatalf("caps get after the restart: exit %d: %s", code, errOut)
		}
		got = capsGetJSON{}
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("caps get -json: %v\n%s", err, out)
		}
		if len(got.Quotas) == 1 && got.Quotas[0].Cap != nil && *got.Quotas[0].Cap == 1000 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a minute after the restart the override has not reverted: %s", out)
		}
		time.Sleep(50 * time.Millisecond) // polling governord's answer, not waiting for readiness
	}
	if len(got.Limits) != 1 || got.Limits[0].Cap == nil || *got.Limits[0].Cap != 4 {
		t.Fatalf("limit db after the revert: %+v, want 4 back", got.Limits)
	}

	code, out, _ = cli(t, "caps", "history", "payments/checkout-42")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 5 {
		t.Fatalf("caps history: exit %d, %d lines, want a header and 4 lines:\n%s", code, len(lines), out)
	}
	for i, want := range [][]string{
		{"WHEN (UTC)", "WHO", "CHANGE", "UNTIL", "REASON"},
		{"tenant:payments", "quota.tokens: 1000 -> 50000", until.UTC().Format(time.DateTime), "incident 7: backlog"},
		{"limit.db: 4 -> none"},
		{"governord", "quota.tokens: 50000 -> 1000", "temporary override expired"},
		{"limit.db: none -> 4"},
	} {
		for _, w := range want {
			if !strings.Contains(lines[i], w) {
				t.Errorf("caps history line %d lacks %q: %s", i, w, lines[i])
			}
		}
	}
	var doc struct {
		Changes []struct {
			At      time.Time
			Who     string
			Reason  string
			Changes []string
			Until   *time.Time
			Revert  bool
		}
		Pending []any
	}
	_, js, _ := cli(t, "caps", "history", "-json", "payments/checkout-42")
	if err := json.Unmarshal([]byte(js), &doc); err != nil {
		t.Fatalf("caps history -json: %v\n%s", err, js)
	}
	if len(doc.Changes) != 2 || len(doc.Pending) != 0 {
		t.Fatalf("history: %+v, want the override and its revert, nothing pending", doc)
	}
	set, rev := doc.Changes[0], doc.Changes[1]
	if set.Who != "tenant:payments" || set.Reason != "incident 7: backlog" || set.Until == nil || !set.Until.Equal(until) ||
		strings.Join(set.Changes, "; ") != "quota.tokens: 1000 -> 50000; limit.db: 4 -> none" {
		t.Errorf("the override's entry: %+v", set)
	}
	if rev.Who != "governord" || !rev.Revert || rev.At.Before(restarted) ||
		strings.Join(rev.Changes, "; ") != "quota.tokens: 50000 -> 1000; limit.db: none -> 4" {
		t.Errorf("the revert's entry: %+v; want by governord, after the restart at %v", rev, restarted)
	}
}

// Bad arguments exit 2 before anything is sent; what governord refuses
// exits 1 and says why; the admin's changes are recorded as the admin's.
func TestCapsRefusals(t *testing.T) {
	for _, args := range [][]string{{"caps"}, {"caps", "nope", "x"}, {"caps", "get"}, {"caps", "get", "a", "b"},
		{"caps", "set", "x", "quota.a=1"}, {"caps", "set", "x", "-reason", "r"}, {"caps", "set", "x", "bogus=1", "-reason", "r"},
		{"caps", "set", "x", "quota.a=-2", "-reason", "r"}, {"caps", "set", "x", "quota=1", "-reason", "r"},
		{"caps", "set", "x", "weight.a=1", "-reason", "r"}, {"caps", "set", "x", "quota.a=1", "-reason", "r", "-for", "-1s"}} {
		if code, out, errOut := cli(t, args...); code != 2 {
			t.Errorf("%v: exit %d, want 2\n%s%s", args, code, out, errOut)
		}
	}

	srv := govtest.Start(t, nil)
	t.Setenv("GOVERNOR_ADDR", srv.Addr())
	admin := adminRPC(t, srv.Addr())
	if _, err := admin.FindOrCreateNode(context.Background(), &governorpb.FindOrCreateNodeRequest{ParentId: 2,
		Spec: &governorpb.NodeSpec{Name: "job"}}); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GOVERNOR_API_KEY", govtest.TenantKey)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"caps", "get", "payments/nope"}, `no open node at "payments/nope" (not found)`},
		{[]string{"caps", "get", "99"}, "not found"},
		{[]string{"caps", "set", "payments", "quota.a=1", "-reason", "raise my own"}, "cannot edit its own scope node"},
		{[]string{"caps", "set", "payments/job", "weight=2", "-reason", "r", "-for", "1h"}, "sets only quotas and limits"},
	} {
		code, out, errOut := cli(t, tc.args...)
		if code != 1 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q, want 1 and %q\n%s", tc.args, code, errOut, tc.want, out)
		}
	}
	t.Setenv("GOVERNOR_API_KEY", govtest.AdminKey)
	if code, out, errOut := cli(t, "caps", "set", "payments", "quota.tokens=7", "-reason", "cap the tenant"); code != 0 {
		t.Fatalf("admin caps set: %d %s%s", code, out, errOut)
	}
	_, out, _ := cli(t, "caps", "history", "payments")
	if !strings.Contains(out, "admin") || !strings.Contains(out, "quota.tokens: none -> 7") || !strings.Contains(out, "cap the tenant") {
		t.Fatalf("history of the admin's change:\n%s", out)
	}
	_, out, _ = cli(t, "caps", "get", "payments")
	if !strings.Contains(out, "payments  (id 2, tenant, open)") || strings.Contains(out, "outside this key's scope") {
		t.Fatalf("caps get as admin:\n%s", out)
	}
}

// The root, which every command prints as "/", is found by that name too:
// caps get / shows it to the admin, and a tenant's key is told it is not
// there for it, as for any node outside its scope.
func TestCapsGetRoot(t *testing.T) {
	srv := govtest.Start(t, func(c *serverconfig.Config) { c.Root = serverconfig.Caps{Limits: map[string]int64{"db": 40}} })
	t.Setenv("GOVERNOR_ADDR", srv.Addr())
	t.Setenv("GOVERNOR_API_KEY", govtest.AdminKey)
	code, out, errOut := gov(t, "caps", "get", "/")
	if code != 0 || !strings.HasPrefix(out, "/  (id 1, root, open)\n") || !strings.Contains(out, "db  0/40") {
		t.Fatalf("caps get / as admin: exit %d\n%s%s", code, out, errOut)
	}
	t.Setenv("GOVERNOR_API_KEY", govtest.TenantKey)
	if code, out, errOut := gov(t, "caps", "get", "/"); code != 1 || !strings.Contains(errOut, `node "/"`) || !strings.Contains(errOut, "not found") {
		t.Fatalf("caps get / with a tenant's key: exit %d, want 1 and not found\n%s%s", code, out, errOut)
	}
}

// capsOfNode reads a node's caps and their modes from governord.
func capsOfNode(t *testing.T, admin governorpb.GovernorClient, path string) *governorpb.Node {
	t.Helper()
	n, err := admin.GetNode(context.Background(), &governorpb.GetNodeRequest{Path: path})
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return n
}

// -for 0s would make a permanent change under a flag that says it is
// temporary: it is refused like a negative one, with nothing changed, and
// says what to do instead.
func TestCapsSetForZeroIsRefused(t *testing.T) {
	srv := govtest.Start(t, nil)
	t.Setenv("GOVERNOR_ADDR", srv.Addr())
	t.Setenv("GOVERNOR_API_KEY", govtest.AdminKey)
	admin := adminRPC(t, srv.Addr())
	if _, err := admin.CreateNode(context.Background(), &governorpb.CreateNodeRequest{ParentId: 2,
		Spec: &governorpb.NodeSpec{Name: "job", Quotas: map[string]int64{"tokens": 100}}}); err != nil {
		t.Fatal(err)
	}
	for d, said := range map[string]string{"0s": "-for 0s", "0": "-for 0s", "-5s": "-for -5s"} {
		code, out, errOut := gov(t, "caps", "set", "payments/job", "quota.tokens=500", "-reason", "incident 7", "-for", d)
		if code != 2 || !strings.Contains(errOut, said+": an override lasts a positive duration") ||
			!strings.Contains(errOut, "leave -for out for a permanent change") {
			t.Errorf("-for %s: exit %d, want 2 saying why\n%s%s", d, code, out, errOut)
		}
	}
	if got := capsOfNode(t, admin, "payments/job").GetQuotas()["tokens"]; got != 100 {
		t.Fatalf("after the refused edits quota tokens is %d, want 100 unchanged", got)
	}
	code, out, errOut := gov(t, "caps", "set", "payments/job", "quota.tokens=500", "-reason", "incident 7", "-for", "1h")
	if code != 0 || !strings.Contains(out, "temporary: reverts by itself in 1h0m0s") {
		t.Fatalf("-for 1h: exit %d\n%s%s", code, out, errOut)
	}
}

// A soft cap without a burst refuses at the cap, as a hard one does: the
// command refuses to set one, naming the key and saying so, rather than
// setting "soft (burst 0)" silently.
func TestCapsSetSoftNeedsABurst(t *testing.T) {
	srv := govtest.Start(t, nil)
	t.Setenv("GOVERNOR_ADDR", srv.Addr())
	t.Setenv("GOVERNOR_API_KEY", govtest.AdminKey)
	admin := adminRPC(t, srv.Addr())
	if _, err := admin.CreateNode(context.Background(), &governorpb.CreateNodeRequest{ParentId: 2,
		Spec: &governorpb.NodeSpec{Name: "job"}}); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"quota.x=5:soft", "quota.x=5:soft:burst=0", "limit.db=3:soft"} {
		code, out, errOut := gov(t, "caps", "set", "payments/job", v, "-reason", "roll out")
		key, _, _ := strings.Cut(v, "=")
		if code != 2 || !strings.Contains(errOut, key+": a soft cap needs a burst") || !strings.Contains(errOut, "as hard does") {
			t.Errorf("%s: exit %d, want 2 naming %s\n%s%s", v, code, key, out, errOut)
		}
	}
	if n := capsOfNode(t, admin, "payments/job"); len(n.GetQuotas()) != 0 || len(n.GetLimits()) != 0 {
		t.Fatalf("the refused edits set caps: %v %v", n.GetQuotas(), n.GetLimits())
	}
	code, out, errOut := gov(t, "caps", "set", "payments/job", "quota.x=5:soft:burst=2", "-reason", "roll out")
	if code != 0 || !strings.Contains(out, "quota.x mode: hard -> soft (burst 2)") {
		t.Fatalf("soft:burst=2: exit %d\n%s%s", code, out, errOut)
	}
}

// caps get shows what decides how a contended pool is shared, and what new
// children get: a tenant's weight, priority, reserved minimums (with their
// window) and defaults; a task's priority and defaults. The JSON carries
// the same.
func TestCapsGetShowsSharing(t *testing.T) {
	until := time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)
	srv := govtest.Start(t, func(c *serverconfig.Config) {
		c.Root = serverconfig.Caps{Limits: map[string]int64{"db": 40}}
		c.Tenants[0].Weight = 4
		c.Tenants[0].Defaults = serverconfig.Caps{Quotas: map[string]int64{"retry": 3}, Limits: map[string]int64{"db": 5}}
		c.Tenants[0].Minimums = map[string]engine.Minimum{"db": {Min: 10, Until: until.UnixNano()}}
	})
	t.Setenv("GOVERNOR_ADDR", srv.Addr())
	t.Setenv("GOVERNOR_API_KEY", govtest.AdminKey)
	if _, err := adminRPC(t, srv.Addr()).CreateNode(context.Background(), &governorpb.CreateNodeRequest{ParentId: 2,
		Spec: &governorpb.NodeSpec{Name: "batch", Priority: -2, DefaultQuotas: map[string]int64{"tokens": 500}}}); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := gov(t, "caps", "get", "payments")
	want := "payments  (id 2, tenant, open)\n" +
		"state: active\n" +
		"sharing: weight 4, priority 0\n" +
		"minimums: db 10 (until 2031-01-02 03:04:05 UTC)\n" +
		"defaults for new children: quota retry=3, limit db=5\n"
	if code != 0 || !strings.HasPrefix(out, want) {
		t.Fatalf("caps get payments: exit %d; want it to begin\n%s\ngot\n%s%s", code, want, out, errOut)
	}
	code, out, errOut = gov(t, "caps", "get", "payments/batch")
	want = "payments/batch  (id 3, task, open)\n" +
		"sharing: priority -2\n" +
		"defaults for new children: quota tokens=500, limit db=5\n" // its own, and the limit it inherited
	if code != 0 || !strings.HasPrefix(out, want) {
		t.Fatalf("caps get payments/batch: exit %d; want it to begin\n%s\ngot\n%s%s", code, want, out, errOut)
	}
	var doc struct {
		Weight   int64
		Priority int64
		Minimums []struct {
			Class      string
			Min        int64
			ValidUntil *time.Time `json:"valid_until"`
		}
		Defaults struct{ Quotas, Limits map[string]int64 }
	}
	_, js, _ := gov(t, "caps", "get", "-json", "payments")
	if err := json.Unmarshal([]byte(js), &doc); err != nil {
		t.Fatalf("caps get -json: %v\n%s", err, js)
	}
	if doc.Weight != 4 || len(doc.Minimums) != 1 || doc.Minimums[0].Min != 10 || doc.Minimums[0].ValidUntil == nil ||
		!doc.Minimums[0].ValidUntil.Equal(until) || doc.Defaults.Quotas["retry"] != 3 || doc.Defaults.Limits["db"] != 5 {
		t.Fatalf("caps get -json: %+v\n%s", doc, js)
	}
}
