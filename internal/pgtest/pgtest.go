// Package pgtest gives a test a PostgreSQL database or schema of its own,
// inside the server that scripts/testpg.sh starts and names in
// GOVERNOR_TEST_PG_DSN, and drops it when the test ends, so that tests never
// see each other's tables. Only tests import it.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// DSNEnv names the test PostgreSQL.
const DSNEnv = "GOVERNOR_TEST_PG_DSN"

// Base returns the test PostgreSQL's DSN. It skips t when none is
// configured.
func Base(t testing.TB) *url.URL {
	t.Helper()
	base := os.Getenv(DSNEnv)
	if base == "" {
		t.Skipf("%s is not set: run ./test.sh, or `source scripts/testpg.sh` first, to test against a throwaway PostgreSQL", DSNEnv)
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		t.Fatalf("%s must be a postgres:// URL", DSNEnv)
	}
	return u
}

// Database creates a database named prefix and a random suffix, dropped
// (with its connections) when t ends. It returns a DSN for it and its name.
func Database(t testing.TB, prefix string) (*url.URL, string) {
	t.Helper()
	base := Base(t)
	name := prefix + suffix()
	Exec(t, base.String(), "CREATE DATABASE "+name)
	t.Cleanup(func() { Exec(t, base.String(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)") })
	u := *base
	u.Path = "/" + name
	return &u, name
}

// Schema creates a schema named prefix and a random suffix in the test
// database, dropped when t ends. It returns a DSN whose search_path is that
// schema.
func Schema(t testing.TB, prefix string) string {
	t.Helper()
	u := Base(t)
	schema := prefix + suffix()
	Exec(t, u.String(), "CREATE SCHEMA "+schema)
	t.Cleanup(func() { Exec(t, u.String(), "DROP SCHEMA "+schema+" CASCADE") })
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// Exec runs sql on dsn and returns the number of rows it affected. A
// failure fails t.
func Exec(t testing.TB, dsn, sql string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect to %s: %v", DSNEnv, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	tag, err := conn.Exec(ctx, sql)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return tag.RowsAffected()
}

func suffix() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
