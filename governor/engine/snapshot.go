package engine

import (
	"cmp"
	"container/heap"
	"fmt"
	"maps"
	"slices"
	"time"
)

// Snapshot is the whole persistent state in a canonical form: every list is
// sorted by id and empty maps are nil, so two equal states give equal
// snapshots. Waiters, heartbeat times and adaptive samples are not state:
// a restart fails waiters, gives every session one fresh TTL and starts the
// sample windows empty.
type Snapshot struct {
	Seq         uint64
	NextNode    NodeID
	NextSession SessionID
	NextLease   LeaseID
	Nodes       []NodeView
	Sessions    []SessionSnapshot
	Leases      []LeaseSnapshot
	Tombstones  []TombstoneSnapshot
	// Audit holds the nodes' audit trails of cap edits and their pending
	// temporary overrides (override.go).
	Audit []NodeAudit `json:",omitempty"`
}

// SessionSnapshot is a session as recorded.
type SessionSnapshot struct {
	ID           SessionID
	Scope        NodeID
	Token        string
	TTL          time.Duration
	Requests     []RequestSnapshot     // oldest first
	Reservations []ReservationSnapshot `json:",omitempty"` // by node, then resource
	Slices       []SliceSnapshot       `json:",omitempty"` // by id (slice.go)
}

// ReservationSnapshot is a session's unspent reservation.
type ReservationSnapshot struct {
	Node     NodeID
	Resource string
	Amount   int64
}

// RequestSnapshot is one remembered request id.
type RequestSnapshot struct {
	ID          string
	Fingerprint uint64
	Node        NodeID  `json:",omitempty"`
	Lease       LeaseID `json:",omitempty"`
	Amount      int64   `json:",omitempty"`
	// ChargedAt is when a request without a lease charged (0 for one
	// that took a lease, or written by an older governord).
	ChargedAt int64 `json:",omitempty"`
}

// LeaseSnapshot is a live lease.
type LeaseSnapshot struct {
	ID      LeaseID
	Session SessionID
	Node    NodeID
	Class   string
	Granted int64
	// Block and Count: a block of Count slots (block.go). A lease holds one.
	Block bool  `json:",omitempty"`
	Count int64 `json:",omitempty"`
	// Charges are what the lease's grant charged, all a give-back may
	// refund (giveback.go). A snapshot written before they were kept has
	// none, and its leases' charges are never refunded.
	Charges []Charge `json:",omitempty"`
}

// TombstoneSnapshot is an ended lease still remembered.
type TombstoneSnapshot struct {
	Lease   LeaseID
	Session SessionID
	Node    NodeID
	Class   string
	Reason  EndReason
	At      int64
}

// withIdle adds to counts, as zeros, the names gs holds an entry for with
// no cap and nothing in use: a class whose leases have all ended, say.
// Tenants' bounds count every name a node holds an entry for, so a
// restore must bring those entries back, or a restarted engine would let a
// tenant use names the live one refused.
func withIdle(gs gauges, counts map[string]int64) map[string]int64 {
	for k, g := range gs {
		if !g.capped && g.n == 0 && g.r == 0 {
			if counts == nil {
				counts = make(map[string]int64)
			}
			counts[k] = 0
		}
	}
	return counts
}

func nilIfEmpty(m map[string]int64) map[string]int64 {
	if len(m) == 0 {
		return nil
	}
	return m
}

// Snapshot captures the whole state.
func (e *Engine) Snapshot() Snapshot { return e.SnapshotPausing(nil) }

// SnapshotPauseEvery is how many nodes, sessions, leases and tombstones
// SnapshotPausing captures between two pauses: well under a millisecond
// of work.
const SnapshotPauseEvery = 256

// SnapshotPausing is Snapshot, calling pause (if not nil) after every
// SnapshotPauseEvery items it captures, with the engine's lock held. It is
// for a caller that is the engine's only user, such as a copy kept to
// take snapshots from, whose pause lets other goroutines run: a large
// state takes long to capture, and on one core everything else would
// wait meanwhile. pause must not call the engine.
func (e *Engine) SnapshotPausing(pause func()) Snapshot {
	e.mu.Lock()
	defer e.mu.Unlock()
	captured := 0
	step := func() {
		if captured++; pause != nil && captured%SnapshotPauseEvery == 0 {
			pause()
		}
	}
	now := e.now()
	snap := Snapshot{Seq: e.seq, NextNode: e.nextNode, NextSession: e.nextSession, NextLease: e.nextLease}
	for _, id := range sortedKeys(e.nodes) {
		step()
		v := e.nodes[id].view()
		// Gauges give nil maps when empty already; defaults are cloned maps.
		v.DefaultQuotas, v.DefaultLimits = nilIfEmpty(v.DefaultQuotas), nilIfEmpty(v.DefaultLimits)
		v.Reserved = nilIfEmpty(v.Reserved)
		v.Used, v.Held = withIdle(e.nodes[id].quota, v.Used), withIdle(e.nodes[id].limit, v.Held)
		snap.Nodes = append(snap.Nodes, v)
		if na, ok := e.nodes[id].auditSnapshot(); ok {
			snap.Audit = append(snap.Audit, na)
		}
	}
	for _, s := range e.sortedSessions() {
		step()
		ss := SessionSnapshot{ID: s.id, Scope: s.scope.id, Token: s.token, TTL: s.ttl}
		for _, id := range s.requests.ids() {
			r := s.requests.byID[id]
			ss.Requests = append(ss.Requests, RequestSnapshot{ID: id, Fingerprint: r.fingerprint, Node: r.node, Lease: r.lease, Amount: r.amount,
				ChargedAt: r.chargedAt})
		}
		for _, res := range s.sortedReservations() {
			ss.Reservations = append(ss.Reservations, ReservationSnapshot{Node: res.node.id, Resource: res.resource, Amount: res.amount})
		}
		ss.Slices = s.sliceSnapshots()
		snap.Sessions = append(snap.Sessions, ss)
	}
	for _, id := range sortedKeys(e.leases) {
		step()
		l := e.leases[id]
		ls := LeaseSnapshot{ID: l.id, Session: l.session.id, Node: l.node.id, Class: l.class, Granted: l.granted,
			Charges: slices.Clone(l.charges)}
		if l.block {
			ls.Block, ls.Count = true, l.count
		}
		snap.Leases = append(snap.Leases, ls)
	}
	for _, id := range sortedKeys(e.tombs) {
		step()
		if t, ok := e.tombstone(id, now); ok {
			snap.Tombstones = append(snap.Tombstones, TombstoneSnapshot{Lease: id, Session: t.session, Node: t.node,
				Class: t.class, Reason: t.reason, At: t.at})
		}
	}
	return snap
}

// Restore replaces the engine's state with snap. The engine must be new:
// restoring over a used engine is an error. The snapshot is checked whole
// before anything is installed, so a corrupt one leaves the engine as it
// was. Every session gets one fresh TTL from the clock.
func (e *Engine) Restore(snap Snapshot) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.seq != 0 || len(e.nodes) != 1 || len(e.sessions) != 0 {
		return fmt.Errorf("%w: restore into an engine that already has state", ErrCorrupt)
	}
	if len(snap.Nodes) == 0 || snap.Nodes[0].ID != RootID || snap.Nodes[0].Parent != 0 {
		return fmt.Errorf("%w: snapshot has no root", ErrCorrupt)
	}
	if snap.NextNode <= RootID || snap.NextSession < 1 || snap.NextLease < 1 {
		return fmt.Errorf("%w: snapshot counters node %d, session %d, lease %d", ErrCorrupt,
			snap.NextNode, snap.NextSession, snap.NextLease)
	}
	now := e.now()
	nodes, deadlines, err := e.restoreNodes(snap)
	if err != nil {
		return err
	}
	sessions, byToken, reserved, err := restoreSessions(snap, nodes, now)
	if err != nil {
		return err
	}
	leases, blocks, err := restoreLeases(snap, sessions, nodes)
	if err != nil {
		return err
	}
	sliced, err := restoreSlices(snap, sessions, nodes)
	if err != nil {
		return err
	}
	tombs := make(map[LeaseID]tombstone, len(snap.Tombstones))
	for _, t := range snap.Tombstones {
		if t.Lease < 1 || t.Lease >= snap.NextLease || leases[t.Lease] != nil {
			return fmt.Errorf("%w: snapshot tombstone of lease %d", ErrCorrupt, t.Lease)
		}
		tombs[t.Lease] = tombstone{session: t.Session, node: t.Node, class: t.Class, reason: t.Reason, at: t.At}
	}
	overridden, err := restoreAudit(nodes, snap.Audit)
	if err != nil {
		return err
	}
	heap.Init(&deadlines)
	e.restoreEnded(nodes, now)
	e.overridden = overridden
	e.nodes, e.root, e.sessions, e.byToken, e.leases, e.tombs, e.deadlines = nodes, nodes[RootID], sessions, byToken, leases, tombs, deadlines
	e.soonest = 0 // the next Reap works it out anew
	e.blocks, e.reserved, e.slices = blocks, reserved, sliced
	e.tombOrder = slices.SortedFunc(maps.Keys(tombs), func(a, b LeaseID) int {
		return cmp.Or(cmp.Compare(tombs[a].at, tombs[b].at), cmp.Compare(a, b))
	})
	e.system.scope = e.root
	e.startAdaptive()
	e.seq, e.nextNode, e.nextSession, e.nextLease = snap.Seq, snap.NextNode, snap.NextSession, snap.NextLease
	return nil
}

// restoreNodes builds the snapshot's tree, each node after its parent, and
// the deadlines of its open nodes.
func (e *Engine) restoreNodes(snap Snapshot) (map[NodeID]*node, deadlineHeap, error) {
	nodes := make(map[NodeID]*node, len(snap.Nodes))
	var deadlines deadlineHeap
	for i, v := range snap.Nodes {
		var parent *node
		if i > 0 {
			parent = nodes[v.Parent]
			if parent == nil || v.ID <= snap.Nodes[i-1].ID || v.ID >= snap.NextNode {
				return nil, nil, fmt.Errorf("%w: snapshot node %d (parent %d) out of order", ErrCorrupt, v.ID, v.Parent)
			}
			if parent.depth+1 >= MaxDepth {
				return nil, nil, fmt.Errorf("%w: snapshot node %d is deeper than %d", ErrCorrupt, v.ID, MaxDepth)
			}
		}
		n, err := e.restoreNode(v, parent)
		if err != nil {
			return nil, nil, err
		}
		nodes[n.id] = n
		if parent != nil {
			if n.state == Open && parent.open[n.name] != nil {
				return nil, nil, fmt.Errorf("%w: snapshot has two open nodes named %q under %d", ErrCorrupt, n.name, parent.id)
			}
			parent.adopt(n)
		}
		if n.deadline != 0 && n.state == Open {
			deadlines = append(deadlines, deadlineEntry{at: n.deadline, node: n.id})
		}
	}
	return nodes, deadlines, nil
}

// restoreNode is one node of a snapshot, checked, under parent (nil for
// the root); its parent does not adopt it yet.
func (e *Engine) restoreNode(v NodeView, parent *node) (*node, error) {
	n := newNode(v.ID, parent, v.Name)
	n.state, n.deadline, n.weight, n.priority = v.State, v.Deadline, v.Weight, v.Priority
	n.quota.setCaps(v.Quotas)
	n.limit.setCaps(v.Limits)
	if err := restoreModes(n, v); err != nil {
		return nil, err
	}
	if v.TenantState > Closing || (v.TenantState != Active && v.Parent != RootID) {
		return nil, fmt.Errorf("%w: snapshot node %d has tenant state %v", ErrCorrupt, v.ID, v.TenantState)
	}
	n.tstate, n.tstateWhy = v.TenantState, v.TenantStateReason
	n.mins = maps.Clone(v.Minimums)
	for k, v := range v.Shadow {
		if v <= 0 {
			return nil, fmt.Errorf("%w: snapshot node %d has a shadow ledger of %d %s", ErrCorrupt, n.id, v, k)
		}
	}
	n.shadow = maps.Clone(v.Shadow)
	if err := n.restoreRates(v.Rates); err != nil {
		return nil, err
	}
	if err := validRates("default rate", v.DefaultRates); err != nil {
		return nil, fmt.Errorf("%w: snapshot node %d: %v", ErrCorrupt, n.id, err)
	}
	n.defRates = maps.Clone(v.DefaultRates)
	for k, u := range v.Used {
		n.quota.add(k, u, false) // as saved
	}
	for k, r := range v.Reserved {
		n.quota.at(k).r = r
	}
	for k, h := range v.Held {
		n.limit.add(k, h, false)
	}
	n.defQuotas, n.defLimits = maps.Clone(v.DefaultQuotas), maps.Clone(v.DefaultLimits)
	if err := e.restorePeriods(n, v.Periods); err != nil {
		return nil, err
	}
	if err := validPeriods("default quota period", v.DefaultQuotaPeriods); err != nil {
		return nil, fmt.Errorf("%w: snapshot node %d: %v", ErrCorrupt, n.id, err)
	}
	n.defPeriods = maps.Clone(v.DefaultQuotaPeriods)
	n.endedAt, n.gone, n.created = v.Ended, maps.Clone(v.Reclaimed), v.Created
	if n.state == Open && n.endedAt != 0 {
		return nil, fmt.Errorf("%w: snapshot node %d is %s but ended at %d", ErrCorrupt, v.ID, n.state, n.endedAt)
	}
	return n, nil
}

// restoreSessions builds the snapshot's sessions, each with one fresh TTL
// from now, and their reservations, which must add up to what each node
// counts as reserved.
func restoreSessions(snap Snapshot, nodes map[NodeID]*node, now int64) (map[SessionID]*session, map[string]*session, map[string]map[*reservation]struct{}, error) {
	sessions := make(map[SessionID]*session, len(snap.Sessions))
	byToken := make(map[string]*session, len(snap.Sessions))
	reserved := make(map[string]map[*reservation]struct{})
	reservedSums := make(map[NodeID]map[string]int64)
	for _, ss := range snap.Sessions {
		scope := nodes[ss.Scope]
		if scope == nil || ss.ID < 1 || ss.ID >= snap.NextSession || ss.TTL <= 0 || sessions[ss.ID] != nil {
			return nil, nil, nil, fmt.Errorf("%w: snapshot session %d", ErrCorrupt, ss.ID)
		}
		s := &session{id: ss.ID, scope: scope, token: ss.Token, ttl: ss.TTL, expires: expiry(now, ss.TTL),
			leases: make(map[LeaseID]*lease)}
		for _, r := range ss.Requests {
			s.requests.add(r.ID, requestResult{fingerprint: r.Fingerprint, node: r.Node, lease: r.Lease, amount: r.Amount,
				chargedAt: r.ChargedAt})
		}
		for _, rs := range ss.Reservations {
			n := nodes[rs.Node]
			if n == nil || rs.Amount <= 0 || rs.Resource == "" || s.reservations[resKey{rs.Node, rs.Resource}] != nil {
				return nil, nil, nil, fmt.Errorf("%w: snapshot reservation of %s on node %d by session %d", ErrCorrupt, rs.Resource, rs.Node, ss.ID)
			}
			res := &reservation{session: s, node: n, resource: rs.Resource, amount: rs.Amount}
			n.pins++
			if s.reservations == nil {
				s.reservations = make(map[resKey]*reservation)
			}
			s.reservations[resKey{n.id, res.resource}] = res
			if reserved[res.resource] == nil {
				reserved[res.resource] = make(map[*reservation]struct{})
			}
			reserved[res.resource][res] = struct{}{}
			for a := n; a != nil; a = a.parent {
				if reservedSums[a.id] == nil {
					reservedSums[a.id] = make(map[string]int64)
				}
				reservedSums[a.id][res.resource] += res.amount
			}
		}
		sessions[s.id] = s
		scope.pinSession()
		if s.token != "" {
			if byToken[s.token] != nil {
				return nil, nil, nil, fmt.Errorf("%w: snapshot sessions share a token", ErrCorrupt)
			}
			byToken[s.token] = s
		}
	}
	for id, n := range nodes {
		if !maps.Equal(n.quota.reservedCounts(), nilIfEmpty(reservedSums[id])) {
			return nil, nil, nil, fmt.Errorf("%w: snapshot node %d reserves %v, its reservations %v", ErrCorrupt, id, n.quota.reservedCounts(), reservedSums[id])
		}
	}
	return sessions, byToken, reserved, nil
}

// restoreLeases attaches the snapshot's leases and blocks to their
// sessions and nodes.
func restoreLeases(snap Snapshot, sessions map[SessionID]*session, nodes map[NodeID]*node) (map[LeaseID]*lease, map[string]map[LeaseID]*lease, error) {
	leases := make(map[LeaseID]*lease, len(snap.Leases))
	blocks := make(map[string]map[LeaseID]*lease)
	for _, ls := range snap.Leases {
		s, n := sessions[ls.Session], nodes[ls.Node]
		if s == nil || n == nil || ls.ID < 1 || ls.ID >= snap.NextLease || leases[ls.ID] != nil || ls.Count < 0 ||
			(ls.Block && s.blocks[blockKey{n.id, ls.Class}] != nil) {
			return nil, nil, fmt.Errorf("%w: snapshot lease %d", ErrCorrupt, ls.ID)
		}
		for _, c := range ls.Charges {
			if validName("resource", c.Resource) != nil || c.Amount <= 0 {
				return nil, nil, fmt.Errorf("%w: snapshot lease %d charged %d of %q", ErrCorrupt, ls.ID, c.Amount, c.Resource)
			}
		}
		l := &lease{id: ls.ID, session: s, node: n, class: ls.Class, granted: ls.Granted, count: 1, charges: slices.Clone(ls.Charges)}
		if ls.Block {
			l.block, l.count = true, ls.Count
		}
		attachLease(l, leases, blocks)
	}
	return leases, blocks, nil
}

func (e *Engine) sortedSessions() []*session {
	out := make([]*session, 0, len(e.sessions))
	for _, id := range sortedKeys(e.sessions) {
		out = append(out, e.sessions[id])
	}
	return out
}

func (s *session) sortedReservations() []*reservation {
	out := make([]*reservation, 0, len(s.reservations))
	for _, res := range s.reservations {
		out = append(out, res)
	}
	slices.SortFunc(out, func(a, b *reservation) int {
		return cmp.Or(cmp.Compare(a.node.id, b.node.id), cmp.Compare(a.resource, b.resource))
	})
	return out
}
