package governor

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/governor-project/governor/api/governorpb"
)

// Sentinel errors. Every error this package returns for a call wraps one of
// them (or a context error), so callers branch with errors.Is. The typed
// errors below carry the details and match their sentinel.
var (
	// ErrQuotaExhausted: a quota on the task or an ancestor is spent. The
	// error is a *Denial naming the cap.
	ErrQuotaExhausted = errors.New("quota exhausted")
	// ErrRateLimited: a rate on the task or an ancestor holds fewer units
	// than the charge asks; it will hold them later. Retryable: the error
	// is a *RateLimitedError saying how long to wait, which Retry honours.
	ErrRateLimited = errors.New("rate limited")
	// ErrTaskEnded: the task, or an ancestor, was closed, cancelled or passed
	// its deadline. The error is a *TaskEndedError when the server said so.
	ErrTaskEnded = errors.New("task ended")
	// ErrLeaseExpired: the lease ended because its session expired.
	ErrLeaseExpired = errors.New("lease expired")
	// ErrLeaseRevoked: the lease ended because its node ended.
	ErrLeaseRevoked = errors.New("lease revoked")
	// ErrLeaseReleased: Validate named a lease that was released.
	ErrLeaseReleased = errors.New("lease released")
	// ErrUnauthenticated: a bad API key, or the server no longer knows the
	// session.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrPermissionDenied: the target lies inside the session's scope but
	// the call may not touch it: it tried to change the scope node itself,
	// or to release a lease another session holds.
	ErrPermissionDenied = errors.New("permission denied")
	// ErrNotFound: no such node or lease, or one outside the session's scope
	// (another tenant's): the two are told apart by nobody but the operator.
	ErrNotFound = errors.New("not found")
	// ErrAlreadyExists: an open sibling already has the task's name.
	ErrAlreadyExists = errors.New("already exists")
	// ErrInvalidArgument: the server rejected the request as malformed, or
	// the SDK's configuration is invalid.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrThrottled: governord did not let the call in yet (its tenant's
	// calls in flight and queued were full, or it was over its api_rate)
	// and the call's context ended before it could be sent again. The
	// call was not applied.
	ErrThrottled = errors.New("governord throttled the call")

	// ErrUnavailable: governord could not be reached. New work is denied.
	ErrUnavailable = errors.New("governord unavailable")
	// ErrSessionLost: the client gave up its session (no heartbeat succeeded
	// in time, or the server forgot it). Nothing is admitted any more; Dial
	// again.
	ErrSessionLost = errors.New("session lost")
	// ErrClosed: the client was closed by Client.Close.
	ErrClosed = errors.New("client closed")
	// ErrNoTask: a helper was given a context that carries no task, so it
	// refused to run the work ungoverned.
	ErrNoTask = errors.New("no governor task in context")
)

// StatusError is an error the server returned. It carries the gRPC status,
// so status.FromError and status.Code work on it, and it unwraps to the
// matching sentinel or to a typed detail (*Denial, *LeaseEndedError,
// *TaskEndedError).
type StatusError struct {
	// Op is the call that failed, e.g. "Consume".
	Op     string
	status *status.Status
	err    error // the sentinel or typed detail; nil if the code has none
	cause  Cause
}

// Cause is why governord refused the call; CauseNone if it refused no
// work (a malformed request, an unknown node, ...).
func (e *StatusError) Cause() Cause { return e.cause }

func (e *StatusError) Error() string { return "governor: " + e.Op + ": " + e.reason() }

// reason is the message without the call's name.
func (e *StatusError) reason() string {
	switch e.err.(type) {
	case nil:
		return fmt.Sprintf("%s: %s", e.status.Code(), e.status.Message())
	case *Denial, *LeaseEndedError, *TaskEndedError, *RateLimitedError:
		return e.err.Error() // the detail says all the message would
	}
	// governord's message may already start with the sentinel's words
	// (the engine's "invalid argument: ..."): say them once.
	if msg := e.status.Message(); strings.HasPrefix(msg, e.err.Error()+": ") {
		return msg
	}
	return fmt.Sprintf("%v: %s", e.err, e.status.Message())
}

// Unwrap returns the sentinel or typed detail the status maps to.
func (e *StatusError) Unwrap() error { return e.err }

// GRPCStatus returns the status the server sent, details included.
func (e *StatusError) GRPCStatus() *status.Status { return e.status }

// Code is the gRPC status code.
func (e *StatusError) Code() codes.Code { return e.status.Code() }

// Denial explains a refused charge: which cap was hit, on which node, how
// full it was, and which child of that node spent the most.
type Denial struct {
	Resource string // the resource whose quota was hit, e.g. "retry"
	NodeID   int64  // the node the quota is on: the task or an ancestor
	NodeName string // that node's name (empty for the root)
	Used     int64  // already charged to that node
	Limit    int64  // that node's quota
	Amount   int64  // what the refused charge asked for

	// The child of NodeID that has used the most of Resource (its subtree
	// counted), or NodeID itself for what was charged to it directly.
	// LargestConsumerID is 0 when the consumer is not one node: children
	// that ended and were reclaimed (named so, with their use), or, on a
	// node the session shares with other tenants (the root), "another
	// tenant" with no use: who else spent a shared cap, and how much, is
	// not the session's to know. Its name is empty when nothing was used.
	LargestConsumerID   int64
	LargestConsumerName string
	LargestConsumerUsed int64

	// ResetAt is when the quota's period resets it (Used is then what was
	// spent since the last reset): waiting until then helps. Zero for a
	// quota that never resets.
	ResetAt time.Time
}

func (d *Denial) Error() string {
	s := fmt.Sprintf("quota exhausted: %s on %q (node %d) is %d of %d, asked %d more",
		d.Resource, d.NodeName, d.NodeID, d.Used, d.Limit, d.Amount)
	switch {
	case d.LargestConsumerID != 0:
		s += fmt.Sprintf("; largest consumer %q (node %d) used %d",
			d.LargestConsumerName, d.LargestConsumerID, d.LargestConsumerUsed)
	case d.LargestConsumerName != "" && d.LargestConsumerUsed == 0: // "another tenant"
		s += "; largest consumer: " + d.LargestConsumerName
	case d.LargestConsumerName != "":
		s += fmt.Sprintf("; largest consumer %q used %d", d.LargestConsumerName, d.LargestConsumerUsed)
	}
	if !d.ResetAt.IsZero() {
		s += "; resets at " + d.ResetAt.UTC().Format(time.RFC3339Nano)
	}
	return s
}

// Is makes errors.Is(d, ErrQuotaExhausted) true.
func (d *Denial) Is(target error) bool { return target == ErrQuotaExhausted }

// LeaseEndReason says why a lease is no longer held.
type LeaseEndReason int32

// The values match governorpb.LeaseEndReason.
const (
	LeaseReleased LeaseEndReason = LeaseEndReason(governorpb.LeaseEndReason_LEASE_END_REASON_RELEASED)
	LeaseExpired  LeaseEndReason = LeaseEndReason(governorpb.LeaseEndReason_LEASE_END_REASON_EXPIRED)
	LeaseRevoked  LeaseEndReason = LeaseEndReason(governorpb.LeaseEndReason_LEASE_END_REASON_REVOKED)
)

func (r LeaseEndReason) String() string {
	switch r {
	case LeaseReleased:
		return "released"
	case LeaseExpired:
		return "expired"
	case LeaseRevoked:
		return "revoked"
	}
	return fmt.Sprintf("LeaseEndReason(%d)", int32(r))
}

// LeaseEndedError reports that a lease named by Release or Validate has
// ended. It matches ErrLeaseReleased, ErrLeaseExpired or ErrLeaseRevoked by
// its reason. A release that gets it means the work ran without cover.
type LeaseEndedError struct {
	LeaseID int64
	Reason  LeaseEndReason
}

func (e *LeaseEndedError) Error() string {
	return fmt.Sprintf("lease %d %s", e.LeaseID, e.Reason)
}

// Is matches the sentinel for the reason.
func (e *LeaseEndedError) Is(target error) bool {
	switch e.Reason {
	case LeaseReleased:
		return target == ErrLeaseReleased
	case LeaseExpired:
		return target == ErrLeaseExpired
	case LeaseRevoked:
		return target == ErrLeaseRevoked
	}
	return false
}

// NodeState says how a node ended.
type NodeState int32

// The values match governorpb.NodeState.
const (
	NodeOpen      NodeState = NodeState(governorpb.NodeState_NODE_STATE_OPEN)
	NodeClosed    NodeState = NodeState(governorpb.NodeState_NODE_STATE_CLOSED)
	NodeCancelled NodeState = NodeState(governorpb.NodeState_NODE_STATE_CANCELLED)
	NodeExpired   NodeState = NodeState(governorpb.NodeState_NODE_STATE_EXPIRED)
)

func (s NodeState) String() string {
	switch s {
	case NodeOpen:
		return "open"
	case NodeClosed:
		return "closed"
	case NodeCancelled:
		return "cancelled"
	case NodeExpired:
		return "expired"
	}
	return fmt.Sprintf("NodeState(%d)", int32(s))
}

// TaskEndedError reports that the target task, or the ancestor named by
// NodeID, has ended. It matches ErrTaskEnded. The SDK cancels the context of
// every task of its own that the end took with it.
type TaskEndedError struct {
	NodeID   int64
	NodeName string
	State    NodeState
}

func (e *TaskEndedError) Error() string {
	return fmt.Sprintf("task ended: %q (node %d) is %s", e.NodeName, e.NodeID, e.State)
}

// Is makes errors.Is(e, ErrTaskEnded) true.
func (e *TaskEndedError) Is(target error) bool { return target == ErrTaskEnded }

// gaveUpError is a call that stopped trying: why it stopped (the caller's
// context ended, or the session did) and the failure of the last attempt.
// errors.Is matches both.
type gaveUpError struct {
	op   string
	why  error
	last error
}

func (e *gaveUpError) Error() string {
	last := e.last.Error()
	if se, ok := e.last.(*StatusError); ok {
		last = se.reason()
	}
	return fmt.Sprintf("governor: %s: %v (last attempt: %s)", e.op, e.why, last)
}

func (e *gaveUpError) Unwrap() []error { return []error{e.why, e.last} }

// RawError turns the error of a call made through Client.Raw (named op)
// into the error the SDK's own calls return for it: a *StatusError that
// unwraps to its sentinel or typed detail (*Denial, *TaskEndedError,
// *TenantStateError, ...), so that errors.Is and errors.As work on it.
// Errors that carry no status are wrapped as they are; nil stays nil.
func RawError(op string, err error) error { return fromStatus(op, err) }

// fromStatus turns an error from a gRPC call into a *StatusError. Errors that
// carry no status (a closed connection, a rejected call) are wrapped as they
// are.
func fromStatus(op string, err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("governor: %s: %w", op, err)
	}
	se := &StatusError{Op: op, status: st}
	var detail error
	se.cause, detail = refusal(st)
	switch _, throttle := throttled(err); {
	case detail != nil:
		se.err = detail
	case throttle:
		se.err = ErrThrottled
	case se.cause.Err() != nil:
		se.err = se.cause.Err()
	default:
		se.err = codeErrors[st.Code()]
	}
	return se
}

// codeErrors are the sentinels of statuses that name no cause.
var codeErrors = map[codes.Code]error{
	codes.ResourceExhausted: ErrQuotaExhausted, // a governord from before causes
	codes.Unauthenticated:   ErrUnauthenticated,
	codes.PermissionDenied:  ErrPermissionDenied,
	codes.NotFound:          ErrNotFound,
	codes.AlreadyExists:     ErrAlreadyExists,
	codes.InvalidArgument:   ErrInvalidArgument,
	codes.Unavailable:       ErrUnavailable,
	codes.Canceled:          context.Canceled,
	codes.DeadlineExceeded:  context.DeadlineExceeded,
}

// refusal reads a status's details: the cause governord named (in the
// detail of the refusal), and the typed error of that detail. From a
// governord that names no cause, the detail's kind tells it.
func refusal(st *status.Status) (Cause, error) {
	var (
		cause  Cause
		detail error
	)
	for _, d := range st.Details() {
		if c, ok := d.(interface{ GetCause() governorpb.Cause }); ok && cause == CauseNone {
			cause = Cause(c.GetCause())
		}
		switch d := d.(type) {
		case *governorpb.Denial:
			detail = denialFromProto(d)
		case *governorpb.RateLimited:
			detail = rateLimitedFromProto(d)
		case *governorpb.NodeEnded:
			detail = &TaskEndedError{NodeID: d.GetNodeId(), NodeName: d.GetNodeName(), State: NodeState(d.GetState())}
		case *governorpb.LeaseEnded:
			detail = &LeaseEndedError{LeaseID: d.GetLeaseId(), Reason: LeaseEndReason(d.GetReason())}
		case *governorpb.TenantRefusal:
			detail = tenantRefusal(d)
		}
	}
	if c, ok := detail.(interface{ Cause() Cause }); ok && cause == CauseNone {
		cause = c.Cause()
	}
	return cause, detail
}

func denialFromProto(d *governorpb.Denial) *Denial {
	return &Denial{
		Resource:            d.GetResource(),
		NodeID:              d.GetNodeId(),
		NodeName:            d.GetNodeName(),
		Used:                d.GetUsed(),
		Limit:               d.GetLimit(),
		Amount:              d.GetAmount(),
		LargestConsumerID:   d.GetLargestConsumerId(),
		LargestConsumerName: d.GetLargestConsumerName(),
		LargestConsumerUsed: d.GetLargestConsumerUsed(),
		ResetAt:             resetTime(d),
	}
}

func resetTime(d *governorpb.Denial) time.Time {
	if d.GetResetAt() == nil {
		return time.Time{}
	}
	return d.GetResetAt().AsTime()
}
