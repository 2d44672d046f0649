package pgwire

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

// Admitter decides whether a transaction may start and whether a statement
// may be charged. The proxy calls it from one goroutine per connection;
// implementations must be safe for concurrent use across connections.
//
// Errors: return a *Denial to choose the SQLSTATE and message the client
// sees. The proxy bounds each call by Proxy.WaitTimeout: when that deadline
// ends the call, the client gets 55P03. Any other error fails closed as
// 53000 (governord unreachable).
type Admitter interface {
	// BeginTx takes a lease of tx.Class, charging tx.Charges in the same
	// step, when a transaction starts. A nil Ticket with a nil error means
	// nothing is to be released.
	BeginTx(ctx context.Context, tx Tx) (Ticket, error)
	// Charge charges a statement's quotas inside a transaction that already
	// holds its lease (or needs none).
	Charge(ctx context.Context, tx Tx, charges map[string]int64) error
}

// Ticket is an admitted transaction's lease.
type Ticket interface {
	// End releases the lease: latency is how long the transaction held it,
	// and overloaded is set when the server answered with SQLSTATE class
	// 53, 57014 or 40001. It is called once, from the connection's
	// goroutine; a slow End delays that connection only.
	End(latency time.Duration, overloaded bool)
}

// Tx describes the transaction or statement being admitted.
type Tx struct {
	Database        string
	User            string
	ApplicationName string
	// Subtask, when not empty, names the subtask of the worker's task the
	// transaction is charged to (Proxy.TaskFromApplicationName).
	Subtask string
	// Rule, Class and Charges come from the rule that matched.
	Rule    string
	Class   string
	Charges map[string]int64
	// Kinds and Tables are what the classifier found.
	Kinds  []string
	Tables []string
}

// SQLSTATEs of a denial (DESIGN.md, "What a denial looks like on the wire").
const (
	SQLStateQuota       = "53400" // configuration_limit_exceeded: a quota is spent
	SQLStateTaskEnded   = "53400" // the task ended or passed its deadline
	SQLStateWaitTimeout = "55P03" // lock_not_available: waited past wait_timeout
	SQLStateUnavailable = "53000" // insufficient_resources: governord unreachable
)

// Denial is the error an Admitter returns to refuse work with a given
// SQLSTATE. Message should name the cap that was hit.
type Denial struct {
	Code    string // a SQLSTATE, e.g. SQLStateQuota
	Message string
	Err     error // the underlying error, if any
}

func (d *Denial) Error() string { return d.Message }
func (d *Denial) Unwrap() error { return d.Err }

// denialFor turns an Admitter's error into the ErrorResponse the client
// sees and the failure it is counted as. waited says the call's own
// deadline (wait_timeout) had passed.
func denialFor(err error, waited bool, class string, wait time.Duration) (code, msg string, f Failure) {
	var d *Denial
	switch {
	case errors.As(err, &d):
		f = DenyQuota
		switch d.Code {
		case SQLStateUnavailable:
			f = DenyUnavailable
		case SQLStateWaitTimeout:
			f = DenyWaitTimeout
		}
		if errors.Is(d.Err, errTaskEnded) {
			f = DenyTaskEnded
		}
		return d.Code, d.Message, f
	case waited && errors.Is(err, context.DeadlineExceeded):
		return SQLStateWaitTimeout, fmt.Sprintf("governor: waited longer than wait_timeout (%s) for a %q lease", wait, class), DenyWaitTimeout
	}
	return SQLStateUnavailable, "governor: governord unavailable, new work is denied: " + err.Error(), DenyUnavailable
}

// errTaskEnded marks a Denial for an ended task, for counting.
var errTaskEnded = errors.New("task ended")

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
