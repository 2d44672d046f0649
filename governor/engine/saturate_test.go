package engine

import (
	"errors"
	"math"
	"testing"
)

// One tenant's hostile amounts refuse nothing of another's: the root,
// which every tenant shares, saturates where it caps nothing (I24), so a
// tenant that charges 2^63-1 units, blocks 2^63-1 slots or records them in
// its shadow ledger leaves every other tenant's work as it was.
func TestATenantsAmountsRefuseNoOtherTenant(t *testing.T) {
	tokens := func(a int64) map[string]int64 { return map[string]int64{"tokens": a} }
	f, _ := delegationFixture(t)
	// Tenant acme drives every root counter it can reach to MaxInt64.
	recordShadow(f, math.MaxInt64)
	f.consume(f.sA, f.job, "tokens", math.MaxInt64)
	f.block(f.sA, f.job, "db", math.MaxInt64, 0)
	if err := f.e.Consume(f.sA, f.job2, "tokens", 1, ""); !errors.Is(err, ErrInvalid) {
		t.Errorf("acme's own next token: %v, want invalid (its own counter is full)", err)
	}

	// Tenant other works as if acme were idle.
	if err := f.e.Consume(f.sB, f.otherJob, "tokens", 5, ""); err != nil {
		t.Errorf("other's consume: %v", err)
	}
	if g, _, err := f.e.Acquire(f.sB, AcquireRequest{Node: f.otherJob, Class: "db", Charges: tokens(2)}); err != nil || g.Lease == 0 {
		t.Errorf("other's acquire: %+v, %v; want a lease at once", g, err)
	}
	if g := f.block(f.sB, f.otherJob, "db", 3, 0); g.Granted != 3 {
		t.Errorf("other's block got %d slots, want 3", g.Granted)
	}
	if r := f.reserve(f.sB, ReserveRequest{Node: f.otherJob, Resource: "tokens", Want: 4, Exact: true}); r.Granted != 4 {
		t.Errorf("other's exact reservation got %d, want 4", r.Granted)
	}
	if dr, err := f.e.Shadow(f.sB, AcquireRequest{Node: f.otherJob, Charges: tokens(7)}, ""); err != nil || dr.Err != nil {
		t.Errorf("other's shadow request: %v %v", err, dr.Err)
	}
	if used := f.node(f.other).Used["tokens"]; used != 7 {
		t.Errorf("other used %d tokens, want 7", used)
	}

	// The root reads at least MaxInt64, and a hard cap set on it now finds
	// it full: it fails closed.
	root := f.node(RootID)
	if root.Used["tokens"] != math.MaxInt64 || root.Held["db"] != math.MaxInt64 {
		t.Errorf("the root counts %d tokens and %d slots, want MaxInt64 of each", root.Used["tokens"], root.Held["db"])
	}
	f.setCaps(RootID, CapsEdit{Quotas: tokens(math.MaxInt64)})
	if err := f.e.Consume(f.sB, f.otherJob, "tokens", 1, ""); !errors.Is(err, ErrQuotaExhausted) {
		t.Errorf("a consume under a root cap of MaxInt64 on a saturated count: %v, want the quota denied", err)
	}
	if bad := counterErrors(f.e); len(bad) > 0 {
		t.Error(bad)
	}
}
