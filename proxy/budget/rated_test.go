package budget_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/governor/engine"
	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/proxy/admission"
	"github.com/governor-project/governor/proxy/budget"
	"github.com/governor-project/governor/server/serverconfig"
)

// TestRatedResourceIsChargedPerRequest: with delegation on, governord
// reserves none of a resource a rate binds while the rate is contended
// (its bucket is below half full: units spent here later would escape the
// rate, and no slice of it is delegated), so each request charges it at
// governord, where it is counted at once; one it is not reserved for never
// takes the fast path. Once the rate is removed, the next top-up after
// RatedRecheck reserves again, and requests go back to spending locally.
func TestRatedResourceIsChargedPerRequest(t *testing.T) {
	srv := govtest.Start(t, func(c *serverconfig.Config) {
		c.Tenants[0].Rates = map[string]engine.Rate{"calls": {Units: 1000, Per: int64(time.Hour)}}
	})
	op := admin(t, srv)
	tenant := node(t, op, govtest.Tenant).GetId()
	if _, err := op.Raw().Consume(context.Background(), &governorpb.ConsumeRequest{NodeId: tenant, Resource: "calls", Amount: 600}); err != nil {
		t.Fatal(err)
	}
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
	if used := node(t, op, govtest.Tenant).GetUsed()["calls"]; used != 605 {
		t.Fatalf("the tenant's calls used %d after 600 and 5 requests, want 605: charged per request, nothing reserved", used)
	}

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

// TestRateSliceAdmitsLocally: a quiet rate of 40/s is delegated as a slice
// (10/s, burst 10: half of what is left of half the refill and size) with
// the units of the first top-up; requests then spend from the slice's
// bucket with no call, at most its burst and its refill, and the rest are
// charged per request; all 30 fit the rate at once. Idle, the slice goes
// back to governord.
func TestRateSliceAdmitsLocally(t *testing.T) {
	srv := govtest.Start(t, func(c *serverconfig.Config) {
		c.Tenants[0].Rates = map[string]engine.Rate{"calls": {Units: 40, Per: int64(time.Second)}}
	})
	m := budget.NewMetrics()
	a := start(t, srv, govtest.TenantKey, governor.Spec{Name: "sliced"}, func(c *budget.Config) {
		c.Metrics = m
		c.Linger = 300 * time.Millisecond
	})
	reg := prometheus.NewRegistry()
	if err := m.Register(reg, a); err != nil {
		t.Fatal(err)
	}
	r := admission.Request{Charges: map[string]int64{"calls": 1}}
	began := time.Now()
	for i := range 30 {
		if _, err := a.Admit(context.Background(), r); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	took := time.Since(began)
	local := gathered(t, reg, "governor_proxy_rate_slice_admitted_total", "")
	most := 10 + 10*took.Seconds()
	if local < 1 || local > most {
		t.Fatalf("%v of 30 requests admitted from the slice in %v; want 1 to %.1f (its burst and refill)", local, took, most)
	}
	if n := gathered(t, reg, "governor_proxy_topups_total", "slice"); n < 1 {
		t.Fatalf("%v top-ups came back with a slice", n)
	}
	eventually(t, "the idle slice given back", func() bool {
		return gathered(t, reg, "governor_proxy_topups_total", "slice_returned") >= 1
	})
	t.Logf("%v of 30 admitted from the slice in %v", local, took)
}

// gathered is the value of the series name in reg whose last label is
// label ("" for one with none), 0 when absent.
func gathered(t *testing.T, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, s := range mf.GetMetric() {
			ls := s.GetLabel()
			if label == "" || (len(ls) > 0 && ls[len(ls)-1].GetValue() == label) {
				return s.GetCounter().GetValue()
			}
		}
	}
	return 0
}
