package budget_test

import (
	"context"
	"testing"
	"time"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/governor/engine"
	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/proxy/admission"
	"github.com/governor-project/governor/proxy/budget"
	"github.com/governor-project/governor/server/serverconfig"
)

// TestRatedResourceIsChargedPerRequest: with delegation on, governord
// reserves none of a resource a rate binds (units spent here later would
// escape the rate), so each request charges it at governord, where it is
// counted at once; one it is not reserved for never takes the fast path.
// Once the rate is removed, the next top-up after RatedRecheck reserves
// again, and requests go back to spending locally.
func TestRatedResourceIsChargedPerRequest(t *testing.T) {
	srv := govtest.Start(t, func(c *serverconfig.Config) {
		c.Tenants[0].Rates = map[string]engine.Rate{"calls": {Units: 1000, Per: int64(time.Second)}}
	})
	a := start(t, srv, govtest.TenantKey, governor.Spec{Name: "rated"}, func(c *budget.Config) { c.RatedRecheck = 100 * time.Millisecond })
	r := admission.Request{Charges: map[string]int64{"calls": 1}}
	for i := range 5 {
		if _, err := a.Admit(context.Background(), r); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if _, ok := a.TryAdmit(r); ok {
			t.Fatalf("request %d took the fast path: calls were reserved under a rate", i)
		}
	}
	op := admin(t, srv)
	if used := node(t, op, govtest.Tenant).GetUsed()["calls"]; used != 5 {
		t.Fatalf("the tenant's calls used %d after 5 requests, want 5: charged per request, nothing reserved", used)
	}

	tenant := node(t, op, govtest.Tenant).GetId()
	if _, err := op.Raw().SetCaps(context.Background(), &governorpb.SetCapsRequest{NodeId: tenant,
		Rates: map[string]*governorpb.Rate{"calls": {Units: -1}}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(waitFor)
	for {
		if _, err := a.Admit(context.Background(), r); err != nil {
			t.Fatal(err)
		}
		if _, ok := a.TryAdmit(r); ok {
			break // spent from a reservation: delegated again
		}
		if time.Now().After(deadline) {
			t.Fatal("the rate is gone, and calls are still not reserved")
		}
		time.Sleep(10 * time.Millisecond) // requests a while apart, as the recheck needs time to pass
	}
}
