package engine

import (
	"container/heap"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
)

// Kind is a node's place in the tree, fixed by its depth.
type Kind uint8

const (
	KindRoot Kind = iota
	KindTenant
	KindTask
	KindSubtask
)

func (k Kind) String() string {
	switch k {
	case KindRoot:
		return "root"
	case KindTenant:
		return "tenant"
	case KindTask:
		return "task"
	default:
		return "subtask"
	}
}

// State is a node's life: open until closed, cancelled or expired. An ended
// node's whole subtree is ended with it.
type State uint8

const (
	Open State = iota
	Closed
	Cancelled
	Expired
)

// Ended reports whether s is a final state.
func (s State) Ended() bool { return s != Open }

func (s State) String() string {
	switch s {
	case Open:
		return "open"
	case Closed:
		return "closed"
	case Cancelled:
		return "cancelled"
	case Expired:
		return "expired"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// NodeSpec describes a new node. Quotas and limits not named are inherited
// from the parent's defaults; NoCap removes an inherited one.
type NodeSpec struct {
	Name          string           `json:"name"`
	Quotas        map[string]int64 `json:"q,omitempty"`
	Limits        map[string]int64 `json:"l,omitempty"`
	DefaultQuotas map[string]int64 `json:"dq,omitempty"`   // nil inherits the parent's defaults
	DefaultLimits map[string]int64 `json:"dl,omitempty"`   // nil inherits the parent's defaults
	Deadline      int64            `json:"dead,omitempty"` // unix nanoseconds; 0 is none
	Weight        int64            `json:"w,omitempty"`    // share in the fair queue; 0 means 1
	Priority      int64            `json:"pri,omitempty"`  // higher first within a tenant; 0 inherits
	// Rates and DefaultRates are as Quotas and DefaultQuotas, for rates
	// (rate.go): a Rate with Units NoCap removes an inherited one.
	Rates        map[string]Rate `json:"rt,omitempty"`
	DefaultRates map[string]Rate `json:"drt,omitempty"` // nil inherits the parent's defaults
	// QuotaPeriods and DefaultQuotaPeriods are as Quotas and
	// DefaultQuotas, for periods (period.go): a quota inherited from the
	// parent's defaults takes its default period unless QuotaPeriods
	// names one (the zero Period: none). A period needs its quota.
	QuotaPeriods        map[string]Period `json:"qp,omitempty"`
	DefaultQuotaPeriods map[string]Period `json:"dqp,omitempty"` // nil inherits the parent's
}

// CapsEdit changes a node's caps. Keys not named are left alone; NoCap
// removes a cap. Nil pointers leave their field alone.
type CapsEdit struct {
	Quotas        map[string]int64 `json:"q,omitempty"`
	Limits        map[string]int64 `json:"l,omitempty"`
	DefaultQuotas map[string]int64 `json:"dq,omitempty"`
	DefaultLimits map[string]int64 `json:"dl,omitempty"`
	Weight        *int64           `json:"w,omitempty"`
	Priority      *int64           `json:"pri,omitempty"`
	Deadline      *int64           `json:"dead,omitempty"` // 0 clears the deadline
	// QuotaModes and LimitModes set how caps are enforced (policy.go);
	// the zero CapMode makes a cap hard again. A mode needs a cap.
	QuotaModes map[string]CapMode `json:"qm,omitempty"`
	LimitModes map[string]CapMode `json:"lm,omitempty"`
	// Minimums set a tenant's reserved minimums by lease class
	// (minimum.go); Min 0 removes one.
	Minimums map[string]Minimum `json:"mins,omitempty"`
	// Rates and DefaultRates set token buckets by resource (rate.go); a
	// Rate with Units NoCap removes one.
	Rates        map[string]Rate `json:"rt,omitempty"`
	DefaultRates map[string]Rate `json:"drt,omitempty"`
	// QuotaPeriods and DefaultQuotaPeriods set when quotas and default
	// quotas reset (period.go); the zero Period removes one. A period
	// needs its quota, and removing the quota removes it.
	QuotaPeriods        map[string]Period `json:"qp,omitempty"`
	DefaultQuotaPeriods map[string]Period `json:"dqp,omitempty"`
}

// NodeView is a copy of a node's state, safe to keep. In a snapshot, zero
// fields are left out: most nodes of a large tree are tasks with few caps.
type NodeView struct {
	ID            NodeID
	Parent        NodeID `json:",omitempty"`
	Name          string
	Kind          Kind             `json:",omitempty"`
	State         State            `json:",omitempty"`
	Quotas        map[string]int64 `json:",omitempty"`
	Used          map[string]int64 `json:",omitempty"`
	Reserved      map[string]int64 `json:",omitempty"` // unspent units reserved in the subtree (reserve.go)
	Limits        map[string]int64 `json:",omitempty"`
	Held          map[string]int64 `json:",omitempty"`
	DefaultQuotas map[string]int64 `json:",omitempty"`
	DefaultLimits map[string]int64 `json:",omitempty"`
	Deadline      int64            `json:",omitempty"`
	Weight        int64            `json:",omitempty"`
	Priority      int64            `json:",omitempty"`
	// Ended is when the node ended (unix nanoseconds), 0 while it is open.
	// It is reclaimed once it has been ended for the retention (reclaim.go).
	Ended int64 `json:",omitempty"`
	// Reclaimed is what children already reclaimed spent, by resource: part
	// of Used that no child shows any more.
	Reclaimed map[string]int64 `json:",omitempty"`
	// Created is when the node was created (unix nanoseconds); 0 for the
	// root, and for nodes restored from a snapshot that did not keep it.
	Created int64 `json:",omitempty"`
	// QuotaModes and LimitModes are the caps enforced other than hard
	// (policy.go).
	QuotaModes map[string]CapMode `json:",omitempty"`
	LimitModes map[string]CapMode `json:",omitempty"`
	// TenantState is a tenant's state, and TenantStateReason the reason
	// its last change gave (tenantstate.go).
	TenantState       TenantState `json:",omitempty"`
	TenantStateReason string      `json:",omitempty"`
	// Minimums are a tenant's reserved minimums by lease class
	// (minimum.go).
	Minimums map[string]Minimum `json:",omitempty"`
	// Shadow is the shadow ledger: what the sidecars' rules in dry run would
	// have charged in the subtree, had they been enforced (dryrun.go).
	Shadow map[string]int64 `json:",omitempty"`
	// Rates are the node's rates with their buckets as stored (rate.go),
	// and DefaultRates the rates a new child starts with.
	Rates        map[string]BucketView `json:",omitempty"`
	DefaultRates map[string]Rate       `json:",omitempty"`
	// Periods are the quotas' periods with their windows (period.go), and
	// DefaultQuotaPeriods the periods a new child's default quotas take.
	Periods             map[string]QuotaWindow `json:",omitempty"`
	DefaultQuotaPeriods map[string]Period      `json:",omitempty"`
}

type node struct {
	id       NodeID
	parent   *node
	tenant   *node // the depth-1 ancestor (itself for a tenant, the root for the root)
	depth    int
	name     string
	state    State
	deadline int64
	weight   int64
	priority int64

	quota     gauges // quotas and usage
	limit     gauges // limits and leases held
	defQuotas map[string]int64
	defLimits map[string]int64

	children []*node
	open     map[string]*node // open children by name
	leases   map[LeaseID]*lease

	endedAt int64            // when it ended (unix nanoseconds); 0 while open
	created int64            // when it was created (unix nanoseconds)
	gone    map[string]int64 // what reclaimed children spent, by resource
	// pins counts what names the node by id and must not outlive it: open
	// sessions scoped to it and reservations on it. A node with a pin in
	// its subtree is not reclaimed (reclaim.go).
	pins int

	// The audit trail of cap edits, newest last, and the caps a temporary
	// override set that are still to revert (override.go).
	audit     []CapsChange
	overrides map[overrideKey]Override

	// A tenant's state and the reason given for it (tenantstate.go), and
	// its reserved minimums by class (minimum.go).
	tstate    TenantState
	tstateWhy string
	mins      map[string]Minimum

	// shadow is the shadow ledger: what requests of the sidecars' rules in
	// dry run would have charged here and below, had they been enforced
	// (dryrun.go). It never counts against a real request.
	shadow map[string]int64

	// rates are the node's token buckets by resource, and defRates the
	// rates a new child starts with (rate.go).
	rates    map[string]*bucket
	defRates map[string]Rate
	// defPeriods are the periods of the default quotas (period.go).
	defPeriods map[string]Period

	// Kept on a tenant for its bounds (bounds.go): open nodes below it, open
	// sessions scoped inside it, and (not state) its queued acquires.
	openBelow int
	sessions  int
	waiting   int
}

func newNode(id NodeID, parent *node, name string) *node {
	n := &node{id: id, parent: parent, name: name, weight: 1}
	switch {
	case parent == nil:
		n.tenant = n
	case parent.parent == nil:
		n.tenant = n
		n.depth = 1
	default:
		n.tenant = parent.tenant
		n.depth = parent.depth + 1
	}
	return n
}

func (n *node) kind() Kind {
	if n.depth >= int(KindSubtask) {
		return KindSubtask
	}
	return Kind(n.depth)
}

func (n *node) view() NodeView {
	v := NodeView{ID: n.id, Name: n.name, Kind: n.kind(), State: n.state,
		Quotas: n.quota.caps(), Used: n.quota.counts(), Reserved: n.quota.reservedCounts(), Limits: n.limit.caps(),
		Held: n.limit.counts(), DefaultQuotas: maps.Clone(n.defQuotas), DefaultLimits: maps.Clone(n.defLimits),
		Deadline: n.deadline, Weight: n.weight, Priority: n.priority, Ended: n.endedAt, Reclaimed: maps.Clone(n.gone),
		Created: n.created, QuotaModes: n.quota.modes(), LimitModes: n.limit.modes(),
		TenantState: n.tstate, TenantStateReason: n.tstateWhy, Minimums: maps.Clone(n.mins),
		Shadow: nilIfEmpty(maps.Clone(n.shadow)), Rates: n.rateViews(), DefaultRates: maps.Clone(n.defRates),
		Periods: n.periodViews(), DefaultQuotaPeriods: maps.Clone(n.defPeriods)}
	if n.parent != nil {
		v.Parent = n.parent.id
	}
	return v
}

// within reports whether n lies in scope's subtree (scope included).
func (n *node) within(scope *node) bool {
	for a := n; a != nil; a = a.parent {
		if a == scope {
			return true
		}
	}
	return false
}

// charge adds amount of r to n and every ancestor. Callers have checked that
// it fits; this is the one place usage grows.
func (n *node) charge(r string, amount int64) {
	for a := n; a != nil; a = a.parent {
		a.quota.at(r).shift(amount, 0, a.isRoot())
	}
}

func (n *node) isRoot() bool { return n.parent == nil }

// saturates reports whether n's counter g (nil for none yet) saturates at
// MaxInt64 rather than refusing an amount it cannot hold. Only the root's
// do: every tenant's work counts on the root, so a root that refused an
// amount for overflow would let one tenant, by charging 2^63-1 units of
// something nobody caps, refuse every other tenant's work. Below the root
// a tenant's own amounts refuse only its own work.
//
// An enforced cap is at most MaxInt64 and refuses before its counter could
// pass it, so under one the root saturates only a count that saturated
// before the cap was set, which the cap then finds full. The exception is
// the base of a period's past windows, which used carries on top of what
// the window spent: a used that overflowed there would hide spending from
// the cap, so a capped root with a base refuses the overflow instead. A
// tenant cannot hasten that: each window admits at most the cap.
func (n *node) saturates(g *gauge) bool {
	if !n.isRoot() {
		return false
	}
	if g == nil || g.base == 0 {
		return true
	}
	_, enforced := g.enforced()
	return !enforced
}

func (gs *gauges) setCaps(m map[string]int64) {
	for k, v := range m {
		gs.setCap(k, v)
	}
}

// mergeMap is base with edit applied, in a new map: an entry of edit that
// removes (NoCap, the zero Period) deletes its key, any other sets it. It
// is nil when nothing is left, so that an edit that removes every entry
// leaves the node as one that never had any.
func mergeMap[V any](base, edit map[string]V, removes func(V) bool) map[string]V {
	out := maps.Clone(base)
	for k, v := range edit {
		if removes(v) {
			delete(out, k)
			continue
		}
		if out == nil {
			out = make(map[string]V)
		}
		out[k] = v
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// mergeCaps is base with edit applied; NoCap removes a cap.
func mergeCaps(base, edit map[string]int64) map[string]int64 {
	return mergeMap(base, edit, func(v int64) bool { return v == NoCap })
}

func (n *node) applyCaps(c *CapsEdit, e *Engine, at int64, wins map[string]Window) {
	n.setRates(c.Rates, at)
	n.defRates = mergeRates(n.defRates, c.DefaultRates)
	n.quota.setCaps(c.Quotas)
	e.setPeriods(n, c.QuotaPeriods, wins)
	n.limit.setCaps(c.Limits)
	for k, m := range c.QuotaModes {
		n.quota.setMode(k, m)
	}
	for k, m := range c.LimitModes {
		n.limit.setMode(k, m)
	}
	n.applyMinimums(c.Minimums)
	n.defQuotas = mergeCaps(n.defQuotas, c.DefaultQuotas)
	n.defLimits = mergeCaps(n.defLimits, c.DefaultLimits)
	n.defPeriods = keepCapped(mergePeriods(n.defPeriods, c.DefaultQuotaPeriods), n.defQuotas)
	if c.Weight != nil {
		n.weight = *c.Weight
	}
	if c.Priority != nil {
		n.priority = *c.Priority
	}
	if c.Deadline != nil {
		n.deadline = *c.Deadline
		if n.deadline != 0 {
			heap.Push(&e.deadlines, deadlineEntry{at: n.deadline, node: n.id})
		}
	}
}

func (s NodeSpec) clone() NodeSpec {
	s.Quotas, s.Limits = maps.Clone(s.Quotas), maps.Clone(s.Limits)
	s.DefaultQuotas, s.DefaultLimits = maps.Clone(s.DefaultQuotas), maps.Clone(s.DefaultLimits)
	s.Rates, s.DefaultRates = maps.Clone(s.Rates), maps.Clone(s.DefaultRates)
	s.QuotaPeriods, s.DefaultQuotaPeriods = maps.Clone(s.QuotaPeriods), maps.Clone(s.DefaultQuotaPeriods)
	return s
}

func (c CapsEdit) clone() CapsEdit {
	c.Quotas, c.Limits = maps.Clone(c.Quotas), maps.Clone(c.Limits)
	c.DefaultQuotas, c.DefaultLimits = maps.Clone(c.DefaultQuotas), maps.Clone(c.DefaultLimits)
	c.QuotaModes, c.LimitModes = maps.Clone(c.QuotaModes), maps.Clone(c.LimitModes)
	c.Minimums = maps.Clone(c.Minimums)
	c.Rates, c.DefaultRates = maps.Clone(c.Rates), maps.Clone(c.DefaultRates)
	c.QuotaPeriods, c.DefaultQuotaPeriods = maps.Clone(c.QuotaPeriods), maps.Clone(c.DefaultQuotaPeriods)
	for _, p := range []**int64{&c.Weight, &c.Priority, &c.Deadline} {
		if *p != nil {
			v := **p
			*p = &v
		}
	}
	return c
}

// ValidName checks a name the engine takes for a node, resource or class
// (what says which, for the error): 1 to MaxNameLen bytes, no NUL.
func ValidName(what, s string) error { return validName(what, s) }

func validName(what, s string) error {
	if s == "" {
		return invalid("%s is empty", what)
	}
	if len(s) > MaxNameLen {
		return invalid("%s is longer than %d bytes", what, MaxNameLen)
	}
	if strings.ContainsAny(s, "\x00") {
		return invalid("%s contains a NUL byte", what)
	}
	return nil
}

func validCaps(what string, m map[string]int64) error {
	for k, v := range m {
		if err := validName(what+" name", k); err != nil {
			return err
		}
		if v < 0 && v != NoCap {
			return invalid("%s %q is %d; caps are >= 0, or %d for no cap", what, k, v, NoCap)
		}
	}
	return nil
}

// validCapSets checks the four cap maps a NodeSpec or a CapsEdit carries, in
// a fixed order.
func validCapSets(quotas, limits, defQuotas, defLimits map[string]int64) error {
	if err := validCaps("quota", quotas); err != nil {
		return err
	}
	if err := validCaps("limit", limits); err != nil {
		return err
	}
	if err := validCaps("default quota", defQuotas); err != nil {
		return err
	}
	return validCaps("default limit", defLimits)
}

func (s *NodeSpec) validate() error {
	if err := validName("node name", s.Name); err != nil {
		return err
	}
	if err := validCapSets(s.Quotas, s.Limits, s.DefaultQuotas, s.DefaultLimits); err != nil {
		return err
	}
	if err := validRateSets(s.Rates, s.DefaultRates); err != nil {
		return err
	}
	if err := validPeriodSets(s.QuotaPeriods, s.DefaultQuotaPeriods); err != nil {
		return err
	}
	if s.Weight < 0 {
		return invalid("weight %d is negative", s.Weight)
	}
	if s.Deadline < 0 {
		return invalid("deadline %d is negative", s.Deadline)
	}
	return nil
}

func (c *CapsEdit) validate() error {
	if err := validCapSets(c.Quotas, c.Limits, c.DefaultQuotas, c.DefaultLimits); err != nil {
		return err
	}
	if err := validRateSets(c.Rates, c.DefaultRates); err != nil {
		return err
	}
	if err := validPeriodSets(c.QuotaPeriods, c.DefaultQuotaPeriods); err != nil {
		return err
	}
	if c.Weight != nil && *c.Weight < 1 {
		return invalid("weight %d is below 1", *c.Weight)
	}
	if c.Deadline != nil && *c.Deadline < 0 {
		return invalid("deadline %d is negative", *c.Deadline)
	}
	for _, side := range []struct {
		what  string
		modes map[string]CapMode
	}{{"quota", c.QuotaModes}, {"limit", c.LimitModes}} {
		for k, m := range side.modes {
			if err := validName(side.what+" name", k); err != nil {
				return err
			}
			if err := m.validate(side.what + " " + k); err != nil {
				return err
			}
		}
	}
	return nil
}

func (n *node) ended() *EndedError {
	return &EndedError{Node: n.id, Name: n.name, Kind: n.kind(), State: n.state, Deadline: n.state == Expired}
}

// checkOpen ends the first node on n's chain that is past its deadline and
// reports whether the chain is still open. now is the decision's time.
func (e *Engine) checkOpen(n *node, now int64) error {
	for a := n; a != nil; a = a.parent {
		if a.state != Open {
			// Name the node whose end took this one with it.
			for a.parent != nil && a.parent.state != Open {
				a = a.parent
			}
			return a.ended()
		}
		if a.deadline != 0 && now >= a.deadline {
			e.endNode(a, Expired, now)
			return a.ended()
		}
	}
	return nil
}

// CreateNode makes a child of parent.
func (e *Engine) CreateNode(sid SessionID, parent NodeID, spec NodeSpec, requestID string) (NodeView, error) {
	v, _, err := e.createNode(sid, parent, spec, requestID, false)
	return v, err
}

// FindOrCreate returns parent's open child named spec.Name, creating it from
// spec when there is none. created says which happened.
func (e *Engine) FindOrCreate(sid SessionID, parent NodeID, spec NodeSpec, requestID string) (v NodeView, created bool, err error) {
	return e.createNode(sid, parent, spec, requestID, true)
}

func (e *Engine) createNode(sid SessionID, parentID NodeID, spec NodeSpec, requestID string, find bool) (NodeView, bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.tick()
	s, err := e.session(sid, now)
	if err != nil {
		return NodeView{}, false, err
	}
	if err := spec.validate(); err != nil {
		return NodeView{}, false, err
	}
	spec = spec.clone() // the event is encoded later, outside the lock
	fp := fingerprintSpec(opCreate, parentID, &spec)
	if r, ok, err := s.requests.lookup(requestID, fp); ok || err != nil {
		if err != nil {
			return NodeView{}, false, err
		}
		if n := e.nodes[r.node]; n != nil {
			return n.view(), true, nil
		}
		return NodeView{}, false, e.notFound(r.node)
	}
	parent, err := e.target(s, parentID)
	if err != nil {
		return NodeView{}, false, err
	}
	if existing := parent.open[spec.Name]; existing != nil && e.checkOpen(existing, now) == nil {
		if find {
			return existing.view(), false, nil
		}
		return NodeView{}, false, fmt.Errorf("%w: %q already has an open child %q (node %d)", ErrExists, parent.name, spec.Name, existing.id)
	}
	if err := e.checkOpen(parent, now); err != nil {
		return NodeView{}, false, err
	}
	if err := parent.admits(false, parent.depth == int(KindTenant)); err != nil {
		return NodeView{}, false, err
	}
	if parent.depth+1 >= MaxDepth {
		return NodeView{}, false, invalid("the tree is at most %d levels deep", MaxDepth)
	}
	if s.id != System { // the operator's configuration is not bounded
		if err := e.checkNewNode(parent, &spec); err != nil {
			return NodeView{}, false, err
		}
	}
	quotas, err := spec.checkPeriods(parent)
	if err != nil {
		return NodeView{}, false, err
	}
	id := e.nextNode
	e.emit(Event{Kind: EvNodeCreated, At: now, Session: s.id, Node: id, Parent: parent.id,
		Spec: &spec, RequestID: requestID, Fingerprint: fp,
		Windows: e.windowsFor(nil, keepCapped(childPeriods(parent, &spec), quotas), now, true)})
	return e.nodes[id].view(), true, nil
}

func (e *Engine) applyNodeCreated(ev *Event) error {
	parent := e.nodes[ev.Parent]
	if parent == nil || ev.Spec == nil || ev.Node != e.nextNode || parent.open[ev.Spec.Name] != nil {
		return fmt.Errorf("%w: node %d under %d", ErrCorrupt, ev.Node, ev.Parent)
	}
	sp := ev.Spec
	n := newNode(ev.Node, parent, sp.Name)
	n.created = ev.At
	n.quota.setCaps(mergeCaps(parent.defQuotas, sp.Quotas))
	n.limit.setCaps(mergeCaps(parent.defLimits, sp.Limits))
	n.defQuotas, n.defLimits = maps.Clone(parent.defQuotas), maps.Clone(parent.defLimits)
	if sp.DefaultQuotas != nil {
		n.defQuotas = mergeCaps(nil, sp.DefaultQuotas)
	}
	if sp.DefaultLimits != nil {
		n.defLimits = mergeCaps(nil, sp.DefaultLimits)
	}
	n.setRates(mergeRates(parent.defRates, sp.Rates), ev.At)
	n.defRates = maps.Clone(parent.defRates)
	if sp.DefaultRates != nil {
		n.defRates = mergeRates(nil, sp.DefaultRates)
	}
	e.setPeriods(n, childPeriods(parent, sp), ev.Windows)
	n.defPeriods = keepCapped(maps.Clone(parent.defPeriods), n.defQuotas)
	if sp.DefaultQuotaPeriods != nil {
		n.defPeriods = keepCapped(mergePeriods(nil, sp.DefaultQuotaPeriods), n.defQuotas)
	}
	if sp.Weight > 0 {
		n.weight = sp.Weight
	}
	n.priority = parent.priority
	if sp.Priority != 0 {
		n.priority = sp.Priority
	}
	n.deadline = sp.Deadline
	if n.deadline != 0 {
		heap.Push(&e.deadlines, deadlineEntry{at: n.deadline, node: n.id})
	}
	if parent.state != Open {
		n.state, n.endedAt = parent.state, ev.At
	}
	if n.state == Open && n.depth >= int(KindTask) {
		n.tenant.openBelow++
	}
	e.nodes[n.id] = n
	parent.adopt(n)
	e.nextNode = n.id + 1
	return nil
}

// adopt makes n the newest child of p, findable by name while it is open.
func (p *node) adopt(n *node) {
	p.children = append(p.children, n)
	if n.state != Open {
		return
	}
	if p.open == nil {
		p.open = make(map[string]*node)
	}
	p.open[n.name] = n
}

// Get returns a node.
func (e *Engine) Get(sid SessionID, id NodeID) (NodeView, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	n, err := e.sessionTarget(sid, id, e.tick())
	if err != nil {
		return NodeView{}, err
	}
	return n.view(), nil
}

// Children returns up to limit children of id whose ids are above after, in
// id order. limit <= 0 means all.
func (e *Engine) Children(sid SessionID, id, after NodeID, limit int) ([]NodeView, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	n, err := e.sessionTarget(sid, id, e.tick())
	if err != nil {
		return nil, err
	}
	start := sort.Search(len(n.children), func(i int) bool { return n.children[i].id > after })
	var out []NodeView
	for _, c := range n.children[start:] {
		if limit > 0 && len(out) == limit {
			break
		}
		out = append(out, c.view())
	}
	return out, nil
}

// EndNode closes or cancels a node and its whole subtree: their leases are
// revoked and their waiters fail. Ending an ended node changes nothing.
func (e *Engine) EndNode(sid SessionID, id NodeID, state State, requestID string) (NodeView, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.tick()
	s, err := e.session(sid, now)
	if err != nil {
		return NodeView{}, err
	}
	if state != Closed && state != Cancelled {
		return NodeView{}, invalid("a node can be closed or cancelled, not set %s", state)
	}
	fp := fingerprint(opEnd, id, "", int64(state))
	if v, done, err := e.remembered(s, requestID, fp, id); done {
		return v, err
	}
	n, err := e.editable(s, id)
	if err != nil {
		return NodeView{}, err
	}
	if n.state == Open {
		if err := e.checkOpen(n, now); err == nil {
			e.emit(Event{Kind: EvNodeEnded, At: now, Session: s.id, Node: n.id, State: state,
				RequestID: requestID, Fingerprint: fp})
			e.afterEnd()
		}
	}
	return n.view(), nil
}

// endNode ends n for the engine's own reasons (a deadline).
func (e *Engine) endNode(n *node, state State, now int64) {
	e.emit(Event{Kind: EvNodeEnded, At: now, Node: n.id, State: state})
	e.afterEnd()
}

func (e *Engine) applyNodeEnded(n *node, ev *Event) {
	if n.state == Open {
		e.endedQ = append(e.endedQ, endedEntry{at: ev.At, node: n.id})
	}
	var walk func(*node)
	walk = func(m *node) {
		if m.state == Open {
			m.state, m.endedAt = ev.State, ev.At
			if m.parent != nil && m.parent.open[m.name] == m {
				delete(m.parent.open, m.name)
			}
			if m.depth >= int(KindTask) {
				m.tenant.openBelow--
			}
		}
		for _, id := range sortedKeys(m.leases) {
			e.endLease(m.leases[id], EndRevoked, ev.At)
		}
		for _, c := range m.children {
			walk(c)
		}
	}
	walk(n)
	e.noticeReservationsEnded(n)
}

// noticeReservationsEnded tells the holders of reservations on n or below
// it that their node has ended, so that they settle and grant no more.
func (e *Engine) noticeReservationsEnded(n *node) {
	if e.notifier == nil || e.replaying {
		return
	}
	for _, r := range slices.Sorted(maps.Keys(e.reserved)) {
		for _, res := range sortedReservations(e.reserved[r]) {
			if res.node.within(n) {
				e.notify(Notice{Session: res.session.id, Kind: NoticeEnded, Node: res.node.id, Resource: r})
			}
		}
	}
}

// afterEnd fails the waiters on ended nodes, in one pass over each tenant's
// queue, and hands freed slots on. Failing a waiter emits nothing, so the
// order does not matter.
func (e *Engine) afterEnd() {
	e.eachQueue(func(q *classQueue) {
		for _, tq := range q.ring {
			kept := tq.waiters[:0]
			for _, w := range tq.waiters {
				if w.node.state == Open {
					kept = append(kept, w)
					continue
				}
				q.waiting--
				w.node.tenant.waiting--
				if i := slices.Index(w.session.waiters, w); i >= 0 {
					w.session.waiters = slices.Delete(w.session.waiters, i, i+1)
				}
				if w.rate != "" {
					e.rateWaiting--
				}
				w.done = true
				w.ch <- Outcome{Err: w.node.ended()}
			}
			clear(tq.waiters[len(kept):])
			tq.waiters = kept
		}
	})
	for _, class := range e.sortedQueues() {
		e.contention(class, e.queues[class])
	}
	e.dispatchAll()
}

// remembered answers a retried edit of node id from the session's memory.
// done says the call is answered, with the node or with an error.
func (e *Engine) remembered(s *session, requestID string, fp uint64, id NodeID) (v NodeView, done bool, err error) {
	_, ok, err := s.requests.lookup(requestID, fp)
	if err != nil {
		return NodeView{}, true, err
	}
	if !ok {
		return NodeView{}, false, nil
	}
	n := e.nodes[id]
	if n == nil { // it ended, and the retention has passed
		return NodeView{}, true, e.notFound(id)
	}
	return n.view(), true, nil
}

// SetCaps edits a node's caps, defaults, weight, priority or deadline.
// Lowering a cap below usage revokes nothing; it stops further grants.
func (e *Engine) SetCaps(sid SessionID, id NodeID, edit CapsEdit, requestID string) (NodeView, error) {
	return e.setCaps(sid, id, edit, Audit{}, requestID)
}

func (e *Engine) setCaps(sid SessionID, id NodeID, edit CapsEdit, a Audit, requestID string) (NodeView, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.tick()
	s, err := e.session(sid, now)
	if err != nil {
		return NodeView{}, err
	}
	if err := edit.validate(); err != nil {
		return NodeView{}, err
	}
	if int64(a.For) > math.MaxInt64-now {
		return NodeView{}, invalid("an override of %v would end past the clock's last instant", a.For)
	}
	edit = edit.clone() // the event is encoded later, outside the lock
	fp := fingerprintCaps(id, &edit)
	if a != (Audit{}) { // an edit without them keeps the fingerprint it always had
		fp = fnvAdd(fnvString(fp, a.Reason), uint64(a.For))
	}
	if v, done, err := e.remembered(s, requestID, fp, id); done {
		return v, err
	}
	n, err := e.editable(s, id)
	if err != nil {
		return NodeView{}, err
	}
	if err := e.checkOpen(n, now); err != nil {
		return NodeView{}, err
	}
	if err := n.checkModes(&edit); err != nil {
		return NodeView{}, err
	}
	if err := n.checkPeriods(&edit); err != nil {
		return NodeView{}, err
	}
	if err := e.checkMinimums(n, &edit); err != nil {
		return NodeView{}, err
	}
	if s.id != System {
		if err := e.checkCapNames(n.tenant, edit.Quotas, edit.DefaultQuotas, edit.Limits, edit.DefaultLimits); err != nil {
			return NodeView{}, err
		}
	}
	audit := &CapsAudit{Who: whoOf(s), Reason: a.Reason, Old: n.oldValues(&edit)}
	if a.For > 0 {
		audit.Until = now + int64(a.For)
	}
	e.emit(Event{Kind: EvCapsSet, At: now, Session: s.id, Node: n.id, Caps: &edit, Audit: audit,
		RequestID: requestID, Fingerprint: fp, Windows: e.windowsFor(n, edit.QuotaPeriods, now, false)})
	// What was delegated below n was sized under the old caps.
	e.recallUnder(n, "", "")
	if edit.Weight != nil {
		// A turn in progress ends at the new weight.
		e.eachQueue(func(q *classQueue) {
			if tq := q.byNode[n]; tq != nil {
				tq.deficit = min(tq.deficit, n.weight)
			}
		})
	}
	e.dispatchAll()
	return n.view(), nil
}

type deadlineEntry struct {
	at   int64
	node NodeID
}

// deadlineHeap orders node deadlines, soonest first. Entries go stale when a
// deadline changes or a node ends; Reap skips those.
type deadlineHeap []deadlineEntry

func (h deadlineHeap) Len() int { return len(h) }
func (h deadlineHeap) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].node < h[j].node
}
func (h deadlineHeap) Swap(i, j int)       { h[i], h[j] = h[j], h[i] }
func (h *deadlineHeap) Push(x any)         { *h = append(*h, x.(deadlineEntry)) }
func (h *deadlineHeap) Pop() any           { old := *h; x := old[len(old)-1]; *h = old[:len(old)-1]; return x }
func (h deadlineHeap) peek() deadlineEntry { return h[0] }
func (h *deadlineHeap) pop() deadlineEntry { return heap.Pop(h).(deadlineEntry) }

func sortedKeys[K ~int64, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
