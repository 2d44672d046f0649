package server

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor/engine"
)

// The audited side of caps: a SetCaps's reason and override, a node's audit
// trail, and a node found by its path (governor caps).

func capsAudit(req *governorpb.SetCapsRequest) (engine.Audit, error) {
	a := engine.Audit{Reason: req.GetReason()}
	if d := req.GetOverrideFor(); d != nil {
		if err := d.CheckValid(); err != nil {
			return a, status.Errorf(codes.InvalidArgument, "override_for: %v", err)
		}
		a.For = d.AsDuration()
	}
	return a, nil
}

func (s *Server) getNodeByPath(ctx context.Context, req *governorpb.GetNodeRequest) (*governorpb.Node, error) {
	if req.GetNodeId() != 0 {
		return nil, status.Error(codes.InvalidArgument, "node_id and path cannot both be set")
	}
	return call(s, ctx, "", func(sid engine.SessionID) (*governorpb.Node, error) {
		return nodeOrNil(s.eng.Lookup(sid, req.GetPath()))
	})
}

func (s *Server) GetCapsHistory(ctx context.Context, req *governorpb.GetCapsHistoryRequest) (*governorpb.CapsHistory, error) {
	if err := required("node_id", req.GetNodeId()); err != nil {
		return nil, err
	}
	return call(s, ctx, "", func(sid engine.SessionID) (*governorpb.CapsHistory, error) {
		changes, pending, err := s.eng.CapsHistory(sid, engine.NodeID(req.GetNodeId()))
		if err != nil {
			return nil, err
		}
		out := &governorpb.CapsHistory{}
		for _, c := range changes {
			pc := &governorpb.CapsChange{At: timestamppb.New(time.Unix(0, c.At)), Who: c.Who, Reason: c.Reason,
				Old: capsValues(c.Old), New: capsValues(c.New), Revert: c.Revert, Seq: c.Seq,
				OldState: c.OldState, NewState: c.NewState, Revoked: c.Revoked}
			if c.Until != 0 {
				pc.Until = timestamppb.New(time.Unix(0, c.Until))
			}
			out.Changes = append(out.Changes, pc)
		}
		for _, o := range pending {
			kind := "quota"
			if o.Limit {
				kind = "limit"
			}
			out.Pending = append(out.Pending, &governorpb.PendingOverride{Kind: kind, Name: o.Name, Value: o.Override,
				Restore: o.Restore, Until: timestamppb.New(time.Unix(0, o.Until))})
		}
		return out, nil
	})
}

func capsValues(c engine.CapsEdit) *governorpb.CapsValues {
	return &governorpb.CapsValues{Quotas: c.Quotas, Limits: c.Limits, DefaultQuotas: c.DefaultQuotas,
		DefaultLimits: c.DefaultLimits, Weight: c.Weight, Priority: c.Priority, DeadlineUnixNano: c.Deadline,
		QuotaModes: toCapModes(c.QuotaModes), LimitModes: toCapModes(c.LimitModes), Minimums: toMinimums(c.Minimums),
		Rates: toRates(c.Rates), DefaultRates: toRates(c.DefaultRates)}
}
