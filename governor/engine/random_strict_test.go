package engine

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"
)

// The randomized checker's strict side: exact answers for ended leases,
// time that lands on the instants the spec draws lines at, sessions that
// outrun their request memory, the model's decisions compared with the
// engine's after every step, and replays compared by how they behave and
// by their internal tables, not only by Snapshot().

// checkLeaseAnswer compares a Release or Validate of a lease the model
// holds no live lease for with the answer the model's tombstones give.
func (w *world) checkLeaseAnswer(what string, sid SessionID, id LeaseID, err error, release bool) {
	w.t.Helper()
	if errors.Is(err, ErrUnauthenticated) || errors.Is(err, ErrSessionExpired) {
		return
	}
	want := w.m.leaseAnswer(sid, w.scope[sid], id, w.clock.Now().UnixNano(), release)
	if !sameLeaseAnswer(err, want) {
		w.fail("%s of lease %d by session %d answered %v; its tombstone %+v (now %d) says %v",
			what, id, sid, err, w.m.tombs[id], w.clock.Now().UnixNano(), want)
	}
}

// reap runs Reap and checks each adaptive limit's move against the model's
// controller.
func (w *world) reap() {
	from := len(w.rec.events)
	want := w.m.DecideAdaptive(w.clock.Now().UnixNano())
	s, n := w.e.Reap()
	w.reaped = true
	w.checkOverridesDue(w.clock.Now().UnixNano())
	w.logf("reap: %d sessions, %d nodes", s, n)
	var got []string
	for _, ev := range w.rec.events[from:] {
		if ev.Kind == EvLimitAdjusted {
			got = append(got, fmt.Sprintf("%s=%d", ev.Resource, ev.Amount))
		}
		if ev.Kind == EvCapsReverted {
			w.checkRecalledUnder(fmt.Sprintf("the revert of event %d", ev.Seq), ev.Node)
		}
	}
	var wanted []string
	for _, ev := range want {
		wanted = append(wanted, fmt.Sprintf("%s=%d", ev.Resource, ev.Amount))
	}
	if !slices.Equal(got, wanted) {
		w.fail("AIMD: Reap set adaptive limits %v; from the samples and the controller's settings they should be %v", got, wanted)
	}
}

// adaptiveLimits is each adaptive class's root limit as the model holds
// it, taken before an operation that may cut one.
func (w *world) adaptiveLimits() map[string]int64 {
	out := map[string]int64{}
	for class := range w.m.aimd {
		out[class], _ = w.m.current(class)
	}
	return out
}

// checkCutAtOnce compares the limit cuts an operation's samples made at
// once (the events since before) with the model's: a cut as soon as the
// window calls for one, and none otherwise.
func (w *world) checkCutAtOnce(what, class string, current, now int64, before uint64) {
	var got, wanted []string
	for _, ev := range w.rec.events[before:] {
		if ev.Kind == EvLimitAdjusted {
			got = append(got, fmt.Sprintf("%s=%d", ev.Resource, ev.Amount))
		}
	}
	for _, ev := range w.m.CutAtOnce(class, current, now) {
		wanted = append(wanted, fmt.Sprintf("%s=%d", ev.Resource, ev.Amount))
	}
	if !slices.Equal(got, wanted) {
		w.fail("AIMD: %s set adaptive limits %v; from the samples and the controller's settings it should be %v", what, got, wanted)
	}
}

// advance moves the clock by d, or, one time in four, exactly onto (or
// one nanosecond short of) an instant the spec draws a line at: a
// session's expiry, a deadline, a tombstone's end, a retention's end.
func (w *world) advance(d time.Duration) {
	now := w.clock.Now().UnixNano()
	var targets []int64
	var tombAt map[int64]LeaseID
	if w.rng.Intn(4) == 0 {
		horizon := now + int64(sessionTTL)
		in := func(at int64) bool { return at > now && at <= horizon }
		for _, sid := range sortedKeys(w.expires) {
			if _, open := w.m.scope[sid]; open && in(w.expires[sid]) {
				targets = append(targets, w.expires[sid])
			}
		}
		for _, id := range sortedKeys(w.m.deadline) {
			if at := w.m.deadline[id]; at != 0 && in(at) && w.m.state[id] == Open {
				targets = append(targets, at)
			}
		}
		tombAt = map[int64]LeaseID{}
		for _, id := range sortedKeys(w.m.tombs) {
			if at := w.m.tombs[id].at + int64(specTombstoneTTL); in(at) {
				targets = append(targets, at)
				tombAt[at] = id
			}
		}
		for _, id := range sortedKeys(w.m.endedAt) {
			if at := w.m.endedAt[id] + int64(w.m.retention); in(at) {
				targets = append(targets, at)
			}
		}
		for _, at := range w.m.windowEnds() { // the clock crosses periods' boundaries
			if in(at) {
				targets = append(targets, at)
			}
		}
	}
	exact := false
	if len(targets) > 0 {
		d = time.Duration(targets[w.rng.Intn(len(targets))] - now)
		if w.rng.Intn(3) == 0 {
			d-- // the last instant before
		} else {
			exact = true
		}
	}
	w.clock.Advance(d)
	w.logf("advance %v (exact: %v)", d, exact)
	if !exact {
		return
	}
	at := now + int64(d)
	// A session whose TTL ends now has expired: the spec's "past its TTL"
	// is the instant itself, as for deadlines and tombstones.
	for _, sid := range sortedKeys(w.expires) {
		if _, open := w.m.scope[sid]; open && w.expires[sid] == at {
			before := w.e.Seq()
			_, err := w.e.Heartbeat(sid)
			w.logf("heartbeat s%d at its expiry -> %v", sid, err)
			if !errors.Is(err, ErrSessionExpired) {
				w.fail("session %d heartbeated at the instant its TTL ended: %v, want ErrSessionExpired", sid, err)
			}
			if w.e.Seq() == before {
				w.fail("session %d expired at a heartbeat but no event ended it", sid)
			}
			w.forgetSession(sid)
		}
	}
	// A tombstone whose minute ends now is gone.
	if id, ok := tombAt[at]; ok {
		t := w.m.tombs[id]
		if _, open := w.m.scope[t.session]; open {
			_, err := w.e.Validate(t.session, id)
			w.logf("validate s%d l%d at its tombstone's end -> %v", t.session, id, err)
			w.checkLeaseAnswer("validate at the tombstone's end", t.session, id, err, false)
		}
	}
}

// pastBound recounts whether granting a queued acquire now would give its
// tenant more distinct resource names or lease classes than its bounds
// allow: the names are those its node holds an entry for.
func (w *world) pastBound(mw *mWaiter) bool {
	t := w.e.nodes[w.m.tenantOf(mw.node)]
	if t == nil || t.parent == nil {
		return false
	}
	b := w.cfg.Bounds
	if tb, ok := w.cfg.TenantBounds[t.name]; ok {
		b = tb
	}
	if _, known := t.limit[mw.class]; !known && b.Classes > 0 && len(t.limit)+1 > b.Classes {
		return true
	}
	fresh := 0
	for r := range mw.charges {
		if _, known := t.quota[r]; !known {
			fresh++
		}
	}
	return fresh > 0 && b.Resources > 0 && len(t.quota)+fresh > b.Resources
}

// forgotten drops a remembered request the model says its session no
// longer remembers (it ended, or 1,024 later ids pushed it out): a retry
// of it is decided afresh.
func (w *world) forgotten(r doneRequest) bool {
	if w.m.Remembers(r.sid, r.id) {
		return false
	}
	w.requests = slices.DeleteFunc(w.requests, func(o doneRequest) bool { return o.sid == r.sid && o.id == r.id })
	return true
}

// burst runs one session past its request memory: 1,024 and a few more
// edits, each with its own request id. The oldest must be forgotten (a
// retry is decided afresh and emits), the newest remembered (a retry emits
// nothing), and the memory must hold exactly the last 1,024.
func (w *world) burst() {
	e := w.e
	var tenant NodeID
	for _, id := range w.tenants {
		if n := e.nodes[id]; n != nil && n.state == Open {
			tenant = id
			break
		}
	}
	if tenant == 0 {
		return
	}
	w.openSession(RootID)
	sid := w.sessions[len(w.sessions)-1]
	if w.scope[sid] != RootID {
		return
	}
	extra := 1 + w.rng.Intn(16)
	weight := e.nodes[tenant].weight
	edit := func(i int) error {
		wt := weight
		_, err := e.SetCaps(sid, tenant, CapsEdit{Weight: &wt}, fmt.Sprintf("burst-%d", i))
		return err
	}
	for i := range specRequestMemory + extra {
		if err := edit(i); err != nil {
			w.fail("burst edit %d by session %d: %v", i, sid, err)
		}
	}
	w.logf("burst: session %d made %d requests", sid, specRequestMemory+extra)
	if got := len(e.sessions[sid].requests.order); got != specRequestMemory {
		w.fail("session %d remembers %d request ids after %d; it should remember the last 1024", sid, got, specRequestMemory+extra)
	}
	before := e.Seq()
	if err := edit(specRequestMemory + extra - 1); err != nil || e.Seq() != before {
		w.fail("a retry of the newest request of session %d: %v, events %d..%d; it is remembered", sid, err, before+1, e.Seq())
	}
	if err := edit(extra - 1); err != nil || e.Seq() == before {
		w.fail("a retry of request %d of session %d, pushed out of its memory, was answered from memory (%v)", extra-1, sid, err)
	}
}

// checkDecisions compares the model's decisions with the engine's after a
// step: no dispatch the model follows is left unfinished, the fair queues
// (turn, deficits, waiters in order) agree, and so does each session's
// request memory.
func (w *world) checkDecisions() {
	e, m := w.e, w.m
	if d := m.disp; d != nil && d.expect != nil {
		w.fail("I5 the model's fair queue expects %s for %s on node %d of session %d, and the engine did not do it",
			d.kind, d.expect.class, d.expect.node, d.expect.session)
	}
	for _, class := range sortedQueueNames(e) {
		q, mq := e.queues[class], m.queues[class]
		if mq == nil {
			if q.waiting > 0 {
				w.fail("I6 DRR: the engine queues %d acquires of %s, the model none", q.waiting, class)
			}
			continue
		}
		desc := func(tenant NodeID, deficit int64, waiters []string) string {
			return fmt.Sprintf("tenant %d deficit %d waiters %v", tenant, deficit, waiters)
		}
		var got, want []string
		for _, tq := range q.ring {
			var ws []string
			for _, wt := range tq.waiters {
				ws = append(ws, fmt.Sprintf("s%d/n%d/%p", wt.session.id, wt.node.id, wt))
			}
			got = append(got, desc(tq.tenant.id, tq.deficit, ws))
		}
		for _, tq := range mq.ring {
			var ws []string
			for _, mw := range tq.waiters {
				ws = append(ws, fmt.Sprintf("s%d/n%d/%p", mw.session, mw.node, mw.wait.w))
			}
			want = append(want, desc(tq.tenant, tq.deficit, ws))
		}
		if !slices.Equal(got, want) || (len(q.ring) > 0 && q.cursor != mq.cursor) {
			w.fail("I6 DRR: the fair queue of %s differs from the model's:\n  engine (turn %d): %s\n  model  (turn %d): %s",
				class, q.cursor, strings.Join(got, "; "), mq.cursor, strings.Join(want, "; "))
		}
	}
	for _, sid := range sortedKeys(m.touched) {
		var got []string
		if s := e.sessions[sid]; s != nil {
			got = s.requests.order
		}
		if want := m.requests[sid]; !slices.Equal(got, want) {
			w.fail("session %d remembers %d request ids (%s); the model says %d (%s)", sid, len(got), ends(got), len(want), ends(want))
		}
	}
	clear(m.touched)
}

func ends(ids []string) string {
	if len(ids) <= 4 {
		return strings.Join(ids, " ")
	}
	return strings.Join(ids[:2], " ") + " ... " + strings.Join(ids[len(ids)-2:], " ")
}

func sortedQueueNames(e *Engine) []string { return e.sortedQueues() }

// quiesce withdraws every queued acquire, so that the live engine holds
// nothing a replay cannot have (waiters are not state) before the two are
// compared by behaviour.
func (w *world) quiesce() {
	for len(w.waits) > 0 {
		p := w.waits[0]
		w.waits = w.waits[1:]
		w.m.Cancel(p.wait)
		w.e.CancelWait(p.wait)
	}
	w.respond()
	w.check()
}

// behaviour asks e, through its API, about every node and lease id ever
// issued: Get of each node, and Validate and a second Release of each
// lease (Release only of leases no longer live, so that asking changes
// nothing), by every open session and the system session.
func behaviour(e *Engine) []string {
	e.mu.Lock()
	nextNode, nextLease := e.nextNode, e.nextLease
	sids := append([]SessionID{System}, sortedKeys(e.sessions)...)
	e.mu.Unlock()
	var out []string
	for id := NodeID(0); id <= nextNode; id++ {
		v, err := e.Get(System, id)
		out = append(out, fmt.Sprintf("get n%d: %+v %v", id, v, err))
	}
	for _, sid := range sids {
		for id := LeaseID(0); id <= nextLease; id++ {
			g, err := e.Validate(sid, id)
			out = append(out, fmt.Sprintf("validate s%d l%d: %+v %v", sid, id, g, err))
			e.mu.Lock()
			live := e.leases[id] != nil
			e.mu.Unlock()
			if !live && sid != System {
				err := e.Release(sid, id, 0, false, "")
				out = append(out, fmt.Sprintf("release s%d l%d: %v", sid, id, err))
			}
		}
	}
	return out
}

// firstDiff names the first line two lists differ at.
func firstDiff(a, b []string) string {
	for i := range max(len(a), len(b)) {
		var x, y string
		if i < len(a) {
			x = a[i]
		}
		if i < len(b) {
			y = b[i]
		}
		if x != y {
			return fmt.Sprintf("line %d:\n  live:   %s\n  replay: %s", i, x, y)
		}
	}
	return ""
}

// dumpTables writes out the engine's persistent tables straight from its
// structures, not through Snapshot(): every field of every node, session,
// lease, tombstone still within its minute, block and reservation. What
// is not state (heartbeat times, waiters, the fair queue, adaptive
// samples, the queues of ended nodes and deadlines Reap walks) is left out.
func dumpTables(e *Engine) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.now()
	out := []string{fmt.Sprintf("seq %d, next node %d, session %d, lease %d", e.seq, e.nextNode, e.nextSession, e.nextLease)}
	for _, id := range sortedKeys(e.nodes) {
		out = append(out, "node "+dumpValue(reflect.ValueOf(*e.nodes[id])))
	}
	for _, id := range sortedKeys(e.sessions) {
		out = append(out, "session "+dumpValue(reflect.ValueOf(*e.sessions[id])))
	}
	out = append(out, "system "+dumpValue(reflect.ValueOf(*e.system)))
	for _, id := range sortedKeys(e.leases) {
		out = append(out, "lease "+dumpValue(reflect.ValueOf(*e.leases[id])))
	}
	for _, id := range sortedKeys(e.tombs) {
		if t, ok := e.tombstone(id, now); ok {
			out = append(out, fmt.Sprintf("tombstone %d %s", id, dumpValue(reflect.ValueOf(t))))
		}
	}
	out = append(out, "blocks "+dumpValue(reflect.ValueOf(e.blocks)), "by token "+dumpValue(reflect.ValueOf(e.byToken)))
	for _, r := range slices.Sorted(mapKeys(e.reserved)) {
		var rs []string
		for res := range e.reserved[r] {
			rs = append(rs, dumpValue(reflect.ValueOf(*res)))
		}
		slices.Sort(rs)
		out = append(out, fmt.Sprintf("reserved %s %v", r, rs))
	}
	return out
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// notState are fields the dump leaves out, by type and field.
var notState = map[string]bool{
	"session.expires": true, "session.waiters": true,
}

func dumpValue(v reflect.Value) string {
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			return "nil"
		}
		switch x := v.Elem(); x.Type() {
		case reflect.TypeFor[node]():
			return fmt.Sprintf("n%d", x.FieldByName("id").Int())
		case reflect.TypeFor[session]():
			return fmt.Sprintf("s%d", x.FieldByName("id").Int())
		case reflect.TypeFor[lease]():
			return fmt.Sprintf("l%d", x.FieldByName("id").Int())
		default:
			return "&" + dumpValue(x)
		}
	case reflect.Struct:
		var fs []string
		for i := range v.NumField() {
			f := v.Type().Field(i)
			if notState[v.Type().Name()+"."+f.Name] {
				continue
			}
			fs = append(fs, f.Name+":"+dumpValue(v.Field(i)))
		}
		return "{" + strings.Join(fs, " ") + "}"
	case reflect.Map:
		var kv []string
		for it := v.MapRange(); it.Next(); {
			if x := it.Value(); x.Kind() == reflect.Map && x.Len() == 0 {
				continue // an empty index (blocks of a class none holds)
			}
			kv = append(kv, dumpValue(it.Key())+"="+dumpValue(it.Value()))
		}
		slices.Sort(kv)
		return "map[" + strings.Join(kv, " ") + "]"
	case reflect.Slice:
		var xs []string
		for i := range v.Len() {
			xs = append(xs, dumpValue(v.Index(i)))
		}
		return "[" + strings.Join(xs, " ") + "]"
	case reflect.Chan, reflect.Func, reflect.Interface:
		return ""
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return fmt.Sprint(v.Int())
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return fmt.Sprint(v.Uint())
	case reflect.Bool:
		return fmt.Sprint(v.Bool())
	case reflect.String:
		return fmt.Sprintf("%q", v.String())
	case reflect.Float32, reflect.Float64:
		return fmt.Sprint(v.Float())
	}
	return "?" + v.Kind().String()
}
