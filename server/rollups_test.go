package server

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/server/serverconfig"
	"github.com/governor-project/governor/store"
	"github.com/governor-project/governor/usage"
)

// Usage rolls up by the hour, the day and the month on time_zone's
// calendar: a report per hour, per day and per month says what the
// minutes said, a day's rollup outlives the minute records that
// usage_retention trims, a month still open is summed from the days
// rolled, rolling a bucket again stores the same rows, and all of it
// survives a restart. New York's March 8, 2026 has 23 hours.
func TestUsageRollups(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	clock := &setClock{}
	at := func(d, h, m int) time.Time { return time.Date(2026, 3, d, h, m, 0, 0, ny) }
	clock.ns.Store(at(7, 0, 10).UnixNano())
	cfg := testConfig()
	cfg.Clock, cfg.Location, cfg.SessionTTL = clock, ny, 96*time.Hour
	cfg.Store = serverconfig.StoreConfig{Driver: "sqlite", DSN: filepath.Join(t.TempDir(), "governor.db"), UsageRetention: 3 * time.Hour}
	srv, pay, task, consume := startSpending(t, cfg)
	consume(1)
	clock.ns.Store(at(8, 0, 10).UnixNano())
	consume(5)
	lease, err := pay.Acquire(pay.ctx, &governorpb.AcquireRequest{NodeId: task.Id, Class: "db"})
	if err != nil {
		t.Fatal(err)
	}
	clock.ns.Store(at(8, 0, 40).UnixNano())
	if _, err := pay.Release(pay.ctx, &governorpb.ReleaseRequest{LeaseId: lease.GetId()}); err != nil {
		t.Fatal(err)
	}
	clock.ns.Store(at(8, 1, 10).UnixNano())
	consume(7)
	// Two days closed, and their minutes past usage_retention: the first
	// pass rolls up a day's hours and must trim none that it has not.
	clock.ns.Store(at(9, 3, 0).UnixNano())
	rs := srv.st.(store.RollupStore)
	dayStart := at(8, 0, 0).Unix() / 60
	waitFor(t, func() bool {
		r, err := rs.RolledUp(context.Background(), "day", dayStart, dayStart+1)
		return err == nil && len(r) == 1
	})

	report := func(c *client, per string, from, to time.Time) []string {
		t.Helper()
		rep, err := c.GetUsage(c.ctx, &governorpb.GetUsageRequest{Per: per, From: timestamppb.New(from), To: timestamppb.New(to)})
		if err != nil {
			t.Fatalf("usage per %q: %v", per, err)
		}
		var out []string
		for _, l := range rep.GetLines() {
			if l.GetTaskId() != 0 || l.GetTenant() != "payments" { // rollups keep tenants' lines
				continue
			}
			out = append(out, strings.TrimSpace(fmtLine(l)))
		}
		return out
	}
	want := func(what string, got []string, want ...string) {
		t.Helper()
		if !slices.Equal(got, want) {
			t.Errorf("%s:\n got %q\nwant %q", what, got, want)
		}
	}
	want("per hour, 00:00 EST to 03:00 EDT", report(pay, "hour", at(8, 0, 0), at(8, 3, 0)),
		"2026-03-08T05:00:00Z..06:00:00Z spend tokens=5 lease db=1800s peak db=1",
		"2026-03-08T06:00:00Z..07:00:00Z spend tokens=7")
	want("per day", report(pay, "day", at(8, 0, 0), at(8, 0, 1)),
		"2026-03-08T05:00:00Z..2026-03-09T04:00:00Z spend tokens=12 lease db=1800s peak db=1")
	// The minutes are gone; their rollups are not.
	want("the minutes, past usage_retention", report(pay, "", at(8, 0, 0), at(9, 0, 0)))
	want("per month, the month still open", report(pay, "month", at(8, 0, 0), at(8, 0, 1)),
		"2026-03-01T05:00:00Z..2026-04-01T04:00:00Z spend tokens=13 lease db=1800s peak db=1")
	want("per day, two days", report(pay, "day", at(7, 0, 0), at(8, 12, 0)),
		"2026-03-07T05:00:00Z..2026-03-08T05:00:00Z spend tokens=1",
		"2026-03-08T05:00:00Z..2026-03-09T04:00:00Z spend tokens=12 lease db=1800s peak db=1")

	// Rolling the day again stores the same rows.
	before, _ := rs.Rollups(context.Background(), "day", 0, 1<<40)
	day := usage.Bucket(usage.Day, at(8, 12, 0).Unix()/60, ny)
	if err := srv.rollBucket(context.Background(), rs, usage.Day, day); err != nil {
		t.Fatal(err)
	}
	after, _ := rs.Rollups(context.Background(), "day", 0, 1<<40)
	if len(before) == 0 || !sameRows(before, after) {
		t.Errorf("the day rolled again:\n%+v\nwas\n%+v", after, before)
	}

	// A restart on the same file reads the same.
	srv.Close()
	srv = start(t, cfg)
	pay = session(t, srv.Addr(), "pay-key", 0)
	want("per day, after a restart", report(pay, "day", at(8, 0, 0), at(8, 0, 1)),
		"2026-03-08T05:00:00Z..2026-03-09T04:00:00Z spend tokens=12 lease db=1800s peak db=1")

	for _, bad := range []struct {
		per      string
		from, to time.Time
	}{
		{"week", at(8, 0, 0), at(9, 0, 0)},
		{"Hour", at(8, 0, 0), at(9, 0, 0)},
		{"hour", time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC), at(9, 0, 0)},
	} {
		_, err := pay.GetUsage(pay.ctx, &governorpb.GetUsageRequest{Per: bad.per, From: timestamppb.New(bad.from), To: timestamppb.New(bad.to)})
		wantCode(t, "per "+bad.per+" from "+bad.from.String(), err, codes.InvalidArgument)
	}
}

// startSpending starts governord on cfg with payments' task "job", and
// returns them and a func that charges the task tokens.
func startSpending(t *testing.T, cfg serverconfig.Config) (*Server, *client, *governorpb.Node, func(int64)) {
	srv := start(t, cfg)
	pay := session(t, srv.Addr(), "pay-key", 0)
	task := pay.task(t, "job", nil)
	return srv, pay, task, func(n int64) {
		t.Helper()
		if _, err := pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: task.Id, Resource: "tokens", Amount: n}); err != nil {
			t.Fatal(err)
		}
	}
}

// fmtLine is a usage line in one line: its bucket, then each figure.
func fmtLine(l *governorpb.UsageLine) string {
	var b strings.Builder
	if l.GetStart() != nil {
		from, to := l.GetStart().AsTime().Format(time.RFC3339), l.GetEnd().AsTime().Format(time.RFC3339)
		if from[:10] == to[:10] {
			to = to[11:]
		}
		b.WriteString(from + ".." + to)
	}
	for _, m := range []struct {
		what string
		m    map[string]int64
	}{{"spend", l.GetSpend()}, {"peak", l.GetPeak()}, {"denied", l.GetDenied()}} {
		if m.what == "peak" {
			for _, k := range slices.Sorted(maps.Keys(l.GetLeaseSeconds())) {
				fmt.Fprintf(&b, " lease %s=%gs", k, l.GetLeaseSeconds()[k])
			}
		}
		for _, k := range slices.Sorted(maps.Keys(m.m)) {
			fmt.Fprintf(&b, " %s %s=%d", m.what, k, m.m[k])
		}
	}
	return b.String()
}

func sameRows(a, b []store.RollupRow) bool {
	key := func(r store.RollupRow) string {
		return fmt.Sprintf("%d/%d %s %s=%d", r.Tenant, r.Task, r.Kind, r.Name, r.Amount)
	}
	ka, kb := make([]string, 0, len(a)), make([]string, 0, len(b))
	for _, r := range a {
		ka = append(ka, key(r))
	}
	for _, r := range b {
		kb = append(kb, key(r))
	}
	slices.Sort(ka)
	slices.Sort(kb)
	return slices.Equal(ka, kb)
}

// The rollups' retentions: read from the store's keys, defaults when
// absent or zero, and a clear error naming the key for anything else
// that is not a duration that fits.
func TestConfigOfUsageRetentions(t *testing.T) {
	cfg, err := serverconfig.ParseConfig([]byte("store: {driver: memory, usage_hourly_retention: 48h, usage_daily_retention: 9223372036854775807ns, usage_monthly_retention: 0s}\ntenants: [{name: a}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &Server{cfg: cfg}
	if h, d, m := srv.rollupRetention(usage.Hour), srv.rollupRetention(usage.Day), srv.rollupRetention(usage.Month); h != 48*time.Hour ||
		d != time.Duration(1<<63-1) || m != DefaultMonthlyRetention {
		t.Errorf("retentions %v, %v, %v; want 48h, the longest duration, and the monthly default", h, d, m)
	}
	for _, key := range []string{"usage_hourly_retention", "usage_daily_retention", "usage_monthly_retention"} {
		for _, bad := range []string{"-1h", "-9223372036854775808ns", "2147483648", "9007199254740992", "2562048h", "[1]", "true", "soon", "{a: 1}"} {
			_, err := serverconfig.ParseConfig([]byte("store: {driver: memory, " + key + ": " + bad + "}\ntenants: [{name: a}]\n"))
			if !serverconfig.IsConfigError(err) || !strings.Contains(err.Error(), key) {
				t.Errorf("%s: %s: %v; want a config error naming the key", key, bad, err)
			}
		}
	}
}

// With a usage_retention shorter than an hour, the hour's minutes are
// summed into its rollup before they go, and the rest added when it
// closes: the hour still reads whole, a lease held across the trim
// included, and so does a report of the hour asked before it closes.
func TestUsageRollupsOutliveAShortRetention(t *testing.T) {
	clock := &setClock{}
	at := func(h, m int) time.Time { return time.Date(2026, 5, 4, h, m, 0, 0, time.UTC) }
	clock.ns.Store(at(9, 5).UnixNano())
	cfg := testConfig()
	cfg.Clock, cfg.SessionTTL = clock, 4*time.Hour
	cfg.Store = serverconfig.StoreConfig{Driver: "sqlite", DSN: filepath.Join(t.TempDir(), "governor.db"), UsageRetention: 10 * time.Minute}
	srv, pay, task, consume := startSpending(t, cfg)
	consume(5)
	clock.ns.Store(at(9, 10).UnixNano())
	lease, err := pay.Acquire(pay.ctx, &governorpb.AcquireRequest{NodeId: task.Id, Class: "db"})
	if err != nil {
		t.Fatal(err)
	}
	clock.ns.Store(at(9, 35).UnixNano()) // 09:05 and 09:10 are past usage_retention
	rs := srv.st.(store.RollupStore)
	hour := at(9, 0).Unix() / 60
	waitFor(t, func() bool { // the hour summed early
		r, err := rs.RolledUp(context.Background(), "hour", hour, hour+1)
		return err == nil && len(r) == 1 && r[0].Upto == at(9, 25).Unix()/60
	})
	perHour := func() []string {
		t.Helper()
		rep, err := pay.GetUsage(pay.ctx, &governorpb.GetUsageRequest{Per: "hour", From: timestamppb.New(at(9, 0)), To: timestamppb.New(at(9, 1))})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, l := range rep.GetLines() {
			if l.GetTaskId() == 0 && l.GetTenant() == "payments" {
				out = append(out, strings.TrimSpace(fmtLine(l)))
			}
		}
		return out
	}
	// Asked before the hour closes: the early rollup and the minutes since.
	if got, want := perHour(), "2026-05-04T09:00:00Z..10:00:00Z spend tokens=5 lease db=1500s peak db=1"; len(got) != 1 || got[0] != want {
		t.Errorf("the hour at 09:35: %q, want %q", got, want)
	}
	clock.ns.Store(at(9, 40).UnixNano())
	consume(7)
	if _, err := pay.Release(pay.ctx, &governorpb.ReleaseRequest{LeaseId: lease.GetId()}); err != nil {
		t.Fatal(err)
	}
	clock.ns.Store(at(10, 5).UnixNano())
	waitFor(t, func() bool { // the hour rolled up
		r, err := rs.RolledUp(context.Background(), "hour", hour, hour+1)
		return err == nil && len(r) == 1 && r[0].Upto == at(10, 0).Unix()/60
	})
	if got, want := perHour(), "2026-05-04T09:00:00Z..10:00:00Z spend tokens=12 lease db=1800s peak db=1"; len(got) != 1 || got[0] != want {
		t.Errorf("the hour closed: %q, want %q", got, want)
	}
}

// A window's ends anywhere a protobuf timestamp reaches (years 1 to 9999)
// are answered, per unit or not: past what unix nanoseconds hold, an end
// is taken as the nearest instant they do. A window to 9999 per hour
// once crashed governord (its nanoseconds wrapped, the bucket count went
// negative, and no bucket was made).
func TestUsageWindowsAtTheEndsOfTime(t *testing.T) {
	srv := start(t, testConfig())
	pay := session(t, srv.Addr(), "pay-key", 0)
	year1, year9999 := time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)
	now := time.Now()
	for _, c := range []struct {
		per      string
		from, to time.Time
		ok       bool
	}{
		{"", now, year9999, true},
		{"", year1, now, true},
		{"", year1, year9999, true},
		{"hour", now, year9999, false},
		{"day", now, year9999, false},
		{"month", year1, year9999, false},
		{"month", now, year9999, false},
		{"hour", year9999.Add(-time.Hour), year9999, true}, // both past 2262: the same instant
	} {
		_, err := pay.GetUsage(pay.ctx, &governorpb.GetUsageRequest{Per: c.per, From: timestamppb.New(c.from), To: timestamppb.New(c.to)})
		if c.ok && err != nil && status.Code(err) != codes.InvalidArgument || !c.ok && status.Code(err) != codes.InvalidArgument {
			t.Errorf("per %q from %v to %v: %v", c.per, c.from, c.to, err)
		}
	}
	if _, err := pay.GetUsage(pay.ctx, &governorpb.GetUsageRequest{}); err != nil {
		t.Fatalf("governord after the windows: %v", err)
	}
}
