package budget

import (
	"context"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/sidecar/admission"
)

// DryRun asks governord how it would answer r now, charging and holding
// nothing (admission.DryRunner): one DryRun call on r's node.
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
	resp, err := s.client.Raw().DryRun(ctx, &governorpb.DryRunRequest{NodeId: id, Class: r.Class, Charges: r.Charges, Write: r.Write})
	if err != nil {
		return admission.DryRunResult{}, err
	}
	return admission.DryRunResult{Outcome: resp.GetOutcome(), Message: resp.GetMessage()}, nil
}
