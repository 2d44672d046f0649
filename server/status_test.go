package server

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor/engine"
)

// Each plain engine error reaches the client with the code the API
// documents, wrapped or not; anything else is Internal.
func TestStatusCodesOfPlainErrors(t *testing.T) {
	for _, c := range []struct {
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
		{engine.ErrRecalling, codes.Aborted},
		{context.Canceled, codes.Canceled},
		{context.DeadlineExceeded, codes.DeadlineExceeded},
		{errors.New("disk on fire"), codes.Internal},
	} {
		for _, err := range []error{c.err, fmt.Errorf("node 7: %w", c.err)} {
			st := status.Convert(toStatus(err))
			if st.Code() != c.code || st.Message() != err.Error() {
				t.Errorf("toStatus(%q) = %v %q, want %v", err, st.Code(), st.Message(), c.code)
			}
		}
	}
}

// The engine's enums map one to one onto the API's; what the API has no
// name for is UNSPECIFIED, but for a kind, which below a task is a subtask.
func TestEnumsAsTheAPICarriesThem(t *testing.T) {
	states := map[engine.State]governorpb.NodeState{
		engine.Open: governorpb.NodeState_NODE_STATE_OPEN, engine.Closed: governorpb.NodeState_NODE_STATE_CLOSED,
		engine.Cancelled: governorpb.NodeState_NODE_STATE_CANCELLED, engine.Expired: governorpb.NodeState_NODE_STATE_EXPIRED,
		engine.State(99): governorpb.NodeState_NODE_STATE_UNSPECIFIED,
	}
	for s, want := range states {
		if got := nodeState(s); got != want {
			t.Errorf("nodeState(%d) = %v, want %v", s, got, want)
		}
	}
	kinds := map[engine.Kind]governorpb.NodeKind{
		engine.KindRoot: governorpb.NodeKind_NODE_KIND_ROOT, engine.KindTenant: governorpb.NodeKind_NODE_KIND_TENANT,
		engine.KindTask: governorpb.NodeKind_NODE_KIND_TASK, engine.KindSubtask: governorpb.NodeKind_NODE_KIND_SUBTASK,
		engine.Kind(99): governorpb.NodeKind_NODE_KIND_SUBTASK,
	}
	for k, want := range kinds {
		if got := nodeKind(k); got != want {
			t.Errorf("nodeKind(%d) = %v, want %v", k, got, want)
		}
	}
	reasons := map[engine.EndReason]governorpb.LeaseEndReason{
		engine.EndReleased:  governorpb.LeaseEndReason_LEASE_END_REASON_RELEASED,
		engine.EndExpired:   governorpb.LeaseEndReason_LEASE_END_REASON_EXPIRED,
		engine.EndRevoked:   governorpb.LeaseEndReason_LEASE_END_REASON_REVOKED,
		engine.EndReason(0): governorpb.LeaseEndReason_LEASE_END_REASON_UNSPECIFIED,
	}
	for r, want := range reasons {
		if got := leaseReason(r); got != want {
			t.Errorf("leaseReason(%d) = %v, want %v", r, got, want)
		}
	}
	notices := map[engine.NoticeKind]governorpb.Notice_Kind{
		engine.NoticeContended: governorpb.Notice_KIND_CONTENDED, engine.NoticeUncontended: governorpb.Notice_KIND_UNCONTENDED,
		engine.NoticeRecall: governorpb.Notice_KIND_RECALL, engine.NoticeEnded: governorpb.Notice_KIND_ENDED,
		engine.NoticeKind(0): governorpb.Notice_KIND_UNSPECIFIED,
	}
	for k, want := range notices {
		n := toNotice(engine.Notice{Kind: k, Node: 7, Class: "db", Resource: "calls"})
		if n.GetKind() != want || n.GetNodeId() != 7 || n.GetClass() != "db" || n.GetResource() != "calls" {
			t.Errorf("toNotice(kind %d) = %v, want kind %v on node 7, db, calls", k, n, want)
		}
	}
}
