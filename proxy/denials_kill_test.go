package proxy

import (
	"context"
	"testing"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor"
)

// Refusal counts a sidecar reports are stored before governord answers:
// reported, then governord killed with SIGKILL before it commits anything
// else, and started again, the usage report still holds them, on SQLite
// and on PostgreSQL. (The sidecar forgets what it reported once answered,
// so counts that waited for the next commit would be lost.)
func TestReportedDenialsSurviveKill9(t *testing.T) {
	for _, st := range []string{"sqlite", "postgres"} {
		t.Run(st, func(t *testing.T) {
			ctx := context.Background()
			g := startGovProcOn(t, st, "tenants:\n  - {name: payments, api_key: "+tenantKey+"}\n")
			c, err := governor.Dial(ctx, governor.WithAddr(g.addr), governor.WithAPIKey(tenantKey))
			must(t, err)
			defer c.Close()
			_, task, err := c.NewTask(ctx, governor.Spec{Name: "job"})
			must(t, err)
			must(t, c.ReportDenials(ctx, []governor.DenialCount{
				{Node: task.ID(), Cause: "wait-timeout", Count: 7},
				{Node: task.ID(), Cause: "wait-timeout", Count: 2}, // the same key twice in one report
				{Node: task.ID(), Cause: "quota:tokens", Count: 1},
			}))
			g.kill()
			g.start()
			a := newAdmin(t, g.addr)
			rep, err := a.c.Raw().GetUsage(ctx, &governorpb.GetUsageRequest{})
			must(t, err)
			var got map[string]int64
			for _, l := range rep.GetLines() {
				if l.GetTaskId() == task.ID() {
					got = l.GetDenied()
				}
			}
			if len(got) != 2 || got["wait-timeout"] != 9 || got["quota:tokens"] != 1 {
				t.Fatalf("the job's refusals after kill -9: %v, want 9 wait-timeout and 1 quota:tokens", got)
			}
		})
	}
}
