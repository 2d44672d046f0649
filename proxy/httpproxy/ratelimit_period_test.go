package httpproxy

import (
	"net/http"
	"testing"
	"time"

	"github.com/governor-project/governor/classify"
	"github.com/governor-project/governor/proxy/admission"
)

// A quota with a period carries its reset in RateLimit (t, seconds,
// rounded up) and, for a duration, its window in RateLimit-Policy (w); a
// calendar period has no fixed w; a quota that never resets has neither.
func TestRateLimitHeadersCarryTheReset(t *testing.T) {
	now := time.Date(2026, 1, 31, 23, 59, 57, 700_000_000, time.UTC)
	for _, c := range []struct {
		what           string
		cap            admission.CapState
		policy, header string
	}{
		{"10s", admission.CapState{Name: "calls", Node: "a", Cap: 5, Remaining: 0, Period: "10s", ResetAt: now.Add(2300 * time.Millisecond)},
			`"calls@a";q=5;w=10`, `"calls@a";r=0;t=3`},
		{"month", admission.CapState{Name: "tokens", Node: "a", Cap: 100, Remaining: 40, Period: "month",
			ResetAt: time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)}, `"tokens@a";q=100`, `"tokens@a";r=40;t=3`},
		{"a reset just passed", admission.CapState{Name: "calls", Node: "a", Cap: 5, Remaining: 5, Period: "10s", ResetAt: now.Add(-time.Millisecond)},
			`"calls@a";q=5;w=10`, `"calls@a";r=5;t=0`},
		{"never", admission.CapState{Name: "retry", Node: "a", Cap: 3, Remaining: 1}, `"retry@a";q=3`, `"retry@a";r=1`},
	} {
		h := http.Header{}
		rateLimitHeaders(h, admission.CapReport{Caps: []admission.CapState{c.cap}}, classify.Decision{}, now)
		if h.Get(HeaderRateLimitPolicy) != c.policy || h.Get(HeaderRateLimit) != c.header {
			t.Errorf("%s: %q / %q; want %q / %q", c.what, h.Get(HeaderRateLimitPolicy), h.Get(HeaderRateLimit), c.policy, c.header)
		}
	}
}
