// Package store is Governor's durability layer: an append-only log of
// records, one snapshot, a table of the live sessions' token hashes, and Log, the group-commit writer that puts the
// engine's events into it before anyone is told about them.
//
// The package knows nothing about the engine. A record is a sequence number
// and opaque bytes; Log takes events of any type and an encode function. It
// imports only the standard library and the database drivers
// (modernc.org/sqlite, github.com/jackc/pgx/v5), never another Governor
// package, so the engine and the server can both depend on it.
//
// The files, by layer:
//
//	store.go     the Store contract, its errors and the checks every backend shares; Open
//	memory.go    Memory: in process, for tests and benchmarks, with failure injection
//	sqlite.go    SQLite: the embedded default (pure Go, WAL, synchronous=FULL)
//	postgres.go  Postgres: pgx, one transaction per Append
//	leader.go    PostgreSQL's leader election, fenced Appends and the standbys' tail
//	sqlstore.go  what SQLite and Postgres share, written once: Load, snapshots in parts,
//	             the usage and rollup reads; their dialects' differences as data
//	log.go       Log: group commit (Emit under the engine lock, WaitDurable before the reply),
//	             and snapshots saved a part at a time between commits
//	usage.go     usage records (Record.Usage): aggregates merged in the same transaction
//	             as their records, read and trimmed through UsageReader; Memory's table
//	usage_sql.go the usage and rollup tables in SQLite and PostgreSQL, and their writes
//	rollup.go    usage rollups: a closed hour's, day's or month's totals; Memory's
//
// Token hashes are kept out of the records on purpose. The log is history
// that is kept, copied and read long after a session ends; the sessions
// table holds a hash only while its session lives, and loses it in the same
// transaction as the record that ends the session.
//
// The invariant every backend keeps: the snapshot (if any) has sequence
// number S, the records held after it are exactly S+1 … N with no hole, and
// an Append must continue at N+1. A request that would break it is refused
// whole, with ErrOutOfSequence or ErrSnapshotSeq, and leaves the log as it
// was. Records at or below S, and an older snapshot's parts, may remain
// after a snapshot saved in steps until Tidy deletes them; Load skips them.
package store

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
)

// Record is one committed event: its sequence number and its encoded bytes,
// and what it changes in the sessions table. That change is committed in the
// same transaction as the record; Load reports the table as a whole, so the
// records it returns have neither Opens nor Ends set.
type Record struct {
	Seq  uint64
	Data []byte

	Opens *Session // a session this record opens: its row is added
	Ends  uint64   // the id of a session this record ends (0: none): its row is removed

	// Usage rows derived from this record (usage.go), merged into the
	// usage table in the same transaction. Load does not return them.
	Usage []UsageRow
}

// Session is a row of the sessions table: a live session and the SHA-256
// hash of its token (the server never stores the token itself).
type Session struct {
	ID        uint64
	TokenHash string
}

// LoadFuncs receives what Load reads, in this order: the newest snapshot, if
// there is one; every live session, in increasing ID order; every record
// after the snapshot, in increasing Seq order. A nil func skips its part.
// The funcs see one consistent view of the store. They must not call back
// into the Store, and they may keep the slices they are given. An error from
// one stops Load, which returns it wrapped.
type LoadFuncs struct {
	Snapshot func(seq uint64, data []byte) error
	Session  func(Session) error
	Record   func(Record) error
}

// Store is an append-only log of records, one snapshot and the sessions
// table.
//
// A Store is safe for concurrent use, but it expects a single writer (Log's
// Run); concurrent Appends are serialized and the loser of a race fails with
// ErrOutOfSequence rather than corrupting the log.
type Store interface {
	// Load reads the whole store into fn (see LoadFuncs).
	Load(ctx context.Context, fn LoadFuncs) error

	// Append stores recs, and their changes to the sessions table, in one
	// transaction: all of them or none. The first
	// Seq must be one more than the newest Seq held (snapshot or record; 1 on
	// an empty log) and each next Seq one more than the last. Append keeps
	// neither recs nor their Data after it returns. An empty recs is a no-op.
	Append(ctx context.Context, recs []Record) error

	// AddSessions adds rows to the sessions table outside any record, all or
	// none. It is for the rows of sessions that the log knows but the table
	// does not: a store written before the table existed. An id or a token
	// hash that is already in the table is an error.
	AddSessions(ctx context.Context, rows []Session) error

	// SaveSnapshot replaces the snapshot with data at seq and deletes every
	// record with Seq <= seq, in one transaction. seq may not be older than
	// the current snapshot nor newer than the newest Seq held.
	SaveSnapshot(ctx context.Context, seq uint64, data []byte) error

	// A snapshot can also be saved in short steps, each a transaction of its
	// own, so that a large one never holds up Appends for long (Log does so
	// between its commits): its parts, then FinishSnapshot, then Tidy until
	// it reports nothing more.

	// WriteSnapshotPart stores part, the bytes of the snapshot at seq from
	// offset off on; off 0 starts that snapshot over. Parts come in order,
	// each at the end of the last. Load does not see them until
	// FinishSnapshot. seq is checked as SaveSnapshot checks it.
	WriteSnapshotPart(ctx context.Context, seq uint64, off int64, part []byte) error

	// FinishSnapshot makes the parts written for seq, size bytes in all, the
	// snapshot that Load reads, in one short transaction. The records it
	// covers, and the snapshot it replaces, are left for Tidy to delete:
	// Load skips them.
	FinishSnapshot(ctx context.Context, seq uint64, size int64) error

	// Tidy deletes, in one short transaction, part of what no snapshot or
	// record needs any more: records at or below the snapshot's seq, the
	// parts of other snapshots, and (SQLite) the pages they leave free.
	// more says that something is left for another call.
	Tidy(ctx context.Context) (more bool, err error)

	// Close releases the Store. Calls after Close fail with ErrClosed.
	Close() error
}

// The errors a Store or Log returns wrap one of these, so callers test them
// with errors.Is. Errors from the database itself are wrapped as they come.
var (
	// ErrOutOfSequence: an Append whose Seqs are not strictly increasing by
	// one from the newest Seq held. Nothing was written.
	ErrOutOfSequence = errors.New("record out of sequence")

	// ErrSnapshotSeq: a snapshot older than the current one, or newer than
	// the log (it would leave a hole). Nothing was written.
	ErrSnapshotSeq = errors.New("snapshot seq out of range")

	// ErrInvalidRecord: an Append whose records say something impossible
	// about the sessions table, such as opening a session without a token
	// hash. Nothing was written.
	ErrInvalidRecord = errors.New("invalid record")

	// ErrCorruptSnapshot: the parts of the snapshot Load found do not make
	// a whole one.
	ErrCorruptSnapshot = errors.New("snapshot parts missing or out of order")

	// ErrClosed: the Store was closed.
	ErrClosed = errors.New("store closed")

	// ErrUnknownDriver: Open was given a driver name it does not know.
	ErrUnknownDriver = errors.New("unknown store driver")

	// ErrLogStopped: the Log's Run returned after a clean shutdown, so the
	// event waited for, or the snapshot asked for, will never be committed.
	ErrLogStopped = errors.New("log stopped")

	// ErrLogRunning: Run was called while another Run was going.
	ErrLogRunning = errors.New("log already running")
)

// The driver names accepted by Open (the `store.driver` config key).
const (
	DriverSQLite   = "sqlite"
	DriverPostgres = "postgres"
	DriverMemory   = "memory"
)

// Open opens the Store named by driver: DriverSQLite (dsn is a file path),
// DriverPostgres (dsn is a libpq-style URL or keyword/value string) or
// DriverMemory (dsn is ignored; nothing survives the process).
func Open(ctx context.Context, driver, dsn string) (Store, error) {
	switch driver {
	case DriverSQLite:
		return OpenSQLite(dsn)
	case DriverPostgres:
		return OpenPostgres(ctx, dsn)
	case DriverMemory:
		return NewMemory(), nil
	default:
		return nil, fmt.Errorf("store: driver %q (want %s, %s or %s): %w",
			driver, DriverSQLite, DriverPostgres, DriverMemory, ErrUnknownDriver)
	}
}

// checkContiguous checks that recs run on without a gap from their first
// Seq, which must not be 0. The SQL stores then check the first against
// what is stored, inside their transaction.
func checkContiguous(recs []Record) error {
	if recs[0].Seq == 0 {
		return gapError(0, 0)
	}
	return checkAppend(recs[0].Seq-1, recs)
}

// checkAppend checks that recs continue a log whose newest Seq is last.
// Backends call it with the last Seq they hold, or with recs[0].Seq-1 and
// then check that against the database inside their transaction.
func checkAppend(last uint64, recs []Record) error {
	want := last + 1
	for i, r := range recs {
		if r.Seq != want {
			return fmt.Errorf("store: append: record %d has seq %d, want %d: %w", i, r.Seq, want, ErrOutOfSequence)
		}
		if r.Seq > math.MaxInt64 {
			// Both SQL backends keep seq in a signed 64-bit column.
			return fmt.Errorf("store: append: seq %d does not fit in int64: %w", r.Seq, ErrOutOfSequence)
		}
		if o := r.Opens; o != nil {
			if err := checkSession(*o); err != nil {
				return fmt.Errorf("store: append: record %d: %w", r.Seq, err)
			}
		}
		if r.Ends > math.MaxInt64 {
			return fmt.Errorf("store: append: record %d ends session %d: %w", r.Seq, r.Ends, ErrInvalidRecord)
		}
		want++
	}
	return nil
}

// checkSession checks a row for the sessions table.
func checkSession(o Session) error {
	if o.ID == 0 || o.ID > math.MaxInt64 || o.TokenHash == "" {
		return fmt.Errorf("session %d with token hash %q: %w", o.ID, o.TokenHash, ErrInvalidRecord)
	}
	return nil
}

// sessionChanges is the net change recs make to the sessions table: the rows
// to add and the ids to remove. A session opened and ended within recs is in
// neither. Backends remove before they add, so a session may end and a new
// one take its token hash in one batch.
func sessionChanges(recs []Record) (opens []Session, ends []uint64) {
	for _, r := range recs {
		if r.Opens != nil {
			opens = append(opens, *r.Opens)
		}
		if r.Ends != 0 {
			ends = append(ends, r.Ends)
		}
	}
	if len(opens) == 0 || len(ends) == 0 {
		return opens, ends
	}
	opened := make(map[uint64]bool, len(opens))
	for _, o := range opens {
		opened[o.ID] = true
	}
	ended := make(map[uint64]bool, len(ends))
	for _, id := range ends {
		ended[id] = true
	}
	opens = slices.DeleteFunc(opens, func(o Session) bool { return ended[o.ID] })
	ends = slices.DeleteFunc(ends, func(id uint64) bool { return opened[id] })
	return opens, ends
}

// checkSnapshot checks that a snapshot at seq fits a log whose snapshot is at
// snapSeq and whose newest Seq is last.
func checkSnapshot(seq, snapSeq, last uint64) error {
	if seq < snapSeq || seq > last {
		return fmt.Errorf("store: snapshot at seq %d, want %d..%d: %w", seq, snapSeq, last, ErrSnapshotSeq)
	}
	return nil
}

// gapError reports an Append that does not continue the stored log.
func gapError(first, last uint64) error {
	return fmt.Errorf("store: append: first seq %d, want %d: %w", first, last+1, ErrOutOfSequence)
}
