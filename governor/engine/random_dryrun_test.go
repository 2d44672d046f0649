package engine

import (
	"errors"
	"fmt"
	"maps"
	"slices"
)

// The randomized driver's dry runs (dryrun.go): every answer of DryRun is
// the one the model decides for the same request at that instant, and a
// dry run changes nothing. Writes on read_only tenants are common: when a
// tenant is read_only, half the dry runs are writes below it.

// dryRunOp is, at most steps, one DryRun, and now and then the operator
// making a tenant read_only or active again, so that most histories have
// read_only tenants to ask about; all drawn from dry, a stream of its own,
// so that each seed's other draws stay as they were.
func (w *world) dryRunOp() {
	if w.dry.Intn(250) == 0 {
		w.readOnlyOp()
	}
	if w.dry.Intn(3) != 0 {
		return
	}
	sid, n, ok := w.dryRunTarget()
	if !ok {
		return
	}
	r := AcquireRequest{Node: n, Write: w.dry.Intn(3) == 0}
	if w.m.tstate[w.m.tenantOf(n)] == ReadOnly {
		r.Write = w.dry.Intn(4) > 0
	}
	if w.dry.Intn(2) == 0 {
		r.Class = classes[w.dry.Intn(len(classes))]
	}
	shadow := w.dry.Intn(3) == 0
	if k := w.dry.Intn(3); k > 0 {
		r.Charges = map[string]int64{}
		for range k {
			res := resources[w.dry.Intn(len(resources))]
			r.Charges[res] = 1 + w.dry.Int63n(8)
		}
		for _, res := range slices.Sorted(maps.Keys(r.Charges)) {
			r.Charges[res] = w.hostileAmount(r.Charges[res], w.m.fullest(n, res, shadow))
		}
	}
	before := w.e.Seq()
	dr, err := w.e.DryRun(sid, r, shadow)
	// Decided after the call: the periods' resets due, which the call
	// emits first, are then in the model too.
	want := w.m.dryRun(r, shadow, w.clock.Now().UnixNano())
	what := fmt.Sprintf("dry run s%d n%d %q %v write %v shadow %v", sid, n, r.Class, r.Charges, r.Write, shadow)
	w.logf("%s -> %+v %v; the model: %s", what, dr, err, want)
	if errors.Is(err, ErrUnauthenticated) || errors.Is(err, ErrSessionExpired) {
		return
	}
	if w.e.Seq() != w.afterResets(before) {
		w.fail("%s emitted events %d..%d", what, before+1, w.e.Seq())
	}
	if got := dryRunAnswer(dr, err); got != want {
		w.fail("%s answered %s; the model says %s", what, got, want)
	}
	if r.Write && errors.Is(dr.Err, ErrTenantState) {
		w.tally.dryRunWritesRefused++
	}
}

// readOnlyOp is the operator's configuration making an open tenant
// read_only, or a read_only one active again.
func (w *world) readOnlyOp() {
	var open []NodeID
	for _, t := range w.tenants {
		if st, kept := w.m.state[t]; kept && st == Open {
			open = append(open, t)
		}
	}
	if len(open) == 0 {
		return
	}
	t, st := open[w.dry.Intn(len(open))], ReadOnly
	if w.m.tstate[t] == ReadOnly {
		st = Active
	}
	before := w.e.Seq()
	_, err := w.e.SetTenantState(System, t, st, "dry runs", false, "")
	w.expect(fmt.Sprintf("tenant state of n%d %s, for dry runs", t, st), before, err, ErrTaskEnded)
}

// dryRunTarget picks a session and a node in its scope: one below a
// read_only tenant, when a session can reach one, half the time.
func (w *world) dryRunTarget() (SessionID, NodeID, bool) {
	var sids []SessionID
	for _, sid := range w.sessions {
		if _, open := w.m.scope[sid]; open {
			sids = append(sids, sid)
		}
	}
	slices.Sort(sids)
	if len(sids) == 0 {
		return 0, 0, false
	}
	sid := sids[w.dry.Intn(len(sids))]
	var in, readOnly []NodeID
	for _, id := range w.nodes {
		if _, kept := w.m.state[id]; !kept || !w.m.inside(id, w.scope[sid]) {
			continue
		}
		in = append(in, id)
		if w.m.tstate[w.m.tenantOf(id)] == ReadOnly {
			readOnly = append(readOnly, id)
		}
	}
	switch {
	case len(readOnly) > 0 && w.dry.Intn(2) == 0:
		return sid, readOnly[w.dry.Intn(len(readOnly))], true
	case len(in) > 0:
		return sid, in[w.dry.Intn(len(in))], true
	}
	return 0, 0, false
}

// dryRunAnswer writes out a DryRun's answer as the model's is written.
func dryRunAnswer(dr DryRun, err error) string {
	var ended *EndedError
	var ts *TenantStateError
	var d *Denial
	var re *RateError
	switch {
	case errors.Is(err, ErrInvalid):
		return "invalid"
	case err != nil:
		return "error " + err.Error()
	case errors.As(dr.Err, &ended):
		return fmt.Sprintf("ended at n%d (%s, deadline %v)", ended.Node, ended.State, ended.Deadline)
	case errors.As(dr.Err, &ts):
		return fmt.Sprintf("refused by %s for %s", ts.State, ts.What)
	case errors.As(dr.Err, &d):
		return fmt.Sprintf("denied %d of %s at n%d (%d of %d)", d.Amount, d.Resource, d.Node, d.Used, d.Limit)
	case errors.Is(dr.Err, ErrRecalling):
		return "recalling"
	case errors.As(dr.Err, &re):
		return fmt.Sprintf("rate limited %d of %s at n%d, retry after %v", re.Amount, re.Resource, re.Node, re.RetryAfter)
	case dr.Err != nil:
		return "refused " + dr.Err.Error()
	}
	return fmt.Sprintf("admitted, wait %v", dr.Wait)
}

// dryRun is SPEC.md's dry run of r at now, from the model: a request on a
// node whose chain has ended or passed a deadline is ended at the lowest
// such node (as it ended, or expired when only its deadline has passed);
// then its tenant's state; then each charge, in name order, as
// a consume would be decided (counting the shadow ledger as spent when
// shadow is set), an amount past what a counter holds being invalid
// whatever the others say; else admitted, waiting when a limit on the
// chain is full.
func (m *model) dryRun(r AcquireRequest, shadow bool, now int64) string {
	for _, a := range r.Charges {
		if a <= 0 {
			return "invalid"
		}
	}
	for _, a := range m.chain(r.Node) {
		if st := m.state[a]; st != Open {
			return fmt.Sprintf("ended at n%d (%s, deadline %v)", a, st, st == Expired)
		}
		if m.deadline[a] != 0 && now >= m.deadline[a] {
			return fmt.Sprintf("ended at n%d (%s, deadline true)", a, Expired)
		}
	}
	if t := m.tenantOf(r.Node); t != RootID {
		switch st := m.tstate[t]; {
		case st == Suspended:
			return fmt.Sprintf("refused by %s for new work", st)
		case st == ReadOnly && r.Write:
			return fmt.Sprintf("refused by %s for a write", st)
		}
	}
	refusal := ""
	for _, res := range slices.Sorted(maps.Keys(r.Charges)) {
		amount := r.Charges[res]
		if m.quotaOverflows(r.Node, res, amount, shadow) {
			return "invalid"
		}
		if refusal == "" {
			refusal = m.chargeRefusal(r.Node, res, amount, shadow)
		}
	}
	if refusal != "" {
		return refusal
	}
	if !shadow { // a shadow rule's ledger counts no rate
		if refusal = m.rateRefusal(r.Node, r.Charges, now); refusal != "" {
			return refusal
		}
	}
	return fmt.Sprintf("admitted, wait %v", r.Class != "" && !m.fits(r.Node, r.Class))
}

// chargeRefusal is how a charge of amount of r on id is refused, counting
// the shadow ledger as spent when shadow is set: denied at the lowest node
// whose spent units (and ledger) leave no room, or recalling when only
// reservations are in the way; "" when it fits.
func (m *model) chargeRefusal(id NodeID, r string, amount int64, shadow bool) string {
	recall := false
	for _, a := range m.chain(id) {
		q, refuses := m.refusesAt(a, false, r)
		if !refuses {
			continue
		}
		want, ledger := amount, int64(0)
		if shadow {
			ledger = m.shadow[a][r]
			want = upToMax(amount, ledger) // the root's ledger saturates
		}
		switch used := m.spent(a, r); {
		case want > q-used:
			return fmt.Sprintf("denied %d of %s at n%d (%d of %d)", amount, r, a, upToMax(used, ledger), q)
		case want > q-used-m.reserved[a][r]:
			recall = true
		}
	}
	if recall {
		return "recalling"
	}
	return ""
}
