// Package usage keeps governord's usage records: a compact aggregate of what
// each tenant and task spent, held and was refused, per minute, that the
// server writes in the same transaction as the events it summarises (so it
// outlives the events a snapshot deletes), and reports over any window.
//
// Fold turns events into records. It is a pure function of the events (and
// of the state it was seeded with), so the records are exactly what the
// event log says. Report sums records over a window. The package imports
// only the engine (for its events and snapshots) and the standard library;
// storing records is the store's job.
package usage

import (
	"sync"

	"github.com/governor-project/governor/governor/engine"
)

// Kind says what a record counts.
type Kind string

// The kinds of record and how two records of the same key merge.
const (
	// Spend is the units of a resource charged (Name is the resource);
	// added. A grant given back whole is taken back, so it can be negative
	// within a minute.
	Spend Kind = "spend"
	// Denied counts refusals (Name is the cause: "quota:RESOURCE",
	// "wait-timeout", "bound", "task-ended", ...); added. Refusals are not
	// events: governord counts them as it answers.
	Denied Kind = "denied"
	// Peak is the most slots of a class (Name) held at once in the
	// subtree, after any event of the minute; the larger is kept.
	Peak Kind = "peak"
	// HeldEnd is the slots held at the end of the minute's last change; the
	// later one is kept. It carries the level into minutes without change.
	HeldEnd Kind = "held_end"
	// HeldTail is, over the minute's changes of the slots held, the sum of
	// each change times the nanoseconds from it to the minute's end; added.
	// With the level carried in, it gives the slot-nanoseconds of the
	// minute exactly (Report).
	HeldTail Kind = "held_tail"
)

// Key names one record. Tenant and Task are node ids: Tenant 0 is the root
// itself; Task 0 is the tenant node itself for Spend and Denied, and the
// tenant's whole subtree for Peak, HeldEnd and HeldTail (a task's are its
// whole subtree). Minute is unix seconds / 60.
type Key struct {
	Tenant int64
	Task   int64
	Minute int64
	Kind   Kind
	Name   string
}

// Record is one aggregate, with the names of its tenant and task as they
// were when it was written (ids outlive the nodes they named).
type Record struct {
	Key
	TenantName string
	TaskName   string
	Amount     int64
}

// Merge combines a newer record b of the same key into a, as Kind says.
func Merge(a, b int64, k Kind) int64 {
	switch k {
	case Peak:
		return max(a, b)
	case HeldEnd:
		return b
	}
	return a + b
}

const minuteNanos = int64(60e9)

// MinuteOf is the minute a unix-nanosecond instant falls in.
func MinuteOf(at int64) int64 {
	if at < 0 {
		return (at+1)/minuteNanos - 1
	}
	return at / minuteNanos
}

type nodeInfo struct {
	parent engine.NodeID
	name   string
}

type leaseInfo struct {
	node    engine.NodeID
	session engine.SessionID
	class   string
	count   int64
}

type resKey struct {
	session  engine.SessionID
	node     engine.NodeID
	resource string
}

type heldKey struct {
	node  engine.NodeID // a tenant or a task
	class string
}

// Fold turns events into records. Feed it every event in order, from the
// state it was seeded with; it is safe for concurrent use.
type Fold struct {
	mu        sync.Mutex
	nodes     map[engine.NodeID]nodeInfo
	kids      map[engine.NodeID]map[engine.NodeID]struct{} // children by parent, to forget a reclaimed subtree
	leases    map[engine.LeaseID]*leaseInfo
	bySession map[engine.SessionID]map[engine.LeaseID]struct{}
	reserved  map[resKey]int64
	held      map[heldKey]int64

	pending map[Key]*Record // written with the next batch of events

	// nodesMost is the most nodes held since nodes and kids were built
	// (shrink).
	nodesMost int
}

// shrinkAbove is the fewest nodes a Fold has held for its maps to be worth
// building again once most are forgotten.
const shrinkAbove = 4096

// New returns a Fold of the state snap holds: the engine's snapshot, or
// the state after replay at startup (the records of everything before it
// are already stored).
func New(snap engine.Snapshot) *Fold {
	f := &Fold{nodes: make(map[engine.NodeID]nodeInfo), kids: make(map[engine.NodeID]map[engine.NodeID]struct{}), leases: make(map[engine.LeaseID]*leaseInfo),
		bySession: make(map[engine.SessionID]map[engine.LeaseID]struct{}), reserved: make(map[resKey]int64),
		held: make(map[heldKey]int64), pending: make(map[Key]*Record)}
	for _, n := range snap.Nodes {
		f.nodes[n.ID] = nodeInfo{parent: n.Parent, name: n.Name}
		f.adopt(n.Parent, n.ID)
	}
	f.nodesMost = len(f.nodes)
	for _, n := range snap.Nodes {
		// A tenant's and a task's levels are their subtrees' slots held.
		if tenant, task := f.place(n.ID); n.ID == tenant || n.ID == task {
			for class, h := range n.Held {
				if h != 0 {
					f.held[heldKey{n.ID, class}] = h
				}
			}
		}
	}
	for _, l := range snap.Leases {
		count := int64(1)
		if l.Block {
			count = l.Count
		}
		f.addLease(l.ID, &leaseInfo{node: l.Node, session: l.Session, class: l.Class, count: count})
	}
	for _, s := range snap.Sessions {
		for _, r := range s.Reservations {
			f.reserved[resKey{s.ID, r.Node, r.Resource}] = r.Amount
		}
	}
	return f
}

// place is the tenant and task a node counts under: (0, 0) for the root,
// (tenant, 0) for a tenant, and (tenant, task) for a task and below.
func (f *Fold) place(id engine.NodeID) (tenant, task engine.NodeID) {
	var chain []engine.NodeID
	for n := id; n != 0; n = f.nodes[n].parent {
		chain = append(chain, n)
		if len(chain) > engine.MaxDepth+1 {
			break
		}
	}
	// chain ends at the root: root, tenant, task are its last three.
	switch len(chain) {
	case 0, 1:
		return 0, 0
	case 2:
		return chain[0], 0
	}
	return chain[len(chain)-2], chain[len(chain)-3]
}

func (f *Fold) addLease(id engine.LeaseID, l *leaseInfo) {
	f.leases[id] = l
	if f.bySession[l.session] == nil {
		f.bySession[l.session] = make(map[engine.LeaseID]struct{})
	}
	f.bySession[l.session][id] = struct{}{}
}

func (f *Fold) add(node engine.NodeID, minute int64, kind Kind, name string, amount int64) {
	tenant, task := f.place(node)
	f.put(tenant, task, minute, kind, name, amount)
}

func (f *Fold) put(tenant, task engine.NodeID, minute int64, kind Kind, name string, amount int64) {
	k := Key{Tenant: int64(tenant), Task: int64(task), Minute: minute, Kind: kind, Name: name}
	if r := f.pending[k]; r != nil {
		r.Amount = Merge(r.Amount, amount, kind)
		return
	}
	r := f.record(k, amount)
	f.pending[k] = &r
}

// record is the record of k, with its tenant's and task's names.
func (f *Fold) record(k Key, amount int64) Record {
	return Record{Key: k, TenantName: f.nodes[engine.NodeID(k.Tenant)].name, TaskName: f.nodes[engine.NodeID(k.Task)].name, Amount: amount}
}

// moveHeld changes the slots of class held under node by delta at at: the
// level of its tenant and of its task, each with its peak, end level and
// tail. Leases on the root itself are counted in no tenant.
func (f *Fold) moveHeld(node engine.NodeID, class string, delta int64, at int64) {
	tenant, task := f.place(node)
	if delta == 0 || tenant == 0 {
		return
	}
	minute := MinuteOf(at)
	tail := delta * ((minute+1)*minuteNanos - at)
	owners := []engine.NodeID{0} // the tenant's own subtree
	if task != 0 {
		owners = append(owners, task)
	}
	for _, o := range owners {
		hk := heldKey{tenant, class}
		if o != 0 {
			hk.node = o
		}
		level := f.held[hk] + delta
		if level == 0 {
			delete(f.held, hk)
		} else {
			f.held[hk] = level
		}
		f.put(tenant, o, minute, Peak, class, level)
		f.put(tenant, o, minute, HeldEnd, class, level)
		f.put(tenant, o, minute, HeldTail, class, tail)
	}
}

func (f *Fold) endLease(id engine.LeaseID, at int64) {
	l := f.leases[id]
	if l == nil {
		return
	}
	delete(f.leases, id)
	delete(f.bySession[l.session], id)
	if len(f.bySession[l.session]) == 0 {
		delete(f.bySession, l.session)
	}
	f.moveHeld(l.node, l.class, -l.count, at)
}

// Add folds ev in. Events must come in order, each once.
func (f *Fold) Add(ev engine.Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	minute := MinuteOf(ev.At)
	switch ev.Kind {
	case engine.EvNodeCreated:
		name := ""
		if ev.Spec != nil {
			name = ev.Spec.Name
		}
		f.nodes[ev.Node] = nodeInfo{parent: ev.Parent, name: name}
		f.adopt(ev.Parent, ev.Node)
		f.nodesMost = max(f.nodesMost, len(f.nodes))
	case engine.EvConsumed:
		f.add(ev.Node, minute, Spend, ev.Resource, ev.Amount)
	case engine.EvCharged:
		sign := int64(1)
		if ev.GivenBack { // a charge its caller gave up at the instant of its grant
			sign = -1
		}
		for _, c := range ev.Charges {
			f.add(ev.Node, minute, Spend, c.Resource, sign*c.Amount)
		}
	case engine.EvLeaseGranted:
		for _, c := range ev.Charges {
			f.add(ev.Node, minute, Spend, c.Resource, c.Amount)
		}
		l := &leaseInfo{node: ev.Node, session: ev.Session, class: ev.Resource, count: 1}
		if ev.Block {
			l.count = ev.Amount
		}
		f.addLease(ev.Lease, l)
		f.moveHeld(l.node, l.class, l.count, ev.At)
	case engine.EvBlockResized:
		if l := f.leases[ev.Lease]; l != nil {
			l.count += ev.Amount
			f.moveHeld(l.node, l.class, ev.Amount, ev.At)
		}
	case engine.EvLeaseReleased:
		if l := f.leases[ev.Lease]; l != nil && ev.GivenBack {
			for _, c := range ev.Charges {
				f.add(l.node, minute, Spend, c.Resource, -c.Amount)
			}
		}
		f.endLease(ev.Lease, ev.At)
	case engine.EvSessionEnded:
		for id := range f.bySession[ev.Session] {
			f.endLease(id, ev.At)
		}
		// Its unspent reservations count as spent (the engine's rule).
		for k, units := range f.reserved {
			if k.session == ev.Session {
				f.add(k.node, minute, Spend, k.resource, units)
				delete(f.reserved, k)
			}
		}
	case engine.EvNodeEnded:
		for id, l := range f.leases {
			if f.under(l.node, ev.Node) {
				f.endLease(id, ev.At)
			}
		}
	case engine.EvReserved:
		k := resKey{ev.Session, ev.Node, ev.Resource}
		if ev.Spent != 0 {
			f.add(ev.Node, minute, Spend, ev.Resource, ev.Spent)
		}
		if left := f.reserved[k] + ev.Amount - ev.Spent - ev.Returned; left != 0 {
			f.reserved[k] = left
		} else {
			delete(f.reserved, k)
		}
	case engine.EvNodesReclaimed:
		// Records keep the names; nothing more will name these nodes.
		for _, id := range ev.Nodes {
			f.forget(id)
		}
		f.shrink()
	}
}

// shrink builds the node maps again once they hold a quarter of their most
// or less. A Go map keeps the room it grew to when entries are deleted, so
// a burst of tasks, long reclaimed, would otherwise keep its room for good.
func (f *Fold) shrink() {
	if f.nodesMost < shrinkAbove || len(f.nodes) > f.nodesMost/4 {
		return
	}
	f.nodes = rebuilt(f.nodes)
	kids := make(map[engine.NodeID]map[engine.NodeID]struct{}, len(f.kids))
	for parent, children := range f.kids {
		kids[parent] = rebuilt(children)
	}
	f.kids = kids
	f.nodesMost = len(f.nodes)
}

// rebuilt is a copy of m with no more room than its entries need (unlike
// maps.Clone, which keeps m's).
func rebuilt[K comparable, V any](m map[K]V) map[K]V {
	out := make(map[K]V, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func (f *Fold) adopt(parent, child engine.NodeID) {
	if parent == 0 {
		return
	}
	if f.kids[parent] == nil {
		f.kids[parent] = make(map[engine.NodeID]struct{})
	}
	f.kids[parent][child] = struct{}{}
}

// forget drops a reclaimed node and its subtree.
func (f *Fold) forget(id engine.NodeID) {
	for c := range f.kids[id] {
		f.forget(c)
	}
	delete(f.kids, id)
	delete(f.kids[f.nodes[id].parent], id)
	delete(f.nodes, id)
}

// under reports whether node lies in top's subtree.
func (f *Fold) under(node, top engine.NodeID) bool {
	for n := node; n != 0; n = f.nodes[n].parent {
		if n == top {
			return true
		}
	}
	return false
}

// Deny counts a refusal of a call on node for cause at at.
func (f *Fold) Deny(node engine.NodeID, cause string, at int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, known := f.nodes[node]; !known {
		return
	}
	f.add(node, MinuteOf(at), Denied, cause, 1)
}

// DenialRecord is the record n refusals of node for cause at at make, for
// a writer that stores it at once rather than with the next commit (a
// sidecar's report, acknowledged only once stored); nothing is folded. ok
// is false for a node the fold does not know, or n below 1.
func (f *Fold) DenialRecord(node engine.NodeID, cause string, at, n int64) (r Record, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, known := f.nodes[node]; !known || n <= 0 {
		return Record{}, false
	}
	tenant, task := f.place(node)
	return f.record(Key{Tenant: int64(tenant), Task: int64(task), Minute: MinuteOf(at), Kind: Denied, Name: cause}, n), true
}

// Take returns the records folded since the last Take, to be written with
// the events they came from.
func (f *Fold) Take() []Record {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.pending) == 0 {
		return nil
	}
	out := make([]Record, 0, len(f.pending))
	for _, r := range f.pending {
		out = append(out, *r)
	}
	clear(f.pending)
	return out
}

// Under reports whether node lies in top's subtree, as far as the fold
// knows the tree (reclaimed nodes are forgotten).
func (f *Fold) Under(node, top engine.NodeID) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.under(node, top)
}
