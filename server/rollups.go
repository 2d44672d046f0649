package server

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/governor-project/governor/store"
	"github.com/governor-project/governor/usage"
)

// Usage rollups, per tenant: once an hour has closed (and rollupLag more has passed,
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
	trimmed int64 // the hour the rollups were last trimmed in
}

// rollUp rolls up the hours closed by now, and what they close, and trims
// rollups past their retention once an hour. A failure is logged and tried
// again on the next pass.
func (r *roller) rollUp(ctx context.Context, now time.Time) {
	rs, ok := r.s.st.(store.RollupStore)
	if !ok {
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
		if err := r.s.rollHour(ctx, rs, h, h.To); err != nil {
			return err
		}
		for _, u := range usage.Units[1:] {
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

// firstHour is where rolling up starts: with the newest hour written if
// it was summed early, after it if not, or with the oldest minute records
// kept, or now.
func (r *roller) firstHour(ctx context.Context, rs store.RollupStore, now time.Time) (int64, error) {
	nowMinute := usage.MinuteOf(now.UnixNano())
	rolled, err := rs.RolledUp(ctx, string(usage.Hour), usage.MinuteOf(now.Add(-r.s.rollupRetention(usage.Hour)).UnixNano()), nowMinute+1)
	if err != nil {
		return 0, err
	}
	if len(rolled) > 0 {
		last := rolled[len(rolled)-1]
		h := usage.Bucket(usage.Hour, last.Start, r.s.location())
		if last.Upto < h.To {
			return h.From, nil
		}
		return h.To, nil
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

// trimPoint is the minute before which minute records may go, given the
// cutoff of usage_retention: every hour before it is rolled up, and the
// hour it falls in is summed up to it first (an early rollup, completed
// when the hour closes), so that a usage_retention shorter than an hour
// loses nothing from the rollups.
func (r *roller) trimPoint(ctx context.Context, cutoff int64) int64 {
	rs, ok := r.s.st.(store.RollupStore)
	switch {
	case !ok:
		return cutoff
	case r.next == 0: // not known yet where rolling up starts
		return math.MinInt64
	case cutoff <= r.next:
		return cutoff
	}
	h := usage.Bucket(usage.Hour, r.next, r.s.location())
	upto := min(cutoff, h.To)
	if err := r.s.rollHour(ctx, rs, h, upto); err != nil {
		r.s.log.Warn("summing an hour of usage before its minutes go failed; they stay", "err", err)
		return r.next
	}
	return upto
}

// rollHour sums hour h's minute records up to upto into its rollup, from
// where an earlier, early rollup of it stopped.
func (s *Server) rollHour(ctx context.Context, rs store.RollupStore, h usage.Window, upto int64) error {
	from, base, err := s.rolledSoFar(ctx, rs, h)
	if err != nil || from >= upto {
		return err
	}
	rest, err := s.minuteLines(ctx, usage.Window{From: from, To: upto, Now: upto * 60e9})
	if err != nil {
		return err
	}
	if err := rs.PutRollup(ctx, string(usage.Hour), h.From, upto, rollupRows(usage.Hour, h.From, usage.Sum(base, rest))); err != nil {
		return fmt.Errorf("hour at %v: %w", time.Unix(h.From*60, 0).UTC(), err)
	}
	return nil
}

// rolledSoFar is where hour h's rollup stops, and its lines: h's start and
// none if it has none.
func (s *Server) rolledSoFar(ctx context.Context, rs store.RollupStore, h usage.Window) (upto int64, lines []usage.Line, err error) {
	rolled, err := rs.RolledUp(ctx, string(usage.Hour), h.From, h.From+1)
	if err != nil || len(rolled) == 0 {
		return h.From, nil, err
	}
	rows, err := rs.Rollups(ctx, string(usage.Hour), h.From, h.From+1)
	if err != nil {
		return 0, nil, err
	}
	return rolled[0].Upto, linesByStart(rows)[h.From], nil
}

// rollBucket sums the closed bucket b of unit u and writes its rollup.
func (s *Server) rollBucket(ctx context.Context, rs store.RollupStore, u usage.Unit, b usage.Window) error {
	b.Now = b.To * 60e9
	lines, err := s.bucketLines(ctx, rs, u, []usage.Window{b})
	if err != nil {
		return err
	}
	if err := rs.PutRollup(ctx, string(u), b.From, b.To, rollupRows(u, b.From, lines[0])); err != nil {
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
	uptoOf := make(map[int64]int64, len(rolled))
	for _, r := range rolled {
		uptoOf[r.Start] = r.Upto
	}
	out := make([][]usage.Line, len(buckets))
	for i, b := range buckets {
		if upto, ok := uptoOf[b.From]; ok {
			out[i] = stored[b.From]
			if upto < b.To { // an hour summed early: the rest from its minutes
				rest, err := s.minuteLines(ctx, usage.Window{From: upto, To: b.To, Now: b.Now})
				if err != nil {
					return nil, err
				}
				out[i] = usage.Sum(out[i], rest)
			}
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

// rollupRows are lines as the rows of the bucket (u, start): the
// tenants' lines (and the root's) only. A task's lines stay in the minute
// records, for usage_retention: rollups are kept for years, and tasks come
// and go by the million.
func rollupRows(u usage.Unit, start int64, lines []usage.Line) []store.RollupRow {
	var rows []store.RollupRow
	for _, l := range lines {
		if l.Task != 0 {
			continue
		}
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
