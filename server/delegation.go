package server

import (
	"context"
	"errors"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor/engine"
)

// Delegated budgets: the calls a sidecar grants from (ResizeBlock, Reserve,
// ReportSamples), the Watch stream that tells it when to give back, and the
// wait of a charge held up by other sessions' reservations while they are
// recalled.

func (s *Server) ResizeBlock(ctx context.Context, req *governorpb.ResizeBlockRequest) (*governorpb.Block, error) {
	if err := required("node_id", req.GetNodeId()); err != nil {
		return nil, err
	}
	if err := checkAmount("want", req.GetWant(), 0); err != nil {
		return nil, err
	}
	if err := checkAmount("return", req.GetReturn(), 0); err != nil {
		return nil, err
	}
	r := engine.BlockRequest{Node: engine.NodeID(req.GetNodeId()), Class: req.GetClass(),
		Want: req.GetWant(), Return: req.GetReturn(), RequestID: req.GetRequestId()}
	if req.GetAbandon() {
		return abandon(s, ctx, r.RequestID, func(sid engine.SessionID) (*governorpb.Block, bool, error) {
			g, k, err := s.eng.GiveBackBlock(sid, r, 0)
			return toBlock(g), k > 0, err
		})
	}
	return grantCall(s, ctx, r.RequestID, func(sid engine.SessionID) (*governorpb.Block, func(), error) {
		g, err := s.eng.Block(sid, r)
		if err != nil {
			return nil, nil, err
		}
		var giveBack func()
		if g.Granted > 0 {
			giveBack = func() {
				if _, _, err := s.eng.GiveBackBlock(sid, r, g.Granted); err != nil {
					s.log.Warn("slots whose caller went away were not given back; they end with the session", "block", g.Lease, "err", err)
				}
			}
		}
		return toBlock(g), giveBack, nil
	})
}

func toBlock(g engine.BlockGrant) *governorpb.Block {
	b := &governorpb.Block{LeaseId: int64(g.Lease), NodeId: int64(g.Node), Class: g.Class, Count: g.Count,
		Granted: g.Granted, Contended: g.Contended, Adaptive: g.Adaptive}
	if g.ReadOnly != nil {
		b.ReadOnly = tenantRefusal(g.ReadOnly)
	}
	return b
}

func (s *Server) Reserve(ctx context.Context, req *governorpb.ReserveRequest) (*governorpb.Reservation, error) {
	if err := required("node_id", req.GetNodeId()); err != nil {
		return nil, err
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"spent", req.GetSpent()}, {"return", req.GetReturn()}, {"want", req.GetWant()}} {
		if err := checkAmount(f.name, f.v, 0); err != nil {
			return nil, err
		}
	}
	r := engine.ReserveRequest{Node: engine.NodeID(req.GetNodeId()), Resource: req.GetResource(),
		Spent: req.GetSpent(), Return: req.GetReturn(), Want: req.GetWant(), Exact: req.GetExact(), EndSlice: req.GetEndSlice(), RequestID: req.GetRequestId()}
	if req.GetAbandon() {
		return abandon(s, ctx, r.RequestID, func(sid engine.SessionID) (*governorpb.Reservation, bool, error) {
			res, k, err := s.eng.GiveBackReserved(sid, r, 0)
			return toReservation(res), k > 0, err
		})
	}
	return grantCall(s, ctx, r.RequestID, func(sid engine.SessionID) (*governorpb.Reservation, func(), error) {
		var res engine.Reservation
		err := s.untilRecalled(ctx, func() error {
			var err error
			res, err = s.eng.Reserve(sid, r)
			return err
		})
		if err != nil {
			return nil, nil, err
		}
		var giveBack func()
		if res.Granted > 0 {
			giveBack = func() {
				if _, _, err := s.eng.GiveBackReserved(sid, r, res.Granted); err != nil {
					s.log.Warn("units whose caller went away were not given back; they count as spent when the session ends", "err", err)
				}
			}
		}
		return toReservation(res), giveBack, nil
	})
}

func toReservation(r engine.Reservation) *governorpb.Reservation {
	res := &governorpb.Reservation{NodeId: int64(r.Node), Resource: r.Resource, Reserved: r.Reserved, Granted: r.Granted, Rated: r.Rated}
	if r.ReadOnly != nil {
		res.ReadOnly = tenantRefusal(r.ReadOnly)
	}
	if sl := r.Slice; sl != nil {
		res.SliceId, res.SliceUnits, res.SlicePerNs, res.SliceBurst = sl.ID, sl.Rate.Units, sl.Rate.Per, sl.Rate.Burst
		res.SliceTermNs = int64(sl.Left)
	}
	return res
}

// ReportSamples records nothing durable (samples are not state), so it does
// not wait for the store.
func (s *Server) ReportSamples(ctx context.Context, req *governorpb.ReportSamplesRequest) (*governorpb.ReportSamplesResponse, error) {
	sid, err := s.authenticate(ctx)
	if err != nil {
		return nil, err
	}
	lat := req.GetLatenciesNs()
	if over := req.GetOverloaded(); over < 0 || over > int64(len(lat)) {
		return nil, status.Errorf(codes.InvalidArgument, "overloaded is %d of %d calls", over, len(lat))
	}
	samples := make([]engine.Sample, len(lat))
	for i, ns := range lat {
		if ns < 0 {
			return nil, status.Error(codes.InvalidArgument, "a latency is negative")
		}
		samples[i] = engine.Sample{Latency: time.Duration(ns), Overloaded: int64(i) < req.GetOverloaded()}
	}
	before := s.eng.Seq()
	if err := s.eng.Observe(sid, req.GetClass(), samples); err != nil {
		if derr := s.durable(ctx); derr != nil { // an expiry found on the way is recorded
			return nil, toStatus(derr)
		}
		return nil, toStatus(err)
	}
	// The samples may have cut the limit at once: that cut is recorded
	// before the reply, like every change. (Samples that change nothing,
	// the usual case, wait for nothing.)
	if s.eng.Seq() != before {
		if err := s.durable(ctx); err != nil {
			return nil, toStatus(err)
		}
	}
	return &governorpb.ReportSamplesResponse{}, nil
}

// watchCheckEvery is how often a Watch stream checks that its session is
// still alive, so a stream does not outlive the session it serves.
const watchCheckEvery = time.Second

func (s *Server) Watch(_ *governorpb.WatchRequest, stream governorpb.Governor_WatchServer) error {
	ctx := stream.Context()
	sid, err := s.authenticate(ctx)
	if err != nil {
		return err
	}
	w := s.notices.watch(sid)
	defer s.notices.unwatch(sid, w)
	first, err := s.eng.Contention(sid)
	if err != nil {
		return toStatus(err)
	}
	for _, n := range first {
		if err := stream.Send(toNotice(n)); err != nil {
			return err
		}
	}
	check := time.NewTicker(watchCheckEvery)
	defer check.Stop()
	for {
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-s.stopping:
			return status.Error(codes.Unavailable, "governord is stopping")
		case <-w.replaced:
			return status.Error(codes.Aborted, "a newer Watch of this session replaced this one")
		case <-check.C:
			if !s.eng.Alive(sid) {
				return status.Error(codes.Unauthenticated, "the session has ended")
			}
		case <-w.wake:
			for _, n := range w.take() {
				if err := stream.Send(toNotice(n)); err != nil {
					return err
				}
				s.metrics.noticeSent(n.Kind)
			}
		}
	}
}

func toNotice(n engine.Notice) *governorpb.Notice {
	return &governorpb.Notice{Kind: noticeKinds[n.Kind], NodeId: int64(n.Node), Class: n.Class, Resource: n.Resource}
}

// noticeKinds is the engine's notice kinds as the API carries them; a kind
// missing is KIND_UNSPECIFIED.
var noticeKinds = map[engine.NoticeKind]governorpb.Notice_Kind{
	engine.NoticeContended:   governorpb.Notice_KIND_CONTENDED,
	engine.NoticeUncontended: governorpb.Notice_KIND_UNCONTENDED,
	engine.NoticeRecall:      governorpb.Notice_KIND_RECALL,
	engine.NoticeEnded:       governorpb.Notice_KIND_ENDED,
}

// notices hands the engine's notices to the sessions' Watch streams. It is
// the engine's Notifier: Notify runs under the engine's lock, so it only
// queues.
type notices struct {
	mu       sync.Mutex
	watchers map[engine.SessionID]*watcher
}

// watcher is one Watch stream's queue of notices.
type watcher struct {
	mu       sync.Mutex
	pending  []engine.Notice
	seen     map[engine.Notice]bool // pending ones, to drop repeats
	wake     chan struct{}          // holds a token while pending is not empty
	replaced chan struct{}          // closed when a newer Watch takes over
}

// maxPendingNotices bounds a stream that is not read. Past it, the queue
// collapses into "give back everything", which is always safe to act on.
const maxPendingNotices = 4096

func (h *notices) Notify(n engine.Notice) {
	h.mu.Lock()
	w := h.watchers[n.Session]
	h.mu.Unlock()
	if w != nil {
		w.add(n)
	}
}

func (h *notices) watch(sid engine.SessionID) *watcher {
	w := &watcher{seen: map[engine.Notice]bool{}, wake: make(chan struct{}, 1), replaced: make(chan struct{})}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.watchers == nil {
		h.watchers = make(map[engine.SessionID]*watcher)
	}
	if old := h.watchers[sid]; old != nil {
		close(old.replaced)
	}
	h.watchers[sid] = w
	return w
}

func (h *notices) unwatch(sid engine.SessionID, w *watcher) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.watchers[sid] == w {
		delete(h.watchers, sid)
	}
}

func (w *watcher) add(n engine.Notice) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.seen[n] {
		return
	}
	if len(w.pending) >= maxPendingNotices {
		// Contention notices are stale once collapsed; a recall of
		// everything under the root asks the holder to give back all it
		// holds idle, which it may always do.
		all := engine.Notice{Session: n.Session, Kind: engine.NoticeRecall, Node: engine.RootID}
		w.pending, w.seen = []engine.Notice{all}, map[engine.Notice]bool{all: true}
	} else {
		w.pending = append(w.pending, n)
		w.seen[n] = true
	}
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *watcher) take() []engine.Notice {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.pending
	w.pending = nil
	clear(w.seen)
	return out
}

// recallRetry bounds the wait between tries of a charge held up by
// reservations being recalled, in case a settlement's signal is missed.
const recallRetry = 50 * time.Millisecond

// untilRecalled runs op until it stops failing with engine.ErrRecalling:
// the holders of the reservations in its way give back what they have not
// spent (or their sessions end, which counts it as spent), and it then
// fits or is denied for good. It waits for a settlement between tries, and
// gives up when ctx ends or the server stops.
func (s *Server) untilRecalled(ctx context.Context, op func() error) error {
	for {
		changed := s.settlements.next()
		err := op()
		if !errors.Is(err, engine.ErrRecalling) {
			return err
		}
		leaveAdmission(ctx) // a charge held up keeps no one else's call out
		t := time.NewTimer(recallRetry)
		select {
		case <-changed:
			t.Stop()
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-s.stopping:
			t.Stop()
			return status.Error(codes.Unavailable, "governord is stopping")
		}
	}
}

// signal is a broadcast: next returns a channel that is closed at the next
// fire.
type signal struct {
	mu sync.Mutex
	ch chan struct{}
}

func (g *signal) next() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ch == nil {
		g.ch = make(chan struct{})
	}
	return g.ch
}

func (g *signal) fire() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ch != nil {
		close(g.ch)
		g.ch = nil
	}
}

// settles reports whether ev may let a charge held up by reservations go
// on: a settlement that gave units back or spent them, or a session's end.
func settles(ev engine.Event) bool {
	return (ev.Kind == engine.EvReserved && ev.Spent+ev.Returned > 0) || ev.Kind == engine.EvSessionEnded ||
		ev.Kind == engine.EvCapsSet
}
