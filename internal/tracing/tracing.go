// Package tracing turns OpenTelemetry tracing on for governord and
// governor-proxy, off by default. It is configured by OpenTelemetry's own
// environment, not by Governor's config files: tracing is on when
// OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set
// (or OTEL_TRACES_EXPORTER=otlp), and then spans go to that OTLP/gRPC
// endpoint, with the exporter's other OTEL_EXPORTER_OTLP_* variables
// (OTEL_EXPORTER_OTLP_INSECURE, headers, certificates) and
// OTEL_SERVICE_NAME as the exporter reads them. Incoming W3C traceparent
// headers are honoured and propagated.
//
// The spans themselves are made where the work is: governor-proxy's
// classification, admission wait, upstream call and governord calls
// (through the SDK's gRPC connection, see ClientHandler), governord's
// handling of a call (ServerHandler) and its commit wait.
//
// It may import the standard library, gRPC and OpenTelemetry's API, SDK,
// OTLP exporter and gRPC instrumentation.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sync/atomic"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/stats"
)

// enabled is whether Setup turned tracing on, so that the hot paths add no
// instrumentation while it is off. It mirrors OpenTelemetry's own global
// provider, which Setup sets.
var enabled atomic.Bool

// Enabled reports whether tracing is on.
func Enabled() bool { return enabled.Load() }

// Wanted reports whether the environment asks for tracing.
func Wanted() bool {
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" ||
		os.Getenv("OTEL_TRACES_EXPORTER") == "otlp"
}

// Setup turns tracing on when the environment asks for it (Wanted), for
// the named service (OTEL_SERVICE_NAME overrides it). The returned
// function flushes the spans still buffered and turns tracing off again;
// call it at shutdown. When tracing is not wanted, it does nothing.
func Setup(ctx context.Context, service string) (shutdown func(context.Context) error, err error) {
	if !Wanted() {
		return func(context.Context) error { return nil }, nil
	}
	if v := os.Getenv("OTEL_TRACES_EXPORTER"); v != "" && v != "otlp" && v != "none" {
		return nil, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: governor exports traces by OTLP only (otlp, none)", v)
	}
	exp, err := otlptracegrpc.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("tracing: the OTLP exporter: %w", err)
	}
	name := service
	if v := os.Getenv("OTEL_SERVICE_NAME"); v != "" {
		name = v
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp),
		sdktrace.WithResource(resource.NewWithAttributes(semconv.SchemaURL, semconv.ServiceName(name))))
	prevTP, prevProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	enabled.Store(true)
	return func(ctx context.Context) error {
		enabled.Store(false)
		err := tp.Shutdown(ctx)
		otel.SetTracerProvider(prevTP)
		otel.SetTextMapPropagator(prevProp)
		if errors.Is(err, context.Canceled) {
			return nil
		}
		return err
	}, nil
}

// Tracer is the tracer of one of Governor's packages.
func Tracer(pkg string) trace.Tracer {
	return otel.Tracer("github.com/governor-project/governor/" + pkg)
}

// ServerHandler is the gRPC server handler that makes a span of each call
// governord handles, continuing the caller's trace; nil while tracing is
// off.
func ServerHandler() stats.Handler {
	if !Enabled() {
		return nil
	}
	return otelgrpc.NewServerHandler()
}

// ClientHandler is the gRPC client handler that makes a span of each call
// to governord and sends the trace along; nil while tracing is off.
func ClientHandler() stats.Handler {
	if !Enabled() {
		return nil
	}
	return otelgrpc.NewClientHandler()
}

// Extract continues the trace an incoming request's traceparent names, if
// any.
func Extract(ctx context.Context, h http.Header) context.Context {
	return otel.GetTextMapPropagator().Extract(ctx, propagation.HeaderCarrier(h))
}

// Inject writes ctx's trace into an outgoing request's headers
// (traceparent), replacing what the caller sent.
func Inject(ctx context.Context, h http.Header) {
	otel.GetTextMapPropagator().Inject(ctx, propagation.HeaderCarrier(h))
}
