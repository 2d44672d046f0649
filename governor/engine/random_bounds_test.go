package engine

import (
	"errors"
	"maps"
	"slices"
)

// The randomized driver's side of bounds at exactly their limit (I17):
// I17's state check finds a tenant past a bound; this finds a refusal
// before one, so that a request that takes a tenant to exactly its bound
// is always granted.

// names lists the distinct names a request sets in maps (NoCap aside),
// sorted.
func names(maps_ ...map[string]int64) []string {
	var out []string
	for _, m := range maps_ {
		for k, v := range m {
			if v != NoCap && !slices.Contains(out, k) {
				out = append(out, k)
			}
		}
	}
	slices.Sort(out)
	return out
}

// checkBoundRefusal checks a refusal for a bound (I17, at its limit): a
// request on node n naming resources and classes is refused only when
// the tenant holds exactly its bound of what it asks for more of (open
// nodes, sessions, queued acquires), or when the names it would add take
// the tenant's names past their bound (its shadow ledger's for a shadow
// request). The error must name the tenant, the bound and its value.
func (w *world) checkBoundRefusal(what string, err error, n NodeID, resources, classes []string, shadow bool) {
	w.t.Helper()
	var be *BoundError
	if !errors.As(err, &be) {
		return
	}
	tn := w.e.nodes[w.m.tenantOf(n)]
	if tn == nil || tn.parent == nil {
		w.fail("I17 bounds: %s refused by %v, but node %d has no tenant", what, err, n)
		return
	}
	b := w.cfg.Bounds
	if tb, ok := w.cfg.TenantBounds[tn.name]; ok {
		b = tb
	}
	known, fresh := 0, 0
	justified := false
	switch be.Bound {
	case BoundSessions:
		justified = b.Sessions > 0 && be.Limit == b.Sessions && tn.sessions == b.Sessions
	case BoundNodes:
		justified = b.Nodes > 0 && be.Limit == b.Nodes && tn.openBelow == b.Nodes
	case BoundWaiters:
		justified = b.Waiters > 0 && be.Limit == b.Waiters && tn.waiting == b.Waiters
	case BoundResources:
		have := maps.Keys(tn.quota)
		if shadow {
			have = maps.Keys(tn.shadow)
		}
		known, fresh = countFresh(slices.Collect(have), resources)
		justified = b.Resources > 0 && be.Limit == b.Resources && known+fresh > b.Resources &&
			slices.Contains(resources, be.Name) && !slices.Contains(slices.Collect(have), be.Name)
	case BoundClasses:
		have := slices.Collect(maps.Keys(tn.limit))
		known, fresh = countFresh(have, classes)
		justified = b.Classes > 0 && be.Limit == b.Classes && known+fresh > b.Classes &&
			slices.Contains(classes, be.Name) && !slices.Contains(have, be.Name)
	}
	if justified && be.Tenant == tn.name {
		w.tally.boundsAtLimit++
		return
	}
	w.fail("I17 bounds: %s refused by %v; tenant %d (%q) holds %d sessions, %d open nodes, %d queued acquires, and %d names known and %d new of resources %v, classes %v; its bounds are %+v",
		what, err, tn.id, tn.name, tn.sessions, tn.openBelow, tn.waiting, known, fresh, resources, classes, b)
}

// classesOf lists an acquire's class, none for a charge alone.
func classesOf(class string) []string {
	if class == "" {
		return nil
	}
	return []string{class}
}

// countFresh is how many names a tenant knows and how many of asked it
// does not.
func countFresh(known, asked []string) (int, int) {
	fresh := 0
	for _, a := range asked {
		if !slices.Contains(known, a) {
			fresh++
		}
	}
	return len(known), fresh
}
