package engine

import (
	"fmt"
	"maps"
	"math"
	"math/big"
	"slices"
	"time"
)

// The model's periods (period.go), computed apart from the engine: its
// windows come from big-number division and time.AddDate from the first
// instant of a day or month, and it follows each quota's window and base
// from the events. It checks I28 on every event: nothing is decided at or
// past a window's end before that window's reset; a reset comes no
// earlier than the end, closes exactly what the window spent and opens
// the window the model computes.

type mWindow struct {
	period Period
	win    Window
	base   int64 // what the subtree had spent when the window opened
}

type modelPeriods struct {
	periods    map[NodeID]map[string]*mWindow
	defPeriods map[NodeID]map[string]Period
	loc        *time.Location
	resets     int // resets seen, for the run's coverage
}

func (m *model) initPeriods(loc *time.Location) {
	m.periods = map[NodeID]map[string]*mWindow{}
	m.defPeriods = map[NodeID]map[string]Period{}
	m.loc = loc
}

// mWindowOf is the model's window of p holding t.
func mWindowOf(p Period, t int64, loc *time.Location) Window {
	if p.Every > 0 {
		q := new(big.Int).Div(big.NewInt(t), big.NewInt(p.Every)) // Euclidean: floor for a positive divisor
		start := new(big.Int).Mul(q, big.NewInt(p.Every))
		end := new(big.Int).Add(start, big.NewInt(p.Every))
		if !end.IsInt64() {
			return Window{Start: start.Int64(), End: math.MaxInt64}
		}
		return Window{Start: start.Int64(), End: end.Int64()}
	}
	lt := time.Unix(0, t).In(loc)
	var from, to time.Time
	day := time.Date(lt.Year(), lt.Month(), lt.Day(), 0, 0, 0, 0, loc)
	switch p.Unit {
	case PeriodHour: // the model's zones change offsets by whole hours
		from = lt.Truncate(time.Hour)
		to = from.Add(time.Hour)
	case PeriodDay:
		from, to = day, day.AddDate(0, 0, 1)
	case PeriodWeek:
		for from = day; from.Weekday() != time.Monday; {
			from = from.AddDate(0, 0, -1)
		}
		to = from.AddDate(0, 0, 7)
	case PeriodMonth:
		from = time.Date(lt.Year(), lt.Month(), 1, 0, 0, 0, 0, loc)
		to = from.AddDate(0, 1, 0)
	}
	w := Window{Start: from.UnixNano(), End: to.UnixNano()}
	if to.After(time.Unix(0, math.MaxInt64)) {
		w.End = math.MaxInt64
	}
	return w
}

// unchargeWindows is a give-back of charges made at granted on id: it
// lowers the spend of the window they were in, not of one opened since.
func (m *model) unchargeWindows(id NodeID, charges []Charge, granted int64) {
	for _, c := range charges {
		for _, a := range m.chain(id) {
			if w := m.periods[a][c.Resource]; w != nil && granted < w.win.Start {
				w.base = max(0, w.base-c.Amount)
				if w.period.IsZero() && w.base == 0 { // a removed period with nothing left to count
					delete(m.periods[a], c.Resource)
				}
			}
		}
	}
}

// spent is what counts against id's quota of r: used less base.
func (m *model) spent(id NodeID, r string) int64 {
	if w := m.periods[id][r]; w != nil {
		return m.used[id][r] - w.base
	}
	return m.used[id][r]
}

// periodEvent checks ev against the windows (I28) and follows it. It
// runs before the model's own apply, with used as the event found it.
func (m *model) periodEvent(ev Event) {
	if ev.Kind != EvPeriodReset {
		m.checkResetFirst(ev)
	}
	switch ev.Kind {
	case EvPeriodReset:
		m.periodReset(ev)
	case EvNodeCreated:
		quotas := overlay(m.defQ[ev.Parent], ev.Spec.Quotas)
		want := map[string]Window{}
		for k, p := range overlayPeriods(m.defPeriods[ev.Parent], ev.Spec.QuotaPeriods) {
			if _, ok := quotas[k]; ok && !p.IsZero() {
				w := &mWindow{period: p, win: mWindowOf(p, ev.At, m.loc)}
				m.setWindow(ev.Node, k, w)
				want[k] = w.win
			}
		}
		m.checkWindows(ev, want)
		defs := overlay(m.defQ[ev.Parent], nil)
		m.defPeriods[ev.Node] = capped(overlayPeriods(m.defPeriods[ev.Parent], nil), defs)
		if ev.Spec.DefaultQuotas != nil {
			defs = overlay(nil, ev.Spec.DefaultQuotas)
		}
		if ev.Spec.DefaultQuotaPeriods != nil {
			m.defPeriods[ev.Node] = overlayPeriods(nil, ev.Spec.DefaultQuotaPeriods)
		}
		m.defPeriods[ev.Node] = capped(m.defPeriods[ev.Node], defs)
	case EvCapsSet, EvCapsReverted:
		m.periodCaps(ev)
	case EvLeaseReleased:
		if l, ok := m.leases[ev.Lease]; ok && ev.GivenBack {
			m.unchargeWindows(l.node, ev.Charges, l.granted)
		}
	case EvCharged:
		if ev.GivenBack { // checked against the request's charge (model_test.go)
			m.unchargeWindows(ev.Node, ev.Charges, ev.ChargedAt)
		}
	case EvNodesReclaimed:
		for _, root := range ev.Nodes {
			for _, id := range m.subtree(root) {
				delete(m.periods, id)
				delete(m.defPeriods, id)
			}
		}
	}
}

func (m *model) setWindow(id NodeID, r string, w *mWindow) {
	if m.periods[id] == nil {
		m.periods[id] = map[string]*mWindow{}
	}
	m.periods[id][r] = w
}

// checkResetFirst: an event at or past the end of an open node's window
// comes only after that window's reset (I28).
func (m *model) checkResetFirst(ev Event) {
	for id, ws := range m.periods {
		if m.state[id] != Open {
			continue
		}
		for r, w := range ws {
			if !w.period.IsZero() && ev.At >= w.win.End {
				m.failf("I28 periods: event %d (%s) at %d is past the end %d of %s's window on node %d, which was not reset first",
					ev.Seq, ev.Kind, ev.At, w.win.End, r, id)
			}
		}
	}
}

func (m *model) periodReset(ev Event) {
	m.resets++
	w := m.periods[ev.Node][ev.Resource]
	switch {
	case w == nil || w.period.IsZero():
		m.failf("I28 periods: event %d resets %s on node %d, which has no period", ev.Seq, ev.Resource, ev.Node)
		return
	case m.state[ev.Node] != Open:
		m.failf("I28 periods: event %d resets %s on node %d, which is %s", ev.Seq, ev.Resource, ev.Node, m.state[ev.Node])
	case ev.At < w.win.End:
		m.failf("I28 periods: event %d resets %s on node %d at %d, before its window ends at %d", ev.Seq, ev.Resource, ev.Node, ev.At, w.win.End)
	case ev.Amount != m.spent(ev.Node, ev.Resource):
		m.failf("I28 periods: event %d closes %s's window on node %d with %d spent; the model's window spent %d",
			ev.Seq, ev.Resource, ev.Node, ev.Amount, m.spent(ev.Node, ev.Resource))
	}
	w.base, w.win = m.used[ev.Node][ev.Resource], mWindowOf(w.period, ev.At, m.loc)
	m.checkWindows(ev, map[string]Window{ev.Resource: w.win})
}

// periodCaps follows an edit (or a revert) of a node's caps: a removed
// quota takes its period and base with it; a period set anew opens the
// window holding the event's time; the same period keeps its window; a
// removed period keeps what its window spent counting.
func (m *model) periodCaps(ev Event) {
	c := ev.Caps
	for k, v := range c.Quotas {
		if v == NoCap {
			delete(m.periods[ev.Node], k)
		}
	}
	want := map[string]Window{}
	for k, p := range c.QuotaPeriods {
		w := m.periods[ev.Node][k]
		switch {
		case p.IsZero() && w != nil:
			w.period, w.win = Period{}, Window{Start: w.win.Start}
			if w.base == 0 {
				delete(m.periods[ev.Node], k)
			}
		case p.IsZero() || (w != nil && w.period == p):
		case w != nil:
			w.period, w.win = p, mWindowOf(p, ev.At, m.loc)
			want[k] = w.win
		default:
			w = &mWindow{period: p, win: mWindowOf(p, ev.At, m.loc)}
			m.setWindow(ev.Node, k, w)
			want[k] = w.win
		}
	}
	m.checkWindows(ev, want)
	m.defPeriods[ev.Node] = capped(overlayPeriods(m.defPeriods[ev.Node], c.DefaultQuotaPeriods), overlay(m.defQ[ev.Node], c.DefaultQuotas))
}

func (m *model) checkWindows(ev Event, want map[string]Window) {
	if len(want) != len(ev.Windows) || !maps.Equal(want, ev.Windows) {
		m.failf("I28 periods: event %d (%s) on node %d opens windows %v; the model's are %v", ev.Seq, ev.Kind, ev.Node, ev.Windows, want)
	}
}

func overlayPeriods(base, edit map[string]Period) map[string]Period {
	out := maps.Clone(base)
	if out == nil {
		out = map[string]Period{}
	}
	for k, p := range edit {
		if p.IsZero() {
			delete(out, k)
		} else {
			out[k] = p
		}
	}
	return out
}

func capped(periods map[string]Period, caps map[string]int64) map[string]Period {
	out := map[string]Period{}
	for k, p := range periods {
		if _, ok := caps[k]; ok {
			out[k] = p
		}
	}
	return out
}

// checkPeriods compares the engine's windows and default periods with
// the model's.
func (w *world) checkPeriods() {
	for id, n := range w.e.nodes {
		got := n.periodViews()
		mw := w.m.periods[id]
		if len(got) != len(mw) {
			w.fail("node %d periods: engine %v, model %v", id, got, fmtWindows(mw))
			continue
		}
		for k, v := range got {
			x := mw[k]
			if x == nil || v != (QuotaWindow{Period: x.period, Window: x.win, Base: x.base}) {
				w.fail("node %d period of %s: engine %+v, model %v", id, k, v, fmtWindows(mw))
			}
		}
		if d := w.m.defPeriods[id]; len(n.defPeriods) != len(d) || (len(d) > 0 && !maps.Equal(n.defPeriods, d)) {
			w.fail("node %d default periods: engine %v, model %v", id, n.defPeriods, d)
		}
	}
}

func fmtWindows(ws map[string]*mWindow) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(ws)) {
		out = append(out, fmt.Sprintf("%s=%+v", k, *ws[k]))
	}
	return fmt.Sprint(out)
}

// windowEnds are the ends of the open nodes' windows, for the driver to
// land on (and a nanosecond short of).
func (m *model) windowEnds() []int64 {
	var out []int64
	for _, id := range sortedKeys(m.periods) {
		if m.state[id] != Open {
			continue
		}
		for _, r := range slices.Sorted(maps.Keys(m.periods[id])) {
			if w := m.periods[id][r]; !w.period.IsZero() {
				out = append(out, w.win.End)
			}
		}
	}
	return out
}
