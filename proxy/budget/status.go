package budget

import (
	"context"
	"maps"

	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/proxy/admission"
)

// CapStatus reads from governord where the caps over subtask's node stand
// (admission.CapReader): one GetCapStatus call (up to statusTries while
// the session's reservations move), so the numbers are governord's own at
// that instant, as a caller of this sidecar can use them. governord counts
// what it reserved for the session as used; the units of it the sidecar
// holds unspent are this sidecar's callers' to take, so they count as left
// (spent units not yet settled, and units a request holds, stay used).
// With shadow, each quota's shadow ledger counts as spent, as a shadow
// rule's dry runs count it.
func (a *Admitter) CapStatus(ctx context.Context, subtask string, shadow bool) (admission.CapReport, error) {
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
	// What is held unspent is read before and after governord's answer.
	// While a top-up or a give-back is under way the answer may count it
	// or not: top-ups under way are waited for, and the reading is taken
	// again, up to statusTries times, until nothing moved across it; else
	// the smaller of the two readings is taken off (never more than was
	// held all along).
	var caps []governor.CapStatus
	var before, after unspentUnits
	for try := 1; ; try++ {
		s.awaitTopUps(ctx)
		before = s.unspent(n)
		ledger := governor.LedgerIgnored
		if shadow {
			ledger = governor.LedgerCounted
		}
		caps, err = n.t.CapStatus(ctx, ledger)
		if err != nil {
			return admission.CapReport{}, err
		}
		after = s.unspent(n)
		if before.still(after) || try == statusTries {
			break
		}
	}
	var out admission.CapReport
	for _, c := range caps {
		st := admission.CapState{NodeID: c.NodeID, Node: c.NodeName, Limit: c.Limit, Name: c.Name,
			Mode: c.Mode, Cap: c.Cap, Used: c.Used, Remaining: c.Remaining, State: c.State, Threshold: c.Threshold,
			Period: c.Period, ResetAt: c.ResetAt}
		if !st.Limit {
			if own := min(before.under(st.NodeID, st.Name), after.under(st.NodeID, st.Name)); own > 0 {
				st.Used = max(st.Used-own, 0)
				st.Remaining = max(st.Cap-st.Used, 0)
			}
		}
		out.Caps = append(out.Caps, st)
	}
	return out, nil
}

// statusTries bounds the GetCapStatus calls of one CapStatus.
const statusTries = 3

// unspentUnits are the units the session holds reserved and unspent, by
// resource: on one node, and on all of its nodes.
type unspentUnits struct {
	node     int64 // a subtask's id; 0 for the task
	onNode   map[string]int64
	allNodes map[string]int64
	moving   bool // a top-up or a give-back was under way
}

// still reports whether nothing moved between u and a later reading v.
func (u unspentUnits) still(v unspentUnits) bool {
	return !u.moving && !v.moving && maps.Equal(u.allNodes, v.allNodes)
}

// under is what of resource is held unspent in the subtree of the node
// with id, one on n's chain: n itself when n is a subtask, else (the task
// or above) every node of the session.
func (u unspentUnits) under(id int64, resource string) int64 {
	if u.node != 0 && id == u.node {
		return u.onNode[resource]
	}
	return u.allNodes[resource]
}

// awaitTopUps waits until the top-ups of the session's reservations that
// are under way have their answers, or ctx ends.
func (s *session) awaitTopUps(ctx context.Context) {
	var flights []*flight
	s.each(func(m *node) {
		_, quota := m.holdings()
		for _, q := range quota {
			q.mu.Lock()
			if f := q.topUp; f != nil {
				flights = append(flights, f)
			}
			q.mu.Unlock()
		}
	})
	for _, f := range flights {
		select {
		case <-f.done:
		case <-ctx.Done():
			return
		}
	}
}

// unspent reads what the session holds unspent, for n's chain.
func (s *session) unspent(n *node) unspentUnits {
	u := unspentUnits{onNode: map[string]int64{}, allNodes: map[string]int64{}}
	if n != s.task {
		u.node = n.t.ID()
	}
	s.each(func(m *node) {
		_, quota := m.holdings()
		for _, q := range quota {
			k, moving := q.unspentNow()
			u.allNodes[q.resource] += k
			u.moving = u.moving || moving
			if m == n {
				u.onNode[q.resource] += k
			}
		}
	})
	return u
}
