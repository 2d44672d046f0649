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
// reserved, or past what the counters can hold (MaxInt64), cap or not,
// unless they saturate there (node.saturates). A soft cap is full past its
// burst; a warn_only cap only where the counters stop.
func (g *gauge) full(amount int64, saturates bool) bool {
	if !saturates && amount > math.MaxInt64-g.n-g.r {
		return true
	}
	eff, ok := g.enforced()
	return ok && amount > eff-g.spent()-g.r
}

// shift changes what is used and reserved. Below the root a change is
// exact: the checks before it refuse what a counter could not hold (I24).
// The root's counters are held to their range instead (root set): used to
// [0, MaxInt64], then reserved to what used leaves of it. See
// node.saturates for why, and for when that range is reached.
func (g *gauge) shift(used, reserved int64, root bool) {
	if !root {
		g.n += used
		g.r += reserved
		return
	}
	g.n = clampedAdd(g.n, used, math.MaxInt64)
	g.r = clampedAdd(g.r, reserved, math.MaxInt64-g.n)
}

// counted is what counts against the cap: spent and reserved, with extra
// (a shadow ledger), held to MaxInt64 (the root's ledger saturates apart
// from its counters, so the three may pass it together there).
func (g *gauge) counted(extra int64) int64 {
	return clampedAdd(g.spent()+g.r, extra, math.MaxInt64)
}

// clampedAdd is v+d held to [0, hi], for v >= 0 and hi >= 0, without
// wrapping.
func clampedAdd(v, d, hi int64) int64 {
	switch {
	case d > 0 && v > hi-d:
		return hi
	case v+d < 0: // v >= 0, so v+d does not wrap
		return 0
	}
	return min(v+d, hi)
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

// add changes what is in use, held to its range at the root (shift). An
// entry that drops to zero stays, so a hot class does not allocate on
// every grant.
func (gs *gauges) add(k string, d int64, root bool) {
	gs.at(k).shift(d, 0, root)
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
