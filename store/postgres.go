package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Postgres is a Store in three PostgreSQL tables, governor_events,
// governor_snapshot and governor_sessions, in the schema that the connection's search_path names
// first (add search_path=NAME to the DSN to keep several logs in one
// database).
type Postgres struct {
	sqlStore // what SQLite does alike (sqlstore.go); its epoch fences Appends
	pool     *pgxpool.Pool
	cfg      *pgxpool.Config // for the connections of an Elector and a Listener (leader.go)
	// notified is when (unix nanoseconds) a fenced Append last notified the
	// followers: at most one notification per NotifyGap (leader.go).
	notified atomic.Int64
}

// postgresDialect is PostgreSQL's part in the shared statements.
var postgresDialect = sqlDialect{
	snapshotHead: "SELECT seq, last_seq, epoch FROM governor_snapshot WHERE id = 1",
	forUpdate:    " FOR UPDATE",
	emptyBlob:    "''::bytea",
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
	p := &Postgres{sqlStore: sqlStore{conn: postgresConn{postgresQuerier{pool}, pool}, dialect: postgresDialect}, pool: pool, cfg: cfg.Copy()}
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

// postgresConn is the pool as the shared statements want it.
type postgresConn struct {
	postgresQuerier
	pool *pgxpool.Pool
}

func (c postgresConn) begin(ctx context.Context, readOnly bool) (sqlTx, error) {
	opts := pgx.TxOptions{}
	if readOnly {
		// Repeatable read: one view of the database for the whole
		// transaction.
		opts = pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}
	}
	tx, err := c.pool.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return postgresTx{postgresQuerier{tx}, tx}, nil
}

// postgresTx is a transaction as the shared statements want it.
type postgresTx struct {
	postgresQuerier
	tx pgx.Tx
}

func (t postgresTx) commit(ctx context.Context) error { return t.tx.Commit(ctx) }

func (t postgresTx) rollback(ctx context.Context) { t.tx.Rollback(context.WithoutCancel(ctx)) }

// postgresQuerier runs the shared statements on a pool or in a transaction.
type postgresQuerier struct {
	q interface {
		QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
		Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
		Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	}
}

func (p postgresQuerier) queryRow(ctx context.Context, query string, args ...any) scanner {
	return p.q.QueryRow(ctx, query, args...)
}

func (p postgresQuerier) query(ctx context.Context, query string, args ...any) (cursor, func(), error) {
	rows, err := p.q.Query(ctx, query, args...)
	if err != nil {
		return nil, nil, err
	}
	return rows, rows.Close, nil
}

func (p postgresQuerier) exec(ctx context.Context, query string, args ...any) error {
	_, err := p.q.Exec(ctx, query, args...)
	return err
}

// Append implements Store in one statement: one round trip whatever the
// batch size.
func (p *Postgres) Append(ctx context.Context, recs []Record) error {
	if err := p.checkAppendable(recs); err != nil || len(recs) == 0 {
		return err
	}
	first := recs[0].Seq
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

// SaveSnapshot implements Store. Like the parts' writes, it is fenced by
// the epoch: a deposed leader's snapshot is refused (ErrDeposed), so that
// it cannot drop events the new leader's log holds past it.
func (p *Postgres) SaveSnapshot(ctx context.Context, seq uint64, data []byte) error {
	if p.closed.Load() {
		return fmt.Errorf("store: save snapshot: %w", ErrClosed)
	}
	if data == nil {
		data = []byte{} // NULL would mean "no snapshot"
	}
	return p.inTx(ctx, "save snapshot", func(tx sqlTx) error {
		if err := p.checkSnapshotTx(ctx, tx, seq, true); err != nil {
			return err
		}
		var b pgx.Batch
		b.Queue("UPDATE governor_snapshot SET seq = $1, data = $2, parts = 0 WHERE id = 1", int64(seq), data)
		b.Queue("DELETE FROM governor_events WHERE seq <= $1", int64(seq))
		b.Queue("DELETE FROM governor_snapshot_parts")
		return tx.(postgresTx).tx.SendBatch(ctx, &b).Close()
	})
}

// Tidy implements Store. One call deletes up to postgresTidyRecords covered
// records and postgresTidyParts parts.
func (p *Postgres) Tidy(ctx context.Context) (more bool, err error) {
	if p.closed.Load() {
		return false, fmt.Errorf("store: tidy: %w", ErrClosed)
	}
	err = pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
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
	if err != nil {
		return false, fmt.Errorf("store: tidy: %w", err)
	}
	return more, nil
}

// How much one Tidy does.
const (
	postgresTidyRecords = 4096
	postgresTidyParts   = 4
)

// Close implements Store.
func (p *Postgres) Close() error {
	if !p.closed.Swap(true) {
		p.pool.Close()
	}
	return nil
}
