// Package retry holds what the SDK and the proxy share when they retry a call
// to governord: a request id, so a retry is recognised, a jittered
// exponential backoff, so retries spread out, and the wait itself, which
// ends early with the caller's context. It may import only the standard
// library.
package retry

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"math/rand/v2"
	"time"
)

// RequestID returns a fresh random request id: 32 hex characters.
func RequestID() string {
	var b [16]byte
	crand.Read(b[:]) // never fails: crypto/rand.Read aborts the program instead
	return hex.EncodeToString(b[:])
}

// Jitter returns a random duration in [d/2, d].
func Jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2+1)
}

// Backoff returns the jittered wait before retry n (0 for the first): base
// doubled n times, but never more than ceiling. It does not overflow however
// large n grows.
func Backoff(base, ceiling time.Duration, n int) time.Duration {
	d := ceiling
	if n = max(n, 0); n < 63 && base <= ceiling>>n {
		d = base << n
	}
	return Jitter(d)
}

// Sleep waits d. It returns ctx's error if ctx ends first.
func Sleep(ctx context.Context, d time.Duration) error {
	return SleepUnless(ctx, d, nil, nil)
}

// SleepUnless waits d as Sleep does, and returns stopped if stop closes
// first. A nil stop never closes.
func SleepUnless(ctx context.Context, d time.Duration, stop <-chan struct{}, stopped error) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-stop:
		return stopped
	}
}
