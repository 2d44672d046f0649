package engine

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// Tests that close gaps scripts/engine-mutation.sh found (docs/engine-mutation.md).

// An interval with more releases than the sample window holds decides on
// the newest 4,096: slow calls pushed out by fast ones no longer count.
func TestAdaptiveWindowKeepsTheNewestSamples(t *testing.T) {
	f := newBareFixture(t, Adaptive{Class: "llm", TargetP95: 10 * time.Millisecond, MinLimit: 1, MaxLimit: 10, MinSamples: 1})
	s := f.open(RootID, longTTL)
	// One batch, so that no early cut sees the slow calls alone.
	calls := make([]Sample, 4096+4096+7)
	for i := range calls {
		calls[i] = Sample{Latency: time.Millisecond}
		if i < 4096 {
			calls[i].Latency = time.Second
		}
	}
	if err := f.e.Observe(s, "llm", calls); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(time.Second)
	f.e.Reap()
	if got, _ := f.e.AdaptiveLimit("llm"); got != 10 {
		t.Errorf("limit %d after an interval whose newest 4,096 calls were fast; want it kept at its max, 10", got)
	}
}

// A call that took no measurable time is a sample like any other.
func TestObserveAcceptsAZeroLatency(t *testing.T) {
	f := newBareFixture(t, Adaptive{Class: "llm", TargetP95: 10 * time.Millisecond, MinLimit: 1, MaxLimit: 10})
	s := f.open(RootID, longTTL)
	if err := f.e.Observe(s, "llm", []Sample{{Latency: 0}}); err != nil {
		t.Errorf("a sample of 0 s: %v", err)
	}
}

// A bound's message names the name that would be one more, and only then.
func TestBoundErrorNamesTheNameItRefused(t *testing.T) {
	named := (&BoundError{Tenant: "acme", Bound: BoundClasses, Limit: 1, Name: "http"}).Error()
	if !strings.Contains(named, `"http" would be one more`) {
		t.Errorf("%q does not name the class it refused", named)
	}
	unnamed := (&BoundError{Tenant: "acme", Bound: BoundNodes, Limit: 3}).Error()
	if strings.Contains(unnamed, "would be one more") {
		t.Errorf("%q names a name where there is none", unnamed)
	}
}

// A block request with a negative want or return is refused, whichever is
// negative.
func TestBlockRefusesANegativeWantOrReturn(t *testing.T) {
	f := newFixture(t)
	f.setCaps(RootID, CapsEdit{Limits: map[string]int64{"db": 3}})
	for _, r := range []BlockRequest{{Node: f.job, Class: "db", Want: -1}, {Node: f.job, Class: "db", Return: -1}} {
		if _, err := f.e.Block(f.sA, r); !errors.Is(err, ErrInvalid) {
			t.Errorf("Block(want %d, return %d): %v, want ErrInvalid", r.Want, r.Return, err)
		}
	}
}

// A block's answer says whether its class is adaptive, when it grows, when
// it shrinks, and when a retry finds the first answer.
func TestBlockGrantSaysWhetherTheClassIsAdaptive(t *testing.T) {
	f := newFixture(t, psp)
	f.setCaps(RootID, CapsEdit{Limits: map[string]int64{"db": 3}})
	for _, tt := range []struct {
		class    string
		adaptive bool
	}{{"psp", true}, {"db", false}} {
		grow := BlockRequest{Node: f.job, Class: tt.class, Want: 2, RequestID: "grow-" + tt.class}
		for _, what := range []string{"grows", "is retried"} {
			g, err := f.e.Block(f.sA, grow)
			if err != nil || g.Adaptive != tt.adaptive {
				t.Errorf("a block of %s %s: Adaptive %v, %v; want %v", tt.class, what, g.Adaptive, err, tt.adaptive)
			}
		}
		if g := f.block(f.sA, f.job, tt.class, 0, 1); g.Adaptive != tt.adaptive {
			t.Errorf("a block of %s shrinks: Adaptive %v, want %v", tt.class, g.Adaptive, tt.adaptive)
		}
		if g := f.block(f.sA, f.job, tt.class, 1, 0); g.Adaptive != tt.adaptive {
			t.Errorf("a block of %s grows again: Adaptive %v, want %v", tt.class, g.Adaptive, tt.adaptive)
		}
	}
}

// A request id that grew a block cannot be used again to shrink it by as
// much: they are different requests.
func TestBlockRequestIDReusedTheOtherWay(t *testing.T) {
	f := newFixture(t)
	f.setCaps(RootID, CapsEdit{Limits: map[string]int64{"db": 3}})
	if _, err := f.e.Block(f.sA, BlockRequest{Node: f.job, Class: "db", Want: 2, RequestID: "r"}); err != nil {
		t.Fatal(err)
	}
	_, err := f.e.Block(f.sA, BlockRequest{Node: f.job, Class: "db", Return: 2, RequestID: "r"})
	wantErr(t, err, ErrRequestIDReused)
}

// A denial on a cap nothing has used yet names no consumer, and in
// particular not another tenant.
func TestDenialOfAnUnusedCapNamesNoConsumer(t *testing.T) {
	d := &Denial{Resource: "tokens", NodeName: "job", Node: 3, Limit: 0, Amount: 1}
	if msg := d.Error(); strings.Contains(msg, OtherTenant) || strings.Contains(msg, `""`) {
		t.Errorf("%q", msg)
	}
	d.Largest = Consumer{Name: OtherTenant}
	if msg := d.Error(); !strings.HasSuffix(msg, "; largest consumer: "+OtherTenant) {
		t.Errorf("%q does not say another tenant", msg)
	}
}

// Event kinds print their names, and a kind without one prints its number.
func TestEventKindNames(t *testing.T) {
	for k, want := range map[EventKind]string{EvSessionOpened: "session_opened", EvNodesReclaimed: "nodes_reclaimed",
		0: "kind(0)", EventKind(len(kindNames)): fmt.Sprintf("kind(%d)", len(kindNames)), 255: "kind(255)"} {
		if got := k.String(); got != want {
			t.Errorf("EventKind(%d) = %q, want %q", uint8(k), got, want)
		}
	}
}
