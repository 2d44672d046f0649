package governorpb_test

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"

	pb "github.com/governor-project/governor/api/governorpb"
)

// fakeServer answers Consume with a quota denial when the bearer token is
// right, so the test can check metadata and status details end to end.
type fakeServer struct {
	pb.UnimplementedGovernorServer
}

func (fakeServer) Consume(ctx context.Context, req *pb.ConsumeRequest) (*pb.ConsumeResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if got := md.Get("authorization"); len(got) != 1 || got[0] != "Bearer tok" {
		return nil, status.Error(codes.Unauthenticated, "no session")
	}
	st, err := status.New(codes.ResourceExhausted, "quota retry spent").WithDetails(&pb.Denial{
		Resource: req.GetResource(), NodeId: 2, NodeName: "payments",
		Used: 3, Limit: 3, Amount: req.GetAmount(),
		LargestConsumerId: 7, LargestConsumerName: "job-1", LargestConsumerUsed: 2,
	})
	if err != nil {
		return nil, err
	}
	return nil, st.Err()
}

func TestDenialDetailRoundTrip(t *testing.T) {
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	pb.RegisterGovernorServer(srv, fakeServer{})
	go srv.Serve(lis)
	defer srv.Stop()

	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := pb.NewGovernorClient(conn)

	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer tok")
	_, err = client.Consume(ctx, &pb.ConsumeRequest{RequestId: "r1", NodeId: 9, Resource: "retry", Amount: 1})
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted {
		t.Fatalf("code = %v, want ResourceExhausted (%v)", st.Code(), err)
	}
	var denial *pb.Denial
	for _, d := range st.Details() {
		if x, ok := d.(*pb.Denial); ok {
			denial = x
		}
	}
	want := &pb.Denial{Resource: "retry", NodeId: 2, NodeName: "payments", Used: 3, Limit: 3, Amount: 1,
		LargestConsumerId: 7, LargestConsumerName: "job-1", LargestConsumerUsed: 2}
	if !proto.Equal(denial, want) {
		t.Fatalf("denial = %v, want %v", denial, want)
	}

	// Calls not implemented by the server report Unimplemented.
	if _, err := client.Heartbeat(ctx, &pb.HeartbeatRequest{}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("Heartbeat: %v, want Unimplemented", err)
	}
}

func TestSetCapsOptionalPresence(t *testing.T) {
	zero := int64(0)
	in := &pb.SetCapsRequest{NodeId: 5, Weight: &zero, Quotas: map[string]int64{"retry": -1}}
	b, err := proto.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out pb.SetCapsRequest
	if err := proto.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if out.Weight == nil || out.GetWeight() != 0 {
		t.Errorf("weight set to 0 must stay present, got %v", out.Weight)
	}
	if out.Priority != nil {
		t.Errorf("priority was not set, got %v", *out.Priority)
	}
	if out.GetQuotas()["retry"] != -1 {
		t.Errorf("quotas = %v", out.GetQuotas())
	}
}
