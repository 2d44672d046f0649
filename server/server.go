package server

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor/engine"
	"github.com/governor-project/governor/internal/apikey"
	"github.com/governor-project/governor/internal/tlsreload"
	"github.com/governor-project/governor/internal/tracing"
	"github.com/governor-project/governor/server/serverconfig"
	"github.com/governor-project/governor/store"
	"github.com/governor-project/governor/usage"
)

// Server is a running governord.
type Server struct {
	governorpb.UnimplementedGovernorServer

	cfg     serverconfig.Config
	log     *slog.Logger
	eng     *engine.Engine
	mirror  *mirror     // snapshots are taken from it (mirror.go)
	usage   *usage.Fold // usage records, written with the events (usage.go)
	st      store.Store
	events  *store.Log[engine.Event]
	metrics *metrics
	keys    map[[sha256.Size]byte]engine.NodeID // API key hash -> scope
	flights flights
	// adm lets calls in, per tenant (admission.go); admLanes are its
	// lanes by tenant name, "" for the admin key's.
	adm      *admission
	admLanes map[string]*lane

	notices     notices       // the engine's notices, to the Watch streams
	settlements signal        // fires when reservations are settled (delegation.go)
	newSession  chan struct{} // tells the reaper something may now fall due first (wakeReaper)

	grpc    *grpc.Server
	certs   *tlsreload.Reloader // the certificate in force; nil without TLS
	health  *health.Server
	lis     net.Listener
	httpSrv *http.Server
	httpLis net.Listener

	stopping  chan struct{} // closed when the server starts to stop
	fatal     chan error    // receives the first fatal error
	cancelRun context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error

	// Recent refusals and the last commit's duration, for Inspect
	// (inspect.go).
	recent     recentDenials
	lastCommit atomic.Int64
	blockUse   blockUses // how the blocks are used where delegated (blockuse.go)

	engCfg engine.Config // the engine's configuration, for the mirror
	ha     *haState      // nil without ha (ha.go)
}

// Option changes how Start builds the server in a way the configuration
// file cannot say.
type Option func(*startOptions)

type startOptions struct {
	openStore func(ctx context.Context) (store.Store, error)
}

// WithStore opens the store with open instead of from Store.Driver and
// Store.DSN; tests use it to inject a store that fails. It is an option,
// not a field of Config, so that the configuration links no store.
func WithStore(open func(ctx context.Context) (store.Store, error)) Option {
	return func(o *startOptions) { o.openStore = open }
}

// Start recovers the state from the store, applies the configuration, and
// serves. It returns once the server is listening and ready.
func Start(ctx context.Context, cfg serverconfig.Config, logger *slog.Logger, opts ...Option) (*Server, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if cfg.ReapInterval == 0 {
		cfg.ReapInterval = serverconfig.DefaultReapInterval
	}
	if cfg.SessionTTL == 0 {
		cfg.SessionTTL = serverconfig.DefaultSessionTTL
	}
	if cfg.Store.SnapshotEvery == 0 {
		cfg.Store.SnapshotEvery = serverconfig.DefaultSnapshotEvery
	}
	if cfg.Clock == nil {
		cfg.Clock = engine.WallClock{}
	}
	cfg.FillLimits()
	s := &Server{cfg: cfg, log: logger, keys: make(map[[sha256.Size]byte]engine.NodeID),
		stopping: make(chan struct{}), fatal: make(chan error, 1), newSession: make(chan struct{}, 1)}
	s.admLanes = s.admissionLanes()
	s.metrics = newMetrics(s)
	var o startOptions
	for _, opt := range opts {
		opt(&o)
	}
	open := o.openStore
	if open == nil {
		open = func(ctx context.Context) (store.Store, error) {
			return store.Open(ctx, cfg.Store.Driver, cfg.Store.DSN)
		}
	}
	st, err := open(ctx)
	if err != nil {
		return nil, fmt.Errorf("open %s store: %w", cfg.Store.Driver, err)
	}
	s.st = st
	if err := s.recover(ctx); err != nil {
		st.Close()
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	s.cancelRun = cancel
	if cfg.HA.Enabled {
		// A standby first; it leads once it wins the election (ha.go).
		if err := s.startStandby(runCtx); err != nil {
			s.Close()
			return nil, err
		}
		return s, nil
	}
	s.runLog(runCtx)
	if err := s.configure(ctx); err != nil {
		s.Close()
		return nil, err
	}
	// Heartbeats could not arrive while the state was being replayed, so
	// every session's one fresh TTL starts now, as the server starts to serve.
	s.eng.RenewAll()
	if err := s.serve(); err != nil {
		s.Close()
		return nil, err
	}
	s.runLoops(runCtx)
	s.log.Info("governord ready", "listen", s.Addr(), "metrics", s.MetricsAddr(), "store", cfg.Store.Driver,
		"seq", s.eng.Seq(), "tenants", len(cfg.Tenants))
	return s, nil
}

// runLog commits the engine's events until ctx ends; a failed commit stops
// the server.
func (s *Server) runLog(ctx context.Context) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := s.events.Run(ctx); err != nil {
			s.die(fmt.Errorf("commit failed: %w", err))
		}
	}()
}

// runLoops starts what a serving governord does on its own: reaping,
// housekeeping (snapshots, trimming, giving memory back) and reminders of
// contention.
func (s *Server) runLoops(ctx context.Context) {
	s.wg.Add(3)
	go s.reapWhenDue(ctx)
	go s.every(ctx, time.Second, s.housekeeping(ctx))
	go s.every(ctx, time.Second, s.eng.RemindContention)
}

// recover rebuilds the engine from the newest snapshot and the events after it.
func (s *Server) recover(ctx context.Context) error {
	began := time.Now()
	tenantBounds := make(map[string]engine.Bounds, len(s.cfg.Tenants))
	for _, t := range s.cfg.Tenants {
		tenantBounds[t.Name] = t.Bounds
	}
	engCfg := engine.Config{Clock: s.cfg.Clock, Adaptive: s.cfg.Adaptive, Sink: s, Notifier: &s.notices, Wake: s.wakeReaper,
		Retention: s.cfg.NodeRetention, Bounds: s.cfg.Bounds, TenantBounds: tenantBounds, Near: s.cfg.Near,
		Location: s.cfg.Location}
	eng, err := engine.New(engCfg)
	if err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	var events int
	batch := make([]engine.Event, 0, 1024)
	flush := func() error {
		if err := eng.Apply(batch...); err != nil {
			return err
		}
		events += len(batch)
		batch = batch[:0]
		return nil
	}
	tokens := make(map[uint64]string)
	err = s.st.Load(ctx, store.LoadFuncs{
		Snapshot: func(seq uint64, data []byte) error {
			snap, err := decodeSnapshot(seq, data)
			if err != nil {
				return err
			}
			return eng.Restore(snap)
		},
		Session: func(row store.Session) error {
			tokens[row.ID] = row.TokenHash
			return nil
		},
		Record: func(r store.Record) error {
			ev, err := decodeEvent(r, tokens)
			if err != nil {
				return err
			}
			if batch = append(batch, ev); len(batch) == cap(batch) {
				return flush()
			}
			return nil
		},
	})
	if err == nil {
		err = flush()
	}
	var missing []store.Session
	if err == nil {
		missing, err = checkSessionTokens(eng.SessionTokens(), tokens)
	}
	if err == nil && len(missing) > 0 {
		// A store written before the sessions table existed: the log knows
		// these hashes, the table does not yet.
		s.log.Warn("adding live sessions missing from the sessions table", "sessions", len(missing))
		err = s.st.AddSessions(ctx, missing)
	}
	if err != nil {
		return fmt.Errorf("replay the store: %w", err)
	}
	s.eng, s.engCfg = eng, engCfg
	if err := s.attach(ctx); err != nil {
		return err
	}
	s.log.Info("state recovered", "seq", eng.Seq(), "events replayed", events, "took", time.Since(began))
	return nil
}

// attach builds what serves alongside the engine from its state as it is:
// the snapshots' mirror, the usage fold and the log that commits its next
// events. A standby does it again when it takes over.
func (s *Server) attach(context.Context) error {
	var err error
	if s.mirror, err = newMirror(s.engCfg, s.eng); err != nil {
		return err
	}
	s.usage = usage.New(s.eng.Snapshot())
	s.events = store.NewLog(s.st, s.encodeWithUsage, store.LogOptions{Committed: s.eng.Seq(), Observe: s.metrics.observeCommit,
		OnError: func(err error) {
			s.log.Warn("tidying the store after a snapshot failed; the next snapshot tries again", "err", err)
		}})
	return nil
}

// checkSessionTokens checks that the sessions table and the replayed state
// agree: the same live sessions with the same token hashes. A session
// whose hash is nowhere could never be reached again, a row that differs
// from the log is a damaged row, and a row without its session is one whose
// end the log lost: each means the store is damaged. A live session whose
// hash the log holds (in the snapshot, or in the event of a store written
// before the table existed) but the table does not is returned, to be added.
func checkSessionTokens(live map[engine.SessionID]string, table map[uint64]string) (missing []store.Session, err error) {
	for _, id := range slices.Sorted(maps.Keys(live)) {
		hash := live[id]
		row, ok := table[uint64(id)]
		switch {
		case hash == "":
			return nil, fmt.Errorf("session %d is live but its token hash is in neither the sessions table nor the log: %w", id, engine.ErrCorrupt)
		case !ok:
			missing = append(missing, store.Session{ID: uint64(id), TokenHash: hash})
		case row != hash:
			return nil, fmt.Errorf("session %d has one token hash in the sessions table and another in the log: %w", id, engine.ErrCorrupt)
		}
	}
	for id := range table {
		if _, ok := live[engine.SessionID(id)]; !ok {
			return nil, fmt.Errorf("the sessions table has a row for session %d, which is not live: %w", id, engine.ErrCorrupt)
		}
	}
	return missing, nil
}

// Emit is the engine's sink: it counts the event and queues it for commit.
// It runs under the engine's lock and never blocks.
func (s *Server) Emit(ev engine.Event) {
	s.metrics.event(ev.Kind)
	if ev.Warnings != nil {
		s.metrics.warned(&ev)
	}
	s.events.Emit(ev)
	s.mirror.add(ev)
	if settles(ev) {
		s.settlements.fire()
	}
}

// configure brings the root and the tenants in line with the configuration.
// The configuration is the source of truth for them; tasks are left alone.
// A root limit of an adaptive class keeps the value the controller reached.
func (s *Server) configure(ctx context.Context) error {
	if err := s.lowerMinimums(); err != nil {
		return err
	}
	if err := s.configureRoot(); err != nil {
		return err
	}
	if h, ok := s.cfg.AdminKeyHash(); ok {
		s.keys[h] = engine.RootID
	}
	s.adm.bind(int64(engine.RootID), s.admLanes[""])
	for _, t := range s.cfg.Tenants {
		id, err := s.configureTenant(t)
		if err != nil {
			return fmt.Errorf("configure tenant %q: %w", t.Name, err)
		}
		s.adm.bind(int64(id), s.admLanes[t.Name])
		if h, ok := t.KeyHash(); ok {
			s.keys[h] = id
		} else {
			s.log.Warn("tenant has no api_key; it cannot open sessions", "tenant", t.Name)
		}
	}
	if _, ok := s.cfg.AdminKeyHash(); !ok {
		s.log.Warn("no admin_key; no operator sessions can be opened")
	}
	for _, key := range s.cfg.ShortKeys() {
		s.log.Warn(fmt.Sprintf("an API key shorter than %d bytes can be guessed; use %d random bytes or more (openssl rand -hex %d)",
			apikey.MinLen, apikey.MinLen, apikey.MinLen), "key", key)
	}
	return s.events.WaitDurable(ctx, s.eng.Seq())
}

// configureRoot sets the root's caps, modes, rates and periods to the
// configuration's; a limit of an adaptive class keeps the value the
// controller reached.
func (s *Server) configureRoot() error {
	root, err := s.eng.Get(engine.System, engine.RootID)
	if err != nil {
		return err
	}
	rootLimits := maps.Clone(s.cfg.Root.Limits)
	for _, a := range s.cfg.Adaptive {
		if v, ok := root.Limits[a.Class]; ok {
			if rootLimits == nil {
				rootLimits = map[string]int64{}
			}
			rootLimits[a.Class] = v
		}
	}
	edit, changed := capsEdit(root, s.cfg.Root.Quotas, rootLimits, nil, 0)
	if modesEdit(&edit, root, s.cfg.Root.Quotas, rootLimits, s.cfg.Root.QuotaModes, s.cfg.Root.LimitModes) {
		changed = true
	}
	if ratesEdit(&edit, root, s.cfg.Root.Rates, nil, false) {
		changed = true
	}
	if periodsEdit(&edit, root, s.cfg.Root.QuotaPeriods, nil, false) {
		changed = true
	}
	if changed {
		if _, err := s.eng.SetCaps(engine.System, engine.RootID, edit, ""); err != nil {
			return fmt.Errorf("configure root: %w", err)
		}
	}
	return nil
}

// configureTenant creates tenant t, or sets its caps, modes, minimums,
// rates and periods to the configuration's, and returns its node.
func (s *Server) configureTenant(t serverconfig.TenantConfig) (engine.NodeID, error) {
	v, created, err := s.eng.FindOrCreate(engine.System, engine.RootID, engine.NodeSpec{Name: t.Name, Weight: t.Weight,
		Quotas: t.Quotas, Limits: t.Limits, DefaultQuotas: orEmpty(t.Defaults.Quotas), DefaultLimits: orEmpty(t.Defaults.Limits),
		Rates: t.Rates, DefaultRates: t.Defaults.Rates, QuotaPeriods: t.QuotaPeriods, DefaultQuotaPeriods: t.Defaults.QuotaPeriods}, "")
	if err != nil {
		return 0, err
	}
	var edit engine.CapsEdit
	changed := false
	if !created {
		edit, changed = capsEdit(v, t.Quotas, t.Limits, &t.Defaults, t.Weight)
	}
	if modesEdit(&edit, v, t.Quotas, t.Limits, t.QuotaModes, t.LimitModes) {
		changed = true
	}
	if minimumsEdit(&edit, v, t.Minimums, false) {
		changed = true
	}
	if ratesEdit(&edit, v, t.Rates, t.Defaults.Rates, true) {
		changed = true
	}
	if periodsEdit(&edit, v, t.QuotaPeriods, t.Defaults.QuotaPeriods, true) {
		changed = true
	}
	if changed {
		if _, err := s.eng.SetCaps(engine.System, v.ID, edit, ""); err != nil {
			return 0, err
		}
	}
	return v.ID, nil
}

func orEmpty(m map[string]int64) map[string]int64 {
	if m == nil {
		return map[string]int64{}
	}
	return m
}

// capsEdit returns the edit that makes v's caps the wanted ones.
func capsEdit(v engine.NodeView, quotas, limits map[string]int64, defaults *serverconfig.Caps, weight int64) (engine.CapsEdit, bool) {
	var edit engine.CapsEdit
	changed := false
	diff := func(have, want map[string]int64) map[string]int64 {
		out := map[string]int64{}
		for k, w := range want {
			if h, ok := have[k]; !ok || h != w {
				out[k] = w
			}
		}
		for k := range have {
			if _, ok := want[k]; !ok {
				out[k] = engine.NoCap
			}
		}
		if len(out) == 0 {
			return nil
		}
		changed = true
		return out
	}
	edit.Quotas, edit.Limits = diff(v.Quotas, quotas), diff(v.Limits, limits)
	if defaults != nil {
		edit.DefaultQuotas, edit.DefaultLimits = diff(v.DefaultQuotas, defaults.Quotas), diff(v.DefaultLimits, defaults.Limits)
	}
	if weight != 0 && weight != v.Weight {
		edit.Weight, changed = &weight, true
	}
	return edit, changed
}

// grpcWindow is the HTTP/2 flow-control window governord grants each
// stream and each connection.
const grpcWindow = 1 << 20

// grpcStreamWorkers is how many goroutines wait to run incoming calls.
const grpcStreamWorkers = 64

func (s *Server) serve() error {
	var opts []grpc.ServerOption
	if s.cfg.TLS.CertFile != "" {
		// The files are watched: each new handshake gets the pair in force,
		// so a rotated certificate needs no restart, and connections
		// already open keep theirs.
		certs, err := tlsreload.New(s.cfg.TLS.CertFile, s.cfg.TLS.KeyFile,
			tlsreload.Options{Interval: s.cfg.TLSReloadInterval, OnReload: s.certReloaded})
		if err != nil {
			return &serverconfig.ConfigError{Key: "tls", Problem: err.Error()}
		}
		s.certs = certs
		opts = append(opts, grpc.Creds(credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS13, GetCertificate: certs.GetCertificate})))
	}
	opts = append(opts, grpc.ChainUnaryInterceptor(s.metrics.unary, s.haUnary, s.admitUnary), grpc.ChainStreamInterceptor(s.metrics.stream, s.haStream),
		// Fixed flow-control windows turn off gRPC's BDP estimation, which
		// otherwise sends a PING for nearly every request that arrives on an
		// idle connection (and the client answers it): two extra writes and
		// wake-ups per call, since every call here is a small message that
		// waits for a commit. Governor's messages are far smaller than these.
		grpc.StaticStreamWindowSize(grpcWindow), grpc.StaticConnWindowSize(grpcWindow),
		// Calls run on long-lived workers instead of a new goroutine each,
		// whose stack would grow (and be copied) several times on every
		// call. Calls beyond the idle workers still get a goroutine of
		// their own, so a call that waits long never holds others up.
		grpc.NumStreamWorkers(grpcStreamWorkers))
	if h := tracing.ServerHandler(); h != nil {
		opts = append(opts, grpc.StatsHandler(h)) // a span of each call, in the caller's trace
	}
	s.grpc = grpc.NewServer(opts...)
	governorpb.RegisterGovernorServer(s.grpc, s)
	s.health = health.NewServer()
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)
	lis, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		s.closeCerts()
		return fmt.Errorf("listen %s: %w", s.cfg.Listen, err)
	}
	s.lis = lis
	if s.cfg.MetricsListen != "" {
		hl, err := net.Listen("tcp", s.cfg.MetricsListen)
		if err != nil {
			lis.Close()
			s.closeCerts()
			return fmt.Errorf("listen %s: %w", s.cfg.MetricsListen, err)
		}
		s.httpLis = hl
		// A scraper that leaves its connections open must not keep their
		// buffers: idle ones close after a minute.
		s.httpSrv = &http.Server{Handler: s.metrics.handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := s.httpSrv.Serve(hl); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Error("metrics server stopped", "err", err)
			}
		}()
	}
	s.setHealth(s.leading()) // a standby is NOT_SERVING from the start (ha.go)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := s.grpc.Serve(lis); err != nil {
			s.die(fmt.Errorf("grpc server: %w", err))
		}
	}()
	return nil
}

// certReloaded logs and counts a change to the TLS files.
func (s *Server) certReloaded(cert *tls.Certificate, err error) {
	if err != nil {
		s.metrics.tlsReloads.WithLabelValues("failure").Inc()
		s.log.Error("the TLS certificate failed to load; the one in force stays", "cert_file", s.cfg.TLS.CertFile,
			"key_file", s.cfg.TLS.KeyFile, "err", err)
		return
	}
	s.metrics.tlsReloads.WithLabelValues("success").Inc()
	s.log.Info("TLS certificate reloaded", "cert_file", s.cfg.TLS.CertFile, "subject", cert.Leaf.Subject.String(),
		"not_after", cert.Leaf.NotAfter)
}

func (s *Server) closeCerts() {
	if s.certs != nil {
		s.certs.Close()
	}
}

// Addr is the address gRPC listens on.
func (s *Server) Addr() string {
	if s.lis == nil {
		return ""
	}
	return s.lis.Addr().String()
}

// MetricsAddr is the address of /metrics, /healthz and /readyz, if served.
func (s *Server) MetricsAddr() string {
	if s.httpLis == nil {
		return ""
	}
	return s.httpLis.Addr().String()
}

// Fatal receives the error that must stop the process, such as a failed
// commit. After it the server answers nothing more.
func (s *Server) Fatal() <-chan error { return s.fatal }

// die stops serving at once: after a failed commit the engine holds changes
// the record lacks, so no further answer may be given.
func (s *Server) die(err error) {
	select {
	case s.fatal <- err:
		s.log.Error("governord must stop", "err", err)
	default:
	}
	s.beginStop()
	if s.grpc != nil {
		go s.grpc.Stop()
	}
}

func (s *Server) beginStop() {
	select {
	case <-s.stopping:
	default:
		close(s.stopping)
	}
	if s.health != nil {
		s.health.Shutdown()
	}
}

// Close stops the server: it stops accepting, fails waiting acquires with
// UNAVAILABLE, lets calls in flight finish (for up to 10 s), commits what is
// pending and closes the store.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.beginStop()
		if s.grpc != nil {
			done := make(chan struct{})
			go func() { s.grpc.GracefulStop(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				s.grpc.Stop()
			}
		}
		if s.httpSrv != nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			s.httpSrv.Shutdown(ctx)
			cancel()
		}
		if s.cancelRun != nil {
			s.cancelRun()
		}
		s.closeCerts()
		s.wg.Wait()
		s.closeHA()
		if s.st != nil {
			s.closeErr = s.st.Close()
		}
	})
	return s.closeErr
}

// every calls f every d until ctx ends. It is one of the goroutines s.wg
// counts.
func (s *Server) every(ctx context.Context, d time.Duration, f func()) {
	defer s.wg.Done()
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f()
		}
	}
}

// reapWhenDue reaps every ReapInterval, and also at the moment the engine
// says a session expires or a deadline passes: a dead worker's slots go to
// the next waiter when its TTL is up, not up to one interval later. It is
// one of the goroutines s.wg counts.
func (s *Server) reapWhenDue(ctx context.Context) {
	defer s.wg.Done()
	t := time.NewTimer(0) // the first reap works out what is due
	defer t.Stop()
	var next time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.newSession:
			// The new session, or a new rate waiter, may be due before the
			// timer fires.
			if d, ok := s.eng.DueIn(); ok && time.Now().Add(d).Before(next) {
				next = time.Now().Add(d)
				t.Reset(d)
			}
			continue
		case <-t.C:
		}
		s.reap()
		wait := s.cfg.ReapInterval
		if d, ok := s.eng.DueIn(); ok {
			// At least a millisecond apart, however many expire at once.
			wait = min(wait, max(d, time.Millisecond))
		}
		next = time.Now().Add(wait)
		t.Reset(wait)
	}
}

// wakeReaper wakes the reaper to time what is newly due (engine.DueIn): a
// new session's expiry, or a rate waiter's grant (engine.Config.Wake).
func (s *Server) wakeReaper() {
	select {
	case s.newSession <- struct{}{}:
	default: // a wake-up is already pending
	}
}

func (s *Server) reap() {
	if sessions, nodes := s.eng.Reap(); sessions+nodes > 0 {
		s.log.Info("reaped", "sessions", sessions, "nodes", nodes)
	}
}

// snapshot takes a snapshot, from the mirror, and saves it.
func (s *Server) snapshot(ctx context.Context) error {
	_, err := s.saveSnapshot(ctx, "asked")
	return err
}

// saveSnapshot is snapshot, saying why in its log line, and returning
// what it saved.
func (s *Server) saveSnapshot(ctx context.Context, why string) (saved, error) {
	began := time.Now()
	snap, err := s.mirror.snapshot(s.eng)
	if err != nil {
		return saved{}, err
	}
	captured := time.Now()
	data, err := encodeSnapshot(snap, s.mirror.encoded, s.mirror.pause)
	if err != nil {
		return saved{}, err
	}
	s.mirror.encoded = len(data)
	encoded := time.Now()
	if err := s.events.SaveSnapshot(ctx, snap.Seq, data); err != nil {
		return saved{}, err
	}
	s.metrics.snapSize.Set(float64(len(data)))
	// capture holds the mirror's lock, not the engine's; save holds the
	// store's writer.
	s.log.Info("snapshot saved", "why", why, "seq", snap.Seq, "bytes", len(data), "nodes", len(snap.Nodes), "took", time.Since(began),
		"capture", captured.Sub(began), "encode", encoded.Sub(captured), "save", time.Since(encoded))
	return saved{seq: snap.Seq, nodes: len(snap.Nodes)}, nil
}

// saved is what a snapshot saved: the seq it is at and the nodes it holds.
type saved struct {
	seq   uint64
	nodes int
}
