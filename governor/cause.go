package governor

import (
	"errors"

	"github.com/governor-project/governor/api/governorpb"
)

// Cause is why work was refused: governorpb.Cause, which governord sets
// on every refusal it answers and which the sidecar answers its clients
// by. String is its name on the wire ("quota", "wait-timeout").
type Cause int32

// The causes, as governorpb.Cause numbers them (governor.proto says what
// each means).
const (
	CauseNone          = Cause(governorpb.Cause_CAUSE_UNSPECIFIED) // no refusal, or none governord named
	CauseQuota         = Cause(governorpb.Cause_CAUSE_QUOTA)
	CauseWaitTimeout   = Cause(governorpb.Cause_CAUSE_WAIT_TIMEOUT)
	CauseUnavailable   = Cause(governorpb.Cause_CAUSE_UNAVAILABLE)
	CauseTaskEnded     = Cause(governorpb.Cause_CAUSE_TASK_ENDED)
	CauseUnmatched     = Cause(governorpb.Cause_CAUSE_UNMATCHED)
	CauseBadRequest    = Cause(governorpb.Cause_CAUSE_BAD_REQUEST)
	CauseCanceled      = Cause(governorpb.Cause_CAUSE_CANCELED)
	CauseStopping      = Cause(governorpb.Cause_CAUSE_STOPPING)
	CauseSuspended     = Cause(governorpb.Cause_CAUSE_SUSPENDED)
	CauseReadOnly      = Cause(governorpb.Cause_CAUSE_READ_ONLY)
	CauseRate          = Cause(governorpb.Cause_CAUSE_RATE)
	CauseBound         = Cause(governorpb.Cause_CAUSE_BOUND)
	CauseWaitAbandoned = Cause(governorpb.Cause_CAUSE_WAIT_ABANDONED)
)

// String is c's name on the wire; "cause(N)" for a value governor.proto
// does not hold.
func (c Cause) String() string { return governorpb.Cause(c).WireName() }

// causeErrors is the one place a cause gets its sentinel error: what an
// error of the cause matches with errors.Is when governord sent no detail
// that makes it a typed error. A bound reads as a spent quota, as it
// always has (RESOURCE_EXHAUSTED).
var causeErrors = map[Cause]error{
	CauseQuota:       ErrQuotaExhausted,
	CauseBound:       ErrQuotaExhausted,
	CauseRate:        ErrRateLimited,
	CauseTaskEnded:   ErrTaskEnded,
	CauseSuspended:   ErrTenantState,
	CauseReadOnly:    ErrTenantState,
	CauseUnavailable: ErrUnavailable,
}

// Err is c's sentinel error; nil for a cause that has none.
func (c Cause) Err() error { return causeErrors[c] }

// CauseOf is why err refused work, as governord or the SDK said:
// CauseNone for an error that refused nothing (or from a governord that
// named no cause and sent no detail).
func CauseOf(err error) Cause {
	var se *StatusError
	if errors.As(err, &se) && se.cause != CauseNone {
		return se.cause
	}
	var c interface{ Cause() Cause }
	if errors.As(err, &c) {
		return c.Cause()
	}
	return CauseNone
}

// Cause is CauseQuota.
func (d *Denial) Cause() Cause { return CauseQuota }

// Cause is CauseRate.
func (e *RateLimitedError) Cause() Cause { return CauseRate }

// Cause is CauseTaskEnded.
func (e *TaskEndedError) Cause() Cause { return CauseTaskEnded }

// Cause is the tenant's state's: a closing tenant refuses a new task as if
// it had ended.
func (e *TenantStateError) Cause() Cause {
	switch e.State {
	case "suspended":
		return CauseSuspended
	case "read_only":
		return CauseReadOnly
	}
	return CauseTaskEnded
}

// Causes lists every cause governor.proto holds (CauseNone aside), in
// order.
func Causes() []Cause {
	pb := governorpb.Causes()
	out := make([]Cause, len(pb))
	for i, c := range pb {
		out[i] = Cause(c)
	}
	return out
}

// UsageName is what governord's usage records count a refusal of cause c
// under: its name, or for a spent quota whose resource is known,
// "quota:RESOURCE" (DenialCount.Cause).
func (c Cause) UsageName(resource string) string { return governorpb.Cause(c).UsageName(resource) }
