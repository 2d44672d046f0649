package budget_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/proxy/admission"
	"github.com/governor-project/governor/proxy/budget"
	"github.com/governor-project/governor/server/serverconfig"
)

// An estimate held for a call is settled to what the call used: the rest
// goes back to the reservation and is admitted again, and governord counts
// only what was used. Used beyond the estimate is charged too.
func TestHeldChargesSettleToWhatWasUsed(t *testing.T) {
	srv := govtest.Start(t, func(c *serverconfig.Config) { c.Tenants[0].Quotas = map[string]int64{"tokens": 100_000} })
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

// Estimates held by calls still running count against the quota: a call
// whose estimate fits only once they settle waits for them (they may come
// back unused) instead of being denied, and is admitted when they settle
// small. Once spent usage leaves no room, it is denied. The quota is never
// exceeded.
func TestHeldChargesHoldTheQuota(t *testing.T) {
	for _, delegate := range []bool{true, false} {
		t.Run(fmt.Sprintf("delegate=%v", delegate), func(t *testing.T) {
			srv := govtest.Start(t, func(c *serverconfig.Config) { c.Tenants[0].Quotas = map[string]int64{"tokens": 2500} })
			a := start(t, srv, govtest.TenantKey, governor.Spec{Name: "pod"}, func(c *budget.Config) { c.Delegate = delegate })
			estimate := admission.Request{Charges: map[string]int64{"tokens": 1000}, Held: true}
			first, second := admit(t, a, estimate), admit(t, a, estimate)

			ctx, cancel := admission.WithWaitTimeout(context.Background(), 200*time.Millisecond)
			_, err := a.Admit(ctx, estimate)
			cancel()
			var d *admission.Denial
			if !errors.As(err, &d) || d.Cause != admission.CauseWaitTimeout {
				t.Fatalf("a third estimate of 1000 with 2000 of 2500 held: %v, want it to wait", err)
			}

			third := make(chan error, 1)
			go func() {
				ctx, cancel := admission.WithWaitTimeout(context.Background(), waitFor)
				defer cancel()
				tk, err := a.Admit(ctx, estimate)
				if err == nil {
					tk.(admission.Settler).Settle(map[string]int64{"tokens": 1000})
					tk.End(0, false)
				}
				third <- err
			}()
			first.(admission.Settler).Settle(map[string]int64{"tokens": 500})
			first.End(0, false)
			if err := <-third; err != nil {
				t.Fatalf("a third estimate once the first call settled at 500: %v, want it admitted", err)
			}
			second.(admission.Settler).Settle(map[string]int64{"tokens": 1000})
			second.End(0, false)
			eventually(t, "every call's use settled", func() bool {
				a.Settle(context.Background())
				return node(t, admin(t, srv), govtest.Tenant).GetUsed()["tokens"] == 2500
			})
			ctx, cancel = admission.WithWaitTimeout(context.Background(), waitFor)
			_, err = a.Admit(ctx, admission.Request{Charges: map[string]int64{"tokens": 1}, Held: true})
			cancel()
			if !errors.As(err, &d) || d.Cause != admission.CauseQuota {
				t.Fatalf("an estimate with all 2500 spent: %v, want a quota denial", err)
			}
		})
	}
}
