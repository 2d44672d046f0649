package faultproxy_test

import (
	"bufio"
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/governor-project/governor/internal/faultproxy"
)

// countingHealth answers every Check and counts them.
type countingHealth struct {
	healthpb.UnimplementedHealthServer
	checks atomic.Int64
}

func (h *countingHealth) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	h.checks.Add(1)
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// A call whose answer is dropped reaches the server, and its client gets
// UNAVAILABLE; the calls before and after it are answered, and a
// connection that is not HTTP/2 is left alone meanwhile.
func TestDropNextAnswerLosesOneAnswer(t *testing.T) {
	srvLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &countingHealth{}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, h)
	go srv.Serve(srvLn)
	defer srv.Stop()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := faultproxy.New(ln, srvLn.Addr().String())
	defer p.Close()
	cc, err := grpc.NewClient(p.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	health := healthpb.NewHealthClient(cc)
	check := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	if err := check(); err != nil {
		t.Fatalf("before the drop: %v", err)
	}

	p.DropNextAnswer()
	// A line echo through the proxy meanwhile: not HTTP/2, so not cut.
	echoLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	echoProxy := faultproxy.New(echoLn, echo(t))
	defer echoProxy.Close()
	echoProxy.DropNextAnswer()
	c, err := net.Dial("tcp", echoProxy.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("still here\n"))
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "still here\n" {
		t.Fatalf("a connection that is not HTTP/2, with an answer to drop: %q, %v", line, err)
	}

	if err := check(); status.Code(err) != codes.Unavailable {
		t.Fatalf("the call whose answer was dropped: %v, want UNAVAILABLE", err)
	}
	if n := h.checks.Load(); n != 2 {
		t.Fatalf("the server answered %d calls, want 2: the dropped one reached it", n)
	}
	if err := check(); err != nil {
		t.Fatalf("the call after the drop: %v", err)
	}
	if n, dropped := h.checks.Load(), p.AnswersDropped(); n != 3 || dropped != 1 {
		t.Fatalf("the server answered %d calls and the proxy dropped %d answers, want 3 and 1", n, dropped)
	}
}
