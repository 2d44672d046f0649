package budget_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/server"
	"github.com/governor-project/governor/sidecar/admission"
	"github.com/governor-project/governor/sidecar/budget"
)

// An estimate held for a call is settled to what the call used: the rest
// goes back to the reservation and is admitted again, and governord counts
// only what was used. Used beyond the estimate is charged too.
func TestHeldChargesSettleToWhatWasUsed(t *testing.T) {
	srv := govtest.Start(t, func(c *server.Config) { c.Tenants[0].Quotas = map[string]int64{"tokens": 100_000} })
	a := start(t, srv, govtest.TenantKey, governor.Spec{Name: "pod"}, func(c *budget.Config) { c.MaxReservation = 10_000 })
	var want int64
	for i, used := range []int64{300, 1000, 0, 1500} {
		tk := admit(t, a, admission.Request{Subtask: "agent", Class: "llm", Charges: map[string]int64{"tokens": 1000}, Held: true})
		s, ok := tk.(admission.Settler)
		if !ok {
			t.Fatalf("the ticket of held charges is a %T", tk)
		}
		if i == 2 {
			tk.End(0, false) // never settled: the whole estimate is spent
			used = 1000
		} else {
			s.Settle(map[string]int64{"tokens": used})
			tk.End(time.Millisecond, false)
		}
		want += used
	}
	a.Settle(context.Background())
	eventually(t, "the use beyond the estimate", func() bool {
		a.Settle(context.Background())
		return node(t, admin(t, srv), govtest.Tenant).GetUsed()["tokens"] == want
	})
}

// A held estimate is refused when the quota cannot hold it, and the quota
// is never exceeded.
func TestHeldChargesHoldTheQuota(t *testing.T) {
	srv := govtest.Start(t, func(c *server.Config) { c.Tenants[0].Quotas = map[string]int64{"tokens": 2500} })
	a := start(t, srv, govtest.TenantKey, governor.Spec{Name: "pod"}, nil)
	var tickets []admission.Ticket
	for {
		ctx, cancel := admission.WithWaitTimeout(context.Background(), waitFor)
		tk, err := a.Admit(ctx, admission.Request{Charges: map[string]int64{"tokens": 1000}, Held: true})
		cancel()
		var d *admission.Denial
		if errors.As(err, &d) && d.Cause == admission.CauseQuota {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		tickets = append(tickets, tk)
		if len(tickets) > 2 {
			t.Fatalf("%d estimates of 1000 held under a quota of 2500", len(tickets))
		}
	}
	for _, tk := range tickets {
		tk.(admission.Settler).Settle(map[string]int64{"tokens": 1000})
		tk.End(0, false)
	}
	a.Settle(context.Background())
	if used := node(t, admin(t, srv), govtest.Tenant).GetUsed()["tokens"]; used > 2500 || used < 1000*int64(len(tickets)) {
		t.Errorf("used %d with %d calls of 1000 admitted", used, len(tickets))
	}
}
