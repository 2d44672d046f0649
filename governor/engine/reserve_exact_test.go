package engine

import (
	"errors"
	"testing"
)

// Exact reservations: the hold of one call's estimate, all or nothing.

func TestExactReservationHoldsAllOfWantOrNothing(t *testing.T) {
	f, _ := delegationFixture(t)
	f.setCaps(f.acme, CapsEdit{Quotas: map[string]int64{"tokens": 1000}})

	// Not a quarter of the headroom, as a top-up would be: all of it.
	res := f.reserve(f.sA, ReserveRequest{Node: f.job, Resource: "tokens", Want: 800, Exact: true})
	if res.Granted != 800 || res.Reserved != 800 {
		t.Fatalf("exact reservation of 800 of 1000: %+v, want all 800", res)
	}
	// 200 are left, and the first hold is in the way of 300 more: as for a
	// consume of 300, its holder is told to give back what it can.
	_, err := f.e.Reserve(f.sA, ReserveRequest{Node: f.job2, Resource: "tokens", Want: 300, Exact: true})
	if !errors.Is(err, ErrRecalling) {
		t.Fatalf("an exact hold that fits only without the other reservation: %v, want ErrRecalling", err)
	}
	// Settled to what the call used: 150 spent, 650 back.
	res = f.reserve(f.sA, ReserveRequest{Node: f.job, Resource: "tokens", Spent: 150, Return: 650})
	if res.Reserved != 0 {
		t.Fatalf("after settling the hold: %+v, want nothing reserved", res)
	}
	if v := f.node(f.acme); v.Used["tokens"] != 150 || v.Reserved["tokens"] != 0 {
		t.Fatalf("acme after the settlement: used %d reserved %d, want 150 and 0", v.Used["tokens"], v.Reserved["tokens"])
	}
	f.consume(f.sB, f.otherJob, "tokens", 1) // another tenant: unaffected
	f.consume(f.sA, f.job2, "tokens", 800)
	_, err = f.e.Reserve(f.sA, ReserveRequest{Node: f.job, Resource: "tokens", Want: 51, Exact: true})
	var d *Denial
	if !errors.As(err, &d) || d.Node != f.acme || d.Used != 950 || d.Limit != 1000 {
		t.Fatalf("an exact hold of 51 with 50 left: %v, want a denial on acme at 950 of 1000", err)
	}
	if v := f.node(f.acme); v.Used["tokens"] != 950 || v.Reserved["tokens"] != 0 {
		t.Fatalf("a refused exact hold changed acme: used %d reserved %d", v.Used["tokens"], v.Reserved["tokens"])
	}
	// Where a top-up would get a share (50/4 = 12), an exact hold of the
	// whole 50 gets all of it.
	if res := f.reserve(f.sA, ReserveRequest{Node: f.job, Resource: "tokens", Want: 50, Exact: true}); res.Granted != 50 {
		t.Fatalf("an exact hold of the last 50: %+v", res)
	}
}

func TestExactReservationSettlesNothingInTheSameCall(t *testing.T) {
	f, _ := delegationFixture(t)
	f.setCaps(f.acme, CapsEdit{Quotas: map[string]int64{"tokens": 1000}})
	f.reserve(f.sA, ReserveRequest{Node: f.job, Resource: "tokens", Want: 10, Exact: true})
	for _, r := range []ReserveRequest{
		{Node: f.job, Resource: "tokens", Spent: 5, Want: 10, Exact: true},
		{Node: f.job, Resource: "tokens", Return: 5, Want: 10, Exact: true},
		{Node: f.job, Resource: "tokens", Spent: 5, Exact: true},
	} {
		if _, err := f.e.Reserve(f.sA, r); !errors.Is(err, ErrInvalid) {
			t.Errorf("Reserve(%+v): %v, want ErrInvalid", r, err)
		}
	}
}

func TestExactReservationRetryIsToldFromATopUpWithTheSameID(t *testing.T) {
	f, _ := delegationFixture(t)
	f.setCaps(f.acme, CapsEdit{Quotas: map[string]int64{"tokens": 1000}})
	r := ReserveRequest{Node: f.job, Resource: "tokens", Want: 400, Exact: true, RequestID: "call-1"}
	first := f.reserve(f.sA, r)
	again := f.reserve(f.sA, r) // a retry: the same answer, nothing more held
	if again.Granted != first.Granted || again.Reserved != 400 {
		t.Fatalf("retry of an exact hold: %+v, first %+v", again, first)
	}
	r.Exact = false // the same id with other arguments
	if _, err := f.e.Reserve(f.sA, r); !errors.Is(err, ErrRequestIDReused) {
		t.Fatalf("the id reused for a top-up: %v, want it refused", err)
	}
}
