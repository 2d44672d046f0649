// Package tenantstate reads the state a tenant is in (active, suspended,
// read_only, closing), why, who set it and since when, and says it in the
// one form the operator's tools print it in (governor caps get, doctor and
// top). It imports the generated API only.
package tenantstate

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/governor-project/governor/api/governorpb"
)

// Active is the state of a tenant that refuses nothing.
const Active = "active"

// State is a tenant's state as the operator sees it.
type State struct {
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
	// By and Since are who set the state and when, from the last change of
	// state in the tenant's audit trail; empty and zero when the trail
	// holds none (never changed, or past the changes it keeps).
	By    string    `json:"by,omitempty"`
	Since time.Time `json:"since,omitzero"`
	// Refuses is what the state refuses, in words; empty for active.
	Refuses string `json:"refuses,omitempty"`
}

// refused is what each state refuses, as governord applies it, and the
// verb that goes with it.
var refused = map[string]struct{ what, verb string }{
	"suspended": {"all new work", "is"}, "read_only": {"new writes", "are"}, "closing": {"new tasks", "are"}}

// Of reads the state of n, a tenant: its own fields, and who set it and
// when from its audit trail (one GetCapsHistory). ok is false for a node
// that is not a tenant.
func Of(ctx context.Context, rpc governorpb.GovernorClient, n *governorpb.Node) (s State, ok bool, err error) {
	if n.GetKind() != governorpb.NodeKind_NODE_KIND_TENANT {
		return State{}, false, nil
	}
	s = State{State: n.GetTenantState(), Reason: n.GetTenantStateReason()}
	if s.State == "" {
		s.State = Active
	}
	s.Refuses = refused[s.State].what
	h, err := rpc.GetCapsHistory(ctx, &governorpb.GetCapsHistoryRequest{NodeId: n.GetId()})
	if err != nil {
		return s, true, fmt.Errorf("the audit trail of %q: %w", n.GetName(), err)
	}
	changes := h.GetChanges()
	for i := len(changes) - 1; i >= 0; i-- {
		if c := changes[i]; c.GetNewState() != "" {
			if c.GetNewState() == s.State {
				s.By, s.Since = c.GetWho(), c.GetAt().AsTime()
			}
			break
		}
	}
	return s, true, nil
}

// Text says the state in one line, its age counted to now:
//
//	suspended by admin since 2026-12-04 14:20:31 UTC (3m12s ago): "incident 42"; all new work is refused
func (s State) Text(now time.Time) string {
	out := s.State
	if s.By != "" {
		out += fmt.Sprintf(" by %s since %s (%s ago)", s.By, s.Since.UTC().Format(time.DateTime+" MST"), now.Sub(s.Since).Round(time.Second))
	}
	if s.Reason != "" {
		out += ": " + strconv.Quote(s.Reason)
	}
	if s.Refuses != "" {
		out += fmt.Sprintf("; %s %s refused", s.Refuses, refused[s.State].verb)
		if s.By == "" {
			out += " (who set it, and when, is past the changes its audit trail keeps)"
		}
	}
	return out
}
