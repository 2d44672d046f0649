package sqlclass

import (
	"fmt"
	"strings"
	"testing"
	"unicode/utf16"
	"unicode/utf8"
)

// checkClass holds a Class to what every Class must be: known kinds,
// positive counts, no empty names, unknown statements without tables,
// entries and names within the limits.
func checkClass(t *testing.T, sql string, c *Class) {
	t.Helper()
	known := map[string]bool{}
	for _, k := range Kinds() {
		known[k] = true
	}
	if len(c.Statements) > MaxStatements {
		t.Fatalf("%d entries, over MaxStatements", len(c.Statements))
	}
	names := 0
	var check func(s *Statement)
	check = func(s *Statement) {
		if s.Count < 1 {
			t.Fatalf("%.200q: count %d", sql, s.Count)
		}
		for _, k := range s.Kinds {
			if !known[k] {
				t.Fatalf("%.200q: unknown kind %q", sql, k)
			}
		}
		if len(s.Kinds) == 0 && s.Execute == "" {
			t.Fatalf("%.200q: a statement without kinds that executes nothing", sql)
		}
		for _, tb := range s.Tables {
			if tb == "" || len(tb) > maxNameParts*(nameLen+1) {
				t.Fatalf("%.200q: table name %q", sql, tb)
			}
		}
		names += len(s.Tables)
		if slicesHas(s.Kinds, KindUnknown) && (len(s.Kinds) != 1 || len(s.Tables) != 0 || s.Execute != "") {
			t.Fatalf("%.200q: an unknown statement with more: %+v", sql, s)
		}
		if (s.Op == OpPrepare) != (s.Prepared != nil) {
			t.Fatalf("%.200q: op %d, prepared %v", sql, s.Op, s.Prepared)
		}
		if s.Prepared != nil {
			check(s.Prepared)
		}
	}
	for i := range c.Statements {
		check(&c.Statements[i])
	}
	if names > MaxNames {
		t.Fatalf("%.200q: %d names, over MaxNames", sql, names)
	}
}

func slicesHas(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

// FuzzClassify: any text, under any settings, classifies without
// panicking, within the limits, the same way twice. Seeds:
// testdata/fuzz/FuzzClassify and the texts of testdata/forms.txt.
func FuzzClassify(f *testing.F) {
	for _, fm := range loadForms(f) {
		f.Add(fm.sql)
	}
	f.Add("WITH x AS (DELETE FROM a RETURNING *) SELECT * FROM x FOR UPDATE")
	f.Add("SELECT $$a$$, $t$;$t$, E'\\'', U&\"x\" /* /* */ */ FROM b; --")
	f.Add("SELECT 'a\\''; INSERT INTO ledger VALUES (1); --'")
	f.Add("PREPARE p AS DELETE FROM t; EXECUTE p; DEALLOCATE ALL; DISCARD ALL")
	f.Add("SELECT E'\x95\x5c'; INSERT INTO ledger VALUES (1); --'")
	f.Fuzz(func(t *testing.T, sql string) {
		for _, set := range []Settings{{}, {BackslashEscapes: true}, {Encoding: EncodingSJIS}, {Encoding: EncodingGB18030}} {
			a, b := ClassifyWith(sql, set), ClassifyWith(sql, set)
			if render(a) != render(b) {
				t.Fatalf("not deterministic: %s vs %s", render(a), render(b))
			}
			checkClass(t, sql, a)
		}
	})
}

// nesters are texts that nest one level deeper each time they repeat, and
// how many levels each repetition adds.
var nesters = []struct {
	open, close string
	levels      int
}{
	{"(", ")", 1},
	{"COPY(", ") TO STDOUT", 2},
	{"EXPLAIN ANALYZE ", "", 1},
	{"DECLARE c CURSOR FOR ", "", 1},
	{"WITH a AS (SELECT 1) (", ")", 2},
	{"SELECT (", ")", 1},
	{"SELECT * FROM (SELECT * FROM t WHERE x IN (", "))", 2},
	{"EXPLAIN (ANALYZE) ", "", 1},
}

// FuzzNesting: text nested past MaxDepth, whatever surrounds it, is one
// unknown statement, found in linear time, and the text after it is
// classified as usual. Within the limit it is never unknown.
func FuzzNesting(f *testing.F) {
	f.Add(uint8(0), uint16(MaxDepth), "1", "; INSERT INTO t VALUES (1)")
	f.Add(uint8(1), uint16(MaxDepth/2+1), "1", "")
	f.Add(uint8(2), uint16(MaxDepth+1), "* FROM t", "; SELECT 2")
	f.Add(uint8(3), uint16(3000), "1", "")
	f.Add(uint8(4), uint16(MaxDepth/2), "1", ";")
	f.Add(uint8(7), uint16(100), "a FROM t", "")
	f.Fuzz(func(t *testing.T, which uint8, reps uint16, inner, after string) {
		n := nesters[int(which)%len(nesters)]
		reps %= 4 * MaxDepth
		sql := strings.Repeat(n.open, int(reps)) + "SELECT " + inner + strings.Repeat(n.close, int(reps))
		c := Classify(sql + after)
		checkClass(t, sql+after, c)
		if len(c.Statements) == 0 {
			t.Fatalf("%.100q: no statement", sql)
		}
		deep := int(reps)*n.levels > MaxDepth
		unknown := slicesHas(c.Statements[0].Kinds, KindUnknown)
		if deep && !unknown {
			t.Fatalf("%d levels of %q: %s, want unknown", reps, n.open, renderStatement(&c.Statements[0]))
		}
		// Within the limit, a plain statement inside is never unknown (unless
		// what follows goes on nesting).
		if !deep && isPlain(inner) && (after == "" || after[0] == ';') && unknown {
			t.Fatalf("%d levels of %q around %q: unknown", reps, n.open, inner)
		}
		// The text after a statement that ends is classified on its own.
		if plain := Classify(after); isPlain(inner) && strings.HasPrefix(after, ";") && len(plain.Statements) > 0 {
			got := c.Statements[len(c.Statements)-1]
			want := plain.Statements[len(plain.Statements)-1]
			got.Count, want.Count = 1, 1 // it may count in with the nested statement
			if len(c.Statements) < MaxStatements && renderStatement(&got) != renderStatement(&want) {
				t.Fatalf("after %d levels of %q: %s, want %s", reps, n.open, renderStatement(&got), renderStatement(&want))
			}
		}
	})
}

// isPlain: text that cannot itself nest, quote or end a statement.
func isPlain(s string) bool {
	return len(s) < 64 && !strings.ContainsAny(s, "()'\"$;-/\\E") && !strings.Contains(strings.ToLower(s), "explain") &&
		!strings.Contains(strings.ToLower(s), "declare") && !strings.Contains(strings.ToLower(s), "copy") &&
		!strings.Contains(strings.ToLower(s), "with") && !strings.Contains(strings.ToLower(s), "prepare") &&
		!strings.Contains(strings.ToLower(s), "begin") && !strings.Contains(strings.ToLower(s), "create")
}

// FuzzUnicodeName: a name written as a U& identifier, each character as an
// escape of four hex digits (a surrogate pair past FFFF), of + and six, or
// as itself, with \ or an escape character UESCAPE gives, reads as the
// name, cut to 63 bytes at a character as the server cuts it. (A name with
// a dot is left out: Statement.Tables joins a name's parts with dots.)
func FuzzUnicodeName(f *testing.F) {
	f.Add("ledger", byte('\\'), uint8(0))
	f.Add("Lédger 😀 \"x\"", byte('!'), uint8(1))
	f.Add(strings.Repeat("é", 40), byte('='), uint8(2))
	f.Fuzz(func(t *testing.T, name string, esc byte, how uint8) {
		if name == "" || !utf8.ValidString(name) || strings.ContainsAny(name, "\x00.") {
			return
		}
		if esc == 0 || esc >= 0x80 || isHex(esc) || isSpace(esc) || strings.IndexByte(`+'"`, esc) >= 0 {
			esc = '\\'
		}
		var b strings.Builder
		for i, r := range name {
			switch (int(how) + i) % 3 {
			case 0:
				if r > 0xffff {
					hi, lo := utf16.EncodeRune(r)
					fmt.Fprintf(&b, "%c%04X%c%04x", esc, hi, esc, lo)
				} else {
					fmt.Fprintf(&b, "%c%04x", esc, r)
				}
			case 1:
				fmt.Fprintf(&b, "%c+%06X", esc, r)
			default:
				switch r {
				case rune(esc):
					b.WriteString(string([]byte{esc, esc}))
				case '"':
					b.WriteString(`""`)
				default:
					b.WriteRune(r)
				}
			}
		}
		sql := `INSERT INTO U&"` + b.String() + `"`
		if esc != '\\' {
			sql += " UESCAPE '" + string(esc) + "'"
		}
		sql += " VALUES (1)"
		want := name
		for len(want) > nameLen {
			_, n := utf8.DecodeLastRuneInString(want)
			want = want[:len(want)-n]
		}
		if got := render(Classify(sql)); got != "insert["+want+"]" {
			t.Fatalf("%q:\n got %s\nwant insert[%s]", sql, got, want)
		}
	})
}
