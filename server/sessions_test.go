package server

import (
	"context"
	"database/sql"
	"errors"
	"maps"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor/engine"
)

// Session token hashes live in the store's sessions table while their
// session does, and never in the event log; a restart takes them from
// there, and refuses a table that disagrees with the log.
func TestSessionTokensLiveInTheSessionsTable(t *testing.T) {
	cfg := testConfig()
	dbPath := filepath.Join(t.TempDir(), "governor.db")
	cfg.Store = StoreConfig{Driver: "sqlite", DSN: dbPath}
	srv, err := Start(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
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
		ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+c.token)
		gov, _ := dial(t, srv.Addr())
		_, err := gov.Heartbeat(ctx, &governorpb.HeartbeatRequest{})
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
			[]any{lateID, hashToken(late.token)}, "no row with its token hash"},
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
