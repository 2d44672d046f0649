package engine

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// The spec's constants, written as SPEC.md states them. These tests never
// use the code's own constants to move the clock or count, so a changed
// constant fails here instead of moving the test along with it.

func TestSpecTombstoneLastsOneMinute(t *testing.T) {
	f := newFixture(t)
	g, _, err := f.e.Acquire(f.sA, AcquireRequest{Node: f.job, Class: "db"})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.e.Release(f.sA, g.Lease, 0, false, ""); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(60*time.Second - time.Nanosecond)
	if _, err := f.e.Heartbeat(f.sA); err != nil {
		t.Fatal(err)
	}
	if err := f.e.Release(f.sA, g.Lease, 0, false, ""); err != nil {
		t.Errorf("a second release a nanosecond before the minute is up: %v; want the tombstone's no-op", err)
	}
	f.clock.Advance(time.Nanosecond)
	if err := f.e.Release(f.sA, g.Lease, 0, false, ""); !errors.Is(err, ErrNotFound) {
		t.Errorf("a second release once the minute is up: %v; want ErrNotFound", err)
	}
}

func TestSpecRequestMemoryHolds1024IDs(t *testing.T) {
	f := newFixture(t)
	for i := range 1025 { // r0 .. r1024: r0 is pushed out
		if err := f.e.Consume(f.sA, f.job, "tokens", 1, fmt.Sprintf("r%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	seq := f.e.Seq()
	if err := f.e.Consume(f.sA, f.job, "tokens", 2, "r1"); !errors.Is(err, ErrRequestIDReused) {
		t.Errorf("r1, the oldest of the last 1,024, with other arguments: %v; want ErrRequestIDReused", err)
	}
	if err := f.e.Consume(f.sA, f.job, "tokens", 2, "r0"); err != nil || f.e.Seq() == seq {
		t.Errorf("r0, the 1,025th from last, with other arguments: %v, emitted %v; want it decided afresh", err, f.e.Seq() != seq)
	}
}

func TestSpecAdaptiveCutIs70Percent(t *testing.T) {
	clock := newFakeClock()
	e, err := New(Config{Clock: clock, Adaptive: []Adaptive{{Class: "llm", TargetP95: time.Millisecond,
		MinLimit: 1, MaxLimit: 10, MinSamples: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	root, err := e.OpenSession(RootID, "op", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	v, err := e.CreateNode(System, RootID, NodeSpec{Name: "t"}, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []int64{7, 4, 2, 1, 1} { // 10 x 0.7 = 7, 7 x 0.7 = 4.9, 4 x 0.7 = 2.8, 2 x 0.7 = 1.4, then the floor
		g, _, err := e.Acquire(root, AcquireRequest{Node: v.ID, Class: "llm"})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Release(root, g.Lease, time.Second, false, ""); err != nil {
			t.Fatal(err)
		}
		clock.Advance(time.Second)
		e.Reap()
		if got, _ := e.AdaptiveLimit("llm"); got != want {
			t.Fatalf("limit %d after a slow interval; want %d", got, want)
		}
	}
}

func TestSpecSliceTermIsFourSeconds(t *testing.T) {
	f := newFixture(t)
	f.setCaps(f.acme, CapsEdit{Rates: map[string]Rate{"calls": {Units: 40, Per: int64(time.Second)}}})
	res := f.reserve(f.sA, ReserveRequest{Node: f.job, Resource: "calls", Want: 1})
	if res.Slice == nil || res.Slice.Left != 4*time.Second {
		t.Fatalf("slice %+v; want a term of 4s", res.Slice)
	}
	f.clock.Advance(4*time.Second - time.Nanosecond)
	f.e.Reap()
	if len(f.e.slices) != 1 {
		t.Fatal("the slice ended a nanosecond before its term")
	}
	f.clock.Advance(time.Nanosecond)
	f.e.Reap()
	if len(f.e.slices) != 0 {
		t.Fatal("the slice outlived its term of 4s")
	}
}
