package governor

import (
	"errors"
	"fmt"
	"time"

	"github.com/governor-project/governor/api/governorpb"
)

// RateLimitedError is a charge refused by a rate (a token bucket) on the
// task or an ancestor: the bucket of Resource on the node NodeID holds
// Level units and the charge asked Amount. It will hold them RetryAfter
// from the refusal, if nothing else takes from it meanwhile. Nothing was
// charged. It matches ErrRateLimited.
type RateLimitedError struct {
	Resource string
	NodeID   int64
	NodeName string
	// Units per Per is the rate; Burst is the bucket's size (0: Units).
	Units      int64
	Per        time.Duration
	Burst      int64
	Level      int64
	Amount     int64
	RetryAfter time.Duration
}

func (e *RateLimitedError) Error() string {
	burst := ""
	if e.Burst > 0 {
		burst = fmt.Sprintf(", burst %d", e.Burst)
	}
	return fmt.Sprintf("rate limited: %s on %q (node %d) is %d per %v%s: %d left, asked %d; retry after %v",
		e.Resource, e.NodeName, e.NodeID, e.Units, e.Per, burst, e.Level, e.Amount, e.RetryAfter)
}

// Is makes errors.Is(e, ErrRateLimited) true.
func (e *RateLimitedError) Is(target error) bool { return target == ErrRateLimited }

// RetryAfter is how long err (or an error it wraps) says to wait before
// the same call can succeed: a refusal for rate's wait, 0 for any other
// error.
func RetryAfter(err error) time.Duration {
	var rl *RateLimitedError
	if errors.As(err, &rl) {
		return rl.RetryAfter
	}
	return 0
}

func rateLimitedFromProto(d *governorpb.RateLimited) *RateLimitedError {
	return &RateLimitedError{Resource: d.GetResource(), NodeID: d.GetNodeId(), NodeName: d.GetNodeName(),
		Units: d.GetRate().GetUnits(), Per: d.GetRate().GetPer().AsDuration(), Burst: d.GetRate().GetBurst(),
		Level: d.GetLevel(), Amount: d.GetAmount(), RetryAfter: d.GetRetryAfter().AsDuration()}
}
