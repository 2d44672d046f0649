package engine

import (
	"fmt"
	"slices"
)

// This file holds a tenant's state, the operator's lever in an incident:
// active, suspended (no new work at all), read_only (no new work marked as
// a write) or closing (no new tasks; what runs finishes). A change is an
// EvTenantStateSet, audited in the tenant's trail with who and why, kept by
// snapshots. Leases already granted are left alone unless the change asks
// to revoke them, which apply does, so replay revokes the same ones.

// TenantState is what a tenant may start.
type TenantState uint8

const (
	// Active: as its caps allow (the default).
	Active TenantState = iota
	// Suspended: nothing new (no charge, grant, delegated growth or node);
	// queued acquires fail.
	Suspended
	// ReadOnly: nothing new that is marked as a write (AcquireRequest.Write);
	// queued writes fail.
	ReadOnly
	// Closing: no new tasks; what runs finishes, and its tasks may still
	// work and make subtasks.
	Closing
)

var tenantStateNames = [...]string{Active: "active", Suspended: "suspended", ReadOnly: "read_only", Closing: "closing"}

func (s TenantState) String() string {
	if int(s) < len(tenantStateNames) {
		return tenantStateNames[s]
	}
	return fmt.Sprintf("tenant_state(%d)", uint8(s))
}

// ParseTenantState reads a tenant state's name.
func ParseTenantState(s string) (TenantState, error) {
	if i := slices.Index(tenantStateNames[:], s); i >= 0 {
		return TenantState(i), nil
	}
	return 0, invalid("tenant state %q is not one of active, suspended, read_only, closing", s)
}

// TenantStateError is work refused because of its tenant's state. It
// matches ErrTenantState.
type TenantStateError struct {
	Tenant string
	State  TenantState
	Reason string // the operator's, as audited
	What   string // what was refused: "new work", "a write", "a new task"
}

func (e *TenantStateError) Error() string {
	s := fmt.Sprintf("%s: tenant %q is %s; %s is refused", ErrTenantState, e.Tenant, e.State, e.What)
	if e.Reason != "" {
		s += " (" + e.Reason + ")"
	}
	return s
}

func (e *TenantStateError) Unwrap() error { return ErrTenantState }

// admits refuses work on n that its tenant's state does not allow: write
// marks work classified as a write, task a new node directly under the
// tenant.
func (n *node) admits(write, task bool) error {
	t := n.tenant
	switch {
	case t.parent == nil: // the root: no tenant
		return nil
	case t.tstate == Suspended:
		return t.refusal("new work")
	case t.tstate == ReadOnly && write:
		return t.refusal("a write")
	case t.tstate == Closing && task:
		return t.refusal("a new task")
	}
	return nil
}

// refusal is work (what) refused by the state of n, a tenant.
func (n *node) refusal(what string) *TenantStateError {
	return &TenantStateError{Tenant: n.name, State: n.tstate, Reason: n.tstateWhy, What: what}
}

// writesRefused is the refusal a write on n would get from its tenant's
// state now, or nil: what the answer to a block's growth or a reservation
// carries (BlockGrant.ReadOnly, Reservation.ReadOnly), so that the holder
// refuses writes from them as a call would. It is read from the state at
// that instant, like Contended: no event.
func (n *node) writesRefused() *TenantStateError {
	if t := n.tenant; t.parent != nil && t.tstate == ReadOnly {
		return t.refusal("a write")
	}
	return nil
}

// SetTenantState changes tenant id's state, audited with reason. revoke
// also ends every lease and block below it at once (as revoked); without
// it, running work is left alone. Only a session above the tenant (the
// operator's) may change it.
func (e *Engine) SetTenantState(sid SessionID, id NodeID, st TenantState, reason string, revoke bool, requestID string) (NodeView, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.tick()
	s, err := e.session(sid, now)
	if err != nil {
		return NodeView{}, err
	}
	if st > Closing {
		return NodeView{}, invalid("tenant state %d is not one of active, suspended, read_only, closing", st)
	}
	if len(reason) > MaxReason {
		return NodeView{}, invalid("the reason is %d bytes; at most %d", len(reason), MaxReason)
	}
	fp := fnvString(fingerprint(opTenantState, id, st.String(), 0), reason)
	if revoke {
		fp = fnvAdd(fp, 1)
	}
	if v, done, err := e.remembered(s, requestID, fp, id); done {
		return v, err
	}
	n, err := e.editable(s, id)
	if err != nil {
		return NodeView{}, err
	}
	if n.depth != int(KindTenant) {
		return NodeView{}, invalid("node %d is a %s; only a tenant has a state", id, n.kind())
	}
	if err := e.checkOpen(n, now); err != nil {
		return NodeView{}, err
	}
	was := n.tstate
	e.emit(Event{Kind: EvTenantStateSet, At: now, Session: s.id, Node: n.id, TenantState: st, Revoke: revoke,
		Audit: &CapsAudit{Who: whoOf(s), Reason: reason}, RequestID: requestID, Fingerprint: fp})
	if st == Suspended || st == ReadOnly {
		e.failRefusedWaiters(n)
	}
	if st == Suspended || st == ReadOnly || was == ReadOnly {
		// What the tenant's sessions hold delegated was granted under the
		// old state: have it back, so that each holder tops up and learns
		// the new one (a read_only tenant's blocks and reservations say
		// so: writesRefused), before it grants anything more.
		e.recallUnder(n, "", "")
	}
	e.dispatchAll() // revoked slots, and failed waiters' turns
	return n.view(), nil
}

// failRefusedWaiters fails t's queued acquires that its state now refuses.
func (e *Engine) failRefusedWaiters(t *node) {
	for _, q := range e.tenantQueues(t) {
		for _, w := range slices.Clone(q.waiters) {
			if err := w.node.admits(w.write, false); err != nil {
				e.failWaiter(w, err)
			}
		}
	}
}

func (e *Engine) applyTenantState(ev *Event) error {
	n := e.nodes[ev.Node]
	if n == nil || n.depth != int(KindTenant) || ev.TenantState > Closing {
		return fmt.Errorf("%w: state %v for node %d", ErrCorrupt, ev.TenantState, ev.Node)
	}
	c := CapsChange{Seq: ev.Seq, At: ev.At, OldState: n.tstate.String(), NewState: ev.TenantState.String(), Revoked: ev.Revoke}
	if ev.Audit != nil {
		c.Who, c.Reason = ev.Audit.Who, ev.Audit.Reason
	}
	n.tstate, n.tstateWhy = ev.TenantState, c.Reason
	n.audit = append(n.audit, c)
	if len(n.audit) > AuditKeep {
		n.audit = slices.Delete(n.audit, 0, len(n.audit)-AuditKeep)
	}
	if ev.Revoke {
		var walk func(*node)
		walk = func(m *node) {
			for _, id := range sortedKeys(m.leases) {
				e.endLease(m.leases[id], EndRevoked, ev.At)
			}
			for _, c := range m.children {
				walk(c)
			}
		}
		walk(n)
	}
	return nil
}
