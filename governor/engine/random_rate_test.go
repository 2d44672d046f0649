package engine

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"
)

// The randomized driver's rates (rate.go): rateOp sets, edits and removes
// rates and default rates on random nodes of every level, small enough
// that the ordinary consumes, charges and reservations meet them, and now
// and then hostile (a rate or burst of 2^63-1, a period of 2^63-1 ns, a
// charge of 2^53 or 2^63-1). It draws from a stream of its own, so that
// every other draw of a seed stays as it was.

// randRate is a rate for the driver: mostly one that binds, sometimes a
// hostile one, sometimes a removal.
func (w *world) randRate() Rate {
	rr := w.rrng
	switch x := rr.Intn(20); {
	case x == 0:
		return Rate{Units: NoCap}
	case x == 1:
		return Rate{Units: math.MaxInt64, Per: 1, Burst: math.MaxInt64}
	case x == 2:
		return Rate{Units: 1, Per: math.MaxInt64, Burst: 1 << 53}
	case x == 3:
		return Rate{Units: 1 << 53, Per: 7}
	case x == 4:
		return Rate{Units: 3, Per: int64(time.Second), Burst: math.MaxInt64}
	case x == 5:
		return Rate{Units: math.MaxInt64, Per: math.MaxInt64}
	}
	per := []time.Duration{100 * time.Millisecond, time.Second, 3 * time.Second, time.Minute}[rr.Intn(4)]
	return Rate{Units: 1 + rr.Int63n(20), Per: int64(per), Burst: rr.Int63n(4) * rr.Int63n(8)}
}

func (w *world) rateOp() {
	rr := w.rrng
	switch x := rr.Intn(30); {
	case x < 3: // the operator sets or edits a rate
		n := w.nodes[rr.Intn(len(w.nodes))]
		edit := CapsEdit{Rates: map[string]Rate{resources[rr.Intn(len(resources))]: w.randRate()}}
		if rr.Intn(4) == 0 {
			edit.DefaultRates = map[string]Rate{resources[rr.Intn(len(resources))]: w.randRate()}
		}
		before := w.e.Seq()
		_, err := w.e.SetCaps(System, n, edit, "")
		w.expect(fmt.Sprintf("rates of n%d %+v", n, edit), before, err, ErrTaskEnded, ErrNotFound)
	case x < 5: // a hostile charge
		sids := w.openSessionIDs()
		if len(sids) == 0 {
			return
		}
		sid := sids[rr.Intn(len(sids))]
		n, _ := w.nodeFor(sid, false)
		r := resources[rr.Intn(len(resources))]
		amt := []int64{1 << 53, math.MaxInt64, math.MaxInt64 / 2, 1<<53 + 1}[rr.Intn(4)]
		// Usage of 2^62 and more would leave no room for the ordinary
		// charges after it (they would be refused as overflowing): the
		// largest amounts are only tried where a rate must refuse them.
		if _, tooBig := w.m.rateWait(n, r, amt, w.clock.Now().UnixNano()); amt > 1<<60 && !tooBig && w.m.rateFits(n, r, amt, w.clock.Now().UnixNano()) {
			amt = 1 << 53
		}
		before := w.e.Seq()
		err := w.e.Consume(sid, n, r, amt, "")
		what := fmt.Sprintf("hostile consume s%d n%d %s %d", sid, n, r, amt)
		w.expect(what, before, err, ErrQuotaExhausted, ErrTaskEnded, ErrRecalling, ErrBound, ErrInvalid, ErrRateLimited)
		w.checkRateRefusal(what, err, n, r, amt)
		w.checkRefusal(sid, err, n, r, amt, 0)
		if err == nil || errors.Is(err, ErrRateLimited) || neverFitsRate(err) {
			w.tally.rateHostile++
		}
	}
}

// checkRated checks I26's delegation rule on a reservation that succeeded:
// one that is not exact and wants units is answered Rated exactly when the
// model has a bucket of its resource on its node's chain; any other is
// never Rated. A Rated one grants units only with a slice of the rate
// (I29), and gets a new slice whenever the model's rule gives one.
func (w *world) checkRated(req ReserveRequest, res Reservation, held bool, expect *SliceGrant) {
	rated := false
	for _, a := range w.m.chain(req.Node) {
		rated = rated || w.m.rates[a][req.Resource] != nil
	}
	want := rated && !req.Exact && req.Want > 0
	switch {
	case res.Rated != want:
		w.fail("I26 rates: reserve %+v answered rated=%v; the model has a rate of %s on the chain: %v", req, res.Rated, req.Resource, rated)
	case want && res.Granted != 0 && res.Slice == nil:
		w.fail("I26 rates: reserve %+v granted %d of a rated resource without a slice", req, res.Granted)
	case want && !held && (expect == nil) != (res.Slice == nil):
		w.fail("I29 slices: reserve %+v answered slice %+v; the model's rule gives %+v", req, res.Slice, expect)
	case want && res.Slice == nil:
		w.tally.rateUndelegated++
	}
}

// sliceOp is a sidecar giving its slice of a rate back, or renewing it
// before its term ends (a top-up while it lives).
func (w *world) sliceOp() {
	if len(w.m.slices) == 0 || w.rrng.Intn(6) != 0 {
		return
	}
	ids := slices.Sorted(maps.Keys(w.m.slices))
	id := ids[w.rrng.Intn(len(ids))]
	sl := w.m.slices[id]
	if s := w.e.sessions[sl.session]; s == nil || s.expired(w.clock.Now().UnixNano()) {
		return
	}
	if w.rrng.Intn(3) != 0 {
		w.reserve(sl.session, ReserveRequest{Node: sl.node, Resource: sl.resource, Want: 1 + w.rrng.Int63n(4)}, w.e.Seq())
		return
	}
	req := ReserveRequest{Node: sl.node, Resource: sl.resource, EndSlice: true}
	res, err := w.e.Reserve(sl.session, req)
	if err != nil || res.Slice != nil || w.e.slices[id] != nil || w.m.slices[id] != nil {
		w.fail("give back the slice of s%d %+v: %+v, %v", sl.session, req, res, err)
		return
	}
	w.tally.slicesGivenBack++
}
