package engine

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"time"
)

// The randomized driver's temporary overrides (override.go), beyond the
// edits randOverride turns into overrides: overrides by the operator's
// configuration anywhere but the root's limits, overrides stacked on a cap
// already overridden, permanent edits that cancel a pending revert, and a
// check that every edit of caps on an open node, a revert included, tells
// each holder of delegated budgets below it to give them back.

// overrideOp is, now and then, one temporary override or a permanent edit
// of an overridden cap. It draws from ovr, a stream of its own, so that
// each seed's other draws stay as they were.
func (w *world) overrideOp() {
	if w.ovr.Intn(10) != 0 {
		return
	}
	n, key, stacked := w.overrideTarget()
	if n == 0 {
		return
	}
	sid := System
	if w.ovr.Intn(3) > 0 {
		var ok bool
		if sid, ok = w.sessionAboveFrom(n, w.ovr); !ok {
			return
		}
	}
	edit := CapsEdit{}
	set := func(limit bool, name string, v int64) {
		m := &edit.Quotas
		if limit {
			m = &edit.Limits
		}
		if *m == nil {
			*m = map[string]int64{}
		}
		(*m)[name] = v
	}
	if stacked {
		set(key.limit, key.name, w.ovr.Int63n(8))
	} else {
		for range 1 + w.ovr.Intn(2) {
			if n == RootID || w.ovr.Intn(2) == 0 { // never the root's limits: Reap decides adaptive ones
				set(false, resources[w.ovr.Intn(len(resources))], w.ovr.Int63n(60))
			} else {
				set(true, classes[w.ovr.Intn(len(classes))], w.ovr.Int63n(6))
			}
		}
	}
	a := Audit{Reason: "override", For: time.Duration(1+w.ovr.Intn(20)) * time.Second}
	if stacked && w.ovr.Intn(3) == 0 {
		a.For = 0 // a permanent edit: the revert is cancelled
	}
	before := w.e.Seq()
	_, err := w.e.SetCapsAudited(sid, n, edit, a, "")
	what := fmt.Sprintf("override s%d n%d %+v for %v (stacked %v)", sid, n, edit, a.For, stacked)
	w.expect(what, before, err, ErrTaskEnded, ErrBound)
	w.checkBoundRefusal(what, err, n, names(edit.Quotas), names(edit.Limits), false)
	if err == nil {
		w.checkRecalledUnder(what, n)
	}
}

// overrideTarget picks an open node to override and, one time in three, a
// cap with an override pending on it (stacked); the root only for the
// operator's configuration, which may edit it.
func (w *world) overrideTarget() (NodeID, modeKey, bool) {
	if w.ovr.Intn(3) == 0 {
		var pending []NodeID
		for _, id := range sortedKeys(w.m.overrides) {
			if st, kept := w.m.state[id]; kept && st == Open && len(w.m.overrides[id]) > 0 && id != RootID {
				pending = append(pending, id)
			}
		}
		if len(pending) > 0 {
			n := pending[w.ovr.Intn(len(pending))]
			keys := slices.SortedFunc(maps.Keys(w.m.overrides[n]), func(a, b modeKey) int {
				return cmp.Or(cmp.Compare(b2i(a.limit), b2i(b.limit)), cmp.Compare(a.name, b.name))
			})
			return n, keys[w.ovr.Intn(len(keys))], true
		}
	}
	var open []NodeID
	for _, id := range w.nodes {
		if st, kept := w.m.state[id]; kept && st == Open {
			open = append(open, id)
		}
	}
	if len(open) == 0 {
		return 0, modeKey{}, false
	}
	slices.Sort(open)
	return open[w.ovr.Intn(len(open))], modeKey{}, false
}

// checkRecalledUnder checks that an edit of n's caps (or a revert) told
// every session holding a block with slots, or a reservation, on n or
// below it to give them back: what was delegated below n was sized under
// the old caps.
func (w *world) checkRecalledUnder(what string, n NodeID) {
	w.t.Helper()
	if w.m.state[n] != Open {
		return
	}
	holders := map[SessionID]bool{}
	for id, l := range w.m.leases {
		if l.block && l.count > 0 && w.m.inside(l.node, n) {
			holders[w.m.leases[id].session] = true
		}
	}
	for k := range w.m.reservations {
		if w.m.inside(k.node, n) {
			holders[k.session] = true
		}
	}
	for _, sid := range sortedKeys(holders) {
		told := slices.ContainsFunc(w.notices, func(nt Notice) bool {
			return nt.Kind == NoticeRecall && nt.Session == sid && nt.Node == n && nt.Class == "" && nt.Resource == ""
		})
		if !told {
			w.fail("%s: session %d holds delegated budgets below node %d and was not told to give them back", what, sid, n)
		}
	}
}
