package engine

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"
)

// Periods: a quota that resets. A quota cap may carry a Period; its usage
// then counts within a window [Start, End) of that period, and at End the
// window's spend is closed by an EvPeriodReset (SPEC.md, "Periods").
//
// The window a reset opens is computed once, when the event is decided,
// and carried in the event: replay never computes a boundary, so it
// reproduces the live run whatever time zone data the replaying machine
// has. The calendar's zone (Config.Location) is resolved by the caller;
// the engine reads no zone database itself.

// The calendar units a Period may name.
const (
	PeriodHour  = "hour"
	PeriodDay   = "day"
	PeriodWeek  = "week" // weeks start on Monday at 00:00, as ISO 8601's do
	PeriodMonth = "month"
)

// Period is how often a quota resets: every Every nanoseconds, boundaries
// at multiples of Every since the Unix epoch (so 10s resets at :00, :10,
// ...), or at each calendar Unit's start in the engine's Location. Exactly
// one is set. In a CapsEdit or NodeSpec, the zero Period removes one.
type Period struct {
	Every int64  `json:"ns,omitempty"`
	Unit  string `json:"u,omitempty"`
}

// IsZero reports whether p is no period.
func (p Period) IsZero() bool { return p == Period{} }

func (p Period) String() string {
	if p.Unit != "" {
		return p.Unit
	}
	return time.Duration(p.Every).String()
}

func (p Period) validate(what string) error {
	switch {
	case p.IsZero():
		return nil
	case p.Every != 0 && p.Unit != "":
		return invalid("%s: a period is a duration or a calendar unit, not both", what)
	case p.Every < 0:
		return invalid("%s: period of %d ns is not positive", what, p.Every)
	case p.Unit != "" && !slices.Contains([]string{PeriodHour, PeriodDay, PeriodWeek, PeriodMonth}, p.Unit):
		return invalid("%s: period %q is none of hour, day, week, month", what, p.Unit)
	}
	return nil
}

// Window is one period's span, [Start, End) in unix nanoseconds. End
// math.MaxInt64 never comes.
type Window struct {
	Start int64 `json:"s"`
	End   int64 `json:"e"`
}

// WindowAt is the window of p that holds t (unix nanoseconds), in loc for
// a calendar unit: what a reset at each boundary makes of time, and what
// usage rollups sum over.
func (p Period) WindowAt(t int64, loc *time.Location) Window { return p.window(t, loc) }

// window is the window of p that holds t, in loc for a calendar unit.
func (p Period) window(t int64, loc *time.Location) Window {
	if p.Every > 0 {
		start := t - t%p.Every
		if t%p.Every < 0 {
			start -= p.Every
		}
		if start > math.MaxInt64-p.Every {
			return Window{Start: start, End: math.MaxInt64}
		}
		return Window{Start: start, End: start + p.Every}
	}
	lt := time.Unix(0, t).In(loc)
	y, m, d := lt.Date()
	var from, to time.Time
	switch p.Unit {
	case PeriodHour:
		// By the offset in force at t: an hour repeated when clocks go
		// back is two windows, as a wall clock shows it.
		_, off := lt.Zone()
		local := t + int64(off)*int64(time.Second)
		start := local - mod(local, int64(time.Hour)) - int64(off)*int64(time.Second)
		return Window{Start: start, End: saturatingAdd(start, int64(time.Hour))}
	case PeriodDay:
		from, to = time.Date(y, m, d, 0, 0, 0, 0, loc), time.Date(y, m, d+1, 0, 0, 0, 0, loc)
	case PeriodWeek:
		back := (int(lt.Weekday()) + 6) % 7 // days since Monday
		from, to = time.Date(y, m, d-back, 0, 0, 0, 0, loc), time.Date(y, m, d-back+7, 0, 0, 0, 0, loc)
	default: // month: the first of the next month, so January 31 ends on February 1
		from, to = time.Date(y, m, 1, 0, 0, 0, 0, loc), time.Date(y, m+1, 1, 0, 0, 0, 0, loc)
	}
	return Window{Start: unixNano(from), End: unixNano(to)}
}

func mod(a, b int64) int64 {
	r := a % b
	if r < 0 {
		r += b
	}
	return r
}

func saturatingAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// unixNano is t in unix nanoseconds, math.MaxInt64 past what they hold.
func unixNano(t time.Time) int64 {
	if t.After(time.Unix(0, math.MaxInt64)) {
		return math.MaxInt64
	}
	return t.UnixNano()
}

// validPeriods checks a map of periods; the zero Period (a removal) is
// allowed only where removing means something (in edits).
func validPeriods(what string, m map[string]Period) error {
	for k, p := range m {
		if err := validName(what+" name", k); err != nil {
			return err
		}
		if err := p.validate(fmt.Sprintf("%s %q", what, k)); err != nil {
			return err
		}
	}
	return nil
}

func validPeriodSets(periods, defaults map[string]Period) error {
	if err := validPeriods("quota period", periods); err != nil {
		return err
	}
	return validPeriods("default quota period", defaults)
}

// keepCapped is periods without those whose resource caps lacks: a
// period goes with its quota.
func keepCapped(periods map[string]Period, caps map[string]int64) map[string]Period {
	for k := range periods {
		if _, ok := caps[k]; !ok {
			delete(periods, k)
		}
	}
	if len(periods) == 0 {
		return nil
	}
	return periods
}

// checkPeriods refuses a spec whose periods name a quota the new child
// under parent will not have (its own or inherited), or default periods
// a default quota it will not have; it returns the child's quotas.
func (sp *NodeSpec) checkPeriods(parent *node) (map[string]int64, error) {
	quotas := mergeCaps(parent.defQuotas, sp.Quotas)
	for k, p := range sp.QuotaPeriods {
		if _, ok := quotas[k]; !ok && !p.IsZero() {
			return nil, invalid("quota %q has no cap to take a period", k)
		}
	}
	defs := parent.defQuotas
	if sp.DefaultQuotas != nil {
		defs = mergeCaps(nil, sp.DefaultQuotas)
	}
	for k, p := range sp.DefaultQuotaPeriods {
		if _, ok := defs[k]; !ok && !p.IsZero() {
			return nil, invalid("default quota %q has no cap to take a period", k)
		}
	}
	return quotas, nil
}

// childPeriods is the periods a new child of parent created from sp
// starts with: the parent's default periods with sp's own over them
// (zero ones kept, so that they set nothing).
func childPeriods(parent *node, sp *NodeSpec) map[string]Period {
	out := maps.Clone(parent.defPeriods)
	for k, p := range sp.QuotaPeriods {
		if out == nil {
			out = make(map[string]Period)
		}
		out[k] = p
	}
	return out
}

// mergePeriods is base with edit applied; the zero Period removes one.
func mergePeriods(base, edit map[string]Period) map[string]Period {
	return mergeMap(base, edit, Period.IsZero)
}

// checkPeriods refuses an edit whose periods name a resource that has no
// quota on n once the edit is made: a period is part of its cap, as a
// mode is. Default periods need a default quota likewise.
func (n *node) checkPeriods(edit *CapsEdit) error {
	for k, p := range edit.QuotaPeriods {
		v, edited := edit.Quotas[k]
		_, capped := n.quota.capOf(k)
		if !p.IsZero() && ((edited && v == NoCap) || (!edited && !capped)) {
			return invalid("quota %q has no cap on node %q to take a period", k, n.name)
		}
	}
	defs := mergeCaps(n.defQuotas, edit.DefaultQuotas)
	for k, p := range edit.DefaultQuotaPeriods {
		if _, ok := defs[k]; !ok && !p.IsZero() {
			return invalid("default quota %q has no cap on node %q to take a period", k, n.name)
		}
	}
	return nil
}

// periodic is the window state of one quota gauge: its period (zero once
// removed), its window, and base, what the subtree had spent when the
// window opened. The window's spend is n - base; used stays the subtree's
// spend over its whole life, so ancestors without a period and the
// largest consumer read it as before.
type periodic struct {
	period Period
	win    Window
}

// tidyPeriod drops a removed period's state once nothing of it is left,
// so that a gauge is the same whether it was built live or restored.
func (g *gauge) tidyPeriod() {
	if g.per != nil && g.per.period.IsZero() && g.base == 0 {
		g.per = nil
	}
}

// spent is what counts against g's cap: usage less what earlier windows
// of its period spent.
func (g *gauge) spent() int64 { return g.n - g.base }

// windowsFor computes the windows a live event sets on n: for each
// resource whose period is set or changed by periods (or, fresh, every
// period in it), the window holding now. Unchanged periods keep theirs.
func (e *Engine) windowsFor(n *node, periods map[string]Period, now int64, fresh bool) map[string]Window {
	var out map[string]Window
	for k, p := range periods {
		if p.IsZero() {
			continue
		}
		if g := n.quotaGauge(k); !fresh && g != nil && g.per != nil && g.per.period == p {
			continue // the same period keeps its window: re-applying a config changes nothing
		}
		if out == nil {
			out = make(map[string]Window)
		}
		out[k] = p.window(now, e.loc)
	}
	return out
}

// quotaGauge is n's gauge of r, nil on a nil node.
func (n *node) quotaGauge(r string) *gauge {
	if n == nil {
		return nil
	}
	return n.quota[r]
}

// setPeriods applies periods with their windows (from the event) to n's
// quotas. A zero period stops resets; what the window spent keeps
// counting (an edit never refills a quota).
func (e *Engine) setPeriods(n *node, periods map[string]Period, wins map[string]Window) {
	for k, p := range periods {
		g := n.quota[k]
		if g == nil || !g.capped {
			continue // removed with its cap
		}
		if p.IsZero() {
			if g.per != nil {
				// The window's start stays: a grant from before it, given
				// back later, still lowers base (unchargePeriods), so base
				// never passes used.
				g.per.period, g.per.win = Period{}, Window{Start: g.per.win.Start}
				g.tidyPeriod()
			}
			continue
		}
		if g.per == nil {
			g.per = &periodic{}
		}
		g.per.period = p
		if w, ok := wins[k]; ok {
			g.per.win = w
			e.nextReset = min(e.nextReset, w.End)
		}
	}
}

// resetDue emits an EvPeriodReset for every quota on an open node whose
// window has ended by now, in node then resource order, and finds when
// the next one is due. Every live call runs it first (tick), so that an
// event at or past a boundary is always decided after that boundary's
// reset, and replay, which applies the recorded resets, reproduces it.
func (e *Engine) resetDue(now int64) {
	type due struct {
		n *node
		r string
	}
	var dues []due
	for _, n := range e.nodes {
		if n.state != Open {
			continue
		}
		for r, g := range n.quota {
			if g.per != nil && !g.per.period.IsZero() && now >= g.per.win.End {
				dues = append(dues, due{n, r})
			}
		}
	}
	slices.SortFunc(dues, func(a, b due) int {
		return cmp.Or(cmp.Compare(a.n.id, b.n.id), cmp.Compare(a.r, b.r))
	})
	for _, d := range dues {
		g := d.n.quota[d.r]
		e.emit(Event{Kind: EvPeriodReset, At: now, Node: d.n.id, Resource: d.r, Amount: g.spent(),
			Windows: map[string]Window{d.r: g.per.period.window(now, e.loc)}})
	}
	e.nextReset = math.MaxInt64
	for _, n := range e.nodes {
		if n.state != Open {
			continue
		}
		for _, g := range n.quota {
			if g.per != nil && !g.per.period.IsZero() {
				e.nextReset = min(e.nextReset, g.per.win.End)
			}
		}
	}
}

// tick reads the clock for a live call and first emits the resets due.
func (e *Engine) tick() int64 {
	now := e.now()
	if now >= e.nextReset {
		e.resetDue(now)
	}
	if e.rateWaiting > 0 && now >= e.rateDue {
		e.dispatchRates(now) // time refilled the buckets rate waiters wait for
	}
	return now
}

// applyPeriodReset closes a window: what it spent (Amount) becomes base,
// and the next window opens. Reserved units stay reserved, so they count
// in the new window, where they are spent or returned.
func (e *Engine) applyPeriodReset(ev *Event) error {
	n := e.nodes[ev.Node]
	var g *gauge
	if n != nil {
		g = n.quota[ev.Resource]
	}
	w, ok := ev.Windows[ev.Resource]
	if g == nil || g.per == nil || g.per.period.IsZero() || !ok || ev.Amount != g.spent() {
		return fmt.Errorf("%w: period reset of %s on node %d", ErrCorrupt, ev.Resource, ev.Node)
	}
	g.per.win = w
	g.base = g.n
	e.nextReset = min(e.nextReset, w.End)
	return nil
}

// unchargePeriods keeps a give-back from crediting the window it lands
// in with what an earlier window spent: a charge granted before a window
// opened lowers base with used, so the window's spend stays as it was.
func (n *node) unchargePeriods(r string, amount, granted int64) {
	for a := n; a != nil; a = a.parent {
		if g := a.quota[r]; g != nil && g.per != nil && granted < g.per.win.Start {
			g.base = max(0, g.base-amount)
			g.tidyPeriod()
		}
	}
}

// QuotaWindow is a quota's period and window as a NodeView shows them:
// Base is what the subtree had spent when the window opened, so that the
// window has spent Used - Base. A quota whose period was removed keeps
// its Base and has no Period or window.
type QuotaWindow struct {
	Period Period `json:"p,omitempty"`
	Window
	Base int64 `json:"b,omitempty"`
}

// periodViews is n's quota windows, nil when it has none.
func (n *node) periodViews() map[string]QuotaWindow {
	var out map[string]QuotaWindow
	for k, g := range n.quota {
		if (g.per == nil || g.per.period.IsZero()) && g.base == 0 {
			continue
		}
		if out == nil {
			out = make(map[string]QuotaWindow)
		}
		qw := QuotaWindow{Base: g.base}
		if g.per != nil {
			qw.Period, qw.Window = g.per.period, g.per.win
		}
		out[k] = qw
	}
	return out
}

// restorePeriods rebuilds n's windows from a snapshot, after its caps and
// usage; it lowers e.nextReset to each window's end.
func (e *Engine) restorePeriods(n *node, v map[string]QuotaWindow) error {
	for k, qw := range v {
		g := n.quota[k]
		if g == nil || !g.capped || qw.Period.validate("period") != nil || qw.Base < 0 || qw.Base > g.n ||
			(!qw.Period.IsZero() && qw.Start >= qw.End) {
			return fmt.Errorf("%w: snapshot node %d has a bad period on %s", ErrCorrupt, n.id, k)
		}
		g.per = &periodic{period: qw.Period, win: qw.Window}
		g.base = qw.Base
		if !qw.Period.IsZero() && n.state == Open {
			e.nextReset = min(e.nextReset, qw.End)
		}
	}
	return nil
}

// PeriodStatus is where one periodic quota stands.
type PeriodStatus struct {
	Node     NodeID
	NodeName string
	Name     string // the resource
	Period   Period
	Window
	Spent int64 // what the window has spent so far
	Limit int64
}

// PeriodStatus lists the periodic quotas on id's chain, from id up to the
// root, each node's sorted by resource. It changes nothing but what every
// call does first: the resets due (tick).
func (e *Engine) PeriodStatus(sid SessionID, id NodeID) ([]PeriodStatus, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	n, err := e.sessionTarget(sid, id, e.tick())
	if err != nil {
		return nil, err
	}
	var out []PeriodStatus
	for a := n; a != nil; a = a.parent {
		for _, k := range slices.Sorted(maps.Keys(a.quota)) {
			g := a.quota[k]
			if g.per == nil || g.per.period.IsZero() {
				continue
			}
			out = append(out, PeriodStatus{Node: a.id, NodeName: a.name, Name: k, Period: g.per.period,
				Window: g.per.win, Spent: g.spent(), Limit: g.cap})
		}
	}
	return out, nil
}

// fingerprintPeriods adds periods to a request's fingerprint, only when
// some are set, so that requests without them keep theirs.
func fingerprintPeriods(h uint64, sets ...map[string]Period) uint64 {
	for i, m := range sets {
		if m == nil {
			continue
		}
		h = fnvAdd(h, uint64(i+21))
		for _, k := range slices.Sorted(maps.Keys(m)) {
			p := m[k]
			h = fnvAdd(fnvString(fnvString(h, k), p.Unit), uint64(p.Every))
		}
	}
	return h
}
