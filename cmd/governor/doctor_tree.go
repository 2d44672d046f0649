package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/cli/slots"
	"github.com/governor-project/governor/cli/tenantstate"
)

// treeWalk is the part of the tree a key sees, parents before children.
type treeWalk struct {
	nodes []*governorpb.Node
	byID  map[int64]*governorpb.Node
	paths map[int64]string
	cut   bool // more nodes than asked for
}

// walkTree lists the open nodes below scope (scope first), at most max,
// in one ListTree.
func walkTree(ctx context.Context, rpc governorpb.GovernorClient, scope int64, max int) (*treeWalk, error) {
	t, err := rpc.ListTree(ctx, &governorpb.ListTreeRequest{NodeId: scope, Limit: int32(max)})
	if err != nil {
		return nil, err
	}
	w := &treeWalk{byID: map[int64]*governorpb.Node{}, paths: map[int64]string{}, cut: t.GetTruncated()}
	for i, n := range t.GetNodes() {
		if i == 0 {
			path, _ := pathOf(ctx, rpc, n)
			w.add(n, path)
			continue
		}
		p := n.GetName()
		if pp := w.paths[n.GetParentId()]; pp != "/" {
			p = pp + "/" + p
		}
		w.add(n, p)
	}
	return w, nil
}

func (w *treeWalk) add(n *governorpb.Node, path string) {
	w.nodes = append(w.nodes, n)
	w.byID[n.GetId()] = n
	w.paths[n.GetId()] = path
}

// under reports whether node id is top or below it, as far as the walk
// goes.
func (w *treeWalk) under(id, top int64) bool {
	for n := w.byID[id]; n != nil; n = w.byID[n.GetParentId()] {
		if n.GetId() == top {
			return true
		}
	}
	return false
}

func (w *treeWalk) name(id int64) string {
	if p, ok := w.paths[id]; ok {
		return p
	}
	return fmt.Sprintf("node %d", id)
}

// checkTree looks over the caps: a child's cap above its parent's, caps
// that admit nothing or that an ancestor's cap keeps out of reach, and
// tenants near their quotas.
func checkTree(ctx context.Context, rpc governorpb.GovernorClient, scope int64, o doctorOptions) ([]finding, *treeWalk) {
	w, err := walkTree(ctx, rpc, scope, o.maxNodes)
	if err != nil {
		return []finding{{Check: "tree", Level: levelError, Problem: "cannot list the tree: " + plainStatus(err).Error()}}, nil
	}
	var out []finding
	noSubagents := 0 // agent sessions of governor hook -max-subagents 0
	for _, n := range w.nodes {
		for _, side := range []struct {
			kind string
			caps func(*governorpb.Node) map[string]int64
		}{{"quota", (*governorpb.Node).GetQuotas}, {"limit", (*governorpb.Node).GetLimits}} {
			caps := side.caps(n)
			for _, k := range slices.Sorted(maps.Keys(caps)) {
				c := caps[k]
				if c == 0 && side.kind == "quota" && k == resourceSubagents && isHookSession(n) {
					noSubagents++ // the hook's own budget, as asked for
					continue
				}
				if c == 0 {
					out = append(out, finding{Check: "caps", Level: levelWarn, Subject: w.name(n.GetId()),
						Problem: fmt.Sprintf("%s %s is 0: it admits nothing", side.kind, k),
						Fix:     fmt.Sprintf("governor caps set %s %s.%s=N -reason ... (or =none to remove it)", w.name(n.GetId()), side.kind, k)})
					continue
				}
				for a, first := w.byID[n.GetParentId()], true; a != nil; a, first = w.byID[a.GetParentId()], false {
					ac, ok := side.caps(a)[k]
					if !ok || c <= ac {
						continue
					}
					problem := fmt.Sprintf("%s %s %d is above its parent %s's %d: the parent's cap binds first", side.kind, k, c, w.name(a.GetId()), ac)
					if !first {
						problem = fmt.Sprintf("%s %s %d can never be met: its ancestor %s caps it at %d", side.kind, k, c, w.name(a.GetId()), ac)
					}
					out = append(out, finding{Check: "caps", Level: levelWarn, Subject: w.name(n.GetId()), Problem: problem,
						Fix: fmt.Sprintf("lower it to at most %d, or raise %s's", ac, w.name(a.GetId()))})
					break
				}
			}
		}
		if n.GetKind() == governorpb.NodeKind_NODE_KIND_TENANT {
			out = append(out, tenantStateFinding(ctx, rpc, n, w)...)
			for _, k := range slices.Sorted(maps.Keys(n.GetQuotas())) {
				c, used := n.GetQuotas()[k], n.GetUsed()[k]+n.GetReserved()[k]
				if c > 0 && float64(used) >= o.nearQuota*float64(c) {
					out = append(out, finding{Check: "quota", Level: levelWarn, Subject: w.name(n.GetId()),
						Problem: fmt.Sprintf("quota %s is %d/%d used (%.0f%%)", k, used, c, 100*float64(used)/float64(c)),
						Fix:     fmt.Sprintf("quotas never refill: raise it (governor caps set %s quota.%s=N -reason ... as admin), or expect denials", w.name(n.GetId()), k)})
				}
			}
		}
	}
	if noSubagents > 0 {
		out = append(out, finding{Check: "caps", Level: levelOK, Problem: fmt.Sprintf("%d agent sessions of governor hook may start no subagents (-max-subagents 0)", noSubagents)})
	}
	if w.cut {
		out = append(out, finding{Check: "tree", Level: levelWarn, Problem: fmt.Sprintf("only the first %d nodes were looked over", o.maxNodes),
			Fix: "raise -max-nodes"})
	}
	out = append(out, finding{Check: "tree", Level: levelOK, Problem: fmt.Sprintf("%d open nodes looked over", len(w.nodes))})
	return out, w
}

// tenantStateFinding says that tenant n refuses work by its state (an
// operator's lever, but one that is easily left on after an incident), and
// who set it, when and why.
func tenantStateFinding(ctx context.Context, rpc governorpb.GovernorClient, n *governorpb.Node, w *treeWalk) []finding {
	if n.GetTenantState() == "" || n.GetTenantState() == tenantstate.Active {
		return nil
	}
	st, _, err := tenantstate.Of(ctx, rpc, n)
	problem := st.Text(time.Now())
	if err != nil {
		problem += " (" + plainStatus(err).Error() + ")"
	}
	return []finding{{Check: "tenants", Level: levelWarn, Subject: w.name(n.GetId()), Problem: problem,
		Fix: fmt.Sprintf("when it is no longer wanted: governor tenant %s resume -reason ... (the admin key)", n.GetName())}}
}

// checkInspection looks for long leases, late heartbeats and long waits.
func checkInspection(in *governorpb.Inspection, w *treeWalk, o doctorOptions) []finding {
	now := in.GetServerTime().AsTime()
	name := func(id int64) string {
		if w == nil {
			return fmt.Sprintf("node %d", id)
		}
		return w.name(id)
	}
	var out []finding
	var held slots.Tally
	for _, l := range in.GetLeases() {
		held.Add(l)
		out = append(out, leaseFinding(l, now, o.leaseAge, name)...)
	}
	for _, s := range in.GetSessions() {
		late := now.Sub(s.GetLastHeartbeat().AsTime())
		if ttl := s.GetTtl().AsDuration(); late > ttl/3+o.heartbeatGrace {
			out = append(out, finding{Check: "heartbeats", Level: levelWarn, Subject: fmt.Sprintf("session %d (%s)", s.GetId(), name(s.GetScopeNodeId())),
				Problem: fmt.Sprintf("last heartbeat %v ago; it should come every %v, and the session ends %v after it", late.Round(time.Millisecond), (ttl / 3).Round(time.Millisecond), ttl),
				Fix:     "the client is stalled, overloaded or cut off from governord; its leases go when the TTL runs out"})
		}
	}
	for _, wt := range in.GetWaiters() {
		if wt.GetSince() == nil {
			continue
		}
		if waited := now.Sub(wt.GetSince().AsTime()); waited > o.waitTimeout {
			out = append(out, waiterFinding(wt, waited, o.waitTimeout, name))
		}
	}
	if len(out) == 0 {
		out = append(out, finding{Check: "leases", Level: levelOK, Problem: fmt.Sprintf("%d leases and blocks, holding %s; %d sessions, %d waiters; none overdue",
			in.GetLeaseCount(), held.Text(), in.GetSessionCount(), in.GetWaiterCount())})
	}
	return append(out, fullPools(in, w)...)
}

// waiterFinding is a waiter that has waited longer than wait_timeout: for
// a slot of its class, or for a rate (wait_for_rate).
func waiterFinding(wt *governorpb.WaiterInfo, waited, waitTimeout time.Duration, name func(int64) string) finding {
	f := finding{Check: "waiters", Level: levelWarn, Subject: name(wt.GetNodeId())}
	how := fmt.Sprintf("has waited %v (longer than wait_timeout %v)", waited.Round(time.Millisecond), waitTimeout)
	if r := wt.GetRate(); r != "" {
		what := "a charge"
		if wt.GetClass() != "" {
			what = "an acquire of " + wt.GetClass()
		}
		f.Problem = fmt.Sprintf("%s by session %d waiting for the rate of %s %s", what, wt.GetSessionId(), r, how)
		f.Fix = "the rate binds: raise the rate of " + r + " on the way (governor caps get " + name(wt.GetNodeId()) + " shows each rate and its fill), or find who spends it"
		return f
	}
	f.Problem = fmt.Sprintf("an acquire of %s by session %d %s", wt.GetClass(), wt.GetSessionId(), how)
	f.Fix = "the pool is full: raise the limit on the way (governor caps get " + name(wt.GetNodeId()) + " names the tightest), or find who holds it"
	return f
}

// leaseFinding finds work stuck in l: a lease held longer than leaseAge, or
// a delegated block whose oldest work has held its slot that long, as its
// holder reports. A block's idle slots are no finding: they go back when
// anyone waits. A block whose use is not reported cannot be told apart,
// and says so once it is that old.
func leaseFinding(l *governorpb.LeaseInfo, now time.Time, leaseAge time.Duration, name func(int64) string) []finding {
	const stuck = "find the holder (a stuck request or transaction?); ending its session or cancelling the node frees the slot"
	age, known := slots.Held(l, now)
	switch {
	case l.GetBlock() && l.GetCount() == 0:
		return nil // holds nothing
	case !known:
		if d := now.Sub(l.GetGranted().AsTime()); d > leaseAge {
			return []finding{{Check: "leases", Level: levelWarn, Subject: name(l.GetNodeId()),
				Problem: fmt.Sprintf("%s: whether any of them is stuck cannot be told", slots.Text(l, now)),
				Fix:     "upgrade the holder's governor-proxy (it reports how its delegated slots are used), or read its governor_proxy_slots metric"}}
		}
	case age <= leaseAge:
	case !l.GetBlock():
		return []finding{{Check: "leases", Level: levelWarn, Subject: name(l.GetNodeId()),
			Problem: fmt.Sprintf("lease %d of %s held by session %d for %v (more than %v)", l.GetId(), l.GetClass(), l.GetSessionId(), age.Round(time.Second), leaseAge),
			Fix:     stuck}}
	default:
		return []finding{{Check: "leases", Level: levelWarn, Subject: name(l.GetNodeId()),
			Problem: fmt.Sprintf("%s: work has held a slot longer than %v", slots.Text(l, now), leaseAge),
			Fix: "find the request or transaction holding it at that sidecar (for pgwire, its oldest transaction in pg_stat_activity); " +
				"ending it frees its slot, and ending the sidecar's session frees the whole block"}}
	}
	return nil
}

// fullPools says, for each limit that is full, how its slots are held: as
// leases, or delegated, in use or idle at their sidecars. A full limit
// with idle delegated slots is not short of slots: they go back to
// governord as soon as anyone waits for the class.
func fullPools(in *governorpb.Inspection, w *treeWalk) []finding {
	if w == nil {
		return nil
	}
	var out []finding
	for _, n := range w.nodes {
		for _, class := range slices.Sorted(maps.Keys(n.GetLimits())) {
			limit, holding := n.GetLimits()[class], n.GetHeld()[class]
			if limit == 0 || holding < limit {
				continue
			}
			var t slots.Tally
			for _, l := range in.GetLeases() {
				if l.GetClass() == class && w.under(l.GetNodeId(), n.GetId()) {
					t.Add(l)
				}
			}
			problem := fmt.Sprintf("limit %s is full (%d/%d): %s", class, holding, limit, t.Text())
			if t.Idle > 0 {
				problem += fmt.Sprintf("; the idle slots go back to governord as soon as anyone waits for %s", class)
			}
			out = append(out, finding{Check: "pools", Level: levelOK, Subject: w.name(n.GetId()), Problem: problem})
		}
	}
	return out
}
