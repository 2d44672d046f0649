package engine

import (
	"fmt"
	"slices"
)

// Bounds are what one tenant may hold in the engine at once, so that no
// tenant, by mistake or on purpose, can grow governord's memory without
// end. They count everything inside a tenant, whoever asks; the root and
// the tenants themselves are not counted, and System (the operator's
// configuration) may create and edit nodes past them. A zero field is no
// bound.
//
// Bounds are configuration, not state: a request past one is refused with
// a *BoundError and emits nothing, and lowering a bound below what a tenant
// holds ends nothing, it only refuses more.
type Bounds struct {
	// Sessions is how many sessions may be open scoped to the tenant.
	Sessions int
	// Nodes is how many nodes (tasks and subtasks) may be open below it.
	// Ended nodes do not count: they are reclaimed after the retention.
	Nodes int
	// Waiters is how many of its acquires may queue at once.
	Waiters int
	// Resources and Classes are how many distinct resource names and lease
	// classes it may use: those its own node has a cap or usage of (every
	// charge, reservation and grant below it reaches it), and those a new
	// node's caps or an edit would add.
	Resources int
	Classes   int
}

// The names of the bounds, as BoundError and governord's configuration
// spell them.
const (
	BoundSessions  = "max_sessions"
	BoundNodes     = "max_nodes"
	BoundWaiters   = "max_waiters"
	BoundResources = "max_resources"
	BoundClasses   = "max_classes"
)

func (b Bounds) validate() error {
	for _, f := range []struct {
		name string
		v    int
	}{{BoundSessions, b.Sessions}, {BoundNodes, b.Nodes}, {BoundWaiters, b.Waiters},
		{BoundResources, b.Resources}, {BoundClasses, b.Classes}} {
		if f.v < 0 {
			return invalid("bound %s is %d; it is >= 0 (0: none)", f.name, f.v)
		}
	}
	return nil
}

// BoundError is a request refused because its tenant is at a bound. It
// matches ErrBound.
type BoundError struct {
	Tenant string
	Bound  string // BoundSessions, BoundNodes, ...
	Limit  int
	// Name is the new resource or class that would have gone past the
	// bound (BoundResources, BoundClasses).
	Name string
}

func (e *BoundError) Error() string {
	var what, first string
	switch e.Bound {
	case BoundSessions:
		what, first = "open sessions", "close some"
	case BoundNodes:
		what, first = "open tasks and subtasks", "close some"
	case BoundWaiters:
		what, first = "queued acquires", "wait for some to be served"
	case BoundResources:
		what, first = "distinct resource names", "use names it already has"
	default:
		what, first = "distinct lease classes", "use classes it already has"
	}
	more := ""
	if e.Name != "" {
		more = fmt.Sprintf(", and %q would be one more", e.Name)
	}
	return fmt.Sprintf("tenant bound reached: tenant %q is at its %s of %d %s%s; %s, or raise %s for the tenant in governord's configuration",
		e.Tenant, e.Bound, e.Limit, what, more, first, e.Bound)
}

// Is makes errors.Is(e, ErrBound) true.
func (e *BoundError) Is(target error) bool { return target == ErrBound }

// boundsOf returns tenant t's bounds; the root (t is the root for itself)
// has none.
func (e *Engine) boundsOf(t *node) (Bounds, bool) {
	if t.parent == nil {
		return Bounds{}, false
	}
	if b, ok := e.tenantBounds[t.name]; ok {
		return b, true
	}
	return e.bounds, true
}

func (e *Engine) checkNewSession(t *node) error {
	if b, ok := e.boundsOf(t); ok && b.Sessions > 0 && t.sessions >= b.Sessions {
		return &BoundError{Tenant: t.name, Bound: BoundSessions, Limit: b.Sessions}
	}
	return nil
}

func (e *Engine) checkNewWaiter(t *node) error {
	if b, ok := e.boundsOf(t); ok && b.Waiters > 0 && t.waiting >= b.Waiters {
		return &BoundError{Tenant: t.name, Bound: BoundWaiters, Limit: b.Waiters}
	}
	return nil
}

// checkNewNode checks a node about to be created under parent, with spec.
func (e *Engine) checkNewNode(parent *node, spec *NodeSpec) error {
	t := parent.tenant
	b, ok := e.boundsOf(t)
	if !ok {
		return nil // a tenant, created under the root
	}
	if b.Nodes > 0 && t.openBelow >= b.Nodes {
		return &BoundError{Tenant: t.name, Bound: BoundNodes, Limit: b.Nodes}
	}
	return e.checkCapNames(t, spec.Quotas, spec.DefaultQuotas, spec.Limits, spec.DefaultLimits)
}

// checkResource checks that tenant t may use resource r.
func (e *Engine) checkResource(t *node, r string) error {
	if _, known := t.quota[r]; known {
		return nil // the common case: no lookup of bounds
	}
	return e.checkNames(t, BoundResources, len(t.quota), []string{r})
}

// checkClass checks that tenant t may use lease class c.
func (e *Engine) checkClass(t *node, c string) error {
	if _, known := t.limit[c]; known {
		return nil
	}
	return e.checkNames(t, BoundClasses, len(t.limit), []string{c})
}

// checkUse checks an acquire's class (possibly none) and charges.
func (e *Engine) checkUse(t *node, class string, charges []Charge) error {
	if class != "" {
		if err := e.checkClass(t, class); err != nil {
			return err
		}
	}
	var fresh []string
	for _, c := range charges {
		if _, known := t.quota[c.Resource]; !known {
			fresh = append(fresh, c.Resource)
		}
	}
	return e.checkNames(t, BoundResources, len(t.quota), fresh)
}

// checkCapNames checks the names of the caps a new node or an edit sets
// (quota and default quota maps, then limit and default limit maps). A
// name t does not know counts as one more, whether the caps are set on t
// or below it; NoCap removes a cap and adds nothing.
func (e *Engine) checkCapNames(t *node, quotas, defQuotas, limits, defLimits map[string]int64) error {
	if err := e.checkNames(t, BoundResources, len(t.quota), unknown(t.quota, quotas, defQuotas)); err != nil {
		return err
	}
	return e.checkNames(t, BoundClasses, len(t.limit), unknown(t.limit, limits, defLimits))
}

// checkNames checks that known names plus the fresh ones (distinct, and
// unknown to t) stay within t's bound of that kind.
func (e *Engine) checkNames(t *node, bound string, known int, fresh []string) error {
	if len(fresh) == 0 {
		return nil
	}
	b, ok := e.boundsOf(t)
	if !ok {
		return nil
	}
	limit := b.Resources
	if bound == BoundClasses {
		limit = b.Classes
	}
	if limit == 0 || known+len(fresh) <= limit {
		return nil
	}
	slices.Sort(fresh) // name the same one every time
	return &BoundError{Tenant: t.name, Bound: bound, Limit: limit, Name: fresh[0]}
}

// unknown lists the distinct names the maps set (NoCap aside) that gs does
// not hold.
func unknown(gs gauges, maps ...map[string]int64) []string {
	var out []string
	var seen map[string]bool
	for _, m := range maps {
		for k, v := range m {
			if _, known := gs[k]; known || v == NoCap || seen[k] {
				continue
			}
			if seen == nil {
				seen = map[string]bool{}
			}
			seen[k] = true
			out = append(out, k)
		}
	}
	return out
}
