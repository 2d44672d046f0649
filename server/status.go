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
	}
	for _, c := range sentinelCodes {
		if errors.Is(err, c.err) {
			return status.Error(c.code, err.Error())
		}
	}
	return status.Error(codes.Internal, err.Error())
}

// sentinelCodes are the codes of the errors that carry no detail, tried in
// this order once no detail applies; anything else is Internal.
var sentinelCodes = []struct {
	err  error
	code codes.Code
}{
	{engine.ErrBound, codes.ResourceExhausted},
	{engine.ErrUnauthenticated, codes.Unauthenticated},
	{engine.ErrSessionExpired, codes.Unauthenticated},
	{engine.ErrPermission, codes.PermissionDenied},
	{engine.ErrNotFound, codes.NotFound},
	{engine.ErrExists, codes.AlreadyExists},
	{engine.ErrInvalid, codes.InvalidArgument},
	{engine.ErrRequestIDReused, codes.InvalidArgument},
	{engine.ErrRecalling, codes.Aborted}, // only when the server gave up waiting for the recall
	{context.Canceled, codes.Canceled},
	{context.DeadlineExceeded, codes.DeadlineExceeded},
}

func withDetail(code codes.Code, err error, detail protoadapt.MessageV1) error {
	st, derr := status.New(code, err.Error()).WithDetails(detail)
	if derr != nil {
		return status.Error(code, err.Error())
	}
	return st.Err()
}

// The engine's enums as the API carries them. A value missing from a table
// is the API's zero, UNSPECIFIED; a kind missing from nodeKinds is a
// subtask, as every node below a task is.
var (
	nodeStates = map[engine.State]governorpb.NodeState{
		engine.Open:      governorpb.NodeState_NODE_STATE_OPEN,
		engine.Closed:    governorpb.NodeState_NODE_STATE_CLOSED,
		engine.Cancelled: governorpb.NodeState_NODE_STATE_CANCELLED,
		engine.Expired:   governorpb.NodeState_NODE_STATE_EXPIRED,
	}
	nodeKinds = map[engine.Kind]governorpb.NodeKind{
		engine.KindRoot:   governorpb.NodeKind_NODE_KIND_ROOT,
		engine.KindTenant: governorpb.NodeKind_NODE_KIND_TENANT,
		engine.KindTask:   governorpb.NodeKind_NODE_KIND_TASK,
	}
	leaseReasons = map[engine.EndReason]governorpb.LeaseEndReason{
		engine.EndReleased: governorpb.LeaseEndReason_LEASE_END_REASON_RELEASED,
		engine.EndExpired:  governorpb.LeaseEndReason_LEASE_END_REASON_EXPIRED,
		engine.EndRevoked:  governorpb.LeaseEndReason_LEASE_END_REASON_REVOKED,
	}
)

func nodeState(s engine.State) governorpb.NodeState { return nodeStates[s] }

func nodeKind(k engine.Kind) governorpb.NodeKind {
	if v, ok := nodeKinds[k]; ok {
		return v
	}
	return governorpb.NodeKind_NODE_KIND_SUBTASK
}

func leaseReason(r engine.EndReason) governorpb.LeaseEndReason { return leaseReasons[r] }
