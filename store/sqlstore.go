package store

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
)

// This file is what the SQLite and PostgreSQL stores share: the steps and
// statements that do not depend on the database, written once against
// sqlConn, with what does depend on it kept as data (sqlDialect). Each
// store's own file has its connection and what its driver does its own
// way: Append, AddSessions, AddUsage and PutRollup (one statement of arrays
// in PostgreSQL, rows in SQLite), SaveSnapshot and Tidy (one round trip of
// statements in PostgreSQL; SQLite also gives pages back to the file
// system).

// scanner is a row of either SQL driver; cursor is a result set of either.
type scanner interface{ Scan(dest ...any) error }

type cursor interface {
	scanner
	Next() bool
	Err() error
}

// sqlQuerier runs statements on either SQL driver. Statements are written
// with PostgreSQL's $N placeholders; SQLite's reads them as ?N.
type sqlQuerier interface {
	queryRow(ctx context.Context, query string, args ...any) scanner
	// query's func closes the cursor.
	query(ctx context.Context, query string, args ...any) (cursor, func(), error)
	exec(ctx context.Context, query string, args ...any) error
}

// sqlTx is a transaction of either SQL driver.
type sqlTx interface {
	sqlQuerier
	commit(ctx context.Context) error
	rollback(ctx context.Context)
}

// sqlConn is a database of either SQL driver: its statements each run in a
// transaction of their own.
type sqlConn interface {
	sqlQuerier
	// begin opens a transaction; readOnly: one that only reads, but sees one
	// view of the database throughout.
	begin(ctx context.Context, readOnly bool) (sqlTx, error)
}

// sqlDialect is what the shared statements know of the database they run
// on.
type sqlDialect struct {
	// snapshotHead reads the snapshot's seq, the newest seq held and the
	// epoch writes are fenced by, in that order.
	snapshotHead string
	// forUpdate, appended to snapshotHead, locks what it reads until the
	// transaction ends; "" where a write transaction holds the database's
	// write lock from its start (SQLite's BEGIN IMMEDIATE).
	forUpdate string
	// emptyBlob is a zero-length blob as a literal: SQLite's driver binds
	// an empty []byte as NULL.
	emptyBlob string
}

// sqlStore is the part of a Store that SQLite and Postgres share.
type sqlStore struct {
	conn    sqlConn
	dialect sqlDialect
	closed  atomic.Bool
	// epoch is the epoch writes are fenced by; 0: not fenced. Only a
	// PostgreSQL leader among standbys sets it (leader.go).
	epoch atomic.Uint64
}

// Load implements Store.
func (s *sqlStore) Load(ctx context.Context, fn LoadFuncs) error {
	if s.closed.Load() {
		return fmt.Errorf("store: load: %w", ErrClosed)
	}
	// One read transaction: the snapshot, the sessions and the records are
	// one view even if an Append or a snapshot commits in between.
	tx, err := s.conn.begin(ctx, true)
	if err != nil {
		return fmt.Errorf("store: load: %w", err)
	}
	defer tx.rollback(ctx)
	return loadSQL(ctx, tx, fn)
}

// checkAppendable refuses an Append to a closed store, or of records that do
// not run on from one another (checkContiguous); the first is checked
// against what is stored inside the Append's transaction.
func (s *sqlStore) checkAppendable(recs []Record) error {
	if s.closed.Load() {
		return fmt.Errorf("store: append: %w", ErrClosed)
	}
	if len(recs) == 0 {
		return nil
	}
	return checkContiguous(recs)
}

// WriteSnapshotPart implements Store.
func (s *sqlStore) WriteSnapshotPart(ctx context.Context, seq uint64, off int64, part []byte) error {
	if s.closed.Load() {
		return fmt.Errorf("store: write snapshot part: %w", ErrClosed)
	}
	return s.inTx(ctx, "write snapshot part", func(tx sqlTx) error {
		if err := s.checkSnapshotTx(ctx, tx, seq, false); err != nil {
			return err
		}
		if off == 0 { // an earlier try at the same seq
			if err := tx.exec(ctx, "DELETE FROM governor_snapshot_parts WHERE seq = $1", int64(seq)); err != nil {
				return err
			}
		}
		var have int64
		if err := tx.queryRow(ctx, "SELECT coalesce(sum(length(data)), 0) FROM governor_snapshot_parts WHERE seq = $1",
			int64(seq)).Scan(&have); err != nil {
			return err
		}
		if have != off {
			return fmt.Errorf("part at %d of the snapshot at seq %d, which has %d bytes: %w", off, seq, have, ErrSnapshotSeq)
		}
		return tx.exec(ctx, "INSERT INTO governor_snapshot_parts (seq, off, data) VALUES ($1, $2, coalesce($3, "+s.dialect.emptyBlob+"))",
			int64(seq), off, part)
	})
}

// FinishSnapshot implements Store.
func (s *sqlStore) FinishSnapshot(ctx context.Context, seq uint64, size int64) error {
	if s.closed.Load() {
		return fmt.Errorf("store: finish snapshot: %w", ErrClosed)
	}
	return s.inTx(ctx, "finish snapshot", func(tx sqlTx) error {
		// Locked, as an Append locks it: the check and the change are one
		// step against Appends.
		if err := s.checkSnapshotTx(ctx, tx, seq, true); err != nil {
			return err
		}
		var have, parts int64
		if err := tx.queryRow(ctx, "SELECT coalesce(sum(length(data)), 0), count(*) FROM governor_snapshot_parts WHERE seq = $1",
			int64(seq)).Scan(&have, &parts); err != nil {
			return err
		}
		if have != size || parts == 0 {
			return fmt.Errorf("the snapshot at seq %d has %d bytes in %d parts, not %d: %w", seq, have, parts, size, ErrSnapshotSeq)
		}
		// data holds no snapshot, so that a governord older than parts
		// fails on the store rather than start without its state.
		return tx.exec(ctx, "UPDATE governor_snapshot SET seq = $1, parts = $2, data = $3 WHERE id = 1",
			int64(seq), parts, snapshotMarker)
	})
}

// snapshotMarker is governor_snapshot.data while the snapshot is in parts:
// not a snapshot, so that a governord older than parts, which reads only
// data, fails on the store rather than start without its state.
var snapshotMarker = []byte{0}

// inTx runs f in a transaction and commits it. An ErrSnapshotSeq from f is
// returned as it is: it names the store already.
func (s *sqlStore) inTx(ctx context.Context, what string, f func(sqlTx) error) error {
	tx, err := s.conn.begin(ctx, false)
	if err != nil {
		return fmt.Errorf("store: %s: %w", what, err)
	}
	defer tx.rollback(ctx)
	if err := f(tx); err != nil {
		if errors.Is(err, ErrSnapshotSeq) {
			return err
		}
		return fmt.Errorf("store: %s: %w", what, err)
	}
	if err := tx.commit(ctx); err != nil {
		return fmt.Errorf("store: %s: commit: %w", what, err)
	}
	return nil
}

// checkSnapshotTx checks seq as a new snapshot's, inside tx, and that the
// store's epoch is the one writes are fenced by; lock keeps what it read
// from changing until tx ends.
func (s *sqlStore) checkSnapshotTx(ctx context.Context, tx sqlTx, seq uint64, lock bool) error {
	query := s.dialect.snapshotHead
	if lock {
		query += s.dialect.forUpdate
	}
	var snapSeq, last, stored int64
	if err := tx.queryRow(ctx, query).Scan(&snapSeq, &last, &stored); err != nil {
		return err
	}
	if epoch := s.epoch.Load(); epoch != 0 && uint64(stored) != epoch {
		return fmt.Errorf("snapshot at seq %d by epoch %d, the store's is %d: %w", seq, epoch, stored, ErrDeposed)
	}
	return checkSnapshot(seq, uint64(snapSeq), uint64(last))
}

// Usage implements UsageReader.
func (s *sqlStore) Usage(ctx context.Context, from, to int64, carryKind string) ([]UsageRow, error) {
	return readRows(ctx, s, "usage", usageSelect, []any{from, to, carryKind}, func(c cursor, r *UsageRow) error {
		return c.Scan(&r.Tenant, &r.Task, &r.Minute, &r.Kind, &r.Name, &r.TenantName, &r.TaskName, &r.Amount)
	})
}

// OldestUsage implements UsageReader.
func (s *sqlStore) OldestUsage(ctx context.Context) (int64, bool, error) {
	if s.closed.Load() {
		return 0, false, fmt.Errorf("store: usage: %w", ErrClosed)
	}
	var m *int64 // NULL when no row is kept
	if err := s.conn.queryRow(ctx, usageOldest).Scan(&m); err != nil {
		return 0, false, fmt.Errorf("store: usage: %w", err)
	}
	if m == nil {
		return 0, false, nil
	}
	return *m, true, nil
}

// TrimUsage implements UsageReader.
func (s *sqlStore) TrimUsage(ctx context.Context, before int64, carryKind string) error {
	return s.write(ctx, "trim usage", usageTrim, before, carryKind)
}

// Rollups implements RollupStore.
func (s *sqlStore) Rollups(ctx context.Context, unit string, from, to int64) ([]RollupRow, error) {
	return readRows(ctx, s, "rollups", rollupSelect, []any{unit, from, to}, func(c cursor, r *RollupRow) error {
		return c.Scan(&r.Unit, &r.Start, &r.Tenant, &r.Task, &r.Kind, &r.Name, &r.TenantName, &r.TaskName, &r.Amount)
	})
}

// RolledUp implements RollupStore.
func (s *sqlStore) RolledUp(ctx context.Context, unit string, from, to int64) ([]Rolled, error) {
	return readRows(ctx, s, "rollups", rollupStarts, []any{unit, from, to}, func(c cursor, r *Rolled) error {
		return c.Scan(&r.Start, &r.Upto)
	})
}

// TrimRollups implements RollupStore.
func (s *sqlStore) TrimRollups(ctx context.Context, unit string, before int64) error {
	return s.write(ctx, "trim rollups", rollupTrim, unit, before)
}

// readRows runs query, which reads the store, and gathers its rows, each
// read by scan; what names it in errors.
func readRows[T any](ctx context.Context, s *sqlStore, what, query string, args []any, scan func(cursor, *T) error) ([]T, error) {
	if s.closed.Load() {
		return nil, fmt.Errorf("store: %s: %w", what, ErrClosed)
	}
	var out []T
	err := eachRow(ctx, s.conn, query, args, func(c cursor) error {
		var v T
		if err := scan(c, &v); err != nil {
			return err
		}
		out = append(out, v)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: %s: %w", what, err)
	}
	return out, nil
}

// write runs one statement that changes the store, in a transaction of its
// own; what names it in errors.
func (s *sqlStore) write(ctx context.Context, what, query string, args ...any) error {
	if s.closed.Load() {
		return fmt.Errorf("store: %s: %w", what, ErrClosed)
	}
	if err := s.conn.exec(ctx, query, args...); err != nil {
		return fmt.Errorf("store: %s: %w", what, err)
	}
	return nil
}

// The reads of Load; $1 is the snapshot's seq.
const (
	loadSnapshotSQL = "SELECT seq, data, data IS NOT NULL, parts FROM governor_snapshot WHERE id = 1"
	loadPartsSQL    = "SELECT off, data FROM governor_snapshot_parts WHERE seq = $1 ORDER BY off"
	loadSessionsSQL = "SELECT id, token_hash FROM governor_sessions ORDER BY id"
	loadRecordsSQL  = "SELECT seq, data FROM governor_events WHERE seq > $1 ORDER BY seq"
)

// loadSQL is Load for the SQL stores, once the read transaction is open.
// Sessions and records are streamed, not gathered first.
func loadSQL(ctx context.Context, tx sqlQuerier, fn LoadFuncs) error {
	var snapSeq, parts int64
	var snap []byte
	var hasSnap bool
	if err := tx.queryRow(ctx, loadSnapshotSQL).Scan(&snapSeq, &snap, &hasSnap, &parts); err != nil {
		return fmt.Errorf("store: load snapshot: %w", err)
	}
	if parts > 0 && fn.Snapshot != nil {
		var err error
		if snap, err = loadParts(ctx, tx, snapSeq, parts); err != nil {
			return fmt.Errorf("store: load snapshot: %w", err)
		}
	}
	if hasSnap && fn.Snapshot != nil {
		if snap == nil { // a zero-length blob may scan as nil
			snap = []byte{}
		}
		if err := fn.Snapshot(uint64(snapSeq), snap); err != nil {
			return fmt.Errorf("store: load snapshot: %w", err)
		}
	}
	if fn.Session != nil {
		err := eachRow(ctx, tx, loadSessionsSQL, nil, func(c cursor) error {
			var id int64
			var hash string
			if err := c.Scan(&id, &hash); err != nil {
				return err
			}
			if err := fn.Session(Session{ID: uint64(id), TokenHash: hash}); err != nil {
				return fmt.Errorf("session %d: %w", id, err)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("store: load sessions: %w", err)
		}
	}
	if fn.Record == nil {
		return nil
	}
	err := eachRow(ctx, tx, loadRecordsSQL, []any{snapSeq}, func(c cursor) error {
		var seq int64
		var data []byte
		if err := c.Scan(&seq, &data); err != nil {
			return err
		}
		if err := fn.Record(Record{Seq: uint64(seq), Data: data}); err != nil {
			return fmt.Errorf("record %d: %w", seq, err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("store: load records: %w", err)
	}
	return nil
}

// loadParts reads the parts of the snapshot at seq, of which there are n,
// and checks that they follow on from one another.
func loadParts(ctx context.Context, tx sqlQuerier, seq, n int64) ([]byte, error) {
	var snap []byte
	var count int64
	err := eachRow(ctx, tx, loadPartsSQL, []any{seq}, func(c cursor) error {
		var off int64
		var part []byte
		if err := c.Scan(&off, &part); err != nil {
			return err
		}
		if off != int64(len(snap)) {
			return fmt.Errorf("part at %d of the snapshot at seq %d, after %d bytes: %w", off, seq, len(snap), ErrCorruptSnapshot)
		}
		snap = append(snap, part...)
		count++
		return nil
	})
	if err == nil && count != n {
		err = fmt.Errorf("the snapshot at seq %d has %d parts, not %d: %w", seq, count, n, ErrCorruptSnapshot)
	}
	if snap == nil {
		snap = []byte{}
	}
	return snap, err
}

// eachRow runs query and calls row for each row it returns.
func eachRow(ctx context.Context, q sqlQuerier, query string, args []any, row func(cursor) error) error {
	rows, closeRows, err := q.query(ctx, query, args...)
	if err != nil {
		return err
	}
	defer closeRows()
	for rows.Next() {
		if err := row(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}
