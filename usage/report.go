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
	lines := map[group]*Line{}
	line := func(g group, r Record) *Line {
		l := lines[g]
		if l == nil {
			l = &Line{Tenant: g.tenant, Task: g.task, TenantName: r.TenantName, Spend: map[string]int64{},
				SlotNanos: map[string]int64{}, Peak: map[string]int64{}, Denied: map[string]int64{}}
			if g.task != 0 {
				l.TaskName = r.TaskName
			}
			lines[g] = l
		}
		return l
	}
	held := map[[3]any]*heldRows{}
	for _, r := range recs {
		inWindow := r.Minute >= w.From && r.Minute < w.To && r.Minute <= MinuteOf(w.Now)
		switch r.Kind {
		case Spend, Denied:
			if !inWindow {
				continue
			}
			add := func(g group) {
				m := line(g, r).Spend
				if r.Kind == Denied {
					m = line(g, r).Denied
				}
				m[r.Name] += r.Amount
			}
			add(group{r.Tenant, 0}) // the tenant's line sums its tasks and itself
			if r.Task != 0 {
				add(group{r.Tenant, r.Task})
			}
		case Peak, HeldEnd, HeldTail:
			k := [3]any{r.Tenant, r.Task, r.Name}
			h := held[k]
			if h == nil {
				h = &heldRows{byMinute: map[int64]*minuteHeld{}, tenantName: r.TenantName, taskName: r.TaskName}
				held[k] = h
			}
			if r.Minute < w.From {
				if r.Kind == HeldEnd {
					h.carry = r.Amount
				}
				continue
			}
			if !inWindow {
				continue
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
	}
	for k, h := range held {
		tenant, task, class := k[0].(int64), k[1].(int64), k[2].(string)
		slot, peak := h.integrate(w)
		if slot == 0 && peak == 0 {
			continue
		}
		l := line(group{tenant, task}, Record{TenantName: h.tenantName, TaskName: h.taskName})
		if slot != 0 {
			l.SlotNanos[class] = slot
		}
		if peak != 0 {
			l.Peak[class] = peak
		}
	}
	out := make([]Line, 0, len(lines))
	for _, k := range slices.SortedFunc(maps.Keys(lines), func(a, b group) int {
		return cmp.Or(cmp.Compare(a.tenant, b.tenant), cmp.Compare(a.task, b.task))
	}) {
		out = append(out, *lines[k])
	}
	return out
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
