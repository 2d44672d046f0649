package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor/engine"
	"github.com/governor-project/governor/server/serverconfig"
	"github.com/governor-project/governor/store"
)

// High availability: several governords over one PostgreSQL store, one
// leader and hot standbys (docs/ha.md).
//
// The leader is whoever holds the newest epoch of store.Elector; its
// appends are fenced by that epoch, so a deposed leader's next commit
// fails and the process stops, as on any failed commit. It answers only
// while its term is valid (store.Term: the lease less the drift
// allowance, by its own monotonic clock), checked when a call starts and
// again before any answer is sent (durable), so that a leader paused past
// its lease answers nothing, Validate included, once it wakes.
//
// A standby replays the log as the leader commits it (a notification on
// each commit, and polling), into the same engine it will serve from. It
// decides nothing: expiry and every other decision arrive as the leader's
// events, each carrying the leader's time. It answers every call of the
// Governor service with UNAVAILABLE and a status detail naming the leader
// (standbyError). When the lease ends it campaigns; the winner reads the
// rest of the log (no older leader can append once the epoch moved), waits
// out the drift allowance, gives every live session one fresh TTL, and
// serves. Acquires that waited at the old leader are lost with it: their
// callers got UNAVAILABLE and re-queue at the new one.

// The roles of a governord with ha on.
const (
	roleStandby int32 = iota
	roleLeader
)

// haState is a governord's part in the election. It exists only with ha on.
type haState struct {
	pg      *store.Postgres
	elector *store.Elector
	self    string // the address this governord advertises

	role atomic.Int32
	lag  atomic.Uint64 // events the leader has committed that this one has not applied

	mu     sync.Mutex
	term   store.Term       // while leading
	leader store.LeaderInfo // the newest leadership row read, while standing by

	// tokens holds the sessions table's rows read ahead of the events that
	// open their sessions; maxSession is the newest id read.
	tokens     map[uint64]string
	maxSession uint64

	led chan struct{} // closed once this governord leads

	// hooks for tests: nil in production.
	testHooks *serverconfig.HATestHooks
}

func (h *haState) hooks() serverconfig.HATestHooks {
	if h.testHooks == nil {
		return serverconfig.HATestHooks{}
	}
	return *h.testHooks
}

func newHAState(s *Server) (*haState, error) {
	pg, ok := s.st.(*store.Postgres)
	if !ok {
		return nil, &serverconfig.ConfigError{Key: "ha.enabled", Problem: fmt.Sprintf("needs a PostgreSQL store, not %T", s.st)}
	}
	if s.cfg.HA.Lease == 0 { // a Config built in code
		s.cfg.HA.Lease = serverconfig.DefaultHALease
	}
	if s.cfg.HA.DriftAllowance == 0 {
		s.cfg.HA.DriftAllowance = min(serverconfig.DefaultHADriftAllowance, s.cfg.HA.Lease/4)
	}
	return &haState{pg: pg, tokens: map[uint64]string{}, led: make(chan struct{}), testHooks: s.cfg.HATestHooks}, nil
}

// connect names this governord, once it listens, and opens its Elector.
func (h *haState) connect(s *Server) error {
	self := s.cfg.HA.AdvertiseAddr
	if self == "" {
		self = s.Addr()
	}
	holder := make([]byte, 8)
	rand.Read(holder)
	el, err := h.pg.NewElector(context.Background(), self+"/"+hex.EncodeToString(holder), self, s.cfg.HA.Lease, s.cfg.HA.DriftAllowance)
	if err != nil {
		return err
	}
	h.mu.Lock()
	h.self, h.elector = self, el
	h.mu.Unlock()
	return nil
}

// servingErr is nil while this governord may answer: it has no ha, or it
// leads under a valid term.
func (s *Server) servingErr() error {
	h := s.ha
	if h == nil {
		return nil
	}
	if h.role.Load() != roleLeader {
		return h.standbyError()
	}
	h.mu.Lock()
	term, self := h.term, h.self
	h.mu.Unlock()
	if term.Valid(time.Now()) || h.hooks().IgnoreLease {
		return nil
	}
	return status.Errorf(codes.Unavailable, "governord at %s: its lease as leader (epoch %d) has ended; it is stopping and another governord takes over", self, term.Epoch)
}

// leading says whether the leader's parts (the log, the mirror, usage) are
// in place: always without ha.
func (s *Server) leading() bool { return s.ha == nil || s.ha.role.Load() == roleLeader }

// The status detail a standby sends: an errdetails.ErrorInfo with this
// reason and domain, and the leader's address and epoch in its metadata
// under these keys (absent while no leader is known). The SDK reads it.
const (
	StandbyReason   = "STANDBY"
	StandbyDomain   = "governor"
	StandbyLeader   = "leader"
	StandbyEpoch    = "epoch"
	standbyNoLeader = "no leader is elected yet; try again shortly"
)

// standbyError is UNAVAILABLE naming the leader, in the message and in an
// ErrorInfo detail.
func (h *haState) standbyError() error {
	h.mu.Lock()
	leader, self := h.leader, h.self
	h.mu.Unlock()
	info := &errdetails.ErrorInfo{Reason: StandbyReason, Domain: StandbyDomain, Metadata: map[string]string{}}
	msg := fmt.Sprintf("governord at %s is a standby; ", self)
	if leader.Live && leader.Addr != "" && leader.Addr != self {
		info.Metadata[StandbyLeader] = leader.Addr
		info.Metadata[StandbyEpoch] = strconv.FormatUint(leader.Epoch, 10)
		msg += fmt.Sprintf("the leader is at %s (epoch %d)", leader.Addr, leader.Epoch)
	} else {
		msg += standbyNoLeader
	}
	st, err := status.New(codes.Unavailable, msg).WithDetails(info)
	if err != nil {
		return status.Error(codes.Unavailable, msg)
	}
	return st.Err()
}

// isGovernorCall says whether a method is one of the Governor service's,
// which only the leader answers (health and reflection answer everywhere).
func isGovernorCall(method string) bool {
	return strings.HasPrefix(method, "/"+governorpb.Governor_ServiceDesc.ServiceName+"/")
}

// haUnary and haStream refuse the Governor service's calls unless this
// governord leads under a valid term.
func (s *Server) haUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if isGovernorCall(info.FullMethod) {
		if err := s.servingErr(); err != nil {
			return nil, err
		}
	}
	return h(ctx, req)
}

func (s *Server) haStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if isGovernorCall(info.FullMethod) {
		if err := s.servingErr(); err != nil {
			return err
		}
	}
	return h(srv, ss)
}

// setHealth says in the gRPC health service whether this governord serves.
func (s *Server) setHealth(serving bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if serving {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus("", st)
	s.health.SetServingStatus(governorpb.Governor_ServiceDesc.ServiceName, st)
}

// How a standby follows.
const (
	// followPoll is how often a standby reads the log and the leadership
	// row when no notification wakes it.
	followPoll = 100 * time.Millisecond
	// followBatch is how many records one read of the tail takes.
	followBatch = 4096
	// followGap is the least time between two reads of the tail, the
	// leader's least time between two notifications: a read per commit per
	// standby would cost PostgreSQL and the machines (the leader's) more
	// than it buys.
	followGap = store.NotifyGap
)

// errFellBehind: the records a standby needed next were folded into a
// snapshot and deleted; it must replay the store from the start.
var errFellBehind = errors.New("the standby fell behind a snapshot")

// startStandby serves as a standby and starts following and campaigning.
func (s *Server) startStandby(runCtx context.Context) error {
	// In place before the first call can arrive: it refuses them all.
	h, err := newHAState(s)
	if err != nil {
		return err
	}
	s.ha = h
	if err := s.serve(); err != nil {
		return err
	}
	if err := h.connect(s); err != nil {
		return err
	}
	s.maxSessionFromEngine()
	wake := make(chan struct{}, 1)
	// Listening ends with standing by: a leader has no use for it.
	listenCtx, stopListening := context.WithCancel(runCtx)
	s.wg.Add(2)
	go s.listen(listenCtx, wake)
	go func() {
		defer stopListening()
		s.standBy(runCtx, wake)
	}()
	s.log.Info("governord standing by", "listen", s.Addr(), "advertise", h.self, "metrics", s.MetricsAddr(), "seq", s.eng.Seq(),
		"lease", s.cfg.HA.Lease, "drift_allowance", s.cfg.HA.DriftAllowance)
	return nil
}

// maxSessionFromEngine starts the follower's session ids from the live
// sessions the replay found.
func (s *Server) maxSessionFromEngine() {
	for id := range s.eng.SessionTokens() {
		s.ha.maxSession = max(s.ha.maxSession, uint64(id))
	}
}

// listen wakes the standby on each commit's notification, reconnecting
// after a failure, until ctx ends (when the standby stops standing by). It
// is one of the goroutines s.wg counts.
func (s *Server) listen(ctx context.Context, wake chan<- struct{}) {
	defer s.wg.Done()
	for try := 0; ctx.Err() == nil; try++ {
		l, err := s.ha.pg.Listen(ctx)
		if err == nil {
			try = 0
			for l.Wait(ctx) == nil {
				select {
				case wake <- struct{}{}:
				default:
				}
			}
			l.Close()
		}
		select {
		case <-ctx.Done():
		case <-time.After(min(followPoll<<min(try, 5), 2*time.Second)):
		}
	}
}

// standBy follows the log and campaigns whenever the lease has ended, until
// it wins (then it takes over) or the server stops. It is one of the
// goroutines s.wg counts.
func (s *Server) standBy(ctx context.Context, wake <-chan struct{}) {
	defer s.wg.Done()
	h := s.ha
	t := time.NewTimer(0)
	defer t.Stop()
	var last, leaderRead time.Time
	for {
		woken := false
		select {
		case <-ctx.Done():
			return
		case <-wake:
			if gap := time.Since(last); gap < followGap {
				t.Reset(followGap - gap)
				continue
			}
			woken = true
		case <-t.C:
		}
		last = time.Now()
		next := followPoll
		if err := s.follow(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, errFellBehind) || errors.Is(err, engine.ErrCorrupt) {
				s.die(fmt.Errorf("standby: %w; a restart replays the store", err))
				return
			}
			s.log.Warn("standby: reading the log failed; trying again", "err", err)
		}
		if woken && time.Since(leaderRead) < followPoll {
			// A commit woke it: the leader is alive. Its lease is read at
			// the poll, for which the timer still runs.
			continue
		}
		leaderRead = time.Now()
		info, err := h.elector.Leader(ctx)
		if err != nil {
			s.log.Warn("standby: reading the leadership failed; trying again", "err", err)
			t.Reset(next)
			continue
		}
		h.mu.Lock()
		h.leader = info
		h.mu.Unlock()
		h.lag.Store(info.LastSeq - min(info.LastSeq, s.eng.Seq()))
		if info.Live {
			t.Reset(min(next, info.Left+time.Millisecond))
			continue
		}
		term, won, err := h.elector.Campaign(ctx)
		switch {
		case err != nil:
			s.log.Warn("standby: campaign failed; trying again", "err", err)
		case won:
			if err := s.takeOver(ctx, term); err != nil && ctx.Err() == nil {
				s.die(fmt.Errorf("take over as leader: %w", err))
			}
			return
		}
		t.Reset(next)
	}
}

// follow applies what the leader has committed since this engine's seq.
func (s *Server) follow(ctx context.Context) error {
	h := s.ha
	for {
		seq := s.eng.Seq()
		tail, err := h.pg.ReadTail(ctx, seq, h.maxSession, followBatch)
		if err != nil {
			return err
		}
		for _, row := range tail.Sessions {
			h.tokens[row.ID] = row.TokenHash
			h.maxSession = max(h.maxSession, row.ID)
		}
		if len(tail.Records) == 0 {
			if tail.LastSeq > seq {
				return fmt.Errorf("%w: it has applied %d, the log holds %d, its snapshot is at %d", errFellBehind, seq, tail.LastSeq, tail.SnapshotSeq)
			}
			h.lag.Store(0)
			return nil
		}
		if first := tail.Records[0].Seq; first != seq+1 {
			return fmt.Errorf("%w: it has applied %d, the log's next is %d", errFellBehind, seq, first)
		}
		evs := make([]engine.Event, 0, len(tail.Records))
		for _, r := range tail.Records {
			ev, err := decodeEvent(r, h.tokens)
			if err != nil {
				return err
			}
			if ev.Kind == engine.EvSessionOpened {
				delete(h.tokens, uint64(ev.Session))
			}
			evs = append(evs, ev)
		}
		if err := s.eng.Apply(evs...); err != nil {
			return fmt.Errorf("apply the leader's events: %w", err)
		}
		h.lag.Store(tail.LastSeq - min(tail.LastSeq, s.eng.Seq()))
		if len(tail.Records) < followBatch {
			return nil
		}
	}
}

// takeOver turns a standby that has just won term into the leader.
func (s *Server) takeOver(ctx context.Context, term store.Term) error {
	h := s.ha
	began := time.Now()
	h.mu.Lock()
	h.term = term
	h.mu.Unlock()
	s.wg.Add(1)
	go s.keepLease(ctx)
	h.pg.Fence(term.Epoch)
	// No older leader can append once the epoch moved, so what is read now
	// is the whole log.
	if err := s.follow(ctx); err != nil {
		return err
	}
	tail := s.eng.Seq()
	// The old leader stopped at its lease less the allowance by its own
	// clock; waiting out the allowance again covers a clock that ran slow.
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(s.cfg.HA.DriftAllowance):
	}
	if err := s.attach(ctx); err != nil {
		return err
	}
	s.runLog(ctx)
	if err := s.configure(ctx); err != nil {
		return err
	}
	// Heartbeats went to the old leader, or nowhere, meanwhile: every live
	// session gets one fresh TTL to reach this one, from before the first
	// call can touch it.
	s.eng.RenewAll()
	h.role.Store(roleLeader)
	close(h.led)
	s.runLoops(ctx)
	s.setHealth(true)
	h.lag.Store(0)
	s.log.Info("governord leads", "epoch", term.Epoch, "advertise", h.self, "seq", tail, "took", time.Since(began))
	return nil
}

// keepLease renews the term three times per lease. A deposed leader, or one
// whose term ran out before a renewal got through, stops. It is one of the
// goroutines s.wg counts.
func (s *Server) keepLease(ctx context.Context) {
	defer s.wg.Done()
	h := s.ha
	every := s.cfg.HA.Lease / 3
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if hold := h.hooks().HoldRenewals; hold != nil {
			select {
			case <-ctx.Done():
				return
			case <-hold:
			}
		}
		h.mu.Lock()
		term := h.term
		h.mu.Unlock()
		until := term.Until
		if h.hooks().IgnoreLease { // the planted bug trusts its leadership until told otherwise
			until = time.Now().Add(s.cfg.HA.Lease)
		}
		rctx, cancel := context.WithDeadline(ctx, until)
		next, err := h.elector.Renew(rctx, term.Epoch)
		cancel()
		switch {
		case err == nil:
			h.mu.Lock()
			h.term = next
			h.mu.Unlock()
			t.Reset(every)
		case ctx.Err() != nil:
			return
		case errors.Is(err, store.ErrDeposed):
			s.die(fmt.Errorf("deposed as leader (epoch %d): %w", term.Epoch, err))
			return
		case !term.Valid(time.Now()) && !h.hooks().IgnoreLease:
			s.die(fmt.Errorf("the lease as leader (epoch %d) ran out before a renewal got through: %w", term.Epoch, err))
			return
		default:
			s.log.Warn("renewing the lease as leader failed; trying again", "epoch", term.Epoch, "err", err,
				"serving_for", time.Until(term.Until).Round(time.Millisecond))
			t.Reset(every / 4)
		}
	}
}

// closeHA gives up the lease of a leader that stops cleanly, so that a
// standby takes over at once, and closes the election's connections. It
// runs once nothing serves or commits any more.
func (s *Server) closeHA() {
	h := s.ha
	if h == nil {
		return
	}
	if h.role.Load() == roleLeader && h.elector != nil {
		h.mu.Lock()
		epoch := h.term.Epoch
		h.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if err := h.elector.Resign(ctx, epoch); err != nil {
			s.log.Warn("resigning as leader failed; a standby takes over when the lease ends", "err", err)
		}
		cancel()
	}
	if h.elector != nil {
		h.elector.Close()
	}
}

// Leading is closed once this governord leads: at once without ha.
func (s *Server) Leading() <-chan struct{} {
	if s.ha == nil {
		led := make(chan struct{})
		close(led)
		return led
	}
	return s.ha.led
}

// HA reports this governord's part: whether it leads and, when ha is on,
// the epoch it leads or last saw, and the replication lag in events.
func (s *Server) HA() (leader bool, epoch, lag uint64) {
	h := s.ha
	if h == nil {
		return true, 0, 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.role.Load() == roleLeader {
		return true, h.term.Epoch, 0
	}
	return false, h.leader.Epoch, h.lag.Load()
}

// haCollector serves the election's metrics. Without ha a governord leads,
// at epoch 0, with no lag.
type haCollector struct{ m *metrics }

var (
	descHALeader = prometheus.NewDesc("governor_ha_leader", "1 while this governord leads (and always without ha), 0 while it stands by.", nil, nil)
	descHAEpoch  = prometheus.NewDesc("governor_ha_epoch", "The leadership epoch this governord leads, or the newest it has seen as a standby; 0 without ha.", nil, nil)
	descHALag    = prometheus.NewDesc("governor_ha_replication_lag_events", "Events the leader has committed that this standby has not yet applied; 0 on the leader.", nil, nil)
)

func (haCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descHALeader
	ch <- descHAEpoch
	ch <- descHALag
}

func (c haCollector) Collect(ch chan<- prometheus.Metric) {
	leader, epoch, lag := c.m.s.HA()
	l := 0.0
	if leader {
		l = 1
	}
	ch <- prometheus.MustNewConstMetric(descHALeader, prometheus.GaugeValue, l)
	ch <- prometheus.MustNewConstMetric(descHAEpoch, prometheus.GaugeValue, float64(epoch))
	ch <- prometheus.MustNewConstMetric(descHALag, prometheus.GaugeValue, float64(lag))
}
