package server

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor/engine"
)

// recentKeep is how many refusals Inspect can show.
const recentKeep = 100

type recentDenial struct {
	at    int64
	node  int64
	cause string
}

// recentDenials keeps the last recentKeep refusals, for Inspect. They are
// not state: a restart forgets them (the usage records keep their counts).
type recentDenials struct {
	mu    sync.Mutex
	items [recentKeep]recentDenial
	next  int
	n     int
}

func (r *recentDenials) add(d recentDenial) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.items[r.next] = d
	r.next = (r.next + 1) % recentKeep
	r.n = min(r.n+1, recentKeep)
}

// newestFirst returns the kept refusals, the newest first.
func (r *recentDenials) newestFirst() []recentDenial {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]recentDenial, 0, r.n)
	for i := 1; i <= r.n; i++ {
		out = append(out, r.items[(r.next-i+recentKeep)%recentKeep])
	}
	return out
}

func (s *Server) Inspect(ctx context.Context, req *governorpb.InspectRequest) (*governorpb.Inspection, error) {
	if err := required("node_id", req.GetNodeId()); err != nil {
		return nil, err
	}
	if req.GetLimit() < 0 {
		return nil, status.Error(codes.InvalidArgument, "limit is negative")
	}
	return call(s, ctx, "", func(sid engine.SessionID) (*governorpb.Inspection, error) {
		in, err := s.eng.Inspect(sid, engine.NodeID(req.GetNodeId()), int(req.GetLimit()))
		if err != nil {
			return nil, err
		}
		out := &governorpb.Inspection{ServerTime: timestamppb.New(time.Unix(0, in.Now)), Seq: s.eng.Seq(),
			LastCommit: durationpb.New(time.Duration(s.lastCommit.Load())),
			LeaseCount: int32(in.LeaseCount), WaiterCount: int32(in.WaiterCount), SessionCount: int32(in.SessionCount)}
		for _, l := range in.Leases {
			li := &governorpb.LeaseInfo{Id: int64(l.ID), NodeId: int64(l.Node), Class: l.Class,
				SessionId: int64(l.Session), Granted: timestamppb.New(time.Unix(0, l.Granted)), Count: l.Count, Block: l.Block}
			if l.Block {
				s.blockUse.fill(li, time.Now().UnixNano())
			}
			out.Leases = append(out.Leases, li)
		}
		for _, w := range in.Waiters {
			pw := &governorpb.WaiterInfo{NodeId: int64(w.Node), Class: w.Class, SessionId: int64(w.Session), Priority: w.Priority, Rate: w.Rate}
			if w.Since != 0 {
				pw.Since = timestamppb.New(time.Unix(0, w.Since))
			}
			out.Waiters = append(out.Waiters, pw)
		}
		for _, ss := range in.Sessions {
			out.Sessions = append(out.Sessions, &governorpb.SessionInfo{Id: int64(ss.ID), ScopeNodeId: int64(ss.Scope),
				Ttl: durationpb.New(ss.TTL), LastHeartbeat: timestamppb.New(time.Unix(0, ss.Expires-int64(ss.TTL))), Leases: int32(ss.Leases)})
		}
		for _, d := range s.recent.newestFirst() {
			if s.usage.Under(engine.NodeID(d.node), engine.NodeID(req.GetNodeId())) {
				out.RecentDenials = append(out.RecentDenials, &governorpb.RecentDenial{At: timestamppb.New(time.Unix(0, d.at)),
					NodeId: d.node, Cause: d.cause})
			}
		}
		return out, nil
	})
}

func (s *Server) ListTree(ctx context.Context, req *governorpb.ListTreeRequest) (*governorpb.ListTreeResponse, error) {
	if err := required("node_id", req.GetNodeId()); err != nil {
		return nil, err
	}
	if req.GetLimit() < 0 {
		return nil, status.Error(codes.InvalidArgument, "limit is negative")
	}
	return call(s, ctx, "", func(sid engine.SessionID) (*governorpb.ListTreeResponse, error) {
		nodes, waiting, more, err := s.eng.Subtree(sid, engine.NodeID(req.GetNodeId()), int(req.GetLimit()))
		if err != nil {
			return nil, err
		}
		out := &governorpb.ListTreeResponse{Truncated: more, Nodes: make([]*governorpb.Node, 0, len(nodes)),
			Waiting: make(map[int64]int32, len(waiting))}
		for _, v := range nodes {
			out.Nodes = append(out.Nodes, toNode(v))
		}
		for id, n := range waiting {
			out.Waiting[int64(id)] = int32(n)
		}
		return out, nil
	})
}
