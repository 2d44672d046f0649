package budget

import (
	"context"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/sidecar/admission"
)

// CapStatus reads from governord where the caps over subtask's node stand
// (admission.CapReader): one GetCapStatus call, so the numbers are
// governord's own at that instant, reserved units included.
func (a *Admitter) CapStatus(ctx context.Context, subtask string) (admission.CapReport, error) {
	s := a.cur.Load()
	if s == nil {
		return admission.CapReport{}, errNoSession
	}
	n, err := s.node(ctx, subtask)
	if err != nil {
		return admission.CapReport{}, err
	}
	id := n.t.ID()
	if subtask != "" {
		n.unuse() // only its id was needed
	}
	rep, err := s.client.Raw().GetCapStatus(ctx, &governorpb.GetCapStatusRequest{NodeId: id})
	if err != nil {
		return admission.CapReport{}, err
	}
	var out admission.CapReport
	for _, c := range rep.GetCaps() {
		out.Caps = append(out.Caps, admission.CapState{Node: c.GetNodeName(), Limit: c.GetLimit(), Name: c.GetName(),
			Mode: c.GetMode().GetMode(), Cap: c.GetCap(), Used: c.GetUsed(), Remaining: c.GetRemaining(),
			State: c.GetState(), Threshold: int(c.GetThreshold())})
	}
	return out, nil
}
