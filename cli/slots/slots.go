// Package slots says what the leases and delegated blocks of an Inspection
// hold, in the one way the operator's tools say it (governor doctor, caps
// get and top): a lease is held by work; a block is slots delegated to a
// session (a sidecar), of which some hold work there, since when the one
// held longest has, and the rest are idle, as its holder reports
// (ReportBlockUse). It imports the generated API only.
package slots

import (
	"fmt"
	"time"

	"github.com/governor-project/governor/api/governorpb"
)

// Reported reports whether l is a block whose holder reported its use.
func Reported(l *governorpb.LeaseInfo) bool { return l.GetBlock() && l.GetUseReported() != nil }

// Idle is how many of a reported block's slots hold no work.
func Idle(l *governorpb.LeaseInfo) int64 {
	if !Reported(l) {
		return 0
	}
	return l.GetCount() - l.GetInUse()
}

// Held is how long the work held longest in l has held its slot: a lease
// since its grant; a reported block since the oldest of its work's (0 when
// none is in use). For a block whose use is not reported it is unknown:
// ok is false.
func Held(l *governorpb.LeaseInfo, now time.Time) (d time.Duration, ok bool) {
	switch {
	case !l.GetBlock():
		return now.Sub(l.GetGranted().AsTime()), true
	case !Reported(l):
		return 0, false
	case l.GetInUse() > 0 && l.GetInUseSince() != nil:
		return now.Sub(l.GetInUseSince().AsTime()), true
	}
	return 0, true
}

// Text says l in one line, ages counted to now:
//
//	lease 22 of db, session 5: held for 12s
//	block 21 of web, session 5: 4 slots delegated; 1 in use (for 3s), 3 idle
//	block 21 of web, session 5: 4 slots delegated for 22s; how many are in use is not reported
//	block 21 of web, session 5: no slots now
func Text(l *governorpb.LeaseInfo, now time.Time) string {
	head := fmt.Sprintf("%s %d of %s, session %d: ", map[bool]string{false: "lease", true: "block"}[l.GetBlock()], l.GetId(), l.GetClass(), l.GetSessionId())
	age, _ := Held(l, now)
	switch {
	case !l.GetBlock():
		return head + "held for " + Age(age)
	case l.GetCount() == 0:
		return head + "no slots now"
	case !Reported(l):
		return head + fmt.Sprintf("%s delegated for %s; how many are in use is not reported", plural(l.GetCount(), "slot"),
			Age(now.Sub(l.GetGranted().AsTime())))
	case l.GetInUse() == 0:
		return head + fmt.Sprintf("%s delegated; none in use, %d idle", plural(l.GetCount(), "slot"), Idle(l))
	}
	return head + fmt.Sprintf("%s delegated; %d in use (for %s), %d idle", plural(l.GetCount(), "slot"), l.GetInUse(), Age(age), Idle(l))
}

// Tally is what a set of leases and blocks holds.
type Tally struct {
	Leases     int64 `json:"leases"`              // slots held as leases
	Delegated  int64 `json:"delegated"`           // slots held in blocks
	InUse      int64 `json:"in_use"`              // of the delegated, holding work (reported)
	Idle       int64 `json:"idle"`                // of the delegated, holding none (reported)
	Unreported int64 `json:"unreported,omitzero"` // of the delegated, in blocks whose use is not reported
}

// Add counts l.
func (t *Tally) Add(l *governorpb.LeaseInfo) {
	switch {
	case !l.GetBlock():
		t.Leases++ // a lease is one slot
	case Reported(l):
		t.Delegated += l.GetCount()
		t.InUse += l.GetInUse()
		t.Idle += Idle(l)
	default:
		t.Delegated += l.GetCount()
		t.Unreported += l.GetCount()
	}
}

// Text says the tally in words: "1 lease, 3 delegated (1 in use, 2
// idle)", "3 delegated (...)", "2 leases".
func (t Tally) Text() string {
	if t.Delegated == 0 {
		return plural(t.Leases, "lease")
	}
	s := fmt.Sprintf("%d delegated (%d in use, %d idle", t.Delegated, t.InUse, t.Idle)
	if t.Unreported > 0 {
		s += fmt.Sprintf(", %d not reported", t.Unreported)
	}
	if t.Leases > 0 {
		return plural(t.Leases, "lease") + ", " + s + ")"
	}
	return s + ")"
}

// Age is a duration as the tools print an age: 3s, 12m09s, 2h05m.
func Age(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	}
	return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
}

func plural(n int64, what string) string {
	if n == 1 {
		return fmt.Sprintf("1 %s", what)
	}
	return fmt.Sprintf("%d %ss", n, what)
}
