package budget

import (
	"context"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/internal/retry"
	"github.com/governor-project/governor/sidecar/admission"
)

// DryRun asks governord how it would answer r had its rule been enforced,
// charging and holding nothing (admission.DryRunner): one DryRun call on
// r's node that records r's charges, when it would be admitted, in the
// shadow ledger, so a run of shadow requests is refused where the same run
// enforced would be (docs/policy.md).
func (a *Admitter) DryRun(ctx context.Context, r admission.Request) (admission.DryRunResult, error) {
	s := a.cur.Load()
	if s == nil {
		return admission.DryRunResult{}, errNoSession
	}
	n, err := s.node(ctx, r.Subtask)
	if err != nil {
		return admission.DryRunResult{}, err
	}
	id := n.t.ID()
	if r.Subtask != "" {
		n.unuse() // only its id was needed
	}
	resp, err := s.client.Raw().DryRun(ctx, &governorpb.DryRunRequest{NodeId: id, Class: r.Class, Charges: r.Charges, Write: r.Write,
		Record: true, RequestId: retry.RequestID()})
	if err != nil {
		return admission.DryRunResult{}, err
	}
	return admission.DryRunResult{Outcome: resp.GetOutcome(), Message: resp.GetMessage()}, nil
}
