package engine

import (
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
