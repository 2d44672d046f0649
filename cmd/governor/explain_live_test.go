package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/internal/govtest"
)

// governor explain -live asks governord, in dry run, how it would answer
// the request on a node now, and says a shadow rule is one: for a shadow
// rule counting the shadow ledger (what its requests would have spent), for
// an enforced one not; a request whose quota is spent reads as refused for
// quota, and nothing is charged.
func TestExplainLive(t *testing.T) {
	srv := govtest.Start(t, nil)
	t.Setenv("GOVERNOR_ADDR", srv.Addr())
	t.Setenv("GOVERNOR_API_KEY", govtest.AdminKey)
	admin := adminRPC(t, srv.Addr())
	if _, err := admin.SetCaps(context.Background(), &governorpb.SetCapsRequest{NodeId: 2, Quotas: map[string]int64{"calls": 1}, Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	c, err := governor.Dial(context.Background(), governor.WithAddr(srv.Addr()), governor.WithAPIKey(govtest.TenantKey))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, task, err := c.NewTask(context.Background(), governor.Spec{Name: "pod-7"})
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "proxy.yaml")
	if err := os.WriteFile(cfg, []byte("rules:\n  - {name: api, match: {host: api.test}, charge: {calls: 1}, mode: shadow}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := cli(t, "explain", "-config", cfg, "-live", "payments/pod-7", "POST", "http://api.test/v1")
	if code != 0 || !strings.Contains(out, "mode: shadow") || !strings.Contains(out, "live, on payments/pod-7") || !strings.Contains(out, "  admitted") {
		t.Fatalf("explain -live with room: %d\n%s%s", code, out, errOut)
	}
	// The shadow rule's own request, recorded in the shadow ledger, spends
	// the quota of 1 as it would enforced: explain counts it.
	if r, err := c.Raw().DryRun(context.Background(), &governorpb.DryRunRequest{NodeId: task.ID(), Charges: map[string]int64{"calls": 1}, Record: true}); err != nil || r.GetOutcome() != "admitted" {
		t.Fatalf("a recorded dry run: %v %v", r, err)
	}
	code, out, errOut = cli(t, "explain", "-config", cfg, "-live", "payments/pod-7", "POST", "http://api.test/v1")
	if code != 0 || !strings.Contains(out, "counting the shadow ledger") || !strings.Contains(out, "refused (quota)") {
		t.Fatalf("explain -live with the shadow ledger full: %d\n%s%s", code, out, errOut)
	}
	// The same rule enforced does not count the ledger: room again, until
	// real work spends the quota.
	enforced := filepath.Join(t.TempDir(), "proxy.yaml")
	if err := os.WriteFile(enforced, []byte("rules:\n  - {name: api, match: {host: api.test}, charge: {calls: 1}}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = cli(t, "explain", "-config", enforced, "-live", "payments/pod-7", "POST", "http://api.test/v1")
	if code != 0 || strings.Contains(out, "shadow") || !strings.Contains(out, "  admitted") {
		t.Fatalf("explain -live of the rule enforced: %d\n%s%s", code, out, errOut)
	}
	if err := task.Consume(context.Background(), "calls", 1); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = cli(t, "explain", "-config", enforced, "-live", "payments/pod-7", "POST", "http://api.test/v1")
	if code != 0 || !strings.Contains(out, "refused (quota)") {
		t.Fatalf("explain -live with the quota spent: %d\n%s%s", code, out, errOut)
	}
	n, err := admin.GetNode(context.Background(), &governorpb.GetNodeRequest{NodeId: 2})
	if err != nil || n.GetUsed()["calls"] != 1 {
		t.Fatalf("a dry run charged something: %v %v", n.GetUsed(), err)
	}
}
