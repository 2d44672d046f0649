package usage

import (
	"cmp"
	"maps"
	"slices"
)

// Line is one tenant's or one task's usage over a window.
type Line struct {
	Tenant     int64
	Task       int64 // 0: the tenant as a whole (its tasks and itself)
	TenantName string
	TaskName   string
	// Spend is the units charged, by resource.
	Spend map[string]int64
	// SlotNanos is the slot-nanoseconds held, by lease class: a lease held
	// for a second is 1e9; a block of 4 slots for a second, 4e9.
	SlotNanos map[string]int64
	// Peak is the most slots held at once in the subtree, by class.
	Peak map[string]int64
	// Denied counts refusals by cause.
	Denied map[string]int64
}

// Window is what a report covers: the minutes [From, To), counted up to
// Now (unix nanoseconds) where they reach past it.
type Window struct {
	From, To int64 // minutes
	Now      int64
}

type group struct{ tenant, task int64 }

type heldRows struct {
	carry      int64 // the level carried into the window
	byMinute   map[int64]*minuteHeld
	tenantName string
	taskName   string
}

type minuteHeld struct{ peak, end, tail int64 }

// Report sums records (the window's, and the HeldEnd rows carried into it)
// into one line per tenant and one per task, ordered by tenant, then task.
func Report(recs []Record, w Window) []Line {
	rep := report{w: w, lines: map[group]*Line{}, held: map[classLine]*heldRows{}}
	for _, r := range recs {
		switch r.Kind {
		case Spend, Denied:
			rep.addAmount(r)
		case Peak, HeldEnd, HeldTail:
			rep.addHeld(r)
		}
	}
	rep.integrateHeld()
	out := make([]Line, 0, len(rep.lines))
	for _, k := range slices.SortedFunc(maps.Keys(rep.lines), func(a, b group) int {
		return cmp.Or(cmp.Compare(a.tenant, b.tenant), cmp.Compare(a.task, b.task))
	}) {
		out = append(out, *rep.lines[k])
	}
	return out
}

// report is a Report being summed.
type report struct {
	w     Window
	lines map[group]*Line
	held  map[classLine]*heldRows
}

// classLine is a class on a line of the report.
type classLine struct {
	tenant, task int64
	class        string
}

// inWindow reports whether a record of minute m counts in the window.
func (rep *report) inWindow(m int64) bool {
	return m >= rep.w.From && m < rep.w.To && m <= MinuteOf(rep.w.Now)
}

// line is g's line, made with r's names the first time.
func (rep *report) line(g group, r Record) *Line {
	l := rep.lines[g]
	if l == nil {
		l = &Line{Tenant: g.tenant, Task: g.task, TenantName: r.TenantName, Spend: map[string]int64{},
			SlotNanos: map[string]int64{}, Peak: map[string]int64{}, Denied: map[string]int64{}}
		if g.task != 0 {
			l.TaskName = r.TaskName
		}
		rep.lines[g] = l
	}
	return l
}

// addAmount adds a Spend or Denied record to its task's line and to its
// tenant's, which sums its tasks and itself.
func (rep *report) addAmount(r Record) {
	if !rep.inWindow(r.Minute) {
		return
	}
	add := func(g group) {
		m := rep.line(g, r).Spend
		if r.Kind == Denied {
			m = rep.line(g, r).Denied
		}
		m[r.Name] += r.Amount
	}
	add(group{r.Tenant, 0})
	if r.Task != 0 {
		add(group{r.Tenant, r.Task})
	}
}

// addHeld notes a Peak, HeldEnd or HeldTail record of a class: a HeldEnd
// from before the window is the level carried into it.
func (rep *report) addHeld(r Record) {
	k := classLine{r.Tenant, r.Task, r.Name}
	h := rep.held[k]
	if h == nil {
		h = &heldRows{byMinute: map[int64]*minuteHeld{}, tenantName: r.TenantName, taskName: r.TaskName}
		rep.held[k] = h
	}
	if r.Minute < rep.w.From {
		if r.Kind == HeldEnd {
			h.carry = r.Amount
		}
		return
	}
	if !rep.inWindow(r.Minute) {
		return
	}
	mh := h.byMinute[r.Minute]
	if mh == nil {
		mh = &minuteHeld{}
		h.byMinute[r.Minute] = mh
	}
	switch r.Kind {
	case Peak:
		mh.peak = r.Amount
	case HeldEnd:
		mh.end = r.Amount
	case HeldTail:
		mh.tail = r.Amount
	}
}

// integrateHeld puts each class's slot-time and peak on its line.
func (rep *report) integrateHeld() {
	for k, h := range rep.held {
		slot, peak := h.integrate(rep.w)
		if slot == 0 && peak == 0 {
			continue
		}
		l := rep.line(group{k.tenant, k.task}, Record{TenantName: h.tenantName, TaskName: h.taskName})
		if slot != 0 {
			l.SlotNanos[k.class] = slot
		}
		if peak != 0 {
			l.Peak[k.class] = peak
		}
	}
}

// integrate is the slot-nanoseconds held over the window, and the most
// held at once, from the carried level and each minute's changes.
func (h *heldRows) integrate(w Window) (slotNanos, peak int64) {
	level := h.carry
	end := min(w.To*minuteNanos, w.Now)
	at := w.From * minuteNanos
	if at >= end {
		return 0, 0
	}
	peak = level
	for _, m := range slices.Sorted(maps.Keys(h.byMinute)) {
		ms, me := m*minuteNanos, (m+1)*minuteNanos
		slotNanos += level * (ms - at) // no change between
		mh := h.byMinute[m]
		if me <= end {
			slotNanos += level*minuteNanos + mh.tail
		} else { // the minute now is in: its changes so far, up to now
			slotNanos += level*(end-ms) + mh.tail - (mh.end-level)*(me-end)
		}
		peak = max(peak, mh.peak)
		level, at = mh.end, me
	}
	if at < end {
		slotNanos += level * (end - at)
	}
	return slotNanos, peak
}
