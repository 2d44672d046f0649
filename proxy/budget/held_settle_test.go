package budget_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/proxy/admission"
	"github.com/governor-project/governor/proxy/budget"
	"github.com/governor-project/governor/server/serverconfig"
)

// Near a quota's edge (a top-up comes back short of the estimate) and with
// delegation off, a held estimate is held exactly at governord and settled
// there to what the call used. So a quota of 2500 with estimates of 1000
// and calls that use 100 admits calls until 1500 are used and one more
// estimate still fits: 16, charged 1600, not 2 charged 1000 each.
func TestHeldEstimatesSettleToWhatWasUsedAtTheQuotasEdge(t *testing.T) {
	for _, delegate := range []bool{true, false} {
		t.Run(fmt.Sprintf("delegate=%v", delegate), func(t *testing.T) {
			srv := govtest.Start(t, func(c *serverconfig.Config) { c.Tenants[0].Quotas = map[string]int64{"tokens": 2500} })
			a := start(t, srv, govtest.TenantKey, governor.Spec{Name: "pod"}, func(c *budget.Config) { c.Delegate = delegate })
			admitted := 0
			for {
				ctx, cancel := admission.WithWaitTimeout(context.Background(), waitFor)
				tk, err := a.Admit(ctx, admission.Request{Subtask: "agent", Charges: map[string]int64{"tokens": 1000}, Held: true})
				cancel()
				var d *admission.Denial
				if errors.As(err, &d) && d.Cause == admission.CauseQuota {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				if admitted++; admitted > 16 {
					t.Fatalf("%d estimates of 1000 admitted under a quota of 2500 with 100 used by each", admitted)
				}
				tk.(admission.Settler).Settle(map[string]int64{"tokens": 100})
				tk.End(0, false)
			}
			a.Settle(context.Background())
			eventually(t, "every call's use settled", func() bool {
				a.Settle(context.Background())
				v := node(t, admin(t, srv), govtest.Tenant)
				return v.GetUsed()["tokens"] == 100*int64(admitted) && (delegate || v.GetReserved()["tokens"] == 0)
			})
			if admitted != 16 {
				t.Errorf("%d calls admitted, want 16: each holds 1000 and uses 100 of a quota of 2500", admitted)
			}
		})
	}
}
