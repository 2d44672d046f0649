package server

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor/engine"
)

// toDenial is a quota denial as the API carries it.
func toDenial(d *engine.Denial) *governorpb.Denial {
	return &governorpb.Denial{Resource: d.Resource, NodeId: int64(d.Node), NodeName: d.NodeName, Used: d.Used, Limit: d.Limit,
		Amount: d.Amount, LargestConsumerId: int64(d.Largest.Node), LargestConsumerName: d.Largest.Name, LargestConsumerUsed: d.Largest.Used,
		ResetAt: resetAt(d.ResetAt), Cause: governorpb.Cause_CAUSE_QUOTA}
}

// toStatus maps an engine error to the gRPC status the API documents, with
// the denial, node or lease details attached, and a refusal's cause set on
// them (withCause).
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return withCause(status.Convert(engineStatus(err)), err)
}

// engineStatus is the status of an engine error, with the detail of its kind.
func engineStatus(err error) error {
	var (
		denial *engine.Denial
		ended  *engine.EndedError
		lease  *engine.LeaseEndedError
		tstate *engine.TenantStateError
		rate   *engine.RateError
		bound  *engine.BoundError
	)
	switch {
	case errors.As(err, &rate):
		return rateStatus(rate)
	case errors.As(err, &tstate):
		return withDetail(codes.FailedPrecondition, err, tenantRefusal(tstate))
	case errors.As(err, &denial):
		return withDetail(codes.ResourceExhausted, err, toDenial(denial))
	case errors.As(err, &ended):
		return withDetail(codes.FailedPrecondition, err, &governorpb.NodeEnded{NodeId: int64(ended.Node),
			NodeName: ended.Name, State: nodeState(ended.State)})
	case errors.As(err, &lease):
		return withDetail(codes.FailedPrecondition, err, &governorpb.LeaseEnded{LeaseId: int64(lease.Lease),
			Reason: leaseReason(lease.Reason)})
	case errors.As(err, &bound):
		return withDetail(codes.ResourceExhausted, err, &governorpb.BoundReached{Tenant: bound.Tenant, Bound: bound.Bound,
			Limit: int64(bound.Limit), Name: bound.Name})
	case errors.Is(err, engine.ErrBound):
		return status.Error(codes.ResourceExhausted, err.Error())
	case errors.Is(err, engine.ErrUnauthenticated), errors.Is(err, engine.ErrSessionExpired):
		return status.Error(codes.Unauthenticated, err.Error())
	case errors.Is(err, engine.ErrPermission):
		return status.Error(codes.PermissionDenied, err.Error())
	case errors.Is(err, engine.ErrNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, engine.ErrExists):
		return status.Error(codes.AlreadyExists, err.Error())
	case errors.Is(err, engine.ErrInvalid), errors.Is(err, engine.ErrRequestIDReused):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, engine.ErrRecalling): // only when the server gave up waiting for the recall
		return status.Error(codes.Aborted, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

func withDetail(code codes.Code, err error, detail protoadapt.MessageV1) error {
	st, derr := status.New(code, err.Error()).WithDetails(detail)
	if derr != nil {
		return status.Error(code, err.Error())
	}
	return st.Err()
}

func nodeState(s engine.State) governorpb.NodeState {
	switch s {
	case engine.Open:
		return governorpb.NodeState_NODE_STATE_OPEN
	case engine.Closed:
		return governorpb.NodeState_NODE_STATE_CLOSED
	case engine.Cancelled:
		return governorpb.NodeState_NODE_STATE_CANCELLED
	case engine.Expired:
		return governorpb.NodeState_NODE_STATE_EXPIRED
	}
	return governorpb.NodeState_NODE_STATE_UNSPECIFIED
}

func nodeKind(k engine.Kind) governorpb.NodeKind {
	switch k {
	case engine.KindRoot:
		return governorpb.NodeKind_NODE_KIND_ROOT
	case engine.KindTenant:
		return governorpb.NodeKind_NODE_KIND_TENANT
	case engine.KindTask:
		return governorpb.NodeKind_NODE_KIND_TASK
	}
	return governorpb.NodeKind_NODE_KIND_SUBTASK
}

func leaseReason(r engine.EndReason) governorpb.LeaseEndReason {
	switch r {
	case engine.EndReleased:
		return governorpb.LeaseEndReason_LEASE_END_REASON_RELEASED
	case engine.EndExpired:
		return governorpb.LeaseEndReason_LEASE_END_REASON_EXPIRED
	case engine.EndRevoked:
		return governorpb.LeaseEndReason_LEASE_END_REASON_REVOKED
	}
	return governorpb.LeaseEndReason_LEASE_END_REASON_UNSPECIFIED
}
