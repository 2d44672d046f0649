package engine

import (
	"errors"
	"fmt"
	"slices"
)

// The randomized driver's side of tenant states (tenantstate.go): an
// operator changes a tenant's state now and then (mostly back to active,
// sometimes revoking its leases), a tenant's own session tries and is
// refused, and every refusal for a tenant's state is checked against the
// model's state of that tenant.

// policyOp is, now and then, a tenantStateOp by a random session.
func (w *world) policyOp() {
	if w.policy.Intn(40) != 0 {
		return
	}
	var sids []SessionID
	for sid := range w.scope {
		sids = append(sids, sid)
	}
	if len(sids) == 0 {
		return
	}
	slices.Sort(sids)
	w.tenantStateOp(sids[w.policy.Intn(len(sids))], w.e.Seq())
}

// tenantStateOp changes a random tenant's state as the operator, or tries
// to as the tenant itself.
func (w *world) tenantStateOp(sid SessionID, before uint64) {
	t := w.tenants[w.policy.Intn(len(w.tenants))]
	st := Active
	switch r := w.policy.Intn(10); {
	case r < 2:
		st = Suspended
	case r < 4:
		st = ReadOnly
	case r < 5:
		st = Closing
	}
	revoke := w.policy.Intn(4) == 0
	rid := w.reqID()
	_, err := w.e.SetTenantState(sid, t, st, "incident", revoke, rid)
	w.expect(fmt.Sprintf("tenant state s%d n%d %s revoke=%v %q", sid, t, st, revoke, rid), before, err, ErrPermission, ErrNotFound, ErrTaskEnded)
	switch scope := w.scope[sid]; {
	case errors.Is(err, ErrUnauthenticated), errors.Is(err, ErrSessionExpired):
	case scope == t && !errors.Is(err, ErrPermission):
		w.fail("tenant %d set its own state: %v", t, err)
	case scope != RootID && scope != t && !errors.Is(err, ErrNotFound):
		w.fail("session %d (scope %d) set the state of tenant %d: %v", sid, scope, t, err)
	}
}

// checkTenantRefusal checks a refusal for a tenant's state: the tenant is,
// as the model has it, in the state the error names, and that state
// refuses what the error says was refused.
func (w *world) checkTenantRefusal(what string, err error) {
	var te *TenantStateError
	if !errors.As(err, &te) {
		w.fail("%s: %v matches ErrTenantState but is no *TenantStateError", what, err)
		return
	}
	for _, t := range w.tenants {
		if n := w.e.nodes[t]; n == nil || n.name != te.Tenant {
			continue
		}
		st := w.m.tstate[t]
		refused := map[string]TenantState{"new work": Suspended, "a write": ReadOnly, "a new task": Closing}[te.What]
		if st != te.State || st != refused || st == Active {
			w.fail("I21 tenant state: %s refused (%v) while the model has tenant %d %s", what, err, t, st)
		}
		return
	}
	w.fail("%s: refused for tenant %q, which the driver does not know", what, te.Tenant)
}
