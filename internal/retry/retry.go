// Package retry holds what the SDK and the proxy share when they retry a call
// to governord: a request id, so a retry is recognised, and a jittered
// exponential backoff, so retries spread out. It may import only the
// standard library.
package retry

import (
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
