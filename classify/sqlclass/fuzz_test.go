package sqlclass

import (
	"slices"
	"testing"

	"github.com/governor-project/governor/classify"
)

// FuzzClassifySQL: any text classifies without panicking, to known kinds,
// the same way twice. Seeds: testdata/fuzz/FuzzClassifySQL.
func FuzzClassify(f *testing.F) {
	f.Add("WITH x AS (DELETE FROM a RETURNING *) SELECT * FROM x FOR UPDATE")
	f.Add("SELECT $$a$$, $t$;$t$, E'\\'', U&\"x\" /* /* */ */ FROM b; --")
	known := map[string]bool{}
	for _, k := range classify.SQLKinds() {
		known[k] = true
	}
	f.Fuzz(func(t *testing.T, sql string) {
		a, b := Classify(sql), Classify(sql)
		if !slices.Equal(a.Kinds, b.Kinds) || !slices.Equal(a.Tables, b.Tables) {
			t.Fatalf("not deterministic: %+v vs %+v", a, b)
		}
		for _, k := range a.Kinds {
			if !known[k] {
				t.Fatalf("unknown kind %q", k)
			}
		}
		for _, tb := range a.Tables {
			if tb == "" {
				t.Fatal("empty table name")
			}
		}
	})
}
