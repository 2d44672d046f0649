package pgwire_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/pgwire"
	"github.com/governor-project/governor/server"
	"github.com/governor-project/governor/server/serverconfig"
)

// Statement governance end to end: a real PostgreSQL, a real governord, and
// pgx, psql and a bare frontend as clients.

const ledgerRules = `
rules:
  - name: ledger-writes
    match: {sql: [insert, update, delete, merge, copy], tables: ["ledger*"]}
    class: db
    charge: {db_writes: 1}
  - name: unseen
    match: {sql: [unknown]}
    class: db
    charge: {db_writes: 1}
  - name: any-sql
    match: {sql: any}
    class: db
`

// publicTable is freshTable, open to every role (the bare frontend logs in
// as gov_trust).
func publicTable(t testing.TB, name string) {
	t.Helper()
	freshTable(t, name)
	direct := connect(t, superDSN("127.0.0.1:"+pgPort(t)))
	exec1(t, direct, "GRANT ALL ON "+name+" TO PUBLIC")
}

func wantCode(t *testing.T, what string, err error, code string) {
	t.Helper()
	if got := sqlState(err); got != code {
		t.Errorf("%s: %v, want SQLSTATE %s", what, err, code)
	}
}

// execAll runs sql in one Query and returns the first error.
func execAll(ctx context.Context, c *pgx.Conn, sql string) error {
	_, err := c.PgConn().Exec(ctx, sql).ReadAll()
	return err
}

// bareLogin logs in as gov_trust (trust: no password exchange) with a bare
// frontend, for messages pgx does not send as a test needs them.
func bareLogin(t *testing.T, addr string) (net.Conn, *pgproto3.Frontend) {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	fe := pgproto3.NewFrontend(nc, nc)
	fe.Send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion30,
		Parameters: map[string]string{"user": "gov_trust", "database": "governor"}})
	raw(t, nc, fe, 1)
	return nc, fe
}

// raw sends msgs in one write and reads the answers up to the syncs-th
// ReadyForQuery, returning the SQLSTATE of each ErrorResponse.
func raw(t *testing.T, nc net.Conn, fe *pgproto3.Frontend, syncs int, msgs ...pgproto3.FrontendMessage) []string {
	t.Helper()
	nc.SetDeadline(time.Now().Add(20 * time.Second))
	defer nc.SetDeadline(time.Time{})
	for _, m := range msgs {
		fe.Send(m)
	}
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	var codes []string
	for syncs > 0 {
		m, err := fe.Receive()
		if err != nil {
			t.Fatalf("receive: %v", err)
		}
		switch m := m.(type) {
		case *pgproto3.ErrorResponse:
			codes = append(codes, m.Code)
		case *pgproto3.ReadyForQuery:
			syncs--
		}
	}
	return codes
}

// The probe of issue 10: a quota of 3 db_writes, spent by three plain
// inserts, and then every route that used to reach the table uncharged. Not
// one more row may arrive.
func TestNoRouteEscapesTheCharge(t *testing.T) {
	pgPort(t)
	srv := governord(t, 10)
	publicTable(t, "ledger_probe")
	addr := ruledProxy(t, srv, governor.Spec{Name: "probe", Quotas: map[string]int64{"db_writes": 3}}, ledgerRules, nil)
	ctx := context.Background()
	const ins = "INSERT INTO ledger_probe VALUES (1)"
	c := connect(t, superDSN(addr))
	for range 3 {
		exec1(t, c, ins)
	}
	wantCode(t, "a fourth plain insert", execAll(ctx, c, ins), "53400")

	t.Run("SQL PREPARE, protocol Bind/Execute", func(t *testing.T) {
		c := connect(t, superDSN(addr))
		exec1(t, c, "PREPARE ins1 AS "+ins)
		_, err := c.PgConn().ExecPrepared(ctx, "ins1", nil, nil, nil).Close()
		wantCode(t, "Execute of ins1", err, "53400")
		wantCode(t, "EXPLAIN ANALYZE EXECUTE ins1", execAll(ctx, c, "EXPLAIN ANALYZE EXECUTE ins1"), "53400")
	})
	t.Run("protocol Parse, SQL EXECUTE", func(t *testing.T) {
		c := connect(t, superDSN(addr))
		if _, err := c.PgConn().Prepare(ctx, "ins2", ins, nil); err != nil {
			t.Fatal(err)
		}
		wantCode(t, "EXECUTE ins2", execAll(ctx, c, "EXECUTE ins2"), "53400")
	})
	t.Run("standard_conforming_strings off", func(t *testing.T) {
		c := connect(t, superDSN(addr))
		exec1(t, c, "SET standard_conforming_strings = off")
		wantCode(t, "a hidden insert", execAll(ctx, c, `SELECT 'a\''; `+ins+`; --'`), "53400")
	})
	t.Run("standard_conforming_strings off, pipelined", func(t *testing.T) {
		nc, fe := bareLogin(t, addr)
		codes := raw(t, nc, fe, 2, &pgproto3.Query{String: "SET standard_conforming_strings = off"},
			&pgproto3.Query{String: `SELECT 'a\''; ` + ins + `; --'`})
		if len(codes) != 1 || codes[0] != "53400" {
			t.Errorf("SET pipelined with a hidden insert: errors %v, want [53400]", codes)
		}
	})
	t.Run("client_encoding SJIS", func(t *testing.T) {
		c := connect(t, superDSN(addr))
		exec1(t, c, "SET client_encoding = 'SJIS'")
		// 0x95 0x5c is one character in Shift JIS; its second byte is a
		// backslash.
		wantCode(t, "a hidden insert", execAll(ctx, c, "SELECT E'\x95\x5c'; "+ins+"; --'"), "53400")
	})
	t.Run("Parse over a name in use", func(t *testing.T) {
		c := connect(t, superDSN(addr))
		if _, err := c.PgConn().Prepare(ctx, "dup", ins, nil); err != nil {
			t.Fatal(err)
		}
		_, err := c.PgConn().Prepare(ctx, "dup", "SELECT 1", nil)
		wantCode(t, "a second Parse of dup", err, "42P05")
		_, err = c.PgConn().ExecPrepared(ctx, "dup", nil, nil, nil).Close()
		wantCode(t, "Execute of dup", err, "53400")
	})
	t.Run("Parse that fails, then the same name", func(t *testing.T) {
		nc, fe := bareLogin(t, addr)
		codes := raw(t, nc, fe, 2,
			&pgproto3.Parse{Name: "p7", Query: "SELECT * FROM no_such_table"}, &pgproto3.Sync{},
			&pgproto3.Parse{Name: "p7", Query: ins}, &pgproto3.Bind{PreparedStatement: "p7"}, &pgproto3.Execute{}, &pgproto3.Sync{})
		if len(codes) != 2 || codes[0] != "42P01" || codes[1] != "53400" {
			t.Errorf("errors %v, want [42P01 53400]", codes)
		}
	})
	t.Run("PREPARE, DEALLOCATE, Parse, EXECUTE", func(t *testing.T) {
		c := connect(t, superDSN(addr))
		exec1(t, c, "PREPARE p8 AS SELECT 1")
		exec1(t, c, "DEALLOCATE p8")
		if _, err := c.PgConn().Prepare(ctx, "p8", ins, nil); err != nil {
			t.Fatal(err)
		}
		wantCode(t, "EXECUTE p8", execAll(ctx, c, "EXECUTE p8"), "53400")
	})
	t.Run("PREPARE, DISCARD ALL, Parse, EXECUTE", func(t *testing.T) {
		c := connect(t, superDSN(addr))
		exec1(t, c, "PREPARE p9 AS SELECT 1")
		exec1(t, c, "DISCARD ALL")
		if _, err := c.PgConn().Prepare(ctx, "p9", ins, nil); err != nil {
			t.Fatal(err)
		}
		wantCode(t, "EXECUTE p9", execAll(ctx, c, "EXECUTE p9"), "53400")
	})
	t.Run("a read before it in one Query", func(t *testing.T) {
		c := connect(t, superDSN(addr))
		wantCode(t, "SELECT; INSERT", execAll(ctx, c, "SELECT 1 FROM ledger_probe; "+ins), "53400")
	})
	t.Run("a CTE named like the table", func(t *testing.T) {
		c := connect(t, superDSN(addr))
		wantCode(t, "WITH ledger_probe AS ...", execAll(ctx, c, "WITH ledger_probe AS (SELECT 1) "+ins), "53400")
	})
	t.Run("nested past the depth limit", func(t *testing.T) {
		c := connect(t, superDSN(addr))
		deep := "INSERT INTO ledger_probe SELECT " + strings.Repeat("(", 300) + "1" + strings.Repeat(")", 300)
		wantCode(t, "a deep insert", execAll(ctx, c, deep), "53400")
	})
	if n := countRows(t, "ledger_probe"); n != 3 {
		t.Fatalf("%d rows reached the table; the quota is 3", n)
	}
}

// Each execution of a prepared statement is charged, however it was
// prepared and however it is run.
func TestEachExecutionCharges(t *testing.T) {
	pgPort(t)
	srv := governord(t, 10)
	freshTable(t, "ledger_exec")
	addr := ruledProxy(t, srv, governor.Spec{Name: "exec", Quotas: map[string]int64{"db_writes": 4}}, ledgerRules, nil)
	ctx := context.Background()
	c := connect(t, superDSN(addr))
	exec1(t, c, "PREPARE a AS INSERT INTO ledger_exec VALUES (1)")
	if _, err := c.PgConn().Prepare(ctx, "b", "INSERT INTO ledger_exec VALUES (2)", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PgConn().ExecPrepared(ctx, "a", nil, nil, nil).Close(); err != nil {
		t.Fatal(err)
	}
	exec1(t, c, "EXECUTE a")
	exec1(t, c, "EXECUTE b")
	if _, err := c.PgConn().ExecPrepared(ctx, "b", nil, nil, nil).Close(); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "a fifth execution", execAll(ctx, c, "EXECUTE a"), "53400")
	// PREPARE itself runs nothing and is not charged.
	exec1(t, c, "PREPARE c AS INSERT INTO ledger_exec VALUES (3)")
	if n := countRows(t, "ledger_exec"); n != 4 {
		t.Fatalf("%d rows, want 4", n)
	}
}

// A multi-statement Query is matched and charged statement by statement:
// a read first does not make the whole a read, and three inserts cost
// three.
func TestEachStatementMatchedOnItsOwn(t *testing.T) {
	pgPort(t)
	srv := governord(t, 10)
	freshTable(t, "payments_each")
	const rules = `
rules:
  - {name: reads, match: {sql: [select]}}
  - {name: writes, match: {sql: [insert, delete], tables: ["payments*"]}, class: db, charge: {db_writes: 1}}
`
	addr := ruledProxy(t, srv, governor.Spec{Name: "each", Quotas: map[string]int64{"db_writes": 3}}, rules, nil)
	ctx := context.Background()
	c := connect(t, superDSN(addr))
	exec1(t, c, "SELECT 1 FROM payments_each; INSERT INTO payments_each VALUES (1)")
	wantCode(t, "three inserts with two units left", execAll(ctx, c,
		"INSERT INTO payments_each VALUES (2); INSERT INTO payments_each VALUES (3); INSERT INTO payments_each VALUES (4)"), "53400")
	exec1(t, c, "INSERT INTO payments_each VALUES (2); INSERT INTO payments_each VALUES (3)")
	wantCode(t, "a read, then a delete", execAll(ctx, c, "SELECT 1 FROM payments_each; DELETE FROM payments_each"), "53400")
	if n := countRows(t, "payments_each"); n != 3 {
		t.Fatalf("%d rows, want 3", n)
	}
}

// classes starts a governord whose tenant has these limits.
func classes(t testing.TB, limits map[string]int64) *server.Server {
	return govtest.Start(t, func(c *serverconfig.Config) { c.Tenants[0].Limits = limits })
}

// A transaction that touches two classes holds a lease of each: a second
// transaction that needs the ledger class waits for it, at most
// wait_timeout, even though it holds its db lease already.
func TestTransactionHoldsEachClass(t *testing.T) {
	pgPort(t)
	srv := classes(t, map[string]int64{"db": 10, "ledger": 1})
	freshTable(t, "ledger_mc")
	const rules = `
rules:
  - {name: ledger, match: {sql: [insert], tables: ["ledger*"]}, class: ledger}
  - {name: any-sql, match: {sql: any}, class: db}
`
	addr := ruledProxy(t, srv, governor.Spec{Name: "classes"}, rules, func(p *pgwire.Proxy) { p.WaitTimeout = time.Second })
	ctx := context.Background()
	a, b := connect(t, superDSN(addr)), connect(t, superDSN(addr))
	ta, err := a.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ta.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	if _, err := ta.Exec(ctx, "INSERT INTO ledger_mc VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	tb, err := b.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tb.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = tb.Exec(ctx, "INSERT INTO ledger_mc VALUES (2)")
	wantCode(t, "a second ledger writer", err, "55P03")
	if waited := time.Since(start); waited < 900*time.Millisecond || waited > 5*time.Second {
		t.Errorf("waited %v for the ledger lease; wait_timeout is 1s", waited)
	}
	if err := tb.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ta.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// Both leases went back with the transaction.
	tb, err = b.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tb.Exec(ctx, "INSERT INTO ledger_mc VALUES (3)"); err != nil {
		t.Fatalf("after the first transaction ended: %v", err)
	}
	if err := tb.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := countRows(t, "ledger_mc"); n != 2 {
		t.Fatalf("%d rows, want 2", n)
	}
}

// Two transactions that take two classes in opposite orders wait for each
// other; wait_timeout ends the wait, each gets 55P03, and after their
// rollbacks the classes are free.
func TestCrossedClassesEndAtWaitTimeout(t *testing.T) {
	pgPort(t)
	srv := classes(t, map[string]int64{"x": 1, "y": 1})
	freshTable(t, "tx_a")
	freshTable(t, "ty_b")
	const rules = `
rules:
  - {name: x, match: {tables: ["tx_*"]}, class: x}
  - {name: y, match: {tables: ["ty_*"]}, class: y}
`
	addr := ruledProxy(t, srv, governor.Spec{Name: "crossed"}, rules, func(p *pgwire.Proxy) { p.WaitTimeout = time.Second })
	ctx := context.Background()
	a, b := connect(t, superDSN(addr)), connect(t, superDSN(addr))
	ta, _ := a.Begin(ctx)
	tb, _ := b.Begin(ctx)
	if _, err := ta.Exec(ctx, "INSERT INTO tx_a VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	if _, err := tb.Exec(ctx, "INSERT INTO ty_b VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	wg.Add(2)
	go func() { defer wg.Done(); _, errs[0] = ta.Exec(ctx, "INSERT INTO ty_b VALUES (2)") }()
	go func() { defer wg.Done(); _, errs[1] = tb.Exec(ctx, "INSERT INTO tx_a VALUES (2)") }()
	wg.Wait()
	for i, err := range errs {
		wantCode(t, fmt.Sprintf("transaction %d's second class", i), err, "55P03")
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the crossed wait lasted %v; wait_timeout is 1s", took)
	}
	ta.Rollback(ctx)
	tb.Rollback(ctx)
	exec1(t, a, "INSERT INTO tx_a VALUES (3); INSERT INTO ty_b VALUES (3)")
}

// DO, CALL and function calls are kinds a rule can name.
func TestDoCallAndFunctionKinds(t *testing.T) {
	pgPort(t)
	srv := governord(t, 10)
	freshTable(t, "fn_target")
	direct := connect(t, superDSN("127.0.0.1:"+pgPort(t)))
	exec1(t, direct, "CREATE OR REPLACE PROCEDURE fn_proc() LANGUAGE sql AS $$ INSERT INTO fn_target VALUES (1) $$")
	exec1(t, direct, "CREATE OR REPLACE FUNCTION fn_write() RETURNS int LANGUAGE sql AS $$ INSERT INTO fn_target VALUES (2) RETURNING 1 $$")
	const rules = `
rules:
  - {name: unseen, match: {sql: [do, call, function]}, class: db, charge: {opaque: 1}}
  - {name: any-sql, match: {sql: any}, class: db}
`
	addr := ruledProxy(t, srv, governor.Spec{Name: "kinds", Quotas: map[string]int64{"opaque": 3}}, rules, nil)
	ctx := context.Background()
	c := connect(t, superDSN(addr))
	exec1(t, c, "DO $$BEGIN INSERT INTO fn_target VALUES (3); END$$")
	exec1(t, c, "CALL fn_proc()")
	exec1(t, c, "SELECT fn_write()")
	exec1(t, c, "SELECT count(*), now() FROM fn_target") // built-ins that only read are not function calls
	wantCode(t, "a fourth opaque statement", execAll(ctx, c, "SELECT fn_write()"), "53400")
	wantCode(t, "a function in FROM", execAll(ctx, c, "SELECT * FROM fn_write()"), "53400")
	if n := countRows(t, "fn_target"); n != 3 {
		t.Fatalf("%d rows, want 3", n)
	}
}

// What the classifier cannot see into is governed as unknown: a statement
// nested past the depth limit, and an EXECUTE of a name the proxy never saw
// prepared (here, one a DO block prepared with dynamic SQL).
func TestUnknownIsGoverned(t *testing.T) {
	pgPort(t)
	srv := governord(t, 10)
	const rules = `
rules:
  - {name: do, match: {sql: [do]}, class: db}
  - {name: unseen, match: {sql: [unknown]}, class: db, charge: {unseen: 1}}
  - {name: any-sql, match: {sql: any}, class: db}
`
	addr := ruledProxy(t, srv, governor.Spec{Name: "unknown", Quotas: map[string]int64{"unseen": 2}}, rules, nil)
	ctx := context.Background()
	c := connect(t, superDSN(addr))
	exec1(t, c, "SELECT "+strings.Repeat("(", 300)+"1"+strings.Repeat(")", 300))
	exec1(t, c, "DO $$BEGIN EXECUTE 'PREPARE hidden AS SELECT 1'; END$$")
	exec1(t, c, "EXECUTE hidden")
	wantCode(t, "a third unknown statement", execAll(ctx, c, "EXECUTE hidden"), "53400")
	// DEALLOCATE forgets: the name is unknown again.
	exec1(t, c, "PREPARE seen AS SELECT 1")
	exec1(t, c, "EXECUTE seen")
	exec1(t, c, "DEALLOCATE seen")
	wantCode(t, "EXECUTE after DEALLOCATE", execAll(ctx, c, "EXECUTE seen"), "53400")
}

// Pathological SQL through the proxy: 1 MiB of nested COPY( and long
// EXPLAIN and DECLARE chains are governed as unknown and answered at once
// (by the server's own error), and the proxy lives on; a 10 MiB multi-row
// INSERT is an ordinary insert, charged once.
func TestPathologicalSQL(t *testing.T) {
	pgPort(t)
	srv := governord(t, 10)
	freshTable(t, "ledger_bulk")
	const rules = `
rules:
  - {name: ledger-writes, match: {sql: [insert], tables: ["ledger*"]}, class: db, charge: {db_writes: 1}}
  - {name: unseen, match: {sql: [unknown]}, class: db, charge: {unseen: 1}}
`
	addr := ruledProxy(t, srv, governor.Spec{Name: "pathological", Quotas: map[string]int64{"db_writes": 2, "unseen": 3}}, rules, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := connect(t, superDSN(addr))
	for _, tc := range []struct{ name, sql string }{
		{"nested COPY(", strings.Repeat("COPY(", 1<<20/5)},
		{"EXPLAIN chain", strings.Repeat("EXPLAIN ANALYZE ", 100_000) + "SELECT 1"},
		{"DECLARE chain", strings.Repeat("DECLARE c CURSOR FOR ", 50_000) + "SELECT 1"},
	} {
		start := time.Now()
		err := execAll(ctx, c, tc.sql)
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "42601" {
			t.Errorf("%s: %v, want the server's syntax error", tc.name, err)
		}
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("%s: answered after %v", tc.name, took)
		}
	}
	wantCode(t, "a fourth unknown statement", execAll(ctx, c, strings.Repeat("(", 1000)), "53400")
	var rows strings.Builder
	rows.WriteString("INSERT INTO ledger_bulk VALUES ")
	n := 0
	for ; rows.Len() < 10<<20; n++ {
		if n > 0 {
			rows.WriteString(", ")
		}
		fmt.Fprintf(&rows, "(%d)", n)
	}
	exec1(t, c, rows.String())
	exec1(t, c, "INSERT INTO ledger_bulk VALUES (-1)")
	wantCode(t, "a third insert", execAll(ctx, c, "INSERT INTO ledger_bulk VALUES (-2)"), "53400")
	if got := countRows(t, "ledger_bulk"); got != n+1 {
		t.Fatalf("%d rows, want %d", got, n+1)
	}
}

// psql, each -c sent as one Query: the hidden routes are denied.
func TestPsqlRoutes(t *testing.T) {
	pgPort(t)
	srv := governord(t, 10)
	freshTable(t, "ledger_psql")
	addr := ruledProxy(t, srv, governor.Spec{Name: "psql", Quotas: map[string]int64{"db_writes": 1}}, ledgerRules, nil)
	host, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command("psql", "-X", "-At", "-h", host, "-p", port, "-U", "governor", "-d", "governor",
		"-c", "INSERT INTO ledger_psql VALUES (1)",
		"-c", "SET standard_conforming_strings = off",
		"-c", `SELECT 'a\''; INSERT INTO ledger_psql VALUES (2); --'`,
		"-c", "SET standard_conforming_strings = on",
		"-c", "WITH ledger_psql AS (SELECT 1) INSERT INTO ledger_psql VALUES (3)",
		"-c", "PREPARE ins AS INSERT INTO ledger_psql VALUES (4)",
		"-c", "EXECUTE ins")
	cmd.Env = append(os.Environ(), "PGPASSWORD=governor")
	out, _ := cmd.CombinedOutput()
	if got := strings.Count(string(out), "quota spent"); got != 3 {
		t.Errorf("%d denials, want 3:\n%s", got, out)
	}
	if n := countRows(t, "ledger_psql"); n != 1 {
		t.Fatalf("%d rows, want 1:\n%s", n, out)
	}
}

// What waits for the server's answers is read as the server will run it
// once they are in. With the quota spent, a statement that only reads,
// pipelined behind a SET that changes how its text lexes or behind a
// Parse the server refuses, is let through: read before the answers (or
// given up as unknown) it would be charged, and refused. The wait ends
// when the answers are in, not at the wait timeout (a minute here, past
// raw's deadline).
func TestWaitsForTheServer(t *testing.T) {
	pgPort(t)
	srv := governord(t, 10)
	publicTable(t, "ledger_wait")
	addr := ruledProxy(t, srv, governor.Spec{Name: "waits", Quotas: map[string]int64{"db_writes": 1}}, ledgerRules,
		func(p *pgwire.Proxy) { p.WaitTimeout = time.Minute })
	ctx := context.Background()
	const ins = "INSERT INTO ledger_wait VALUES (1)"
	c := connect(t, superDSN(addr))
	exec1(t, c, ins)
	wantCode(t, "a second insert", execAll(ctx, c, ins), "53400")

	t.Run("a setting changed just before", func(t *testing.T) {
		nc, fe := bareLogin(t, addr)
		// With standard_conforming_strings off, the quote holds the rest
		// of the text: one SELECT of a string, no INSERT.
		codes := raw(t, nc, fe, 2, &pgproto3.Query{String: "SET standard_conforming_strings = off"},
			&pgproto3.Query{String: `SELECT 'x\' FROM ledger_wait; ` + ins + ` --'`})
		if len(codes) != 0 {
			t.Errorf("a SELECT pipelined behind the SET: errors %v, want none", codes)
		}
	})
	t.Run("a Parse refused just before", func(t *testing.T) {
		nc, fe := bareLogin(t, addr)
		raw(t, nc, fe, 1, &pgproto3.Parse{Name: "w1", Query: "SELECT 1"}, &pgproto3.Sync{})
		codes := raw(t, nc, fe, 2,
			&pgproto3.Parse{Name: "w1", Query: ins}, &pgproto3.Sync{},
			&pgproto3.Bind{PreparedStatement: "w1"}, &pgproto3.Execute{}, &pgproto3.Sync{})
		if len(codes) != 1 || codes[0] != "42P05" {
			t.Errorf("w1 run behind its refused Parse: errors %v, want [42P05]", codes)
		}
	})
	if n := countRows(t, "ledger_wait"); n != 1 {
		t.Fatalf("%d rows reached the table; the quota is 1", n)
	}
}
