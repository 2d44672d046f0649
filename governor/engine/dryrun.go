package engine

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
// The error return is for a request that cannot be decided at all (no
// session, out of scope, invalid); refusals are in DryRun.Err.
func (e *Engine) DryRun(sid SessionID, r AcquireRequest) (DryRun, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.now()
	s, err := e.session(sid, now)
	if err != nil {
		return DryRun{}, err
	}
	charges, err := normalizeCharges(r.Charges)
	if err != nil {
		return DryRun{}, err
	}
	if r.Class != "" {
		if err := validName("lease class", r.Class); err != nil {
			return DryRun{}, err
		}
	}
	n, err := e.target(s, r.Node)
	if err != nil {
		return DryRun{}, err
	}
	for a := n; a != nil; a = a.parent {
		if a.state != Open || (a.deadline != 0 && now >= a.deadline) {
			ended := a.ended()
			if a.state == Open {
				ended.State, ended.Deadline = Expired, true
			}
			return DryRun{Err: ended}, nil
		}
	}
	if err := n.admits(r.Write, false); err != nil {
		return DryRun{Err: err}, nil
	}
	if err := n.checkAll(charges); err != nil {
		if d, ok := err.(*Denial); ok {
			d.seenBy(e, s.scope)
			return DryRun{Err: d}, nil
		}
		return DryRun{Err: ErrRecalling}, nil
	}
	return DryRun{Wait: r.Class != "" && !n.fits(r.Class)}, nil
}
