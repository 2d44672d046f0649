package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Postgres is a Store in three PostgreSQL tables, governor_events,
// governor_snapshot and governor_sessions, in the schema that the connection's search_path names
// first (add search_path=NAME to the DSN to keep several logs in one
// database).
type Postgres struct {
	pool  *pgxpool.Pool
	cfg   *pgxpool.Config // for the connections of an Elector and a Listener (leader.go)
	epoch atomic.Uint64   // the epoch Appends are fenced by; 0: not fenced (leader.go)
	// notified is when (unix nanoseconds) a fenced Append last notified the
	// followers: at most one notification per NotifyGap (leader.go).
	notified atomic.Int64
	closed   atomic.Bool
}

// postgresMaxConns: one for the writer, one for a Load or an operator call
// that overlaps it.
const postgresMaxConns = 2

// postgresSchemaLock is the pg_advisory_xact_lock key that serializes table
// creation between processes starting at once ("governor" in ASCII).
const postgresSchemaLock = 0x676f7665726e6f72

const postgresSchema = `
CREATE TABLE IF NOT EXISTS governor_events (
	seq  bigint PRIMARY KEY,
	data bytea
);
CREATE TABLE IF NOT EXISTS governor_snapshot (
	id       smallint PRIMARY KEY CHECK (id = 1),
	seq      bigint NOT NULL, -- the snapshot's seq; 0 when there is none
	data     bytea,           -- NULL when there is no snapshot
	last_seq bigint NOT NULL  -- the newest seq held, snapshot or record
);
INSERT INTO governor_snapshot (id, seq, data, last_seq) VALUES (1, 0, NULL, 0) ON CONFLICT (id) DO NOTHING;
-- > 0: the snapshot is in governor_snapshot_parts (added after the table).
ALTER TABLE governor_snapshot ADD COLUMN IF NOT EXISTS parts integer NOT NULL DEFAULT 0;
CREATE TABLE IF NOT EXISTS governor_snapshot_parts (
	seq  bigint NOT NULL, -- the snapshot's seq
	off  bigint NOT NULL, -- where in the snapshot the part starts
	data bytea NOT NULL,
	PRIMARY KEY (seq, off)
);
CREATE TABLE IF NOT EXISTS governor_sessions (
	id         bigint PRIMARY KEY,   -- the live session's id
	token_hash text NOT NULL UNIQUE  -- SHA-256 of its token, hex
);
`

// OpenPostgres connects to the database named by dsn and creates the tables
// if they are missing.
//
// Every connection runs with synchronous_commit=on unless the DSN sets it:
// "committed" has to mean "on the server's disk" whatever the server's
// default is.
func OpenPostgres(ctx context.Context, dsn string) (*Postgres, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// pgx's parse errors can quote the DSN, password included.
		return nil, errors.New("store: postgres: cannot parse the dsn")
	}
	cfg.MaxConns = postgresMaxConns
	if _, ok := cfg.ConnConfig.RuntimeParams["synchronous_commit"]; !ok {
		cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "on"
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("store: postgres: %w", err)
	}
	p := &Postgres{pool: pool, cfg: cfg.Copy()}
	if err := p.init(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("store: postgres: create tables: %w", err)
	}
	return p, nil
}

func (p *Postgres) init(ctx context.Context) error {
	return pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(postgresSchemaLock)); err != nil {
			return err
		}
		// Simple protocol: several statements in one Exec.
		_, err := tx.Exec(ctx, postgresSchema+postgresUsageSchema+postgresRollupSchema+postgresLeaderSchema, pgx.QueryExecModeSimpleProtocol)
		return err
	})
}

// Load implements Store.
func (p *Postgres) Load(ctx context.Context, fn LoadFuncs) error {
	if p.closed.Load() {
		return fmt.Errorf("store: load: %w", ErrClosed)
	}
	// Repeatable read: the snapshot, the sessions and the records are one
	// view even if an Append or a SaveSnapshot commits in between.
	tx, err := p.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("store: load: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	return loadSQL(postgresReader{ctx, tx}, fn)
}

// postgresReader is a read transaction as loadSQL wants it.
type postgresReader struct {
	ctx context.Context
	tx  pgx.Tx
}

func (r postgresReader) queryRow(query string, args ...any) scanner {
	return r.tx.QueryRow(r.ctx, query, args...)
}

func (r postgresReader) query(query string, args ...any) (cursor, func(), error) {
	rows, err := r.tx.Query(r.ctx, query, args...)
	if err != nil {
		return nil, nil, err
	}
	return rows, rows.Close, nil
}

// Append implements Store in one statement: one round trip whatever the
// batch size.
func (p *Postgres) Append(ctx context.Context, recs []Record) error {
	if p.closed.Load() {
		return fmt.Errorf("store: append: %w", ErrClosed)
	}
	if len(recs) == 0 {
		return nil
	}
	first := recs[0].Seq
	if err := checkContiguous(recs); err != nil {
		return err
	}
	seqs := make([]int64, len(recs))
	datas := make([][]byte, len(recs))
	for i, r := range recs {
		seqs[i], datas[i] = int64(r.Seq), r.Data
	}
	// One statement, so one round trip and its own transaction: the check
	// against what is stored and the move of last_seq (whose row lock also
	// serializes concurrent writers) gate the insert of every record and
	// every change to the sessions table.
	args := []any{seqs[len(seqs)-1], int64(first - 1), seqs, datas}
	query := appendSQL
	if opens, ends := sessionChanges(recs); len(opens) > 0 || len(ends) > 0 {
		// Most batches open and end no session; only these pay for the
		// sessions table's part of the statement.
		openIDs, openHashes := make([]int64, len(opens)), make([]string, len(opens))
		for i, o := range opens {
			openIDs[i], openHashes[i] = int64(o.ID), o.TokenHash
		}
		endIDs := make([]int64, len(ends))
		for i, id := range ends {
			endIDs[i] = int64(id)
		}
		args = append(args, openIDs, openHashes, endIDs)
		query = appendWithSessionsSQL
	}
	if rows := usageRows(recs); len(rows) > 0 {
		// The usage rows ride in the same statement (usage_sql.go).
		var cte string
		cte, args = postgresUsageCTE(rows, args)
		query = strings.Replace(query, appendInsertSQL, cte+appendInsertSQL, 1)
	}
	epoch := p.epoch.Load()
	if epoch != 0 {
		// A leader among standbys: only while its epoch is the newest.
		args = append(args, int64(epoch))
		now := time.Now().UnixNano()
		notify := now-p.notified.Load() >= int64(NotifyGap)
		if notify {
			p.notified.Store(now)
		}
		query = fencedSQL(query, len(args), notify)
	}
	tag, err := p.pool.Exec(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("store: append: %w", err)
	}
	if tag.RowsAffected() != int64(len(recs)) {
		var last, stored int64
		if err := p.pool.QueryRow(ctx, "SELECT last_seq, epoch FROM governor_snapshot WHERE id = 1").Scan(&last, &stored); err != nil {
			return fmt.Errorf("store: append: %w", err)
		}
		if epoch != 0 && uint64(stored) != epoch {
			return fmt.Errorf("store: append: epoch %d, the store's is %d: %w", epoch, stored, ErrDeposed)
		}
		return gapError(first, uint64(last))
	}
	return nil
}

// appendSQL appends records $3 (seqs) and $4 (data) if the newest seq held
// is $2, and makes $1 the newest. appendWithSessionsSQL also adds sessions
// $5 (ids) and $6 (token hashes) and removes sessions $7 (ids). The
// sub-statements of a WITH all see the tables as they were before the
// statement, so a session opened and ended in one batch must be in neither
// list; sessionChanges sees to that.
const (
	appendMoveSQL = `WITH moved AS (
	UPDATE governor_snapshot SET last_seq = $1 WHERE id = 1 AND last_seq = $2 RETURNING 1)`
	appendSessionsSQL = `,
opened AS (
	INSERT INTO governor_sessions (id, token_hash)
	SELECT i, h FROM unnest($5::bigint[], $6::text[]) AS o(i, h) WHERE EXISTS (SELECT 1 FROM moved)),
ended AS (
	DELETE FROM governor_sessions WHERE id = ANY($7::bigint[]) AND EXISTS (SELECT 1 FROM moved))`
	appendInsertSQL = `
INSERT INTO governor_events (seq, data)
SELECT s, d FROM unnest($3::bigint[], $4::bytea[]) AS u(s, d) WHERE EXISTS (SELECT 1 FROM moved)`

	appendSQL             = appendMoveSQL + appendInsertSQL
	appendWithSessionsSQL = appendMoveSQL + appendSessionsSQL + appendInsertSQL
)

// AddSessions implements Store, in one statement.
func (p *Postgres) AddSessions(ctx context.Context, rows []Session) error {
	if p.closed.Load() {
		return fmt.Errorf("store: add sessions: %w", ErrClosed)
	}
	ids, hashes := make([]int64, len(rows)), make([]string, len(rows))
	for i, o := range rows {
		if err := checkSession(o); err != nil {
			return fmt.Errorf("store: add sessions: %w", err)
		}
		ids[i], hashes[i] = int64(o.ID), o.TokenHash
	}
	_, err := p.pool.Exec(ctx, "INSERT INTO governor_sessions (id, token_hash) SELECT * FROM unnest($1::bigint[], $2::text[])", ids, hashes)
	if err != nil {
		return fmt.Errorf("store: add sessions: %w", err)
	}
	return nil
}

// SaveSnapshot implements Store.
func (p *Postgres) SaveSnapshot(ctx context.Context, seq uint64, data []byte) error {
	if p.closed.Load() {
		return fmt.Errorf("store: save snapshot: %w", ErrClosed)
	}
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("store: save snapshot: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))

	var snapSeq, last int64
	if err := tx.QueryRow(ctx, "SELECT seq, last_seq FROM governor_snapshot WHERE id = 1 FOR UPDATE").Scan(&snapSeq, &last); err != nil {
		return fmt.Errorf("store: save snapshot: %w", err)
	}
	if err := checkSnapshot(seq, uint64(snapSeq), uint64(last)); err != nil {
		return err
	}
	if data == nil {
		data = []byte{} // NULL would mean "no snapshot"
	}
	var b pgx.Batch
	b.Queue("UPDATE governor_snapshot SET seq = $1, data = $2, parts = 0 WHERE id = 1", int64(seq), data)
	b.Queue("DELETE FROM governor_events WHERE seq <= $1", int64(seq))
	b.Queue("DELETE FROM governor_snapshot_parts")
	if err := tx.SendBatch(ctx, &b).Close(); err != nil {
		return fmt.Errorf("store: save snapshot: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("store: save snapshot: commit: %w", err)
	}
	return nil
}

// WriteSnapshotPart implements Store.
func (p *Postgres) WriteSnapshotPart(ctx context.Context, seq uint64, off int64, part []byte) error {
	if p.closed.Load() {
		return fmt.Errorf("store: write snapshot part: %w", ErrClosed)
	}
	return p.inTx(ctx, "write snapshot part", func(tx pgx.Tx) error {
		if err := p.checkSnapshotTx(ctx, tx, seq, ""); err != nil {
			return err
		}
		if off == 0 { // an earlier try at the same seq
			if _, err := tx.Exec(ctx, "DELETE FROM governor_snapshot_parts WHERE seq = $1", int64(seq)); err != nil {
				return err
			}
		}
		var have int64
		if err := tx.QueryRow(ctx, "SELECT coalesce(sum(length(data)), 0) FROM governor_snapshot_parts WHERE seq = $1",
			int64(seq)).Scan(&have); err != nil {
			return err
		}
		if have != off {
			return fmt.Errorf("part at %d of the snapshot at seq %d, which has %d bytes: %w", off, seq, have, ErrSnapshotSeq)
		}
		if part == nil {
			part = []byte{}
		}
		_, err := tx.Exec(ctx, "INSERT INTO governor_snapshot_parts (seq, off, data) VALUES ($1, $2, $3)", int64(seq), off, part)
		return err
	})
}

// FinishSnapshot implements Store.
func (p *Postgres) FinishSnapshot(ctx context.Context, seq uint64, size int64) error {
	if p.closed.Load() {
		return fmt.Errorf("store: finish snapshot: %w", ErrClosed)
	}
	return p.inTx(ctx, "finish snapshot", func(tx pgx.Tx) error {
		// FOR UPDATE, as Append's statement locks the row: the check and the
		// change are one step against Appends.
		if err := p.checkSnapshotTx(ctx, tx, seq, " FOR UPDATE"); err != nil {
			return err
		}
		var have, parts int64
		if err := tx.QueryRow(ctx, "SELECT coalesce(sum(length(data)), 0), count(*) FROM governor_snapshot_parts WHERE seq = $1",
			int64(seq)).Scan(&have, &parts); err != nil {
			return err
		}
		if have != size || parts == 0 {
			return fmt.Errorf("the snapshot at seq %d has %d bytes in %d parts, not %d: %w", seq, have, parts, size, ErrSnapshotSeq)
		}
		// data holds no snapshot, so that a governord older than parts
		// fails on the table rather than start without its state.
		_, err := tx.Exec(ctx, "UPDATE governor_snapshot SET seq = $1, parts = $2, data = $3 WHERE id = 1",
			int64(seq), parts, snapshotMarker)
		return err
	})
}

// Tidy implements Store. One call deletes up to postgresTidyRecords covered
// records and postgresTidyParts parts.
func (p *Postgres) Tidy(ctx context.Context) (more bool, err error) {
	if p.closed.Load() {
		return false, fmt.Errorf("store: tidy: %w", ErrClosed)
	}
	err = p.inTx(ctx, "tidy", func(tx pgx.Tx) error {
		var snapSeq int64
		if err := tx.QueryRow(ctx, "SELECT seq FROM governor_snapshot WHERE id = 1").Scan(&snapSeq); err != nil {
			return err
		}
		var b pgx.Batch
		b.Queue(`DELETE FROM governor_events
			WHERE seq <= LEAST($1, (SELECT min(seq) FROM governor_events) + $2)`, snapSeq, int64(postgresTidyRecords-1))
		b.Queue(`DELETE FROM governor_snapshot_parts WHERE (seq, off) IN
			(SELECT seq, off FROM governor_snapshot_parts WHERE seq <> $1 LIMIT $2)`, snapSeq, int64(postgresTidyParts))
		b.Queue(`SELECT EXISTS (SELECT 1 FROM governor_events WHERE seq <= $1)
			OR EXISTS (SELECT 1 FROM governor_snapshot_parts WHERE seq <> $1)`, snapSeq)
		br := tx.SendBatch(ctx, &b)
		if _, err := br.Exec(); err != nil {
			br.Close()
			return err
		}
		if _, err := br.Exec(); err != nil {
			br.Close()
			return err
		}
		if err := br.QueryRow().Scan(&more); err != nil {
			br.Close()
			return err
		}
		return br.Close()
	})
	return more, err
}

// How much one Tidy does.
const (
	postgresTidyRecords = 4096
	postgresTidyParts   = 4
)

// inTx runs f in a transaction and commits it.
func (p *Postgres) inTx(ctx context.Context, what string, f func(pgx.Tx) error) error {
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("store: %s: %w", what, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := f(tx); err != nil {
		if errors.Is(err, ErrSnapshotSeq) {
			return err
		}
		return fmt.Errorf("store: %s: %w", what, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("store: %s: commit: %w", what, err)
	}
	return nil
}

// checkSnapshotTx checks seq as a new snapshot's, inside tx; lock is "" or
// " FOR UPDATE".
func (p *Postgres) checkSnapshotTx(ctx context.Context, tx pgx.Tx, seq uint64, lock string) error {
	var snapSeq, last, stored int64
	if err := tx.QueryRow(ctx, "SELECT seq, last_seq, epoch FROM governor_snapshot WHERE id = 1"+lock).Scan(&snapSeq, &last, &stored); err != nil {
		return err
	}
	if epoch := p.epoch.Load(); epoch != 0 && uint64(stored) != epoch {
		return fmt.Errorf("snapshot at seq %d by epoch %d, the store's is %d: %w", seq, epoch, stored, ErrDeposed)
	}
	return checkSnapshot(seq, uint64(snapSeq), uint64(last))
}

// Close implements Store.
func (p *Postgres) Close() error {
	if !p.closed.Swap(true) {
		p.pool.Close()
	}
	return nil
}
