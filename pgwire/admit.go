package pgwire

import (
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/governor-project/governor/proxy/admission"
)

// SQLSTATEs of a denial (docs/proxy.md, the table of denials).
const (
	SQLStateQuota       = "53400" // configuration_limit_exceeded: a quota is spent
	SQLStateTaskEnded   = "53400" // the task ended or passed its deadline
	SQLStateWaitTimeout = "55P03" // lock_not_available: waited past wait_timeout
	SQLStateUnavailable = "53000" // insufficient_resources: governord unreachable
	SQLStateBadRequest  = "22023" // invalid_parameter_value: an application_name the proxy refuses
	SQLStateSuspended   = "53400" // configuration_limit_exceeded: the tenant is suspended
	SQLStateReadOnly    = "25006" // read_only_sql_transaction: a write while the tenant is read-only
	SQLStateRate        = "53300" // too_many_connections, the closest standard code for "too much, too fast": over a rate, try again
)

// sqlState is the one place a refusal becomes what a SQL client sees: its
// SQLSTATE, and the failure it is counted as.
func sqlState(d *admission.Denial) (code string, f Failure) {
	switch d.Cause {
	case admission.CauseQuota:
		return SQLStateQuota, DenyQuota
	case admission.CauseTaskEnded:
		return SQLStateTaskEnded, DenyTaskEnded
	case admission.CauseWaitTimeout:
		return SQLStateWaitTimeout, DenyWaitTimeout
	case admission.CauseBadRequest:
		return SQLStateBadRequest, DenyBadRequest
	case admission.CauseSuspended:
		return SQLStateSuspended, DenySuspended
	case admission.CauseReadOnly:
		return SQLStateReadOnly, DenyReadOnly
	case admission.CauseRate:
		return SQLStateRate, DenyRate
	}
	// Unavailable, stopping; canceled too (the client is gone and sees
	// nothing).
	return SQLStateUnavailable, DenyUnavailable
}

// overloadedCode reports the SQLSTATEs that mark a transaction overloaded.
func overloadedCode(code string) bool {
	return len(code) == 5 && (code[:2] == "53" || code == "57014" || code == "40001")
}

// errorResponse encodes an ERROR (not FATAL: the connection stays usable).
func errorResponse(severity, code, msg string) []byte {
	b, _ := (&pgproto3.ErrorResponse{Severity: severity, SeverityUnlocalized: severity, Code: code, Message: msg}).Encode(nil)
	return b
}

func noticeResponse(msg string) []byte {
	b, _ := (&pgproto3.NoticeResponse{Severity: "NOTICE", SeverityUnlocalized: "NOTICE", Code: "00000", Message: msg}).Encode(nil)
	return b
}

func readyForQuery(status byte) []byte {
	return appendMsg(nil, MsgReadyForQuery, []byte{status})
}
