package engine

import (
	"errors"
	"testing"
	"time"
)

// A dry run answers what Acquire would, and changes nothing: no event, no
// charge, no lease, no waiter, and a node past its deadline is not ended.
func TestDryRunDecidesAndChangesNothing(t *testing.T) {
	f := newFixture(t)
	f.setCaps(f.job, CapsEdit{Quotas: map[string]int64{"tokens": 5}, Limits: map[string]int64{"db": 1}})
	f.consume(f.sA, f.job, "tokens", 5)
	f.acquire(f.sA, f.job, "db")
	seq := f.e.Seq()
	check := func(what string, r AcquireRequest, wantErr error, wantWait bool) {
		t.Helper()
		dr, err := f.e.DryRun(f.sA, r)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if (wantErr == nil) != (dr.Err == nil) || (wantErr != nil && !errors.Is(dr.Err, wantErr)) || dr.Wait != wantWait {
			t.Fatalf("%s: %+v, want err %v wait %v", what, dr, wantErr, wantWait)
		}
		if f.e.Seq() != seq {
			t.Fatalf("%s: a dry run emitted events %d..%d", what, seq+1, f.e.Seq())
		}
	}
	check("a spent quota", AcquireRequest{Node: f.step, Charges: map[string]int64{"tokens": 1}}, ErrQuotaExhausted, false)
	check("a full limit", AcquireRequest{Node: f.step, Class: "db"}, nil, true)
	check("room", AcquireRequest{Node: f.job2, Class: "db", Charges: map[string]int64{"tokens": 1}}, nil, false)
	dl := f.now() + int64(time.Second)
	f.setCaps(f.job2, CapsEdit{Deadline: &dl})
	seq = f.e.Seq()
	f.clock.Advance(2 * time.Second)
	check("past a deadline", AcquireRequest{Node: f.job2}, ErrTaskEnded, false)
	if v := f.node(f.job2); v.State != Open {
		t.Fatalf("a dry run ended node %d: %s", f.job2, v.State)
	}
	if _, err := f.e.DryRun(f.sA, AcquireRequest{Node: f.otherJob}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a dry run outside the scope: %v", err)
	}
	admin := f.open(RootID, longTTL)
	seq = f.e.Seq()
	if _, err := f.e.SetTenantState(admin, f.acme, ReadOnly, "", false, ""); err != nil {
		t.Fatal(err)
	}
	seq = f.e.Seq()
	check("a write while read_only", AcquireRequest{Node: f.job, Write: true}, ErrTenantState, false)
}
