package store

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
)

// This file keeps usage rollups: the totals of a closed hour, day or month,
// which outlive the minute records they were summed from (usage_retention
// trims those). A bucket is written whole: writing it again replaces what
// it held, so summing the same records twice stores the same rows.

// RollupRow is one total of a bucket of time.
type RollupRow struct {
	Unit                 string // "hour", "day" or "month"
	Start                int64  // the bucket's first minute (unix seconds / 60)
	Tenant, Task         int64
	Kind, Name           string
	TenantName, TaskName string
	Amount               int64
}

// Rolled is a bucket written: its first minute, and the minute its rows
// sum up to (its end, or less for an hour summed early, before its
// minutes were trimmed).
type Rolled struct{ Start, Upto int64 }

// RollupStore is the part of a Store that keeps usage rollups. Every
// backend implements it.
type RollupStore interface {
	// PutRollup replaces the rows of the bucket (unit, start), which sum
	// its minutes up to upto, with rows, at once. Every row must be of
	// that bucket.
	PutRollup(ctx context.Context, unit string, start, upto int64, rows []RollupRow) error
	// Rollups returns the rows of unit whose bucket starts in [from, to).
	Rollups(ctx context.Context, unit string, from, to int64) ([]RollupRow, error)
	// RolledUp returns unit's buckets that start in [from, to) and were
	// written, rows or none, in order.
	RolledUp(ctx context.Context, unit string, from, to int64) ([]Rolled, error)
	// TrimRollups deletes unit's buckets that start before before.
	TrimRollups(ctx context.Context, unit string, before int64) error
}

// rollupMarker is the kind of the row that records a bucket as written
// (so that an empty bucket reads as written too), with its upto as the
// amount; Rollups does not return it.
const rollupMarker = ""

// checkRollup checks that rows are of the bucket (unit, start) and none
// of them has the marker's kind.
func checkRollup(unit string, start int64, rows []RollupRow) error {
	if unit == "" {
		return fmt.Errorf("store: put rollup: no unit")
	}
	for _, r := range rows {
		if r.Unit != unit || r.Start != start {
			return fmt.Errorf("store: put rollup: a row of %s %d in the bucket %s %d", r.Unit, r.Start, unit, start)
		}
		if r.Kind == rollupMarker {
			return fmt.Errorf("store: put rollup: a row with no kind")
		}
	}
	return nil
}

// withMarker is rows and the bucket's marker row.
func withMarker(unit string, start, upto int64, rows []RollupRow) []RollupRow {
	return append(slices.Clip(rows), RollupRow{Unit: unit, Start: start, Kind: rollupMarker, Amount: upto})
}

// PutRollup implements RollupStore.
func (m *Memory) PutRollup(ctx context.Context, unit string, start, upto int64, rows []RollupRow) error {
	if err := checkRollup(unit, start, rows); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return fmt.Errorf("store: put rollup: %w", ErrClosed)
	}
	if m.state.rollups == nil {
		m.state.rollups = map[string]map[int64][]RollupRow{}
	}
	byStart := m.state.rollups[unit]
	if byStart == nil {
		byStart = map[int64][]RollupRow{}
		m.state.rollups[unit] = byStart
	}
	byStart[start] = withMarker(unit, start, upto, slices.Clone(rows)) // replaced, never changed in place
	return nil
}

// Rollups implements RollupStore.
func (m *Memory) Rollups(ctx context.Context, unit string, from, to int64) ([]RollupRow, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, fmt.Errorf("store: rollups: %w", ErrClosed)
	}
	var out []RollupRow
	for start, rows := range m.state.rollups[unit] {
		if start >= from && start < to {
			out = append(out, rows[:len(rows)-1]...) // but the marker
		}
	}
	return out, nil
}

// RolledUp implements RollupStore.
func (m *Memory) RolledUp(ctx context.Context, unit string, from, to int64) ([]Rolled, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, fmt.Errorf("store: rollups: %w", ErrClosed)
	}
	var out []Rolled
	for start, rows := range m.state.rollups[unit] {
		if start >= from && start < to {
			out = append(out, Rolled{Start: start, Upto: rows[len(rows)-1].Amount})
		}
	}
	slices.SortFunc(out, func(a, b Rolled) int { return cmp.Compare(a.Start, b.Start) })
	return out, nil
}

// TrimRollups implements RollupStore.
func (m *Memory) TrimRollups(ctx context.Context, unit string, before int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return fmt.Errorf("store: trim rollups: %w", ErrClosed)
	}
	maps.DeleteFunc(m.state.rollups[unit], func(start int64, _ []RollupRow) bool { return start < before })
	return nil
}

// cloneRollups copies the maps of m's rollups (Reopen); the rows are
// never changed in place.
func cloneRollups(r map[string]map[int64][]RollupRow) map[string]map[int64][]RollupRow {
	out := make(map[string]map[int64][]RollupRow, len(r))
	for unit, byStart := range r {
		out[unit] = maps.Clone(byStart)
	}
	return out
}
