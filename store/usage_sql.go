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
	merge       INTEGER NOT NULL DEFAULT 0, -- how a row of its key merges (store.UsageMerge)
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
	merge       smallint NOT NULL DEFAULT 0, -- how a row of its key merges (store.UsageMerge)
	PRIMARY KEY (tenant, task, minute, kind, name)
);
`

// sqliteUsageUpsert merges one row; $9 is its UsageMerge.
const sqliteUsageUpsert = `
INSERT INTO governor_usage (tenant, task, minute, kind, name, tenant_name, task_name, amount, merge)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (tenant, task, minute, kind, name) DO UPDATE SET amount = CASE excluded.merge
	WHEN 1 THEN max(governor_usage.amount, excluded.amount)
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

// usageTrim deletes old rows but the newest carried row of each key, if
// it carries a level other than zero (UsageReader.TrimUsage); $1 before,
// $2 the carried kind.
const usageTrim = `
DELETE FROM governor_usage WHERE minute < $1 AND NOT (kind = $2 AND amount <> 0 AND minute = (
	SELECT max(n.minute) FROM governor_usage n
	WHERE n.tenant = governor_usage.tenant AND n.task = governor_usage.task AND n.name = governor_usage.name AND n.kind = $2))`

// usageOldest reads the oldest minute kept; NULL when none is.
const usageOldest = `SELECT min(minute) FROM governor_usage`

// sqliteParams writes PostgreSQL's $N placeholders as SQLite's ?N.
func sqliteParams(q string) string { return strings.ReplaceAll(q, "$", "?") }

func sqliteAddUsage(ctx context.Context, tx *sql.Tx, rows []UsageRow) error {
	if len(rows) == 0 {
		return nil
	}
	stmt, err := tx.PrepareContext(ctx, sqliteParams(sqliteUsageUpsert))
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

// AddUsage merges rows into the usage table at once (see Memory.AddUsage).
func (s *SQLite) AddUsage(ctx context.Context, rows []UsageRow) error {
	if s.closed.Load() {
		return fmt.Errorf("store: add usage: %w", ErrClosed)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: add usage: %w", err)
	}
	if err := sqliteAddUsage(ctx, tx, mergeUsage(rows)); err != nil {
		tx.Rollback()
		return fmt.Errorf("store: add %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: add usage: %w", err)
	}
	return nil
}

// postgresUsageCTE is the part of Append's statement that merges rows into
// the usage table, gated like the rest on the move of last_seq, with its
// arrays appended to args. The merge mode is a column, so that ON CONFLICT
// can read it from the row it would have inserted.
func postgresUsageCTE(rows []UsageRow, args []any) (string, []any) {
	n := len(rows)
	tenants, tasks, minutes, amounts := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	kinds, names, tenantNames, taskNames := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	merges := make([]int32, n)
	for i, r := range rows {
		tenants[i], tasks[i], minutes[i], amounts[i] = r.Tenant, r.Task, r.Minute, r.Amount
		kinds[i], names[i], tenantNames[i], taskNames[i] = r.Kind, r.Name, r.TenantName, r.TaskName
		merges[i] = int32(r.Merge)
	}
	at := len(args)
	args = append(args, tenants, tasks, minutes, kinds, names, tenantNames, taskNames, amounts, merges)
	p := func(i int) int { return at + i }
	cte := fmt.Sprintf(`,
usage AS (
	INSERT INTO governor_usage (tenant, task, minute, kind, name, tenant_name, task_name, amount, merge)
	SELECT * FROM unnest($%d::bigint[], $%d::bigint[], $%d::bigint[], $%d::text[], $%d::text[], $%d::text[], $%d::text[], $%d::bigint[], $%d::smallint[])
	WHERE EXISTS (SELECT 1 FROM moved)
	ON CONFLICT (tenant, task, minute, kind, name) DO UPDATE SET amount = CASE excluded.merge
		WHEN 1 THEN GREATEST(governor_usage.amount, excluded.amount)
		WHEN 2 THEN excluded.amount
		ELSE governor_usage.amount + excluded.amount END)`, p(1), p(2), p(3), p(4), p(5), p(6), p(7), p(8), p(9))
	return cte, args
}

// AddUsage merges rows into the usage table at once (see Memory.AddUsage),
// with Append's own merge: its usage part, gated on nothing.
func (p *Postgres) AddUsage(ctx context.Context, rows []UsageRow) error {
	if p.closed.Load() {
		return fmt.Errorf("store: add usage: %w", ErrClosed)
	}
	rows = mergeUsage(rows)
	if len(rows) == 0 {
		return nil
	}
	cte, args := postgresUsageCTE(rows, nil)
	if _, err := p.pool.Exec(ctx, "WITH moved AS (SELECT 1)"+cte+"\nSELECT 1", args...); err != nil {
		return fmt.Errorf("store: add usage: %w", err)
	}
	return nil
}

// The rollups' table (rollup.go): each bucket's rows, and a row of kind ”
// that records the bucket as written.
const sqliteRollupSchema = `
CREATE TABLE IF NOT EXISTS governor_usage_rollup (
	unit        TEXT NOT NULL,
	start       INTEGER NOT NULL, -- the bucket's first minute
	tenant      INTEGER NOT NULL,
	task        INTEGER NOT NULL,
	kind        TEXT NOT NULL,
	name        TEXT NOT NULL,
	tenant_name TEXT NOT NULL,
	task_name   TEXT NOT NULL,
	amount      INTEGER NOT NULL,
	PRIMARY KEY (unit, start, tenant, task, kind, name)
);
`

const postgresRollupSchema = `
CREATE TABLE IF NOT EXISTS governor_usage_rollup (
	unit        text NOT NULL,
	start       bigint NOT NULL, -- the bucket's first minute
	tenant      bigint NOT NULL,
	task        bigint NOT NULL,
	kind        text NOT NULL,
	name        text NOT NULL,
	tenant_name text NOT NULL,
	task_name   text NOT NULL,
	amount      bigint NOT NULL,
	PRIMARY KEY (unit, start, tenant, task, kind, name)
);
`

const (
	rollupDelete = `DELETE FROM governor_usage_rollup WHERE unit = $1 AND start = $2`
	rollupInsert = `INSERT INTO governor_usage_rollup (unit, start, tenant, task, kind, name, tenant_name, task_name, amount)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`
	rollupSelect = `SELECT unit, start, tenant, task, kind, name, tenant_name, task_name, amount FROM governor_usage_rollup
WHERE unit = $1 AND start >= $2 AND start < $3 AND kind <> ''`
	rollupStarts = `SELECT start, amount FROM governor_usage_rollup WHERE unit = $1 AND start >= $2 AND start < $3 AND kind = '' ORDER BY start`
	rollupTrim   = `DELETE FROM governor_usage_rollup WHERE unit = $1 AND start < $2`
)

// PutRollup implements RollupStore.
func (s *SQLite) PutRollup(ctx context.Context, unit string, start, upto int64, rows []RollupRow) error {
	if err := checkRollup(unit, start, rows); err != nil {
		return err
	}
	if s.closed.Load() {
		return fmt.Errorf("store: put rollup: %w", ErrClosed)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: put rollup: %w", err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, sqliteParams(rollupDelete), unit, start); err != nil {
		return fmt.Errorf("store: put rollup: %w", err)
	}
	stmt, err := tx.PrepareContext(ctx, sqliteParams(rollupInsert))
	if err != nil {
		return fmt.Errorf("store: put rollup: %w", err)
	}
	defer stmt.Close()
	for _, r := range withMarker(unit, start, upto, rows) {
		if _, err := stmt.ExecContext(ctx, r.Unit, r.Start, r.Tenant, r.Task, r.Kind, r.Name, r.TenantName, r.TaskName, r.Amount); err != nil {
			return fmt.Errorf("store: put rollup: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: put rollup: %w", err)
	}
	return nil
}

// PutRollup implements RollupStore.
func (p *Postgres) PutRollup(ctx context.Context, unit string, start, upto int64, rows []RollupRow) error {
	if err := checkRollup(unit, start, rows); err != nil {
		return err
	}
	if p.closed.Load() {
		return fmt.Errorf("store: put rollup: %w", ErrClosed)
	}
	all := withMarker(unit, start, upto, rows)
	n := len(all)
	tenants, tasks, amounts := make([]int64, n), make([]int64, n), make([]int64, n)
	kinds, names, tenantNames, taskNames := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	for i, r := range all {
		tenants[i], tasks[i], amounts[i] = r.Tenant, r.Task, r.Amount
		kinds[i], names[i], tenantNames[i], taskNames[i] = r.Kind, r.Name, r.TenantName, r.TaskName
	}
	const insert = `INSERT INTO governor_usage_rollup (unit, start, tenant, task, kind, name, tenant_name, task_name, amount)
SELECT $1, $2, * FROM unnest($3::bigint[], $4::bigint[], $5::text[], $6::text[], $7::text[], $8::text[], $9::bigint[])`
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, rollupDelete, unit, start); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, insert, unit, start, tenants, tasks, kinds, names, tenantNames, taskNames, amounts)
		return err
	})
	if err != nil {
		return fmt.Errorf("store: put rollup: %w", err)
	}
	return nil
}
