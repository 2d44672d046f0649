package server

import (
	"time"

	"github.com/governor-project/governor/server/serverconfig"
)

// tokenBucket is api_rate's bucket. It has no lock of its own: admission
// holds its lock around it. Time comes from the caller.
type tokenBucket struct {
	rate   float64 // tokens a second
	burst  float64
	tokens float64
	last   time.Time
}

func newTokenBucket(r serverconfig.APIRate, now time.Time) *tokenBucket {
	burst := float64(max(r.Burst, 1))
	return &tokenBucket{rate: r.PerSecond, burst: burst, tokens: burst, last: now}
}

// take takes a token at now, or says how long until one is there. A clock
// that goes back refills nothing.
func (b *tokenBucket) take(now time.Time) (wait time.Duration, ok bool) {
	if d := now.Sub(b.last); d > 0 {
		b.tokens = min(b.burst, b.tokens+d.Seconds()*b.rate)
		b.last = now
	}
	if b.tokens >= 1 {
		b.tokens--
		return 0, true
	}
	return time.Duration((1 - b.tokens) / b.rate * float64(time.Second)), false
}

// giveBack returns a token taken for a call then refused for another
// reason.
func (b *tokenBucket) giveBack() { b.tokens = min(b.burst, b.tokens+1) }
