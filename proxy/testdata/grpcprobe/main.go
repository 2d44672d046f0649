// Command grpcprobe is a gRPC client as a user runs one: grpc-go with
// nothing configured but its environment (HTTPS_PROXY, SSL_CERT_FILE). It
// makes -unary UnaryCalls of grpc.testing.TestService to -target, then one
// StreamingOutputCall of -stream responses, and prints one JSON line per
// call: its code, its message, and (for the stream) the responses and the
// trailer it got. The sidecar's interception tests run it.
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

type result struct {
	Call      string              `json:"call"`
	Code      string              `json:"code"`
	Message   string              `json:"message,omitempty"`
	Responses int                 `json:"responses,omitempty"`
	Trailer   map[string][]string `json:"trailer,omitempty"`
	Header    map[string][]string `json:"header,omitempty"`
}

func main() {
	target := flag.String("target", "", "host:port of the TestService")
	unary := flag.Int("unary", 1, "UnaryCalls to make")
	stream := flag.Int("stream", 0, "responses to ask of one StreamingOutputCall (0: none)")
	flag.Parse()
	// The system roots: SSL_CERT_FILE says where they are.
	conn, err := grpc.NewClient(*target, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{})))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer conn.Close()
	c := grpc_testing.NewTestServiceClient(conn)
	out := json.NewEncoder(os.Stdout)
	for range *unary {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var header, trailer metadata.MD
		_, err := c.UnaryCall(ctx, &grpc_testing.SimpleRequest{ResponseSize: 10}, grpc.Header(&header), grpc.Trailer(&trailer))
		cancel()
		st := status.Convert(err)
		out.Encode(result{Call: "unary", Code: st.Code().String(), Message: st.Message(), Header: header, Trailer: trailer})
	}
	if *stream > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		params := make([]*grpc_testing.ResponseParameters, *stream)
		for i := range params {
			params[i] = &grpc_testing.ResponseParameters{Size: 10}
		}
		s, err := c.StreamingOutputCall(ctx, &grpc_testing.StreamingOutputCallRequest{ResponseParameters: params})
		r := result{Call: "stream"}
		for err == nil {
			if _, err = s.Recv(); err == nil {
				r.Responses++
			}
		}
		if err == io.EOF {
			err = nil
		}
		st := status.Convert(err)
		r.Code, r.Message = st.Code().String(), st.Message()
		if s != nil {
			r.Trailer = s.Trailer()
		}
		out.Encode(r)
	}
}
