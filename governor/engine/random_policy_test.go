package engine

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"
)

// The randomized driver's side of tenant states (tenantstate.go): an
// operator changes a tenant's state now and then (mostly back to active,
// sometimes revoking its leases), a tenant's own session tries and is
// refused, and every refusal for a tenant's state is checked against the
// model's state of that tenant.

// policyOp is, now and then, a tenantStateOp by a random session, or the
// operator's configuration setting a tenant's minimums.
func (w *world) policyOp() {
	if w.policy.Intn(25) == 0 {
		t := w.tenants[w.policy.Intn(len(w.tenants))]
		if st, ok := w.m.state[t]; !ok || st != Open {
			return
		}
		var edit CapsEdit
		w.randMinimums(&edit, t, true, true)
		before := w.e.Seq()
		_, err := w.e.SetCaps(System, t, edit, "")
		what := fmt.Sprintf("minimums of n%d %v", t, edit.Minimums)
		w.expect(what, before, err, ErrTaskEnded)
		if err == nil {
			w.checkRecalledUnder(what, t)
		}
		return
	}
	if w.policy.Intn(25) == 0 {
		w.modesOp()
		return
	}
	if w.policy.Intn(15) != 0 {
		return
	}
	sids := w.openSessionIDs()
	if len(sids) == 0 {
		return
	}
	w.tenantStateOp(sids[w.policy.Intn(len(sids))], w.e.Seq())
}

// openSessionIDs lists the sessions the driver holds open, sorted, for a
// stream of its own to pick from.
func (w *world) openSessionIDs() []SessionID {
	return slices.Sorted(maps.Keys(w.scope))
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
	case r < 6:
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

// randMinimums adds, now and then, reserved minimums to an edit of a
// tenant (permanent edits only: an override sets none), each within what
// the root's limit leaves over the other tenants' minimums, sometimes with
// a window; and keeps an edit of the root's limits from going under the
// minimums' sum, which the engine refuses.
func (w *world) randMinimums(edit *CapsEdit, n NodeID, permanent, always bool) {
	sum := func(class string, except NodeID) int64 {
		s := int64(0)
		for t, mins := range w.m.mins {
			if t != except && w.m.state[t] == Open {
				s += mins[class].Min
			}
		}
		return s
	}
	if n == RootID {
		for class, v := range edit.Limits {
			if s := sum(class, 0); v != NoCap && v < s {
				edit.Limits[class] = s
			}
		}
		return
	}
	if !permanent || w.m.parent[n] != RootID || (!always && w.policy.Intn(3) != 0) {
		return
	}
	edit.Minimums = map[string]Minimum{}
	for _, class := range classes {
		if w.policy.Intn(2) == 0 {
			continue
		}
		room := int64(3)
		if limit, ok := w.m.limits[RootID][class]; ok {
			room = min(room, max(limit-sum(class, n), 0))
		}
		mn := Minimum{Min: w.policy.Int63n(room + 1)}
		if w.policy.Intn(3) == 0 {
			now := w.clock.Now().UnixNano()
			mn.From = now + int64(w.policy.Intn(3))*int64(time.Second)
			mn.Until = mn.From + int64(1+w.policy.Intn(8))*int64(time.Second)
		}
		edit.Minimums[class] = mn
	}
}

// modesOp is the operator's configuration giving an open node small quotas
// and limits in soft (with a small burst) or warn_only mode, so that
// histories run at and past such caps often.
func (w *world) modesOp() {
	var open []NodeID
	for id, st := range w.m.state {
		if st == Open {
			open = append(open, id)
		}
	}
	if len(open) == 0 {
		return
	}
	slices.Sort(open)
	n := open[w.policy.Intn(len(open))]
	mode := func() CapMode {
		if w.policy.Intn(3) == 0 {
			return CapMode{Mode: ModeWarnOnly}
		}
		return CapMode{Mode: ModeSoft, Burst: w.policy.Int63n(4)}
	}
	r, c := resources[w.policy.Intn(len(resources))], classes[w.policy.Intn(len(classes))]
	edit := CapsEdit{Quotas: map[string]int64{r: 2 + w.policy.Int63n(10)}, QuotaModes: map[string]CapMode{r: mode()}}
	if n != RootID {
		edit.Limits, edit.LimitModes = map[string]int64{c: 1 + w.policy.Int63n(2)}, map[string]CapMode{c: mode()}
	}
	w.randMinimums(&edit, n, true, false) // keeps a root limit within the minimums
	before := w.e.Seq()
	_, err := w.e.SetCaps(System, n, edit, "")
	what := fmt.Sprintf("modes of n%d %+v", n, edit)
	w.expect(what, before, err, ErrTaskEnded)
	if err == nil {
		w.checkRecalledUnder(what, n)
	}
}

// shadowOp is, now and then, a shadow rule's request (Engine.Shadow), or
// a retry of one, from a stream of its own (srng), so that every other
// draw of a seed stays as it was. It checks each answer against the model:
// a quota refusal names a node where what is spent and what the shadow
// ledger holds leave no room for the charge (I23; I1's check of each
// EvShadowCharged is the other half), a recorded request emits exactly its
// EvShadowCharged, and a retry answers admitted and records nothing more.
func (w *world) shadowOp() {
	if w.srng.Intn(4) != 0 {
		return
	}
	if len(w.shadowReqs) > 0 && w.srng.Intn(4) == 0 {
		w.shadowRetry()
		return
	}
	sids := w.openSessionIDs()
	if len(sids) == 0 {
		return
	}
	sid := sids[w.srng.Intn(len(sids))]
	var in []NodeID
	for _, id := range w.nodes {
		if w.m.inside(id, w.scope[sid]) {
			in = append(in, id)
		}
	}
	if len(in) == 0 {
		return
	}
	r := AcquireRequest{Node: in[w.srng.Intn(len(in))], Charges: map[string]int64{}, Write: w.srng.Intn(3) == 0}
	for range 1 + w.srng.Intn(2) {
		r.Charges[resources[w.srng.Intn(len(resources))]] += 1 + w.srng.Int63n(6)
	}
	for _, res := range slices.Sorted(maps.Keys(r.Charges)) {
		r.Charges[res] = w.hostileAmount(r.Charges[res], w.m.fullest(r.Node, res, true))
	}
	if w.srng.Intn(2) == 0 {
		r.Class = classes[w.srng.Intn(len(classes))]
	}
	rid := ""
	if w.srng.Intn(2) == 0 {
		w.nextShadow++
		rid = fmt.Sprintf("sh%d", w.nextShadow)
	}
	before := w.e.Seq()
	invalid := w.m.chargesInvalid(r.Node, r.Charges, true)
	dr, err := w.e.Shadow(sid, r, rid)
	what := fmt.Sprintf("shadow s%d n%d %v write %v %q", sid, r.Node, r.Charges, r.Write, rid)
	w.expect(what, before, err, ErrBound, ErrInvalid)
	w.checkHostile(what, errors.Join(err, dr.Err), invalid)
	w.checkBoundRefusal(what, err, r.Node, names(r.Charges), nil, true)
	if err != nil {
		return
	}
	w.logf("%s -> %v wait %v", what, dr.Err, dr.Wait)
	var d *Denial
	switch {
	case errors.As(dr.Err, &d):
		q, ok := w.m.refusesAt(d.Node, false, d.Resource)
		if want := upToMax(w.m.spent(d.Node, d.Resource), w.m.shadow[d.Node][d.Resource]); !ok || d.Limit != q || d.Used != want ||
			d.Amount <= d.Limit-d.Used || !slices.Contains(w.m.chain(r.Node), d.Node) {
			w.fail("I23 shadow: %s refused by %v; the model has %d spent and in the ledger of %d (enforced %v) there", what, d, want, q, ok)
		}
	case dr.Err != nil:
		w.expect(what, before, dr.Err, ErrTaskEnded, ErrRecalling)
	}
	evs := w.rec.events[w.afterResets(before):]
	if dr.Err != nil {
		if len(evs) != 0 {
			w.fail("%s refused with %v but emitted %d events", what, dr.Err, len(evs))
		}
		return
	}
	if len(evs) != 1 || evs[0].Kind != EvShadowCharged || evs[0].Node != r.Node || len(evs[0].Charges) != len(r.Charges) {
		w.fail("%s admitted, emitting %v; want one EvShadowCharged of its charges", what, evs)
		return
	}
	for _, c := range evs[0].Charges {
		if r.Charges[c.Resource] != c.Amount {
			w.fail("%s recorded %v", what, evs[0].Charges)
		}
	}
	if rid != "" {
		w.shadowReqs = append(w.shadowReqs, shadowReq{sid: sid, id: rid, req: r})
	}
}

// shadowReq is a recorded shadow request with an id, for retries.
type shadowReq struct {
	sid SessionID
	id  string
	req AcquireRequest
}

// shadowRetry sends a recorded shadow request again, with the same
// arguments (admitted, nothing emitted) or, now and then, other ones
// (ErrRequestIDReused).
func (w *world) shadowRetry() {
	i := w.srng.Intn(len(w.shadowReqs))
	r := w.shadowReqs[i]
	if !w.m.Remembers(r.sid, r.id) { // ended, or pushed out by 1,024 later ids
		w.shadowReqs = slices.Delete(w.shadowReqs, i, i+1)
		return
	}
	req, differ := r.req, w.srng.Intn(5) == 0
	if differ {
		req.Charges = maps.Clone(req.Charges)
		req.Charges["tokens"] = otherAmount(req.Charges["tokens"])
	}
	before := w.e.Seq()
	dr, err := w.e.Shadow(r.sid, req, r.id)
	what := fmt.Sprintf("shadow retry s%d %q differ %v", r.sid, r.id, differ)
	if differ {
		w.expect(what, before, err, ErrRequestIDReused)
		if err == nil {
			w.fail("%s: accepted", what)
		}
		return
	}
	w.expect(what, before, err)
	if err == nil && (dr.Err != nil || w.e.Seq() != w.afterResets(before)) {
		w.fail("%s -> %v, events %d..%d; want admitted and nothing emitted", what, dr.Err, before+1, w.e.Seq())
	}
}
