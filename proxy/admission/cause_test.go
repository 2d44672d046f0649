package admission

import (
	"slices"
	"testing"

	"github.com/governor-project/governor/governor"
)

// The sidecar's causes are governor.proto's: every cause there has a row
// in the table or is marked as governord's alone, and converts to the
// sidecar's cause of the same name, or to none.
func TestCausesAreTheProtosCauses(t *testing.T) {
	for _, c := range governor.Causes() {
		sc, ok := causeFrom(c)
		switch {
		case governordOnly[Cause(c)] && (ok || sc.hasRow()):
			t.Errorf("%v is marked governord's alone but has a row", c)
		case !governordOnly[Cause(c)] && !ok:
			t.Errorf("%v has no row in the table of causes and is not marked governord's alone", c)
		case ok && sc.String() != c.String():
			t.Errorf("%v converts to %v", c, sc)
		}
	}
	for sc := range governordOnly {
		if !slices.Contains(governor.Causes(), governor.Cause(sc)) {
			t.Errorf("%v is marked governord's alone but governor.proto has no such cause", sc)
		}
	}
	for _, c := range []governor.Cause{governor.CauseNone, -1, 1 << 20} {
		if sc, ok := causeFrom(c); ok {
			t.Errorf("%d converts to %v", c, sc)
		}
		if w := Cause(c).Wire(); w.Status != 400 || w.Header != "" {
			t.Errorf("%d renders as %+v", c, w)
		}
	}
}
