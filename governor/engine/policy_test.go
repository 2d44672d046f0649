package engine

import (
	"errors"
	"reflect"
	"testing"
)

// A soft cap lets work go past the cap by up to its burst, each charge
// past the cap warned in its event, and refuses past cap plus burst as a
// hard cap does; a warn_only cap never refuses and warns of every charge a
// hard one would have refused. Both hold for quotas and for limits, and the
// modes survive a restore and a replay.
func TestCapModesSoftAndWarnOnly(t *testing.T) {
	f := newFixture(t)
	f.setCaps(f.job, CapsEdit{Quotas: map[string]int64{"tokens": 100, "calls": 3}, Limits: map[string]int64{"db": 1},
		QuotaModes: map[string]CapMode{"tokens": {Mode: ModeSoft, Burst: 20}, "calls": {Mode: ModeWarnOnly}},
		LimitModes: map[string]CapMode{"db": {Mode: ModeSoft, Burst: 1}}})

	// Soft: 100 within, 20 more with a warning, then refused.
	f.consume(f.sA, f.job, "tokens", 100)
	if w := f.rec.events[len(f.rec.events)-1].Warnings; w != nil {
		t.Fatalf("a charge up to the cap warns %v", w)
	}
	f.consume(f.sA, f.job, "tokens", 15)
	want := []Warning{{Node: f.job, Name: "tokens", Mode: ModeSoft, Used: 115, Cap: 100}}
	if w := f.rec.events[len(f.rec.events)-1].Warnings; !reflect.DeepEqual(w, want) {
		t.Fatalf("a charge past a soft cap warns %v, want %v", w, want)
	}
	err := f.e.Consume(f.sA, f.job, "tokens", 6, "")
	var d *Denial
	if !errors.As(err, &d) || d.Limit != 120 || d.Used != 115 {
		t.Fatalf("past cap plus burst: %v, want a denial at 115 of 120", err)
	}
	f.consume(f.sA, f.job, "tokens", 5) // exactly cap plus burst fits

	// Warn only: never refused, every charge past the cap warned.
	for i := int64(1); i <= 5; i++ {
		f.consume(f.sA, f.job, "calls", 1)
		got := f.rec.events[len(f.rec.events)-1].Warnings
		if i <= 3 && got != nil {
			t.Fatalf("call %d of a cap of 3 warns %v", i, got)
		}
		if i > 3 && (len(got) != 1 || got[0].Mode != ModeWarnOnly || got[0].Used != i) {
			t.Fatalf("call %d of a warn_only cap of 3 warns %v, want one would-be denial at %d", i, got, i)
		}
	}

	// A soft limit of 1 with a burst of 1: the second lease is granted with
	// a warning, the third queues.
	l1 := f.acquire(f.sA, f.job, "db")
	l2 := f.acquire(f.sA, f.job, "db")
	if w := f.rec.events[len(f.rec.events)-1].Warnings; len(w) != 1 || !w[0].Limit || w[0].Used != 2 {
		t.Fatalf("the second lease of a soft limit of 1 warns %v", w)
	}
	wt := f.enqueue(f.sA, f.job, "db")
	f.release(f.sA, l1)
	if o := <-wt.C; o.Err != nil {
		t.Fatal(o.Err)
	}
	_ = l2

	// Status: tokens at 120 of a soft 100+20 refuses more; calls over a
	// warn_only cap are soft exceeded; db holds 2 of 1+1.
	st, err := f.e.Status(f.sA, f.step)
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]Overage{}
	for _, s := range st {
		if s.Node == f.job {
			states[s.Name] = s.State
		}
	}
	if states["tokens"] != HardExceeded || states["calls"] != SoftExceeded || states["db"] != HardExceeded {
		t.Fatalf("states %v, want tokens and db hard_exceeded, calls soft_exceeded", states)
	}
	for _, way := range []string{wayRestore, wayReplay} {
		e := f.rebuild(t, way)
		v, err := e.Get(System, f.job)
		if err != nil {
			t.Fatal(err)
		}
		if v.QuotaModes["tokens"] != (CapMode{ModeSoft, 20}) || v.QuotaModes["calls"] != (CapMode{Mode: ModeWarnOnly}) ||
			v.LimitModes["db"] != (CapMode{ModeSoft, 1}) {
			t.Fatalf("%s: modes %v %v", way, v.QuotaModes, v.LimitModes)
		}
	}
}

// The near thresholds: within below the first, near from it (with the
// threshold reached), and a hard cap at its cap refuses more.
func TestCapStatusNearThresholds(t *testing.T) {
	f := newFixture(t)
	f.setCaps(f.job, CapsEdit{Quotas: map[string]int64{"tokens": 100}})
	for _, c := range []struct {
		add       int64
		state     Overage
		threshold int
		remaining int64
	}{{79, Within, 0, 21}, {1, Near, 80, 20}, {10, Near, 90, 10}, {10, HardExceeded, 90, 0}} {
		f.consume(f.sA, f.job, "tokens", c.add)
		st, err := f.e.Status(f.sA, f.job)
		if err != nil {
			t.Fatal(err)
		}
		if len(st) != 1 || st[0].State != c.state || st[0].Threshold != c.threshold || st[0].Remaining != c.remaining {
			t.Fatalf("after %d more: %+v, want %s at %d%% with %d remaining", c.add, st, c.state, c.threshold, c.remaining)
		}
	}
	if got := f.e.TenantOverage(); got["acme"] != Within || len(got) != 2 {
		t.Fatalf("TenantOverage %v: acme has no caps of its own, so it is within", got)
	}
	if _, err := New(Config{Near: []int{90, 80}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("thresholds out of order: %v", err)
	}
}

// A mode needs a cap, and removing the cap removes its mode; a burst is
// only for a soft cap; an override sets no modes.
func TestCapModesRefusals(t *testing.T) {
	f := newFixture(t)
	for _, edit := range []CapsEdit{
		{QuotaModes: map[string]CapMode{"tokens": {Mode: ModeSoft}}},
		{Quotas: map[string]int64{"tokens": NoCap}, QuotaModes: map[string]CapMode{"tokens": {Mode: ModeSoft}}},
		{Quotas: map[string]int64{"tokens": 5}, QuotaModes: map[string]CapMode{"tokens": {Mode: ModeHard, Burst: 3}}},
		{Limits: map[string]int64{"db": 5}, LimitModes: map[string]CapMode{"db": {Mode: 9}}},
	} {
		if _, err := f.e.SetCaps(System, f.job, edit, ""); !errors.Is(err, ErrInvalid) {
			t.Fatalf("SetCaps(%+v) = %v, want ErrInvalid", edit, err)
		}
	}
	f.setCaps(f.job, CapsEdit{Quotas: map[string]int64{"tokens": 5}, QuotaModes: map[string]CapMode{"tokens": {Mode: ModeWarnOnly}}})
	f.setCaps(f.job, CapsEdit{Quotas: map[string]int64{"tokens": NoCap}})
	f.setCaps(f.job, CapsEdit{Quotas: map[string]int64{"tokens": 5}})
	if m := f.node(f.job).QuotaModes; m != nil {
		t.Fatalf("a cap set again after its removal keeps the old mode %v", m)
	}
	_, err := f.e.SetCapsAudited(System, f.job, CapsEdit{Quotas: map[string]int64{"tokens": 5},
		QuotaModes: map[string]CapMode{"tokens": {Mode: ModeSoft}}}, Audit{For: 1e9}, "")
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("an override with a mode: %v", err)
	}
	if m, err := ParseMode("warn_only"); err != nil || m != ModeWarnOnly {
		t.Fatalf("ParseMode: %v %v", m, err)
	}
	if _, err := ParseMode("lenient"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("ParseMode(lenient): %v", err)
	}
}
