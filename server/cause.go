package server

import (
	"context"
	"errors"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor/engine"
)

// causeOf is the one mapping from an engine error to the cause governord
// names it by, on statuses, in usage records and in DryRun's answers:
// UNSPECIFIED for an error that refuses no work (a malformed request, an
// unknown node, a lease that ended). A caller whose context ended while
// it waited gave up (WAIT_ABANDONED); nothing refused it.
func causeOf(err error) governorpb.Cause {
	var tstate *engine.TenantStateError
	switch {
	case err == nil:
	case errors.As(err, &tstate):
		switch tstate.State {
		case engine.Suspended:
			return governorpb.Cause_CAUSE_SUSPENDED
		case engine.ReadOnly:
			return governorpb.Cause_CAUSE_READ_ONLY
		}
		// A closing tenant refuses a new task as if it had ended.
		return governorpb.Cause_CAUSE_TASK_ENDED
	case errors.Is(err, engine.ErrRateLimited):
		return governorpb.Cause_CAUSE_RATE
	case errors.Is(err, engine.ErrQuotaExhausted):
		return governorpb.Cause_CAUSE_QUOTA
	case errors.Is(err, engine.ErrTaskEnded):
		return governorpb.Cause_CAUSE_TASK_ENDED
	case errors.Is(err, engine.ErrBound):
		return governorpb.Cause_CAUSE_BOUND
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return governorpb.Cause_CAUSE_WAIT_ABANDONED
	}
	return governorpb.Cause_CAUSE_UNSPECIFIED
}

// causeField is the name of the field of a detail that says why work was
// refused (Denial, RateLimited, NodeEnded, TenantRefusal, BoundReached).
const causeField = "cause"

// withCause sets the cause of err (causeOf) on every detail of st, the
// status err maps to, that has a cause field: so each refusal's detail
// says why, from this one mapping.
func withCause(st *status.Status, err error) error {
	cause := causeOf(err)
	p := st.Proto()
	if cause == governorpb.Cause_CAUSE_UNSPECIFIED || len(p.GetDetails()) == 0 {
		return st.Err()
	}
	details := make([]*anypb.Any, 0, len(p.GetDetails()))
	for _, a := range p.GetDetails() {
		details = append(details, setCause(a, cause))
	}
	return status.FromProto(&spb.Status{Code: p.GetCode(), Message: p.GetMessage(), Details: details}).Err()
}

// setCause is a with its cause field set to cause; a itself when it has
// none (google.rpc.RetryInfo).
func setCause(a *anypb.Any, cause governorpb.Cause) *anypb.Any {
	m, err := a.UnmarshalNew()
	if err != nil {
		return a
	}
	f := m.ProtoReflect().Descriptor().Fields().ByName(causeField)
	if f == nil || f.Enum() == nil || f.Enum().FullName() != cause.Descriptor().FullName() {
		return a
	}
	m.ProtoReflect().Set(f, protoreflect.ValueOfEnum(cause.Number()))
	out, err := anypb.New(m)
	if err != nil {
		return a
	}
	return out
}
