package admission

import (
	"net/http"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor"
)

// Wire is how a refusal of one cause reads to a client, on each side of the
// sidecar. The table of causes (wires) is the one place a cause gets its
// HTTP status, headers and SQLSTATE: package httpproxy and package pgwire
// render from it, and the metrics of denials take their label values from
// it, so a new cause is one value in governor.proto and one row here, keyed
// by the generated constant (governorpb.Cause_CAUSE_...).
type Wire struct {
	// Header is the Governor-Denied value and the metrics' cause label; a
	// cause that is not the sidecar's answer (canceled: the client went
	// away) sends none, and is counted as canceled.
	Header string
	// Status is the HTTP status.
	Status int
	// ShouldRetry is x-should-retry ("true", "false"), read by the OpenAI
	// and Anthropic SDKs; "" sends none.
	ShouldRetry string
	// RetryAfter says what Retry-After is sent.
	RetryAfter RetryAfter
	// SQLState is the SQLSTATE of the ERROR a SQL client gets.
	SQLState string
}

// RetryAfter is the Retry-After a denial carries.
type RetryAfter uint8

const (
	RetryAfterNone RetryAfter = iota // no Retry-After
	RetryAfterSoon                   // 1 second: the client will queue again anyway
	RetryAfterRate                   // the seconds until the rate has room (Denial.Rate)
)

// The SQLSTATEs of denials (docs/proxy.md, the table of denials). Several
// causes share a code: a SQL client tells them apart by the message.
const (
	SQLStateLimitExceeded = "53400" // configuration_limit_exceeded: quota spent, task ended, tenant suspended
	SQLStateLockWait      = "55P03" // lock_not_available: waited past wait_timeout
	SQLStateUnavailable   = "53000" // insufficient_resources: governord unreachable, the proxy stopping
	SQLStateBadRequest    = "22023" // invalid_parameter_value: an application_name the proxy refuses
	SQLStateReadOnly      = "25006" // read_only_sql_transaction: a write while the tenant is read-only
	SQLStateRate          = "53300" // too_many_connections, the closest standard code for "too much, too fast": over a rate, try again
)

// wires is the table: one row per cause.
var wires = [...]Wire{
	CauseQuota:       {"quota", http.StatusTooManyRequests, "false", RetryAfterNone, SQLStateLimitExceeded},
	CauseRate:        {"rate", http.StatusTooManyRequests, "true", RetryAfterRate, SQLStateRate},
	CauseWaitTimeout: {"wait-timeout", http.StatusServiceUnavailable, "", RetryAfterSoon, SQLStateLockWait},
	CauseUnavailable: {"unavailable", http.StatusServiceUnavailable, "", RetryAfterSoon, SQLStateUnavailable},
	// Shutting down reads as governord being away: to the client, it is.
	CauseStopping:   {"unavailable", http.StatusServiceUnavailable, "", RetryAfterSoon, SQLStateUnavailable},
	CauseTaskEnded:  {"task-ended", http.StatusForbidden, "false", RetryAfterNone, SQLStateLimitExceeded},
	CauseUnmatched:  {"unmatched", http.StatusForbidden, "", RetryAfterNone, SQLStateLimitExceeded},
	CauseSuspended:  {"suspended", http.StatusForbidden, "", RetryAfterNone, SQLStateLimitExceeded},
	CauseReadOnly:   {"read-only", http.StatusForbidden, "", RetryAfterNone, SQLStateReadOnly},
	CauseBadRequest: {"bad-request", http.StatusBadRequest, "", RetryAfterNone, SQLStateBadRequest},
	// The client is gone and sees nothing; the status is for the log.
	CauseCanceled: {"", http.StatusServiceUnavailable, "", RetryAfterNone, SQLStateUnavailable},
}

// governordOnly are the causes governord names that the sidecar never
// answers a client with, and so have no row: a bound reads as governord
// refusing the sidecar's call (unavailable), and a wait given up is the
// sidecar's own (canceled, wait-timeout).
var governordOnly = map[Cause]bool{
	Cause(governorpb.Cause_CAUSE_BOUND):          true,
	Cause(governorpb.Cause_CAUSE_WAIT_ABANDONED): true,
}

// causeFrom is the one conversion from a cause governord or the SDK named
// (governor.CauseOf) to the sidecar's: the same value, when the sidecar
// answers with it.
func causeFrom(c governor.Cause) (Cause, bool) {
	sc := Cause(c)
	return sc, !governordOnly[sc] && sc.hasRow()
}

func (c Cause) hasRow() bool { return c >= 0 && int(c) < len(wires) && wires[c].Status != 0 }

// Wire is c's row of the table.
func (c Cause) Wire() Wire {
	if c.hasRow() {
		return wires[c]
	}
	return Wire{Status: http.StatusBadRequest, SQLState: SQLStateBadRequest}
}

// DeniedLabels lists the cause labels a refusal can be counted under, each
// once, for metrics that start every series at zero.
func DeniedLabels() []string {
	var out []string
	seen := map[string]bool{"": true}
	for _, w := range wires {
		if !seen[w.Header] {
			seen[w.Header] = true
			out = append(out, w.Header)
		}
	}
	return out
}
