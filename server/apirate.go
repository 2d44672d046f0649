package server

import (
	"fmt"
	"strconv"
	"strings"
	"time"
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

// ParseAPIRate reads "N/s", "N/min" or "N/h", N a whole number of calls
// from 1 on, at most MaxAPIRatePerSecond a second.
func ParseAPIRate(text string) (float64, error) {
	num, unit, ok := strings.Cut(strings.TrimSpace(text), "/")
	if !ok {
		return 0, fmt.Errorf("%q is not a rate: want N/s, N/min or N/h", text)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(num), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a rate: %q is not a whole number of calls", text, num)
	}
	if n < 1 {
		return 0, fmt.Errorf("%q admits no calls: the least is 1 call (leave api_rate out for no rate)", text)
	}
	var per time.Duration
	switch strings.TrimSpace(unit) {
	case "s":
		per = time.Second
	case "min":
		per = time.Minute
	case "h":
		per = time.Hour
	default:
		return 0, fmt.Errorf("%q is not a rate: the unit %q is not s, min or h", text, unit)
	}
	if n > MaxAPIRatePerSecond*int64(per/time.Second) {
		return 0, fmt.Errorf("%q is over %d calls a second", text, MaxAPIRatePerSecond)
	}
	return float64(n) / per.Seconds(), nil
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
