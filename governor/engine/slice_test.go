package engine

import (
	"reflect"
	"testing"
	"time"
)

// rateLevel is what the bucket of r on node id holds now.
func (f *fixture) rateLevel(e *Engine, id NodeID, r string) int64 {
	f.t.Helper()
	st, err := e.RateStatus(System, id)
	if err != nil {
		f.t.Fatal(err)
	}
	for _, s := range st {
		if s.Node == id && s.Name == r {
			return s.Level
		}
	}
	f.t.Fatalf("no rate of %s on node %d", r, id)
	return 0
}

// TestSliceCarvesEveryBucket: a slice is sized by the rule (half of what
// is left of half of each bucket's refill, in the nearest bucket's
// period), carves each bucket at least its rate in that bucket's units
// and its burst from each level and size, and the buckets refill at the
// rest until it ends, when they refill whole again from that instant.
func TestSliceCarvesEveryBucket(t *testing.T) {
	f := newFixture(t)
	f.setCaps(RootID, CapsEdit{Rates: map[string]Rate{"calls": {Units: 1000, Per: int64(time.Minute)}}})
	f.setCaps(f.acme, CapsEdit{Rates: map[string]Rate{"calls": perSecond(100, 0)}})
	res := f.reserve(f.sA, ReserveRequest{Node: f.job, Resource: "calls", Want: 10})
	// acme: (50-0)/2 = 25/s; root: (500-0)/2 = 250/min = 4.17/s: 4/s.
	// Burst: min((100/2)/2, (1000/2)/2, the levels) = 25.
	want := Rate{Units: 4, Per: int64(time.Second), Burst: 25}
	if !res.Rated || res.Slice == nil || res.Slice.Rate != want || res.Slice.Left != SliceTerm || res.Granted != 10 {
		t.Fatalf("reserve: %+v slice %+v; want rated, 10 granted, a slice of %+v for %v", res, res.Slice, want, SliceTerm)
	}
	v := f.node(RootID).Rates["calls"]
	if len(v.Carves) != 1 || v.Carves[0].Units != 240 || v.Carves[0].Burst != 25 { // ceil(4 × 60)
		t.Fatalf("root's carves %+v; want 240 per minute, burst 25", v.Carves)
	}
	if lv := f.rateLevel(f.e, f.acme, "calls"); lv != 75 {
		t.Fatalf("acme holds %d after the burst went to the slice; want 75", lv)
	}
	f.consume(f.sA, f.job, "calls", 75)
	f.clock.Advance(500 * time.Millisecond)
	if lv := f.rateLevel(f.e, f.acme, "calls"); lv != 48 { // 96/s for 0.5 s
		t.Fatalf("acme refilled to %d in 500ms less the slice; want 48", lv)
	}
	// Given back at 500ms: the bucket is credited up to then at 96/s, and
	// refills at 100/s from then on, up to its whole size.
	f.reserve(f.sA, ReserveRequest{Node: f.job, Resource: "calls", EndSlice: true})
	f.clock.Advance(500 * time.Millisecond)
	if lv := f.rateLevel(f.e, f.acme, "calls"); lv != 98 {
		t.Fatalf("acme holds %d 500ms after the slice ended; want 48+50", lv)
	}
	if len(f.e.slices) != 0 || f.e.nodes[f.job].pins != 1 { // the reservation's
		t.Fatalf("the slice given back is still held: %d slices, %d pins", len(f.e.slices), f.e.nodes[f.job].pins)
	}
}

// TestSliceOnlyWithoutContention: a bucket below half of what it may
// hold is contended, and gets no slice and no renewal; a quiet one
// renews, and an unrenewed slice ends at its term, at Reap.
func TestSliceOnlyWithoutContention(t *testing.T) {
	f := newFixture(t)
	f.setCaps(f.acme, CapsEdit{Rates: map[string]Rate{"calls": perSecond(40, 0)}})
	sA2 := f.open(f.acme, longTTL)
	res := f.reserve(f.sA, ReserveRequest{Node: f.job, Resource: "calls", Want: 5})
	if res.Slice == nil || res.Slice.Rate.Units != 10 || res.Slice.Rate.Burst != 10 {
		t.Fatalf("first slice %+v; want 10/s, burst 10", res.Slice)
	}
	res = f.reserve(sA2, ReserveRequest{Node: f.job2, Resource: "calls", Want: 5})
	if res.Slice == nil || res.Slice.Rate.Units != 5 || res.Slice.Rate.Burst != 5 {
		t.Fatalf("second slice %+v; want 5/s (half of what is left of half), burst 5", res.Slice)
	}
	// 25 of 40 carved; the bucket holds 40-15 of 25: drained to 11, it is
	// contended (11 < 25/2).
	f.consume(f.sA, f.job, "calls", 14)
	f.clock.Advance(time.Second)
	if lv := f.rateLevel(f.e, f.acme, "calls"); lv != 25 {
		t.Fatalf("acme holds %d; want its room, 25", lv)
	}
	f.consume(f.sA, f.job, "calls", 13)
	before := f.e.Seq()
	res = f.reserve(f.sA, ReserveRequest{Node: f.job, Resource: "calls", Want: 5})
	if res.Granted != 0 || res.Slice == nil || res.Slice.Until != f.e.slices[res.Slice.ID].until || res.Slice.Left != SliceTerm-time.Second {
		t.Fatalf("top-up under contention: %+v slice %+v; want nothing granted, the slice not renewed", res, res.Slice)
	}
	if f.e.Seq() != before {
		t.Fatalf("a top-up that renewed nothing emitted %d events", f.e.Seq()-before)
	}
	f.clock.Advance(time.Second)
	res = f.reserve(sA2, ReserveRequest{Node: f.job2, Resource: "calls", Want: 5})
	if res.Slice == nil || res.Slice.Left != SliceTerm || res.Granted == 0 {
		t.Fatalf("a quiet renewal: %+v slice %+v; want the term renewed, units granted", res, res.Slice)
	}
	f.clock.Advance(SliceTerm - 2*time.Second)
	f.e.Reap()
	if len(f.e.slices) != 1 || len(f.e.sessions[f.sA].slices) != 0 {
		t.Fatalf("after the first slice's term: %d slices; want only the renewed one", len(f.e.slices))
	}
	if d, ok := f.e.DueIn(); !ok || d != 2*time.Second {
		t.Fatalf("DueIn %v %v; want the renewed slice's term end in 2s", d, ok)
	}
}

// TestSliceEndsWithItsSession: a slice never outlives its session: when
// the session expires mid-term, its slices end at the expiry's instant,
// their refill credited up to it at the carved rate.
func TestSliceEndsWithItsSession(t *testing.T) {
	f := newFixture(t)
	f.setCaps(f.acme, CapsEdit{Rates: map[string]Rate{"calls": perSecond(40, 0)}})
	short := f.open(f.acme, time.Second)
	res := f.reserve(short, ReserveRequest{Node: f.job, Resource: "calls", Want: 5})
	if res.Slice == nil || res.Slice.Left != SliceTerm {
		t.Fatalf("slice %+v", res.Slice)
	}
	f.consume(f.sA, f.job, "calls", 30) // 40 - 10 burst - 30 = 0
	f.clock.Advance(time.Second)        // 30/s under the slice
	f.e.Reap()
	if len(f.e.slices) != 0 || f.e.nodes[f.job].pins != 0 {
		t.Fatalf("the expired session's slice lives on: %d slices, %d pins", len(f.e.slices), f.e.nodes[f.job].pins)
	}
	f.clock.Advance(250 * time.Millisecond) // 40/s once it ended
	if lv := f.rateLevel(f.e, f.acme, "calls"); lv != 40 {
		t.Fatalf("acme holds %d; want 30 + 10", lv)
	}
}

// TestSliceSurvivesRestart: a restart mid-slice (snapshot and restore,
// or replay of every event) gives the same slice and the same refill, and
// ends it at the same term.
func TestSliceSurvivesRestart(t *testing.T) {
	f := newFixture(t)
	f.setCaps(RootID, CapsEdit{Rates: map[string]Rate{"calls": {Units: 90, Per: int64(3 * time.Second), Burst: 200}}})
	f.setCaps(f.acme, CapsEdit{Rates: map[string]Rate{"calls": perSecond(40, 0)}})
	f.reserve(f.sA, ReserveRequest{Node: f.step, Resource: "calls", Want: 5})
	f.consume(f.sA, f.job, "calls", 25)
	f.clock.Advance(1234567 * time.Microsecond)
	for _, way := range []string{wayRestore, wayReplay} {
		e := f.rebuild(t, way)
		if got, want := e.Snapshot(), f.e.Snapshot(); !reflect.DeepEqual(got, want) {
			t.Fatalf("%s mid-slice: %s", way, diffSnapshots(want, got))
		}
		for _, id := range []NodeID{f.acme, RootID} {
			if a, b := f.rateLevel(f.e, id, "calls"), f.rateLevel(e, id, "calls"); a != b {
				t.Fatalf("%s: node %d holds %d, the live engine %d", way, id, b, a)
			}
		}
	}
	f.clock.Advance(SliceTerm)
	f.e.Reap()
	for _, way := range []string{wayRestore, wayReplay} {
		e := f.rebuild(t, way)
		if got, want := e.Snapshot(), f.e.Snapshot(); !reflect.DeepEqual(got, want) || len(e.slices) != 0 {
			t.Fatalf("%s after the term: %s", way, diffSnapshots(want, got))
		}
	}
}

// TestSliceRestoreRefusesCorruptCarves: a carve whose slice is nowhere,
// or a bucket holding more than its slices leave, is a corrupt snapshot.
func TestSliceRestoreRefusesCorruptCarves(t *testing.T) {
	f := newFixture(t)
	f.setCaps(f.acme, CapsEdit{Rates: map[string]Rate{"calls": perSecond(40, 0)}})
	f.reserve(f.sA, ReserveRequest{Node: f.job, Resource: "calls", Want: 5})
	for name, spoil := range map[string]func(*Snapshot){
		"a carve with no slice": func(s *Snapshot) {
			for i := range s.Sessions {
				s.Sessions[i].Slices = nil
			}
		},
		"a level past the room": func(s *Snapshot) {
			for i := range s.Nodes {
				if b, ok := s.Nodes[i].Rates["calls"]; ok {
					b.Level = 40
					s.Nodes[i].Rates["calls"] = b
				}
			}
		},
	} {
		snap := cloneSnapshot(t, f.e.Snapshot())
		spoil(&snap)
		e, _ := New(Config{Clock: f.clock})
		if err := e.Restore(snap); err == nil {
			t.Errorf("%s: restored", name)
		}
	}
}

// TestSliceFleetBound plays three sidecars for two minutes of fake time in
// steps of a millisecond: each admits from its slice's local bucket while
// the slice lives (until its term as the answer said), charges governord
// per request otherwise, and renews its slice every second; the load is
// light for a while (slices live and are renewed), then a flood (slices
// end under contention), then light again. In every window of 1 ms to
// 20 s the fleet admits at most rate × window + burst.
func TestSliceFleetBound(t *testing.T) {
	f := newFixture(t)
	rate := Rate{Units: 50, Per: int64(time.Second), Burst: 30}
	f.setCaps(f.acme, CapsEdit{Rates: map[string]Rate{"calls": rate}})
	type sidecar struct {
		sid   SessionID
		node  NodeID
		local *bucket
		id    uint64
		until int64
		asked int64
	}
	cars := []*sidecar{{sid: f.sA, node: f.job}, {sid: f.open(f.acme, longTTL), node: f.job2}, {sid: f.open(f.acme, longTTL), node: f.step}}
	const steps = 120_000
	admitted := make([]int64, steps+1)
	var local, direct int
	for step := range steps {
		now := f.now()
		flood := step >= 40_000 && step < 80_000
		for i, c := range cars {
			if c.asked == 0 || now-c.asked >= int64(time.Second) {
				c.asked = now
				res := f.reserve(c.sid, ReserveRequest{Node: c.node, Resource: "calls", Want: 1})
				if s := res.Slice; s != nil {
					if s.ID != c.id {
						c.id, c.local = s.ID, &bucket{Rate: s.Rate, level: s.Rate.Burst, stamp: now}
					}
					c.until = now + int64(s.Left)
				}
			}
			want := (step+i*7)%100 == 0 // 10/s each
			if flood {
				want = true
			}
			if !want {
				continue
			}
			if c.local != nil && now < c.until {
				if lv, _ := c.local.at(now); lv >= 1 {
					c.local.take(1, now)
					admitted[step]++
					local++
					continue
				}
			}
			if f.e.Consume(c.sid, c.node, "calls", 1, "") == nil {
				admitted[step]++
				direct++
			}
		}
		f.clock.Advance(time.Millisecond)
		f.e.Reap()
	}
	if local == 0 || direct == 0 {
		t.Fatalf("admitted %d from slices and %d per request; want both", local, direct)
	}
	sum := make([]int64, steps+1)
	for i := range steps {
		sum[i+1] = sum[i] + admitted[i]
	}
	for _, w := range []int{1, 10, 100, 1000, 2500, 10_000, 20_000} {
		bound := int64(w)*rate.Units/1000 + rate.Burst
		for start := 0; start+w <= steps; start++ {
			if got := sum[start+w] - sum[start]; got > bound {
				t.Fatalf("%d admitted in the %d ms from %d ms; the rate allows %d", got, w, start, bound)
			}
		}
	}
	t.Logf("admitted %d from slices, %d per request", local, direct)
}

// TestSliceWaitCountsItsTerm: a charge that only fits once a slice's carve
// ends is told to retry when it does fit: at the slice's term, when the
// reaper ends it, plus the refill at the whole rate from then; not at the
// carved refill, which the carved room could never hold. A bucket's
// "full in" counts the term the same way.
func TestSliceWaitCountsItsTerm(t *testing.T) {
	f := newFixture(t)
	f.setCaps(f.acme, CapsEdit{Rates: map[string]Rate{"calls": perSecond(100, 0)}})
	res := f.reserve(f.sA, ReserveRequest{Node: f.job, Resource: "calls", Want: 10})
	if res.Slice == nil || res.Slice.Rate.Units != 25 || res.Slice.Rate.Burst != 25 {
		t.Fatalf("reserve: %+v; want a slice of 25/s holding 25", res.Slice)
	}
	f.consume(f.sA, f.job2, "calls", 75) // the room the slice leaves, emptied
	// 90 fits the size (100), not the room (75): the term ends in 4s, with
	// 75 there by then; 15 more at 100/s take 150ms.
	for _, way := range []string{wayLive, wayRestore, wayReplay} { // the term is state
		rateErr(t, f.rebuild(t, way).Consume(f.sA, f.job, "calls", 90, ""), f.acme, SliceTerm+150*time.Millisecond)
	}
	if st := f.rates(f.acme); st[0].Full != SliceTerm+250*time.Millisecond {
		t.Fatalf("acme is full in %v; want the term and 250ms", st[0].Full)
	}
	f.clock.Advance(SliceTerm)
	f.e.Reap() // as DueIn asks: the term ends
	if len(f.e.slices) != 0 {
		t.Fatal("the slice outlived its term")
	}
	f.clock.Advance(150*time.Millisecond - 1)
	rateErr(t, f.e.Consume(f.sA, f.job, "calls", 90, ""), f.acme, 1)
	f.clock.Advance(1)
	f.consume(f.sA, f.job, "calls", 90)
}
