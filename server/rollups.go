package server

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/governor-project/governor/store"
	"github.com/governor-project/governor/usage"
)

// Usage rollups: once an hour has closed (and rollupLag more has passed,
// for refusals counted as it closed), housekeeping sums its minute records
// into the hour's rollup; the last hour of a day rolls the day up from its
// hours, and the last day of a month the month from its days, on the
// calendar of time_zone, as calendar periods reset. A bucket is written
// whole, so rolling it again stores the same rows. Rollups are kept longer
// than the minute records (usage_hourly_retention, usage_daily_retention,
// usage_monthly_retention), so a report per day or per month reaches back
// past usage_retention.

// The defaults of the rollups' retentions.
const (
	DefaultHourlyRetention  = 90 * 24 * time.Hour
	DefaultDailyRetention   = 2 * 366 * 24 * time.Hour
	DefaultMonthlyRetention = 10 * 366 * 24 * time.Hour
)

const (
	// rollupLag is how long after an hour closes it is rolled up.
	rollupLag = 2 * time.Minute
	// rollupsPerPass bounds the hours one housekeeping pass rolls up (a
	// governord catching up after a stop rolls a day's worth a second).
	rollupsPerPass = 24
	// maxUsageBuckets bounds the buckets one GetUsage reports.
	maxUsageBuckets = 2000
)

// roller rolls usage up; it lives on the housekeeping goroutine.
type roller struct {
	s       *Server
	next    int64 // the first minute of the next hour to roll; 0: not known yet
	none    bool  // the store keeps no rollups
	trimmed int64 // the hour the rollups were last trimmed in
}

// rollUp rolls up the hours closed by now, and what they close, and trims
// rollups past their retention once an hour. A failure is logged and tried
// again on the next pass.
func (r *roller) rollUp(ctx context.Context, now time.Time) {
	rs, ok := r.s.st.(store.RollupStore)
	if !ok {
		r.none = true
		return
	}
	if err := r.rollClosed(ctx, rs, now); err != nil {
		r.s.log.Warn("rolling usage up failed; the next pass tries again", "err", err)
	}
	if hour := now.Unix() / 3600; hour != r.trimmed {
		r.trimmed = hour
		for _, u := range usage.Units {
			before := usage.MinuteOf(now.Add(-r.s.rollupRetention(u)).UnixNano())
			if err := rs.TrimRollups(ctx, string(u), before); err != nil {
				r.s.log.Warn("trimming old usage rollups failed; the next hour tries again", "unit", u, "err", err)
			}
		}
	}
}

func (r *roller) rollClosed(ctx context.Context, rs store.RollupStore, now time.Time) error {
	loc := r.s.location()
	if r.next == 0 {
		next, err := r.firstHour(ctx, rs, now)
		if err != nil {
			return err
		}
		r.next = next
	}
	for range rollupsPerPass {
		h := usage.Bucket(usage.Hour, r.next, loc)
		if time.Unix(h.To*60, 0).Add(rollupLag).After(now) {
			return nil
		}
		for _, u := range usage.Units {
			b := usage.Bucket(u, h.From, loc)
			if b.To != h.To {
				break // the day (and so the month) goes on after this hour
			}
			if err := r.s.rollBucket(ctx, rs, u, b); err != nil {
				return err
			}
		}
		r.next = h.To
	}
	return nil
}

// firstHour is where rolling up starts: after the newest hour rolled, or
// with the oldest minute records kept, or now.
func (r *roller) firstHour(ctx context.Context, rs store.RollupStore, now time.Time) (int64, error) {
	nowMinute := usage.MinuteOf(now.UnixNano())
	rolled, err := rs.RolledUp(ctx, string(usage.Hour), usage.MinuteOf(now.Add(-r.s.rollupRetention(usage.Hour)).UnixNano()), nowMinute+1)
	if err != nil {
		return 0, err
	}
	if len(rolled) > 0 {
		return usage.Bucket(usage.Hour, rolled[len(rolled)-1], r.s.location()).To, nil
	}
	from := nowMinute
	if u, ok := r.s.st.(store.UsageReader); ok {
		oldest, some, err := u.OldestUsage(ctx)
		if err != nil {
			return 0, err
		}
		if some {
			from = min(from, oldest)
		}
	}
	return usage.Bucket(usage.Hour, from, r.s.location()).From, nil
}

// rolledBefore is the minute before which every hour has been rolled up
// (or the oldest hour not rolled yet starts): minute records before it
// may go.
func (r *roller) rolledBefore() int64 {
	switch {
	case r.none:
		return math.MaxInt64
	case r.next == 0:
		return math.MinInt64
	}
	return r.next
}

// rollBucket sums the closed bucket b of unit u and writes its rollup.
func (s *Server) rollBucket(ctx context.Context, rs store.RollupStore, u usage.Unit, b usage.Window) error {
	b.Now = b.To * 60e9
	lines, err := s.bucketLines(ctx, rs, u, []usage.Window{b})
	if err != nil {
		return err
	}
	if err := rs.PutRollup(ctx, string(u), b.From, rollupRows(u, b.From, lines[0])); err != nil {
		return fmt.Errorf("%s at %v: %w", u, time.Unix(b.From*60, 0).UTC(), err)
	}
	return nil
}

// bucketLines are the lines of each bucket of unit u: a bucket rolled up
// is read from its rollup; another is summed from the unit before it (an
// hour from minute records), up to its Now.
func (s *Server) bucketLines(ctx context.Context, rs store.RollupStore, u usage.Unit, buckets []usage.Window) ([][]usage.Line, error) {
	if len(buckets) == 0 {
		return nil, nil
	}
	from, to := buckets[0].From, buckets[len(buckets)-1].To
	rolled, err := rs.RolledUp(ctx, string(u), from, to)
	if err != nil {
		return nil, err
	}
	stored := map[int64][]usage.Line{}
	if len(rolled) > 0 {
		rows, err := rs.Rollups(ctx, string(u), from, to)
		if err != nil {
			return nil, err
		}
		stored = linesByStart(rows)
	}
	isRolled := make(map[int64]bool, len(rolled))
	for _, start := range rolled {
		isRolled[start] = true
	}
	out := make([][]usage.Line, len(buckets))
	for i, b := range buckets {
		if isRolled[b.From] {
			out[i] = stored[b.From]
			continue
		}
		if out[i], err = s.sumBucket(ctx, rs, u, b); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// sumBucket sums a bucket not rolled up from what it holds.
func (s *Server) sumBucket(ctx context.Context, rs store.RollupStore, u usage.Unit, b usage.Window) ([]usage.Line, error) {
	finer := u.Finer()
	if finer == "" {
		return s.minuteLines(ctx, b)
	}
	subs := usage.Buckets(finer, b.From, b.To, s.location())
	for i := range subs {
		subs[i].Now = b.Now
	}
	parts, err := s.bucketLines(ctx, rs, finer, subs)
	if err != nil {
		return nil, err
	}
	return usage.Sum(parts...), nil
}

// minuteLines reports the minute records of w.
func (s *Server) minuteLines(ctx context.Context, w usage.Window) ([]usage.Line, error) {
	u, ok := s.st.(store.UsageReader)
	if !ok {
		return nil, fmt.Errorf("this store keeps no usage records")
	}
	rows, err := u.Usage(ctx, w.From, w.To, string(usage.HeldEnd))
	if err != nil {
		return nil, err
	}
	recs := make([]usage.Record, 0, len(rows))
	for _, r := range rows {
		recs = append(recs, usage.Record{Key: usage.Key{Tenant: r.Tenant, Task: r.Task, Minute: r.Minute, Kind: usage.Kind(r.Kind), Name: r.Name},
			TenantName: r.TenantName, TaskName: r.TaskName, Amount: r.Amount})
	}
	return usage.Report(recs, w), nil
}

// The kinds of a rollup's rows: a Line's maps.
const (
	rollupSpend     = "spend"
	rollupSlotNanos = "slot_nanos"
	rollupPeak      = "peak"
	rollupDenied    = "denied"
)

// rollupRows are lines as the rows of the bucket (u, start).
func rollupRows(u usage.Unit, start int64, lines []usage.Line) []store.RollupRow {
	var rows []store.RollupRow
	for _, l := range lines {
		for kind, m := range map[string]map[string]int64{rollupSpend: l.Spend, rollupSlotNanos: l.SlotNanos, rollupPeak: l.Peak, rollupDenied: l.Denied} {
			for name, amount := range m {
				rows = append(rows, store.RollupRow{Unit: string(u), Start: start, Tenant: l.Tenant, Task: l.Task,
					Kind: kind, Name: name, TenantName: l.TenantName, TaskName: l.TaskName, Amount: amount})
			}
		}
	}
	return rows
}

// linesByStart are rollup rows as each bucket's lines.
func linesByStart(rows []store.RollupRow) map[int64][]usage.Line {
	type key struct{ start, tenant, task int64 }
	byKey := map[key]*usage.Line{}
	for _, r := range rows {
		k := key{r.Start, r.Tenant, r.Task}
		l := byKey[k]
		if l == nil {
			l = &usage.Line{Tenant: r.Tenant, Task: r.Task, TenantName: r.TenantName, TaskName: r.TaskName,
				Spend: map[string]int64{}, SlotNanos: map[string]int64{}, Peak: map[string]int64{}, Denied: map[string]int64{}}
			byKey[k] = l
		}
		switch r.Kind {
		case rollupSpend:
			l.Spend[r.Name] = r.Amount
		case rollupSlotNanos:
			l.SlotNanos[r.Name] = r.Amount
		case rollupPeak:
			l.Peak[r.Name] = r.Amount
		case rollupDenied:
			l.Denied[r.Name] = r.Amount
		}
	}
	out := map[int64][]usage.Line{}
	for k, l := range byKey {
		out[k.start] = append(out[k.start], *l)
	}
	for start, ls := range out {
		out[start] = usage.Sum(ls) // in Report's order
	}
	return out
}

// rollupRetention is how long u's rollups are kept.
func (s *Server) rollupRetention(u usage.Unit) time.Duration {
	keep, def := s.cfg.Store.UsageHourlyRetention, DefaultHourlyRetention
	switch u {
	case usage.Day:
		keep, def = s.cfg.Store.UsageDailyRetention, DefaultDailyRetention
	case usage.Month:
		keep, def = s.cfg.Store.UsageMonthlyRetention, DefaultMonthlyRetention
	}
	if keep == 0 {
		return def
	}
	return keep
}

// location is the calendar's time zone: time_zone, UTC by default.
func (s *Server) location() *time.Location {
	if s.cfg.Location != nil {
		return s.cfg.Location
	}
	return time.UTC
}
