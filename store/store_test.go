package store_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	"github.com/governor-project/governor/store"
)

// TestStoreConformance runs the one suite every Store implementation must
// pass.
func TestStoreConformance(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			for _, c := range conformanceCases {
				t.Run(c.name, func(t *testing.T) {
					open := b.fresh(t)
					c.run(t, open)
				})
			}
		})
	}
}

var conformanceCases = []struct {
	name string
	run  func(t *testing.T, open func() store.Store)
}{
	{"EmptyLog", testEmptyLog},
	{"AppendLoadOrder", testAppendLoadOrder},
	{"SnapshotReplacesAndDeletes", testSnapshotReplacesAndDeletes},
	{"SnapshotOutOfRange", testSnapshotOutOfRange},
	{"ReopenKeepsEverything", testReopen},
	{"OutOfSequenceRejected", testOutOfSequence},
	{"LoadStopsOnCallbackError", testLoadCallbackError},
	{"ManyRecords", testManyRecords},
	{"Closed", testClosed},
	{"SessionsTable", testSessionsTable},
	{"SessionsAllOrNothing", testSessionsAllOrNothing},
	{"SessionsHashReusedInOneBatch", testSessionsHashReused},
	{"AddSessions", testAddSessions},
	{"SnapshotInParts", testSnapshotInParts},
	{"SnapshotPartsChecked", testSnapshotPartsChecked},
	{"SnapshotPartsAbandoned", testSnapshotPartsAbandoned},
}

// logView is everything Load reports.
type logView struct {
	hasSnap  bool
	snapSeq  uint64
	snap     []byte
	sessions []store.Session
	recs     []store.Record
}

func loadAll(t testing.TB, st store.Store) logView {
	t.Helper()
	var v logView
	err := st.Load(context.Background(), store.LoadFuncs{
		Snapshot: func(seq uint64, data []byte) error {
			if v.hasSnap {
				t.Errorf("snapshot func called twice")
			}
			if len(v.recs) > 0 || len(v.sessions) > 0 {
				t.Errorf("snapshot func called after a session or a record")
			}
			v.hasSnap, v.snapSeq, v.snap = true, seq, data
			return nil
		},
		Session: func(s store.Session) error {
			if len(v.recs) > 0 {
				t.Errorf("session func called after a record")
			}
			v.sessions = append(v.sessions, s)
			return nil
		},
		Record: func(r store.Record) error {
			if r.Opens != nil || r.Ends != 0 {
				t.Errorf("Load gave record %d sessions changes %+v, %d; they are reported as the table", r.Seq, r.Opens, r.Ends)
			}
			v.recs = append(v.recs, r)
			return nil
		},
	})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return v
}

// recs makes records from..to, each with data "r<seq>".
func recs(from, to uint64) []store.Record {
	var rs []store.Record
	for s := from; s <= to; s++ {
		rs = append(rs, store.Record{Seq: s, Data: fmt.Appendf(nil, "r%d", s)})
	}
	return rs
}

func mustAppend(t testing.TB, st store.Store, rs []store.Record) {
	t.Helper()
	if err := st.Append(context.Background(), rs); err != nil {
		t.Fatalf("Append %d..%d: %v", rs[0].Seq, rs[len(rs)-1].Seq, err)
	}
}

// wantLog checks that st holds exactly the snapshot (snapSeq, snap; hasSnap
// false for none) and the records from..to made by recs.
func wantLog(t testing.TB, st store.Store, hasSnap bool, snapSeq uint64, snap string, from, to uint64) {
	t.Helper()
	v := loadAll(t, st)
	if v.hasSnap != hasSnap || v.snapSeq != snapSeq || string(v.snap) != snap {
		t.Errorf("snapshot = (%v, %d, %q), want (%v, %d, %q)", v.hasSnap, v.snapSeq, v.snap, hasSnap, snapSeq, snap)
	}
	var want []store.Record
	if from <= to {
		want = recs(from, to)
	}
	if !slices.EqualFunc(v.recs, want, func(a, b store.Record) bool { return a.Seq == b.Seq && bytes.Equal(a.Data, b.Data) }) {
		t.Errorf("records = %s, want %s", fmtRecs(v.recs), fmtRecs(want))
	}
}

func fmtRecs(rs []store.Record) string {
	if len(rs) > 12 {
		return fmt.Sprintf("[%d records: %s … %s]", len(rs), fmtRecs(rs[:3]), fmtRecs(rs[len(rs)-3:]))
	}
	var b bytes.Buffer
	for i, r := range rs {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%d:%q", r.Seq, r.Data)
	}
	return "[" + b.String() + "]"
}

func testEmptyLog(t *testing.T, open func() store.Store) {
	st := open()
	defer st.Close()
	wantLog(t, st, false, 0, "", 1, 0)
	if err := st.Append(context.Background(), nil); err != nil {
		t.Errorf("Append(nil) = %v, want nil", err)
	}
	wantLog(t, st, false, 0, "", 1, 0)
}

func testAppendLoadOrder(t *testing.T, open func() store.Store) {
	st := open()
	defer st.Close()
	mustAppend(t, st, recs(1, 1))
	mustAppend(t, st, recs(2, 5))
	mustAppend(t, st, recs(6, 300))
	wantLog(t, st, false, 0, "", 1, 300)

	// Data is copied: the caller may reuse its buffers.
	rs := recs(301, 301)
	mustAppend(t, st, rs)
	rs[0].Data[0] = 'X'
	wantLog(t, st, false, 0, "", 1, 301)

	// Empty and nil Data both come back empty.
	mustAppend(t, st, []store.Record{{Seq: 302, Data: []byte{}}, {Seq: 303}})
	v := loadAll(t, st)
	if n := len(v.recs); n != 303 || len(v.recs[301].Data) != 0 || len(v.recs[302].Data) != 0 {
		t.Errorf("records 302, 303 = %s, want empty data", fmtRecs(v.recs[301:]))
	}
}

func testSnapshotReplacesAndDeletes(t *testing.T, open func() store.Store) {
	ctx := context.Background()
	st := open()
	defer st.Close()
	mustAppend(t, st, recs(1, 10))
	if err := st.SaveSnapshot(ctx, 4, []byte("s4")); err != nil {
		t.Fatalf("SaveSnapshot(4): %v", err)
	}
	wantLog(t, st, true, 4, "s4", 5, 10)

	// Same seq again: replaced.
	if err := st.SaveSnapshot(ctx, 4, []byte("s4b")); err != nil {
		t.Fatalf("SaveSnapshot(4) again: %v", err)
	}
	wantLog(t, st, true, 4, "s4b", 5, 10)

	// Up to the end: no records left; appends continue after it.
	if err := st.SaveSnapshot(ctx, 10, []byte("s10")); err != nil {
		t.Fatalf("SaveSnapshot(10): %v", err)
	}
	wantLog(t, st, true, 10, "s10", 11, 10)
	mustAppend(t, st, recs(11, 12))
	wantLog(t, st, true, 10, "s10", 11, 12)

	// An empty snapshot is still a snapshot.
	if err := st.SaveSnapshot(ctx, 12, nil); err != nil {
		t.Fatalf("SaveSnapshot(12, nil): %v", err)
	}
	wantLog(t, st, true, 12, "", 13, 12)
}

func testSnapshotOutOfRange(t *testing.T, open func() store.Store) {
	ctx := context.Background()
	st := open()
	defer st.Close()

	// A snapshot past the log would leave a hole after it.
	if err := st.SaveSnapshot(ctx, 1, []byte("s1")); !errors.Is(err, store.ErrSnapshotSeq) {
		t.Errorf("SaveSnapshot(1) on an empty log = %v, want ErrSnapshotSeq", err)
	}
	mustAppend(t, st, recs(1, 6))
	if err := st.SaveSnapshot(ctx, 3, []byte("s3")); err != nil {
		t.Fatalf("SaveSnapshot(3): %v", err)
	}
	for _, seq := range []uint64{7, 100, 2, 0} {
		if err := st.SaveSnapshot(ctx, seq, []byte("bad")); !errors.Is(err, store.ErrSnapshotSeq) {
			t.Errorf("SaveSnapshot(%d) = %v, want ErrSnapshotSeq", seq, err)
		}
	}
	// Nothing moved.
	wantLog(t, st, true, 3, "s3", 4, 6)
}

func testReopen(t *testing.T, open func() store.Store) {
	ctx := context.Background()
	st := open()
	mustAppend(t, st, recs(1, 20))
	if err := st.SaveSnapshot(ctx, 15, []byte("s15")); err != nil {
		t.Fatalf("SaveSnapshot(15): %v", err)
	}
	mustAppend(t, st, recs(21, 25))
	if err := st.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	st = open()
	wantLog(t, st, true, 15, "s15", 16, 25)
	// The next seq is known after a restart too.
	if err := st.Append(ctx, recs(27, 27)); !errors.Is(err, store.ErrOutOfSequence) {
		t.Errorf("Append(27) after reopen = %v, want ErrOutOfSequence", err)
	}
	mustAppend(t, st, recs(26, 30))
	st.Close()

	st = open()
	defer st.Close()
	wantLog(t, st, true, 15, "s15", 16, 30)
}

func testOutOfSequence(t *testing.T, open func() store.Store) {
	st := open()
	defer st.Close()
	bad := func(rs ...uint64) {
		t.Helper()
		var batch []store.Record
		for _, s := range rs {
			batch = append(batch, store.Record{Seq: s, Data: []byte("bad")})
		}
		if err := st.Append(context.Background(), batch); !errors.Is(err, store.ErrOutOfSequence) {
			t.Errorf("Append%v = %v, want ErrOutOfSequence", rs, err)
		}
	}
	bad(0)
	bad(2) // an empty log starts at 1
	mustAppend(t, st, recs(1, 3))
	bad(5)       // a gap
	bad(3)       // a duplicate
	bad(1, 2)    // the past
	bad(4, 4)    // not increasing
	bad(4, 6)    // a gap inside the batch
	bad(4, 5, 7) // the good head of a bad batch is not written either
	bad(5, 4)
	bad(1<<63, 1<<63+1)
	// Nothing was written by any of them.
	wantLog(t, st, false, 0, "", 1, 3)
	mustAppend(t, st, recs(4, 5))
	wantLog(t, st, false, 0, "", 1, 5)
}

func testLoadCallbackError(t *testing.T, open func() store.Store) {
	ctx := context.Background()
	st := open()
	defer st.Close()
	mustAppend(t, st, recs(1, 10))
	errStop := errors.New("stop here")
	var seen []uint64
	err := st.Load(ctx, store.LoadFuncs{Record: func(r store.Record) error {
		seen = append(seen, r.Seq)
		if r.Seq == 4 {
			return errStop
		}
		return nil
	}})
	if !errors.Is(err, errStop) || !slices.Equal(seen, []uint64{1, 2, 3, 4}) {
		t.Errorf("Load = %v after %v, want errStop after [1 2 3 4]", err, seen)
	}

	if err := st.SaveSnapshot(ctx, 2, []byte("s2")); err != nil {
		t.Fatal(err)
	}
	seen = nil
	err = st.Load(ctx, store.LoadFuncs{
		Snapshot: func(uint64, []byte) error { return errStop },
		Record: func(r store.Record) error {
			seen = append(seen, r.Seq)
			return nil
		},
	})
	if !errors.Is(err, errStop) || len(seen) != 0 {
		t.Errorf("Load = %v after %v, want errStop before any record", err, seen)
	}
	// The store is still usable afterwards.
	mustAppend(t, st, recs(11, 11))
	wantLog(t, st, true, 2, "s2", 3, 11)
}

func testManyRecords(t *testing.T, open func() store.Store) {
	st := open()
	defer st.Close()
	const n = 20000
	for from := uint64(1); from <= n; from += 1000 {
		mustAppend(t, st, recs(from, from+999))
	}
	var next uint64 = 1
	err := st.Load(context.Background(), store.LoadFuncs{
		Snapshot: func(uint64, []byte) error { return errors.New("no snapshot expected") },
		Record: func(r store.Record) error {
			if r.Seq != next || string(r.Data) != fmt.Sprintf("r%d", next) {
				return fmt.Errorf("record %d:%q, want %d", r.Seq, r.Data, next)
			}
			next++
			return nil
		},
	})
	if err != nil || next != n+1 {
		t.Fatalf("Load = %v, stopped at %d, want %d records", err, next-1, n)
	}
}

func testClosed(t *testing.T, open func() store.Store) {
	ctx := context.Background()
	st := open()
	mustAppend(t, st, recs(1, 2))
	if err := st.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := st.Append(ctx, recs(3, 3)); !errors.Is(err, store.ErrClosed) {
		t.Errorf("Append after Close = %v, want ErrClosed", err)
	}
	if err := st.SaveSnapshot(ctx, 2, nil); !errors.Is(err, store.ErrClosed) {
		t.Errorf("SaveSnapshot after Close = %v, want ErrClosed", err)
	}
	err := st.Load(ctx, store.LoadFuncs{Record: func(store.Record) error { return nil }})
	if !errors.Is(err, store.ErrClosed) {
		t.Errorf("Load after Close = %v, want ErrClosed", err)
	}
}

func TestStoreOpen(t *testing.T) {
	ctx := context.Background()
	if _, err := store.Open(ctx, "mysql", "x"); !errors.Is(err, store.ErrUnknownDriver) || !bytes.Contains([]byte(err.Error()), []byte(`"mysql"`)) {
		t.Errorf("Open(mysql) = %v, want ErrUnknownDriver naming the driver", err)
	}
	st, err := store.Open(ctx, store.DriverMemory, "")
	if err != nil {
		t.Fatalf("Open(memory): %v", err)
	}
	st.Close()

	st, err = store.Open(ctx, store.DriverSQLite, filepath.Join(t.TempDir(), "g.db"))
	if err != nil {
		t.Fatalf("Open(sqlite): %v", err)
	}
	mustAppend(t, st, recs(1, 1))
	st.Close()

	if _, err := store.Open(ctx, store.DriverSQLite, filepath.Join(t.TempDir(), "no", "such", "dir", "g.db")); err == nil {
		t.Errorf("Open(sqlite) in a missing folder succeeded")
	}
	if _, err := store.Open(ctx, store.DriverPostgres, "postgres://u:secret@[bad"); err == nil || bytes.Contains([]byte(err.Error()), []byte("secret")) {
		t.Errorf("Open(postgres, bad dsn) = %v, want an error that does not show the password", err)
	}
}

// TestStoreConcurrentWriters: two handles on one log racing to append the
// same seqs. One wins each seq; the loser gets ErrOutOfSequence; the log
// ends up whole.
func TestStoreConcurrentWriters(t *testing.T) {
	for _, b := range backends() {
		if b.name == "memory" {
			continue // two Memory handles are two logs
		}
		t.Run(b.name, func(t *testing.T) {
			open := b.fresh(t)
			st1, st2 := open(), open()
			defer st1.Close()
			defer st2.Close()
			const n = 100
			errc := make(chan error, 2)
			write := func(st store.Store) {
				for s := uint64(1); s <= n; s++ {
					err := st.Append(context.Background(), recs(s, s))
					if err != nil && !errors.Is(err, store.ErrOutOfSequence) {
						errc <- err
						return
					}
				}
				errc <- nil
			}
			go write(st1)
			go write(st2)
			for range 2 {
				if err := <-errc; err != nil {
					t.Errorf("Append: %v", err)
				}
			}
			wantLog(t, st1, false, 0, "", 1, n)
		})
	}
}

// opening makes record seq open session id (token hash "h<id>").
func opening(seq, id uint64) store.Record {
	return store.Record{Seq: seq, Data: fmt.Appendf(nil, "r%d", seq), Opens: &store.Session{ID: id, TokenHash: fmt.Sprintf("h%d", id)}}
}

// ending makes record seq end session id.
func ending(seq, id uint64) store.Record {
	return store.Record{Seq: seq, Data: fmt.Appendf(nil, "r%d", seq), Ends: id}
}

// wantSessions checks that st's sessions table holds exactly the sessions
// ids, each with the hash opening gave it.
func wantSessions(t testing.TB, st store.Store, ids ...uint64) {
	t.Helper()
	want := []store.Session{}
	for _, id := range ids {
		want = append(want, store.Session{ID: id, TokenHash: fmt.Sprintf("h%d", id)})
	}
	if got := append([]store.Session{}, loadAll(t, st).sessions...); !slices.Equal(got, want) {
		t.Errorf("sessions = %v, want %v", got, want)
	}
}

func testSessionsTable(t *testing.T, open func() store.Store) {
	ctx := context.Background()
	st := open()
	mustAppend(t, st, []store.Record{opening(1, 1), opening(2, 2), opening(3, 3)})
	wantSessions(t, st, 1, 2, 3)
	mustAppend(t, st, []store.Record{ending(4, 2)})
	wantSessions(t, st, 1, 3)
	// Opened and ended in one batch: never in the table.
	mustAppend(t, st, []store.Record{opening(5, 4), ending(6, 4), ending(7, 1), opening(8, 5)})
	wantSessions(t, st, 3, 5)
	// Ending a session that has no row changes nothing.
	mustAppend(t, st, []store.Record{ending(9, 42)})
	wantSessions(t, st, 3, 5)
	// A snapshot deletes records, never sessions.
	if err := st.SaveSnapshot(ctx, 9, []byte("s9")); err != nil {
		t.Fatal(err)
	}
	wantSessions(t, st, 3, 5)
	st.Close()

	st = open()
	defer st.Close()
	wantSessions(t, st, 3, 5)
	mustAppend(t, st, append(recs(10, 11), opening(12, 6)))
	wantSessions(t, st, 3, 5, 6)
	v := loadAll(t, st)
	if v.snapSeq != 9 || len(v.recs) != 3 || !bytes.Equal(v.recs[2].Data, []byte("r12")) {
		t.Errorf("log = snapshot %d and %s, want 9 then 10..12", v.snapSeq, fmtRecs(v.recs))
	}
}

func testSessionsAllOrNothing(t *testing.T, open func() store.Store) {
	ctx := context.Background()
	st := open()
	defer st.Close()
	mustAppend(t, st, []store.Record{opening(1, 1), opening(2, 2)})

	refused := func(why string, batch []store.Record, want error) {
		t.Helper()
		err := st.Append(ctx, batch)
		if err == nil || (want != nil && !errors.Is(err, want)) {
			t.Errorf("Append with %s = %v, want an error (%v)", why, err, want)
		}
	}
	refused("a gap", []store.Record{ending(3, 1), opening(5, 3)}, store.ErrOutOfSequence)
	refused("no token hash", []store.Record{ending(3, 1), {Seq: 4, Opens: &store.Session{ID: 3}}}, store.ErrInvalidRecord)
	refused("session id 0", []store.Record{{Seq: 3, Opens: &store.Session{TokenHash: "h0"}}}, store.ErrInvalidRecord)
	// The database's own keys: an id or a hash that is taken. The SQL
	// stores report their constraint's error, the memory store its own.
	refused("a live session's id", []store.Record{ending(3, 2), {Seq: 4, Opens: &store.Session{ID: 1, TokenHash: "other"}}}, nil)
	refused("a live session's token hash", []store.Record{ending(3, 2), {Seq: 4, Opens: &store.Session{ID: 7, TokenHash: "h1"}}}, nil)

	// None of them wrote anything: not the sessions, not the records.
	wantSessions(t, st, 1, 2)
	v := loadAll(t, st)
	if len(v.recs) != 2 {
		t.Errorf("records = %s, want 1..2", fmtRecs(v.recs))
	}
	mustAppend(t, st, []store.Record{ending(3, 2), opening(4, 3)})
	wantSessions(t, st, 1, 3)
}

// sessionsOf returns st's sessions table.
func sessionsOf(t testing.TB, st store.Store) []store.Session {
	t.Helper()
	return append([]store.Session{}, loadAll(t, st).sessions...)
}

func testSessionsHashReused(t *testing.T, open func() store.Store) {
	st := open()
	defer st.Close()
	mustAppend(t, st, []store.Record{opening(1, 1)})
	// Session 1 ends and session 2 takes its token hash, in one batch: the
	// end is applied first, so the hash is free.
	mustAppend(t, st, []store.Record{ending(2, 1), {Seq: 3, Opens: &store.Session{ID: 2, TokenHash: "h1"}}})
	if got, want := sessionsOf(t, st), []store.Session{{ID: 2, TokenHash: "h1"}}; !slices.Equal(got, want) {
		t.Errorf("sessions = %v, want %v", got, want)
	}
}

func testAddSessions(t *testing.T, open func() store.Store) {
	ctx := context.Background()
	st := open()
	mustAppend(t, st, []store.Record{opening(1, 1)})
	if err := st.AddSessions(ctx, []store.Session{{ID: 7, TokenHash: "h7"}, {ID: 3, TokenHash: "h3"}}); err != nil {
		t.Fatalf("AddSessions: %v", err)
	}
	wantSessions(t, st, 1, 3, 7)
	// All or none: a taken id, a taken hash, or a bad row refuses the lot.
	for _, rows := range [][]store.Session{
		{{ID: 8, TokenHash: "h8"}, {ID: 1, TokenHash: "other"}},
		{{ID: 8, TokenHash: "h8"}, {ID: 9, TokenHash: "h3"}},
		{{ID: 8, TokenHash: "h8"}, {ID: 9}},
		{{ID: 8, TokenHash: "h8"}, {TokenHash: "h0"}},
	} {
		if err := st.AddSessions(ctx, rows); err == nil {
			t.Errorf("AddSessions(%v) = nil, want an error", rows)
		}
	}
	wantSessions(t, st, 1, 3, 7)
	// The rows are ordinary rows: they last, and an end removes them.
	st.Close()
	st = open()
	defer st.Close()
	mustAppend(t, st, []store.Record{ending(2, 7)})
	wantSessions(t, st, 1, 3)
	if err := st.AddSessions(ctx, nil); err != nil {
		t.Errorf("AddSessions(nil) = %v", err)
	}
}

// writeParts writes data as the snapshot at seq, in parts of n bytes, and
// finishes it.
func writeParts(t testing.TB, st store.Store, seq uint64, data string, n int) {
	t.Helper()
	ctx := context.Background()
	off := 0
	for {
		end := min(off+n, len(data))
		if err := st.WriteSnapshotPart(ctx, seq, int64(off), []byte(data[off:end])); err != nil {
			t.Fatalf("WriteSnapshotPart(%d, %d): %v", seq, off, err)
		}
		if off = end; off >= len(data) {
			break
		}
	}
	if err := st.FinishSnapshot(ctx, seq, int64(len(data))); err != nil {
		t.Fatalf("FinishSnapshot(%d): %v", seq, err)
	}
}

// tidyAll calls Tidy until it has nothing more to do.
func tidyAll(t testing.TB, st store.Store) {
	t.Helper()
	for i := 0; ; i++ {
		more, err := st.Tidy(context.Background())
		if err != nil {
			t.Fatalf("Tidy: %v", err)
		}
		if !more {
			return
		}
		if i > 10_000 {
			t.Fatal("Tidy always has more to do")
		}
	}
}

// A snapshot saved in parts: unseen until finished, then loaded whole, with
// the records it covers skipped before Tidy deletes them and after.
func testSnapshotInParts(t *testing.T, open func() store.Store) {
	ctx := context.Background()
	st := open()
	defer st.Close()
	mustAppend(t, st, recs(1, 10))
	for off, part := range []string{"the snap", "shot at ", "six"} {
		if err := st.WriteSnapshotPart(ctx, 6, int64(8*off), []byte(part)); err != nil {
			t.Fatalf("WriteSnapshotPart at %d: %v", 8*off, err)
		}
		wantLog(t, st, false, 0, "", 1, 10) // not yet
	}
	if err := st.FinishSnapshot(ctx, 6, 19); err != nil {
		t.Fatal(err)
	}
	wantLog(t, st, true, 6, "the snapshot at six", 7, 10)
	mustAppend(t, st, recs(11, 12))
	st.Close()

	st = open()
	defer st.Close()
	wantLog(t, st, true, 6, "the snapshot at six", 7, 12)
	tidyAll(t, st)
	wantLog(t, st, true, 6, "the snapshot at six", 7, 12)

	// The next one replaces it; so does one saved whole, and an empty one.
	writeParts(t, st, 11, "eleven, in parts of four", 4)
	wantLog(t, st, true, 11, "eleven, in parts of four", 12, 12)
	tidyAll(t, st)
	wantLog(t, st, true, 11, "eleven, in parts of four", 12, 12)
	if err := st.SaveSnapshot(ctx, 12, []byte("whole")); err != nil {
		t.Fatal(err)
	}
	wantLog(t, st, true, 12, "whole", 13, 12)
	mustAppend(t, st, recs(13, 14))
	writeParts(t, st, 14, "", 4)
	wantLog(t, st, true, 14, "", 15, 14)
	tidyAll(t, st)
	st.Close()
	st = open()
	defer st.Close()
	wantLog(t, st, true, 14, "", 15, 14)

	// A nil part is an empty one, not a missing one.
	mustAppend(t, st, recs(15, 15))
	for _, p := range []struct {
		off  int64
		part []byte
	}{{0, []byte("fifteen")}, {7, nil}} {
		if err := st.WriteSnapshotPart(ctx, 15, p.off, p.part); err != nil {
			t.Fatalf("WriteSnapshotPart(15, %d, %q): %v", p.off, p.part, err)
		}
	}
	if err := st.FinishSnapshot(ctx, 15, 7); err != nil {
		t.Fatal(err)
	}
	wantLog(t, st, true, 15, "fifteen", 16, 15)
}

// Parts out of place, a finish of the wrong size and a seq out of range are
// refused, and change nothing.
func testSnapshotPartsChecked(t *testing.T, open func() store.Store) {
	ctx := context.Background()
	st := open()
	defer st.Close()
	mustAppend(t, st, recs(1, 10))
	writeParts(t, st, 5, "five", 2)
	for _, c := range []struct {
		what string
		err  error
	}{
		{"a part past the newest seq", st.WriteSnapshotPart(ctx, 11, 0, []byte("x"))},
		{"a part older than the snapshot", st.WriteSnapshotPart(ctx, 4, 0, []byte("x"))},
		{"a first part not at 0", st.WriteSnapshotPart(ctx, 8, 3, []byte("x"))},
		{"a finish with no part", st.FinishSnapshot(ctx, 9, 0)},
	} {
		if !errors.Is(c.err, store.ErrSnapshotSeq) {
			t.Errorf("%s: %v, want ErrSnapshotSeq", c.what, c.err)
		}
	}
	if err := st.WriteSnapshotPart(ctx, 8, 0, []byte("ei")); err != nil {
		t.Fatal(err)
	}
	if err := st.WriteSnapshotPart(ctx, 8, 1, []byte("x")); !errors.Is(err, store.ErrSnapshotSeq) {
		t.Errorf("a part overlapping the last: %v, want ErrSnapshotSeq", err)
	}
	if err := st.FinishSnapshot(ctx, 8, 5); !errors.Is(err, store.ErrSnapshotSeq) {
		t.Errorf("a finish of 5 bytes with 2 written: %v, want ErrSnapshotSeq", err)
	}
	wantLog(t, st, true, 5, "five", 6, 10)
	if err := st.WriteSnapshotPart(ctx, 8, 2, []byte("ght")); err != nil {
		t.Fatal(err)
	}
	if err := st.FinishSnapshot(ctx, 8, 5); err != nil {
		t.Fatal(err)
	}
	wantLog(t, st, true, 8, "eight", 9, 10)
}

// A snapshot whose writing stopped half-way (a crash) is never loaded, and
// its parts go with the next Tidy after another snapshot.
func testSnapshotPartsAbandoned(t *testing.T, open func() store.Store) {
	ctx := context.Background()
	st := open()
	defer st.Close()
	mustAppend(t, st, recs(1, 10))
	writeParts(t, st, 4, "four", 3)
	if err := st.WriteSnapshotPart(ctx, 9, 0, []byte("half of ni")); err != nil {
		t.Fatal(err)
	}
	st.Close()
	st = open()
	defer st.Close()
	wantLog(t, st, true, 4, "four", 5, 10)
	// Started over at another seq, and at the same.
	if err := st.WriteSnapshotPart(ctx, 8, 0, []byte("half")); err != nil {
		t.Fatal(err)
	}
	writeParts(t, st, 9, "nine", 3)
	wantLog(t, st, true, 9, "nine", 10, 10)
	tidyAll(t, st)
	wantLog(t, st, true, 9, "nine", 10, 10)
}
