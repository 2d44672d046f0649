package server

import (
	"context"

	"github.com/governor-project/governor/internal/tracing"
)

var tracer = tracing.Tracer("server")

// commitWaitSpan is the span of a call's wait for its events to commit
// (write before reply), under the call's own span; tracing is on.
func commitWaitSpan(ctx context.Context) (context.Context, func()) {
	ctx, span := tracer.Start(ctx, "governord.commit_wait")
	return ctx, func() { span.End() }
}
