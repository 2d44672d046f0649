package engine

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// This file keeps the audit trail of cap edits and the temporary overrides
// that revert by themselves (governor caps set --for). Both are state: an
// edit's who, why and old values travel in its EvCapsSet, a revert is an
// EvCapsReverted decided by Reap from the engine's clock, and snapshots keep
// each node's trail and pending reverts, so neither is lost when old events
// are deleted or the process restarts.

const (
	// AuditKeep is how many changes a node's audit trail keeps, newest
	// last; older ones are dropped so the state stays bounded.
	AuditKeep = 100
	// MaxReason is the longest reason an edit may give, in bytes.
	MaxReason = 1024
	// WhoConfig, WhoAdmin and WhoGovernord name who made a change when it
	// was not a tenant: governord's configuration, the operator's admin key,
	// and governord itself (an override's revert). A tenant's key is
	// "tenant:" followed by the tenant's name.
	WhoConfig    = "config"
	WhoAdmin     = "admin"
	WhoGovernord = "governord"
)

// Audit is how an edit is told: its reason and, for a temporary override,
// how long it lasts.
type Audit struct {
	Reason string
	// For makes the edit a temporary override of quotas and limits: after
	// it, each cap it set goes back to what it was before the first
	// override still pending on it. Zero is a permanent edit, which also
	// cancels the pending reverts of the caps it sets.
	For time.Duration
}

// CapsAudit rides on an EvCapsSet or EvCapsReverted: who made the change,
// why, the values it replaced (NoCap where there was no cap) and, for an
// override, when it reverts.
type CapsAudit struct {
	Who    string   `json:"who"`
	Reason string   `json:"why,omitempty"`
	Old    CapsEdit `json:"old"`
	Until  int64    `json:"until,omitempty"`
}

// CapsChange is one entry of a node's audit trail.
type CapsChange struct {
	Seq    uint64 // the event that made it
	At     int64  // unix nanoseconds
	Who    string
	Reason string   `json:",omitempty"`
	Old    CapsEdit // the values before, for the keys changed; NoCap for none
	New    CapsEdit
	Until  int64 `json:",omitempty"` // an override: when it reverts
	Revert bool  `json:",omitempty"` // an override's revert
	// OldState and NewState are a tenant's state before and after a change
	// of it (tenantstate.go), and Revoked says its leases were revoked;
	// Old and New are then empty.
	OldState string `json:",omitempty"`
	NewState string `json:",omitempty"`
	Revoked  bool   `json:",omitempty"`
}

// Override is a cap an override set that goes back to Restore at Until.
type Override struct {
	Limit    bool // a limit (a lease class) rather than a quota (a resource)
	Name     string
	Restore  int64 // NoCap when there was no cap
	Until    int64
	Override int64 // the value the override set
}

// NodeAudit is a node's audit trail and pending reverts, in a snapshot.
type NodeAudit struct {
	Node      NodeID
	Changes   []CapsChange `json:",omitempty"`
	Overrides []Override   `json:",omitempty"` // by kind, then name
}

type overrideKey struct {
	limit bool
	name  string
}

// whoOf names who a session acts for, as the audit trail records it.
func whoOf(s *session) string {
	switch {
	case s.id == System:
		return WhoConfig
	case s.scope.parent == nil:
		return WhoAdmin
	}
	return "tenant:" + s.scope.name
}

func (a *Audit) validate(edit *CapsEdit) error {
	if len(a.Reason) > MaxReason {
		return invalid("the reason is %d bytes; at most %d", len(a.Reason), MaxReason)
	}
	if a.For < 0 {
		return invalid("an override's duration %v is negative", a.For)
	}
	if a.For > 0 {
		if edit.DefaultQuotas != nil || edit.DefaultLimits != nil || edit.Weight != nil || edit.Priority != nil || edit.Deadline != nil ||
			edit.QuotaModes != nil || edit.LimitModes != nil || edit.Minimums != nil || edit.Rates != nil || edit.DefaultRates != nil ||
			edit.QuotaPeriods != nil || edit.DefaultQuotaPeriods != nil {
			return invalid("a temporary override sets only quotas and limits")
		}
		if len(edit.Quotas)+len(edit.Limits) == 0 {
			return invalid("a temporary override needs a quota or a limit to set")
		}
	}
	return nil
}

// oldValues is what edit would replace on n: the same keys, with n's values
// now (NoCap where n has no cap or default, 0 where no deadline).
func (n *node) oldValues(edit *CapsEdit) CapsEdit {
	pick := func(edited map[string]int64, cur func(string) (int64, bool)) map[string]int64 {
		if edited == nil {
			return nil
		}
		out := make(map[string]int64, len(edited))
		for k := range edited {
			v, ok := cur(k)
			if !ok {
				v = NoCap
			}
			out[k] = v
		}
		return out
	}
	inMap := func(m map[string]int64) func(string) (int64, bool) {
		return func(k string) (int64, bool) { v, ok := m[k]; return v, ok }
	}
	old := CapsEdit{Quotas: pick(edit.Quotas, n.quota.capOf), Limits: pick(edit.Limits, n.limit.capOf),
		DefaultQuotas: pick(edit.DefaultQuotas, inMap(n.defQuotas)), DefaultLimits: pick(edit.DefaultLimits, inMap(n.defLimits))}
	if edit.Weight != nil {
		old.Weight = int64p(n.weight)
	}
	if edit.Priority != nil {
		old.Priority = int64p(n.priority)
	}
	if edit.Deadline != nil {
		old.Deadline = int64p(n.deadline)
	}
	pickModes := func(edited map[string]CapMode, gs gauges) map[string]CapMode {
		if edited == nil {
			return nil
		}
		out := make(map[string]CapMode, len(edited))
		for k := range edited {
			out[k] = gs.modeOf(k)
		}
		return out
	}
	old.QuotaModes, old.LimitModes = pickModes(edit.QuotaModes, n.quota), pickModes(edit.LimitModes, n.limit)
	if edit.Minimums != nil {
		old.Minimums = make(map[string]Minimum, len(edit.Minimums))
		for k := range edit.Minimums {
			old.Minimums[k] = n.mins[k]
		}
	}
	old.Rates, old.DefaultRates = n.oldRates(edit.Rates), oldRates(edit.DefaultRates, n.defRates)
	return old
}

// oldRates is what a rates edit would replace on n: each rate edited with
// n's rate now, NoCap units where n has none.
func (n *node) oldRates(edited map[string]Rate) map[string]Rate {
	return pickRates(edited, func(k string) (Rate, bool) {
		b, ok := n.rates[k]
		if !ok {
			return Rate{}, false
		}
		return b.Rate, true
	})
}

func oldRates(edited, cur map[string]Rate) map[string]Rate {
	return pickRates(edited, func(k string) (Rate, bool) { r, ok := cur[k]; return r, ok })
}

func pickRates(edited map[string]Rate, cur func(string) (Rate, bool)) map[string]Rate {
	if edited == nil {
		return nil
	}
	out := make(map[string]Rate, len(edited))
	for k := range edited {
		r, ok := cur(k)
		if !ok {
			r = Rate{Units: NoCap}
		}
		out[k] = r
	}
	return out
}

func int64p(v int64) *int64 { return &v }

// SetCapsAudited is SetCaps with a reason and, with a.For, as a temporary
// override that Reap reverts once a.For has passed on the engine's clock.
func (e *Engine) SetCapsAudited(sid SessionID, id NodeID, edit CapsEdit, a Audit, requestID string) (NodeView, error) {
	if err := a.validate(&edit); err != nil {
		return NodeView{}, err
	}
	return e.setCaps(sid, id, edit, a, requestID)
}

// record applies the audit side of an EvCapsSet or EvCapsReverted to n: the
// trail grows, and the pending reverts follow the caps edited.
func (e *Engine) record(n *node, ev *Event) {
	c := CapsChange{Seq: ev.Seq, At: ev.At, New: ev.Caps.canonical(), Revert: ev.Kind == EvCapsReverted}
	if ev.Audit != nil {
		c.Who, c.Reason, c.Old, c.Until = ev.Audit.Who, ev.Audit.Reason, ev.Audit.Old.canonical(), ev.Audit.Until
	}
	n.audit = append(n.audit, c)
	if len(n.audit) > AuditKeep {
		n.audit = slices.Delete(n.audit, 0, len(n.audit)-AuditKeep)
	}
	for _, side := range []struct {
		limit bool
		m     map[string]int64
	}{{false, ev.Caps.Quotas}, {true, ev.Caps.Limits}} {
		for k, v := range side.m {
			key := overrideKey{side.limit, k}
			if c.Until == 0 || c.Revert {
				delete(n.overrides, key)
				continue
			}
			o, pending := n.overrides[key]
			if !pending {
				o = Override{Limit: side.limit, Name: k, Restore: c.Old.valueOf(side.limit, k)}
			}
			o.Until, o.Override = c.Until, v
			if n.overrides == nil {
				n.overrides = make(map[overrideKey]Override)
			}
			n.overrides[key] = o
		}
	}
	if len(n.overrides) > 0 {
		e.overridden[n.id] = n
	} else {
		delete(e.overridden, n.id)
	}
}

// canonical is a copy of c with empty maps as nil, as a snapshot's JSON
// round trip gives them back.
func (c CapsEdit) canonical() CapsEdit {
	c = c.clone()
	c.Quotas, c.Limits = nilIfEmpty(c.Quotas), nilIfEmpty(c.Limits)
	c.DefaultQuotas, c.DefaultLimits = nilIfEmpty(c.DefaultQuotas), nilIfEmpty(c.DefaultLimits)
	if len(c.QuotaModes) == 0 {
		c.QuotaModes = nil
	}
	if len(c.LimitModes) == 0 {
		c.LimitModes = nil
	}
	if len(c.Minimums) == 0 {
		c.Minimums = nil
	}
	return c
}

func (c CapsEdit) valueOf(limit bool, name string) int64 {
	m := c.Quotas
	if limit {
		m = c.Limits
	}
	if v, ok := m[name]; ok {
		return v
	}
	return NoCap
}

func (e *Engine) applyCapsReverted(ev *Event) error {
	n := e.nodes[ev.Node]
	if n == nil || ev.Caps == nil {
		return fmt.Errorf("%w: revert of caps on node %d", ErrCorrupt, ev.Node)
	}
	for _, m := range []struct {
		limit bool
		m     map[string]int64
	}{{false, ev.Caps.Quotas}, {true, ev.Caps.Limits}} {
		for k := range m.m {
			if _, ok := n.overrides[overrideKey{m.limit, k}]; !ok {
				return fmt.Errorf("%w: revert of %s on node %d, which has no override", ErrCorrupt, k, ev.Node)
			}
		}
	}
	n.applyCaps(ev.Caps, e, ev.At, nil)
	e.record(n, ev)
	return nil
}

// revertOverrides puts back, as one EvCapsReverted per node, every override
// whose time has come. Reap calls it.
func (e *Engine) revertOverrides(now int64) {
	if len(e.overridden) == 0 {
		return
	}
	for _, id := range sortedKeys(e.overridden) {
		n := e.overridden[id]
		var edit CapsEdit
		for _, o := range n.sortedOverrides() {
			if o.Until > now {
				continue
			}
			m := &edit.Quotas
			if o.Limit {
				m = &edit.Limits
			}
			if *m == nil {
				*m = make(map[string]int64)
			}
			(*m)[o.Name] = o.Restore
		}
		if edit.Quotas == nil && edit.Limits == nil {
			continue
		}
		old := n.oldValues(&edit)
		e.emit(Event{Kind: EvCapsReverted, At: now, Node: n.id, Caps: &edit,
			Audit: &CapsAudit{Who: WhoGovernord, Reason: "temporary override expired", Old: old}})
		if n.state == Open {
			e.recallUnder(n, "", "")
		}
		// As after any edit of caps, and only then: a dispatch with
		// nothing changed would still move the fair queue's turns, which
		// no event records.
		e.dispatchAll()
	}
}

// nextRevert is when the soonest pending override reverts, or MaxInt64.
func (e *Engine) nextRevert(next int64) int64 {
	for _, n := range e.overridden {
		for _, o := range n.overrides {
			next = min(next, o.Until)
		}
	}
	return next
}

func (n *node) sortedOverrides() []Override {
	out := slices.Collect(maps.Values(n.overrides))
	slices.SortFunc(out, func(a, b Override) int {
		if a.Limit != b.Limit {
			if a.Limit {
				return 1
			}
			return -1
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out
}

// CapsHistory is a node's audit trail, oldest first, and its pending
// overrides, as the session may see them.
func (e *Engine) CapsHistory(sid SessionID, id NodeID) ([]CapsChange, []Override, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	n, err := e.sessionTarget(sid, id, e.tick())
	if err != nil {
		return nil, nil, err
	}
	out := make([]CapsChange, len(n.audit))
	for i, c := range n.audit {
		c.Old, c.New = c.Old.clone(), c.New.clone()
		out[i] = c
	}
	return out, n.sortedOverrides(), nil
}

// Lookup resolves a path of open nodes' names from the root
// ("payments/checkout-42"), as the session may see it: a node outside its
// scope is not found.
func (e *Engine) Lookup(sid SessionID, path string) (NodeView, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	s, err := e.session(sid, e.tick())
	if err != nil {
		return NodeView{}, err
	}
	n := e.root
	for _, name := range strings.Split(strings.Trim(path, "/"), "/") {
		if name == "" {
			return NodeView{}, invalid("path %q has an empty name", path)
		}
		next := n.open[name]
		if next == nil {
			return NodeView{}, fmt.Errorf("%w: no open node at %q", ErrNotFound, path)
		}
		n = next
	}
	if !n.within(s.scope) {
		return NodeView{}, fmt.Errorf("%w: no open node at %q", ErrNotFound, path)
	}
	return n.view(), nil
}

// auditSnapshot is n's trail and pending reverts, for a snapshot; ok is
// false when it has neither.
func (n *node) auditSnapshot() (NodeAudit, bool) {
	if len(n.audit) == 0 && len(n.overrides) == 0 {
		return NodeAudit{}, false
	}
	na := NodeAudit{Node: n.id}
	if len(n.overrides) > 0 {
		na.Overrides = n.sortedOverrides()
	}
	for _, c := range n.audit {
		c.Old, c.New = c.Old.clone(), c.New.clone()
		na.Changes = append(na.Changes, c)
	}
	return na, true
}

// restoreAudit installs a snapshot's trails and pending reverts on nodes.
func restoreAudit(nodes map[NodeID]*node, audits []NodeAudit) (map[NodeID]*node, error) {
	overridden := make(map[NodeID]*node)
	for _, na := range audits {
		n := nodes[na.Node]
		if n == nil || n.audit != nil || n.overrides != nil || len(na.Changes) > AuditKeep {
			return nil, fmt.Errorf("%w: snapshot audit of node %d", ErrCorrupt, na.Node)
		}
		n.audit = slices.Clone(na.Changes)
		for _, o := range na.Overrides {
			key := overrideKey{o.Limit, o.Name}
			if _, dup := n.overrides[key]; dup || o.Name == "" {
				return nil, fmt.Errorf("%w: snapshot override of %q on node %d", ErrCorrupt, o.Name, na.Node)
			}
			if n.overrides == nil {
				n.overrides = make(map[overrideKey]Override)
			}
			n.overrides[key] = o
		}
		if len(n.overrides) > 0 {
			overridden[n.id] = n
		}
	}
	return overridden, nil
}
