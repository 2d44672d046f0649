package filepoll

import (
	"errors"
	"testing"
)

// Poll is driven by hand: a change is applied only once it has read the
// same twice, an error only once while it lasts, and going back to what is
// in force cancels a change seen once.
func TestChangesApplyOnceSettled(t *testing.T) {
	var now [][]byte
	var readErr error
	var applied []string
	p := &Poller{handled: digest([][]byte{[]byte("a")}, nil),
		read: func() ([][]byte, error) { return now, readErr },
		apply: func(c [][]byte, err error) {
			if err != nil {
				applied = append(applied, "error")
				return
			}
			applied = append(applied, string(c[0]))
		}}
	step := func(content string, err error) {
		now, readErr = [][]byte{[]byte(content)}, err
		p.Poll()
	}
	step("a", nil)
	step("b", nil) // seen once
	step("a", nil) // back to what is in force
	step("b", nil)
	step("c", nil) // changed again before settling
	step("c", nil) // settled
	step("c", nil)
	gone := errors.New("no such file")
	step("", gone)
	step("", gone) // the error settles: applied once
	step("", gone)
	step("c", nil)
	step("c", nil)
	want := []string{"c", "error", "c"}
	if len(applied) != len(want) {
		t.Fatalf("applied %q, want %q", applied, want)
	}
	for i := range want {
		if applied[i] != want[i] {
			t.Fatalf("applied %q, want %q", applied, want)
		}
	}
}

// The parts of a content are told apart: ("ab", "") is not ("a", "b").
func TestDigestSeparatesParts(t *testing.T) {
	if digest([][]byte{[]byte("ab"), nil}, nil) == digest([][]byte{[]byte("a"), []byte("b")}, nil) {
		t.Error("two splits of the same bytes read the same")
	}
}
