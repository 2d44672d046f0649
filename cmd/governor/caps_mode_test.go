package main

import (
	"context"
	"strings"
	"testing"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/internal/govtest"
)

// governor caps set takes a cap's enforcement after its value
// (VALUE:soft:burst=N, VALUE:warn_only, VALUE:hard); governord enforces it,
// caps get shows it and the audit trail records the change of mode.
func TestCapsSetMode(t *testing.T) {
	for _, bad := range []string{"quota.a=5:lenient", "quota.a=5:hard:burst=3", "quota.a=5:soft:burst=x",
		"quota.a=5:soft:brust=3", "quota.a=none:soft", "weight=2:soft", "default_quota.a=5:soft"} {
		if code, out, errOut := cli(t, "caps", "set", "x", bad, "-reason", "r"); code != 2 {
			t.Errorf("%s: exit %d, want 2\n%s%s", bad, code, out, errOut)
		}
	}
	srv := govtest.Start(t, nil)
	t.Setenv("GOVERNOR_ADDR", srv.Addr())
	admin := adminRPC(t, srv.Addr())
	job, err := admin.FindOrCreateNode(context.Background(), &governorpb.FindOrCreateNodeRequest{ParentId: 2,
		Spec: &governorpb.NodeSpec{Name: "job"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("GOVERNOR_API_KEY", govtest.AdminKey)
	code, out, errOut := cli(t, "caps", "set", "payments/job", "quota.tokens=100:soft:burst=10", "limit.db=2:warn_only", "-reason", "roll out")
	if code != 0 || !strings.Contains(out, "quota.tokens mode: hard -> soft (burst 10)") || !strings.Contains(out, "limit.db mode: hard -> warn_only") {
		t.Fatalf("caps set with modes: %d\n%s%s", code, out, errOut)
	}
	id := job.GetNode().GetId()
	for i, amount := range []int64{100, 10, 1} {
		_, err := admin.Consume(context.Background(), &governorpb.ConsumeRequest{NodeId: id, Resource: "tokens", Amount: amount})
		if (err != nil) != (i == 2) {
			t.Fatalf("consume %d after %d: %v; a soft 100 with a burst of 10 admits 110 and no more", amount, i, err)
		}
	}
	// A shadow rule's dry run of 7 calls, recorded in the shadow ledger
	// (docs/policy.md), which caps get shows beside the usage.
	if r, err := admin.DryRun(context.Background(), &governorpb.DryRunRequest{NodeId: id, Charges: map[string]int64{"calls": 7}, Record: true}); err != nil || r.GetOutcome() != "admitted" {
		t.Fatalf("a recorded dry run: %v, %v", r, err)
	}
	_, out, _ = cli(t, "caps", "get", "payments/job")
	if !strings.Contains(out, "soft (burst 10)") || !strings.Contains(out, "warn_only") || !strings.Contains(out, "shadow 7") {
		t.Fatalf("caps get does not show the modes and the shadow ledger:\n%s", out)
	}
	_, out, _ = cli(t, "caps", "history", "payments/job")
	if !strings.Contains(out, "quota.tokens mode: hard -> soft (burst 10)") || !strings.Contains(out, "roll out") {
		t.Fatalf("caps history does not show the change of mode:\n%s", out)
	}
	if code, out, errOut := cli(t, "caps", "set", "payments/job", "quota.tokens=100:hard", "-reason", "enforce"); code != 0 ||
		!strings.Contains(out, "quota.tokens mode: soft (burst 10) -> hard") {
		t.Fatalf("back to hard: %d\n%s%s", code, out, errOut)
	}
}

// governor caps set min.CLASS=N sets a tenant's reserved minimum, shown as
// a change and kept in the audit trail; on a task it is refused.
func TestCapsSetMinimum(t *testing.T) {
	srv := govtest.Start(t, nil)
	t.Setenv("GOVERNOR_ADDR", srv.Addr())
	t.Setenv("GOVERNOR_API_KEY", govtest.AdminKey)
	code, out, errOut := cli(t, "caps", "set", "payments", "min.db=2", "-reason", "reserve for payments")
	if code != 0 || !strings.Contains(out, "min.db: 0 -> 2") {
		t.Fatalf("caps set min: %d\n%s%s", code, out, errOut)
	}
	_, out, _ = cli(t, "caps", "history", "payments")
	if !strings.Contains(out, "min.db: 0 -> 2") || !strings.Contains(out, "reserve for payments") {
		t.Fatalf("caps history:\n%s", out)
	}
	if code, _, errOut := cli(t, "caps", "set", "payments", "min.db=none", "-reason", "r"); code != 2 {
		t.Fatalf("min.db=none: exit %d %s", code, errOut)
	}
	admin := adminRPC(t, srv.Addr())
	if _, err := admin.FindOrCreateNode(context.Background(), &governorpb.FindOrCreateNodeRequest{ParentId: 2,
		Spec: &governorpb.NodeSpec{Name: "job"}}); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := cli(t, "caps", "set", "payments/job", "min.db=1", "-reason", "r"); code != 1 || !strings.Contains(errOut, "only a tenant has minimums") {
		t.Fatalf("a minimum on a task: exit %d %s", code, errOut)
	}
}
