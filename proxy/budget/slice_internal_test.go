package budget

import (
	"math"
	"testing"
	"time"

	"github.com/governor-project/governor/governor"
)

// TestLocalSliceRefillsExactly: the local bucket admits its burst at
// once, then exactly units per per, and says how long until it holds a
// charge, or that it never will within the slice's term.
func TestLocalSliceRefillsExactly(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	l := newLocalSlice(&governor.RateSlice{ID: 7, Units: 3, Per: time.Second, Burst: 4, Term: 4 * time.Second}, t0)
	for i := range 4 {
		if !l.take(1, t0) {
			t.Fatalf("take %d of the burst of 4 refused", i)
		}
	}
	if l.take(1, t0) {
		t.Fatal("a fifth unit at once")
	}
	if d, ok := l.wait(1, t0); !ok || d != 333333334*time.Nanosecond {
		t.Fatalf("wait for 1 at 3/s: %v %v; want 333333334ns", d, ok)
	}
	if l.take(1, t0.Add(333333333)) || !l.take(1, t0.Add(333333334)) {
		t.Fatal("the first refilled unit came a nanosecond early or late")
	}
	if d, ok := l.wait(4, t0.Add(time.Second)); !ok || d >= time.Second {
		t.Fatalf("wait for the whole burst: %v %v", d, ok)
	}
	if _, ok := l.wait(5, t0); ok {
		t.Fatal("a charge past the burst can wait for the local bucket")
	}
	if l.lives(t0.Add(4*time.Second)) || !l.lives(t0.Add(4*time.Second-1)) {
		t.Fatal("the slice lives past its term, or not up to it")
	}
	late := t0.Add(3900 * time.Millisecond)
	if !l.take(4, late) {
		t.Fatal("the bucket is not full again after 3.5s")
	}
	if _, ok := l.wait(1, late); ok {
		t.Fatal("a wait past the term fits")
	}
}

// TestLocalSliceHostileValues: whatever numbers an answer carries, the
// local bucket neither wraps nor trusts a term of more than a minute.
func TestLocalSliceHostileValues(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	for _, s := range []governor.RateSlice{
		{ID: 1, Units: math.MaxInt64, Per: 1, Burst: math.MaxInt64, Term: math.MaxInt64},
		{ID: 2, Units: 1, Per: math.MaxInt64, Burst: 1, Term: 1 << 53},
		{ID: 3, Units: 1 << 31, Per: 1 << 31, Burst: 1 << 53, Term: time.Second},
	} {
		l := newLocalSlice(&s, t0)
		if !l.take(s.Burst, t0) || l.take(1, t0) {
			t.Fatalf("%+v: the burst at once, and nothing more", s)
		}
		if l.until.Sub(t0) > maxSliceTerm {
			t.Fatalf("%+v: trusted for %v", s, l.until.Sub(t0))
		}
		l.refill(t0.Add(time.Hour))
		if l.level < 0 || l.level > s.Burst || l.acc < 0 || l.acc >= l.per {
			t.Fatalf("%+v: after an hour, level %d acc %d", s, l.level, l.acc)
		}
		if d, ok := l.wait(s.Burst, t0.Add(time.Hour)); d < 0 || (ok && d > maxSliceTerm) {
			t.Fatalf("%+v: wait %v %v", s, d, ok)
		}
	}
}
