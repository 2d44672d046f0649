package pgwire

import (
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/governor-project/governor/proxy/admission"
)

// SQLStateUnavailable is the SQLSTATE of an ERROR the proxy sends for a
// connection that is failing: governord's own, as for a denial that fails
// closed.
const SQLStateUnavailable = admission.SQLStateUnavailable

// sqlState is what a SQL client sees of a refusal: the SQLSTATE of its
// cause (admission's table of causes, the one place causes get their
// codes), and the failure it is counted as.
func sqlState(d *admission.Denial) (code string, f Failure) {
	return d.Cause.Wire().SQLState, denyFailure(d.Cause)
}

// denyFailure is the failure a connection counts a refusal as.
func denyFailure(c admission.Cause) Failure {
	switch c {
	case admission.CauseQuota:
		return DenyQuota
	case admission.CauseTaskEnded:
		return DenyTaskEnded
	case admission.CauseWaitTimeout:
		return DenyWaitTimeout
	case admission.CauseBadRequest:
		return DenyBadRequest
	case admission.CauseSuspended:
		return DenySuspended
	case admission.CauseReadOnly:
		return DenyReadOnly
	case admission.CauseRate:
		return DenyRate
	}
	// Unavailable, stopping; canceled too (the client is gone and sees
	// nothing).
	return DenyUnavailable
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
