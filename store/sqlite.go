package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"

	_ "modernc.org/sqlite" // registers the pure-Go "sqlite" database/sql driver
)

// SQLite is a Store in one SQLite file: the embedded default. It is pure Go
// (modernc.org/sqlite, no cgo). The file is in WAL mode with
// synchronous=FULL, so a commit has reached the disk when Append returns.
//
// The files stay in proportion to what the log holds now, not to its
// history: the file is in auto_vacuum=INCREMENTAL mode and each snapshot
// hands the pages it frees (the old snapshot's, the records it covers) back
// to the file system, and the WAL, checkpointed automatically every 1,000
// pages, is cut back to sqliteWALLimit after each checkpoint.
type SQLite struct {
	sqlStore    // what PostgreSQL does alike (sqlstore.go)
	db          *sql.DB
	incremental bool // auto_vacuum is INCREMENTAL: Tidy gives free pages back
}

// sqliteDialect is SQLite's part in the shared statements. The newest seq
// is in governor_head, and nothing fences a SQLite file's writes. The
// snapshot's seq is stored before its blob, so reading it does not read
// the blob.
var sqliteDialect = sqlDialect{
	snapshotHead: "SELECT s.seq, h.last_seq, 0 FROM governor_snapshot s, governor_head h WHERE s.id = 1 AND h.id = 1",
	emptyBlob:    "x''",
}

// sqliteBusyTimeoutMS is how long a statement waits for a lock held by
// another process (a backup, an operator's sqlite3 shell) before failing.
const sqliteBusyTimeoutMS = 10000

// sqliteWALLimit is the journal_size_limit: the size the WAL is cut back to
// when it starts over after a checkpoint. It is above what one ordinary
// checkpoint interval writes (1,000 pages and a batch), so the common cycle
// reuses the file in place, and it undoes what a large snapshot grew.
const sqliteWALLimit = 8 << 20

// sqliteInsertChunk is how many records one INSERT statement carries: well
// under SQLite's limit of 32766 bound parameters.
const sqliteInsertChunk = 256

// sqliteSchema creates the tables of a new file. The newest seq is a row of
// its own, in governor_head, not a column of governor_snapshot as in
// PostgreSQL: SQLite stores a row as one record, so every UPDATE of a
// column rewrites the whole row, and reading a column stored after the
// snapshot's blob walks the blob's overflow pages. With last_seq next to a
// snapshot of a few megabytes, each Append read the snapshot twice (about
// 15 MB for 7.5 MB) and commits got 20-50 times slower after the first
// snapshot (issue 19).
const sqliteSchema = `
CREATE TABLE IF NOT EXISTS governor_events (
	seq  INTEGER PRIMARY KEY,
	data BLOB
);
CREATE TABLE IF NOT EXISTS governor_snapshot (
	id    INTEGER PRIMARY KEY CHECK (id = 1),
	seq   INTEGER NOT NULL,           -- the snapshot's seq; 0 when there is none
	parts INTEGER NOT NULL DEFAULT 0, -- > 0: the snapshot is in governor_snapshot_parts
	data  BLOB                        -- NULL when there is no snapshot
);
CREATE TABLE IF NOT EXISTS governor_snapshot_parts (
	seq  INTEGER NOT NULL, -- the snapshot's seq
	off  INTEGER NOT NULL, -- where in the snapshot the part starts
	data BLOB NOT NULL,
	PRIMARY KEY (seq, off)
);
CREATE TABLE IF NOT EXISTS governor_head (
	id       INTEGER PRIMARY KEY CHECK (id = 1),
	last_seq INTEGER NOT NULL -- the newest seq held, snapshot or record
);
CREATE TABLE IF NOT EXISTS governor_sessions (
	id         INTEGER PRIMARY KEY, -- the live session's id
	token_hash TEXT NOT NULL UNIQUE -- SHA-256 of its token, hex
);
`

// sqliteMoveLastSeq moves last_seq out of governor_snapshot into
// governor_head, in a file written before governor_head existed. Dropping
// the column, rather than leaving it behind, makes an older governord fail
// at once on this file instead of trusting a number nothing updates.
const sqliteMoveLastSeq = `
INSERT INTO governor_head (id, last_seq) SELECT 1, last_seq FROM governor_snapshot WHERE id = 1;
ALTER TABLE governor_snapshot DROP COLUMN last_seq;
`

// sqliteFirstRows gives a new file its one snapshot row and head row.
const sqliteFirstRows = `
INSERT OR IGNORE INTO governor_snapshot (id, seq, data) VALUES (1, 0, NULL);
INSERT OR IGNORE INTO governor_head (id, last_seq) VALUES (1, 0);
`

// OpenSQLite opens or creates the SQLite database at path and its tables.
func OpenSQLite(path string) (*SQLite, error) {
	if path == "" {
		return nil, errors.New("store: sqlite: empty path")
	}
	if strings.ContainsRune(path, '?') {
		// The driver would read whatever follows as its own options.
		return nil, fmt.Errorf("store: sqlite: path %q contains '?'", path)
	}
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", sqliteBusyTimeoutMS))
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(FULL)")
	q.Add("_pragma", fmt.Sprintf("journal_size_limit(%d)", sqliteWALLimit))
	// The driver sets auto_vacuum before anything else, while a new file is
	// still empty: that is the only time it can be set without a VACUUM.
	q.Set("_auto_vacuum", "INCREMENTAL")
	// BEGIN IMMEDIATE takes the write lock up front, so a transaction never
	// fails half-way with SQLITE_BUSY when it first writes.
	q.Set("_txlock", "immediate")
	db, err := sql.Open("sqlite", path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("store: sqlite: open %s: %w", path, err)
	}
	// One connection: there is one writer, and SQLite would serialize
	// writers anyway. Keeping it open keeps the pragmas and the WAL handle.
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)

	s := &SQLite{sqlStore: sqlStore{conn: sqliteConn{sqliteQuerier{db}, db}, dialect: sqliteDialect}, db: db}
	if err := s.init(); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: sqlite: open %s: %w", path, err)
	}
	return s, nil
}

func (s *SQLite) init() error {
	ctx := context.Background()
	var mode string
	if err := s.db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		return err
	}
	if !strings.EqualFold(mode, "wal") {
		// E.g. a file system without shared memory: refuse rather than run
		// with different durability than documented.
		return fmt.Errorf("journal_mode is %q, want wal", mode)
	}
	// One immediate transaction, so that two processes opening an old file
	// at once do not both move last_seq.
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, sqliteSchema+sqliteUsageSchema+sqliteRollupSchema); err != nil {
		return err
	}
	var oldShape bool
	if err := tx.QueryRowContext(ctx,
		"SELECT count(*) > 0 FROM pragma_table_info('governor_snapshot') WHERE name = 'last_seq'").Scan(&oldShape); err != nil {
		return err
	}
	if oldShape {
		if _, err := tx.ExecContext(ctx, sqliteMoveLastSeq); err != nil {
			return fmt.Errorf("move last_seq to governor_head: %w", err)
		}
	}
	var hasParts bool
	if err := tx.QueryRowContext(ctx,
		"SELECT count(*) > 0 FROM pragma_table_info('governor_snapshot') WHERE name = 'parts'").Scan(&hasParts); err != nil {
		return err
	}
	if !hasParts { // a file written before snapshots were saved in parts
		if _, err := tx.ExecContext(ctx, "ALTER TABLE governor_snapshot ADD COLUMN parts INTEGER NOT NULL DEFAULT 0"); err != nil {
			return fmt.Errorf("add governor_snapshot.parts: %w", err)
		}
	}
	if _, err := tx.ExecContext(ctx, sqliteFirstRows); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	s.convertAutoVacuum(ctx)
	var vacuum int
	if err := s.db.QueryRowContext(ctx, "PRAGMA auto_vacuum").Scan(&vacuum); err != nil {
		return err
	}
	s.incremental = vacuum == 2
	return nil
}

// convertAutoVacuum puts a file created before auto_vacuum was set (mode
// NONE) into INCREMENTAL mode. That takes a VACUUM, which rewrites the file
// once: about as long as reading it, and it needs as much free disk again
// for its copy. It is worth it once, since such a file may hold the free
// pages of every snapshot before.
//
// It is best effort: if the VACUUM fails (the disk is short of room for the
// copy, or another process holds the file), the file is left as it was.
// Such a file works as before, reusing its free pages rather than giving
// them back; the next open tries again.
func (s *SQLite) convertAutoVacuum(ctx context.Context) {
	var mode int
	if err := s.db.QueryRowContext(ctx, "PRAGMA auto_vacuum").Scan(&mode); err != nil || mode != 0 {
		return // 2 (INCREMENTAL) as wanted, or 1 (FULL), which frees pages at every commit
	}
	if _, err := s.db.ExecContext(ctx, "PRAGMA auto_vacuum = INCREMENTAL"); err != nil {
		return
	}
	_, _ = s.db.ExecContext(ctx, "VACUUM") // best effort, as said above
}

// sqliteConn is the database as the shared statements want it.
type sqliteConn struct {
	sqliteQuerier
	db *sql.DB
}

func (c sqliteConn) begin(ctx context.Context, readOnly bool) (sqlTx, error) {
	// A write transaction is BEGIN IMMEDIATE (_txlock): it holds the write
	// lock from its start.
	tx, err := c.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: readOnly})
	if err != nil {
		return nil, err
	}
	return sqliteTx{sqliteQuerier{tx}, tx}, nil
}

// sqliteTx is a transaction as the shared statements want it.
type sqliteTx struct {
	sqliteQuerier
	tx *sql.Tx
}

func (t sqliteTx) commit(context.Context) error { return t.tx.Commit() }

func (t sqliteTx) rollback(context.Context) { t.tx.Rollback() }

// sqliteQuerier runs the shared statements on the database or in a
// transaction; their $N placeholders are read as ?N, the same in SQLite's
// syntax.
type sqliteQuerier struct {
	q interface {
		QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
		QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
		ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	}
}

func (s sqliteQuerier) queryRow(ctx context.Context, query string, args ...any) scanner {
	return s.q.QueryRowContext(ctx, sqliteParams(query), args...)
}

func (s sqliteQuerier) query(ctx context.Context, query string, args ...any) (cursor, func(), error) {
	rows, err := s.q.QueryContext(ctx, sqliteParams(query), args...)
	if err != nil {
		return nil, nil, err
	}
	return rows, func() { rows.Close() }, nil
}

func (s sqliteQuerier) exec(ctx context.Context, query string, args ...any) error {
	_, err := s.q.ExecContext(ctx, sqliteParams(query), args...)
	return err
}

// Append implements Store.
func (s *SQLite) Append(ctx context.Context, recs []Record) error {
	if err := s.checkAppendable(recs); err != nil || len(recs) == 0 {
		return err
	}
	first := recs[0].Seq

	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: append: %w", err)
	}
	defer tx.Rollback()

	// The check against what is stored and the move of last_seq are one
	// statement, inside the transaction that inserts.
	res, err := tx.ExecContext(ctx,
		"UPDATE governor_head SET last_seq = ? WHERE id = 1 AND last_seq = ?",
		int64(recs[len(recs)-1].Seq), int64(first-1))
	if err != nil {
		return fmt.Errorf("store: append: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("store: append: %w", err)
	} else if n != 1 {
		var last int64
		if err := tx.QueryRowContext(ctx, "SELECT last_seq FROM governor_head WHERE id = 1").Scan(&last); err != nil {
			return fmt.Errorf("store: append: %w", err)
		}
		return gapError(first, uint64(last))
	}

	args := make([]any, 0, 2*min(len(recs), sqliteInsertChunk))
	for chunk := range sliceChunks(recs, sqliteInsertChunk) {
		args = args[:0]
		for _, r := range chunk {
			args = append(args, int64(r.Seq), r.Data)
		}
		if _, err := tx.ExecContext(ctx, sqliteInsert(len(chunk)), args...); err != nil {
			return fmt.Errorf("store: append: %w", err)
		}
	}
	opens, ends := sessionChanges(recs)
	if err := sqliteChangeSessions(ctx, tx, opens, ends); err != nil {
		return fmt.Errorf("store: append: %w", err)
	}
	if err := sqliteAddUsage(ctx, tx, usageRows(recs)); err != nil {
		return fmt.Errorf("store: append: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: append: commit: %w", err)
	}
	return nil
}

// sqliteChangeSessions removes the sessions ends and then adds opens, inside
// tx.
func sqliteChangeSessions(ctx context.Context, tx *sql.Tx, opens []Session, ends []uint64) error {
	for _, id := range ends {
		if _, err := tx.ExecContext(ctx, "DELETE FROM governor_sessions WHERE id = ?", int64(id)); err != nil {
			return fmt.Errorf("end session %d: %w", id, err)
		}
	}
	for _, o := range opens {
		if _, err := tx.ExecContext(ctx, "INSERT INTO governor_sessions (id, token_hash) VALUES (?, ?)", int64(o.ID), o.TokenHash); err != nil {
			return fmt.Errorf("open session %d: %w", o.ID, err)
		}
	}
	return nil
}

// AddSessions implements Store.
func (s *SQLite) AddSessions(ctx context.Context, rows []Session) error {
	if s.closed.Load() {
		return fmt.Errorf("store: add sessions: %w", ErrClosed)
	}
	for _, o := range rows {
		if err := checkSession(o); err != nil {
			return fmt.Errorf("store: add sessions: %w", err)
		}
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: add sessions: %w", err)
	}
	defer tx.Rollback()
	if err := sqliteChangeSessions(ctx, tx, rows, nil); err != nil {
		return fmt.Errorf("store: add sessions: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: add sessions: commit: %w", err)
	}
	return nil
}

// sqliteInsertFull is the INSERT for a whole chunk, built once.
var sqliteInsertFull = buildSQLiteInsert(sqliteInsertChunk)

func sqliteInsert(n int) string {
	if n == sqliteInsertChunk {
		return sqliteInsertFull
	}
	return buildSQLiteInsert(n)
}

func buildSQLiteInsert(n int) string {
	var b strings.Builder
	b.WriteString("INSERT INTO governor_events (seq, data) VALUES ")
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("(?,?)")
	}
	return b.String()
}

// sliceChunks yields s in consecutive pieces of at most n elements.
func sliceChunks[T any](s []T, n int) func(yield func([]T) bool) {
	return func(yield func([]T) bool) {
		for len(s) > 0 {
			k := min(n, len(s))
			if !yield(s[:k]) {
				return
			}
			s = s[k:]
		}
	}
}

// SaveSnapshot implements Store.
func (s *SQLite) SaveSnapshot(ctx context.Context, seq uint64, data []byte) error {
	if s.closed.Load() {
		return fmt.Errorf("store: save snapshot: %w", ErrClosed)
	}
	err := s.inTx(ctx, "save snapshot", func(tx sqlTx) error {
		if err := s.checkSnapshotTx(ctx, tx, seq, true); err != nil {
			return err
		}
		// coalesce: the driver binds an empty blob as NULL, which would
		// mean "no snapshot".
		if err := tx.exec(ctx, "UPDATE governor_snapshot SET seq = ?, parts = 0, data = coalesce(?, x'') WHERE id = 1", int64(seq), data); err != nil {
			return err
		}
		if err := tx.exec(ctx, "DELETE FROM governor_snapshot_parts"); err != nil {
			return err
		}
		if err := tx.exec(ctx, "DELETE FROM governor_events WHERE seq <= ?", int64(seq)); err != nil {
			return err
		}
		// Give the pages just freed back to the file system: the file
		// shrinks to what the log holds now. In the same transaction, so a
		// failure leaves the store as it was.
		if err := tx.exec(ctx, "PRAGMA incremental_vacuum"); err != nil {
			return fmt.Errorf("incremental vacuum: %w", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	// Copy the WAL into the file now, which also cuts the file to its new
	// size, rather than at the next automatic checkpoint. PASSIVE never
	// waits for another process's reader; if it cannot finish, the
	// automatic checkpoints will. The snapshot is saved either way.
	_, _ = s.db.ExecContext(ctx, "PRAGMA wal_checkpoint(PASSIVE)")
	return nil
}

// Tidy implements Store. One call deletes up to sqliteTidyRecords covered
// records and sqliteTidyParts parts, and gives up to sqliteTidyPages free
// pages back: a few milliseconds.
func (s *SQLite) Tidy(ctx context.Context) (more bool, err error) {
	if s.closed.Load() {
		return false, fmt.Errorf("store: tidy: %w", ErrClosed)
	}
	err = s.inTx(ctx, "tidy", func(tx sqlTx) error {
		var snapSeq int64
		if err := tx.queryRow(ctx, "SELECT seq FROM governor_snapshot WHERE id = 1").Scan(&snapSeq); err != nil {
			return err
		}
		if err := tx.exec(ctx, `DELETE FROM governor_events
			WHERE seq <= min(?, (SELECT min(seq) FROM governor_events) + ?)`, snapSeq, sqliteTidyRecords-1); err != nil {
			return err
		}
		if err := tx.exec(ctx, `DELETE FROM governor_snapshot_parts WHERE rowid IN
			(SELECT rowid FROM governor_snapshot_parts WHERE seq <> ? LIMIT ?)`, snapSeq, sqliteTidyParts); err != nil {
			return err
		}
		if s.incremental {
			if err := tx.exec(ctx, fmt.Sprintf("PRAGMA incremental_vacuum(%d)", sqliteTidyPages)); err != nil {
				return fmt.Errorf("incremental vacuum: %w", err)
			}
		}
		var free int64
		if s.incremental {
			if err := tx.queryRow(ctx, "PRAGMA freelist_count").Scan(&free); err != nil {
				return err
			}
		}
		return tx.queryRow(ctx, `SELECT ? > 0
			OR EXISTS (SELECT 1 FROM governor_events WHERE seq <= ?)
			OR EXISTS (SELECT 1 FROM governor_snapshot_parts WHERE seq <> ?)`, free, snapSeq, snapSeq).Scan(&more)
	})
	if err == nil && !more {
		// As SaveSnapshot does: the file takes its new size now.
		_, _ = s.db.ExecContext(ctx, "PRAGMA wal_checkpoint(PASSIVE)")
	}
	return more, err
}

// How much one Tidy does.
const (
	sqliteTidyRecords = 4096
	sqliteTidyParts   = 4
	sqliteTidyPages   = 256
)

// Close implements Store.
func (s *SQLite) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("store: sqlite: close: %w", err)
	}
	return nil
}
