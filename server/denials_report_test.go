package server

import (
	"path/filepath"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/server/serverconfig"
)

// A sidecar's report of the refusals it decided goes into the usage
// records of its own nodes only, and bad reports are refused whole.
func TestReportDenials(t *testing.T) {
	cfg := testConfig()
	cfg.Store = serverconfig.StoreConfig{Driver: "sqlite", DSN: filepath.Join(t.TempDir(), "governor.db")}
	srv := start(t, cfg)
	pay := session(t, srv.Addr(), "pay-key", 0)
	recon := session(t, srv.Addr(), "recon-key", 0)
	task := pay.task(t, "checkout-42", nil)
	other := recon.task(t, "nightly", nil)

	report := func(c *client, ds ...*governorpb.DenialCount) error {
		_, err := c.ReportDenials(c.ctx, &governorpb.ReportDenialsRequest{Denials: ds})
		return err
	}
	ok := &governorpb.DenialCount{NodeId: task.Id, Cause: "wait-timeout", Count: 3}
	for what, bad := range map[string]*governorpb.DenialCount{
		"no node":        {Cause: "wait-timeout", Count: 1},
		"an upper case":  {NodeId: task.Id, Cause: "Wait-timeout", Count: 1},
		"two colons":     {NodeId: task.Id, Cause: "quota:a:b", Count: 1},
		"no resource":    {NodeId: task.Id, Cause: "quota:", Count: 1},
		"a NUL":          {NodeId: task.Id, Cause: "quota:a\x00b", Count: 1},
		"an empty cause": {NodeId: task.Id, Count: 1},
		"a zero count":   {NodeId: task.Id, Cause: "wait-timeout"},
		"a huge count":   {NodeId: task.Id, Cause: "wait-timeout", Count: maxDenialCount + 1},
	} {
		wantCode(t, what, report(pay, ok, bad), codes.InvalidArgument)
	}
	if err := report(pay, ok, &governorpb.DenialCount{NodeId: other.Id, Cause: "quota:tokens", Count: 1}); err == nil {
		t.Fatal("a tenant reported refusals on another tenant's node")
	}
	many := make([]*governorpb.DenialCount, maxDenialReports+1)
	for i := range many {
		many[i] = ok
	}
	wantCode(t, "too many counts", report(pay, many...), codes.InvalidArgument)

	if err := report(pay, ok, &governorpb.DenialCount{NodeId: task.Id, Cause: "quota:tokens", Count: 2}); err != nil {
		t.Fatal(err)
	}
	// Stored before the answer: no commit needs to follow.
	rep, err := pay.GetUsage(pay.ctx, &governorpb.GetUsageRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]int64
	for _, l := range rep.GetLines() {
		if l.GetTaskId() == task.Id {
			got = l.GetDenied()
		}
	}
	if len(got) != 2 || got["wait-timeout"] != 3 || got["quota:tokens"] != 2 {
		t.Fatalf("checkout-42's refusals: %v, want 3 wait-timeout and 2 quota:tokens, and none of the refused reports", got)
	}
	// A quota cause names its resource as the engine does: any name it
	// takes but for ':', upper case and '/' included.
	if err := report(pay, &governorpb.DenialCount{NodeId: task.Id, Cause: "quota:GPT-4o/Tokens", Count: 1}); err != nil {
		t.Fatalf("a cause naming a resource with upper case and '/': %v", err)
	}
}
