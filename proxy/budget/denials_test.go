package budget_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/proxy/admission"
	"github.com/governor-project/governor/proxy/budget"
	"github.com/governor-project/governor/server/serverconfig"
)

// Refusals the sidecar decides by itself reach governord's usage records,
// by cause, on the node the work was for; refusals governord decided are
// counted there once, not again by the sidecar. The same work is refused
// with delegation on and off: once the quota is spent, a charge is refused
// by the Reserve that would top the sidecar's reservation up (a refusal
// governord does not count: the sidecar reports it) or, without
// delegation, by governord's ChargeAndAcquire (counted there); a lease
// not free in time is refused by governord's queue either way. The usage
// report says the same in both.
func TestRefusalsReachUsageOnce(t *testing.T) {
	for _, delegate := range []bool{true, false} {
		t.Run(fmt.Sprintf("delegate=%v", delegate), func(t *testing.T) {
			srv := govtest.Start(t, func(c *serverconfig.Config) {
				c.Tenants[0].Quotas = map[string]int64{"tokens": 5}
				c.Tenants[0].Limits = map[string]int64{"db": 1}
			})
			a := start(t, srv, govtest.TenantKey, governor.Spec{Name: "pod"}, func(c *budget.Config) { c.Delegate = delegate })
			admit(t, a, admission.Request{Subtask: "agent", Charges: map[string]int64{"tokens": 5}})
			holder := admit(t, a, admission.Request{Subtask: "agent", Class: "db"})
			refuse := func(r admission.Request, wait time.Duration, want admission.Cause) {
				t.Helper()
				ctx, cancel := admission.WithWaitTimeout(context.Background(), wait)
				defer cancel()
				_, err := a.Admit(ctx, r)
				var d *admission.Denial
				if !errors.As(err, &d) || d.Cause != want {
					t.Fatalf("Admit(%+v): %v, want %v", r, err, want)
				}
			}
			refuse(admission.Request{Subtask: "agent", Class: "db"}, 100*time.Millisecond, admission.CauseWaitTimeout)
			refuse(admission.Request{Subtask: "agent", Charges: map[string]int64{"tokens": 1}}, waitFor, admission.CauseQuota)
			refuse(admission.Request{Subtask: "agent", Charges: map[string]int64{"tokens": 1}}, waitFor, admission.CauseQuota)
			holder.End(0, false)

			adm := admin(t, srv)
			var denied map[string]int64
			eventually(t, "the refusals in the usage records", func() bool {
				a.Settle(context.Background())
				// Refusals are stored with the next event governord commits.
				if _, err := adm.Raw().Consume(context.Background(), &governorpb.ConsumeRequest{NodeId: 1, Resource: "ticks", Amount: 1}); err != nil {
					t.Fatal(err)
				}
				denied = taskUsage(t, adm, "pod").GetDenied()
				return denied["quota:tokens"] >= 2 && denied["wait-abandoned"] >= 1
			})
			if len(denied) != 2 || denied["quota:tokens"] != 2 || denied["wait-abandoned"] != 1 {
				t.Errorf("usage's refusals of pod: %v, want 2 quota:tokens and 1 wait-abandoned", denied)
			}
		})
	}
}

// taskUsage is the usage line of the payments tenant's task named task.
func taskUsage(t *testing.T, adm *governor.Client, task string) *governorpb.UsageLine {
	t.Helper()
	rep, err := adm.Raw().GetUsage(context.Background(), &governorpb.GetUsageRequest{Tenant: govtest.Tenant})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range rep.GetLines() {
		if l.GetTask() == task {
			return l
		}
	}
	return &governorpb.UsageLine{}
}
