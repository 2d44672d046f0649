package governorpb

import (
	"slices"
	"testing"
)

// The wire names are derived from the enumeration; these are the names
// clients, dashboards and usage records already know, which must not move.
func TestCauseWireNames(t *testing.T) {
	want := map[Cause]string{
		Cause_CAUSE_QUOTA:          "quota",
		Cause_CAUSE_WAIT_TIMEOUT:   "wait-timeout",
		Cause_CAUSE_UNAVAILABLE:    "unavailable",
		Cause_CAUSE_TASK_ENDED:     "task-ended",
		Cause_CAUSE_UNMATCHED:      "unmatched",
		Cause_CAUSE_BAD_REQUEST:    "bad-request",
		Cause_CAUSE_CANCELED:       "canceled",
		Cause_CAUSE_STOPPING:       "stopping",
		Cause_CAUSE_SUSPENDED:      "suspended",
		Cause_CAUSE_READ_ONLY:      "read-only",
		Cause_CAUSE_RATE:           "rate",
		Cause_CAUSE_BOUND:          "bound",
		Cause_CAUSE_WAIT_ABANDONED: "wait-abandoned",
	}
	for c, name := range want {
		if got := c.WireName(); got != name {
			t.Errorf("%v.WireName() = %q, want %q", c, got, name)
		}
	}
	if !slices.IsSorted(Causes()) {
		t.Errorf("Causes() = %v, not in order", Causes())
	}
	for _, c := range []Cause{Cause_CAUSE_UNSPECIFIED, 999, 1 << 30, 1<<31 - 1, -1 << 31, -1} {
		if _, ok := causeWireNames[c]; ok {
			t.Errorf("%d has a wire name", c)
		}
	}
	if got := Cause(999).WireName(); got != "cause(999)" {
		t.Errorf("an unknown cause reads %q", got)
	}
	if got := Cause_CAUSE_UNSPECIFIED.WireName(); got != "cause(0)" {
		t.Errorf("UNSPECIFIED reads %q", got)
	}
}

// Usage records count a spent quota by its resource, and every other
// cause by its name alone.
func TestCauseUsageName(t *testing.T) {
	for _, c := range []struct {
		cause    Cause
		resource string
		want     string
	}{
		{Cause_CAUSE_QUOTA, "tokens", "quota:tokens"},
		{Cause_CAUSE_QUOTA, "", "quota"},
		{Cause_CAUSE_BOUND, "tokens", "bound"},
		{Cause_CAUSE_TASK_ENDED, "", "task-ended"},
		{Cause_CAUSE_WAIT_ABANDONED, "", "wait-abandoned"},
	} {
		if got := c.cause.UsageName(c.resource); got != c.want {
			t.Errorf("%v.UsageName(%q) = %q, want %q", c.cause, c.resource, got, c.want)
		}
	}
}
