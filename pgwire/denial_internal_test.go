package pgwire

import (
	"testing"

	"github.com/governor-project/governor/proxy/admission"
)

// TestRateIsItsOwnSQLState: a refusal for rate is told apart from a spent
// quota (53400, final) and from governord away (53000): 53300, counted as
// deny_rate.
func TestRateIsItsOwnSQLState(t *testing.T) {
	code, f := sqlState(&admission.Denial{Cause: admission.CauseRate})
	if code != "53300" || f != DenyRate || f.String() != "deny_rate" {
		t.Fatalf("rate: %s %v, want 53300 deny_rate", code, f)
	}
}
