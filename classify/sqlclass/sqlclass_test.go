package sqlclass

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// render writes a Class as the tests spell it: statements separated by
// "; ", each its kinds joined by "+" ("-" for none), [tables], what it
// executes or does to prepared statements, and xN for N in a row.
func render(c *Class) string {
	parts := make([]string, len(c.Statements))
	for i, s := range c.Statements {
		parts[i] = renderStatement(&s)
	}
	return strings.Join(parts, "; ")
}

func renderStatement(s *Statement) string {
	r := strings.Join(s.Kinds, "+")
	if r == "" {
		r = "-"
	}
	if len(s.Tables) > 0 {
		r += "[" + strings.Join(s.Tables, ",") + "]"
	}
	if s.Execute != "" {
		r += " execute " + s.Execute
	}
	switch s.Op {
	case OpPrepare:
		r += " prepare " + s.Name + "=" + renderStatement(s.Prepared)
	case OpDeallocate:
		r += " deallocate " + s.Name
	case OpDeallocateAll:
		r += " deallocate all"
	case OpDiscardAll:
		r += " discard all"
	}
	if s.Count != 1 {
		r += fmt.Sprintf(" x%d", s.Count)
	}
	return r
}

func TestClassify(t *testing.T) {
	for _, tc := range []struct{ sql, want string }{
		{"SELECT 1", "select"},
		{"select * from payments p join ledger l on p.id = l.id", "select[payments,ledger]"},
		{`SELECT a FROM public.payments, "Mixed"."Case" x, other`, "select[public.payments,Mixed.Case,other]"},
		{"SELECT * FROM t FOR UPDATE", "select+lock[t]"},
		{"select * from t for no key update of t skip locked", "select+lock[t]"},
		{"SELECT * FROM t FOR KEY SHARE", "select+lock[t]"},
		{"SELECT extract(year from ts), substring(s from 2 for 3) FROM events", "select[events]"},
		{"SELECT a IS DISTINCT FROM b FROM x", "select[x]"},
		{"SELECT * FROM generate_series(1,10) g, LATERAL (SELECT * FROM inner_t) s", "select[inner_t]"},
		{"SELECT * FROM (a JOIN b ON a.id = b.id) JOIN c USING (id)", "select[a,b,c]"},
		{"SELECT * INTO newt FROM t", "select+ddl[newt,t]"},
		{"INSERT INTO payments (a, b) VALUES (1, 'x;y')", "insert[payments]"},
		{"INSERT INTO audit SELECT * FROM payments", "insert[audit,payments]"},
		{"insert into t values (1) on conflict (id) do update set v = excluded.v", "insert+update[t]"},
		{"insert into t values (1) on conflict do nothing", "insert[t]"},
		{"UPDATE ONLY accounts a SET x = 1 FROM branches b WHERE a.b = b.id", "update[accounts,branches]"},
		// A qualified name cut off by a token no name takes, which the
		// server refuses: INTO records what it read, UPDATE nothing.
		{"INSERT INTO s.* VALUES (1)", "insert[s]"},
		{"UPDATE s.* SET x = 1", "update"},
		{"DELETE FROM t USING u WHERE t.id = u.id", "delete[t,u]"},
		{"MERGE INTO target t USING source s ON t.id = s.id WHEN MATCHED THEN UPDATE SET v = s.v", "merge[target,source]"},
		{"WITH moved AS (DELETE FROM a RETURNING *) INSERT INTO b SELECT * FROM moved", "insert+delete[a,b]"},
		{"WITH x AS (SELECT * FROM a) SELECT * FROM x", "select[a]"},
		{"WITH x AS MATERIALIZED (UPDATE a SET v = 1 RETURNING *) SELECT * FROM x", "update[a]"},
		{"WITH x AS (SELECT * FROM a FOR UPDATE) SELECT * FROM x", "select+lock[a]"},
		{"WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n+1 FROM r) SELECT * FROM r", "select"},
		{"WITH a AS (SELECT 1) (SELECT * FROM a UNION SELECT * FROM b)", "select[b]"},
		{"EXPLAIN SELECT * FROM t", "utility[t]"},
		{"EXPLAIN ANALYZE DELETE FROM t", "delete[t]"},
		{"EXPLAIN (ANALYZE, BUFFERS) UPDATE t SET a = 1", "update[t]"},
		{"EXPLAIN (ANALYZE false) UPDATE t SET a = 1", "utility[t]"},
		{"EXPLAIN (ANALYZE 0, VERBOSE) DELETE FROM t", "utility[t]"},
		{"DO $$BEGIN DELETE FROM t; END$$", "do"},
		{"DO $body$ select 'a;b' $body$ LANGUAGE plpgsql", "do"},
		{"CALL proc(1)", "call"},
		{"CALL s.proc(nextval('q'))", "call+function"},
		{"COPY pgbench_accounts FROM STDIN", "copy[pgbench_accounts]"},
		{"COPY (SELECT * FROM t) TO STDOUT", "copy[t]"},
		{"COPY (DELETE FROM t RETURNING *) TO STDOUT", "delete+copy[t]"},
		{"COPY public.t (a, b) TO STDOUT WITH (FORMAT csv)", "copy[public.t]"},
		{"TRUNCATE TABLE a, b", "truncate[a,b]"},
		{"truncate a", "truncate[a]"},
		{"LOCK TABLE t IN EXCLUSIVE MODE", "lock[t]"},
		{"CREATE TABLE IF NOT EXISTS t (id int, ts timestamptz default now())", "ddl[t]"},
		{"CREATE TABLE t2 AS SELECT * FROM t1", "ddl[t2,t1]"},
		{"CREATE INDEX i ON t USING btree (a)", "ddl[t]"},
		{"DROP TABLE IF EXISTS a, b CASCADE", "ddl[a,b]"},
		{"ALTER TABLE ONLY t ADD COLUMN x int REFERENCES u ON UPDATE CASCADE", "ddl[t]"},
		{"GRANT SELECT ON payments TO bob", "ddl[payments]"},
		{"GRANT USAGE ON SCHEMA s TO bob", "ddl"},
		{"CREATE FUNCTION f() RETURNS TABLE (a int) LANGUAGE sql BEGIN ATOMIC SELECT 1; SELECT 2; END; SELECT 3 FROM z", "ddl; select[z]"},
		{"BEGIN; INSERT INTO t VALUES (1); COMMIT", "transaction; insert[t]; transaction"},
		{"START TRANSACTION ISOLATION LEVEL SERIALIZABLE", "transaction"},
		{"SET TRANSACTION READ ONLY", "transaction"},
		{"SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY", "transaction"},
		{"SET search_path = x", "utility"},
		{"SHOW work_mem; VACUUM t", "utility x2"},
		{"LISTEN chan; NOTIFY chan, 'x'", "utility x2"},
		{"-- comment; DELETE FROM t\nSELECT 1 /* nested /* DELETE FROM u; */ */", "select"},
		{`SELECT E'it\'s; DELETE FROM t' FROM a`, "select[a]"},
		{"SELECT 'it''s; DELETE FROM t' FROM a", "select[a]"},
		{`SELECT U&"d\0061t" FROM "my ""quoted"" table"`, `select[my "quoted" table]`},
		{"SELECT $tag$ ; DELETE FROM t $tag$, $$;$$ FROM a", "select[a]"},
		{"DECLARE c CURSOR FOR SELECT * FROM t FOR UPDATE", "select+lock[t]"},
		{"DECLARE c CURSOR WITH HOLD FOR SELECT nextval('s')", "select+function"},
		{"TABLE foo", "select[foo]"},
		{"VALUES (1), (2)", "select"},
		{"(SELECT 1) UNION (SELECT * FROM t)", "select[t]"},
		{"", ""},
		{";;", ""},
		{"PREPARE TRANSACTION 'x'", "transaction"},
		{"SELECT * FROM Payments", "select[payments]"},
		{"SELECT 1from ledger", "select[ledger]"},

		// Each statement of a text is its own.
		{"SELECT 1 FROM reports; DELETE FROM payments", "select[reports]; delete[payments]"},
		{"INSERT INTO t VALUES (1); INSERT INTO t VALUES (2); insert into T values (3)", "insert[t] x3"},
		{"INSERT INTO t VALUES (1); SELECT 1; INSERT INTO t VALUES (2)", "insert[t]; select; insert[t]"},

		// Function calls.
		{"SELECT nextval('s')", "select+function"},
		{"SELECT my_writer(1) FROM t", "select+function[t]"},
		{"SELECT count(*), pg_catalog.lower(x), now(), COALESCE(a, b) FROM t", "select[t]"},
		{"SELECT public.lower(x)", "select+function"},
		{`SELECT "MyFunc"()`, "select+function"},
		{"SELECT * FROM my_srf(1) f", "select+function"},
		{"SELECT CAST(x AS numeric(10,2)), y::varchar(3), a IN (1, 2), ROW(1, 2), ARRAY(SELECT 1) FROM t", "select[t]"},
		{"SELECT sum(x) OVER (PARTITION BY y), count(*) FILTER (WHERE z) FROM t GROUP BY ROLLUP (a)", "select[t]"},
		{"INSERT INTO t VALUES (nextval('s'))", "insert+function[t]"},
		{"UPDATE t SET (a, b) = (1, 2), c = set_config('x', 'y', false)", "update+function[t]"},
		{"EXPLAIN SELECT f()", "utility"},
		{"EXPLAIN ANALYZE SELECT f()", "select+function"},
		{"CREATE TABLE t (a numeric(10, 2) CHECK (a > 0), b text DEFAULT f())", "ddl[t]"},
		{"WITH x (a, b) AS (SELECT f()) SELECT * FROM x", "select+function"},

		// A CTE's name never hides a table written to.
		{"WITH ledger AS (SELECT 1) INSERT INTO ledger VALUES (1)", "insert[ledger]"},
		{"WITH ledger AS (SELECT 1) DELETE FROM ledger", "delete[ledger]"},
		{"WITH ledger AS (SELECT 1) UPDATE ledger SET a = 1", "update[ledger]"},
		{"WITH ledger AS (SELECT 1) MERGE INTO ledger USING ledger ON true WHEN MATCHED THEN DELETE", "merge[ledger]"},

		// Prepared statements.
		{"PREPARE p (int) AS INSERT INTO t VALUES ($1)", "utility prepare p=insert[t]"},
		{`PREPARE "Q" AS SELECT 1; EXECUTE "Q"`, "utility prepare Q=select; - execute Q"},
		{"EXECUTE Ins(1, 2)", "- execute ins"},
		{"EXECUTE ins(nextval('s'))", "function execute ins"},
		{"EXPLAIN ANALYZE EXECUTE ins", "- execute ins"},
		{"EXPLAIN EXECUTE ins", "utility"},
		{"CREATE TABLE t AS EXECUTE ins", "ddl[t] execute ins"},
		{"DEALLOCATE ins", "utility deallocate ins"},
		{"DEALLOCATE PREPARE ALL", "utility deallocate all"},
		{"DISCARD ALL", "utility discard all"},
		{"DISCARD PLANS", "utility"},
	} {
		if got := render(Classify(tc.sql)); got != tc.want {
			t.Errorf("%q:\n got %s\nwant %s", tc.sql, got, tc.want)
		}
	}
}

// A server's settings move where strings end: a statement hidden in a
// string for one setting is a statement for another.
func TestClassifyWithSettings(t *testing.T) {
	const hidden = `SELECT 'a\''; INSERT INTO ledger VALUES (1); --'`
	for _, tc := range []struct {
		sql  string
		set  Settings
		want string
	}{
		{hidden, Settings{}, "select"},
		{hidden, Settings{BackslashEscapes: true}, "select; insert[ledger]"},
		{`SELECT E'a\''; INSERT INTO ledger VALUES (1); --'`, Settings{}, "select; insert[ledger]"},
		{`SELECT N'a\''; INSERT INTO ledger VALUES (1); --'`, Settings{BackslashEscapes: true}, "select; insert[ledger]"},
		{`SELECT X'a\''; INSERT INTO ledger VALUES (1); --'`, Settings{BackslashEscapes: true}, "select"},
		// In Shift JIS, 0x95 0x5c is one character whose second byte is a
		// backslash: it escapes nothing.
		{"SELECT E'\x95\x5c'; INSERT INTO ledger VALUES (1); --'", Settings{}, "select"},
		{"SELECT E'\x95\x5c'; INSERT INTO ledger VALUES (1); --'", Settings{Encoding: EncodingSJIS}, "select; insert[ledger]"},
		{"SELECT E'\x95\x5c'; INSERT INTO ledger VALUES (1); --'", Settings{Encoding: EncodingDoubleByte}, "select; insert[ledger]"},
		// Half-width katakana is one byte in Shift JIS.
		{"SELECT E'\xb1\\'; INSERT INTO ledger VALUES (1); --'", Settings{Encoding: EncodingSJIS}, "select"},
		{"SELECT E'\x81\x5c'; INSERT INTO ledger VALUES (1); --'", Settings{Encoding: EncodingGB18030}, "select; insert[ledger]"},
		{"SELECT E'\x81\x5c'; INSERT INTO ledger VALUES (1); --'", Settings{Encoding: EncodingJOHAB}, "select; insert[ledger]"},
	} {
		if got := render(ClassifyWith(tc.sql, tc.set)); got != tc.want {
			t.Errorf("%q under %+v:\n got %s\nwant %s", tc.sql, tc.set, got, tc.want)
		}
	}
	for name, want := range map[string]Encoding{"UTF8": ASCIISafe, "SJIS": EncodingSJIS, "SHIFT_JIS_2004": EncodingSJIS,
		"BIG5": EncodingDoubleByte, "GBK": EncodingDoubleByte, "UHC": EncodingDoubleByte, "GB18030": EncodingGB18030,
		"JOHAB": EncodingJOHAB, "LATIN1": ASCIISafe, "EUC_JP": ASCIISafe} {
		if got := EncodingOf(name); got != want {
			t.Errorf("EncodingOf(%q) = %d, want %d", name, got, want)
		}
	}
	if DependsOnSettings([]byte("SELECT 'a' FROM t")) || !DependsOnSettings([]byte(`SELECT 'a\'`)) || !DependsOnSettings([]byte("SELECT '\xe9'")) {
		t.Error("DependsOnSettings")
	}
}

func TestExecuting(t *testing.T) {
	c := Classify("PREPARE ins AS INSERT INTO payments VALUES (1); EXECUTE ins; CREATE TABLE t AS EXECUTE ins")
	p := c.Statements[0].Prepared
	if got := renderStatement(p); got != "insert[payments]" {
		t.Fatalf("prepared %s", got)
	}
	if got := c.Statements[1].Executing(p); renderStatement(&got) != "insert[payments]" {
		t.Errorf("EXECUTE ins runs %s", renderStatement(&got))
	}
	if got := c.Statements[2].Executing(p); renderStatement(&got) != "insert+ddl[t,payments]" {
		t.Errorf("CREATE TABLE AS EXECUTE ins runs %s", renderStatement(&got))
	}
	if got := c.Statements[1].Executing(nil); renderStatement(&got) != "unknown" {
		t.Errorf("EXECUTE of an unknown name: %s", renderStatement(&got))
	}
	if got := c.Statements[0].Executing(nil); renderStatement(&got) != renderStatement(&c.Statements[0]) {
		t.Errorf("a statement that executes nothing changed: %s", renderStatement(&got))
	}
}

// The kind bits name classify's kinds, in order.
func TestKindBits(t *testing.T) {
	for bit, want := range map[kindSet]string{kSelect: KindSelect, kLock: KindLock,
		kFunction: KindFunction, kDDL: KindDDL, kUtility: KindUtility, kUnknown: KindUnknown} {
		if got := kindLists[bit]; !slices.Equal(got, []string{want}) {
			t.Errorf("bit %b names %v, want %s", bit, got, want)
		}
	}
}
