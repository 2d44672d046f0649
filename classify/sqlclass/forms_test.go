package sqlclass

import (
	"bufio"
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/governor-project/governor/internal/pgtest"
)

// formsFile holds the lexical forms the classifier must read as PostgreSQL
// reads them, each with its expected classification. They seed
// FuzzClassify too.
const formsFile = "testdata/forms.txt"

// form is one case of formsFile.
type form struct {
	line    int
	sql     string
	set     Settings
	want    string // as render writes it
	refused bool   // the server refuses the text: nothing in it runs
}

// loadForms reads formsFile: stanzas separated by blank lines, each a sql:
// line (a Go string literal), a want: line, and optionally set: (scs=off,
// sjis) and server: refused. Lines starting with # are comments.
func loadForms(t testing.TB) []form {
	t.Helper()
	f, err := os.Open(formsFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var forms []form
	var cur *form
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			if line == "" {
				cur = nil
			}
			continue
		}
		key, value, ok := strings.Cut(line, ":")
		value = strings.TrimSpace(value)
		if !ok {
			t.Fatalf("%s:%d: no key", formsFile, n)
		}
		if key == "sql" {
			forms = append(forms, form{line: n})
			cur = &forms[len(forms)-1]
			if cur.sql, err = strconv.Unquote(value); err != nil {
				t.Fatalf("%s:%d: %v", formsFile, n, err)
			}
			continue
		}
		if cur == nil {
			t.Fatalf("%s:%d: %s before sql", formsFile, n, key)
		}
		switch key {
		case "want":
			cur.want = value
		case "set":
			for _, s := range strings.Fields(value) {
				switch s {
				case "scs=off":
					cur.set.BackslashEscapes = true
				case "sjis":
					cur.set.Encoding = EncodingSJIS
				default:
					t.Fatalf("%s:%d: unknown setting %q", formsFile, n, s)
				}
			}
		case "server":
			if value != "refused" {
				t.Fatalf("%s:%d: server: %q, want refused", formsFile, n, value)
			}
			cur.refused = true
		default:
			t.Fatalf("%s:%d: unknown key %q", formsFile, n, key)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	for _, f := range forms {
		if f.want == "" {
			t.Fatalf("%s:%d: no want", formsFile, f.line)
		}
	}
	return forms
}

// Each form classifies as formsFile says.
func TestForms(t *testing.T) {
	for _, f := range loadForms(t) {
		if got := render(ClassifyWith(f.sql, f.set)); got != f.want {
			t.Errorf("%s:%d: %q under %+v:\n got %s\nwant %s", formsFile, f.line, f.sql, f.set, got, f.want)
		}
	}
}

// The forms on a real PostgreSQL: the server refuses exactly the texts
// marked refused, and every text it runs adds, to each table, as many rows
// as the classifier counts inserts and merges naming that table. A table the
// classifier misnames, or an INSERT it does not see, shows as rows where
// none were counted. Each text runs in a transaction rolled back after it,
// with a table (id int) for every name the classifier reads and for
// ledger.
func TestFormsOnServer(t *testing.T) {
	dsn := pgtest.Schema(t, "sqlforms")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	pc := conn.PgConn()
	exec := func(sql string) error {
		_, err := pc.Exec(ctx, sql).ReadAll()
		return err
	}
	must := func(sql string) {
		t.Helper()
		if err := exec(sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	count := func(table string) int {
		t.Helper()
		res, err := pc.Exec(ctx, "SELECT count(*) FROM "+pgx.Identifier{table}.Sanitize()).ReadAll()
		if err != nil {
			t.Fatalf("counting %q: %v", table, err)
		}
		n, err := strconv.Atoi(string(res[0].Rows[0][0]))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, f := range loadForms(t) {
		c := ClassifyWith(f.sql, f.set)
		inserts := writesByTable(c)
		tables := []string{"ledger"}
		for _, s := range c.Statements {
			for _, tb := range s.Tables {
				if !slicesHas(tables, tb) {
					tables = append(tables, tb)
				}
			}
		}
		must("BEGIN")
		for _, tb := range tables {
			must("CREATE TABLE " + pgx.Identifier{tb}.Sanitize() + " (id int)")
		}
		if f.set.BackslashEscapes {
			must("SET LOCAL standard_conforming_strings = off")
		}
		if f.set.Encoding == EncodingSJIS {
			must("SET LOCAL client_encoding = 'SJIS'")
		}
		must("SAVEPOINT form")
		err := exec(f.sql)
		if err != nil {
			must("ROLLBACK TO SAVEPOINT form")
		}
		must("SET LOCAL standard_conforming_strings = on; SET LOCAL client_encoding = 'UTF8'")
		if refused := err != nil; refused != f.refused {
			t.Errorf("%s:%d: %q: the server's answer: %v; want refused %t", formsFile, f.line, f.sql, err, f.refused)
		}
		for _, tb := range tables {
			rows := count(tb)
			if !f.refused && rows != inserts[tb] {
				t.Errorf("%s:%d: %q: the server added %d rows to %q, the classifier counts %d inserts and merges (%s)",
					formsFile, f.line, f.sql, rows, tb, inserts[tb], render(c))
			}
		}
		must("ROLLBACK")
		must("DEALLOCATE ALL")
	}
}

// writesByTable counts a Class's inserts and merges (each form's adds one
// row) by the table they name, with the statements EXECUTE runs resolved
// from the PREPAREs before them.
func writesByTable(c *Class) map[string]int {
	prepared := map[string]*Statement{}
	n := map[string]int{}
	for _, s := range c.Statements {
		run := s.Executing(prepared[s.Execute])
		if s.Op == OpPrepare {
			prepared[s.Name] = s.Prepared
		}
		if !slicesHas(run.Kinds, "insert") && !slicesHas(run.Kinds, "merge") {
			continue
		}
		for _, tb := range run.Tables {
			n[tb] += run.Count
		}
	}
	return n
}
