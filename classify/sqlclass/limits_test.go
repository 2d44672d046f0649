package sqlclass

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"
)

// allocated returns the bytes allocated while f ran.
func allocated(f func()) uint64 {
	var a, b runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&a)
	f()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

// Nesting up to MaxDepth is classified; one level more is unknown, and the
// statements after it are classified as usual.
func TestDepthLimit(t *testing.T) {
	for _, n := range nesters {
		reps := MaxDepth / n.levels
		within := strings.Repeat(n.open, reps) + "DELETE FROM t" + strings.Repeat(n.close, reps)
		if got := render(Classify(within)); strings.Contains(got, "unknown") {
			t.Errorf("%d levels of %q: %s", reps*n.levels, n.open, got)
		}
		reps++
		past := strings.Repeat(n.open, reps) + "DELETE FROM t" + strings.Repeat(n.close, reps) + "; INSERT INTO ledger VALUES (1)"
		if got := render(Classify(past)); got != "unknown; insert[ledger]" {
			t.Errorf("%d levels of %q: %s, want unknown; insert[ledger]", reps*n.levels, n.open, got)
		}
	}
	// PREPARE past the limit still prepares its name: what it runs is
	// unknown.
	deep := "PREPARE p AS SELECT " + strings.Repeat("(", MaxDepth+1) + "1" + strings.Repeat(")", MaxDepth+1)
	if got := render(Classify(deep)); got != "unknown prepare p=unknown" {
		t.Errorf("a deep PREPARE: %s", got)
	}
}

// Chains of EXPLAIN and DECLARE ... FOR used to recurse once per link; on a
// small stack a long chain was fatal. Now nothing recurses.
func TestChainsNeedNoStack(t *testing.T) {
	defer debug.SetMaxStack(debug.SetMaxStack(1 << 20))
	for _, link := range []string{"EXPLAIN ANALYZE ", "DECLARE c CURSOR FOR ", "EXPLAIN (ANALYZE) ", "COPY ("} {
		sql := strings.Repeat(link, 200_000) + "DELETE FROM t"
		if got := render(Classify(sql)); got != "unknown" {
			t.Errorf("a chain of %q: %s", link, got)
		}
	}
}

// Classification is linear in the text: 1 MiB of nested COPY( (which used
// to take minutes) or of anything else takes milliseconds (U& names and
// their UESCAPE clauses, which are read again for the name, included), and
// a 10 MiB multi-row INSERT is an ordinary insert.
func TestLinearTime(t *testing.T) {
	var rows strings.Builder
	rows.WriteString("INSERT INTO ledger (id, note) VALUES ")
	for i := 0; rows.Len() < 10<<20; i++ {
		if i > 0 {
			rows.WriteString(", ")
		}
		fmt.Fprintf(&rows, "(%d, 'row ''%d'' of the bulk load; DELETE FROM t', now())", i, i)
	}
	for _, tc := range []struct {
		name, sql, want string
		limit           time.Duration
	}{
		{"nested COPY(", strings.Repeat("COPY(", 1<<20/5), "unknown", time.Second},
		{"nested parentheses", strings.Repeat("(", 1<<20), "unknown", time.Second},
		{"punctuation", "SELECT " + strings.Repeat("+-", 1<<19), "select", time.Second},
		{"a long qualified name", "SELECT * FROM " + strings.Repeat("a.", 1<<19) + "b", "select[a.a.a]", time.Second},
		{"many tables", "SELECT * FROM " + strings.Repeat("t, ", 1<<18) + "u", "select[t,u]", time.Second},
		{"10 MiB INSERT", rows.String(), "insert[ledger]", 5 * time.Second},
		{"U& names with UESCAPE", "SELECT * FROM " + strings.Repeat(`U&"t!0031" UESCAPE '!', `, 1<<15) + "u", "select[t1,u]", time.Second},
		{"a long U& name", `INSERT INTO U&"` + strings.Repeat(`\0061`, 1<<18) + `" VALUES (1)`, "insert[" + strings.Repeat("a", nameLen) + "]", time.Second},
		{"a long UESCAPE string", `INSERT INTO U&"a" UESCAPE '` + strings.Repeat("!", 1<<20) + `' VALUES (1)`, "insert[a]", time.Second},
		{"a string continued", "SELECT E'a'" + strings.Repeat("\n'\\''", 1<<18), "select", time.Second},
	} {
		start := time.Now()
		got := render(Classify(tc.sql))
		took := time.Since(start)
		if got != tc.want {
			t.Errorf("%s: %.200s, want %s", tc.name, got, tc.want)
		}
		if took > tc.limit {
			t.Errorf("%s (%d bytes): %v, over %v", tc.name, len(tc.sql), took, tc.limit)
		}
		t.Logf("%s: %d bytes in %v", tc.name, len(tc.sql), took)
	}
}

// Memory is bounded by the limits, not by the text: the lexer keeps no
// tokens (it used to make a 24-byte one per punctuation byte).
func TestBoundedMemory(t *testing.T) {
	Classify("warm the pool up")
	for name, sql := range map[string]string{
		"punctuation":        "SELECT " + strings.Repeat("+", 1<<20),
		"nested parentheses": strings.Repeat("(", 1<<20),
		"nested COPY(":       strings.Repeat("COPY(", 1<<20/5),
		"a multi-row INSERT": "INSERT INTO t VALUES " + strings.Repeat("(1, 'a', $1, 2.5e3), ", 1<<20/22) + "(0)",
	} {
		// What is left is the classifier's own state, up to MaxDepth levels.
		if n := allocated(func() { Classify(sql) }); n > 128<<10 {
			t.Errorf("%s (%d bytes): %d bytes allocated", name, len(sql), n)
		}
	}
}

// A text past MaxStatements distinct entries ends in one unknown entry that
// counts the rest; identical statements in a row share an entry however
// many there are.
func TestStatementLimit(t *testing.T) {
	var b strings.Builder
	for i := range MaxStatements + 10 {
		fmt.Fprintf(&b, "INSERT INTO t%d VALUES (1);", i)
	}
	c := Classify(b.String())
	if len(c.Statements) != MaxStatements {
		t.Fatalf("%d entries", len(c.Statements))
	}
	last := c.Statements[MaxStatements-1]
	if got := renderStatement(&last); got != "unknown x11" {
		t.Errorf("the last entry: %s", got)
	}
	if got := render(Classify(strings.Repeat("INSERT INTO t VALUES (1);", 100_000))); got != "insert[t] x100000" {
		t.Errorf("100,000 inserts: %s", got)
	}
}

// A statement naming more than MaxNames tables is unknown.
func TestNameLimit(t *testing.T) {
	var b strings.Builder
	b.WriteString("SELECT * FROM t0")
	for i := 1; i <= MaxNames; i++ {
		fmt.Fprintf(&b, " JOIN t%d USING (id)", i)
	}
	if got := render(Classify(b.String() + "; SELECT 1")); got != "unknown; select" {
		t.Errorf("%d tables: %.100s", MaxNames+1, got)
	}
	long := strings.Repeat("x", 100)
	if got := render(Classify("SELECT * FROM " + long + ", \"" + long + "\"")); got != "select["+long[:nameLen]+"]" {
		t.Errorf("names are cut to %d bytes: %s", nameLen, got)
	}
	cut := strings.Repeat("x", nameLen-1) + "é"
	if got := Classify("SELECT * FROM " + cut).Statements[0].Tables[0]; got != cut[:nameLen-1] {
		t.Errorf("a name cut inside a character: %q", got)
	}
}
