package usage

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/governor-project/governor/governor/engine"
)

// Buckets follow the calendar of their time zone: an hour in Kolkata
// starts at half past in UTC, New York's day of the spring change has 23
// hours, and January 31 ends its month.
func TestBuckets(t *testing.T) {
	ny, _ := time.LoadLocation("America/New_York")
	kolkata, _ := time.LoadLocation("Asia/Kolkata")
	min := func(y int, m time.Month, d, h, mi int) int64 {
		return time.Date(y, m, d, h, mi, 0, 0, time.UTC).Unix() / 60
	}
	for _, c := range []struct {
		unit     Unit
		at       int64
		loc      *time.Location
		from, to int64
	}{
		{Hour, min(2026, 3, 8, 12, 10), kolkata, min(2026, 3, 8, 11, 30), min(2026, 3, 8, 12, 30)},
		{Day, min(2026, 3, 8, 12, 0), ny, min(2026, 3, 8, 5, 0), min(2026, 3, 9, 4, 0)},    // 23 hours
		{Day, min(2026, 11, 1, 12, 0), ny, min(2026, 11, 1, 4, 0), min(2026, 11, 2, 5, 0)}, // 25 hours
		{Month, min(2026, 1, 31, 23, 59), time.UTC, min(2026, 1, 1, 0, 0), min(2026, 2, 1, 0, 0)},
		{Month, min(2026, 2, 1, 0, 0), time.UTC, min(2026, 2, 1, 0, 0), min(2026, 3, 1, 0, 0)},
	} {
		if got := Bucket(c.unit, c.at, c.loc); got.From != c.from || got.To != c.to {
			t.Errorf("%s holding %v in %v: [%v, %v), want [%v, %v)", c.unit, time.Unix(c.at*60, 0).UTC(), c.loc,
				time.Unix(got.From*60, 0).UTC(), time.Unix(got.To*60, 0).UTC(), time.Unix(c.from*60, 0).UTC(), time.Unix(c.to*60, 0).UTC())
		}
	}
	if n := len(Buckets(Hour, min(2026, 3, 8, 5, 0), min(2026, 3, 9, 4, 0), ny)); n != 23 {
		t.Errorf("New York's day of the spring change holds %d hours, want 23", n)
	}
}

// A rollup is the sum of the finer buckets it holds: for random histories
// of two days (across New York's spring change), the report of each day,
// and of the whole span, equals the Sum of the reports of its hours, in a
// zone whose hours are whole in UTC and in one whose hours are not. This
// is what lets governord roll hours from minutes, and days and months
// from the rollups before them.
func TestRollupsSumToTheReport(t *testing.T) {
	ny, _ := time.LoadLocation("America/New_York")
	kolkata, _ := time.LoadLocation("Asia/Kolkata")
	seeds := 8
	if testing.Short() {
		seeds = 2
	}
	for seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			st, first, last := history(t, uint64(seed), time.Date(2026, 3, 7, 12, 0, 0, 0, time.UTC))
			now := last + int64(time.Hour)
			for _, loc := range []*time.Location{ny, kolkata} {
				days := Buckets(Day, MinuteOf(first), MinuteOf(last)+1, loc)
				var dayLines [][]Line
				for _, d := range days {
					var hourLines [][]Line
					for _, h := range Buckets(Hour, d.From, d.To, loc) {
						h.Now = now
						hourLines = append(hourLines, Report(st.window(h), h))
					}
					d.Now = now
					want := Report(st.window(d), d)
					if g, w := flatten(Sum(hourLines...)), flatten(want); g != w {
						t.Fatalf("%v: the day from %v, summed from its hours:\n got %s\nwant %s", loc, time.Unix(d.From*60, 0).UTC(), g, w)
					}
					dayLines = append(dayLines, want)
				}
				whole := Window{From: days[0].From, To: days[len(days)-1].To, Now: now}
				all := Report(st.window(whole), whole)
				if g, w := flatten(Sum(dayLines...)), flatten(all); g != w {
					t.Fatalf("%v: %d days summed:\n got %s\nwant %s", loc, len(days), g, w)
				}
				if len(days) < 2 || !strings.Contains(flatten(all), "slotns") || !strings.Contains(flatten(all), "peak") {
					t.Fatalf("%v: a history of %d days, reading %s: too little to check", loc, len(days), flatten(all))
				}
			}
		})
	}
}

// history runs a random history of about two days from start on a real
// engine and returns its usage records, and its first and last events'
// times.
func history(t *testing.T, seed uint64, start time.Time) (st storeOf, first, last int64) {
	rng := rand.New(rand.NewPCG(seed, 11))
	clock := &fakeClock{}
	clock.ns.Store(start.UnixNano())
	rec := &recorder{}
	e, err := engine.New(engine.Config{Clock: clock, Sink: rec, Retention: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	fold := New(e.Snapshot())
	d := newDriver(t, rng, e, clock)
	d.stretch = 30
	for range 1500 {
		d.step()
	}
	st = storeOf{}
	for _, ev := range rec.events {
		fold.Add(ev)
	}
	st.add(fold.Take())
	return st, rec.events[0].At, rec.events[len(rec.events)-1].At
}
