package retry

import (
	"testing"
	"time"
)

func TestRequestIDAndJitter(t *testing.T) {
	a, b := RequestID(), RequestID()
	if len(a) != 32 || a == b {
		t.Fatalf("request ids %q and %q", a, b)
	}
	for range 1000 {
		if j := Jitter(time.Second); j < time.Second/2 || j > time.Second {
			t.Fatalf("Jitter(1s) = %v", j)
		}
	}
}
