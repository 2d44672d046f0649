package governor

import (
	"context"
	"math/rand/v2"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/governor-project/governor/internal/retry"
)

// governord refuses a call it cannot let in yet (its tenant's calls in
// flight and queued are full, or the tenant is over its api_rate) with
// RESOURCE_EXHAUSTED, an errdetails.ErrorInfo of one of these reasons in
// this domain, and an errdetails.RetryInfo saying when to send it again.
// The call was not applied: the client waits that long and sends it again
// under the same request id, for as long as its context and the session
// allow. A quota denial is RESOURCE_EXHAUSTED too, but carries a Denial and
// no such ErrorInfo: it is final.
const (
	throttledBusy   = "API_BUSY"
	throttledRate   = "API_RATE"
	throttledDomain = "governor"
)

// throttled reports whether err is governord's admission refusing a call,
// and the wait its RetryInfo asks for.
func throttled(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.ResourceExhausted {
		return 0, false
	}
	var wait time.Duration
	var info, retry bool
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = info || (d.GetDomain() == throttledDomain && (d.GetReason() == throttledBusy || d.GetReason() == throttledRate))
		case *errdetails.RetryInfo:
			if rd := d.GetRetryDelay(); rd != nil && rd.CheckValid() == nil {
				wait, retry = max(rd.AsDuration(), 0), true
			}
		}
	}
	return wait, info && retry
}

// throttleWait is the wait before sending a refused call again: what
// governord asked, and up to a quarter more, so that callers refused
// together do not all come back at the same instant.
func throttleWait(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return d + rand.N(d/4+1)
}

// sleep waits d. It returns ctx's error if ctx ends first, or
// ErrSessionLost if stop closes.
func sleep(ctx context.Context, stop <-chan struct{}, d time.Duration) error {
	return retry.SleepUnless(ctx, d, stop, ErrSessionLost)
}
