package engine

import (
	"errors"
	"fmt"
	"math"
	"time"
	_ "time/tzdata" // New York's rules on every machine
)

// The randomized driver's periods (period.go): periodOp sets, edits and
// removes periods and default periods on random nodes of every level,
// mostly seconds long so that the clock crosses their boundaries (the
// driver's advance lands on window ends, and a nanosecond short of them),
// sometimes calendar units in the seed's zone (UTC or New York), and now
// and then hostile: a period of 0 (a removal), negative, MinInt64, 2^31,
// 2^53 or 2^63-1 ns, an unknown unit, both a duration and a unit, a
// period of a quota the node lacks. It draws from a stream of its own.

func (w *world) periodZone() *time.Location {
	if w.seed%2 == 0 {
		return time.UTC
	}
	loc, err := time.LoadLocation("America/New_York")
	if err != nil {
		w.t.Fatal(err)
	}
	return loc
}

// randPeriod is a period for the driver, and whether it must be refused.
func (w *world) randPeriod() (p Period, bad bool) {
	pr := w.prng
	switch x := pr.Intn(24); {
	case x == 0:
		return Period{}, false // a removal
	case x == 1:
		return Period{Every: -1 - pr.Int63n(10)}, true
	case x == 2:
		return Period{Every: math.MinInt64}, true
	case x == 3:
		return Period{Unit: "fortnight"}, true
	case x == 4:
		return Period{Every: int64(time.Second), Unit: PeriodDay}, true
	case x == 5:
		return Period{Every: []int64{1 << 31, 1 << 53, math.MaxInt64}[pr.Intn(3)]}, false
	case x < 9:
		return Period{Unit: []string{PeriodHour, PeriodDay, PeriodWeek, PeriodMonth}[pr.Intn(4)]}, false
	}
	return Period{Every: int64(time.Duration(1+pr.Intn(15)) * time.Second)}, false
}

func (w *world) periodOp() {
	pr := w.prng
	if pr.Intn(6) != 0 {
		return
	}
	n := w.nodes[pr.Intn(len(w.nodes))]
	r := resources[pr.Intn(len(resources))]
	p, bad := w.randPeriod()
	edit := CapsEdit{QuotaPeriods: map[string]Period{r: p}}
	_, capped := w.m.quotas[n][r]
	switch x := pr.Intn(6); {
	case x == 0: // a quota with its period, so that periods meet charges
		edit.Quotas = map[string]int64{r: 5 + pr.Int63n(60)}
		capped = true
	case x == 1: // default periods, with or without their default quotas
		edit = CapsEdit{DefaultQuotaPeriods: edit.QuotaPeriods}
		_, capped = w.m.defQ[n][r]
		if pr.Intn(2) == 0 {
			edit.DefaultQuotas, capped = map[string]int64{r: 5 + pr.Int63n(40)}, true
		}
	case x == 2 && capped: // the quota removed, with its period
		edit, p, bad = CapsEdit{Quotas: map[string]int64{r: NoCap}}, Period{}, false
	}
	before := w.e.Seq()
	_, err := w.e.SetCaps(System, n, edit, "")
	what := fmt.Sprintf("periods of n%d %+v", n, edit)
	w.expect(what, before, err, ErrTaskEnded, ErrNotFound, ErrInvalid)
	w.checkPeriodRefusal(what, err, bad, !capped && !p.IsZero())

	if pr.Intn(4) == 0 { // a new task inheriting (or naming) periods
		w.createWithPeriods(pr.Intn(2) == 0)
	}
}

// createWithPeriods creates a task under a random tenant, naming a
// period of its own when own is set.
func (w *world) createWithPeriods(own bool) {
	pr := w.prng
	t := w.tenants[pr.Intn(len(w.tenants))]
	spec := NodeSpec{Name: fmt.Sprintf("p%d", w.step)}
	bad, uncapped := false, false
	if own {
		r := resources[pr.Intn(len(resources))]
		p, b := w.randPeriod()
		spec.QuotaPeriods = map[string]Period{r: p}
		_, inherited := w.m.defQ[t][r]
		if pr.Intn(2) == 0 {
			spec.Quotas, inherited = map[string]int64{r: 5 + pr.Int63n(30)}, true
		}
		bad, uncapped = b, !inherited && !p.IsZero()
	}
	sid, ok := w.sessionOver(t)
	if !ok {
		return
	}
	before := w.e.Seq()
	v, err := w.e.CreateNode(sid, t, spec, "")
	what := fmt.Sprintf("create n? under n%d %+v", t, spec)
	w.expect(what, before, err, ErrTaskEnded, ErrNotFound, ErrInvalid, ErrExists, ErrBound)
	w.checkPeriodRefusal(what, err, bad, uncapped)
	if err == nil {
		w.nodes = append(w.nodes, v.ID)
	}
}

// sessionOver is an open session whose scope holds t strictly above it
// (the operator's, at the root), which is bounded as tenants are.
func (w *world) sessionOver(t NodeID) (SessionID, bool) {
	for _, sid := range sortedKeys(w.m.scope) {
		if scope := w.m.scope[sid]; scope != t && w.m.inside(t, scope) {
			return sid, true
		}
	}
	return 0, false
}

// checkPeriodRefusal: a bad period (negative, an unknown unit, ...) is
// invalid before anything else is looked at; a period of a quota the node
// lacks is invalid once the node is found open.
func (w *world) checkPeriodRefusal(what string, err error, bad, uncapped bool) {
	invalid := errors.Is(err, ErrInvalid)
	switch {
	case errors.Is(err, ErrUnauthenticated) || errors.Is(err, ErrSessionExpired):
	case bad && !invalid:
		w.fail("%s: %v; a bad period must be refused as invalid", what, err)
	case !bad && uncapped && err == nil:
		w.fail("%s: accepted a period of a quota the node does not have", what)
	case !bad && !uncapped && invalid:
		w.fail("%s: refused as invalid: %v", what, err)
	}
}

// afterResets is before moved past the period resets a call emitted
// first: they are due by the clock, not caused by the call, so a call
// that must emit nothing may still be preceded by them.
func (w *world) afterResets(before uint64) uint64 {
	for before < uint64(len(w.rec.events)) && w.rec.events[before].Kind == EvPeriodReset {
		before++
	}
	return before
}
