package server

import (
	"context"
	"crypto/sha256"
	"fmt"
	"path"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor/engine"
)

// The shell of admission (admission.go): which lane a call takes, the
// interceptor that makes it wait its turn, and the refusal it gets.

// The status detail of a call refused by admission: RESOURCE_EXHAUSTED
// with an errdetails.RetryInfo (when to send it again) and an
// errdetails.ErrorInfo with one of these reasons, in ThrottledDomain. The
// SDK waits the RetryInfo's delay and sends the call again; a quota
// denial, which carries a Denial and no RetryInfo, is final.
const (
	ThrottledBusy   = "API_BUSY" // the tenant's calls in flight and queue are full
	ThrottledRate   = "API_RATE" // the tenant is over its api_rate
	ThrottledDomain = "governor"
)

// The refusals' reasons as metrics label them (why).
const (
	refusedBusy = "busy"
	refusedRate = "api_rate"
)

// refusal is a call admission turned away.
type refusal struct {
	lane       string // the tenant ("" for the admin's lane)
	why        string // refusedBusy or refusedRate
	retryAfter time.Duration
}

func (r *refusal) Error() string { return r.status().Message() }

func (r *refusal) status() *status.Status {
	who := fmt.Sprintf("tenant %q", r.lane)
	if r.lane == "" {
		who = "the admin key's sessions"
	}
	msg := fmt.Sprintf("%s have as many calls in flight and queued as governord allows; try again in %v", who, r.retryAfter)
	reason := ThrottledBusy
	if r.why == refusedRate {
		msg = fmt.Sprintf("%s are over their api_rate; try again in %v", who, r.retryAfter)
		reason = ThrottledRate
	}
	st, err := status.New(codes.ResourceExhausted, msg).WithDetails(
		&errdetails.RetryInfo{RetryDelay: durationpb.New(r.retryAfter)},
		&errdetails.ErrorInfo{Reason: reason, Domain: ThrottledDomain})
	if err != nil {
		return status.New(codes.ResourceExhausted, msg)
	}
	return st
}

// GRPCStatus makes a refusal a gRPC status as it leaves the handler.
func (r *refusal) GRPCStatus() *status.Status { return r.status() }

// The lanes a call may take.
const (
	laneWork    = "work"    // new work: waits its turn in its tenant's lane
	laneControl = "control" // keeps sessions alive or frees capacity: never waits
)

// callLane says which lane a call takes. Control calls are heartbeats,
// releases, closing a session, and give-backs: a call sent again to
// abandon, a ResizeBlock or Reserve that only returns or settles. Every
// other call of the Governor service is work; calls of other services
// (health, reflection) are not admitted at all ("").
func callLane(method string, req any) string {
	if !strings.HasPrefix(method, "/"+governorpb.Governor_ServiceDesc.ServiceName+"/") {
		return ""
	}
	switch path.Base(method) {
	case "Heartbeat", "Release", "CloseSession":
		return laneControl
	}
	if r, ok := req.(interface{ GetAbandon() bool }); ok && r.GetAbandon() {
		return laneControl
	}
	switch r := req.(type) {
	case *governorpb.ResizeBlockRequest:
		if r.GetWant() == 0 {
			return laneControl
		}
	case *governorpb.ReserveRequest:
		if r.GetWant() == 0 {
			return laneControl
		}
	}
	return laneWork
}

// admitted is what the interceptor leaves in a call's context: its
// session, once authenticated, and its place.
type admitted struct {
	sid    engine.SessionID
	ticket *ticket
}

type admittedKey struct{}

// admitUnary puts each call of new work in its tenant's lane, and times
// every call by tenant.
func (s *Server) admitUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	kind := callLane(info.FullMethod, req)
	if kind == "" || s.adm == nil {
		return h(ctx, req)
	}
	began := time.Now()
	var l *lane
	var a admitted
	if r, ok := req.(*governorpb.OpenSessionRequest); ok {
		if scope, ok := s.keys[sha256.Sum256([]byte(r.GetApiKey()))]; ok {
			l = s.adm.laneOf(int64(scope))
		}
	} else if sid, scope, ok := s.sessionOf(ctx); ok {
		a.sid = sid
		l = s.adm.laneOf(int64(scope))
	}
	if l == nil {
		return h(ctx, req) // the handler refuses it: no session, or no key
	}
	defer func() { s.metrics.callTime(l.name, kind, time.Since(began)) }()
	if kind == laneWork {
		t, err := s.adm.enter(ctx, l)
		if err != nil {
			if r, ok := err.(*refusal); ok {
				s.metrics.refused(r.lane, r.why)
			}
			return nil, err
		}
		defer t.finish()
		a.ticket = t
	}
	resp, err := h(context.WithValue(ctx, admittedKey{}, &a), req)
	if err != nil {
		s.countRateRefusal(l.name, err)
	}
	return resp, err
}

// countRateRefusal counts a call refused for rate, by the caller's tenant.
func (s *Server) countRateRefusal(tenant string, err error) {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.ResourceExhausted {
		return
	}
	for _, d := range st.Details() {
		if r, ok := d.(*governorpb.RateLimited); ok {
			s.metrics.rateRefusal(tenant, r.GetResource())
			return
		}
	}
}

// sessionOf resolves the call's session without answering: the handler
// authenticates, and says what is wrong.
func (s *Server) sessionOf(ctx context.Context) (engine.SessionID, engine.NodeID, bool) {
	token, ok := bearer(ctx)
	if !ok {
		return 0, 0, false
	}
	return s.eng.SessionByToken(hashToken(token))
}

// leaveAdmission gives the call's place back before it is answered: an
// acquire that waits in the engine's queue, or a charge that waits for
// reservations being recalled, holds no place meanwhile.
func leaveAdmission(ctx context.Context) {
	if a, ok := ctx.Value(admittedKey{}).(*admitted); ok {
		a.ticket.finish()
	}
}

// admissionLanes builds the lanes from the configuration: the admin's
// first, then the tenants' in the order configured.
func (s *Server) admissionLanes() map[string]*lane {
	c := s.cfg.Admission
	a := newAdmission(c.MaxInFlight, time.Now)
	lanes := map[string]*lane{}
	a.addLane("", laneLimits{Weight: c.AdminWeight, MaxInFlight: c.TenantMaxInFlight, MaxQueued: c.TenantMaxQueued})
	for _, t := range s.cfg.Tenants {
		lim := laneLimits{Weight: int(t.Weight), MaxInFlight: c.TenantMaxInFlight, MaxQueued: c.TenantMaxQueued, Rate: t.APIRate}
		if t.MaxInFlight > 0 {
			lim.MaxInFlight = t.MaxInFlight
		}
		if t.MaxQueued != nil {
			lim.MaxQueued = *t.MaxQueued
		}
		lanes[t.Name] = a.addLane(t.Name, lim)
	}
	s.adm = a
	return lanes
}
