package engine

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math/rand"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The randomized checker. Every seed drives the engine with a random history
// of every operation, checks every invariant of SPEC.md after every step, and
// replays the history three ways. Run thousands of seeds with
//
//	GOVERNOR_SEEDS=5000 go test ./governor/engine -run TestRandomized
//
// and reproduce one with -run 'TestRandomized/seed=N$'.
var (
	flagSeeds = flag.Int("seeds", envInt("GOVERNOR_SEEDS", 100), "seeds TestRandomized runs")
	flagOps   = flag.Int("ops", envInt("GOVERNOR_OPS", 2000), "operations per seed")
	flagBase  = flag.Int("seedbase", envInt("GOVERNOR_SEED_BASE", 1), "first seed")
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

var (
	resources = []string{"tokens", "retry", "calls"}
	classes   = []string{"db", "http", "llm"}
)

const sessionTTL = 5 * time.Second

func TestRandomized(t *testing.T) {
	var reach reached
	t.Cleanup(func() { reach.check(t) })
	for seed := int64(*flagBase); seed < int64(*flagBase+*flagSeeds); seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Parallel()
			w := newWorld(t, seed)
			defer reach.add(w)
			for w.step = 1; w.step <= *flagOps; w.step++ {
				if seed%5 == 0 && w.step == *flagOps/3 {
					w.burst() // some sessions outrun their request memory
				}
				w.randomOp()
				w.policyOp()
				w.shadowOp()
				w.giveBackOp()
				w.giveBackChargedOp()
				w.deepOp()
				w.agingOp()
				w.dryRunOp()
				w.overrideOp()
				w.rateOp()
				w.sliceOp()
				w.periodOp()
				w.respond()
				w.drain()
				w.check()
				if w.step == *flagOps/2 {
					snap := w.e.Snapshot()
					w.mid = &snap
				}
			}
			w.checkReplay()
		})
	}
}

// pending is a queued Acquire. Its outcome may have arrived before its
// caller looked (arrived), which is when a cancel races a grant.
type pending struct {
	wait    *Wait
	sid     SessionID
	arrived bool
	outcome Outcome
}

type doneRequest struct {
	sid    SessionID
	id     string
	result string
	call   func(requestID string, differ bool) (string, error)
	// node is the node a create, end or edit named: once it is reclaimed,
	// a retry answers ErrNotFound.
	node NodeID
}

type world struct {
	t    *testing.T
	seed int64
	rng  *rand.Rand
	// boundsSeen is how many events the bounds check has seen (I17).
	boundsSeen int
	// policy draws the tenant-state ops and write marks from a stream of
	// their own, so that they leave every other draw of a seed as it was.
	policy *rand.Rand
	orng   *rand.Rand // which edits are overrides, a stream of its own (model_override_test.go)
	// srng draws shadow requests (random_policy_test.go's shadowOp), a
	// stream of its own; shadowReqs are those recorded with an id.
	srng       *rand.Rand
	rrng       *rand.Rand // rates (random_rate_test.go), a stream of its own
	prng       *rand.Rand // periods (random_period_test.go), a stream of its own
	shadowReqs []shadowReq
	// hrng draws hostile amounts (random_hostile_test.go), a stream of its
	// own, in the seeds that send any (hostile).
	hrng    *rand.Rand
	hostile bool
	// deep opens sessions scoped below the tenants and deepens subtrees
	// (random_deep_test.go), a stream of its own.
	deep *rand.Rand
	// aging runs aging episodes (random_aging_test.go), and dry draws dry
	// runs (random_dryrun_test.go), streams of their own.
	aging *rand.Rand
	dry   *rand.Rand
	// ovr makes temporary overrides (random_override_test.go), a stream
	// of its own.
	ovr        *rand.Rand
	tally      coverage
	nextShadow int
	clock      *fakeClock
	cfg        Config
	e          *Engine
	rec        *recorder
	m          *model
	step       int
	trail      []string
	mid        *Snapshot

	sessions []SessionID
	scope    map[SessionID]NodeID
	quiet    map[SessionID]bool // sessions that stopped heartbeating: dead workers
	tenants  []NodeID
	nodes    []NodeID
	gone     []NodeID // reclaimed
	held     map[LeaseID]SessionID
	// charges are the charges without a lease granted, by session, for
	// GiveBackCharged (random_hostile_test.go).
	charges  []chargeReq
	waits    []*pending
	requests []doneRequest
	nextReq  int

	// A sidecar's side of delegated budgets: what each session has spent
	// of its reservations and not yet settled, and what it holds unspent;
	// the notices of this step; and what each block holder was last told
	// about contention.
	local   map[modelRes]*localRes
	notices []Notice
	told    map[blockKey2]NoticeKind

	// reaped says this step ran Reap; names is how many resources and
	// classes each tenant knew after the last step.
	reaped bool
	names  map[NodeID][2]int
	// expires is when each session's TTL runs out, from the driver's own
	// opens and heartbeats (not state, so not in any event).
	expires map[SessionID]int64
}

type localRes struct{ spent, unspent int64 }

type blockKey2 struct {
	session SessionID
	node    NodeID
	class   string
}

// Notify collects the engine's notices; respond acts on them after the step.
func (w *world) Notify(n Notice) { w.notices = append(w.notices, n) }

func newWorld(t *testing.T, seed int64) *world {
	rng := rand.New(rand.NewSource(seed))
	retention := time.Duration(2+rng.Intn(9)) * time.Second
	w := &world{t: t, seed: seed, rng: rng, policy: rand.New(rand.NewSource(^seed)), orng: rand.New(rand.NewSource(seed + 1<<32)),
		srng: rand.New(rand.NewSource(seed + 2<<32)), hrng: rand.New(rand.NewSource(seed + 3<<32)),
		deep: rand.New(rand.NewSource(seed + 4<<32)), aging: rand.New(rand.NewSource(seed + 5<<32)),
		dry: rand.New(rand.NewSource(seed + 6<<32)), ovr: rand.New(rand.NewSource(seed + 7<<32)),
		rrng: rand.New(rand.NewSource(seed + 8<<32)), prng: rand.New(rand.NewSource(seed + 9<<32)), clock: newFakeClock(),
		rec: &recorder{}, m: newModel(retention), scope: map[SessionID]NodeID{}, quiet: map[SessionID]bool{},
		held: map[LeaseID]SessionID{}, local: map[modelRes]*localRes{}, told: map[blockKey2]NoticeKind{},
		expires: map[SessionID]int64{}}
	w.hostile = w.hrng.Intn(2) == 0
	w.m.expired = func(sid SessionID, now int64) bool { at, ok := w.expires[sid]; return ok && now >= at }
	w.m.pastBound = w.pastBound
	w.cfg = Config{Clock: w.clock, Sink: sinks{w.rec, w.m}, Notifier: w, Adaptive: []Adaptive{{Class: "llm",
		TargetP95: 50 * time.Millisecond, MaxOverload: 0.1, MinLimit: 1, MaxLimit: 6, MinSamples: 5}},
		Retention: retention, Bounds: w.randBounds(), TenantBounds: map[string]Bounds{"tenant0": w.randBounds()},
		Location: w.periodZone()}
	w.m.loc = w.cfg.Location
	e, err := New(w.cfg)
	if err != nil {
		t.Fatal(err)
	}
	w.e = e
	w.m.limits[RootID] = map[string]int64{"llm": 6} // an adaptive class starts at its MaxLimit
	for _, a := range w.cfg.Adaptive {
		w.m.aimd[a.Class] = &mController{cfg: a, last: w.clock.Now().UnixNano()}
	}
	w.nodes = []NodeID{RootID}
	// The operator's configuration: root caps, then tenants.
	w.must(e.SetCaps(System, RootID, CapsEdit{Limits: map[string]int64{"db": 2 + w.rng.Int63n(4), "http": 3 + w.rng.Int63n(5), "llm": 4},
		Quotas: map[string]int64{"tokens": 400 + w.rng.Int63n(800)}}, ""))
	for i := range 2 + w.rng.Intn(3) {
		v, err := e.CreateNode(System, RootID, NodeSpec{Name: fmt.Sprintf("tenant%d", i), Weight: 1 + w.rng.Int63n(4),
			Limits: w.randCaps(classes, 4), Quotas: w.randCaps(resources, 300),
			DefaultQuotas: w.randCaps(resources, 40), DefaultLimits: w.randCaps(classes, 3)}, "")
		if err != nil {
			t.Fatal(err)
		}
		w.tenants = append(w.tenants, v.ID)
		w.nodes = append(w.nodes, v.ID)
	}
	for range 3 + w.rng.Intn(3) {
		w.openSession(w.tenants[w.rng.Intn(len(w.tenants))])
	}
	w.openSession(RootID) // an operator's session
	w.check()
	return w
}

// randBounds are small bounds, so that histories reach them; a zero field
// is no bound.
func (w *world) randBounds() Bounds {
	pick := func(lo, hi int) int {
		if w.rng.Intn(3) == 0 {
			return 0
		}
		return lo + w.rng.Intn(hi-lo+1)
	}
	return Bounds{Sessions: pick(2, 6), Nodes: pick(3, 12), Waiters: pick(1, 4), Resources: pick(1, 3), Classes: pick(1, 3)}
}

func (w *world) must(_ NodeView, err error) {
	if err != nil {
		w.t.Fatal(err)
	}
}

func (w *world) fail(format string, args ...any) {
	w.t.Helper()
	w.t.Fatalf("seed %d, step %d: %s\nrecent operations:\n  %s\nreproduce: go test ./governor/engine -run 'TestRandomized/seed=%d$' -ops %d",
		w.seed, w.step, fmt.Sprintf(format, args...), strings.Join(w.trail, "\n  "), w.seed, *flagOps)
}

func (w *world) logf(format string, args ...any) {
	w.trail = append(w.trail, fmt.Sprintf("%d: ", w.step)+fmt.Sprintf(format, args...))
	if len(w.trail) > 25 {
		w.trail = w.trail[1:]
	}
}

func (w *world) randCaps(keys []string, max int64) map[string]int64 {
	m := map[string]int64{}
	for _, k := range keys {
		switch w.rng.Intn(4) {
		case 0:
			m[k] = w.rng.Int63n(max + 1)
		case 1:
			m[k] = NoCap
		}
	}
	if len(m) == 0 {
		return nil
	}
	return m
}

// randModes picks enforcement modes (policy.go) for some of the names that
// will have a cap once edit is applied over have: hard, soft with a burst
// up to maxBurst, or warn_only.
func (w *world) randModes(edit, have map[string]int64, keys []string, maxBurst int64) map[string]CapMode {
	m := map[string]CapMode{}
	for _, k := range keys {
		v, edited := edit[k]
		_, capped := have[k]
		if (edited && v == NoCap) || (!edited && !capped) || w.rng.Intn(2) == 0 {
			continue
		}
		switch w.rng.Intn(3) {
		case 0:
			m[k] = CapMode{}
		case 1:
			m[k] = CapMode{Mode: ModeSoft, Burst: w.rng.Int63n(maxBurst + 1)}
		case 2:
			m[k] = CapMode{Mode: ModeWarnOnly}
		}
	}
	if len(m) == 0 {
		return nil
	}
	return m
}

func (w *world) pick(ids []NodeID) NodeID { return ids[w.rng.Intn(len(ids))] }

func (w *world) session() SessionID {
	for _, scope := range append(slices.Clone(w.tenants), RootID) {
		if len(w.sessions) > 0 {
			break
		}
		w.openSession(scope)
	}
	return w.sessions[w.rng.Intn(len(w.sessions))]
}

// nodeFor picks a node inside sid's scope, or outside it when out is true
// (when there is one).
func (w *world) nodeFor(sid SessionID, out bool) (NodeID, bool) {
	var in, outside []NodeID
	for _, id := range w.nodes {
		if w.m.inside(id, w.scope[sid]) {
			in = append(in, id)
		} else {
			outside = append(outside, id)
		}
	}
	if out {
		if len(outside) == 0 {
			return 0, false
		}
		return w.pick(outside), true
	}
	if len(in) == 0 {
		// Its scope was reclaimed: the session ended before (a live one
		// pins its scope), and the call is refused as unauthenticated.
		return w.scope[sid], true
	}
	return w.pick(in), true
}

func (w *world) reqID() string {
	if w.rng.Intn(3) > 0 {
		return ""
	}
	w.nextReq++
	return fmt.Sprintf("r%d", w.nextReq)
}

func (w *world) openSession(scope NodeID) { w.openSessionDrawing(scope, w.rng) }

// openSessionDrawing opens a session on scope, drawing whether its worker
// dies from rng.
func (w *world) openSessionDrawing(scope NodeID, rng *rand.Rand) {
	before := w.e.Seq()
	id, err := w.e.OpenSession(scope, fmt.Sprintf("hash-%d-%d", w.seed, w.e.Seq()), sessionTTL)
	what := fmt.Sprintf("open session on %d: %d", scope, id)
	w.expect(what, before, err, ErrTaskEnded, ErrNotFound, ErrBound)
	w.checkBoundRefusal(what, err, scope, nil, nil, false)
	if err != nil {
		return
	}
	w.sessions = append(w.sessions, id)
	w.scope[id] = scope
	w.expires[id] = w.clock.Now().UnixNano() + int64(sessionTTL)
	w.quiet[id] = rng.Intn(5) == 0
}

func (w *world) forgetSession(sid SessionID) {
	w.sessions = slices.DeleteFunc(w.sessions, func(s SessionID) bool { return s == sid })
}

// expect checks an error against what the driver allows, and that errors
// that change nothing emitted nothing.
func (w *world) expect(what string, before uint64, err error, allowed ...error) {
	w.t.Helper()
	w.logf("%s -> %v", what, err)
	if err == nil {
		return
	}
	if errors.Is(err, ErrUnauthenticated) || errors.Is(err, ErrSessionExpired) {
		return
	}
	if errors.Is(err, ErrTenantState) {
		w.checkTenantRefusal(what, err)
		return
	}
	ok := false
	for _, a := range allowed {
		ok = ok || errors.Is(err, a)
	}
	if !ok {
		w.fail("%s: unexpected error %v", what, err)
	}
	// These refusals are decided before anything could end lazily. (A
	// bound is checked after the target: a node found past its deadline
	// on the way has ended, and that is all.)
	// What an end found on the way frees is dispatched at once: grants
	// may follow it.
	before = w.afterResets(before)
	if evs := w.rec.events[before:]; errors.Is(err, ErrBound) && (len(evs) == 0 || evs[0].Kind == EvNodeEnded) && !slices.ContainsFunc(evs, func(ev Event) bool {
		return !(ev.Kind == EvNodeEnded && ev.State == Expired) && ev.Kind != EvLeaseGranted
	}) {
		return
	}
	if errors.Is(err, ErrPermission) || errors.Is(err, ErrInvalid) || errors.Is(err, ErrRequestIDReused) || errors.Is(err, ErrNotFound) ||
		errors.Is(err, ErrBound) {
		if w.e.Seq() != before {
			w.fail("%s: refused with %v but emitted events %d..%d", what, err, before+1, w.e.Seq())
		}
	}
}

// remember keeps a request that caused an event, for retries later. A
// request id is stored in the event it caused, so one that caused none (a
// no-op release) is not remembered.
func (w *world) remember(sid SessionID, id, result string, call func(string, bool) (string, error)) {
	w.rememberOn(sid, 0, id, result, call)
}

// rememberOn is remember for a request that names node.
func (w *world) rememberOn(sid SessionID, node NodeID, id, result string, call func(string, bool) (string, error)) {
	if id != "" && w.caused(sid, id) {
		w.requests = append(w.requests, doneRequest{sid: sid, id: id, result: result, call: call, node: node})
	}
}

func (w *world) randomOp() {
	e := w.e
	sid := w.session()
	before := e.Seq()
	switch op := w.rng.Intn(118); {
	case op < 22: // consume
		n, _ := w.nodeFor(sid, false)
		r, amt, rid := resources[w.rng.Intn(3)], 1+w.rng.Int63n(6), w.reqID()
		amt = w.hostileAmount(amt, w.m.fullest(n, r, false))
		invalid := amt <= 0 || w.m.quotaOverflows(n, r, amt, false)
		err := e.Consume(sid, n, r, amt, rid)
		what := fmt.Sprintf("consume s%d n%d %s %d %q", sid, n, r, amt, rid)
		w.expect(what, before, err, ErrQuotaExhausted, ErrTaskEnded, ErrRecalling, ErrBound, ErrInvalid, ErrRateLimited)
		w.checkHostile(what, err, invalid)
		w.checkBoundRefusal(what, err, n, []string{r}, nil, false)
		w.checkRateRefusal(what, err, n, r, amt)
		w.checkRefusal(sid, err, n, r, amt, 0)
		if err == nil {
			w.remember(sid, rid, "", func(id string, differ bool) (string, error) {
				a := amt
				if differ {
					a = otherAmount(a)
				}
				return "", e.Consume(sid, n, r, a, id)
			})
		}
	case op < 36: // acquire, sometimes with charges; sometimes a few at once, so that acquires queue
		for range 1 + w.rng.Intn(2)*w.rng.Intn(4) {
			w.acquireOp(sid, e.Seq())
		}
	case op < 48: // release a lease the driver holds, or a random one
		var id LeaseID
		if len(w.held) > 0 && w.rng.Intn(8) > 0 {
			ids := sortedKeys(w.held)
			id = ids[w.rng.Intn(len(ids))]
			sid = w.held[id]
		} else {
			id = LeaseID(w.rng.Int63n(int64(e.nextLease) + 2))
		}
		lat := time.Duration(w.rng.Int63n(int64(100 * time.Millisecond)))
		rid := w.reqID()
		over := w.rng.Intn(10) == 0
		ml, live := w.m.leases[id]
		remembered := rid != "" && w.m.Remembers(sid, rid)
		limitBefore := w.adaptiveLimits()
		err := e.Release(sid, id, lat, over, rid)
		w.expect(fmt.Sprintf("release s%d l%d %q", sid, id, rid), before, err, ErrLeaseExpired, ErrLeaseRevoked, ErrNotFound, ErrPermission, ErrLeaseReleased)
		if !live && !remembered {
			w.checkLeaseAnswer("release", sid, id, err, true)
		}
		for _, ev := range w.rec.events[before:] {
			if ev.Kind == EvLeaseReleased && ev.Lease == id && ev.Session == sid && !ev.GivenBack && !ml.block {
				w.m.Observe(ml.class, lat, over, ml.granted)
				w.checkCutAtOnce("release", ml.class, limitBefore[ml.class], w.clock.Now().UnixNano(), before)
			}
		}
		if err == nil || errors.Is(err, ErrLeaseExpired) || errors.Is(err, ErrLeaseRevoked) {
			if w.held[id] == sid {
				delete(w.held, id)
			}
		}
		if err == nil && rid != "" {
			w.remember(sid, rid, "", func(rid string, differ bool) (string, error) {
				return "", e.Release(sid, id+LeaseID(b2i(differ)), 0, false, rid)
			})
		}
	case op < 52: // a waiter gives up, perhaps at the instant of its grant
		if len(w.waits) > 0 {
			i := w.rng.Intn(len(w.waits))
			if w.rng.Intn(2) == 0 {
				// Favour the race that matters: a grant that arrived and
				// that its caller gives up before taking.
				if j := slices.IndexFunc(w.waits, func(p *pending) bool {
					return p.arrived && e.leases[p.outcome.Grant.Lease] != nil
				}); j >= 0 {
					i = j
				}
			}
			p := w.waits[i]
			w.waits = slices.Delete(w.waits, i, i+1)
			l := p.outcome.Grant.Lease
			live := p.arrived && l != 0 && e.leases[l] != nil // not ended meanwhile (an expiry, a revoke)
			w.m.Cancel(p.wait)
			e.CancelWait(p.wait)
			w.logf("cancel wait of s%d (outcome arrived: %v %v)", p.sid, p.arrived, p.outcome)
			if live {
				w.tally.cancelledAtGrant++
				if e.leases[l] != nil {
					w.fail("a wait cancelled at the instant of its grant kept lease %d", l)
				}
			}
		}
	case op < 60: // create or find a node
		parent, _ := w.nodeFor(sid, false)
		spec := NodeSpec{Name: fmt.Sprintf("t%d", w.rng.Intn(12)), Quotas: w.randCaps(resources, 30), Limits: w.randCaps(classes, 3),
			Priority: w.rng.Int63n(3)}
		if w.rng.Intn(3) == 0 {
			spec.DefaultQuotas = w.randCaps(resources, 20)
		}
		if w.rng.Intn(4) == 0 {
			spec.Deadline = w.clock.Now().Add(time.Duration(1+w.rng.Intn(20)) * time.Second).UnixNano()
		}
		rid := w.reqID()
		find := w.rng.Intn(3) == 0
		var v NodeView
		var err error
		if find {
			v, _, err = e.FindOrCreate(sid, parent, spec, rid)
		} else {
			v, err = e.CreateNode(sid, parent, spec, rid)
		}
		what := fmt.Sprintf("create s%d under n%d %q find=%v: n%d", sid, parent, spec.Name, find, v.ID)
		w.expect(what, before, err, ErrTaskEnded, ErrExists, ErrInvalid, ErrBound)
		w.checkBoundRefusal(what, err, parent, names(spec.Quotas, spec.DefaultQuotas), names(spec.Limits, spec.DefaultLimits), false)
		if err == nil {
			if !slices.Contains(w.nodes, v.ID) {
				w.nodes = append(w.nodes, v.ID)
			}
			if !find {
				w.rememberOn(sid, v.ID, rid, fmt.Sprint(v.ID), func(id string, differ bool) (string, error) {
					s := spec
					if differ {
						s.Name += "x"
					}
					v, err := e.CreateNode(sid, parent, s, id)
					return fmt.Sprint(v.ID), err
				})
			}
		}
	case op < 63: // close or cancel a node
		n, _ := w.nodeFor(sid, false)
		state := Closed
		if w.rng.Intn(2) == 0 {
			state = Cancelled
		}
		rid := w.reqID()
		_, err := e.EndNode(sid, n, state, rid)
		w.expect(fmt.Sprintf("end s%d n%d %s %q", sid, n, state, rid), before, err, ErrPermission)
		if errors.Is(err, ErrPermission) && n != w.scope[sid] {
			w.fail("ending node %d inside scope %d was refused: %v", n, w.scope[sid], err)
		}
	case op < 69: // edit caps
		n, _ := w.nodeFor(sid, false)
		edit := CapsEdit{Quotas: w.randCaps(resources, 60), Limits: w.randCaps(classes, 5)}
		if w.rng.Intn(3) == 0 {
			edit.DefaultQuotas = w.randCaps(resources, 20)
			edit.DefaultLimits = w.randCaps(classes, 3)
		}
		if w.rng.Intn(4) == 0 {
			wt := 1 + w.rng.Int63n(4)
			edit.Weight = &wt
		}
		if w.rng.Intn(6) == 0 {
			d := int64(0)
			if w.rng.Intn(2) == 0 {
				d = w.clock.Now().Add(time.Duration(w.rng.Intn(10)) * time.Second).UnixNano()
			}
			edit.Deadline = &d
		}
		if w.rng.Intn(3) == 0 {
			edit.QuotaModes = w.randModes(edit.Quotas, w.m.quotas[n], resources, 20)
			edit.LimitModes = w.randModes(edit.Limits, w.m.limits[n], classes, 3)
		}
		rid := w.reqID()
		audit := w.randOverride(edit)
		w.randMinimums(&edit, n, audit.For == 0, false)
		_, err := e.SetCapsAudited(sid, n, edit, audit, rid)
		what := fmt.Sprintf("caps s%d n%d %+v for %v %q", sid, n, edit, audit.For, rid)
		w.expect(what, before, err, ErrPermission, ErrTaskEnded, ErrBound)
		w.checkBoundRefusal(what, err, n, names(edit.Quotas, edit.DefaultQuotas), names(edit.Limits, edit.DefaultLimits), false)
		if err == nil {
			w.checkRecalledUnder(what, n)
		}
		switch {
		case n == w.scope[sid] && err == nil:
			w.fail("session %d edited its own scope node %d", sid, n)
		case n != w.scope[sid] && errors.Is(err, ErrPermission):
			w.fail("session %d refused an edit of node %d inside its scope: %v", sid, n, err)
		}
	case op < 72: // sessions come and go
		switch w.rng.Intn(3) {
		case 0:
			w.openSession(w.tenants[w.rng.Intn(len(w.tenants))])
		case 1:
			err := e.CloseSession(sid)
			w.expect(fmt.Sprintf("close session %d", sid), before, err)
			w.forgetSession(sid)
		default:
			w.quiet[sid] = true // the worker dies
		}
	case op < 80: // time passes; live workers heartbeat
		d := time.Duration(w.rng.Int63n(int64(800 * time.Millisecond)))
		if w.rng.Intn(10) == 0 {
			d = time.Duration(w.rng.Int63n(int64(3 * sessionTTL)))
		}
		for _, s := range w.sessions {
			if !w.quiet[s] && d < sessionTTL {
				if _, err := e.Heartbeat(s); err != nil {
					w.forgetSession(s)
				} else {
					w.expires[s] = w.clock.Now().UnixNano() + int64(sessionTTL)
				}
			}
		}
		w.advance(d)
	case op < 84:
		w.reap()
	case op < 87: // validate
		id := LeaseID(w.rng.Int63n(int64(e.nextLease) + 2))
		_, live := w.m.leases[id]
		g, err := e.Validate(sid, id)
		w.expect(fmt.Sprintf("validate s%d l%d: %v", sid, id, g), before, err, ErrLeaseExpired, ErrLeaseRevoked, ErrLeaseReleased, ErrNotFound, ErrPermission)
		if !live {
			w.checkLeaseAnswer("validate", sid, id, err, false)
		}
		if err == nil && e.leases[id] == nil {
			w.fail("validate of lease %d succeeded but it is not held", id)
		}
	case op < 93: // a retry: same id, same arguments
		if len(w.requests) == 0 {
			return
		}
		r := w.requests[w.rng.Intn(len(w.requests))]
		if w.forgotten(r) {
			return
		}
		got, err := r.call(r.id, false)
		w.logf("retry s%d %q -> %q %v", r.sid, r.id, got, err)
		if errors.Is(err, ErrUnauthenticated) || errors.Is(err, ErrSessionExpired) {
			return
		}
		if errors.Is(err, ErrNotFound) && r.node != 0 && e.nodes[r.node] == nil {
			return // the node it named was reclaimed: forgotten, as SPEC.md says
		}
		if err != nil || got != r.result {
			w.fail("retry of %q by session %d returned %q, %v; the original returned %q", r.id, r.sid, got, err, r.result)
		}
		if e.Seq() != w.afterResets(before) {
			w.fail("retry of %q emitted events %d..%d", r.id, before+1, e.Seq())
		}
	case op < 95: // an id reused with other arguments
		if len(w.requests) == 0 {
			return
		}
		r := w.requests[w.rng.Intn(len(w.requests))]
		if w.forgotten(r) {
			return
		}
		_, err := r.call(r.id, true)
		w.expect(fmt.Sprintf("reuse s%d %q", r.sid, r.id), before, err, ErrRequestIDReused)
		if err == nil {
			w.fail("request id %q reused with other arguments was accepted", r.id)
		}
	case op >= 100 && op < 106:
		w.blockOp(sid, before)
	case op >= 106 && op < 112:
		w.reserveOp(sid, before)
	case op >= 112:
		w.askAboutEnded(sid, before)
	default: // calls outside the scope, on purpose
		if w.scope[sid] == RootID {
			return
		}
		n, ok := w.nodeFor(sid, true)
		if !ok {
			return
		}
		var err error
		call := w.rng.Intn(7)
		switch call {
		case 0:
			err = e.Consume(sid, n, "tokens", 1, "")
		case 1:
			_, _, err = e.Acquire(sid, AcquireRequest{Node: n, Class: "db"})
		case 2:
			_, err = e.Get(sid, n)
		case 3:
			_, err = e.Children(sid, n, 0, 0)
		case 4:
			_, err = e.CreateNode(sid, n, NodeSpec{Name: "intruder"}, "")
		case 5:
			_, err = e.SetCaps(sid, n, CapsEdit{Quotas: map[string]int64{"tokens": 1 << 40}}, "")
		case 6:
			_, err = e.EndNode(sid, n, Cancelled, "")
		}
		w.expect(fmt.Sprintf("outside call %d s%d n%d", call, sid, n), before, err, ErrNotFound)
		if err == nil {
			w.fail("call %d by session %d (scope %d) on node %d outside its scope succeeded", call, sid, w.scope[sid], n)
		}
	}
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// arrived reports whether lease id sits in a wait's outcome its caller has
// not taken yet.
func (w *world) arrived(id LeaseID) bool {
	for _, p := range w.waits {
		if p.arrived && p.outcome.Err == nil && p.outcome.Grant.Lease == id {
			return true
		}
	}
	return false
}

// caused reports whether some event records the request.
func (w *world) caused(sid SessionID, id string) bool {
	for i := len(w.rec.events) - 1; i >= 0 && i >= len(w.rec.events)-4; i-- {
		if ev := w.rec.events[i]; ev.RequestID == id && ev.Session == sid {
			return true
		}
	}
	return false
}

// drain collects the outcomes of queued acquires. Some callers are slow to
// look, so a cancel can later race a grant that has already arrived.
func (w *world) drain() {
	w.waits = slices.DeleteFunc(w.waits, func(p *pending) bool {
		if !p.arrived {
			select {
			case p.outcome = <-p.wait.C:
				p.arrived = true
			default:
				return false
			}
		}
		if w.rng.Intn(2) == 0 {
			return false // the caller has not woken up yet
		}
		w.logf("wait of s%d -> %v %v", p.sid, p.outcome.Grant, p.outcome.Err)
		if p.outcome.Err == nil {
			w.held[p.outcome.Grant.Lease] = p.sid
		}
		if want, ok := w.m.granted[p.wait]; p.outcome.Err == nil && (!ok || want != p.outcome.Grant.Lease) {
			w.fail("I6 DRR: a queued acquire of session %d was granted lease %d; the model's fair queue granted it %d (0: none)",
				p.sid, p.outcome.Grant.Lease, want)
		}
		delete(w.m.granted, p.wait)
		return true
	})
}

// check verifies every state invariant from scratch, and the model's
// transition audit.
func (w *world) check() {
	w.t.Helper()
	e, m := w.e, w.m
	if len(m.errs) > 0 {
		w.fail("%s", strings.Join(m.errs, "\n"))
	}
	if len(e.nodes) != len(m.state) {
		w.fail("engine has %d nodes, model %d", len(e.nodes), len(m.state))
	}
	w.nodes = slices.DeleteFunc(w.nodes, func(id NodeID) bool {
		if e.nodes[id] == nil {
			w.gone = append(w.gone, id)
			return true
		}
		return false
	})
	w.checkReclaimed()
	w.checkBounds()
	w.checkCounters()
	w.checkDecisions()
	w.checkRates()
	w.checkSlices()
	w.checkPeriods()
	heldCount := map[NodeID]map[string]int64{}
	for id, l := range e.leases {
		ml, ok := m.leases[id]
		if !ok || ml.session != l.session.id || ml.node != l.node.id || ml.class != l.class {
			w.fail("lease %d: engine %+v, model %+v (present %v)", id, l, ml, ok)
		}
		if e.sessions[l.session.id] != l.session {
			w.fail("I7 lease %d belongs to session %d, which is not open", id, l.session.id)
		}
		if l.node.state != Open {
			w.fail("I7 lease %d is held on node %d, which is %s", id, l.node.id, l.node.state)
		}
		if id >= e.nextLease {
			w.fail("I4 lease %d is not below the counter %d", id, e.nextLease)
		}
		if _, dead := e.tombs[id]; dead {
			w.fail("I4 lease %d is both live and a tombstone", id)
		}
		if _, known := w.held[id]; !known && !w.arrived(id) {
			w.fail("I5 lease %d (session %d) was granted but never handed to a caller: leaked", id, l.session.id)
		}
		if ml.block != l.block || ml.count != l.count {
			w.fail("lease %d: engine block=%v count=%d, model block=%v count=%d", id, l.block, l.count, ml.block, ml.count)
		}
		for a := l.node; a != nil; a = a.parent {
			add(heldCount, a.id, l.class, l.count)
		}
	}
	reservedCount := map[NodeID]map[string]int64{}
	for r, byRes := range e.reserved {
		for res := range byRes {
			if res.amount <= 0 || e.sessions[res.session.id] != res.session || res.session.reservations[resKey{res.node.id, r}] != res {
				w.fail("reservation of %s on node %d by session %d (%d units) is not filed where it belongs", r, res.node.id, res.session.id, res.amount)
			}
			if m.reservations[modelRes{res.session.id, res.node.id, r}] != res.amount {
				w.fail("reservation of %s on node %d by session %d: engine %d, model %d", r, res.node.id, res.session.id, res.amount,
					m.reservations[modelRes{res.session.id, res.node.id, r}])
			}
			for a := res.node; a != nil; a = a.parent {
				add(reservedCount, a.id, r, res.amount)
			}
		}
	}
	w.checkDelegation()
	if len(e.leases) != len(m.leases) {
		w.fail("engine holds %d leases, model %d", len(e.leases), len(m.leases))
	}
	for id, n := range e.nodes {
		for _, c := range []struct {
			name         string
			engine, want map[string]int64
		}{
			{"used (I2)", n.quota.counts(), m.used[id]},
			{"shadow ledger (I23)", n.shadow, m.shadow[id]},
			{"reserved (I2)", n.quota.reservedCounts(), m.reserved[id]},
			{"reserved recounted (I2)", n.quota.reservedCounts(), m.unlessClamped(id, "reserved", n.quota.reservedCounts(), reservedCount[id])},
			{"held (I2)", n.limit.counts(), m.held[id]},
			{"held recounted (I2)", n.limit.counts(), m.unlessClamped(id, "held", n.limit.counts(), heldCount[id])},
			{"quotas", n.quota.caps(), m.quotas[id]},
			{"limits", n.limit.caps(), m.limits[id]},
			{"default quotas", n.defQuotas, m.defQ[id]},
			{"default limits", n.defLimits, m.defL[id]},
		} {
			if !maps.Equal(nilIfEmpty(c.engine), nilIfEmpty(c.want)) {
				w.fail("node %d %s: engine %v, model %v", id, c.name, c.engine, c.want)
			}
		}
		if id != RootID && n.state != m.state[id] {
			w.fail("node %d state: engine %s, model %s", id, n.state, m.state[id])
		}
		modes := map[modeKey]CapMode{}
		for k, cm := range n.quota.modes() {
			modes[modeKey{false, k}] = cm
		}
		for k, cm := range n.limit.modes() {
			modes[modeKey{true, k}] = cm
		}
		if !maps.Equal(modes, m.modes[id]) && (len(modes) > 0 || len(m.modes[id]) > 0) {
			w.fail("node %d modes: engine %v, model %v", id, modes, m.modes[id])
		}
		if n.tstate != m.tstate[id] {
			w.fail("node %d tenant state: engine %s, model %s", id, n.tstate, m.tstate[id])
		}
		for name, c := range n.open {
			if c.state != Open || c.name != name || c.parent != n {
				w.fail("node %d's open index names %q -> node %d (%s)", id, name, c.id, c.state)
			}
		}
	}
	// I5: no waiter that fits is left waiting.
	for class, q := range e.queues {
		count := 0
		for i, tq := range q.ring {
			count += len(tq.waiters)
			if tq.deficit < 0 || tq.deficit > tq.tenant.weight {
				w.fail("I6 DRR: tenant %d's deficit %d is outside [0, %d]", tq.tenant.id, tq.deficit, tq.tenant.weight)
			}
			for j, wt := range tq.waiters {
				if wt.done {
					w.fail("a finished waiter is still queued")
				}
				if e.root.fits(class) && wt.node.fits(class) {
					w.fail("I5 a waiter of session %d for %s on node %d fits but waits (tenant %d, position %d)", wt.session.id, class, wt.node.id, i, j)
				}
				if j > 0 && tq.waiters[j-1].priority < wt.priority {
					w.fail("tenant %d's queue is out of priority order", tq.tenant.id)
				}
			}
		}
		if count != q.waiting {
			w.fail("queue %s counts %d waiters, holds %d", class, q.waiting, count)
		}
	}
	for _, s := range e.sessions {
		for _, wt := range s.waiters {
			if wt.done {
				w.fail("session %d still lists a finished waiter of %s on node %d", s.id, wt.class, wt.node.id)
			}
		}
		if len(s.requests.byID) > RequestMemory || len(s.requests.byID) != len(s.requests.order) {
			w.fail("session %d remembers %d ids in a ring of %d", s.id, len(s.requests.byID), len(s.requests.order))
		}
	}
}

// checkReplay rebuilds the state three ways and compares each with the live
// engine, field by field.
func (w *world) checkReplay() {
	w.quiesce()
	live := w.e.Snapshot()
	events := w.rec.events
	// Events and snapshots go through JSON, as they do through a store.
	var decoded []Event
	raw, err := json.Marshal(events)
	if err != nil {
		w.fail("encode events: %v", err)
	}
	if err := json.Unmarshal(raw, &decoded); err != nil {
		w.fail("decode events: %v", err)
	}
	roundTrip := func(s Snapshot) Snapshot {
		var out Snapshot
		raw, err := json.Marshal(s)
		if err == nil {
			err = json.Unmarshal(raw, &out)
		}
		if err != nil {
			w.fail("snapshot round trip: %v", err)
		}
		return out
	}
	var replays []*Engine
	var names []string
	for _, way := range []struct {
		name string
		snap *Snapshot
		from uint64
	}{
		{"events only", nil, 0},
		{"mid-run snapshot plus later events", w.mid, w.mid.Seq},
		{"final snapshot", &live, live.Seq},
	} {
		e, err := New(Config{Clock: w.clock, Adaptive: w.cfg.Adaptive, Retention: w.cfg.Retention})
		if err != nil {
			w.fail("%v", err)
		}
		if way.snap != nil {
			if err := e.Restore(roundTrip(*way.snap)); err != nil {
				w.fail("%s: restore: %v", way.name, err)
			}
		}
		if err := e.Apply(decoded[way.from:]...); err != nil {
			w.fail("%s: apply: %v", way.name, err)
		}
		if got := e.Snapshot(); !reflect.DeepEqual(got, live) {
			w.fail("replay from %s differs from the live engine:\n%s", way.name, diffSnapshots(live, got))
		}
		replays = append(replays, e)
		names = append(names, way.name)
	}
	// Then by behaviour and by the internal tables, not through
	// Snapshot(): a field Snapshot() leaves out is missing from both
	// snapshots alike. Sessions get one fresh TTL, as a replay gives them.
	w.e.RenewAll()
	liveTables := dumpTables(w.e)
	liveAnswers := behaviour(w.e)
	liveAfter := dumpTables(w.e)
	for i, e := range replays {
		if d := firstDiff(liveTables, dumpTables(e)); d != "" {
			w.fail("replay from %s holds other tables than the live engine, %s", names[i], d)
		}
		if d := firstDiff(liveAnswers, behaviour(e)); d != "" {
			w.fail("replay from %s answers otherwise than the live engine, %s", names[i], d)
		}
		if d := firstDiff(liveAfter, dumpTables(e)); d != "" {
			w.fail("replay from %s, asked the same questions, holds other tables than the live engine, %s", names[i], d)
		}
	}
}

// diffSnapshots names the first fields that differ.
func diffSnapshots(want, got Snapshot) string {
	var out []string
	wv, gv := reflect.ValueOf(want), reflect.ValueOf(got)
	for i := range wv.NumField() {
		f := wv.Type().Field(i).Name
		a, b := wv.Field(i).Interface(), gv.Field(i).Interface()
		if reflect.DeepEqual(a, b) {
			continue
		}
		if wv.Field(i).Kind() == reflect.Slice {
			n := max(wv.Field(i).Len(), gv.Field(i).Len())
			for j := range n {
				var x, y any
				if j < wv.Field(i).Len() {
					x = wv.Field(i).Index(j).Interface()
				}
				if j < gv.Field(i).Len() {
					y = gv.Field(i).Index(j).Interface()
				}
				if !reflect.DeepEqual(x, y) {
					out = append(out, fmt.Sprintf("%s[%d]:\n  live:   %+v\n  replay: %+v", f, j, x, y))
					break
				}
			}
			continue
		}
		out = append(out, fmt.Sprintf("%s: live %+v, replay %+v", f, a, b))
	}
	return strings.Join(out, "\n")
}

// acquireOp is one Acquire, sometimes with charges, sometimes charges only.
func (w *world) acquireOp(sid SessionID, before uint64) {
	e := w.e
	n, _ := w.nodeFor(sid, false)
	class := classes[w.rng.Intn(3)]
	var charges map[string]int64
	if w.rng.Intn(3) == 0 {
		r := resources[w.rng.Intn(3)]
		charges = map[string]int64{r: w.hostileAmount(1+w.rng.Int63n(3), w.m.fullest(n, r, false))}
		if w.rng.Intn(4) == 0 {
			class = ""
		}
	}
	rid := w.reqID()
	write := w.policy.Intn(3) == 0
	invalid := w.m.chargesInvalid(n, charges, false)
	g, wait, err := e.Acquire(sid, AcquireRequest{Node: n, Class: class, Charges: charges, RequestID: rid, Write: write})
	what := fmt.Sprintf("acquire s%d n%d %q %v %q: %v queued=%v", sid, n, class, charges, rid, g, wait != nil)
	w.expect(what, before, err, ErrQuotaExhausted, ErrTaskEnded, ErrInvalid, ErrRecalling, ErrBound, ErrRateLimited)
	w.checkHostile(what, err, invalid)
	w.checkBoundRefusal(what, err, n, names(charges), classesOf(class), false)
	for r, amt := range charges {
		w.checkRefusal(sid, err, n, r, amt, 0)
		w.checkRateRefusal(what, err, n, r, amt)
	}
	if err != nil {
		return
	}
	if wait != nil {
		w.waits = append(w.waits, &pending{wait: wait, sid: sid})
		w.m.Enqueue(wait, sid, n, class, charges, rid, write)
		return
	}
	if g.Lease != 0 {
		w.held[g.Lease] = sid
	} else {
		w.charges = append(w.charges, chargeReq{sid, AcquireRequest{Node: n, Charges: charges, RequestID: rid, Write: write}})
	}
	w.remember(sid, rid, fmt.Sprint(g.Lease), func(id string, differ bool) (string, error) {
		c := class
		if differ {
			c += "x"
		}
		g, _, err := e.Acquire(sid, AcquireRequest{Node: n, Class: c, Charges: charges, RequestID: id, Write: write})
		return fmt.Sprint(g.Lease), err
	})
}

// observeOp is a sidecar reporting a batch of calls made in its slots,
// which feed adaptive limits as releases do.
func (w *world) observeOp(sid SessionID, before uint64) {
	class := classes[w.rng.Intn(3)]
	var samples []Sample
	for range 1 + w.rng.Intn(6) {
		samples = append(samples, Sample{Latency: time.Duration(w.rng.Int63n(int64(80 * time.Millisecond))), Overloaded: w.rng.Intn(12) == 0})
	}
	limitBefore := w.adaptiveLimits()
	err := w.e.Observe(sid, class, samples)
	w.expect(fmt.Sprintf("observe s%d %s %d samples", sid, class, len(samples)), before, err)
	if err == nil {
		now := w.clock.Now().UnixNano()
		for _, s := range samples {
			w.m.Observe(class, s.Latency, s.Overloaded, now-int64(s.Latency))
		}
		if _, adaptive := limitBefore[class]; adaptive {
			w.checkCutAtOnce("observe", class, limitBefore[class], now, before)
		}
	}
}

// blockOp is a sidecar growing its block of a class, or giving idle slots
// back. (Releasing a block is the release operation's: blocks are held
// leases.)
func (w *world) blockOp(sid SessionID, before uint64) {
	e := w.e
	if w.rng.Intn(3) == 0 {
		w.observeOp(sid, before)
		return
	}
	n, _ := w.nodeFor(sid, false)
	class := classes[w.rng.Intn(3)]
	req := BlockRequest{Node: n, Class: class, Want: 1 + w.rng.Int63n(4), RequestID: w.reqID()}
	if s := e.sessions[sid]; s != nil && w.rng.Intn(3) == 0 {
		if l := s.blocks[blockKey{n, class}]; l != nil && l.count > 0 {
			req.Want, req.Return = 0, 1+w.rng.Int63n(l.count)
		}
	}
	if req.Return > 0 {
		req.Return = w.hostileAmount(req.Return, 0)
	} else {
		req.Want = w.hostileAmount(req.Want, w.m.fullestHeld(n, class))
	}
	contended := e.contended(class)
	invalid := w.blockInvalid(sid, req, contended)
	g, err := e.Block(sid, req)
	what := fmt.Sprintf("block s%d %+v: %+v", sid, req, g)
	w.expect(what, before, err, ErrTaskEnded, ErrNotFound, ErrLeaseRevoked, ErrLeaseExpired, ErrBound, ErrInvalid)
	w.checkHostile(what, err, invalid)
	w.checkBoundRefusal(what, err, n, nil, []string{class}, false)
	if err != nil {
		return
	}
	if g.Granted > 0 && contended {
		w.fail("I12 delegation: block %d of %s grew by %d while acquires of the class queued", g.Lease, class, g.Granted)
	}
	if now := e.contended(class); g.Contended != now {
		w.fail("block %d says contended=%v, the queue says %v", g.Lease, g.Contended, now)
	}
	w.held[g.Lease] = sid
	w.told[blockKey2{sid, n, class}] = map[bool]NoticeKind{true: NoticeContended, false: NoticeUncontended}[g.Contended]
	w.remember(sid, req.RequestID, fmt.Sprint(g.Lease, g.Granted), func(id string, differ bool) (string, error) {
		r := req
		r.RequestID = id
		if differ && r.Return > 0 {
			r.Return = otherAmount(r.Return)
		} else if differ {
			r.Want = otherAmount(r.Want)
		}
		g, err := e.Block(sid, r)
		return fmt.Sprint(g.Lease, g.Granted), err
	})
}

// reserveOp is a sidecar spending its reservation locally, topping it up
// (settling what it spent), or settling and giving unspent units back.
func (w *world) reserveOp(sid SessionID, before uint64) {
	n, _ := w.nodeFor(sid, false)
	r := resources[w.rng.Intn(3)]
	k := modelRes{sid, n, r}
	loc := w.local[k]
	if loc == nil {
		loc = &localRes{}
	}
	req := ReserveRequest{Node: n, Resource: r, Spent: loc.spent, RequestID: w.reqID()}
	switch x := w.rng.Intn(10); {
	case x < 3 && loc.unspent > 0:
		amt := 1 + w.rng.Int63n(loc.unspent)
		loc.unspent -= amt
		loc.spent += amt
		w.logf("s%d spends %d of %s on n%d locally", sid, amt, r, n)
		return
	case x < 6:
		req.Want = 1 + w.rng.Int63n(8)
	case x < 8:
		// The hold of one call's estimate: all of it or nothing, and no
		// settlement in the same call (the spent units stay local).
		req.Want, req.Spent, req.Exact = 1+w.rng.Int63n(12), 0, true
	default:
		req.Return = w.rng.Int63n(loc.unspent + 1)
		if req.Spent == 0 && req.Return == 0 {
			req.Want = 1
		}
	}
	req.Spent = w.hostileAmount(req.Spent, 0)
	req.Return = w.hostileAmount(req.Return, 0)
	req.Want = w.hostileAmount(req.Want, w.m.fullest(n, r, false))
	w.reserve(sid, req, before)
}

func (w *world) reserve(sid SessionID, req ReserveRequest, before uint64) {
	e := w.e
	k := modelRes{sid, req.Node, req.Resource}
	invalid, overflows := w.reserveInvalid(sid, req)
	held := w.e.sessions[sid] != nil && w.e.sessions[sid].slices[resKey{req.Node, req.Resource}] != nil
	expect := w.m.expectedSlice(req.Node, req.Resource, w.clock.Now().UnixNano())
	res, err := e.Reserve(sid, req)
	what := fmt.Sprintf("reserve s%d %+v: %+v", sid, req, res)
	w.expect(what, before, err, ErrQuotaExhausted, ErrTaskEnded, ErrRecalling, ErrBound, ErrInvalid, ErrRateLimited)
	// A top-up of a rated resource with no slice to come reserves nothing,
	// so a want that would overflow a counter is no fault (checkRated
	// checks the slice decision).
	nothing := err == nil && res.Rated && res.Slice == nil && res.Granted == 0
	w.checkHostile(what, err, invalid || overflows && !nothing)
	w.checkBoundRefusal(what, err, req.Node, []string{req.Resource}, nil, false)
	asked := int64(1) // a top-up is refused only when not one unit fits
	if req.Exact {
		asked = req.Want
	}
	w.checkRateRefusal(what, err, req.Node, req.Resource, asked)
	w.checkRefusal(sid, err, req.Node, req.Resource, asked, req.Return)
	if err != nil {
		return
	}
	if req.Exact && res.Granted != req.Want {
		w.fail("an exact reservation of %d %s on n%d granted %d", req.Want, req.Resource, req.Node, res.Granted)
	}
	w.checkRated(req, res, held, expect)
	loc := w.local[k]
	if loc == nil {
		loc = &localRes{}
		w.local[k] = loc
	}
	loc.spent -= req.Spent
	loc.unspent += res.Granted - req.Return
	w.remember(sid, req.RequestID, fmt.Sprint(res.Granted), func(id string, differ bool) (string, error) {
		r := req
		r.RequestID = id
		if differ {
			r.Want = otherAmount(r.Want)
		}
		res, err := e.Reserve(sid, r)
		return fmt.Sprint(res.Granted), err
	})
}

// respond is the sidecars acting on this step's notices, as they should
// (most of the time: some are slow). Acting may bring more notices.
func (w *world) respond() {
	for round := 0; len(w.notices) > 0 && round < 8; round++ {
		notices := w.notices
		w.notices = nil
		for _, nt := range notices {
			w.logf("notice %+v", nt)
			switch nt.Kind {
			case NoticeContended, NoticeUncontended:
				w.told[blockKey2{nt.Session, nt.Node, nt.Class}] = nt.Kind
				continue
			}
			if w.rng.Intn(4) == 0 {
				continue // slow to act
			}
			w.giveBack(nt)
		}
	}
	w.notices = nil
}

// giveBack settles and gives back what a notice asks for.
func (w *world) giveBack(nt Notice) {
	e := w.e
	s := e.sessions[nt.Session]
	if s == nil {
		return
	}
	if nt.Resource == "" {
		for _, l := range sortedBlocks(e.blocks[nt.Class]) {
			if nt.Class == "" {
				break
			}
			if l.session == s && l.count > 0 && l.node.within(e.nodes[nt.Node]) && nt.Kind == NoticeRecall {
				g, err := e.Block(s.id, BlockRequest{Node: l.node.id, Class: l.class, Return: l.count})
				w.logf("give back block %d: %+v %v", l.id, g, err)
			}
		}
		if nt.Class == "" {
			for _, c := range slices.Sorted(maps.Keys(e.blocks)) {
				for _, l := range sortedBlocks(e.blocks[c]) {
					if l.session == s && l.count > 0 && l.node.within(e.nodes[nt.Node]) {
						g, err := e.Block(s.id, BlockRequest{Node: l.node.id, Class: l.class, Return: l.count})
						w.logf("give back block %d: %+v %v", l.id, g, err)
					}
				}
			}
		}
	}
	if nt.Class != "" && nt.Resource == "" {
		return
	}
	for _, res := range s.sortedReservations() {
		if (nt.Resource != "" && res.resource != nt.Resource) || !res.node.within(e.nodes[nt.Node]) {
			continue
		}
		k := modelRes{s.id, res.node.id, res.resource}
		loc := w.local[k]
		if loc == nil {
			w.fail("session %d holds a reservation of %s on node %d that its sidecar does not know", s.id, res.resource, res.node.id)
		}
		w.reserve(s.id, ReserveRequest{Node: res.node.id, Resource: res.resource, Spent: loc.spent, Return: loc.unspent}, e.Seq())
	}
}

// checkRefusal checks what a refused charge of amount of r on node n says
// (returned: units the same request gave back first). A *Denial must be
// deserved by spent units alone (I14) and, on a node above sid's scope,
// name no consumer outside it (I9), and ErrRecalling must have told every
// holder of a reservation in the way (I13).
func (w *world) checkRefusal(sid SessionID, err error, n NodeID, r string, amount, returned int64) {
	var d *Denial
	if errors.As(err, &d) && d.Resource == r && d.Amount <= d.Limit-d.Used {
		w.fail("I14 denial: %v, but what is spent (%d) leaves room for %d more", d, d.Used, d.Amount)
	}
	if d != nil && !w.m.inside(d.Node, w.scope[sid]) && d.Largest != (Consumer{Name: OtherTenant}) &&
		(d.Largest.Node == 0 || !w.m.inside(d.Largest.Node, w.scope[sid])) && d.Largest != (Consumer{}) {
		w.fail("I9 scope: session %d (scope %d) is told of %v, a consumer outside its scope", sid, w.scope[sid], d.Largest)
	}
	if !errors.Is(err, ErrRecalling) {
		return
	}
	// The highest node on n's chain that the charge fits under but for
	// unspent reservations: every reservation below it must be recalled.
	var blocked *node
	for a := w.e.nodes[n]; a != nil; a = a.parent {
		q, refuses := w.m.refusesAt(a.id, false, r) // a soft cap refuses past its burst (policy.go)
		if g := a.quota[r]; g != nil && refuses && amount > q-g.spent()-g.r+returned && amount <= q-g.spent() {
			blocked = a
		}
	}
	if blocked == nil {
		w.fail("ErrRecalling for %d of %s on node %d, but no reservation is in the way", amount, r, n)
	}
	for _, res := range sortedReservations(w.e.reserved[r]) {
		if !res.node.within(blocked) {
			continue
		}
		told := slices.ContainsFunc(w.notices, func(nt Notice) bool {
			return nt.Kind == NoticeRecall && nt.Session == res.session.id && (nt.Resource == r || nt.Resource == "") &&
				res.node.within(w.e.nodes[nt.Node])
		})
		if !told {
			w.fail("I13 recall: %s on node %d is recalled, but session %d, holding %d on node %d, was not told",
				r, blocked.id, res.session.id, res.amount, res.node.id)
		}
	}
}

// checkDelegation checks the sidecars' view against the engine: every
// reservation's units are the sidecar's spent plus unspent, and every block
// holder was last told the contention its class has.
func (w *world) checkDelegation() {
	e := w.e
	for k, loc := range w.local {
		s := e.sessions[k.session]
		if s == nil {
			delete(w.local, k) // the session ended: its units count as spent
			continue
		}
		if have := s.reservedOn(k.node, k.resource); have != loc.spent+loc.unspent {
			w.fail("session %d reserves %d of %s on node %d; its sidecar spent %d and holds %d", k.session, have, k.resource, k.node, loc.spent, loc.unspent)
		}
		if loc.spent == 0 && loc.unspent == 0 {
			delete(w.local, k)
		}
	}
	for _, s := range e.sessions {
		for key := range s.reservations {
			if w.local[modelRes{s.id, key.node, key.resource}] == nil {
				w.fail("session %d reserves %s on node %d, unknown to its sidecar", s.id, key.resource, key.node)
			}
		}
	}
	for class, byID := range e.blocks {
		for _, l := range byID {
			got := w.told[blockKey2{l.session.id, l.node.id, class}]
			if want := map[bool]NoticeKind{true: NoticeContended, false: NoticeUncontended}[e.contended(class)]; got != want {
				w.fail("the holder of block %d of %s was last told %v, but acquires of the class %s", l.id, class, got,
					map[bool]string{true: "queue", false: "do not queue"}[e.contended(class)])
			}
		}
	}
}

// askAboutEnded asks about a reclaimed node, which must be ErrNotFound, or
// about an ended node still kept, which must answer as ended.
func (w *world) askAboutEnded(sid SessionID, before uint64) {
	e := w.e
	if len(w.gone) > 0 && w.rng.Intn(2) == 0 {
		n := w.gone[w.rng.Intn(len(w.gone))]
		var err error
		switch w.rng.Intn(3) {
		case 0:
			_, err = e.Get(sid, n)
		case 1:
			err = e.Consume(sid, n, "tokens", 1, "")
		default:
			_, err = e.CreateNode(sid, n, NodeSpec{Name: "child"}, "")
		}
		w.expect(fmt.Sprintf("ask s%d about reclaimed n%d", sid, n), before, err, ErrNotFound)
		if err == nil {
			w.fail("a call on node %d, reclaimed, succeeded", n)
		}
		return
	}
	var ended []NodeID
	for _, id := range w.nodes {
		if n := e.nodes[id]; n != nil && n.state != Open && n.within(e.sessions[sid].scopeOr(e)) {
			ended = append(ended, id)
		}
	}
	if len(ended) == 0 {
		return
	}
	id := ended[w.rng.Intn(len(ended))]
	v, err := e.Get(sid, id)
	w.expect(fmt.Sprintf("get s%d ended n%d: %s", sid, id, v.State), before, err)
	if err == nil && (!v.State.Ended() || v.Ended == 0) {
		w.fail("node %d ended but Get says %s, ended at %d", id, v.State, v.Ended)
	}
	err = e.Consume(sid, id, "tokens", 1, "")
	w.expect(fmt.Sprintf("consume s%d on ended n%d", sid, id), before, err, ErrTaskEnded)
	if err == nil {
		w.fail("a consume on node %d, ended, succeeded", id)
	}
}

// scopeOr is the session's scope; the system session's for a session the
// engine no longer holds (its calls are refused as unauthenticated anyway).
func (s *session) scopeOr(e *Engine) *node {
	if s == nil {
		return e.root
	}
	return s.scope
}

// checkReclaimed checks what reclamation keeps: every node's end time and
// reclaimed usage against the model, the pins recounted, and (I16) after
// a Reap, that no ended node whose retention has passed is still held
// unless something pins it.
func (w *world) checkReclaimed() {
	e, m := w.e, w.m
	pins := map[NodeID]int{}
	for _, s := range e.sessions {
		pins[s.scope.id]++
		for _, res := range s.reservations {
			pins[res.node.id]++
		}
		for _, sl := range s.slices {
			pins[sl.node.id]++
		}
	}
	for id, n := range e.nodes {
		if n.endedAt != m.endedAt[id] {
			w.fail("node %d ended at %d, the model says %d", id, n.endedAt, m.endedAt[id])
		}
		if !maps.Equal(nilIfEmpty(n.gone), nilIfEmpty(m.gone[id])) {
			w.fail("node %d's reclaimed usage: engine %v, model %v", id, n.gone, m.gone[id])
		}
		if n.pins != pins[id] {
			w.fail("node %d counts %d pins; it has %d", id, n.pins, pins[id])
		}
	}
	if !w.reaped {
		return
	}
	w.reaped = false
	cutoff := e.now() - int64(e.retention)
	for _, n := range e.nodes {
		top := n.parent != nil && n.state != Open && (n.parent.state == Open || n.parent.endedAt > n.endedAt)
		if !top || n.endedAt > cutoff {
			continue
		}
		switch w.m.pinDepth(n.id) {
		case -1:
			w.fail("I16 reclaim: node %d ended %v ago (retention %v), nothing pins it, and Reap kept it",
				n.id, time.Duration(e.now()-n.endedAt), e.retention)
		case 0, 1:
		default:
			w.tally.keptForDeepPin++
		}
	}
}

// checkBounds checks I17: what each tenant holds, recounted, and that no
// step took a tenant past a bound.
func (w *world) checkBounds() {
	e := w.e
	type counts struct{ open, sessions, waiting int }
	got := map[*node]*counts{}
	for _, t := range e.root.children {
		got[t] = &counts{}
	}
	for _, n := range e.nodes {
		if n.depth >= int(KindTask) && n.state == Open {
			got[n.tenant].open++
		}
	}
	for _, s := range e.sessions {
		if c := got[s.scope.tenant]; c != nil {
			c.sessions++
		}
	}
	for _, q := range e.queues {
		for _, tq := range q.ring {
			if c := got[tq.tenant]; c != nil {
				c.waiting += len(tq.waiters)
			}
		}
	}
	if w.names == nil {
		w.names = map[NodeID][2]int{}
	}
	for t, c := range got {
		if t.openBelow != c.open || t.sessions != c.sessions || t.waiting != c.waiting {
			w.fail("tenant %d counts %d open nodes, %d sessions, %d waiters; recounted %d, %d, %d",
				t.id, t.openBelow, t.sessions, t.waiting, c.open, c.sessions, c.waiting)
		}
		b, _ := e.boundsOf(t)
		for _, x := range []struct {
			what     string
			n, bound int
		}{{"open nodes", c.open, b.Nodes}, {"sessions", c.sessions, b.Sessions}, {"waiters", c.waiting, b.Waiters}} {
			if x.bound > 0 && x.n > x.bound {
				w.fail("I17 bounds: tenant %d holds %d %s, its bound is %d", t.id, x.n, x.what, x.bound)
			}
		}
		prev, had := w.names[t.id]
		// System's edits (the operator's configuration) are not bounded,
		// nor is a revert of an override, which puts back a cap the tenant
		// had, as governord's own act.
		had = had && !slices.ContainsFunc(w.rec.events[w.boundsSeen:], func(ev Event) bool {
			n := e.nodes[ev.Node]
			return (ev.Kind == EvCapsReverted || ev.Kind == EvCapsSet && ev.Session == System) && n != nil && n.within(t)
		})
		now := [2]int{len(t.quota), len(t.limit)}
		for i, bound := range []int{b.Resources, b.Classes} {
			if had && now[i] > prev[i] && bound > 0 && now[i] > bound {
				w.fail("I17 bounds: tenant %d went from %d to %d names (resources, classes: %d), past its bound %d", t.id, prev[i], now[i], i, bound)
			}
		}
		w.names[t.id] = now
	}
	w.boundsSeen = len(w.rec.events)
}
