package store

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The usage table in SQLite and PostgreSQL (usage.go). Both speak the same
// SQL here but for the placeholders and the larger of two values.

const sqliteUsageSchema = `
CREATE TABLE IF NOT EXISTS governor_usage (
	tenant      INTEGER NOT NULL,
	task        INTEGER NOT NULL,
	minute      INTEGER NOT NULL, -- unix seconds / 60
	kind        TEXT NOT NULL,
	name        TEXT NOT NULL,
	tenant_name TEXT NOT NULL,
	task_name   TEXT NOT NULL,
	amount      INTEGER NOT NULL,
	PRIMARY KEY (tenant, task, minute, kind, name)
);
`

const postgresUsageSchema = `
CREATE TABLE IF NOT EXISTS governor_usage (
	tenant      bigint NOT NULL,
	task        bigint NOT NULL,
	minute      bigint NOT NULL, -- unix seconds / 60
	kind        text NOT NULL,
	name        text NOT NULL,
	tenant_name text NOT NULL,
	task_name   text NOT NULL,
	amount      bigint NOT NULL,
	PRIMARY KEY (tenant, task, minute, kind, name)
);
`

// usageUpsert merges one row; $9 is its UsageMerge.
const usageUpsert = `
INSERT INTO governor_usage (tenant, task, minute, kind, name, tenant_name, task_name, amount)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (tenant, task, minute, kind, name) DO UPDATE SET amount = CASE CAST($9 AS INTEGER)
	WHEN 1 THEN %s(governor_usage.amount, excluded.amount)
	WHEN 2 THEN excluded.amount
	ELSE governor_usage.amount + excluded.amount END`

// usageSelect reads a window and the carried rows; $1 from, $2 to, $3 the
// carried kind.
const usageSelect = `
SELECT tenant, task, minute, kind, name, tenant_name, task_name, amount FROM governor_usage
WHERE minute >= $1 AND minute < $2
UNION ALL
SELECT u.tenant, u.task, u.minute, u.kind, u.name, u.tenant_name, u.task_name, u.amount
FROM governor_usage u JOIN (
	SELECT tenant, task, name, max(minute) AS m FROM governor_usage WHERE kind = $3 AND minute < $1 GROUP BY tenant, task, name
) c ON u.tenant = c.tenant AND u.task = c.task AND u.name = c.name AND u.minute = c.m AND u.kind = $3`

// usageTrim deletes old rows but the newest carried row of each key; $1
// before, $2 the carried kind.
const usageTrim = `
DELETE FROM governor_usage WHERE minute < $1 AND NOT (kind = $2 AND minute = (
	SELECT max(n.minute) FROM governor_usage n
	WHERE n.tenant = governor_usage.tenant AND n.task = governor_usage.task AND n.name = governor_usage.name AND n.kind = $2))`

// sqliteParams writes PostgreSQL's $N placeholders as SQLite's ?N.
func sqliteParams(q string) string { return strings.ReplaceAll(q, "$", "?") }

func sqliteAddUsage(ctx context.Context, tx *sql.Tx, rows []UsageRow) error {
	if len(rows) == 0 {
		return nil
	}
	stmt, err := tx.PrepareContext(ctx, sqliteParams(fmt.Sprintf(usageUpsert, "max")))
	if err != nil {
		return fmt.Errorf("usage: %w", err)
	}
	defer stmt.Close()
	for _, r := range rows {
		if _, err := stmt.ExecContext(ctx, r.Tenant, r.Task, r.Minute, r.Kind, r.Name, r.TenantName, r.TaskName, r.Amount, int(r.Merge)); err != nil {
			return fmt.Errorf("usage: %w", err)
		}
	}
	return nil
}

// Usage implements UsageReader.
func (s *SQLite) Usage(ctx context.Context, from, to int64, carryKind string) ([]UsageRow, error) {
	if s.closed.Load() {
		return nil, fmt.Errorf("store: usage: %w", ErrClosed)
	}
	rows, err := s.db.QueryContext(ctx, sqliteParams(usageSelect), from, to, carryKind)
	if err != nil {
		return nil, fmt.Errorf("store: usage: %w", err)
	}
	defer rows.Close()
	var out []UsageRow
	for rows.Next() {
		var r UsageRow
		if err := rows.Scan(&r.Tenant, &r.Task, &r.Minute, &r.Kind, &r.Name, &r.TenantName, &r.TaskName, &r.Amount); err != nil {
			return nil, fmt.Errorf("store: usage: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: usage: %w", err)
	}
	return out, nil
}

// TrimUsage implements UsageReader.
func (s *SQLite) TrimUsage(ctx context.Context, before int64, carryKind string) error {
	if s.closed.Load() {
		return fmt.Errorf("store: trim usage: %w", ErrClosed)
	}
	if _, err := s.db.ExecContext(ctx, sqliteParams(usageTrim), before, carryKind); err != nil {
		return fmt.Errorf("store: trim usage: %w", err)
	}
	return nil
}

// postgresAppendWithUsage is Append for a batch with usage rows: the
// records, the sessions and the rows in one transaction.
func (p *Postgres) appendWithUsage(ctx context.Context, query string, args []any, want int64, rows []UsageRow) (bool, error) {
	ok := false
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, query, args...)
		if err != nil {
			return err
		}
		if tag.RowsAffected() != want {
			return nil // out of sequence: commit nothing (the insert did nothing)
		}
		b := &pgx.Batch{}
		upsert := fmt.Sprintf(usageUpsert, "GREATEST")
		for _, r := range rows {
			b.Queue(upsert, r.Tenant, r.Task, r.Minute, r.Kind, r.Name, r.TenantName, r.TaskName, r.Amount, int(r.Merge))
		}
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return fmt.Errorf("usage: %w", err)
		}
		ok = true
		return nil
	})
	return ok, err
}

// Usage implements UsageReader.
func (p *Postgres) Usage(ctx context.Context, from, to int64, carryKind string) ([]UsageRow, error) {
	if p.closed.Load() {
		return nil, fmt.Errorf("store: usage: %w", ErrClosed)
	}
	rows, err := p.pool.Query(ctx, usageSelect, from, to, carryKind)
	if err != nil {
		return nil, fmt.Errorf("store: usage: %w", err)
	}
	defer rows.Close()
	var out []UsageRow
	for rows.Next() {
		var r UsageRow
		if err := rows.Scan(&r.Tenant, &r.Task, &r.Minute, &r.Kind, &r.Name, &r.TenantName, &r.TaskName, &r.Amount); err != nil {
			return nil, fmt.Errorf("store: usage: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: usage: %w", err)
	}
	return out, nil
}

// TrimUsage implements UsageReader.
func (p *Postgres) TrimUsage(ctx context.Context, before int64, carryKind string) error {
	if p.closed.Load() {
		return fmt.Errorf("store: trim usage: %w", ErrClosed)
	}
	if _, err := p.pool.Exec(ctx, usageTrim, before, carryKind); err != nil {
		return fmt.Errorf("store: trim usage: %w", err)
	}
	return nil
}
