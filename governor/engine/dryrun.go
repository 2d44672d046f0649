package engine

import (
	"errors"
	"math"
)

// DryRun is a request decided as Acquire would decide it at this instant,
// with nothing charged, held, queued or ended: what a shadow rule of the
// sidecar asks (docs/policy.md).
type DryRun struct {
	// Err is the refusal Acquire would answer: a *Denial (a quota spent,
	// as the session may see it), an *EndedError, a *TenantStateError,
	// ErrRecalling; nil when it would be admitted or would wait.
	Err error
	// Wait is true when a lease would have to queue: a limit on the chain
	// is full now.
	Wait bool
}

// DryRun decides r as Acquire would, changing nothing and emitting
// nothing: a node past its deadline reads as ended without being ended.
// With shadow, the shadow ledger counts as spent, as Shadow counts it, but
// nothing is recorded. The error return is for a request that cannot be
// decided at all (no session, out of scope, invalid); refusals are in
// DryRun.Err.
func (e *Engine) DryRun(sid SessionID, r AcquireRequest, shadow bool) (DryRun, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.tick()
	s, charges, err := e.sessionCharges(sid, r.Charges, now)
	if err != nil {
		return DryRun{}, err
	}
	dr, _, err := e.dryRun(s, now, r, charges, shadow)
	return dr, err
}

// Shadow is a shadow rule's request: decided as DryRun decides it, but
// against what the shadow requests before it would have charged too, had
// they been enforced, and, when it would have been admitted, its charges
// go into the shadow ledger (EvShadowCharged), which nothing real is
// checked against. So a run of requests through a rule in shadow is
// refused exactly where the same run through the rule enforced would be,
// as far as quotas decide (a lease's wait is not simulated: Wait says a
// limit is full of real holders now). A retry with the same requestID
// after it was recorded answers admitted and records nothing more.
func (e *Engine) Shadow(sid SessionID, r AcquireRequest, requestID string) (DryRun, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.tick()
	s, charges, err := e.sessionCharges(sid, r.Charges, now)
	if err != nil {
		return DryRun{}, err
	}
	fp := uint64(0)
	if requestID != "" {
		fp = fingerprintCharges(opShadow, r.Node, r.Class, charges)
		if _, ok, err := s.requests.lookup(requestID, fp); ok || err != nil {
			return DryRun{}, err
		}
	}
	dr, n, err := e.dryRun(s, now, r, charges, true)
	if err != nil || dr.Err != nil || len(charges) == 0 {
		return dr, err
	}
	// The ledger's names are bounded as the tenant's real ones are, so a
	// tenant's dry runs cannot grow it without end.
	var fresh []string
	for _, c := range charges {
		if _, known := n.tenant.shadow[c.Resource]; !known {
			fresh = append(fresh, c.Resource)
		}
	}
	if err := e.checkNames(n.tenant, BoundResources, len(n.tenant.shadow), fresh); err != nil {
		return DryRun{}, err
	}
	e.emit(Event{Kind: EvShadowCharged, At: now, Session: s.id, Node: n.id, Charges: charges, Write: r.Write,
		RequestID: requestID, Fingerprint: fp})
	return dr, nil
}

// dryRun decides r, whose charges are normalized, for DryRun and Shadow
// (shadow: counting the shadow ledger) at now, returning the node it is
// for.
func (e *Engine) dryRun(s *session, now int64, r AcquireRequest, charges []Charge, shadow bool) (DryRun, *node, error) {
	if r.Class != "" {
		if err := validName("lease class", r.Class); err != nil {
			return DryRun{}, nil, err
		}
	}
	n, err := e.target(s, r.Node)
	if err != nil {
		return DryRun{}, nil, err
	}
	for a := n; a != nil; a = a.parent {
		if a.state != Open || (a.deadline != 0 && now >= a.deadline) {
			ended := a.ended()
			if a.state == Open {
				ended.State, ended.Deadline = Expired, true
			}
			return DryRun{Err: ended}, n, nil
		}
	}
	if err := n.admits(r.Write, false); err != nil {
		return DryRun{Err: err}, n, nil
	}
	if err := n.checkAllAs(charges, shadow); err != nil {
		if d, ok := err.(*Denial); ok {
			d.seenBy(e, s.scope)
			return DryRun{Err: d}, n, nil
		}
		if errors.Is(err, ErrInvalid) {
			return DryRun{}, nil, err
		}
		return DryRun{Err: ErrRecalling}, n, nil
	}
	if !shadow { // a shadow rule's ledger counts no rate
		if err := n.checkRatesAhead(charges, now, e.aheadOf()); errors.Is(err, ErrInvalid) {
			return DryRun{}, nil, err
		} else if err != nil {
			return DryRun{Err: err}, n, nil
		}
	}
	return DryRun{Wait: r.Class != "" && !n.fits(r.Class)}, n, nil
}

// shadowCharge counts amount of r in the shadow ledger of n's chain.
func (n *node) shadowCharge(r string, amount int64) {
	for a := n; a != nil; a = a.parent {
		if a.shadow == nil {
			a.shadow = make(map[string]int64)
		}
		a.shadow[r] = clampedAdd(a.shadow[r], amount, math.MaxInt64) // exact below the root: checked
	}
}
