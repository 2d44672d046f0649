package server

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor/engine"
)

// How the sessions' blocks are used where they were delegated, as their
// holders report it (ReportBlockUse), for Inspect: a block's slots are
// charged here whole, and only its holder knows which of them hold work.
// Reports are not state: a restart forgets them until the next.

const (
	// maxBlockUses bounds the blocks of one report.
	maxBlockUses = 10_000
	// blockUseKeep is how long a session's last report is kept: a holder
	// reports again well within it, so a report older than it is a dead
	// session's.
	blockUseKeep = time.Minute
)

type blockUseKey struct {
	node  int64
	class string
}

// blockUseReport is a session's last report.
type blockUseReport struct {
	at     int64                    // unix nanoseconds, governord's clock
	blocks map[blockUseKey][2]int64 // slots in use, and since when the oldest (unix ns)
}

// blockUses are the sessions' last reports.
type blockUses struct {
	mu      sync.Mutex
	reports map[engine.SessionID]blockUseReport
	pruned  int // the map's size after the last prune
}

func (b *blockUses) put(sid engine.SessionID, r blockUseReport) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.reports == nil {
		b.reports = map[engine.SessionID]blockUseReport{}
	}
	b.reports[sid] = r
	// Dead sessions' reports go, amortized over the reports that grow
	// the map, so that it stays about the size of the live sessions.
	if len(b.reports) > 2*b.pruned+64 {
		b.pruneLocked(r.at)
	}
}

func (b *blockUses) pruneLocked(now int64) {
	for sid, r := range b.reports {
		if now-r.at > int64(blockUseKeep) {
			delete(b.reports, sid)
		}
	}
	b.pruned = len(b.reports)
}

// fill sets what sid's last report says of its block l.
func (b *blockUses) fill(l *governorpb.LeaseInfo, now int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	r, ok := b.reports[engine.SessionID(l.GetSessionId())]
	if !ok || now-r.at > int64(blockUseKeep) {
		return
	}
	l.UseReported = timestamppb.New(time.Unix(0, r.at))
	if u, ok := r.blocks[blockUseKey{l.GetNodeId(), l.GetClass()}]; ok {
		// The block may have shrunk since: never more in use than held.
		l.InUse = min(u[0], l.GetCount())
		l.InUseSince = timestamppb.New(time.Unix(0, u[1]))
	}
}

// ReportBlockUse keeps the session's report of its blocks' use for Inspect.
// It records nothing durable, so it does not wait for the store.
func (s *Server) ReportBlockUse(ctx context.Context, req *governorpb.ReportBlockUseRequest) (*governorpb.ReportBlockUseResponse, error) {
	sid, err := s.authenticate(ctx)
	if err != nil {
		return nil, err
	}
	if len(req.GetBlocks()) > maxBlockUses {
		return nil, status.Errorf(codes.InvalidArgument, "%d blocks in one report; at most %d", len(req.GetBlocks()), maxBlockUses)
	}
	now := time.Now().UnixNano()
	r := blockUseReport{at: now, blocks: make(map[blockUseKey][2]int64, len(req.GetBlocks()))}
	for i, u := range req.GetBlocks() {
		if err := required("node_id", u.GetNodeId()); err != nil {
			return nil, err
		}
		switch c := u.GetClass(); {
		case c == "" || len(c) > engine.MaxNameLen:
			return nil, status.Errorf(codes.InvalidArgument, "blocks[%d]: class is empty or longer than %d bytes", i, engine.MaxNameLen)
		case u.GetInUse() < 1:
			return nil, status.Errorf(codes.InvalidArgument, "blocks[%d]: in_use %d is not 1 or more", i, u.GetInUse())
		case u.GetOldest().AsDuration() < 0:
			return nil, status.Errorf(codes.InvalidArgument, "blocks[%d]: oldest is negative", i)
		}
		r.blocks[blockUseKey{u.GetNodeId(), u.GetClass()}] = [2]int64{u.GetInUse(), now - int64(u.GetOldest().AsDuration())}
	}
	s.blockUse.put(sid, r)
	return &governorpb.ReportBlockUseResponse{}, nil
}
