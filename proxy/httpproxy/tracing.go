package httpproxy

import (
	"context"
	"errors"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/governor-project/governor/internal/tracing"
	"github.com/governor-project/governor/proxy/admission"
)

// Spans of the HTTP side, made only while tracing is on (package tracing):
// one per request, continuing the caller's traceparent, with its
// classification, its admission wait and its upstream call under it, and
// a denial as an event on it.
var tracer = tracing.Tracer("proxy/httpproxy")

// traceRequest starts a request's span; the returned request carries it.
func traceRequest(r *http.Request) (*http.Request, trace.Span) {
	ctx := tracing.Extract(r.Context(), r.Header)
	ctx, span := tracer.Start(ctx, "governor-proxy.request", trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("http.request.method", r.Method), attribute.String("url.full", r.URL.String())))
	return r.WithContext(ctx), span
}

// traceStep starts the span of one step of a request (classify, admission).
func traceStep(ctx context.Context, name string) (context.Context, trace.Span) {
	return tracer.Start(ctx, name)
}

// traceDecision notes a request's outcome on its span: the rule, and a
// denial as an event naming its cause.
func traceDecision(ctx context.Context, ex *exchange, err error) {
	span := trace.SpanFromContext(ctx)
	span.SetAttributes(attribute.String("governor.rule", ex.rule), attribute.String("governor.subtask", ex.subtask))
	var d *admission.Denial
	if errors.As(err, &d) {
		span.AddEvent("governor.denied", trace.WithAttributes(attribute.String("governor.cause", d.Cause.String()),
			attribute.String("governor.message", d.Message())))
		span.SetStatus(codes.Error, "denied: "+d.Cause.String())
	}
}

// traceUpstream starts the span of the call upstream and sends its trace
// along (traceparent).
func traceUpstream(req *http.Request) (*http.Request, trace.Span) {
	ctx, span := tracer.Start(req.Context(), "upstream", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("server.address", req.URL.Host)))
	tracing.Inject(ctx, req.Header)
	return req.WithContext(ctx), span
}
