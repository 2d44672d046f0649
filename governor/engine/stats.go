package engine

// Stats is what an operator watches: the root and every tenant, and how many
// acquires wait per class. It is read once per metrics scrape; it never
// lists tasks, so its size follows the configuration, not the work.
type Stats struct {
	Root    NodeView
	Tenants []NodeView
	Waiting map[string]int // queued acquires by class
	// WaitingRate is the charges queued for a rate (ratewait.go), by the
	// tenant they are charged in and the resource whose rate holds them:
	// apart from Waiting, which counts acquires waiting for a slot.
	WaitingRate map[TenantResource]int
	// Delegated is the slots held in blocks, by class (also in Held).
	Delegated map[string]int64
	Leases    int
	Sessions  int
	// Nodes is how many nodes are held: open, and ended but not yet
	// reclaimed.
	Nodes int
	// Rates are the root's and the tenants' own rates, with their fill at
	// the engine's clock (each names its node).
	Rates []RateStatus
}

// TenantResource names a resource of a tenant, by the tenant's name.
type TenantResource struct{ Tenant, Resource string }

// Stats returns the root, the tenants and the queue depths.
func (e *Engine) Stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := Stats{Root: e.root.view(), Waiting: make(map[string]int, len(e.queues)),
		Leases: len(e.leases), Sessions: len(e.sessions), Nodes: len(e.nodes)}
	now := e.now()
	st.Rates = e.root.appendRateStatus(nil, now)
	for _, t := range e.root.children {
		st.Tenants = append(st.Tenants, t.view())
		st.Rates = t.appendRateStatus(st.Rates, now)
	}
	for class, q := range e.queues {
		st.Waiting[class] = q.waiting
	}
	st.WaitingRate = make(map[TenantResource]int)
	for r, q := range e.rateQueues {
		for _, tq := range q.ring {
			if len(tq.waiters) > 0 {
				st.WaitingRate[TenantResource{tq.tenant.name, r}] += len(tq.waiters)
			}
		}
	}
	st.Delegated = make(map[string]int64, len(e.blocks))
	for class, blocks := range e.blocks {
		for _, l := range blocks {
			st.Delegated[class] += l.count
		}
	}
	return st
}
