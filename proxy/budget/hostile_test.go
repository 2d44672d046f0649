package budget_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/proxy/admission"
	"github.com/governor-project/governor/proxy/budget"
	"github.com/governor-project/governor/server/serverconfig"
)

// A charge no work can make (negative, or over governor.MaxAmount) is
// refused as a bad request before anything is taken, in both delegation
// modes, and leaves the books as they were: the next request is admitted
// from them as before. Work that already ran (Spent) is charged as far as
// the caps allow, however large the amount its response named, in one
// call: the cap is reached, never passed.
func TestHostileChargesAreRefusedBeforeAnythingIsTaken(t *testing.T) {
	for _, delegate := range []bool{true, false} {
		t.Run(fmt.Sprintf("delegate=%v", delegate), func(t *testing.T) {
			srv := govtest.Start(t, func(c *serverconfig.Config) { c.Tenants[0].Quotas = map[string]int64{"tokens": 100} })
			a := start(t, srv, govtest.TenantKey, governor.Spec{Name: "pod-x"}, func(c *budget.Config) { c.Delegate = delegate })
			adm := admin(t, srv)
			ctx := context.Background()
			if _, err := a.Admit(ctx, admission.Request{Charges: map[string]int64{"tokens": 5}}); err != nil {
				t.Fatal(err)
			}
			for _, v := range []int64{-1, math.MinInt64, governor.MaxAmount + 1, math.MaxInt64} {
				for _, held := range []bool{false, true} {
					r := admission.Request{Charges: map[string]int64{"tokens": v}, Held: held}
					if _, ok := a.TryAdmit(r); ok {
						t.Errorf("TryAdmit admitted a charge of %d", v)
					}
					_, err := a.Admit(ctx, r)
					var d *admission.Denial
					if !errors.As(err, &d) || d.Cause != admission.CauseBadRequest {
						t.Errorf("a charge of %d (held %v): %v, want a bad request", v, held, err)
					}
				}
			}
			if _, err := a.Admit(ctx, admission.Request{Charges: map[string]int64{"tokens": 5}}); err != nil {
				t.Fatalf("a charge after the hostile ones: %v", err)
			}
			a.Settle(ctx)
			if used := node(t, adm, govtest.Tenant).GetUsed()["tokens"]; used != 10 {
				t.Errorf("%d tokens used, want 10", used)
			}
			if _, err := a.Admit(ctx, admission.Request{Charges: map[string]int64{"tokens": math.MaxInt64}, Spent: true}); err != nil {
				t.Fatalf("work that ran, charged as far as the caps allow: %v", err)
			}
			a.Settle(ctx)
			n := node(t, adm, govtest.Tenant)
			if used, reserved := n.GetUsed()["tokens"], n.GetReserved()["tokens"]; used != 100 || used+reserved > 100 {
				t.Errorf("after work that used more than the budget: used %d, reserved %d of 100", used, reserved)
			}
		})
	}
}
