package engine

import (
	"errors"
	"fmt"
	"reflect"
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
		dr, err := f.e.DryRun(f.sA, r, false)
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
	if _, err := f.e.DryRun(f.sA, AcquireRequest{Node: f.otherJob}, false); !errors.Is(err, ErrNotFound) {
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

// Shadow decides against what is spent plus what earlier shadow requests
// would have charged, records what it would admit (and nothing else),
// leaves real requests alone, remembers its request ids, bounds the
// ledger's names like a tenant's own, and the ledger is state: a snapshot
// and a replay bring it back.
func TestShadowLedgerIsTheEnforcedRun(t *testing.T) {
	f := newRetentionFixture(t, func(c *Config) {
		c.TenantBounds = map[string]Bounds{"acme": {Resources: 3}}
	})
	f.setCaps(f.job, CapsEdit{Quotas: map[string]int64{"tokens": 10}})
	f.consume(f.sA, f.job, "tokens", 4)
	shadow := func(node NodeID, amount int64, rid string) DryRun {
		t.Helper()
		dr, err := f.e.Shadow(f.sA, AcquireRequest{Node: node, Charges: map[string]int64{"tokens": amount}}, rid)
		if err != nil {
			t.Fatal(err)
		}
		return dr
	}
	// 4 spent: 3 and 3 fit (the ledger reaches 6), a third 1 does not.
	for i, amount := range []int64{3, 3} {
		if dr := shadow(f.step, amount, fmt.Sprintf("s%d", i)); dr.Err != nil {
			t.Fatalf("shadow %d: %v", i, dr.Err)
		}
	}
	seq := f.e.Seq()
	var d *Denial
	if dr := shadow(f.step, 1, ""); !errors.As(dr.Err, &d) || d.Node != f.job || d.Used != 10 || d.Limit != 10 {
		t.Fatalf("past the ledger: %+v, want a denial on job with 10 of 10 used (4 spent, 6 in the ledger)", dr)
	}
	if f.e.Seq() != seq {
		t.Fatal("a refused shadow request emitted events")
	}
	// A retry records nothing more; the same id with other charges is refused.
	if dr := shadow(f.step, 3, "s1"); dr.Err != nil || f.e.Seq() != seq {
		t.Fatalf("a retry: %+v, events %d -> %d", dr, seq, f.e.Seq())
	}
	if _, err := f.e.Shadow(f.sA, AcquireRequest{Node: f.step, Charges: map[string]int64{"tokens": 2}}, "s1"); !errors.Is(err, ErrRequestIDReused) {
		t.Fatalf("a reused id: %v", err)
	}
	// Real work ignores the ledger: the 6 left are still there for it, and
	// a plain DryRun answers as real work would.
	if dr, _ := f.e.DryRun(f.sA, AcquireRequest{Node: f.step, Charges: map[string]int64{"tokens": 6}}, false); dr.Err != nil {
		t.Fatalf("a dry run counted the shadow ledger: %v", dr.Err)
	}
	// Counting it, without recording: what the shadow rule's next request
	// would get.
	seq = f.e.Seq()
	if dr, _ := f.e.DryRun(f.sA, AcquireRequest{Node: f.step, Charges: map[string]int64{"tokens": 1}}, true); !errors.Is(dr.Err, ErrQuotaExhausted) || f.e.Seq() != seq {
		t.Fatalf("a dry run counting the ledger: %v", dr.Err)
	}
	f.consume(f.sA, f.step, "tokens", 6)
	for _, id := range []NodeID{f.step, f.job, f.acme, RootID} {
		if got := f.node(id).Shadow["tokens"]; got != 6 {
			t.Fatalf("node %d's shadow ledger: %d tokens, want 6", id, got)
		}
	}
	// The ledger's names are bounded: acme knows tokens; two more fit, a
	// fourth name does not.
	if _, err := f.e.Shadow(f.sA, AcquireRequest{Node: f.job, Charges: map[string]int64{"a": 1, "b": 1}}, ""); err != nil {
		t.Fatal(err)
	}
	seq = f.e.Seq()
	if _, err := f.e.Shadow(f.sA, AcquireRequest{Node: f.job, Charges: map[string]int64{"c": 1}}, ""); !errors.Is(err, ErrBound) || f.e.Seq() != seq {
		t.Fatalf("a fourth name in the ledger: %v", err)
	}
	live := f.e.Snapshot()
	for _, way := range []string{wayRestore, wayReplay} {
		if got := f.rebuild(t, way).Snapshot(); !reflect.DeepEqual(got, live) {
			t.Errorf("%s differs:\n%s", way, diffSnapshots(live, got))
		}
	}
}
