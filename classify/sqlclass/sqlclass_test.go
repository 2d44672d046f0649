package sqlclass

import (
	"slices"
	"strings"
	"testing"
)

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		sql    string
		kinds  string
		tables string
	}{
		{"SELECT 1", "select", ""},
		{"select * from payments p join ledger l on p.id = l.id", "select", "payments ledger"},
		{"SELECT a FROM public.payments, \"Mixed\".\"Case\" x, other", "select", "public.payments Mixed.Case other"},
		{"SELECT * FROM t FOR UPDATE", "select lock", "t"},
		{"select * from t for no key update of t skip locked", "select lock", "t"},
		{"SELECT * FROM t FOR KEY SHARE", "select lock", "t"},
		{"SELECT extract(year from ts), substring(s from 2 for 3) FROM events", "select", "events"},
		{"SELECT a IS DISTINCT FROM b FROM x", "select", "x"},
		{"SELECT * FROM generate_series(1,10) g, LATERAL (SELECT * FROM inner_t) s", "select", "inner_t"},
		{"SELECT * INTO newt FROM t", "select ddl", "newt t"},
		{"INSERT INTO payments (a, b) VALUES (1, 'x;y')", "insert", "payments"},
		{"INSERT INTO audit SELECT * FROM payments", "insert", "audit payments"},
		{"insert into t values (1) on conflict (id) do update set v = excluded.v", "insert update", "t"},
		{"insert into t values (1) on conflict do nothing", "insert", "t"},
		{"UPDATE ONLY accounts a SET x = 1 FROM branches b WHERE a.b = b.id", "update", "accounts branches"},
		{"DELETE FROM t USING u WHERE t.id = u.id", "delete", "t u"},
		{"MERGE INTO target t USING source s ON t.id = s.id WHEN MATCHED THEN UPDATE SET v = s.v", "merge", "target source"},
		{"WITH moved AS (DELETE FROM a RETURNING *) INSERT INTO b SELECT * FROM moved", "insert delete", "a b"},
		{"WITH x AS (SELECT * FROM a) SELECT * FROM x", "select", "a"},
		{"WITH x AS MATERIALIZED (UPDATE a SET v = 1 RETURNING *) SELECT * FROM x", "update", "a"},
		{"WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n+1 FROM r) SELECT * FROM r", "select", ""},
		{"EXPLAIN SELECT * FROM t", "utility", "t"},
		{"EXPLAIN ANALYZE DELETE FROM t", "delete", "t"},
		{"EXPLAIN (ANALYZE, BUFFERS) UPDATE t SET a = 1", "update", "t"},
		{"EXPLAIN (ANALYZE false) UPDATE t SET a = 1", "utility", "t"},
		{"DO $$BEGIN DELETE FROM t; END$$", "do", ""},
		{"DO $body$ select 'a;b' $body$ LANGUAGE plpgsql", "do", ""},
		{"CALL proc(1)", "call", ""},
		{"COPY pgbench_accounts FROM STDIN", "copy", "pgbench_accounts"},
		{"COPY (SELECT * FROM t) TO STDOUT", "copy", "t"},
		{"COPY public.t (a, b) TO STDOUT WITH (FORMAT csv)", "copy", "public.t"},
		{"TRUNCATE TABLE a, b", "truncate", "a b"},
		{"truncate a", "truncate", "a"},
		{"LOCK TABLE t IN EXCLUSIVE MODE", "lock", "t"},
		{"CREATE TABLE IF NOT EXISTS t (id int, ts timestamptz default now())", "ddl", "t"},
		{"CREATE TABLE t2 AS SELECT * FROM t1", "ddl", "t2 t1"},
		{"CREATE INDEX i ON t USING btree (a)", "ddl", "t"},
		{"DROP TABLE IF EXISTS a, b CASCADE", "ddl", "a b"},
		{"ALTER TABLE ONLY t ADD COLUMN x int REFERENCES u ON UPDATE CASCADE", "ddl", "t"},
		{"GRANT SELECT ON payments TO bob", "ddl", "payments"},
		{"CREATE FUNCTION f() RETURNS TABLE (a int) LANGUAGE sql BEGIN ATOMIC SELECT 1; SELECT 2; END; SELECT 3 FROM z", "select ddl", "z"},
		{"BEGIN; INSERT INTO t VALUES (1); COMMIT", "insert transaction", "t"},
		{"START TRANSACTION ISOLATION LEVEL SERIALIZABLE", "transaction", ""},
		{"SET TRANSACTION READ ONLY", "transaction", ""},
		{"SET search_path = x", "utility", ""},
		{"SHOW work_mem; VACUUM t", "utility", ""},
		{"LISTEN chan; NOTIFY chan, 'x'", "utility", ""},
		{"-- comment; DELETE FROM t\nSELECT 1 /* nested /* DELETE FROM u; */ */", "select", ""},
		{"SELECT E'it\\'s; DELETE FROM t' FROM a", "select", "a"},
		{"SELECT 'it''s; DELETE FROM t' FROM a", "select", "a"},
		{"SELECT U&\"d\\0061t\" FROM \"my \"\"quoted\"\" table\"", "select", "my \"quoted\" table"},
		{"DECLARE c CURSOR FOR SELECT * FROM t FOR UPDATE", "select lock", "t"},
		{"PREPARE p (int) AS INSERT INTO t VALUES ($1)", "utility", "t"},
		{"TABLE foo", "select", "foo"},
		{"VALUES (1), (2)", "select", ""},
		{"(SELECT 1) UNION (SELECT * FROM t)", "select", "t"},
		{"", "", ""},
		{";;", "", ""},
		{"PREPARE TRANSACTION 'x'", "transaction", ""},
		{"SELECT * FROM Payments", "select", "payments"},
	} {
		c := Classify(tc.sql)
		if got := strings.Join(c.Kinds, " "); got != tc.kinds {
			t.Errorf("%q: kinds %q, want %q", tc.sql, got, tc.kinds)
		}
		got := slices.Clone(c.Tables)
		want := strings.Fields(tc.tables)
		if strings.Contains(tc.tables, "\"") {
			want = []string{tc.tables}
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%q: tables %q, want %q", tc.sql, got, want)
		}
	}
}

func TestClassifyPrepareExecute(t *testing.T) {
	c := Classify("PREPARE ins AS INSERT INTO payments VALUES (1); EXECUTE ins")
	if len(c.Prepares) != 1 || c.Prepares[0].Name != "ins" || strings.Join(c.Prepares[0].Class.Kinds, ",") != "insert" {
		t.Fatalf("prepares %+v", c.Prepares)
	}
	if !slices.Equal(c.Executes, []string{"ins"}) {
		t.Fatalf("executes %v", c.Executes)
	}
}
