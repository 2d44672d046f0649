package proxy

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/governor-project/governor/internal/pgtest"
)

// ledgerRule charges one db_writes for each write to a table named ledger*.
const ledgerRule = `
rules:
  - {name: ledger, match: {sql: [insert, merge, copy], tables: ["ledger*"]}, class: db, charge: {db_writes: 1}}
`

// A write to ledger is charged however the text spells it, as the server
// reads it (issue 25, point 1). With a quota of 3 spent, each spelling
// below is refused with 53400 and writes nothing: a Unicode-escaped name,
// with and without UESCAPE, in the extended and the simple protocol; an
// INSERT after a -- comment that a carriage return ends; an INSERT after an
// E'...' string continued on the next line, whose continuation reads
// backslashes as the E'...' does; and, in Shift JIS, an INSERT after a
// string or dollar quote holding a character whose second byte is a
// backslash.
func TestPGWireChargesEverySpellingOfATable(t *testing.T) {
	pgUpstream(t)
	dsn := pgtest.Schema(t, "spelling")
	u, err := url.Parse(dsn)
	must(t, err)
	schema := u.Query().Get("search_path")
	pgtest.Exec(t, dsn, "CREATE TABLE ledger (id int)")
	rows := func() int64 { return pgtest.Exec(t, dsn, "SELECT * FROM ledger") }

	g := startGovernord(t, nil)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(),
		yaml: "task: {name: pod-spelling, quotas: {db_writes: 3}}\n" + pgListenerYAML(t, "") + ledgerRule})
	cfg, err := pgx.ParseConfig(pgDSN(p.PGWireAddrs()[0], ""))
	must(t, err)
	cfg.RuntimeParams["search_path"] = schema
	c, err := pgx.ConnectConfig(context.Background(), cfg)
	must(t, err)
	t.Cleanup(func() { c.Close(context.Background()) })

	for i := range 3 {
		pgExec(t, c, "INSERT INTO ledger VALUES ($1)", i)
	}
	wantPGError(t, c, "53400", "db_writes", "INSERT INTO ledger VALUES ($1)", 3)

	// In the extended protocol (pgx with an argument).
	wantQuotaError(t, c, `INSERT INTO U&"l\0065dger" VALUES ($1)`, 4)
	wantQuotaError(t, c, `INSERT INTO U&"l!0065dger" UESCAPE '!' VALUES ($1)`, 4)

	// In the simple protocol, as the text is written.
	for _, sql := range []string{
		`INSERT INTO U&"l\0065dger" VALUES (4)`,
		`INSERT INTO U&"l!0065dger" UESCAPE '!' VALUES (4)`,
		`INSERT INTO U&"\006C\0065\0064\0067\0065\0072" VALUES (4)`,
		"SELECT 1; --\rINSERT INTO ledger VALUES (4)",
		"SELECT E'a'\n'\\''; INSERT INTO ledger VALUES (4); --'",
	} {
		wantQuotaError(t, c, sql)
	}
	// Shift JIS: 0x95 0x5c is one character (U+8868), not a backslash.
	wantSimpleOK(t, c, "SET client_encoding = 'SJIS'")
	for _, sql := range []string{
		"SELECT E'\\\x95\x5c'; INSERT INTO ledger VALUES (4); --'",
		"SELECT $\x95\x5c$ ' $\x95\x5c$; INSERT INTO ledger VALUES (4); --'",
	} {
		wantQuotaError(t, c, sql)
	}
	wantSimpleOK(t, c, "SET client_encoding = 'UTF8'")
	pgAlive(t, c)

	if n := rows(); n != 3 {
		t.Errorf("rows in ledger: %d, want 3", n)
	}
}

// wantQuotaError runs sql and wants the db_writes quota's refusal, 53400.
// Without args, sql goes as one Query message, as written (the simple
// protocol); with args, pgx prepares it (the extended protocol).
func wantQuotaError(t testing.TB, c *pgx.Conn, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	var err error
	if len(args) == 0 {
		_, err = c.PgConn().Exec(ctx, sql).ReadAll()
	} else {
		_, err = c.Exec(ctx, sql, args...)
	}
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "53400" || !strings.Contains(pe.Message, "db_writes") {
		t.Errorf("%q: %v; want an ERROR 53400 naming db_writes", sql, err)
	}
}

// wantSimpleOK sends sql as one Query message and wants no error.
func wantSimpleOK(t testing.TB, c *pgx.Conn, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	if _, err := c.PgConn().Exec(ctx, sql).ReadAll(); err != nil {
		t.Fatalf("%q: %v", sql, err)
	}
}
