package proxy

import (
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"

	"github.com/governor-project/governor/internal/tracing"
	"github.com/governor-project/governor/proxy/meter/fakellm"
)

// otlpReceiver is an OTLP/gRPC trace receiver in this process: what an
// OpenTelemetry collector would be handed.
type otlpReceiver struct {
	collectortrace.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []*tracepb.Span
}

func (o *otlpReceiver) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			o.spans = append(o.spans, ss.GetSpans()...)
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// startTracing turns tracing on, exporting to a receiver in this process,
// before governord and the sidecar start (they install their gRPC handlers
// only while it is on). The returned function flushes and turns it off.
func startTracing(t *testing.T) (*otlpReceiver, func()) {
	rec := &otlpReceiver{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(gs, rec)
	go gs.Serve(ln)
	t.Cleanup(gs.Stop)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+ln.Addr().String())
	t.Setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
	shutdown, err := tracing.Setup(context.Background(), "governor-test")
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	end := func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), waitFor)
			defer cancel()
			if err := shutdown(ctx); err != nil {
				t.Errorf("flushing the spans: %v", err)
			}
		})
	}
	t.Cleanup(end)
	return rec, end
}

// One request through the sidecar, in the trace its traceparent names: the
// span tree runs from the sidecar's request span through classification,
// admission and the governord call it makes, governord's handling and its
// commit wait, to the upstream call, whose trace reaches the upstream; a
// denial is an event on its request's span.
func TestTraceOfOneRequest(t *testing.T) {
	rec, flush := startTracing(t)
	srv := startGovernord(t, nil)
	var upstreamParent string
	o := origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upstreamParent = r.Header.Get("Traceparent")
		w.Write([]byte("ok"))
	}), true, false)
	p := startProxy(t, proxyOpts{gaddr: srv.Addr(), tls: certPool(o), yaml: fmt.Sprintf(`
task: {name: pod-7, quotas: {calls: 1}}
delegation: {enabled: false}
routes:
  - {prefix: /api/, upstream: "%s"}
rules:
  - {name: api, class: llm, charge: {calls: 1}}
`, hostURL(o, "example.com"))})
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	for i, want := range []int{200, 429} {
		req, _ := http.NewRequest(http.MethodGet, "http://"+p.Addr()+"/api/x", nil)
		req.Header.Set("Traceparent", "00-"+traceID+"-"+parentID+"-01")
		resp, err := noProxyClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
		if resp.StatusCode != want {
			t.Fatalf("request %d: %d, want %d", i, resp.StatusCode, want)
		}
	}
	// governord ends a call's span after its reply is on the wire: stop it
	// (which waits for every call to end) before the spans are flushed.
	srv.Close()
	flush()

	rec.mu.Lock()
	defer rec.mu.Unlock()
	byName := map[string][]*tracepb.Span{}
	for _, s := range rec.spans {
		// Calls the sidecar makes on its own behalf (opening its session,
		// a release in the background) are traces of their own.
		if hex.EncodeToString(s.GetTraceId()) == traceID {
			byName[s.GetName()] = append(byName[s.GetName()], s)
		}
	}
	one := func(name string, n int) []*tracepb.Span {
		if got := byName[name]; len(got) != n {
			var names []string
			for k, v := range byName {
				names = append(names, fmt.Sprintf("%s×%d", k, len(v)))
			}
			t.Fatalf("%d spans %q, want %d; spans: %s", len(got), name, n, strings.Join(names, ", "))
		}
		return byName[name]
	}
	id := func(s *tracepb.Span) string { return hex.EncodeToString(s.GetSpanId()) }
	parent := func(s *tracepb.Span) string { return hex.EncodeToString(s.GetParentSpanId()) }
	requests := one("governor-proxy.request", 2)
	admitted, denied := requests[0], requests[1]
	if denied.GetStartTimeUnixNano() < admitted.GetStartTimeUnixNano() {
		admitted, denied = denied, admitted
	}
	childOf := func(what string, s *tracepb.Span, of *tracepb.Span) {
		if parent(s) != id(of) {
			t.Errorf("%s's parent is %s, want %q's %s", what, parent(s), of.GetName(), id(of))
		}
	}
	for _, r := range requests {
		if parent(r) != parentID {
			t.Errorf("a request span's parent is %s, not the caller's %s", parent(r), parentID)
		}
	}
	// The admitted request: classify, admission -> governord's call ->
	// its handling -> its commit wait; and the upstream call.
	var admission, call, handling, upstream *tracepb.Span
	for _, s := range one("admission", 2) {
		if parent(s) == id(admitted) {
			admission = s
		}
	}
	if admission == nil {
		t.Fatal("no admission span under the admitted request")
	}
	for _, s := range one("classify", 2) {
		if parent(s) != id(admitted) && parent(s) != id(denied) {
			t.Errorf("a classify span's parent is %s", parent(s))
		}
	}
	calls := one("governor.v1.Governor/ChargeAndAcquire", 4) // client and server, for each request
	for _, s := range calls {
		if s.GetKind() == tracepb.Span_SPAN_KIND_CLIENT && parent(s) == id(admission) {
			call = s
		}
	}
	for _, s := range calls {
		if call != nil && s.GetKind() == tracepb.Span_SPAN_KIND_SERVER && parent(s) == id(call) {
			handling = s
		}
	}
	if call == nil || handling == nil {
		t.Fatalf("governord's call under the admission: client %v, server %v", call != nil, handling != nil)
	}
	commits := 0
	for _, s := range byName["governord.commit_wait"] {
		if parent(s) == id(handling) {
			commits++
		}
	}
	if commits == 0 {
		t.Error("no commit wait under governord's handling of the call")
	}
	upstream = one("upstream", 1)[0]
	childOf("the upstream call", upstream, admitted)
	if want := "00-" + traceID + "-" + id(upstream) + "-01"; upstreamParent != want {
		t.Errorf("the upstream got traceparent %q, want %q", upstreamParent, want)
	}
	// The denial is an event on its request's span.
	found := false
	for _, ev := range denied.GetEvents() {
		if ev.GetName() == "governor.denied" {
			for _, a := range ev.GetAttributes() {
				found = found || (a.GetKey() == "governor.cause" && a.GetValue().GetStringValue() == "quota")
			}
		}
	}
	if !found {
		t.Errorf("the denied request's span has no governor.denied event with cause quota: %v", denied.GetEvents())
	}
}

// A metered call whose estimate is held at governord (delegation off) has
// the hold and its settlement, which runs after the response has ended,
// in its own trace.
func TestTraceOfAMeteredCallHasItsSettlement(t *testing.T) {
	rec, _ := startTracing(t)
	e := startLLM(t, 1_000_000, &fakellm.Provider{}, "delegation: {enabled: false}")
	const traceID = "5bf92f3577b34da6a3ce929d0e0e4737"
	resp := e.post("/openai/chat/completions", "agent-1", `{"model":"m","max_tokens":100,"messages":[]}`,
		"Traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
	if body := readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	// The settlement runs after the response: wait for its span to end
	// and be exported.
	provider, ok := otel.GetTracerProvider().(interface{ ForceFlush(context.Context) error })
	if !ok {
		t.Fatalf("the tracer provider is a %T", otel.GetTracerProvider())
	}
	reserves := func() int {
		if err := provider.ForceFlush(context.Background()); err != nil {
			t.Fatal(err)
		}
		rec.mu.Lock()
		defer rec.mu.Unlock()
		n := 0
		for _, s := range rec.spans {
			if hex.EncodeToString(s.GetTraceId()) == traceID && s.GetName() == "governor.v1.Governor/Reserve" &&
				s.GetKind() == tracepb.Span_SPAN_KIND_CLIENT {
				n++
			}
		}
		return n
	}
	eventually(t, "the hold and its settlement in the request's trace", func() bool { return reserves() >= 2 })
	reported, _ := e.fake.Reported()
	if used := e.used(); used != reported {
		t.Errorf("governord counts %d tokens; the fake reported %d", used, reported)
	}
	if n := reserves(); n != 2 {
		t.Errorf("%d Reserve calls in the request's trace, want 2: the hold and its settlement", n)
	}
}
