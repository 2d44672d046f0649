package budget

import (
	"context"

	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/proxy/admission"
)

// DryRun asks governord how it would answer r had its rule been enforced,
// charging and holding nothing (admission.DryRunner): one dry run on r's
// node that records r's charges, when it would be admitted, in the shadow
// ledger, so a run of shadow requests is refused where the same run
// enforced would be (docs/policy.md). The SDK retries it under one request
// id, so a lost answer neither loses the record nor makes it twice.
func (a *Admitter) DryRun(ctx context.Context, r admission.Request) (admission.DryRunResult, error) {
	s := a.cur.Load()
	if s == nil {
		return admission.DryRunResult{}, errNoSession
	}
	n, err := s.node(ctx, r.Subtask)
	if err != nil {
		return admission.DryRunResult{}, err
	}
	if r.Subtask != "" {
		defer n.unuse()
	}
	v, err := n.t.DryRun(ctx, governor.Work{Class: r.Class, Charges: r.Charges, Write: r.Write}, governor.LedgerRecorded)
	if err != nil {
		return admission.DryRunResult{}, err
	}
	return admission.DryRunResult{Outcome: v.Outcome, Message: v.Message}, nil
}

// CheckWrite tells whether r, a write, may go on in work admitted as a
// read (admission.WriteChecker): a transaction whose lease a SELECT took
// and which now writes, with nothing new to admit. It returns the refusal
// a write gets while r's tenant is read_only (or suspended), or nil. With
// delegated budgets it is what the node's last top-up said of the tenant
// (a change of state recalls them, so a lease taken after it had a top-up
// that said so); without, governord is asked in a dry run.
func (a *Admitter) CheckWrite(ctx context.Context, r admission.Request) error {
	s := a.cur.Load()
	if s == nil {
		return errNoSession
	}
	n, err := s.node(ctx, r.Subtask)
	if err != nil {
		return err
	}
	if r.Subtask != "" {
		defer n.unuse()
	}
	if a.cfg.Delegate {
		return n.ts.refusesWrites()
	}
	v, err := n.t.DryRun(ctx, governor.Work{Write: true}, governor.LedgerIgnored)
	if err != nil {
		return err
	}
	if v.Tenant != nil && v.Tenant.State == "read_only" {
		return v.Tenant // a suspension refuses new work, not what runs already
	}
	return nil
}
