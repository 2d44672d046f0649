package usage

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/governor-project/governor/governor/engine"
)

// Unit is the bucket of time a rollup totals: an hour, a day or a month,
// on the calendar of a time zone (that of calendar periods, so that a
// day's rollup is what a daily budget counted).
type Unit string

// The units of rollups, finest first.
const (
	Hour  Unit = "hour"
	Day   Unit = "day"
	Month Unit = "month"
)

// Units are the rollups' units, finest first: each is summed from the one
// before it, and an hour from minute records.
var Units = []Unit{Hour, Day, Month}

// ParseUnit reads a unit's name.
func ParseUnit(s string) (Unit, error) {
	if u := Unit(s); slices.Contains(Units, u) {
		return u, nil
	}
	return "", fmt.Errorf("%q is not hour, day or month", s)
}

// Finer is the unit u is summed from; "" for an hour, which is summed
// from minutes.
func (u Unit) Finer() Unit {
	if i := slices.Index(Units, u); i > 0 {
		return Units[i-1]
	}
	return ""
}

// Bucket is the bucket of unit u that holds minute m in loc, as the
// minutes [From, To). A bucket starts on a minute (every time zone's
// offset is whole minutes today); one that would not is taken from the
// minute it starts in.
func Bucket(u Unit, m int64, loc *time.Location) Window {
	w := engine.Period{Unit: string(u)}.WindowAt(m*minuteNanos, loc)
	return Window{From: MinuteOf(w.Start), To: MinuteOf(w.End-1) + 1}
}

// Buckets are the buckets of unit u that meet the minutes [from, to), in
// order.
func Buckets(u Unit, from, to int64, loc *time.Location) []Window {
	var out []Window
	for m := from; m < to; {
		b := Bucket(u, m, loc)
		out = append(out, b)
		m = b.To
	}
	return out
}

// Sum adds up lines of several buckets into one line per tenant and task:
// units spent, slot-time held and refusals add; the peak is the largest.
// Lines are ordered as Report orders them.
func Sum(lines ...[]Line) []Line {
	byGroup := map[group]*Line{}
	for _, ls := range lines {
		for _, l := range ls {
			g := group{l.Tenant, l.Task}
			sum := byGroup[g]
			if sum == nil {
				sum = &Line{Tenant: l.Tenant, Task: l.Task, Spend: map[string]int64{}, SlotNanos: map[string]int64{},
					Peak: map[string]int64{}, Denied: map[string]int64{}}
				byGroup[g] = sum
			}
			sum.TenantName, sum.TaskName = cmp.Or(l.TenantName, sum.TenantName), cmp.Or(l.TaskName, sum.TaskName)
			addInto(sum.Spend, l.Spend)
			addInto(sum.SlotNanos, l.SlotNanos)
			addInto(sum.Denied, l.Denied)
			for k, v := range l.Peak {
				sum.Peak[k] = max(sum.Peak[k], v)
			}
		}
	}
	out := make([]Line, 0, len(byGroup))
	for _, g := range slices.SortedFunc(maps.Keys(byGroup), func(a, b group) int {
		return cmp.Or(cmp.Compare(a.tenant, b.tenant), cmp.Compare(a.task, b.task))
	}) {
		out = append(out, *byGroup[g])
	}
	return out
}

func addInto(to, from map[string]int64) {
	for k, v := range from {
		to[k] += v
	}
}
