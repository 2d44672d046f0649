package store_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/governor-project/governor/store"
)

// pgDSNEnv names the PostgreSQL the tests use; scripts/testpg.sh starts a
// throwaway server and sets it, and ./test.sh sources that script.
const pgDSNEnv = "GOVERNOR_TEST_PG_DSN"

// backend is one Store implementation under test.
type backend struct {
	name string
	// fresh makes a new, empty log and returns open, which returns a new
	// handle on that same log each time it is called, as a restarted process
	// would find it. The test closes each handle it opens.
	fresh func(t testing.TB) (open func() store.Store)
}

func backends() []backend {
	return []backend{
		{name: "memory", fresh: freshMemory},
		{name: "sqlite", fresh: freshSQLite},
		{name: "postgres", fresh: freshPostgres},
	}
}

func freshMemory(t testing.TB) func() store.Store {
	var last *store.Memory
	return func() store.Store {
		if last == nil {
			last = store.NewMemory()
		} else {
			last = last.Reopen()
		}
		return last
	}
}

func freshSQLite(t testing.TB) func() store.Store {
	path := filepath.Join(t.TempDir(), "governor.db")
	return func() store.Store {
		st, err := store.OpenSQLite(path)
		if err != nil {
			t.Fatalf("OpenSQLite: %v", err)
		}
		return st
	}
}

func freshPostgres(t testing.TB) func() store.Store {
	dsn := pgSchemaDSN(t)
	return func() store.Store {
		st, err := store.OpenPostgres(context.Background(), dsn)
		if err != nil {
			t.Fatalf("OpenPostgres: %v", err)
		}
		return st
	}
}

// pgSchemaDSN returns a DSN for the test PostgreSQL whose search_path is a
// new schema of its own, dropped when t ends, so tests never see each
// other's tables. It skips t when no server is configured.
func pgSchemaDSN(t testing.TB) string {
	t.Helper()
	base := os.Getenv(pgDSNEnv)
	if base == "" {
		t.Skipf("%s is not set: run ./test.sh, or `source scripts/testpg.sh` first, to test against a throwaway PostgreSQL", pgDSNEnv)
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		t.Fatalf("%s must be a postgres:// URL", pgDSNEnv)
	}
	var b [8]byte
	rand.Read(b[:])
	schema := "governor_test_" + hex.EncodeToString(b[:])

	ctx := context.Background()
	admin := func(sql string) {
		t.Helper()
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Fatalf("connect to %s: %v", pgDSNEnv, err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	admin("CREATE SCHEMA " + schema)
	t.Cleanup(func() { admin("DROP SCHEMA " + schema + " CASCADE") })

	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}
