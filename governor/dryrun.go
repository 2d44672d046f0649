package governor

import (
	"context"
	"maps"
	"time"

	"github.com/governor-project/governor/api/governorpb"
)

// Questions about a task that admit nothing: how governord would answer
// work now (DryRun), and where the caps over the task stand (CapStatus).
// Like every call of the client they are retried while governord is
// unavailable, and a dry run that records sends one request id across its
// retries, so that a lost answer records it once.

// Work is the work a dry run asks about.
type Work struct {
	// Class is the lease class it would hold; empty for none.
	Class string
	// Charges are what it would charge, each from 1 to MaxAmount.
	Charges map[string]int64
	// Write marks work classified as a write, which a read_only tenant
	// refuses.
	Write bool
}

// ShadowLedger says how a dry run treats the task's shadow ledger: what
// earlier recorded dry runs (a shadow rule's requests) would have charged
// had their rule been enforced.
type ShadowLedger int

const (
	// LedgerIgnored answers as a real request would be answered now:
	// the ledger is not counted, and nothing is recorded.
	LedgerIgnored ShadowLedger = iota
	// LedgerCounted answers counting the ledger as spent, and records
	// nothing: how a shadow rule's next request would be answered.
	LedgerCounted
	// LedgerRecorded answers as LedgerCounted does and, when the work
	// would be admitted, adds its charges to the ledger: a shadow rule's
	// request. A retry records nothing more.
	LedgerRecorded
)

// Verdict is governord's answer to a dry run.
type Verdict struct {
	// Outcome is "admitted", "wait" (a lease would queue: a limit is full
	// now), or the cause a real request would be refused for: "quota",
	// "task-ended", "suspended", "read-only" or "recalling" (a quota held
	// by others' reservations, which would be recalled).
	Outcome string
	// Message says a refusal in words; empty when admitted.
	Message string
	// Denial names the cap that would refuse it, for "quota".
	Denial *Denial
	// Tenant is the tenant's state, for "suspended" and "read-only" (and a
	// closing tenant's refusal of a new task).
	Tenant *TenantStateError
}

// DryRun asks governord how it would answer work on the task at this
// instant, as ChargeAndAcquire would be answered, charging nothing,
// holding nothing and queueing nothing; ledger says whether the shadow
// ledger is counted and recorded to. A refusal is the Verdict's Outcome,
// not an error: an error says governord gave no answer (or refused the
// question: an amount out of range, a task outside the session's scope).
func (t *Task) DryRun(ctx context.Context, w Work, ledger ShadowLedger) (Verdict, error) {
	req := &governorpb.DryRunRequest{NodeId: t.id, Class: w.Class, Charges: maps.Clone(w.Charges), Write: w.Write,
		Record: ledger == LedgerRecorded, Shadow: ledger == LedgerCounted}
	var resp *governorpb.DryRunResponse
	err := t.c.call(ctx, "DryRun", func(ctx context.Context, id string) error {
		req.RequestId = id // what keeps a retry of a recorded dry run from recording twice
		var err error
		resp, err = t.c.rpc.DryRun(ctx, req)
		return err
	})
	if err != nil {
		t.observe(err)
		return Verdict{}, err
	}
	v := Verdict{Outcome: resp.GetOutcome(), Message: resp.GetMessage(), Tenant: tenantRefusal(resp.GetTenantRefusal())}
	if d := resp.GetDenial(); d != nil {
		v.Denial = denialFromProto(d)
	}
	return v, nil
}

// CapStatus is where one cap over a task stands, as governord counts it.
type CapStatus struct {
	NodeID   int64
	NodeName string
	// Limit is true for a limit (a lease class), false for a quota (a
	// resource).
	Limit bool
	// Name is the resource or lease class.
	Name string
	// Mode is "hard" (or empty), "soft" or "warn_only"; Burst is how far
	// past Cap a soft cap lets work go.
	Mode  string
	Burst int64
	Cap   int64
	// Used is what is charged and reserved unspent, for a quota; the
	// slots held, for a limit.
	Used int64
	// Remaining is how much more fits before the cap itself (0 at or past
	// it); a soft cap's burst is not counted.
	Remaining int64
	// State is "within", "near", "soft_exceeded" or "hard_exceeded".
	State string
	// Threshold is the highest near threshold (percent of the cap) Used
	// has reached; 0 when none.
	Threshold int
	// Period is a quota's period ("month", "10s"), and ResetAt when it
	// next resets it (Used counts since the last reset); empty and zero
	// for a quota that never resets and for a limit.
	Period  string
	ResetAt time.Time
}

// CapStatus reads where the caps over the task stand, at one instant at
// governord, reserved units included: from the task up to the root, on
// each node its quotas before its limits, each by name. With
// LedgerCounted each quota's shadow ledger counts as spent, as a shadow
// rule's dry runs count it (LedgerRecorded counts it too; it records
// nothing here).
func (t *Task) CapStatus(ctx context.Context, ledger ShadowLedger) ([]CapStatus, error) {
	var rep *governorpb.CapStatusReport
	err := t.c.call(ctx, "GetCapStatus", func(ctx context.Context, _ string) error {
		var err error
		rep, err = t.c.rpc.GetCapStatus(ctx, &governorpb.GetCapStatusRequest{NodeId: t.id, Shadow: ledger != LedgerIgnored})
		return err
	})
	if err != nil {
		t.observe(err)
		return nil, err
	}
	caps := make([]CapStatus, 0, len(rep.GetCaps()))
	for _, c := range rep.GetCaps() {
		caps = append(caps, CapStatus{NodeID: c.GetNodeId(), NodeName: c.GetNodeName(), Limit: c.GetLimit(), Name: c.GetName(),
			Mode: c.GetMode().GetMode(), Burst: c.GetMode().GetBurst(), Cap: c.GetCap(), Used: c.GetUsed(),
			Remaining: c.GetRemaining(), State: c.GetState(), Threshold: int(c.GetThreshold()), Period: c.GetPeriod()})
		if r := c.GetResetAt(); r != nil {
			caps[len(caps)-1].ResetAt = r.AsTime()
		}
	}
	return caps, nil
}
