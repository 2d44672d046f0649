package engine

import "math"

// gauge is one resource (or lease class) on one node: its cap, if any, and
// how much is in use (usage for a quota, slots held for a limit). Keeping
// both behind one map entry means a chain walk hashes the name once per
// level, and a charge reuses the entries its check found.
type gauge struct {
	cap    int64
	capped bool
	n      int64
	// r is what the subtree's quota reservations hold unspent (quotas only):
	// it counts against the cap like usage, but it is not spent.
	r int64
	// mode and burst are how the cap is enforced (policy.go).
	mode  Mode
	burst int64
	// base is what earlier windows of a quota's period spent, and per its
	// period and window (period.go); both zero without one.
	base int64
	per  *periodic
}

// full reports whether amount more would go over the cap, counting what is
// reserved, or past what the counters can hold (MaxInt64), cap or not.
// A soft cap is full past its burst; a warn_only cap only at MaxInt64.
func (g *gauge) full(amount int64) bool {
	if amount > math.MaxInt64-g.n-g.r {
		return true
	}
	eff, ok := g.enforced()
	return ok && amount > eff-g.spent()-g.r
}

// gauges maps a name to its gauge. An entry exists while it is capped or has
// been used.
type gauges map[string]*gauge

// at returns the gauge for k, creating it.
func (gs *gauges) at(k string) *gauge {
	if *gs == nil {
		*gs = make(gauges)
	}
	g := (*gs)[k]
	if g == nil {
		g = &gauge{}
		(*gs)[k] = g
	}
	return g
}

func (gs gauges) tidy(k string, g *gauge) {
	if !g.capped && g.n == 0 && g.r == 0 {
		delete(gs, k)
	}
}

// setCap sets a cap, or removes it for NoCap.
func (gs *gauges) setCap(k string, v int64) {
	g := gs.at(k)
	g.cap, g.capped = v, v != NoCap
	if !g.capped { // a mode is part of its cap
		g.cap, g.mode, g.burst = 0, ModeHard, 0
		g.base, g.per = 0, nil // and so is a period
	}
	gs.tidy(k, g)
}

// add changes what is in use. An entry that drops to zero stays, so a hot
// class does not allocate on every grant.
func (gs *gauges) add(k string, d int64) {
	gs.at(k).n += d
}

// capOf returns the cap on k, if there is one.
func (gs gauges) capOf(k string) (int64, bool) {
	if g := gs[k]; g != nil && g.capped {
		return g.cap, true
	}
	return 0, false
}

func (gs gauges) count(k string) int64 {
	if g := gs[k]; g != nil {
		return g.n
	}
	return 0
}

// caps returns the caps as a map, nil when there are none.
func (gs gauges) caps() map[string]int64 {
	var out map[string]int64
	for k, g := range gs {
		if g.capped {
			if out == nil {
				out = make(map[string]int64)
			}
			out[k] = g.cap
		}
	}
	return out
}

// counts returns what is in use as a map, nil when nothing is.
func (gs gauges) counts() map[string]int64 {
	var out map[string]int64
	for k, g := range gs {
		if g.n != 0 {
			if out == nil {
				out = make(map[string]int64)
			}
			out[k] = g.n
		}
	}
	return out
}

// reservedCounts returns what reservations hold unspent, nil when nothing.
func (gs gauges) reservedCounts() map[string]int64 {
	var out map[string]int64
	for k, g := range gs {
		if g.r != 0 {
			if out == nil {
				out = make(map[string]int64)
			}
			out[k] = g.r
		}
	}
	return out
}
