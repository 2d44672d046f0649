package admission

import (
	"slices"
	"strconv"
	"testing"
)

// The table of causes is the wire contract (docs/proxy.md, "What a denial
// looks like"): each cause's HTTP status, Governor-Denied word, retry
// headers and SQLSTATE, checked row by row against the contract as
// written, so that a row changed by mistake fails here and not in a
// client.
func TestTableOfCausesIsTheContract(t *testing.T) {
	for _, c := range []struct {
		cause Cause
		want  Wire
	}{
		{CauseQuota, Wire{"quota", 429, "false", RetryAfterNone, "53400"}},
		{CauseWaitTimeout, Wire{"wait-timeout", 503, "", RetryAfterSoon, "55P03"}},
		{CauseUnavailable, Wire{"unavailable", 503, "", RetryAfterSoon, "53000"}},
		{CauseStopping, Wire{"unavailable", 503, "", RetryAfterSoon, "53000"}},
		{CauseTaskEnded, Wire{"task-ended", 403, "false", RetryAfterNone, "53400"}},
		{CauseUnmatched, Wire{"unmatched", 403, "", RetryAfterNone, "53400"}},
		{CauseBadRequest, Wire{"bad-request", 400, "", RetryAfterNone, "22023"}},
		{CauseSuspended, Wire{"suspended", 403, "", RetryAfterNone, "53400"}},
		{CauseReadOnly, Wire{"read-only", 403, "", RetryAfterNone, "25006"}},
		{CauseRate, Wire{"rate", 429, "true", RetryAfterRate, "53300"}},
		{CauseCanceled, Wire{"", 503, "", RetryAfterNone, "53000"}},
	} {
		if got := c.cause.Wire(); got != c.want {
			t.Errorf("%v: %+v, want %+v", c.cause, got, c.want)
		}
		// The word on the wire is the cause's own name, but for the two
		// that read as something else to the client.
		if w := c.cause.Wire().Header; w != "" && w != c.cause.String() && c.cause != CauseStopping {
			t.Errorf("%v is sent as %q", c.cause, w)
		}
	}
	// Every cause has a row: one added without one fails here.
	for c := Cause(1); c.String() != "cause("+strconv.Itoa(int(c))+")"; c++ {
		if int(c) >= len(wires) || wires[c].Status == 0 {
			t.Errorf("%v has no row in the table", c)
		}
	}
	want := []string{"quota", "rate", "wait-timeout", "unavailable", "task-ended", "unmatched", "suspended", "read-only", "bad-request"}
	got := DeniedLabels()
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("denial labels %v, want %v", got, want)
	}
}
