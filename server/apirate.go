package server

import (
	"fmt"
	"time"

	"github.com/governor-project/governor/api/governorpb"
)

// APIRate is a tenant's api_rate: how many calls a second its sessions may
// make to governord's API, beyond which a call is refused with a RetryInfo
// (admission.go). It is a rate on governord itself, not on the tenant's
// work: the rates a tenant sets on its work are caps in the engine.
type APIRate struct {
	PerSecond float64 // the refill
	Burst     int     // the bucket's size: calls that may come at once
}

// Bounds of api_rate and api_burst: past them a value is a mistake, not a
// rate (governord answers some tens of thousands of calls a second).
const (
	MaxAPIRatePerSecond = 1_000_000
	MaxAPIBurst         = 1_000_000
)

// ParseAPIRate reads a rate as the rates of work are written
// (governorpb.ParseRate: "N/s", "N/min", "N/h" ...), at most
// MaxAPIRatePerSecond calls a second, and returns calls a second.
func ParseAPIRate(text string) (float64, error) {
	n, per, err := governorpb.ParseRate(text)
	if err != nil {
		return 0, err
	}
	perSecond := float64(n) / per.Seconds()
	if perSecond > MaxAPIRatePerSecond {
		return 0, fmt.Errorf("%q is over %d calls a second", text, MaxAPIRatePerSecond)
	}
	return perSecond, nil
}

// tokenBucket is api_rate's bucket. It has no lock of its own: admission
// holds its lock around it. Time comes from the caller.
type tokenBucket struct {
	rate   float64 // tokens a second
	burst  float64
	tokens float64
	last   time.Time
}

func newTokenBucket(r APIRate, now time.Time) *tokenBucket {
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
