package engine

import (
	"sync"
	"testing"
)

// What the randomized driver is there to reach, counted over a run of
// TestRandomized: a driver change that stops its default seeds reaching
// one fails the run, rather than leaving a check with nothing to check.

// coverage counts, in one history, the moments the driver is there to
// reach.
type coverage struct {
	// dryRunWritesRefused counts dry runs of writes refused by a
	// read_only tenant.
	dryRunWritesRefused int
	// keptForDeepPin counts ended nodes Reap kept past their retention
	// for a pin two or more levels below them (I15, I16).
	keptForDeepPin int
	// boundsAtLimit counts requests refused at exactly a bound (I17).
	boundsAtLimit int
	// reverts counts temporary overrides reverted.
	reverts int
	// hostileRefused counts calls refused for their amounts (I24).
	hostileRefused int
	// agedGrants counts grants to waiters the aging guard had marked (I22).
	agedGrants int
	// Rates (I26, I27): refusals with a wait, charges larger than a
	// bucket, takes from buckets, and hostile charges decided by a rate.
	rateRefused, rateNever, rateTaken, rateHostile int
	// periodResets counts windows closed by a reset (I28).
	periodResets int
	// rateUndelegated counts top-ups of a rated resource answered Rated
	// with nothing reserved (I26).
	rateUndelegated int
	// slicesGranted, slicesRenewed and slicesGivenBack count slices of
	// rates granted, renewed and given back (I29); slicesTermed those
	// that ended at their term.
	slicesGranted, slicesRenewed, slicesGivenBack, slicesTermed int
	// cancelledAtGrant counts waits given up after their grant arrived and
	// before their caller took it (the race CancelWait undoes).
	cancelledAtGrant int
	// chargesGivenBack counts charges without a lease undone whole by
	// GiveBackCharged.
	chargesGivenBack int
}

// reached sums the coverage of the histories of one run.
type reached struct {
	mu    sync.Mutex
	sum   coverage
	seeds int
}

func (r *reached) add(w *world) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := w.tally
	c.agedGrants = w.m.agedGrants
	c.rateTaken = w.m.rateTaken
	c.periodResets = w.m.resets
	for _, ev := range w.rec.events {
		if ev.Kind == EvCapsReverted {
			c.reverts++
		}
	}
	r.sum.dryRunWritesRefused += c.dryRunWritesRefused
	r.sum.keptForDeepPin += c.keptForDeepPin
	r.sum.boundsAtLimit += c.boundsAtLimit
	r.sum.reverts += c.reverts
	r.sum.hostileRefused += c.hostileRefused
	r.sum.agedGrants += c.agedGrants
	r.sum.rateRefused += c.rateRefused
	r.sum.rateNever += c.rateNever
	r.sum.rateTaken += c.rateTaken
	r.sum.rateHostile += c.rateHostile
	r.sum.periodResets += c.periodResets
	r.sum.rateUndelegated += c.rateUndelegated
	for _, ev := range w.rec.events {
		switch {
		case ev.Kind == EvReserved && ev.Slice != nil && ev.Slice.ID == 0:
			c.slicesGranted++
		case ev.Kind == EvReserved && ev.Slice != nil:
			c.slicesRenewed++
		case ev.Kind == EvSliceEnded:
			c.slicesTermed++ // less those given back, below
		}
	}
	c.slicesTermed -= c.slicesGivenBack
	r.sum.slicesGranted += c.slicesGranted
	r.sum.slicesRenewed += c.slicesRenewed
	r.sum.slicesGivenBack += c.slicesGivenBack
	r.sum.slicesTermed += c.slicesTermed
	r.sum.cancelledAtGrant += c.cancelledAtGrant
	r.sum.chargesGivenBack += c.chargesGivenBack
	r.seeds++
}

// check fails a run of the default seeds (or more) that never reached one
// of them.
func (r *reached) check(t *testing.T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t.Logf("%d histories reached: %+v", r.seeds, r.sum)
	if r.seeds < 100 || *flagOps < 2000 {
		return // a single seed, or a short run, need not reach everything
	}
	for _, c := range []struct {
		what string
		n    int
	}{
		{"a dry run of a write refused by a read_only tenant", r.sum.dryRunWritesRefused},
		{"an ended node kept for a pin two levels below it", r.sum.keptForDeepPin},
		{"a request refused at exactly a bound", r.sum.boundsAtLimit},
		{"a temporary override reverted", r.sum.reverts},
		{"a call refused for a hostile amount", r.sum.hostileRefused},
		{"a grant to a waiter the aging guard had marked", r.sum.agedGrants},
		{"a charge refused for rate", r.sum.rateRefused},
		{"a charge larger than a bucket", r.sum.rateNever},
		{"a charge taken from a bucket", r.sum.rateTaken},
		{"a hostile charge decided by a rate", r.sum.rateHostile},
		{"a quota's window closed by a reset", r.sum.periodResets},
		{"a top-up of a rated resource answered rated", r.sum.rateUndelegated},
		{"a slice of a rate granted", r.sum.slicesGranted},
		{"a slice of a rate renewed", r.sum.slicesRenewed},
		{"a slice of a rate given back", r.sum.slicesGivenBack},
		{"a slice of a rate ended at its term", r.sum.slicesTermed},
		{"a wait given up at the instant of its grant", r.sum.cancelledAtGrant},
		{"a charge without a lease given back whole", r.sum.chargesGivenBack},
	} {
		if c.n == 0 {
			t.Errorf("none of %d histories reached %s: the driver no longer drives what its checks check", r.seeds, c.what)
		}
	}
}
