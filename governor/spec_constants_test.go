package governor

import (
	"testing"
	"time"
)

// The client gives its session up at 80% of the TTL after the last
// successful heartbeat was sent (SPEC.md of the engine, doc.go): written
// as the literal, so a changed share fails here.
func TestSpecLocalDeadlineIs80PercentOfTTL(t *testing.T) {
	for _, ttl := range []time.Duration{10 * time.Second, 30 * time.Second, time.Minute} {
		if got, want := localDeadline(ttl), ttl*8/10; got != want {
			t.Errorf("localDeadline(%v) = %v; want %v", ttl, got, want)
		}
	}
}
