package governor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/governor-project/governor/internal/retry"
)

// Default backoff of Retry.
const (
	DefaultRetryBase = 100 * time.Millisecond
	DefaultRetryMax  = 10 * time.Second
)

// A RetryOption changes how Retry retries.
type RetryOption func(*retryConfig)

type retryConfig struct {
	base, max time.Duration
	attempts  int
	resource  string
	retryIf   func(error) bool
}

// WithBackoff sets the first delay between attempts and its ceiling. Each
// delay doubles the last and is jittered.
func WithBackoff(base, max time.Duration) RetryOption {
	return func(c *retryConfig) { c.base, c.max = base, max }
}

// WithMaxAttempts caps the attempts, the first included, on top of the
// budget. Zero or less means only the budget stops Retry.
func WithMaxAttempts(n int) RetryOption { return func(c *retryConfig) { c.attempts = n } }

// WithRetryResource charges retries to another quota than "retry".
func WithRetryResource(resource string) RetryOption {
	return func(c *retryConfig) { c.resource = resource }
}

// WithRetryIf decides which errors are worth a retry; the rest are returned
// at once. The default retries every error except the governor's own
// refusals (a spent quota, an ended task, a lost session) and ctx ending.
func WithRetryIf(retryable func(error) bool) RetryOption {
	return func(c *retryConfig) { c.retryIf = retryable }
}

// Retry calls fn until it succeeds, drawing each retry from the retry budget
// of the task ctx carries. The first attempt is free; each retry first
// consumes one unit of "retry" from the task, and so from every ancestor.
// When that is refused, Retry returns fn's last error at once, wrapped with
// the refusal, so errors.Is matches both. Between attempts it waits with
// jittered exponential backoff, and it stops when ctx ends. After a refusal
// for rate (ErrRateLimited) it waits at least the refusal's RetryAfter.
//
// Without a task in ctx, Retry returns an error wrapping ErrNoTask and does
// not call fn.
func Retry(ctx context.Context, fn func(ctx context.Context) error, opts ...RetryOption) error {
	task := TaskFromContext(ctx)
	if task == nil {
		return fmt.Errorf("governor: Retry: %w", ErrNoTask)
	}
	cfg := retryConfig{base: DefaultRetryBase, max: DefaultRetryMax, resource: ResourceRetry, retryIf: retryable}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.base <= 0 {
		cfg.base = cfg.max // no first delay given: wait the ceiling
	}
	err := fn(ctx)
	for attempt := 1; err != nil; attempt++ {
		if !cfg.retryIf(err) || (cfg.attempts > 0 && attempt >= cfg.attempts) {
			return err
		}
		if cerr := context.Cause(ctx); cerr != nil {
			return fmt.Errorf("%w (not retried: %w)", err, cerr)
		}
		if cerr := task.Consume(ctx, cfg.resource, 1); cerr != nil {
			return fmt.Errorf("%w (not retried: %w)", err, cerr)
		}
		t := time.NewTimer(max(retry.Backoff(cfg.base, cfg.max, attempt-1), RetryAfter(err)))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (not retried: %w)", err, context.Cause(ctx))
		}
		err = fn(ctx)
	}
	return nil
}

// retryable is the default of WithRetryIf.
func retryable(err error) bool {
	for _, stop := range []error{context.Canceled, context.DeadlineExceeded, ErrQuotaExhausted,
		ErrTaskEnded, ErrSessionLost, ErrClosed, ErrNoTask, ErrUnauthenticated, ErrPermissionDenied, ErrNotFound} {
		if errors.Is(err, stop) {
			return false
		}
	}
	return true
}
