package proxy

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"

	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/internal/testcert"
)

// testService is grpc.testing.TestService's UnaryCall and
// StreamingOutputCall, which ends its stream with a trailer.
type testService struct {
	grpc_testing.UnimplementedTestServiceServer
	mu    sync.Mutex
	calls map[string]int
}

func (s *testService) count(method string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.calls == nil {
		s.calls = map[string]int{}
	}
	s.calls[method]++
}

func (s *testService) served(method string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[method]
}

func (s *testService) UnaryCall(_ context.Context, r *grpc_testing.SimpleRequest) (*grpc_testing.SimpleResponse, error) {
	s.count("unary")
	return &grpc_testing.SimpleResponse{Payload: &grpc_testing.Payload{Body: make([]byte, r.GetResponseSize())}}, nil
}

func (s *testService) StreamingOutputCall(r *grpc_testing.StreamingOutputCallRequest, st grpc.ServerStreamingServer[grpc_testing.StreamingOutputCallResponse]) error {
	s.count("stream")
	for _, p := range r.GetResponseParameters() {
		if err := st.Send(&grpc_testing.StreamingOutputCallResponse{Payload: &grpc_testing.Payload{Body: make([]byte, p.GetSize())}}); err != nil {
			return err
		}
	}
	st.SetTrailer(metadata.Pairs("x-probe", "done"))
	return nil
}

// buildProbe builds testdata/grpcprobe, a grpc-go client configured by its
// environment alone.
func buildProbe(t *testing.T) string { return govtest.Binary(t, "proxy/testdata/grpcprobe") }

type probeResult struct {
	Call      string
	Code      string
	Message   string
	Responses int
	Trailer   map[string][]string
	Header    map[string][]string
}

// A grpc-go client with HTTPS_PROXY and SSL_CERT_FILE set, calling an
// intercepted host: each call is governed as a request (POST
// /grpc.testing.TestService/UnaryCall), so a rule charges that method per
// call; exactly the quota's calls reach the server, the next is
// RESOURCE_EXHAUSTED with the denial's message, and a server-streaming call
// of another method gets every response and its trailer.
func TestInterceptedGRPC(t *testing.T) {
	srv := startGovernord(t, nil)
	origin := testcert.New(t, "example.com")
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{origin.TLS}})))
	svc := &testService{}
	grpc_testing.RegisterTestServiceServer(gs, svc)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	go gs.Serve(ln)
	t.Cleanup(gs.Stop)
	_, gport, _ := net.SplitHostPort(ln.Addr().String())
	caCert, caKey, _ := caFiles(t)
	p := startProxy(t, proxyOpts{gaddr: srv.Addr(), yaml: interceptYAML(caCert, caKey, origin.CertFile, "example.com") + `
task: {name: pod-7, quotas: {unary_calls: 3}}
rules:
  - {name: unary, match: {host: example.com, method: POST, path: /grpc.testing.TestService/UnaryCall}, charge: {unary_calls: 1}}
`})
	cmd := exec.Command(buildProbe(t), "-target", "example.com:"+gport, "-unary", "5", "-stream", "4")
	cmd.Env = append(os.Environ(), "HTTPS_PROXY=http://grpc-agent:@"+p.Addr(), "https_proxy=", "NO_PROXY=", "no_proxy=", "SSL_CERT_FILE="+caCert)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("grpcprobe: %v\n%s", err, out)
	}
	var results []probeResult
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var r probeResult
		must(t, json.Unmarshal([]byte(line), &r))
		results = append(results, r)
	}
	if len(results) != 6 {
		t.Fatalf("results: %s", out)
	}
	for i, r := range results[:5] {
		want := "OK"
		if i >= 3 {
			want = "ResourceExhausted"
		}
		if r.Code != want {
			t.Errorf("unary call %d: %s %q, want %s", i+1, r.Code, r.Message, want)
		}
		// A trailers-only response's headers are the call's trailer.
		if want != "OK" && (!strings.Contains(r.Message, "quota spent: unary_calls") || fmt.Sprint(r.Trailer["governor-denied"]) != "[quota]") {
			t.Errorf("unary call %d: the denial is not readable: %q, headers %v", i+1, r.Message, r.Header)
		}
	}
	if s := results[5]; s.Code != "OK" || s.Responses != 4 || fmt.Sprint(s.Trailer["x-probe"]) != "[done]" {
		t.Errorf("the streaming call: %+v", s)
	}
	if n := svc.served("unary"); n != 3 {
		t.Errorf("the server served %d unary calls under a quota of 3", n)
	}
	if v := p.metric(`governor_proxy_intercept_handshakes_total{reason="ok"}`); v != 1 {
		t.Errorf("%v intercepted handshakes, want the client's one connection", v)
	}
}
