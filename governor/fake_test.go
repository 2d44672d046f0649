package governor_test

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor"
)

// fakeGovernor is an in-process governord for what a real one cannot show on
// demand: replies that are lost after the work was done, heartbeats that stop
// being answered, UNAVAILABLE. It remembers request ids the way the real one
// does, so a retry with a known id returns the first result.
type fakeGovernor struct {
	governorpb.UnimplementedGovernorServer
	ttl time.Duration

	// down makes every call but OpenSession fail with UNAVAILABLE.
	down atomic.Bool

	// Hooks; nil means answer normally. n counts calls of that kind from 0.
	heartbeat func(ctx context.Context, n int) error // before answering
	consume   func(n int) error                      // after applying
	acquire   func(n int, granted bool) error        // before (granted false) and after (true) granting; before looking up the id

	mu         sync.Mutex
	calls      map[string]int
	ids        map[string][]string // request ids seen, by method
	heartbeats []time.Time         // when each answered heartbeat arrived
	consumed   map[string]int64    // applied consumes by request id
	leases     map[string]int64    // granted leases by request id
	releases   []*governorpb.ReleaseRequest
	nextID     int64
}

func newFake(ttl time.Duration) *fakeGovernor {
	return &fakeGovernor{ttl: ttl, calls: map[string]int{}, ids: map[string][]string{},
		consumed: map[string]int64{}, leases: map[string]int64{}, nextID: 100}
}

const fakeToken = "fake-token"

// enter checks the session token, counts the call and returns its number.
func (f *fakeGovernor) enter(ctx context.Context, method, requestID string) (int, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if got := md.Get("authorization"); len(got) != 1 || got[0] != "Bearer "+fakeToken {
		return 0, status.Error(codes.Unauthenticated, "no session")
	}
	if f.down.Load() {
		return 0, status.Error(codes.Unavailable, "down")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.calls[method]
	f.calls[method]++
	if requestID != "" {
		f.ids[method] = append(f.ids[method], requestID)
	}
	return n, nil
}

func (f *fakeGovernor) count(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

func (f *fakeGovernor) requestIDs(method string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.ids[method]...)
}

func (f *fakeGovernor) OpenSession(_ context.Context, req *governorpb.OpenSessionRequest) (*governorpb.OpenSessionResponse, error) {
	if req.GetApiKey() != "k" {
		return nil, status.Error(codes.Unauthenticated, "unknown API key")
	}
	return &governorpb.OpenSessionResponse{SessionToken: fakeToken, ScopeNodeId: 2,
		Ttl: durationpb.New(f.ttl), HeartbeatInterval: durationpb.New(f.ttl / 3)}, nil
}

func (f *fakeGovernor) Heartbeat(ctx context.Context, _ *governorpb.HeartbeatRequest) (*governorpb.HeartbeatResponse, error) {
	arrived := time.Now()
	n, err := f.enter(ctx, "Heartbeat", "")
	if err != nil {
		return nil, err
	}
	if f.heartbeat != nil {
		if err := f.heartbeat(ctx, n); err != nil {
			return nil, err
		}
	}
	f.mu.Lock()
	f.heartbeats = append(f.heartbeats, arrived)
	f.mu.Unlock()
	return &governorpb.HeartbeatResponse{Ttl: durationpb.New(f.ttl)}, nil
}

func (f *fakeGovernor) lastHeartbeat() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.heartbeats) == 0 {
		return time.Time{}
	}
	return f.heartbeats[len(f.heartbeats)-1]
}

func (f *fakeGovernor) CloseSession(ctx context.Context, req *governorpb.CloseSessionRequest) (*governorpb.CloseSessionResponse, error) {
	if _, err := f.enter(ctx, "CloseSession", req.GetRequestId()); err != nil {
		return nil, err
	}
	return &governorpb.CloseSessionResponse{}, nil
}

func (f *fakeGovernor) CreateNode(ctx context.Context, req *governorpb.CreateNodeRequest) (*governorpb.Node, error) {
	if _, err := f.enter(ctx, "CreateNode", req.GetRequestId()); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextID++
	return &governorpb.Node{Id: f.nextID, ParentId: req.GetParentId(), Name: req.GetSpec().GetName(),
		State: governorpb.NodeState_NODE_STATE_OPEN}, nil
}

func (f *fakeGovernor) CloseNode(ctx context.Context, req *governorpb.CloseNodeRequest) (*governorpb.Node, error) {
	if _, err := f.enter(ctx, "CloseNode", req.GetRequestId()); err != nil {
		return nil, err
	}
	return &governorpb.Node{Id: req.GetNodeId(), State: governorpb.NodeState_NODE_STATE_CLOSED}, nil
}

func (f *fakeGovernor) Consume(ctx context.Context, req *governorpb.ConsumeRequest) (*governorpb.ConsumeResponse, error) {
	n, err := f.enter(ctx, "Consume", req.GetRequestId())
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	_, seen := f.consumed[req.GetRequestId()]
	if !seen {
		f.consumed[req.GetRequestId()] = req.GetAmount()
	}
	f.mu.Unlock()
	if seen {
		return &governorpb.ConsumeResponse{}, nil // a retry: the first result
	}
	if f.consume != nil {
		if err := f.consume(n); err != nil {
			return nil, err
		}
	}
	return &governorpb.ConsumeResponse{}, nil
}

func (f *fakeGovernor) Acquire(ctx context.Context, req *governorpb.AcquireRequest) (*governorpb.Lease, error) {
	n, err := f.enter(ctx, "Acquire", req.GetRequestId())
	if err != nil {
		return nil, err
	}
	if f.acquire != nil {
		if err := f.acquire(n, false); err != nil {
			return nil, err
		}
	}
	f.mu.Lock()
	id, seen := f.leases[req.GetRequestId()]
	f.mu.Unlock()
	if seen {
		return &governorpb.Lease{Id: id, NodeId: req.GetNodeId(), Class: req.GetClass()}, nil
	}
	f.mu.Lock()
	f.nextID++
	id = f.nextID
	f.leases[req.GetRequestId()] = id
	f.mu.Unlock()
	if f.acquire != nil {
		if err := f.acquire(n, true); err != nil {
			return nil, err
		}
	}
	return &governorpb.Lease{Id: id, NodeId: req.GetNodeId(), Class: req.GetClass()}, nil
}

func (f *fakeGovernor) ChargeAndAcquire(ctx context.Context, req *governorpb.ChargeAndAcquireRequest) (*governorpb.ChargeAndAcquireResponse, error) {
	if _, err := f.enter(ctx, "ChargeAndAcquire", req.GetRequestId()); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextID++
	return &governorpb.ChargeAndAcquireResponse{Lease: &governorpb.Lease{Id: f.nextID, NodeId: req.GetNodeId(), Class: req.GetClass()}}, nil
}

func (f *fakeGovernor) Release(ctx context.Context, req *governorpb.ReleaseRequest) (*governorpb.ReleaseResponse, error) {
	if _, err := f.enter(ctx, "Release", req.GetRequestId()); err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.releases = append(f.releases, req)
	f.mu.Unlock()
	return &governorpb.ReleaseResponse{}, nil
}

// serveFake serves f over an in-memory listener until the test ends, and
// returns the options that make Dial reach it.
func serveFake(t *testing.T, f *fakeGovernor, opts ...grpc.ServerOption) []governor.Option {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(opts...)
	governorpb.RegisterGovernorServer(srv, f)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	dialer := grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) })
	return []governor.Option{governor.WithAddr("passthrough:///fake"), governor.WithAPIKey("k"),
		governor.WithGRPCOptions(dialer)}
}

// dialFake dials the fake and closes the client when the test ends.
func dialFake(t *testing.T, f *fakeGovernor, opts ...governor.Option) *governor.Client {
	t.Helper()
	c, err := governor.Dial(t.Context(), append(serveFake(t, f), opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
