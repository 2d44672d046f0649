package server

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor/engine"
	"github.com/governor-project/governor/internal/tracing"
	"github.com/governor-project/governor/server/serverconfig"
	"github.com/governor-project/governor/store"
)

const (
	maxRequestID    = 128
	defaultPageSize = 100
	maxPageSize     = 1000
)

// authenticate resolves the session named by the call's bearer token.
// A call admission let in has been resolved already (admitcall.go); the
// engine still checks the session on every operation.
func (s *Server) authenticate(ctx context.Context) (engine.SessionID, error) {
	if a, ok := ctx.Value(admittedKey{}).(*admitted); ok && a.sid != 0 {
		return a.sid, nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	if len(md.Get("authorization")) == 0 {
		return 0, status.Error(codes.Unauthenticated, "no session: send \"authorization: Bearer <session_token>\" from OpenSession")
	}
	token, ok := bearer(ctx)
	if !ok {
		return 0, status.Error(codes.Unauthenticated, "the authorization metadata is not \"Bearer <session_token>\"")
	}
	sid, _, ok := s.eng.SessionByToken(hashToken(token))
	if !ok {
		return 0, status.Error(codes.Unauthenticated, "unknown or expired session; open a new one")
	}
	return sid, nil
}

// bearer is the session token in the call's "authorization" metadata.
func bearer(ctx context.Context) (string, bool) {
	md, _ := metadata.FromIncomingContext(ctx)
	auth := md.Get("authorization")
	if len(auth) == 0 {
		return "", false
	}
	token, ok := strings.CutPrefix(auth[0], "Bearer ")
	return token, ok && token != ""
}

func hashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// durable waits until every event the engine has emitted so far is
// committed: write before reply.
func (s *Server) durable(ctx context.Context) error {
	if tracing.Enabled() {
		var end func()
		ctx, end = commitWaitSpan(ctx)
		defer end()
	}
	err := s.events.WaitDurable(ctx, s.eng.Seq())
	switch {
	case err == nil:
		// With ha, no answer leaves a leader whose term has ended (ha.go).
		return s.servingErr()
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	case errors.Is(err, store.ErrLogStopped):
		return status.Error(codes.Unavailable, "governord is stopping")
	}
	return status.Errorf(codes.Unavailable, "governord cannot record changes: %v", err)
}

// required refuses a zero id, as the API documents, before anything else.
func required(field string, id int64) error {
	if id == 0 {
		return status.Errorf(codes.InvalidArgument, "%s is required", field)
	}
	return nil
}

// call authenticates, runs op once per request id at a time, waits until
// what it did is durable, and maps its error to a status.
func call[T any](s *Server, ctx context.Context, requestID string, op func(sid engine.SessionID) (T, error)) (T, error) {
	return grantCall(s, ctx, requestID, func(sid engine.SessionID) (T, func(), error) {
		v, err := op(sid)
		return v, nil, err
	})
}

// answer is what an op answered, with the func that gives back what it
// granted (nil when it granted nothing).
type answer struct {
	v        any
	giveBack func()
}

// grantCall is call for an op that grants: a lease, slots of a block, units
// of a reservation. A caller gone before its answer could reach it (its
// context ended while the grant waited for its commit, or it abandoned the
// request id) would hold the grant without knowing it, so the grant is
// given back, durably, and the caller is told it was cancelled: nothing is
// held.
func grantCall[T any](s *Server, ctx context.Context, requestID string, op func(sid engine.SessionID) (T, func(), error)) (T, error) {
	var zero T
	sid, err := s.authenticate(ctx)
	if err != nil {
		return zero, err
	}
	if len(requestID) > maxRequestID {
		return zero, status.Errorf(codes.InvalidArgument, "request_id is longer than %d bytes", maxRequestID)
	}
	run := func() (any, error) {
		v, giveBack, err := op(sid)
		if derr := s.durable(ctx); derr != nil {
			return answer{giveBack: giveBack}, derr
		}
		return answer{v: v, giveBack: giveBack}, err
	}
	var res any
	if requestID == "" {
		res, err = run()
	} else {
		res, err = s.flights.do(ctx, flightKey{session: sid, request: requestID}, run)
	}
	a, _ := res.(answer)
	if a.giveBack != nil && (err == nil || isContextError(err)) {
		if gone := s.gone(ctx, sid, requestID); gone != nil {
			a.giveBack()
			s.metrics.givenBack(givenBackWhy(gone))
			if derr := s.durable(context.WithoutCancel(ctx)); derr != nil {
				return zero, toStatus(derr)
			}
			return zero, toStatus(gone)
		}
	}
	if err != nil {
		return zero, toStatus(err)
	}
	v, _ := a.v.(T)
	return v, nil
}

// gone says why the caller of a request can no longer be told its answer
// (its context ended, or it abandoned the request id), or nil while it can.
func (s *Server) gone(ctx context.Context, sid engine.SessionID, requestID string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if requestID != "" && s.flights.isAbandoned(flightKey{session: sid, request: requestID}) {
		return status.Error(codes.Canceled, "the caller abandoned this request id: what it was granted is given back")
	}
	return nil
}

// givenBackWhy is the metrics label for a give-back because of gone.
func givenBackWhy(gone error) string {
	if isContextError(gone) {
		return "caller_gone"
	}
	return "abandoned"
}

func isContextError(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// abandon serves a request sent again with abandon set: its caller gave up
// on the first without an answer. The id is marked first, so that a copy
// still on its way gives back what it gets (grantCall), and then giveBack
// gives back what the session remembers the id got, and says whether
// there was any.
func abandon[T any](s *Server, ctx context.Context, requestID string, giveBack func(sid engine.SessionID) (T, bool, error)) (T, error) {
	var zero T
	if requestID == "" {
		return zero, status.Error(codes.InvalidArgument, "abandon needs the request_id of the call given up on")
	}
	if len(requestID) > maxRequestID {
		return zero, status.Errorf(codes.InvalidArgument, "request_id is longer than %d bytes", maxRequestID)
	}
	sid, err := s.authenticate(ctx)
	if err != nil {
		return zero, err
	}
	s.flights.abandon(flightKey{session: sid, request: requestID}, time.Now())
	v, given, err := giveBack(sid)
	if derr := s.durable(ctx); derr != nil {
		return zero, toStatus(derr)
	}
	if err != nil {
		return zero, toStatus(err)
	}
	if given {
		s.metrics.givenBack("abandoned")
	}
	return v, nil
}

func (s *Server) OpenSession(ctx context.Context, req *governorpb.OpenSessionRequest) (*governorpb.OpenSessionResponse, error) {
	scope, ok := s.keys[sha256.Sum256([]byte(req.GetApiKey()))]
	if !ok || req.GetApiKey() == "" {
		return nil, status.Error(codes.Unauthenticated, "unknown API key")
	}
	ttl := s.cfg.SessionTTL
	if d := req.GetTtl(); d != nil {
		if err := d.CheckValid(); err != nil || d.AsDuration() < 0 {
			return nil, status.Error(codes.InvalidArgument, "ttl is not a valid non-negative duration")
		}
		if d.AsDuration() > 0 {
			// A longer ask gets max_session_ttl: the client uses the TTL
			// the answer carries.
			ttl = min(max(d.AsDuration(), serverconfig.MinSessionTTL), s.cfg.MaxSessionTTL)
		}
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return nil, status.Errorf(codes.Internal, "session token: %v", err)
	}
	token := base64.RawURLEncoding.EncodeToString(raw)
	if _, err := s.eng.OpenSession(scope, hashToken(token), ttl); err != nil {
		return nil, toStatus(err)
	}
	s.wakeReaper()
	if err := s.durable(ctx); err != nil {
		return nil, toStatus(err)
	}
	return &governorpb.OpenSessionResponse{SessionToken: token, ScopeNodeId: int64(scope),
		Ttl: durationpb.New(ttl), HeartbeatInterval: durationpb.New(ttl / 3)}, nil
}

// Heartbeat renews the session. It records nothing, so unless it found the
// session expired (which is recorded) it does not wait for the store: a slow
// commit must not cost a healthy worker its session.
func (s *Server) Heartbeat(ctx context.Context, _ *governorpb.HeartbeatRequest) (*governorpb.HeartbeatResponse, error) {
	sid, err := s.authenticate(ctx)
	if err != nil {
		return nil, err
	}
	ttl, err := s.eng.Heartbeat(sid)
	if err != nil {
		if derr := s.durable(ctx); derr != nil {
			return nil, toStatus(derr)
		}
		return nil, toStatus(err)
	}
	return &governorpb.HeartbeatResponse{Ttl: durationpb.New(ttl)}, nil
}

func (s *Server) CloseSession(ctx context.Context, req *governorpb.CloseSessionRequest) (*governorpb.CloseSessionResponse, error) {
	return call(s, ctx, req.GetRequestId(), func(sid engine.SessionID) (*governorpb.CloseSessionResponse, error) {
		return &governorpb.CloseSessionResponse{}, s.eng.CloseSession(sid)
	})
}

func (s *Server) CreateNode(ctx context.Context, req *governorpb.CreateNodeRequest) (*governorpb.Node, error) {
	if err := required("parent_id", req.GetParentId()); err != nil {
		return nil, err
	}
	spec, err := nodeSpec(req.GetSpec())
	if err != nil {
		return nil, err
	}
	return call(s, ctx, req.GetRequestId(), func(sid engine.SessionID) (*governorpb.Node, error) {
		v, err := s.eng.CreateNode(sid, engine.NodeID(req.GetParentId()), spec, req.GetRequestId())
		return nodeOrNil(v, err)
	})
}

func (s *Server) FindOrCreateNode(ctx context.Context, req *governorpb.FindOrCreateNodeRequest) (*governorpb.FindOrCreateNodeResponse, error) {
	if err := required("parent_id", req.GetParentId()); err != nil {
		return nil, err
	}
	spec, err := nodeSpec(req.GetSpec())
	if err != nil {
		return nil, err
	}
	return call(s, ctx, req.GetRequestId(), func(sid engine.SessionID) (*governorpb.FindOrCreateNodeResponse, error) {
		v, created, err := s.eng.FindOrCreate(sid, engine.NodeID(req.GetParentId()), spec, req.GetRequestId())
		if err != nil {
			return nil, err
		}
		return &governorpb.FindOrCreateNodeResponse{Node: toNode(v), Created: created}, nil
	})
}

func (s *Server) GetNode(ctx context.Context, req *governorpb.GetNodeRequest) (*governorpb.Node, error) {
	if req.GetPath() != "" {
		return s.getNodeByPath(ctx, req)
	}
	if err := required("node_id", req.GetNodeId()); err != nil {
		return nil, err
	}
	return call(s, ctx, "", func(sid engine.SessionID) (*governorpb.Node, error) {
		return nodeOrNil(s.eng.Get(sid, engine.NodeID(req.GetNodeId())))
	})
}

func (s *Server) ListChildren(ctx context.Context, req *governorpb.ListChildrenRequest) (*governorpb.ListChildrenResponse, error) {
	if err := required("node_id", req.GetNodeId()); err != nil {
		return nil, err
	}
	size := int(req.GetPageSize())
	switch {
	case size < 0:
		return nil, status.Error(codes.InvalidArgument, "page_size is negative")
	case size == 0:
		size = defaultPageSize
	case size > maxPageSize:
		size = maxPageSize
	}
	var after int64
	if tok := req.GetPageToken(); tok != "" {
		v, err := strconv.ParseInt(tok, 10, 64)
		if err != nil || v < 0 {
			return nil, status.Error(codes.InvalidArgument, "page_token is not one this server gave out")
		}
		after = v
	}
	return call(s, ctx, "", func(sid engine.SessionID) (*governorpb.ListChildrenResponse, error) {
		views, err := s.eng.Children(sid, engine.NodeID(req.GetNodeId()), engine.NodeID(after), size+1)
		if err != nil {
			return nil, err
		}
		resp := &governorpb.ListChildrenResponse{}
		if len(views) > size {
			views = views[:size]
			resp.NextPageToken = strconv.FormatInt(int64(views[size-1].ID), 10)
		}
		for _, v := range views {
			resp.Nodes = append(resp.Nodes, toNode(v))
		}
		return resp, nil
	})
}

func (s *Server) CancelNode(ctx context.Context, req *governorpb.CancelNodeRequest) (*governorpb.Node, error) {
	return s.endNode(ctx, req.GetRequestId(), req.GetNodeId(), engine.Cancelled)
}

func (s *Server) CloseNode(ctx context.Context, req *governorpb.CloseNodeRequest) (*governorpb.Node, error) {
	return s.endNode(ctx, req.GetRequestId(), req.GetNodeId(), engine.Closed)
}

func (s *Server) endNode(ctx context.Context, requestID string, id int64, state engine.State) (*governorpb.Node, error) {
	if err := required("node_id", id); err != nil {
		return nil, err
	}
	return call(s, ctx, requestID, func(sid engine.SessionID) (*governorpb.Node, error) {
		return nodeOrNil(s.eng.EndNode(sid, engine.NodeID(id), state, requestID))
	})
}

func (s *Server) Consume(ctx context.Context, req *governorpb.ConsumeRequest) (*governorpb.ConsumeResponse, error) {
	if err := required("node_id", req.GetNodeId()); err != nil {
		return nil, err
	}
	if err := checkAmount("amount", req.GetAmount(), 1); err != nil {
		return nil, err
	}
	return call(s, ctx, req.GetRequestId(), func(sid engine.SessionID) (*governorpb.ConsumeResponse, error) {
		return &governorpb.ConsumeResponse{}, s.denied(req.GetNodeId(), s.untilRecalled(ctx, func() error {
			return s.eng.Consume(sid, engine.NodeID(req.GetNodeId()), req.GetResource(), req.GetAmount(), req.GetRequestId())
		}))
	})
}

func (s *Server) Acquire(ctx context.Context, req *governorpb.AcquireRequest) (*governorpb.Lease, error) {
	if err := required("node_id", req.GetNodeId()); err != nil {
		return nil, err
	}
	if req.GetClass() == "" {
		return nil, status.Error(codes.InvalidArgument, "class is empty")
	}
	r := engine.AcquireRequest{Node: engine.NodeID(req.GetNodeId()), Class: req.GetClass(), RequestID: req.GetRequestId(),
		Write: req.GetWrite()}
	if req.GetAbandon() {
		return abandon(s, ctx, r.RequestID, func(sid engine.SessionID) (*governorpb.Lease, bool, error) {
			id, err := s.eng.GiveBack(sid, r, 0)
			return &governorpb.Lease{Id: int64(id), NodeId: int64(r.Node), Class: r.Class}, id != 0, err
		})
	}
	return grantCall(s, ctx, r.RequestID, func(sid engine.SessionID) (*governorpb.Lease, func(), error) {
		g, err := s.acquire(ctx, sid, r)
		if err != nil {
			return nil, nil, err
		}
		return toLease(g), s.leaseGiveBack(sid, r, g), nil
	})
}

func (s *Server) ChargeAndAcquire(ctx context.Context, req *governorpb.ChargeAndAcquireRequest) (*governorpb.ChargeAndAcquireResponse, error) {
	if err := required("node_id", req.GetNodeId()); err != nil {
		return nil, err
	}
	if err := checkCharges("charges", req.GetCharges()); err != nil {
		return nil, err
	}
	r := engine.AcquireRequest{Node: engine.NodeID(req.GetNodeId()), Class: req.GetClass(),
		Charges: req.GetCharges(), RequestID: req.GetRequestId(), Write: req.GetWrite(), WaitRate: req.GetWaitForRate()}
	if req.GetAbandon() {
		return abandon(s, ctx, r.RequestID, func(sid engine.SessionID) (*governorpb.ChargeAndAcquireResponse, bool, error) {
			resp := &governorpb.ChargeAndAcquireResponse{}
			if r.Class == "" { // a charge without a lease
				given, err := s.eng.GiveBackCharged(sid, r)
				return resp, given, err
			}
			id, err := s.eng.GiveBack(sid, r, 0)
			if id != 0 {
				resp.Lease = &governorpb.Lease{Id: int64(id), NodeId: int64(r.Node), Class: r.Class}
			}
			return resp, id != 0, err
		})
	}
	return grantCall(s, ctx, r.RequestID, func(sid engine.SessionID) (*governorpb.ChargeAndAcquireResponse, func(), error) {
		g, err := s.acquire(ctx, sid, r)
		if err != nil {
			return nil, nil, err
		}
		resp := &governorpb.ChargeAndAcquireResponse{}
		if g.Lease != 0 {
			resp.Lease = toLease(g)
		}
		return resp, s.leaseGiveBack(sid, r, g), nil
	})
}

// leaseGiveBack is what gives g back, whole, if its caller is gone: its
// lease and charges, or the charges of a grant without a lease, which its
// request id names (nil without one: nothing can name the charge).
func (s *Server) leaseGiveBack(sid engine.SessionID, r engine.AcquireRequest, g engine.Grant) func() {
	if g.Lease == 0 && r.RequestID == "" {
		return nil
	}
	if g.Lease == 0 {
		return func() {
			if _, err := s.eng.GiveBackCharged(sid, r); err != nil {
				s.log.Warn("a charge whose caller went away was not given back; it stands", "request_id", r.RequestID, "err", err)
			}
		}
	}
	return func() {
		if _, err := s.eng.GiveBack(sid, r, g.Lease); err != nil {
			s.log.Warn("a lease whose caller went away was not given back; it ends with its session", "lease", g.Lease, "err", err)
		}
	}
}

// acquire waits, outside the engine's lock, for a queued acquire. A caller
// that goes away, or a server that stops, withdraws the wait; a grant that
// raced the withdrawal is given back by the engine.
func (s *Server) acquire(ctx context.Context, sid engine.SessionID, r engine.AcquireRequest) (engine.Grant, error) {
	var g engine.Grant
	err := s.untilRecalled(ctx, func() error {
		var err error
		g, err = s.acquireOnce(ctx, sid, r)
		return err
	})
	return g, s.denied(int64(r.Node), err)
}

// acquireOnce is one try of acquire. Its charges may meet reservations being
// recalled, at once or when its turn comes in the queue.
func (s *Server) acquireOnce(ctx context.Context, sid engine.SessionID, r engine.AcquireRequest) (engine.Grant, error) {
	g, wait, err := s.eng.Acquire(sid, r)
	if err != nil || wait == nil {
		return g, err
	}
	leaveAdmission(ctx) // a held-up acquire keeps no one else's call out
	s.metrics.waiting(1)
	defer s.metrics.waiting(-1)
	began := time.Now()
	select {
	case o := <-wait.C:
		s.metrics.waited(time.Since(began))
		return o.Grant, o.Err
	case <-ctx.Done():
		s.eng.CancelWait(wait)
		return engine.Grant{}, ctx.Err()
	case <-s.stopping:
		s.eng.CancelWait(wait)
		return engine.Grant{}, status.Error(codes.Unavailable, "governord is stopping")
	}
}

func (s *Server) Release(ctx context.Context, req *governorpb.ReleaseRequest) (*governorpb.ReleaseResponse, error) {
	if err := required("lease_id", req.GetLeaseId()); err != nil {
		return nil, err
	}
	var latency time.Duration
	if d := req.GetLatency(); d != nil {
		if d.CheckValid() != nil || d.AsDuration() < 0 {
			return nil, status.Error(codes.InvalidArgument, "latency is not a valid non-negative duration")
		}
		latency = d.AsDuration()
	}
	return call(s, ctx, req.GetRequestId(), func(sid engine.SessionID) (*governorpb.ReleaseResponse, error) {
		return &governorpb.ReleaseResponse{}, s.eng.Release(sid, engine.LeaseID(req.GetLeaseId()), latency, req.GetOverloaded(), req.GetRequestId())
	})
}

func (s *Server) Validate(ctx context.Context, req *governorpb.ValidateRequest) (*governorpb.Lease, error) {
	if err := required("lease_id", req.GetLeaseId()); err != nil {
		return nil, err
	}
	return call(s, ctx, "", func(sid engine.SessionID) (*governorpb.Lease, error) {
		g, err := s.eng.Validate(sid, engine.LeaseID(req.GetLeaseId()))
		if err != nil {
			return nil, err
		}
		return toLease(g), nil
	})
}

func (s *Server) SetCaps(ctx context.Context, req *governorpb.SetCapsRequest) (*governorpb.Node, error) {
	if err := required("node_id", req.GetNodeId()); err != nil {
		return nil, err
	}
	edit := engine.CapsEdit{Quotas: req.GetQuotas(), Limits: req.GetLimits(),
		DefaultQuotas: req.GetDefaultQuotas(), DefaultLimits: req.GetDefaultLimits()}
	if req.Weight != nil {
		w := req.GetWeight()
		if w == 0 {
			w = 1
		}
		edit.Weight = &w
	}
	if req.Priority != nil {
		p := req.GetPriority()
		edit.Priority = &p
	}
	switch {
	case req.GetDeadline() != nil && req.GetClearDeadline():
		return nil, status.Error(codes.InvalidArgument, "deadline and clear_deadline cannot both be set")
	case req.GetClearDeadline():
		var zero int64
		edit.Deadline = &zero
	case req.GetDeadline() != nil:
		if err := req.GetDeadline().CheckValid(); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "deadline: %v", err)
		}
		d := req.GetDeadline().AsTime().UnixNano()
		edit.Deadline = &d
	}
	audit, err := capsAudit(req)
	if err != nil {
		return nil, err
	}
	if edit.QuotaModes, err = capModes("quota_modes", req.GetQuotaModes()); err != nil {
		return nil, err
	}
	if edit.LimitModes, err = capModes("limit_modes", req.GetLimitModes()); err != nil {
		return nil, err
	}
	edit.Minimums = capMinimums(req.GetMinimums())
	if edit.Rates, err = ratesFromPB("rates", req.GetRates()); err != nil {
		return nil, err
	}
	if edit.DefaultRates, err = ratesFromPB("default_rates", req.GetDefaultRates()); err != nil {
		return nil, err
	}
	if edit.QuotaPeriods, err = periodsFromPB("quota_periods", req.GetQuotaPeriods()); err != nil {
		return nil, err
	}
	if edit.DefaultQuotaPeriods, err = periodsFromPB("default_quota_periods", req.GetDefaultQuotaPeriods()); err != nil {
		return nil, err
	}
	return call(s, ctx, req.GetRequestId(), func(sid engine.SessionID) (*governorpb.Node, error) {
		return nodeOrNil(s.eng.SetCapsAudited(sid, engine.NodeID(req.GetNodeId()), edit, audit, req.GetRequestId()))
	})
}

func nodeSpec(p *governorpb.NodeSpec) (engine.NodeSpec, error) {
	if p == nil {
		return engine.NodeSpec{}, status.Error(codes.InvalidArgument, "spec is missing")
	}
	spec := engine.NodeSpec{Name: p.GetName(), Quotas: p.GetQuotas(), Limits: p.GetLimits(),
		DefaultQuotas: p.GetDefaultQuotas(), DefaultLimits: p.GetDefaultLimits(),
		Weight: p.GetWeight(), Priority: p.GetPriority()}
	if d := p.GetDeadline(); d != nil {
		if err := d.CheckValid(); err != nil {
			return spec, status.Errorf(codes.InvalidArgument, "spec.deadline: %v", err)
		}
		spec.Deadline = d.AsTime().UnixNano()
	}
	var err error
	if spec.Rates, err = ratesFromPB("spec.rates", p.GetRates()); err != nil {
		return spec, err
	}
	if spec.DefaultRates, err = ratesFromPB("spec.default_rates", p.GetDefaultRates()); err != nil {
		return spec, err
	}
	if spec.QuotaPeriods, err = periodsFromPB("spec.quota_periods", p.GetQuotaPeriods()); err != nil {
		return spec, err
	}
	if spec.DefaultQuotaPeriods, err = periodsFromPB("spec.default_quota_periods", p.GetDefaultQuotaPeriods()); err != nil {
		return spec, err
	}
	return spec, nil
}

func nodeOrNil(v engine.NodeView, err error) (*governorpb.Node, error) {
	if err != nil {
		return nil, err
	}
	return toNode(v), nil
}

func toNode(v engine.NodeView) *governorpb.Node {
	n := &governorpb.Node{Id: int64(v.ID), ParentId: int64(v.Parent), Name: v.Name, Kind: nodeKind(v.Kind),
		State: nodeState(v.State), Quotas: v.Quotas, Used: v.Used, Reserved: v.Reserved, Limits: v.Limits, Held: v.Held,
		DefaultQuotas: v.DefaultQuotas, DefaultLimits: v.DefaultLimits, Priority: v.Priority,
		QuotaModes: toCapModes(v.QuotaModes), LimitModes: toCapModes(v.LimitModes), Shadow: v.Shadow,
		Rates: bucketRates(v.Rates), DefaultRates: toRates(v.DefaultRates),
		QuotaPeriods: toPeriods(windowPeriods(v.Periods)), DefaultQuotaPeriods: toPeriods(v.DefaultQuotaPeriods)}
	if v.Kind == engine.KindTenant {
		n.Weight = v.Weight
		n.TenantState, n.TenantStateReason = v.TenantState.String(), v.TenantStateReason
		n.Minimums = toMinimums(v.Minimums)
	}
	if v.Deadline != 0 {
		n.Deadline = timestamppb.New(time.Unix(0, v.Deadline))
	}
	if v.Created != 0 {
		n.Created = timestamppb.New(time.Unix(0, v.Created))
	}
	return n
}

func toLease(g engine.Grant) *governorpb.Lease {
	return &governorpb.Lease{Id: int64(g.Lease), NodeId: int64(g.Node), Class: g.Class}
}
