package store

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// TestStoreSQLitePragmas checks the settings the durability promise, and
// the bound on the files' size, rest on, on the connection Append uses.
func TestStoreSQLitePragmas(t *testing.T) {
	s, err := OpenSQLite(filepath.Join(t.TempDir(), "g.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for pragma, want := range map[string]string{
		"journal_mode":       "wal",
		"synchronous":        "2", // FULL
		"busy_timeout":       "10000",
		"auto_vacuum":        "2", // INCREMENTAL
		"journal_size_limit": strconv.Itoa(sqliteWALLimit),
	} {
		var got string
		if err := s.db.QueryRowContext(context.Background(), "PRAGMA "+pragma).Scan(&got); err != nil {
			t.Fatalf("PRAGMA %s: %v", pragma, err)
		}
		if got != want {
			t.Errorf("PRAGMA %s = %q, want %q", pragma, got, want)
		}
	}
}

// sqliteOldSchema is the schema as SQLite files were written before
// governor_head existed: last_seq was a column of governor_snapshot.
const sqliteOldSchema = `
CREATE TABLE governor_events (
	seq  INTEGER PRIMARY KEY,
	data BLOB
);
CREATE TABLE governor_snapshot (
	id       INTEGER PRIMARY KEY CHECK (id = 1),
	seq      INTEGER NOT NULL,
	data     BLOB,
	last_seq INTEGER NOT NULL
);
INSERT INTO governor_snapshot (id, seq, data, last_seq) VALUES (1, 0, NULL, 0);
CREATE TABLE governor_sessions (
	id         INTEGER PRIMARY KEY,
	token_hash TEXT NOT NULL UNIQUE
);
`

// writeOldSQLite writes a file in the old schema, as the earlier code left
// it: a snapshot at 3 ("snap"), records 4..6 ("r4".."r6"), last_seq 6, and
// one live session.
func writeOldSQLite(t *testing.T, path string) {
	t.Helper()
	db, err := sql.Open("sqlite", path+"?_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, q := range []string{
		sqliteOldSchema,
		"UPDATE governor_snapshot SET seq = 3, data = CAST('snap' AS BLOB), last_seq = 6 WHERE id = 1",
		"INSERT INTO governor_events (seq, data) VALUES (4, CAST('r4' AS BLOB)), (5, CAST('r5' AS BLOB)), (6, CAST('r6' AS BLOB))",
		"INSERT INTO governor_sessions (id, token_hash) VALUES (9, 'h9')",
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// TestStoreSQLiteOldFile opens a file written before governor_head existed,
// and before auto_vacuum was set: its last_seq moves to governor_head, the
// file turns to auto_vacuum=INCREMENTAL, nothing else changes, and the log
// goes on from where it was.
func TestStoreSQLiteOldFile(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "g.db")
	writeOldSQLite(t, path)

	s, err := OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var oldColumn bool
	if err := s.db.QueryRow("SELECT count(*) > 0 FROM pragma_table_info('governor_snapshot') WHERE name = 'last_seq'").Scan(&oldColumn); err != nil {
		t.Fatal(err)
	}
	if oldColumn {
		t.Errorf("governor_snapshot still has last_seq after the upgrade")
	}
	if mode := pragmaInt(t, s, "auto_vacuum"); mode != 2 {
		t.Errorf("auto_vacuum after the upgrade = %d, want 2 (INCREMENTAL)", mode)
	}

	var snapSeq uint64
	var snap string
	var sessions []Session
	var seqs []uint64
	err = s.Load(ctx, LoadFuncs{
		Snapshot: func(seq uint64, data []byte) error { snapSeq, snap = seq, string(data); return nil },
		Session:  func(o Session) error { sessions = append(sessions, o); return nil },
		Record:   func(r Record) error { seqs = append(seqs, r.Seq); return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	if snapSeq != 3 || snap != "snap" || len(sessions) != 1 || sessions[0] != (Session{9, "h9"}) || len(seqs) != 3 || seqs[0] != 4 || seqs[2] != 6 {
		t.Errorf("after the upgrade: snapshot (%d, %q), sessions %v, records %v; want (3, \"snap\"), [{9 h9}], [4 5 6]", snapSeq, snap, sessions, seqs)
	}

	if err := s.Append(ctx, []Record{{Seq: 8, Data: []byte("r8")}}); !errors.Is(err, ErrOutOfSequence) {
		t.Errorf("Append 8 after 6 = %v, want ErrOutOfSequence", err)
	}
	if err := s.Append(ctx, []Record{{Seq: 7, Data: []byte("r7")}}); err != nil {
		t.Fatalf("Append 7: %v", err)
	}
	if err := s.SaveSnapshot(ctx, 8, []byte("x")); !errors.Is(err, ErrSnapshotSeq) {
		t.Errorf("SaveSnapshot 8 with 7 held = %v, want ErrSnapshotSeq", err)
	}
	if err := s.SaveSnapshot(ctx, 7, []byte("snap7")); err != nil {
		t.Fatalf("SaveSnapshot 7: %v", err)
	}
	s.Close()

	// Opening it again finds the new shape and changes nothing.
	s, err = OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Append(ctx, []Record{{Seq: 8, Data: []byte("r8")}}); err != nil {
		t.Errorf("Append 8 after reopening: %v", err)
	}
}

func pragmaInt(t testing.TB, s *SQLite, name string) int64 {
	t.Helper()
	var n int64
	if err := s.db.QueryRow("PRAGMA " + name).Scan(&n); err != nil {
		t.Fatalf("PRAGMA %s: %v", name, err)
	}
	return n
}

func fileSize(t testing.TB, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// TestStoreSQLiteFilesFollowTheLiveState: after each snapshot the file has
// no free pages and is about the size of what it now holds, however much
// it held before; the WAL is cut back after a snapshot larger than its
// limit.
func TestStoreSQLiteFilesFollowTheLiveState(t *testing.T) {
	for _, way := range []string{"whole", "in parts"} {
		t.Run(way, func(t *testing.T) { testFilesFollowTheLiveState(t, way == "in parts") })
	}
}

func testFilesFollowTheLiveState(t *testing.T, inParts bool) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "g.db")
	s, err := OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	data := make([]byte, 130)
	var seq uint64
	appendRecords := func(n int) {
		t.Helper()
		for range n / 100 {
			rs := make([]Record, 100)
			for i := range rs {
				seq++
				rs[i] = Record{Seq: seq, Data: data}
			}
			if err := s.Append(ctx, rs); err != nil {
				t.Fatal(err)
			}
		}
	}
	save := func(snap []byte) {
		t.Helper()
		if !inParts {
			if err := s.SaveSnapshot(ctx, seq, snap); err != nil {
				t.Fatal(err)
			}
			return
		}
		for off := 0; off == 0 || off < len(snap); off += 256 << 10 {
			if err := s.WriteSnapshotPart(ctx, seq, int64(off), snap[off:min(off+256<<10, len(snap))]); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.FinishSnapshot(ctx, seq, int64(len(snap))); err != nil {
			t.Fatal(err)
		}
		steps := 0
		for more := true; more; steps++ {
			if more, err = s.Tidy(ctx); err != nil {
				t.Fatal(err)
			}
		}
		var left int64
		if err := s.db.QueryRowContext(ctx, "SELECT (SELECT count(*) FROM governor_events WHERE seq <= ?) + "+
			"(SELECT count(*) FROM governor_snapshot_parts WHERE seq <> ?)", seq, seq).Scan(&left); err != nil {
			t.Fatal(err)
		}
		t.Logf("tidied in %d steps", steps)
		if left != 0 {
			t.Errorf("after Tidy, %d covered records and old parts are left", left)
		}
	}
	// A large snapshot first, then small ones: a file that kept its free
	// pages would stay the size of the largest.
	for i, snapSize := range []int{sqliteWALLimit + 2<<20, 64 << 10, 64 << 10} {
		appendRecords(20_000)
		save(make([]byte, snapSize))
		appendRecords(100) // the first commit after a checkpoint cuts the WAL
		free, pages := pragmaInt(t, s, "freelist_count"), pragmaInt(t, s, "page_count")
		db, wal := fileSize(t, path), fileSize(t, path+"-wal")
		t.Logf("snapshot %d (%d bytes): %d pages, %d free; file %d bytes, WAL %d bytes", i+1, snapSize, pages, free, db, wal)
		if free != 0 {
			t.Errorf("snapshot %d: %d free pages, want 0", i+1, free)
		}
		// The snapshot, 100 records and each table's root: a few pages over.
		if limit := int64(snapSize) + 256<<10; db > limit {
			t.Errorf("snapshot %d: file is %d bytes, want at most %d", i+1, db, limit)
		}
		if wal > sqliteWALLimit {
			t.Errorf("snapshot %d: WAL is %d bytes, want at most %d", i+1, wal, sqliteWALLimit)
		}
	}
}
