package engine

import (
	"errors"
	"math"
	"testing"
	"time"
	_ "time/tzdata" // the same zone data on every machine that runs the tests
)

func newYork(t *testing.T) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// newPeriodFixture is newFixture with its clock at at and calendar
// periods in loc.
func newPeriodFixture(t *testing.T, loc *time.Location, at time.Time) *fixture {
	t.Helper()
	f := &fixture{t: t, clock: newFakeClock(), rec: &recorder{}}
	f.clock.ns.Store(at.UnixNano())
	f.cfg = Config{Clock: f.clock, Sink: f.rec, Location: loc}
	e, err := New(f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.e = e
	f.acme = f.create(System, RootID, NodeSpec{Name: "acme"})
	f.job = f.create(System, f.acme, NodeSpec{Name: "job"})
	f.step = f.create(System, f.job, NodeSpec{Name: "step"})
	f.job2 = f.create(System, f.acme, NodeSpec{Name: "job2"})
	f.sA = f.open(f.acme, 1000*time.Hour)
	return f
}

func (f *fixture) setClock(at time.Time) { f.clock.ns.Store(at.UnixNano()) }

// windowOf is the window of p holding at, in loc.
func windowOf(p Period, at time.Time, loc *time.Location) (from, to time.Time) {
	w := p.window(at.UnixNano(), loc)
	return time.Unix(0, w.Start).In(loc), time.Unix(0, w.End).In(loc)
}

func TestPeriodCalendarWindows(t *testing.T) {
	ny := newYork(t)
	at := func(y int, m time.Month, d, h, min int) time.Time { return time.Date(y, m, d, h, min, 0, 0, ny) }
	for _, c := range []struct {
		what     string
		p        Period
		at       time.Time
		from, to time.Time
		length   time.Duration
	}{
		// January 31 ends on February 1, not on March 3 (January 31 plus a month).
		{"month, Jan 31", Period{Unit: PeriodMonth}, at(2026, 1, 31, 23, 59), at(2026, 1, 1, 0, 0), at(2026, 2, 1, 0, 0), 31 * 24 * time.Hour},
		{"month, February", Period{Unit: PeriodMonth}, at(2026, 2, 1, 0, 0), at(2026, 2, 1, 0, 0), at(2026, 3, 1, 0, 0), 28 * 24 * time.Hour},
		// Clocks go forward on March 8, 2026: March is an hour short.
		{"month across the spring DST change", Period{Unit: PeriodMonth}, at(2026, 3, 20, 12, 0), at(2026, 3, 1, 0, 0), at(2026, 4, 1, 0, 0), 31*24*time.Hour - time.Hour},
		{"month across the autumn DST change", Period{Unit: PeriodMonth}, at(2026, 11, 2, 0, 0), at(2026, 11, 1, 0, 0), at(2026, 12, 1, 0, 0), 30*24*time.Hour + time.Hour},
		{"day of the spring change", Period{Unit: PeriodDay}, at(2026, 3, 8, 12, 0), at(2026, 3, 8, 0, 0), at(2026, 3, 9, 0, 0), 23 * time.Hour},
		{"day of the autumn change", Period{Unit: PeriodDay}, at(2026, 11, 1, 12, 0), at(2026, 11, 1, 0, 0), at(2026, 11, 2, 0, 0), 25 * time.Hour},
		// Weeks start on Monday: Sunday March 8 is in the week of Monday March 2.
		{"week, a Sunday", Period{Unit: PeriodWeek}, at(2026, 3, 8, 23, 0), at(2026, 3, 2, 0, 0), at(2026, 3, 9, 0, 0), 7*24*time.Hour - time.Hour},
		{"week, a Monday at midnight", Period{Unit: PeriodWeek}, at(2026, 3, 9, 0, 0), at(2026, 3, 9, 0, 0), at(2026, 3, 16, 0, 0), 7 * 24 * time.Hour},
		{"hour", Period{Unit: PeriodHour}, at(2026, 3, 8, 3, 30), at(2026, 3, 8, 3, 0), at(2026, 3, 8, 4, 0), time.Hour},
	} {
		from, to := windowOf(c.p, c.at, ny)
		if !from.Equal(c.from) || !to.Equal(c.to) || to.Sub(from) != c.length {
			t.Errorf("%s: window of %v is [%v, %v) (%v); want [%v, %v) (%v)", c.what, c.at, from, to, to.Sub(from), c.from, c.to, c.length)
		}
	}
	// When clocks go back, 01:30 comes twice: each is in an hour of its own.
	first := time.Date(2026, 11, 1, 5, 30, 0, 0, time.UTC)  // 01:30 EDT
	second := time.Date(2026, 11, 1, 6, 30, 0, 0, time.UTC) // 01:30 EST
	f1, t1 := windowOf(Period{Unit: PeriodHour}, first, ny)
	f2, t2 := windowOf(Period{Unit: PeriodHour}, second, ny)
	if !t1.Equal(f2) || t1.Sub(f1) != time.Hour || t2.Sub(f2) != time.Hour || !f1.Equal(first.Add(-30*time.Minute)) {
		t.Errorf("the repeated hour: [%v, %v) then [%v, %v)", f1, t1, f2, t2)
	}
}

func TestPeriodDurationWindows(t *testing.T) {
	ten := Period{Every: int64(10 * time.Second)}
	at := time.Date(2026, 1, 1, 0, 0, 17, 5, time.UTC).UnixNano()
	if w := ten.window(at, time.UTC); w.Start != at-int64(7*time.Second)-5 || w.End != w.Start+int64(10*time.Second) {
		t.Errorf("10s at :17: %+v; want the window from :10", w)
	}
	if w := ten.window(-1, time.UTC); w.Start != -int64(10*time.Second) || w.End != 0 {
		t.Errorf("10s at -1ns: %+v", w)
	}
	// The longest period never ends, and nothing wraps.
	if w := (Period{Every: math.MaxInt64}).window(at, time.UTC); w.Start != 0 || w.End != math.MaxInt64 {
		t.Errorf("a period of 2^63-1 ns: %+v", w)
	}
	if w := (Period{Every: 1 << 62}).window(math.MaxInt64-1, time.UTC); w.End != math.MaxInt64 || w.Start > math.MaxInt64-1 {
		t.Errorf("a window past the clock's last instant: %+v", w)
	}
	if w := (Period{Unit: PeriodMonth}).window(math.MaxInt64-1, time.UTC); w.End != math.MaxInt64 {
		t.Errorf("a month past the clock's last instant: %+v", w)
	}
}

// A monthly quota in New York, on the engine's clock: refused on January
// 31, admitted again at the first instant of February 1 (local), and the
// reset is an event of its own, before the call that found it due.
func TestPeriodMonthlyResetsAtTheBoundary(t *testing.T) {
	ny := newYork(t)
	f := newPeriodFixture(t, ny, time.Date(2026, 1, 31, 12, 0, 0, 0, ny))
	f.setCaps(f.acme, CapsEdit{Quotas: map[string]int64{"tokens": 100}, QuotaPeriods: map[string]Period{"tokens": {Unit: PeriodMonth}}})
	f.consume(f.sA, f.step, "tokens", 100)
	feb := time.Date(2026, 2, 1, 0, 0, 0, 0, ny)
	if d, ok := f.e.DueIn(); !ok || d != feb.Sub(f.clock.Now()) {
		t.Fatalf("DueIn %v %v; want the boundary in %v", d, ok, feb.Sub(f.clock.Now()))
	}
	f.setClock(feb.Add(-1))
	var d *Denial
	if err := f.e.Consume(f.sA, f.step, "tokens", 1, ""); !errors.As(err, &d) || d.ResetAt != feb.UnixNano() || d.Used != 100 {
		t.Fatalf("a nanosecond before February: %v; want a denial of 100 used resetting at %v", err, feb)
	}
	f.setClock(feb)
	before := f.e.Seq()
	f.consume(f.sA, f.step, "tokens", 60)
	evs := f.rec.events[before:]
	if len(evs) != 2 || evs[0].Kind != EvPeriodReset || evs[0].Node != f.acme || evs[0].Amount != 100 || evs[0].At != feb.UnixNano() ||
		evs[0].Windows["tokens"] != (Window{Start: feb.UnixNano(), End: time.Date(2026, 3, 1, 0, 0, 0, 0, ny).UnixNano()}) || evs[1].Kind != EvConsumed {
		t.Fatalf("events at the boundary: %+v; want the reset of 100, then the consume", evs)
	}
	// Used stays the subtree's spend for ever; the window's is 60.
	if v := f.node(f.acme); v.Used["tokens"] != 160 || v.Periods["tokens"].Base != 100 {
		t.Fatalf("after the reset: used %d, base %d", v.Used["tokens"], v.Periods["tokens"].Base)
	}
	if err := f.e.Consume(f.sA, f.step, "tokens", 41, ""); !errors.As(err, &d) || d.Used != 60 {
		t.Fatalf("41 more of a window with 60 spent: %v", err)
	}
	// Across the DST change: March's window ends at April 1, 00:00 EDT.
	f.setClock(time.Date(2026, 3, 1, 0, 0, 0, 0, ny))
	f.Reap()
	if st := f.periods(f.step); len(st) != 1 || st[0].End != time.Date(2026, 4, 1, 0, 0, 0, 0, ny).UnixNano() || st[0].Spent != 0 {
		t.Fatalf("March: %+v", st)
	}
}

func (f *fixture) Reap() { f.e.Reap() }

func (f *fixture) periods(id NodeID) []PeriodStatus {
	f.t.Helper()
	st, err := f.e.PeriodStatus(System, id)
	if err != nil {
		f.t.Fatal(err)
	}
	return st
}

// Reap resets with no traffic, so the log says when each window closed.
func TestPeriodResetByReapAlone(t *testing.T) {
	f := newPeriodFixture(t, nil, time.Date(2026, 1, 1, 0, 0, 3, 0, time.UTC))
	f.setCaps(f.job, CapsEdit{Quotas: map[string]int64{"q": 5}, QuotaPeriods: map[string]Period{"q": {Every: int64(10 * time.Second)}}})
	f.consume(f.sA, f.job, "q", 5)
	if d, ok := f.e.DueIn(); !ok || d != 7*time.Second {
		t.Fatalf("DueIn %v %v; want 7s", d, ok)
	}
	f.clock.Advance(7 * time.Second)
	before := f.e.Seq()
	f.e.Reap()
	if evs := f.rec.events[before:]; len(evs) != 1 || evs[0].Kind != EvPeriodReset || evs[0].Amount != 5 {
		t.Fatalf("Reap at the boundary emitted %+v", evs)
	}
	f.e.Reap()
	if f.e.Seq() != before+1 {
		t.Fatal("a second Reap reset again")
	}
	// Nothing spent in a window: the reset still closes it, with 0.
	f.clock.Advance(10 * time.Second)
	f.e.Reap()
	if ev := f.rec.events[len(f.rec.events)-1]; ev.Kind != EvPeriodReset || ev.Amount != 0 {
		t.Fatalf("an idle window's reset: %+v", ev)
	}
}

// Units reserved and unspent at a reset stay reserved: they count against
// the new window, where they are spent or returned, so the quota holds at
// every instant. A task budget without a period never refills beneath a
// tenant's that does.
func TestPeriodResetKeepsReservationsAndLifetimeBudgets(t *testing.T) {
	f := newPeriodFixture(t, nil, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	f.setCaps(f.acme, CapsEdit{Quotas: map[string]int64{"q": 100}, QuotaPeriods: map[string]Period{"q": {Every: int64(time.Minute)}}})
	f.setCaps(f.job2, CapsEdit{Quotas: map[string]int64{"q": 150}}) // a lifetime budget
	f.consume(f.sA, f.job, "q", 50)
	res, err := f.e.Reserve(f.sA, ReserveRequest{Node: f.job, Resource: "q", Want: 40, Exact: true})
	if err != nil || res.Granted != 40 {
		t.Fatalf("reserve: %+v %v", res, err)
	}
	f.consume(f.sA, f.job2, "q", 10)
	f.clock.Advance(time.Minute)
	f.Reap()
	// 40 are still reserved: 60 fit in the new window, not 100.
	if err := f.e.Consume(f.sA, f.job2, "q", 61, ""); !errors.Is(err, ErrRecalling) {
		t.Fatalf("61 with 40 reserved in a new window of 100: %v; want a recall", err)
	}
	f.consume(f.sA, f.job2, "q", 60)
	// The reserved units spent after the reset are the new window's.
	if _, err := f.e.Reserve(f.sA, ReserveRequest{Node: f.job, Resource: "q", Spent: 40}); err != nil {
		t.Fatal(err)
	}
	if st := f.periods(f.job); st[0].Spent != 100 {
		t.Fatalf("the new window spent %d; want 100 (60 consumed, 40 reserved before the reset)", st[0].Spent)
	}
	// job2's lifetime budget of 150 has 70 spent; the tenant's window is full.
	f.clock.Advance(time.Minute)
	f.consume(f.sA, f.job2, "q", 80)
	var d *Denial
	if err := f.e.Consume(f.sA, f.job2, "q", 1, ""); !errors.As(err, &d) || d.Node != f.job2 || d.ResetAt != 0 || d.Used != 150 {
		t.Fatalf("past job2's lifetime budget: %v; want its denial, no reset", err)
	}
	f.clock.Advance(time.Hour)
	if err := f.e.Consume(f.sA, f.job2, "q", 1, ""); !errors.As(err, &d) || d.Node != f.job2 {
		t.Fatalf("an hour on, job2's budget refilled: %v", err)
	}
}

// A grant charged in one window and given back in the next refunds
// nothing to the new window: quota is never refunded into a window that
// did not spend it.
func TestPeriodGiveBackDoesNotCreditANewWindow(t *testing.T) {
	f := newPeriodFixture(t, nil, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	f.setCaps(f.acme, CapsEdit{Quotas: map[string]int64{"q": 10}, QuotaPeriods: map[string]Period{"q": {Every: int64(time.Minute)}}})
	req := AcquireRequest{Node: f.job, Charges: map[string]int64{"q": 8}, Class: "c", RequestID: "r1"}
	if _, _, err := f.e.Acquire(f.sA, req); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(time.Minute)
	f.consume(f.sA, f.job, "q", 10) // the new window is full
	if id, err := f.e.GiveBack(f.sA, req, 0); err != nil || id == 0 {
		t.Fatalf("give-back: %d %v", id, err)
	}
	if st := f.periods(f.job); st[0].Spent != 10 {
		t.Fatalf("after a give-back of the last window's 8, this window has spent %d; want 10", st[0].Spent)
	}
	if err := f.e.Consume(f.sA, f.job, "q", 1, ""); !errors.Is(err, ErrQuotaExhausted) {
		t.Fatalf("the give-back credited the new window: %v", err)
	}
	if v := f.node(f.acme); v.Used["q"] != 10 {
		t.Fatalf("used %d; the grant's 8 are refunded from the subtree's spend", v.Used["q"])
	}
}

// A grant charged in one window, a reset, the period removed, and then the
// grant given back: the window's start stays with the removed period, so
// the give-back lowers base with used and the state restores (a removed
// period once forgot its window, left base above used, and its snapshot
// was refused as corrupt; seed 51 of the randomized checker found it).
func TestPeriodRemovedThenGrantGivenBackStillRestores(t *testing.T) {
	f := newPeriodFixture(t, nil, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	f.setCaps(f.acme, CapsEdit{Quotas: map[string]int64{"q": 10}, QuotaPeriods: map[string]Period{"q": {Every: int64(time.Minute)}}})
	req := AcquireRequest{Node: f.job, Charges: map[string]int64{"q": 3}, Class: "c", RequestID: "r1"}
	if _, _, err := f.e.Acquire(f.sA, req); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(time.Minute) // the reset: base 3
	f.setCaps(f.acme, CapsEdit{QuotaPeriods: map[string]Period{"q": {}}})
	if id, err := f.e.GiveBack(f.sA, req, 0); err != nil || id == 0 {
		t.Fatalf("give-back: %d %v", id, err)
	}
	if v := f.node(f.acme); v.Used["q"] != 0 || v.Periods["q"].Base > v.Used["q"] {
		t.Fatalf("after the give-back: used %d, base %d", v.Used["q"], v.Periods["q"].Base)
	}
	for _, way := range []string{wayRestore, wayReplay} {
		f.rebuild(t, way)
	}
}

// Snapshots and replay keep periods and the current window; the reset
// still comes at the boundary, not a period after the restart; replay
// needs no time zone.
func TestPeriodSurvivesRestoreAndReplay(t *testing.T) {
	ny := newYork(t)
	f := newPeriodFixture(t, ny, time.Date(2026, 1, 31, 12, 0, 0, 0, ny))
	f.setCaps(f.acme, CapsEdit{Quotas: map[string]int64{"q": 10}, QuotaPeriods: map[string]Period{"q": {Unit: PeriodDay}},
		DefaultQuotas: map[string]int64{"q": 5}, DefaultQuotaPeriods: map[string]Period{"q": {Every: int64(time.Hour)}}})
	kid := f.create(System, f.acme, NodeSpec{Name: "kid"})
	f.consume(f.sA, kid, "q", 5)
	for _, way := range []string{wayRestore, wayReplay} {
		e := f.rebuild(t, way)
		v, _ := e.Get(System, f.acme)
		k, _ := e.Get(System, kid)
		if v.Periods["q"] != f.node(f.acme).Periods["q"] || k.Periods["q"].Period.Every != int64(time.Hour) || v.DefaultQuotaPeriods["q"].Every != int64(time.Hour) {
			t.Fatalf("%s: periods %+v, %+v", way, v.Periods, k.Periods)
		}
		e.Reap()                                       // a restored engine knows its sessions' expiries only after a Reap
		if d, ok := e.DueIn(); !ok || d != time.Hour { // the kid's hour ends at 13:00
			t.Fatalf("%s: DueIn %v %v; want 1h", way, d, ok)
		}
	}
	f.clock.Advance(time.Hour)
	f.consume(f.sA, kid, "q", 5) // the kid's hour reset
	f.setClock(time.Date(2026, 2, 1, 0, 0, 0, 0, ny))
	for _, way := range []string{wayRestore, wayReplay} {
		e := f.rebuild(t, way)
		if err := e.Consume(System, kid, "q", 5, ""); err != nil {
			t.Fatalf("%s: after midnight in New York: %v", way, err)
		}
	}
}

func TestPeriodHostile(t *testing.T) {
	f := newPeriodFixture(t, nil, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	for _, c := range []struct {
		what string
		edit CapsEdit
	}{
		{"negative", CapsEdit{Quotas: map[string]int64{"q": 1}, QuotaPeriods: map[string]Period{"q": {Every: -1}}}},
		{"MinInt64", CapsEdit{Quotas: map[string]int64{"q": 1}, QuotaPeriods: map[string]Period{"q": {Every: math.MinInt64}}}},
		{"both", CapsEdit{Quotas: map[string]int64{"q": 1}, QuotaPeriods: map[string]Period{"q": {Every: 1, Unit: PeriodDay}}}},
		{"unknown unit", CapsEdit{Quotas: map[string]int64{"q": 1}, QuotaPeriods: map[string]Period{"q": {Unit: "fortnight"}}}},
		{"no quota", CapsEdit{QuotaPeriods: map[string]Period{"q": {Unit: PeriodDay}}}},
		{"quota removed", CapsEdit{Quotas: map[string]int64{"q": NoCap}, QuotaPeriods: map[string]Period{"q": {Unit: PeriodDay}}}},
		{"no default quota", CapsEdit{DefaultQuotaPeriods: map[string]Period{"q": {Unit: PeriodDay}}}},
		{"bad name", CapsEdit{Quotas: map[string]int64{"q": 1}, QuotaPeriods: map[string]Period{"": {Unit: PeriodDay}}}},
	} {
		before := f.e.Seq()
		if _, err := f.e.SetCaps(System, f.job, c.edit, ""); !errors.Is(err, ErrInvalid) || f.e.Seq() != before {
			t.Errorf("%s: %v; want ErrInvalid and no event", c.what, err)
		}
	}
	if _, err := f.e.SetCapsAudited(System, f.job, CapsEdit{Quotas: map[string]int64{"q": 1}, QuotaPeriods: map[string]Period{"q": {Unit: PeriodDay}}},
		Audit{For: time.Hour}, ""); !errors.Is(err, ErrInvalid) {
		t.Errorf("a period in a temporary override: %v", err)
	}
	if _, err := f.e.CreateNode(System, f.acme, NodeSpec{Name: "x", QuotaPeriods: map[string]Period{"q": {Unit: PeriodDay}}}, ""); !errors.Is(err, ErrInvalid) {
		t.Errorf("a period without its quota at creation: %v", err)
	}
	// 2^63-1 ns never ends; 1ns resets at each call at most once.
	f.setCaps(f.job, CapsEdit{Quotas: map[string]int64{"q": 1, "r": 1}, QuotaPeriods: map[string]Period{"q": {Every: math.MaxInt64}, "r": {Every: 1}}})
	f.consume(f.sA, f.job, "q", 1)
	f.consume(f.sA, f.job, "r", 1)
	f.clock.Advance(100 * 365 * 24 * time.Hour)
	before := f.e.Seq()
	f.consume(System, f.job, "r", 1)
	if f.e.Seq() != before+2 {
		t.Fatalf("a 1ns period a century on: %d events; want one reset and the consume", f.e.Seq()-before)
	}
	if err := f.e.Consume(System, f.job, "q", 1, ""); !errors.Is(err, ErrQuotaExhausted) {
		t.Fatalf("a century into a period of 2^63-1 ns: %v", err)
	}
	// Removing the period stops resets, refilling nothing; removing the
	// quota takes its period with it.
	f.setCaps(f.job, CapsEdit{QuotaPeriods: map[string]Period{"r": {}}})
	f.clock.Advance(time.Hour)
	if err := f.e.Consume(System, f.job, "r", 1, ""); !errors.Is(err, ErrQuotaExhausted) {
		t.Fatalf("after removing the period: %v", err)
	}
	f.setCaps(f.job, CapsEdit{Quotas: map[string]int64{"q": NoCap}})
	if v := f.node(f.job); v.Periods["q"] != (QuotaWindow{}) {
		t.Fatalf("the quota removed left %+v", v.Periods["q"])
	}
}

// Re-applying the same period (a config applied at every start) keeps the
// window; another period opens the window holding now, and refills
// nothing.
func TestPeriodEditKeepsOrMovesTheWindow(t *testing.T) {
	f := newPeriodFixture(t, nil, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	day := CapsEdit{Quotas: map[string]int64{"q": 10}, QuotaPeriods: map[string]Period{"q": {Unit: PeriodDay}}}
	f.setCaps(f.job, day)
	f.consume(f.sA, f.job, "q", 10)
	w := f.node(f.job).Periods["q"]
	f.clock.Advance(time.Hour)
	f.setCaps(f.job, day)
	if got := f.node(f.job).Periods["q"]; got != w {
		t.Fatalf("the same period again moved the window: %+v to %+v", w, got)
	}
	f.setCaps(f.job, CapsEdit{QuotaPeriods: map[string]Period{"q": {Unit: PeriodHour}}})
	got := f.node(f.job).Periods["q"]
	if got.Start != f.now() || got.End != f.now()+int64(time.Hour) || got.Base != 0 {
		t.Fatalf("an hourly period from 01:00: %+v", got)
	}
	if err := f.e.Consume(f.sA, f.job, "q", 1, ""); !errors.Is(err, ErrQuotaExhausted) {
		t.Fatalf("an edit of the period refilled the quota: %v", err)
	}
}
