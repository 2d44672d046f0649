package store_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/governor-project/governor/store"
)

// Usage rows merge by their key as each says (add, max, set), commit with
// their records or not at all, survive a reopen, and read back as a window
// plus the newest carried row before it; trimming keeps that carried row.
func TestUsageRows(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			open := b.fresh(t)
			st := open()
			row := func(minute int64, kind string, amount int64, m store.UsageMerge) store.UsageRow {
				return store.UsageRow{Tenant: 2, Task: 5, Minute: minute, Kind: kind, Name: "db", TenantName: "pay", TaskName: "job", Amount: amount, Merge: m}
			}
			batches := [][]store.UsageRow{
				{row(10, "spend", 3, store.MergeAdd), row(10, "peak", 4, store.MergeMax), row(10, "held_end", 4, store.MergeSet)},
				{row(10, "spend", 2, store.MergeAdd), row(10, "peak", 2, store.MergeMax), row(10, "held_end", 2, store.MergeSet)},
				{row(12, "held_end", 1, store.MergeSet)},
				{row(20, "spend", 7, store.MergeAdd)},
			}
			for i, rows := range batches {
				if err := st.Append(ctx, []store.Record{{Seq: uint64(i + 1), Data: []byte("x"), Usage: rows}}); err != nil {
					t.Fatal(err)
				}
			}
			// A batch out of sequence writes no usage either.
			err := st.Append(ctx, []store.Record{{Seq: 2, Data: []byte("x"), Usage: []store.UsageRow{row(10, "spend", 100, store.MergeAdd)}}})
			if !errors.Is(err, store.ErrOutOfSequence) {
				t.Fatalf("append out of sequence: %v", err)
			}
			st.Close()
			st = open()
			defer st.Close()
			u := st.(store.UsageReader)
			got := func(from, to int64) string {
				t.Helper()
				rows, err := u.Usage(ctx, from, to, "held_end")
				if err != nil {
					t.Fatal(err)
				}
				var out []string
				for _, r := range rows {
					out = append(out, strings.Join([]string{r.Kind, itoa(r.Minute), itoa(r.Amount), r.TenantName, r.TaskName}, ":"))
				}
				slices.Sort(out)
				return strings.Join(out, " ")
			}
			if g, w := got(10, 11), "held_end:10:2:pay:job peak:10:4:pay:job spend:10:5:pay:job"; g != w {
				t.Errorf("minute 10: %s, want %s", g, w)
			}
			if g, w := got(15, 30), "held_end:12:1:pay:job spend:20:7:pay:job"; g != w {
				t.Errorf("minutes 15-30: %s, want %s (the level carried from minute 12)", g, w)
			}
			if err := u.TrimUsage(ctx, 15, "held_end"); err != nil {
				t.Fatal(err)
			}
			if g, w := got(0, 100), "held_end:12:1:pay:job spend:20:7:pay:job"; g != w {
				t.Errorf("after trimming before 15: %s, want %s", g, w)
			}
		})
	}
}

func itoa(v int64) string {
	if v < 0 {
		return "-" + itoa(-v)
	}
	if v < 10 {
		return string(rune('0' + v))
	}
	return itoa(v/10) + string(rune('0'+v%10))
}

// Rows of one batch that share a key merge before they are written, as
// they would one by one: added, the larger, the later.
func TestUsageRowsMergeWithinABatch(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			st := b.fresh(t)()
			defer st.Close()
			row := func(kind string, amount int64, m store.UsageMerge) store.UsageRow {
				return store.UsageRow{Tenant: 2, Task: 3, Minute: 7, Kind: kind, Name: "db", Amount: amount, Merge: m}
			}
			batch := []store.Record{
				// A session opens in the same batch: the sessions table's part
				// of the statement and the usage rows' go together.
				{Seq: 1, Data: []byte("a"), Opens: &store.Session{ID: 1, TokenHash: strings.Repeat("ab", 32)},
					Usage: []store.UsageRow{row("spend", 2, store.MergeAdd), row("peak", 5, store.MergeMax), row("held_end", 5, store.MergeSet)}},
				{Seq: 2, Data: []byte("b"), Usage: []store.UsageRow{row("spend", 3, store.MergeAdd), row("peak", 1, store.MergeMax), row("held_end", 1, store.MergeSet)}},
			}
			if err := st.Append(ctx, batch); err != nil {
				t.Fatal(err)
			}
			rows, err := st.(store.UsageReader).Usage(ctx, 0, 100, "held_end")
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]int64{}
			for _, r := range rows {
				got[r.Kind] = r.Amount
			}
			if got["spend"] != 5 || got["peak"] != 5 || got["held_end"] != 1 || len(rows) != 3 {
				t.Fatalf("rows %v, want spend 5, peak 5, held_end 1", got)
			}
		})
	}
}

// Usage rows outlive a snapshot, which deletes the records it covers but
// not the usage written with them.
func TestUsageRowsOutliveASnapshot(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			st := b.fresh(t)()
			defer st.Close()
			row := store.UsageRow{Tenant: 2, Task: 5, Minute: 10, Kind: "spend", Name: "calls", Amount: 3, Merge: store.MergeAdd}
			if err := st.Append(ctx, []store.Record{{Seq: 1, Data: []byte("x"), Usage: []store.UsageRow{row}}}); err != nil {
				t.Fatal(err)
			}
			if err := st.SaveSnapshot(ctx, 1, []byte("snap")); err != nil {
				t.Fatal(err)
			}
			rows, err := st.(store.UsageReader).Usage(ctx, 0, 100, "held_end")
			if err != nil {
				t.Fatal(err)
			}
			if len(rows) != 1 || rows[0].Amount != 3 {
				t.Fatalf("after a snapshot: %+v, want the one spend row of 3", rows)
			}
		})
	}
}

// Trimming keeps the newest carried row of a key only when its level is
// not zero: an ended task's slots end at zero, and no row carries zero as
// well, so nothing of it outlives usage_retention.
func TestTrimUsageDropsALevelOfZero(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			st := b.fresh(t)()
			defer st.Close()
			held := func(task, minute, level int64) store.UsageRow {
				return store.UsageRow{Tenant: 2, Task: task, Minute: minute, Kind: "held_end", Name: "db", Amount: level, Merge: store.MergeSet}
			}
			rows := []store.UsageRow{held(5, 10, 2), held(5, 12, 0), held(6, 11, 3)}
			if err := st.Append(ctx, []store.Record{{Seq: 1, Data: []byte("x"), Usage: rows}}); err != nil {
				t.Fatal(err)
			}
			u := st.(store.UsageReader)
			if err := u.TrimUsage(ctx, 15, "held_end"); err != nil {
				t.Fatal(err)
			}
			got, err := u.Usage(ctx, 0, 100, "held_end")
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || got[0].Task != 6 || got[0].Amount != 3 {
				t.Fatalf("after trimming before minute 15: %+v, want task 6's level of 3 only", got)
			}
		})
	}
}
