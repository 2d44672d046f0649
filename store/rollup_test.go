package store_test

import (
	"context"
	"slices"
	"testing"

	"github.com/governor-project/governor/store"
)

// A rollup bucket is written whole: writing it again replaces its rows
// (so writing the same rows twice stores them once), an empty bucket still
// reads as written, buckets survive a reopen, and trimming deletes whole
// buckets of one unit only.
func TestUsageRollups(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			open := b.fresh(t)
			st := open()
			r := st.(store.RollupStore)
			row := func(unit string, start int64, kind, name string, amount int64) store.RollupRow {
				return store.RollupRow{Unit: unit, Start: start, Tenant: 2, Task: 5, Kind: kind, Name: name, TenantName: "pay", TaskName: "job", Amount: amount}
			}
			put := func(unit string, start int64, rows ...store.RollupRow) {
				t.Helper()
				if err := r.PutRollup(ctx, unit, start, start+60, rows); err != nil {
					t.Fatalf("PutRollup(%s, %d): %v", unit, start, err)
				}
			}
			put("hour", 60, row("hour", 60, "spend", "tokens", 7), row("hour", 60, "peak", "db", 3))
			put("hour", 60, row("hour", 60, "spend", "tokens", 9))          // written again: replaced
			put("hour", 60, row("hour", 60, "spend", "tokens", 9))          // and again: the same
			put("hour", 120)                                                // an hour with nothing in it
			if err := r.PutRollup(ctx, "hour", 300, 330, nil); err != nil { // summed up to half-way
				t.Fatal(err)
			}
			put("day", 0, row("day", 0, "spend", "tokens", 9))
			if err := r.PutRollup(ctx, "hour", 180, 240, []store.RollupRow{row("hour", 240, "spend", "x", 1)}); err == nil {
				t.Fatal("a row of another bucket was taken")
			}
			st.Close()
			st = open()
			defer func() { st.Close() }()
			r = st.(store.RollupStore)
			got, err := r.Rollups(ctx, "hour", 0, 1000)
			if err != nil {
				t.Fatal(err)
			}
			if want := []store.RollupRow{row("hour", 60, "spend", "tokens", 9)}; !slices.Equal(got, want) {
				t.Fatalf("hour rollups after a reopen: %+v, want %+v", got, want)
			}
			starts, err := r.RolledUp(ctx, "hour", 0, 1000)
			if want := []store.Rolled{{60, 120}, {120, 180}, {300, 330}}; err != nil || !slices.Equal(starts, want) {
				t.Fatalf("hours written: %v (%v), want %v", starts, err, want)
			}
			if err := r.TrimRollups(ctx, "hour", 100); err != nil {
				t.Fatal(err)
			}
			starts, _ = r.RolledUp(ctx, "hour", 0, 1000)
			days, _ := r.RolledUp(ctx, "day", 0, 1000)
			if !slices.Equal(starts, []store.Rolled{{120, 180}, {300, 330}}) || !slices.Equal(days, []store.Rolled{{0, 60}}) {
				t.Fatalf("after trimming hours before 100: hours %v, days %v; want those from 120 and the day", starts, days)
			}
		})
	}
}
