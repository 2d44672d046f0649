// Package store is Governor's durability layer: an append-only log of
// records plus one snapshot, and Log, the group-commit writer that puts the
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
//	log.go       Log: group commit (Emit under the engine lock, WaitDurable before the reply)
//
// The invariant every backend keeps: the snapshot (if any) has sequence
// number S, the records held are exactly S+1 … N with no hole, and an Append
// must continue at N+1. A request that would break it is refused whole, with
// ErrOutOfSequence or ErrSnapshotSeq, and leaves the log as it was.
package store

import (
	"context"
	"errors"
	"fmt"
	"math"
)

// Record is one committed event: its sequence number and its encoded bytes.
type Record struct {
	Seq  uint64
	Data []byte
}

// Store is an append-only log of records plus one snapshot.
//
// A Store is safe for concurrent use, but it expects a single writer (Log's
// Run); concurrent Appends are serialized and the loser of a race fails with
// ErrOutOfSequence rather than corrupting the log.
type Store interface {
	// Load calls snapshot once with the newest snapshot, if there is one, and
	// then record for every record after it, in increasing Seq order. The
	// callbacks see one consistent view of the log. They must not call back
	// into the Store, and they may keep the slices they are given. An error
	// from a callback stops Load, which returns it wrapped.
	Load(ctx context.Context, snapshot func(seq uint64, data []byte) error, record func(Record) error) error

	// Append stores recs in one transaction: all of them or none. The first
	// Seq must be one more than the newest Seq held (snapshot or record; 1 on
	// an empty log) and each next Seq one more than the last. Append keeps
	// neither recs nor their Data after it returns. An empty recs is a no-op.
	Append(ctx context.Context, recs []Record) error

	// SaveSnapshot replaces the snapshot with data at seq and deletes every
	// record with Seq <= seq, in one transaction. seq may not be older than
	// the current snapshot nor newer than the newest Seq held.
	SaveSnapshot(ctx context.Context, seq uint64, data []byte) error

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
		want++
	}
	return nil
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

// loadSnapshotSQL reads the snapshot row; both SQL stores share its schema.
const loadSnapshotSQL = "SELECT seq, data, data IS NOT NULL FROM governor_snapshot WHERE id = 1"

// scanner is a row of either SQL driver; cursor is a result set of either.
type scanner interface{ Scan(dest ...any) error }

type cursor interface {
	scanner
	Next() bool
	Err() error
}

// loadRecords is Load for the SQL stores, once the read transaction is open:
// the snapshot row, then every record after it, streamed in order.
func loadRecords(snapRow scanner, records func(after int64) (cursor, func(), error),
	snapshot func(uint64, []byte) error, record func(Record) error) error {
	var snapSeq int64
	var snap []byte
	var hasSnap bool
	if err := snapRow.Scan(&snapSeq, &snap, &hasSnap); err != nil {
		return fmt.Errorf("store: load snapshot: %w", err)
	}
	if hasSnap { // a zero-length blob may scan as nil
		if snap == nil {
			snap = []byte{}
		}
		if err := snapshot(uint64(snapSeq), snap); err != nil {
			return fmt.Errorf("store: load snapshot: %w", err)
		}
	}
	rows, closeRows, err := records(snapSeq)
	if err != nil {
		return fmt.Errorf("store: load records: %w", err)
	}
	defer closeRows()
	for rows.Next() {
		var seq int64
		var data []byte
		if err := rows.Scan(&seq, &data); err != nil {
			return fmt.Errorf("store: load records: %w", err)
		}
		if err := record(Record{Seq: uint64(seq), Data: data}); err != nil {
			return fmt.Errorf("store: load record %d: %w", seq, err)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("store: load records: %w", err)
	}
	return nil
}
