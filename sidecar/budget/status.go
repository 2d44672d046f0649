package budget

import (
	"context"

	"github.com/governor-project/governor/sidecar/admission"
)

// CapStatus reads from governord where the caps over subtask's node stand
// (admission.CapReader): one cap-status read, retried by the SDK while
// governord is unavailable, so the numbers are governord's own at that
// instant, reserved units included.
func (a *Admitter) CapStatus(ctx context.Context, subtask string) (admission.CapReport, error) {
	s := a.cur.Load()
	if s == nil {
		return admission.CapReport{}, errNoSession
	}
	n, err := s.node(ctx, subtask)
	if err != nil {
		return admission.CapReport{}, err
	}
	if subtask != "" {
		defer n.unuse()
	}
	caps, err := n.t.CapStatus(ctx)
	if err != nil {
		return admission.CapReport{}, err
	}
	var out admission.CapReport
	for _, c := range caps {
		out.Caps = append(out.Caps, admission.CapState{Node: c.NodeName, Limit: c.Limit, Name: c.Name,
			Mode: c.Mode, Cap: c.Cap, Used: c.Used, Remaining: c.Remaining, State: c.State, Threshold: c.Threshold})
	}
	return out, nil
}
