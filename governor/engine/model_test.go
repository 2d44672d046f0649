package engine

import (
	"fmt"
	"maps"
	"math"
	"math/big"
	"time"
)

// model is a deliberately simple second implementation of the tree's
// bookkeeping, driven only by the events the engine emits. It checks each
// transition as it arrives (the transition invariants of SPEC.md) and is
// compared with the engine's state after every step.
type model struct {
	parent   map[NodeID]NodeID
	state    map[NodeID]State
	deadline map[NodeID]int64
	quotas   map[NodeID]map[string]int64
	limits   map[NodeID]map[string]int64
	defQ     map[NodeID]map[string]int64
	defL     map[NodeID]map[string]int64
	used     map[NodeID]map[string]int64
	shadow   map[NodeID]map[string]int64 // the shadow ledger (dryrun.go)
	reserved map[NodeID]map[string]int64
	held     map[NodeID]map[string]int64
	// rootClamped names the root's counts ("reserved/tokens") that were
	// ever held to their range (rootCount): from then on they are no longer
	// the sum of their sources.
	rootClamped map[string]bool
	leases      map[LeaseID]modelLease
	// reservations are the sessions' unspent reserved units.
	reservations map[modelRes]int64
	scope        map[SessionID]NodeID
	maxLease     LeaseID
	seq          uint64
	errs         []string
	// endedAt is when each ended node ended; gone is what each node's
	// reclaimed children spent; retention is the engine's.
	endedAt   map[NodeID]int64
	gone      map[NodeID]map[string]int64
	retention time.Duration
	// modes are the caps enforced other than hard (policy.go).
	modes map[NodeID]map[modeKey]CapMode
	// tstate is each tenant's state (tenantstate.go), mins its reserved
	// minimums (minimum.go).
	tstate map[NodeID]TenantState
	mins   map[NodeID]map[string]Minimum
	// overrides are the temporary overrides pending (model_override_test.go).
	overrides map[NodeID]map[modeKey]modelOverride
	// The model's own decisions (model_decide_test.go).
	modelDecide
	// Rates and their buckets (model_rate_test.go).
	modelRates
	// Periods and their windows (model_period_test.go).
	modelPeriods
}

type modelLease struct {
	session SessionID
	node    NodeID
	class   string
	charges []Charge
	block   bool
	count   int64 // slots held: 1 for a lease
	granted int64
}

type modelRes struct {
	session  SessionID
	node     NodeID
	resource string
}

func newModel(retention time.Duration) *model {
	m := &model{parent: map[NodeID]NodeID{}, state: map[NodeID]State{}, deadline: map[NodeID]int64{},
		quotas: map[NodeID]map[string]int64{}, limits: map[NodeID]map[string]int64{},
		defQ: map[NodeID]map[string]int64{}, defL: map[NodeID]map[string]int64{},
		used: map[NodeID]map[string]int64{}, held: map[NodeID]map[string]int64{}, shadow: map[NodeID]map[string]int64{},
		reserved: map[NodeID]map[string]int64{}, reservations: map[modelRes]int64{}, rootClamped: map[string]bool{},
		leases: map[LeaseID]modelLease{}, scope: map[SessionID]NodeID{},
		endedAt: map[NodeID]int64{}, gone: map[NodeID]map[string]int64{}, retention: retention,
		modes: map[NodeID]map[modeKey]CapMode{}, overrides: map[NodeID]map[modeKey]modelOverride{},
		tstate: map[NodeID]TenantState{}, mins: map[NodeID]map[string]Minimum{}}
	m.state[RootID] = Open
	m.decideInit()
	m.initRates()
	m.initPeriods(time.UTC)
	return m
}

func (m *model) failf(format string, args ...any) {
	m.errs = append(m.errs, fmt.Sprintf(format, args...))
}

// chain lists id and its ancestors, leaf first.
func (m *model) chain(id NodeID) []NodeID {
	var out []NodeID
	for id != 0 {
		out = append(out, id)
		id = m.parent[id]
	}
	return out
}

func (m *model) inside(id, scope NodeID) bool {
	for _, a := range m.chain(id) {
		if a == scope {
			return true
		}
	}
	return false
}

func (m *model) subtree(id NodeID) []NodeID {
	out := []NodeID{id}
	for c, p := range m.parent {
		if p == id {
			out = append(out, m.subtree(c)...)
		}
	}
	return out
}

// overlay applies caps to a copy of base; NoCap removes.
func overlay(base, caps map[string]int64) map[string]int64 {
	out := map[string]int64{}
	maps.Copy(out, base)
	for k, v := range caps {
		if v == NoCap {
			delete(out, k)
		} else {
			out[k] = v
		}
	}
	return out
}

func add(m map[NodeID]map[string]int64, id NodeID, key string, v int64) {
	if m[id] == nil {
		m[id] = map[string]int64{}
	}
	m[id][key] += v
	if m[id][key] == 0 {
		delete(m[id], key)
	}
}

// count adds v to what tbl counts of key on id, as add does. The engine's
// counters are int64 and must never leave [0, MaxInt64] (I24): a count
// that would is a failure, whatever the engine's own says; but the root's
// are held to their range instead (rootCount).
func (m *model) count(tbl map[NodeID]map[string]int64, what string, id NodeID, key string, v int64) {
	if id == RootID {
		m.rootCount(tbl, what, key, v)
		return
	}
	if cur := tbl[id][key]; (v > 0 && cur > math.MaxInt64-v) || cur+v < 0 {
		m.failf("I24 counters: event %d takes %s of %s on node %d from %d by %d, out of [0, MaxInt64]", m.seq, what, key, id, cur, v)
	}
	add(tbl, id, key, v)
}

// rootCount is count on the root, whose counters every tenant shares and
// so saturate rather than refuse (I24): each stops at MaxInt64 and at 0,
// and what is reserved at what is used leaves of MaxInt64, which a change
// of what is used lowers it to at once. Worked out in big integers, apart
// from the engine's arithmetic.
func (m *model) rootCount(tbl map[NodeID]map[string]int64, what string, key string, v int64) {
	hi := big.NewInt(math.MaxInt64)
	if what == "reserved" {
		hi.Sub(hi, big.NewInt(m.used[RootID][key]))
	}
	sum := new(big.Int).Add(big.NewInt(tbl[RootID][key]), big.NewInt(v))
	if sum.Sign() < 0 {
		sum.SetInt64(0)
		m.rootClamped[what+"/"+key] = true
	}
	if sum.Cmp(hi) > 0 {
		sum.Set(hi)
		m.rootClamped[what+"/"+key] = true
	}
	add(tbl, RootID, key, sum.Int64()-tbl[RootID][key])
	if what == "used" {
		m.rootCount(m.reserved, "reserved", key, 0)
	}
}

// Emit audits one event and applies it to the model, then follows what
// the engine decides after it (model_decide_test.go).
func (m *model) Emit(ev Event) {
	wasExpected := m.expected(ev)
	l := m.leases[ev.Lease]
	m.checkWarnings(ev)
	m.checkTenantState(ev)
	m.rateEvent(ev)
	before := m.chainUsage(ev)
	m.periodEvent(ev)
	m.applyEvent(ev)
	m.checkCapsPassed(ev, before)
	m.decideEvent(ev, l)
	if wasExpected {
		m.afterExpected(ev)
	}
}

func (m *model) applyEvent(ev Event) {
	if ev.Seq != m.seq+1 {
		m.failf("event seq %d follows %d", ev.Seq, m.seq)
	}
	m.seq = ev.Seq
	// Scope: a session's events touch only its own subtree.
	if scope, ok := m.scope[ev.Session]; ok && ev.Node != 0 && ev.Kind != EvSessionOpened {
		target := ev.Node
		if ev.Kind == EvNodeCreated {
			target = ev.Parent
		}
		if !m.inside(target, scope) {
			m.failf("I9 scope: event %d (%s) by session %d touches node %d outside its scope %d", ev.Seq, ev.Kind, ev.Session, target, scope)
		}
		if (ev.Kind == EvCapsSet || ev.Kind == EvNodeEnded) && ev.Node == scope {
			m.failf("I9 scope: event %d (%s) by session %d edits its own scope node %d", ev.Seq, ev.Kind, ev.Session, scope)
		}
	}
	switch ev.Kind {
	case EvSessionOpened:
		m.scope[ev.Session] = ev.Node
	case EvSessionEnded:
		reason := EndReleased
		if ev.Reason == EndExpired {
			reason = EndExpired
		}
		for id, l := range m.leases {
			if l.session == ev.Session {
				m.endLease(id, reason, ev.At)
			}
		}
		// Whatever it still had reserved may have been spent: it counts.
		for k, amount := range m.reservations {
			if k.session == ev.Session {
				for _, a := range m.chain(k.node) {
					m.count(m.used, "used", a, k.resource, amount)
					m.count(m.reserved, "reserved", a, k.resource, -amount)
				}
				delete(m.reservations, k)
			}
		}
		delete(m.scope, ev.Session)
	case EvNodeCreated:
		p, sp := ev.Parent, ev.Spec
		m.checkOpen(ev, p)
		m.parent[ev.Node] = p
		m.state[ev.Node] = Open
		m.deadline[ev.Node] = sp.Deadline
		m.quotas[ev.Node] = overlay(m.defQ[p], sp.Quotas)
		m.limits[ev.Node] = overlay(m.defL[p], sp.Limits)
		m.defQ[ev.Node], m.defL[ev.Node] = overlay(m.defQ[p], nil), overlay(m.defL[p], nil)
		if sp.DefaultQuotas != nil {
			m.defQ[ev.Node] = overlay(nil, sp.DefaultQuotas)
		}
		if sp.DefaultLimits != nil {
			m.defL[ev.Node] = overlay(nil, sp.DefaultLimits)
		}
	case EvNodeEnded:
		for _, id := range m.subtree(ev.Node) {
			if m.state[id] == Open {
				m.state[id] = ev.State
				m.endedAt[id] = ev.At
			}
			for lid, l := range m.leases {
				if l.node == id {
					m.endLease(lid, EndRevoked, ev.At)
				}
			}
		}
	case EvCapsSet:
		c := ev.Caps
		m.capsSet(ev)
		m.quotas[ev.Node] = overlay(m.quotas[ev.Node], c.Quotas)
		m.limits[ev.Node] = overlay(m.limits[ev.Node], c.Limits)
		m.defQ[ev.Node] = overlay(m.defQ[ev.Node], c.DefaultQuotas)
		m.defL[ev.Node] = overlay(m.defL[ev.Node], c.DefaultLimits)
		if c.Deadline != nil {
			m.deadline[ev.Node] = *c.Deadline
		}
		m.setModes(ev.Node, c)
		m.setMinimums(ev.Node, c.Minimums)
	case EvCapsReverted:
		m.capsReverted(ev)
	case EvConsumed:
		m.checkOpen(ev, ev.Node)
		m.charge(ev, ev.Node, ev.Resource, ev.Amount)
	case EvCharged:
		if ev.GivenBack {
			m.chargeGivenBack(ev)
			break
		}
		m.checkOpen(ev, ev.Node)
		for _, c := range ev.Charges {
			m.charge(ev, ev.Node, c.Resource, c.Amount)
		}
		if ev.RequestID != "" {
			if m.charged[ev.Session] == nil {
				m.charged[ev.Session] = map[string]mCharged{}
			}
			m.charged[ev.Session][ev.RequestID] = mCharged{node: ev.Node, charges: ev.Charges, at: ev.At}
		}
	case EvShadowCharged:
		m.checkOpen(ev, ev.Node)
		for _, c := range ev.Charges {
			m.shadowCharge(ev, ev.Node, c.Resource, c.Amount)
		}
	case EvLeaseGranted:
		m.checkOpen(ev, ev.Node)
		if _, ok := m.scope[ev.Session]; !ok {
			m.failf("event %d grants lease %d to session %d, which is not open", ev.Seq, ev.Lease, ev.Session)
		}
		for _, c := range ev.Charges {
			m.charge(ev, ev.Node, c.Resource, c.Amount)
		}
		if ev.Lease <= m.maxLease {
			m.failf("I4 fencing: lease %d granted after lease %d", ev.Lease, m.maxLease)
		}
		m.maxLease = max(m.maxLease, ev.Lease)
		count := int64(1)
		if ev.Block {
			count = ev.Amount
			for id, l := range m.leases {
				if l.block && l.session == ev.Session && l.node == ev.Node && l.class == ev.Resource {
					m.failf("event %d grants session %d a second block of %s on node %d (it holds lease %d)", ev.Seq, ev.Session, ev.Resource, ev.Node, id)
				}
			}
		}
		m.hold(ev, ev.Node, ev.Resource, count)
		m.leases[ev.Lease] = modelLease{session: ev.Session, node: ev.Node, class: ev.Resource, charges: ev.Charges,
			block: ev.Block, count: count, granted: ev.At}
	case EvBlockResized:
		l, ok := m.leases[ev.Lease]
		switch {
		case !ok || !l.block:
			m.failf("event %d resizes lease %d, which is not a live block", ev.Seq, ev.Lease)
			return
		case l.count+ev.Amount < 0:
			m.failf("event %d shrinks block %d of %d slots by %d", ev.Seq, ev.Lease, l.count, -ev.Amount)
			return
		case ev.Amount > 0:
			m.checkOpen(ev, l.node)
			m.hold(ev, l.node, l.class, ev.Amount)
		default:
			for _, a := range m.chain(l.node) {
				m.count(m.held, "held", a, l.class, ev.Amount)
			}
		}
		l.count += ev.Amount
		m.leases[ev.Lease] = l
	case EvReserved:
		k := modelRes{session: ev.Session, node: ev.Node, resource: ev.Resource}
		have := m.reservations[k]
		settled := ev.Spent + ev.Returned
		if settled > have || ev.Spent < 0 || ev.Returned < 0 || ev.Amount < 0 {
			m.failf("event %d settles %d+%d of a reservation of %d, or reserves %d", ev.Seq, ev.Spent, ev.Returned, have, ev.Amount)
			return
		}
		if ev.Amount > 0 {
			m.checkOpen(ev, ev.Node)
		}
		for _, a := range m.chain(ev.Node) {
			// I1: a new reservation fits under every quota, counting what
			// is reserved; settling moves units from reserved to used.
			if q, ok := m.refusesAt(a, false, ev.Resource); ok && ev.Amount > 0 &&
				m.spent(a, ev.Resource)+m.reserved[a][ev.Resource]-ev.Returned+ev.Amount > q {
				m.failf("I1 quotas: event %d reserves %d of %s on node %d; node %d had %d used and %d reserved of %d, %d returned",
					ev.Seq, ev.Amount, ev.Resource, ev.Node, a, m.used[a][ev.Resource], m.reserved[a][ev.Resource], q, ev.Returned)
			}
			m.count(m.used, "used", a, ev.Resource, ev.Spent)
			m.count(m.reserved, "reserved", a, ev.Resource, ev.Amount-settled)
		}
		m.reservations[k] = have + ev.Amount - settled
		if m.reservations[k] == 0 {
			delete(m.reservations, k)
		}
	case EvLeaseReleased:
		l, ok := m.leases[ev.Lease]
		if !ok {
			m.failf("event %d releases lease %d, which is not held", ev.Seq, ev.Lease)
			return
		}
		if len(ev.Charges) > 0 && !ev.GivenBack {
			m.failf("event %d undoes charges of lease %d, which was not given back at its grant", ev.Seq, ev.Lease)
		}
		if ev.GivenBack && fmt.Sprint(ev.Charges) != fmt.Sprint(l.charges) {
			m.failf("event %d gives back lease %d undoing %v, but its grant charged %v", ev.Seq, ev.Lease, ev.Charges, l.charges)
		}
		for _, c := range ev.Charges {
			for _, a := range m.chain(l.node) {
				m.count(m.used, "used", a, c.Resource, -c.Amount)
			}
		}
		m.endLease(ev.Lease, EndReleased, ev.At)
	case EvLimitAdjusted:
		m.limits[ev.Node] = overlay(m.limits[ev.Node], map[string]int64{ev.Resource: ev.Amount})
	case EvNodesReclaimed:
		for _, id := range ev.Nodes {
			m.reclaim(ev, id)
		}
	case EvTenantStateSet:
		m.applyTenantState(ev)
	}
}

// reclaim checks I15 (a node is reclaimed only once it and its whole
// subtree have been ended for the retention, with nothing pinning them) and
// forgets the subtree, leaving what it spent with the parent.
func (m *model) reclaim(ev Event, root NodeID) {
	if _, ok := m.state[root]; !ok || root == RootID {
		m.failf("event %d reclaims node %d, which the model does not hold (or is the root)", ev.Seq, root)
		return
	}
	for _, id := range m.subtree(root) {
		switch {
		case m.state[id] == Open:
			m.failf("I15 reclaim: event %d reclaims node %d, which is open", ev.Seq, id)
		case ev.At-m.endedAt[id] < int64(m.retention):
			m.failf("I15 reclaim: event %d reclaims node %d %v after its end; the retention is %v",
				ev.Seq, id, time.Duration(ev.At-m.endedAt[id]), m.retention)
		}
		for sid, scope := range m.scope {
			if scope == id {
				m.failf("I15 reclaim: event %d reclaims node %d, the scope of open session %d", ev.Seq, id, sid)
			}
		}
		for k, amount := range m.reservations {
			if k.node == id {
				m.failf("I15 reclaim: event %d reclaims node %d, where session %d reserves %d of %s", ev.Seq, id, k.session, amount, k.resource)
			}
		}
		for sid, sl := range m.slices {
			if sl.node == id {
				m.failf("I15 reclaim: event %d reclaims node %d, where session %d holds slice %d of %s", ev.Seq, id, sl.session, sid, sl.resource)
			}
		}
		for lid, l := range m.leases {
			if l.node == id {
				m.failf("I15 reclaim: event %d reclaims node %d, which holds lease %d", ev.Seq, id, lid)
			}
		}
	}
	p := m.parent[root]
	if p == RootID {
		m.dropTenant(root)
	}
	for r, u := range m.used[root] {
		m.count(m.gone, "reclaimed", p, r, u)
	}
	for _, id := range m.subtree(root) {
		for _, tbl := range []map[NodeID]map[string]int64{m.quotas, m.limits, m.defQ, m.defL, m.used, m.reserved, m.held, m.gone} {
			delete(tbl, id)
		}
		delete(m.parent, id)
		delete(m.modes, id)
		delete(m.tstate, id)
		delete(m.mins, id)
		delete(m.state, id)
		delete(m.deadline, id)
		delete(m.endedAt, id)
	}
}

// checkOpen: nothing is charged or granted on an ended chain or past a deadline.
func (m *model) checkOpen(ev Event, id NodeID) {
	for _, a := range m.chain(id) {
		if m.state[a] != Open {
			m.failf("I8 ended: event %d (%s) on node %d whose ancestor %d is %s", ev.Seq, ev.Kind, id, a, m.state[a])
		}
		if d := m.deadline[a]; d != 0 && ev.At >= d {
			m.failf("I8 deadline: event %d (%s) on node %d at %d, ancestor %d's deadline is %d", ev.Seq, ev.Kind, id, ev.At, a, d)
		}
	}
}

// charge checks I1 (no charge takes a node over a cap, counting what is
// reserved) and applies it.
func (m *model) charge(ev Event, id NodeID, r string, amount int64) {
	for _, a := range m.chain(id) {
		if q, ok := m.refusesAt(a, false, r); ok && amount > q-m.spent(a, r)-m.reserved[a][r] {
			m.failf("I1 quotas: event %d charges %d of %s on node %d; node %d had %d spent and %d reserved of %d",
				ev.Seq, amount, r, id, a, m.spent(a, r), m.reserved[a][r], q)
		}
		m.count(m.used, "used", a, r, amount)
	}
}

// chargeGivenBack checks that ev undoes a charge without a lease that its
// session remembers, exactly (its node, charges and time), and refunds it.
func (m *model) chargeGivenBack(ev Event) {
	c, ok := m.charged[ev.Session][ev.Forget]
	if !ok || !m.Remembers(ev.Session, ev.Forget) || c.node != ev.Node || c.at != ev.ChargedAt || fmt.Sprint(c.charges) != fmt.Sprint(ev.Charges) {
		m.failf("event %d gives back %v on node %d charged at %d for request %q; the session's request made %+v (known %v, remembered %v)",
			ev.Seq, ev.Charges, ev.Node, ev.ChargedAt, ev.Forget, c, ok, m.Remembers(ev.Session, ev.Forget))
		return
	}
	delete(m.charged[ev.Session], ev.Forget)
	for _, ch := range ev.Charges {
		for _, a := range m.chain(ev.Node) {
			m.count(m.used, "used", a, ch.Resource, -ch.Amount)
		}
	}
}

// shadowCharge checks I23 (a shadow charge fits under every quota on its
// chain counting the shadow ledger as spent, as the same charge enforced
// after the shadow charges before it would have) and adds it to the ledger.
func (m *model) shadowCharge(ev Event, id NodeID, r string, amount int64) {
	for _, a := range m.chain(id) {
		if q, ok := m.refusesAt(a, false, r); ok && amount+m.shadow[a][r] > q-m.spent(a, r)-m.reserved[a][r] {
			m.failf("I23 shadow: event %d records %d of %s on node %d; node %d had %d used, %d reserved and %d in its shadow ledger of %d",
				ev.Seq, amount, r, id, a, m.used[a][r], m.reserved[a][r], m.shadow[a][r], q)
		}
		m.count(m.shadow, "shadow ledger", a, r, amount)
	}
}

// hold checks I3 (no grant or block growth takes a node over a limit) and
// takes count slots of class on id's chain.
func (m *model) hold(ev Event, id NodeID, class string, count int64) {
	for _, a := range m.chain(id) {
		if limit, ok := m.refusesAt(a, true, class); ok && count > 0 && count > limit-m.held[a][class] {
			m.failf("I3 limits: event %d (%s) takes %d slots of %s on node %d while node %d holds %d of limit %d",
				ev.Seq, ev.Kind, count, class, id, a, m.held[a][class], limit)
		}
		m.count(m.held, "held", a, class, count)
	}
}

func (m *model) endLease(id LeaseID, reason EndReason, at int64) {
	l := m.leases[id]
	m.tomb(id, l, reason, at)
	for _, a := range m.chain(l.node) {
		m.count(m.held, "held", a, l.class, -l.count)
	}
	delete(m.leases, id)
}
