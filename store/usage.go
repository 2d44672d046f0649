package store

import (
	"context"
	"fmt"
)

// This file keeps usage records: small aggregates (per tenant, task, minute,
// kind and name) that the server derives from its events and writes in the
// same transaction as them (Record.Usage), so that they are exactly as
// durable as the events, are never written twice (a batch commits once or
// not at all), and outlive the records a snapshot deletes. The store does
// not know what they count; it only merges a row into the one with the same
// key, as the row's Merge says.

// UsageMerge says how a usage row combines with a stored row of its key.
type UsageMerge uint8

const (
	// MergeAdd adds the amounts.
	MergeAdd UsageMerge = iota
	// MergeMax keeps the larger.
	MergeMax
	// MergeSet keeps the newer.
	MergeSet
)

// UsageRow is one usage aggregate.
type UsageRow struct {
	Tenant, Task         int64
	Minute               int64 // unix seconds / 60
	Kind, Name           string
	TenantName, TaskName string
	Amount               int64
	Merge                UsageMerge
}

type usageKey struct {
	tenant, task, minute int64
	kind, name           string
}

func (r UsageRow) key() usageKey { return usageKey{r.Tenant, r.Task, r.Minute, r.Kind, r.Name} }

func merge(old, new int64, m UsageMerge) int64 {
	switch m {
	case MergeMax:
		return max(old, new)
	case MergeSet:
		return new
	}
	return old + new
}

// UsageReader is the part of a Store that reads and trims usage records.
// Every backend implements it.
type UsageReader interface {
	// Usage returns the rows whose minute is in [from, to), and for each
	// key of kind carryKind the newest row before from (the level carried
	// into the window).
	Usage(ctx context.Context, from, to int64, carryKind string) ([]UsageRow, error)
	// TrimUsage deletes rows older than minute before, except the newest
	// row of each key of kind carryKind, which carries a level forward,
	// when that level is not zero: no row carries zero as well, and an
	// ended task's level ends at zero, so its rows go too.
	TrimUsage(ctx context.Context, before int64, carryKind string) error
	// OldestUsage returns the oldest minute of a row kept; ok is false
	// when there is none.
	OldestUsage(ctx context.Context) (minute int64, ok bool, err error)
}

// usageRows gathers a batch's usage rows, merged by key (a batch often
// touches the same tenant, task and minute many times), in the order each
// key first appears, so the store writes each key once.
func usageRows(recs []Record) []UsageRow {
	var rows []UsageRow
	var at map[usageKey]int
	for _, r := range recs {
		for _, u := range r.Usage {
			if at == nil {
				at = make(map[usageKey]int)
			}
			if i, ok := at[u.key()]; ok {
				rows[i].Amount = merge(rows[i].Amount, u.Amount, u.Merge)
				continue
			}
			at[u.key()] = len(rows)
			rows = append(rows, u)
		}
	}
	return rows
}

// Usage implements UsageReader.
func (m *Memory) Usage(ctx context.Context, from, to int64, carryKind string) ([]UsageRow, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, fmt.Errorf("store: usage: %w", ErrClosed)
	}
	var out []UsageRow
	carry := map[usageKey]UsageRow{} // by key without the minute
	for _, r := range m.state.usage {
		switch {
		case r.Minute >= from && r.Minute < to:
			out = append(out, r)
		case r.Minute < from && r.Kind == carryKind:
			k := r.key()
			k.minute = 0
			if c, ok := carry[k]; !ok || c.Minute < r.Minute {
				carry[k] = r
			}
		}
	}
	for _, r := range carry {
		out = append(out, r)
	}
	return out, nil
}

// OldestUsage implements UsageReader.
func (m *Memory) OldestUsage(ctx context.Context) (minute int64, ok bool, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return 0, false, fmt.Errorf("store: usage: %w", ErrClosed)
	}
	for _, r := range m.state.usage {
		if !ok || r.Minute < minute {
			minute, ok = r.Minute, true
		}
	}
	return minute, ok, nil
}

// TrimUsage implements UsageReader.
func (m *Memory) TrimUsage(ctx context.Context, before int64, carryKind string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return fmt.Errorf("store: trim usage: %w", ErrClosed)
	}
	newest := map[usageKey]int64{}
	for _, r := range m.state.usage {
		if r.Kind == carryKind {
			k := r.key()
			k.minute = 0
			newest[k] = max(newest[k], r.Minute)
		}
	}
	// No size hint: a map keeps the room it is made with, and most rows
	// may be going.
	kept := make(map[usageKey]UsageRow)
	for k, r := range m.state.usage {
		nk := k
		nk.minute = 0
		if r.Minute >= before || (r.Kind == carryKind && newest[nk] == r.Minute && r.Amount != 0) {
			kept[k] = r
		}
	}
	m.state.usage = kept
	return nil
}

// AddUsage merges rows into the usage table at once, in a transaction of
// their own rather than with an Append: records that come from no event
// (a sidecar's report of the refusals it decided). Rows with the same key
// are merged first.
func (m *Memory) AddUsage(ctx context.Context, rows []UsageRow) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return fmt.Errorf("store: add usage: %w", ErrClosed)
	}
	m.addUsage(mergeUsage(rows))
	return nil
}

// mergeUsage merges rows that share a key, keeping the first one's place:
// one statement must not touch a row twice.
func mergeUsage(rows []UsageRow) []UsageRow {
	return usageRows([]Record{{Usage: rows}})
}

// addUsage merges rows into a copy of m's usage. m.mu must be held.
func (m *Memory) addUsage(rows []UsageRow) {
	if len(rows) == 0 {
		return
	}
	if m.state.usage == nil {
		m.state.usage = make(map[usageKey]UsageRow, len(rows))
	}
	usage := m.state.usage // changed in place (memState)
	for _, r := range rows {
		if old, ok := usage[r.key()]; ok {
			old.Amount = merge(old.Amount, r.Amount, r.Merge)
			usage[r.key()] = old
		} else {
			usage[r.key()] = r
		}
	}
}
