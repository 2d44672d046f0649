package server

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"maps"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor/engine"
	"github.com/governor-project/governor/server/serverconfig"
)

// Session token hashes live in the store's sessions table while their
// session does, and never in the event log; a restart takes them from
// there, and refuses a table that disagrees with the log.
func TestSessionTokensLiveInTheSessionsTable(t *testing.T) {
	cfg, dbPath, srv := startSQLite(t)
	kept := session(t, srv.Addr(), "pay-key", 0)
	closed := session(t, srv.Addr(), "recon-key", 0)
	late := session(t, srv.Addr(), "admin-key", 0)
	idOf := func(c *client) int64 {
		t.Helper()
		id, _, ok := srv.eng.SessionByToken(hashToken(c.token))
		if !ok {
			t.Fatal("no session for the client's token")
		}
		return int64(id)
	}
	wantRows := map[int64]string{idOf(kept): hashToken(kept.token), idOf(late): hashToken(late.token)}
	lateID := idOf(late)
	if _, err := closed.CloseSession(closed.ctx, &governorpb.CloseSessionRequest{}); err != nil {
		t.Fatal(err)
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}

	db := openSQLite(t, dbPath)
	for _, c := range []*client{kept, closed, late} {
		var n int
		hash := hashToken(c.token)
		if err := db.QueryRow("SELECT count(*) FROM governor_events WHERE instr(CAST(data AS TEXT), ?) > 0", hash).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("%d events hold a token hash", n)
		}
	}
	if got := sessionRows(t, db); !maps.Equal(got, wantRows) {
		t.Fatalf("sessions table = %v, want the two live sessions %v", got, wantRows)
	}

	// After a restart the live tokens work and the closed one does not.
	srv = start(t, cfg)
	for _, c := range []*client{kept, late, closed} {
		err := heartbeatWith(t, srv.Addr(), c.token)
		if c == closed {
			wantCode(t, "heartbeat of the closed session after a restart", err, codes.Unauthenticated)
		} else if err != nil {
			t.Fatalf("heartbeat of a live session after a restart: %v", err)
		}
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}

	// A table that disagrees with the log is refused, whichever way.
	for _, c := range []struct {
		name, damage, undo string
		args               []any
		want               string
	}{
		{"a live session's row lost", "DELETE FROM governor_sessions WHERE id = ?", "INSERT INTO governor_sessions (id, token_hash) VALUES (?, ?)",
			[]any{lateID, hashToken(late.token)}, "in neither the sessions table nor the log"},
		{"a row without a session", "INSERT INTO governor_sessions (id, token_hash) VALUES (?, ?)", "DELETE FROM governor_sessions WHERE id = ?",
			[]any{int64(999), "feed"}, "not live"},
	} {
		if _, err := db.Exec(c.damage, c.args[:strings.Count(c.damage, "?")]...); err != nil {
			t.Fatal(err)
		}
		srv, err := Start(context.Background(), cfg, nil)
		if err == nil {
			srv.Close()
		}
		if !errors.Is(err, engine.ErrCorrupt) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Start = %v, want ErrCorrupt saying %q", c.name, err, c.want)
		}
		if _, err := db.Exec(c.undo, c.args[:strings.Count(c.undo, "?")]...); err != nil {
			t.Fatal(err)
		}
	}
	start(t, cfg) // repaired, it starts again
}

// A store written before the sessions table existed holds the token hashes
// of live sessions in its snapshot and in its events, and has no rows. A
// restart adds the rows, and the sessions go on working.
func TestRestartAddsSessionsMissingFromAnOlderStore(t *testing.T) {
	cfg, dbPath, srv := startSQLite(t)
	inSnapshot := session(t, srv.Addr(), "pay-key", 0)
	if err := srv.snapshot(context.Background()); err != nil {
		t.Fatal(err)
	}
	inEvent := session(t, srv.Addr(), "recon-key", 0)
	eventID, _, _ := srv.eng.SessionByToken(hashToken(inEvent.token))
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}

	// Make the store look as the build before the table wrote it: no rows,
	// and the hash inside the event that opened the session.
	db := openSQLite(t, dbPath)
	if _, err := db.Exec("DELETE FROM governor_sessions"); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Query("SELECT seq, data FROM governor_events")
	if err != nil {
		t.Fatal(err)
	}
	var seq int64 = -1
	var old []byte
	for rows.Next() {
		var s int64
		var data []byte
		if err := rows.Scan(&s, &data); err != nil {
			t.Fatal(err)
		}
		var ev engine.Event
		if err := json.Unmarshal(data, &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Kind == engine.EvSessionOpened && ev.Session == eventID {
			ev.Token = hashToken(inEvent.token)
			if old, err = json.Marshal(ev); err != nil {
				t.Fatal(err)
			}
			seq = s
		}
	}
	rows.Close()
	if seq < 0 {
		t.Fatal("no event opens the second session")
	}
	if _, err := db.Exec("UPDATE governor_events SET data = ? WHERE seq = ?", old, seq); err != nil {
		t.Fatal(err)
	}

	srv = start(t, cfg)
	for _, c := range []*client{inSnapshot, inEvent} {
		if err := heartbeatWith(t, srv.Addr(), c.token); err != nil {
			t.Fatalf("heartbeat of a live session of the older store: %v", err)
		}
	}
	got := sessionRows(t, db)
	if len(got) != 2 || got[int64(eventID)] != hashToken(inEvent.token) {
		t.Fatalf("sessions table after the restart = %v, want both live sessions", got)
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}

	// Where the log holds a hash too (here, the snapshot), a row that says
	// otherwise is refused.
	snapID, _, _ := srv.eng.SessionByToken(hashToken(inSnapshot.token))
	if _, err := db.Exec("UPDATE governor_sessions SET token_hash = 'feed' WHERE id = ?", int64(snapID)); err != nil {
		t.Fatal(err)
	}
	srv, err = Start(context.Background(), cfg, nil)
	if err == nil {
		srv.Close()
	}
	if want := "one token hash in the sessions table and another in the log"; !errors.Is(err, engine.ErrCorrupt) || !strings.Contains(err.Error(), want) {
		t.Errorf("Start with a row that differs = %v, want ErrCorrupt saying %q", err, want)
	}
}

// startSQLite starts a server on a new SQLite store; the caller closes it.
func startSQLite(t *testing.T) (serverconfig.Config, string, *Server) {
	t.Helper()
	cfg := testConfig()
	dbPath := filepath.Join(t.TempDir(), "governor.db")
	cfg.Store = serverconfig.StoreConfig{Driver: "sqlite", DSN: dbPath}
	srv, err := Start(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, dbPath, srv
}

// heartbeatWith sends a heartbeat on a new connection to addr with token.
func heartbeatWith(t *testing.T, addr, token string) error {
	t.Helper()
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+token)
	gov, _ := dial(t, addr)
	_, err := gov.Heartbeat(ctx, &governorpb.HeartbeatRequest{})
	return err
}

func openSQLite(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func sessionRows(t *testing.T, db *sql.DB) map[int64]string {
	t.Helper()
	rows, err := db.Query("SELECT id, token_hash FROM governor_sessions")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[int64]string{}
	for rows.Next() {
		var id int64
		var hash string
		if err := rows.Scan(&id, &hash); err != nil {
			t.Fatal(err)
		}
		got[id] = hash
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}

// Once snapshot_every events are committed, a snapshot is saved on its own
// and the events it covers are deleted soon after; a restart recovers from it.
func TestSnapshotTakenAfterSnapshotEveryEvents(t *testing.T) {
	cfg := testConfig()
	dbPath := filepath.Join(t.TempDir(), "governor.db")
	cfg.Store = serverconfig.StoreConfig{Driver: "sqlite", DSN: dbPath, SnapshotEvery: 5}
	srv := start(t, cfg)
	pay := session(t, srv.Addr(), "pay-key", 0)
	task := pay.task(t, "t", map[string]int64{"calls": 100})
	for range 6 {
		if _, err := pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: task.Id, Resource: "calls", Amount: 1}); err != nil {
			t.Fatal(err)
		}
	}
	db := openSQLite(t, dbPath)
	var snapSeq, events int64
	waitFor(t, func() bool {
		if err := db.QueryRow("SELECT seq FROM governor_snapshot").Scan(&snapSeq); err != nil {
			t.Fatal(err)
		}
		return snapSeq >= 5
	})
	// The covered events are tidied away after the snapshot is current, in
	// steps between commits, so they go soon but not at once.
	waitFor(t, func() bool {
		if err := db.QueryRow("SELECT count(*) FROM governor_events WHERE seq <= ?", snapSeq).Scan(&events); err != nil {
			t.Fatal(err)
		}
		return events == 0
	})
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	srv = start(t, cfg)
	pay = session(t, srv.Addr(), "pay-key", 0)
	n, err := pay.GetNode(pay.ctx, &governorpb.GetNodeRequest{NodeId: task.Id})
	if err != nil || n.Used["calls"] != 6 {
		t.Fatalf("after a restart from the snapshot: used %v calls (%v), want 6", n.GetUsed()["calls"], err)
	}
}
