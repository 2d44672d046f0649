package hacheck

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor"
)

// periodSlack is how late after its boundary a 10s quota may admit again.
const periodSlack = 50 * time.Millisecond

// A quota of 5 per 10s (in both governords' config), spent on the leader; the leader killed with
// SIGKILL mid-window; on the standby that takes over the quota is still
// spent (the window is in the log, not restarted by the takeover) and is
// admitted again within periodSlack of the boundary on the wall clock.
func TestPeriodResetsOnTheStandbyAfterFailover(t *testing.T) {
	bin, err := buildGovernord()
	if err != nil {
		t.Fatal(err)
	}
	pg := startPG(t)
	const quota = ", quotas: {calls: {cap: 5, period: 10s}}"
	nodes := []*node{newNodeWith(t, bin, "a", pg.dsn, nil, quota), newNodeWith(t, bin, "b", pg.dsn, nil, quota)}
	leader := waitLeader(t, nodes)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	boundary := time.Now().Truncate(10 * time.Second).Add(10 * time.Second)
	if time.Until(boundary) < 7*time.Second { // room for a failover in the window
		time.Sleep(time.Until(boundary)) // a wall-clock boundary, not readiness
		boundary = boundary.Add(10 * time.Second)
	}
	tenant := openOn(t, ctx, leader.Addr, tenantKey)
	if err := tenant.consume(5); err != nil {
		t.Fatal(err)
	}
	var d *governor.Denial
	if err := governor.RawError("consume", tenant.consume(1)); !errors.As(err, &d) || !d.ResetAt.Equal(boundary) {
		t.Fatalf("the sixth call: %v; want a denial resetting at %v", err, boundary)
	}
	leader.Signal(syscall.SIGKILL)
	leader.Wait()
	standby := waitLeader(t, others(nodes, leader))
	tenant = openOn(t, ctx, standby.Addr, tenantKey)
	err = tenant.consume(1)
	left := time.Until(boundary)
	t.Logf("on the standby after the failover, %v before the boundary: %v", left, err)
	if left <= 0 {
		t.Fatalf("on the standby after the failover only %v after the boundary: the window could not be checked", -left)
	}
	if err := governor.RawError("consume", err); !errors.As(err, &d) || !d.ResetAt.Equal(boundary) {
		t.Fatalf("on the standby after the failover, before the boundary: %v; want the quota still spent, resetting at %v", err, boundary)
	}
	time.Sleep(time.Until(boundary))
	var late time.Duration
	for {
		// Timed from when the call was sent: on a loaded machine its
		// round trip is the machine's, and a call sent then was admitted.
		sent := time.Since(boundary)
		err := tenant.consume(5)
		late = time.Since(boundary)
		if err == nil {
			late = sent
			break
		}
		if status.Code(err) != codes.ResourceExhausted || late > time.Second {
			t.Fatalf("%v after the boundary: %v", late, err)
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("admitted on the standby %v after the boundary", late)
	if late > periodSlack {
		t.Errorf("admitted %v after the boundary; want within %v", late, periodSlack)
	}
}

// rpcSession is a session on one governord, over plain gRPC.
type rpcSession struct {
	governorpb.GovernorClient
	ctx   context.Context
	scope int64
}

func (s *rpcSession) consume(n int64) error {
	_, err := s.Consume(s.ctx, &governorpb.ConsumeRequest{NodeId: s.scope, Resource: "calls", Amount: n})
	return err
}

// openOn opens a session with key on the governord at addr.
func openOn(t *testing.T, ctx context.Context, addr, key string) *rpcSession {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	cli := governorpb.NewGovernorClient(conn)
	resp, err := cli.OpenSession(ctx, &governorpb.OpenSessionRequest{ApiKey: key, Ttl: durationpb.New(sessionTTL)})
	if err != nil {
		t.Fatal(err)
	}
	return &rpcSession{GovernorClient: cli, scope: resp.GetScopeNodeId(),
		ctx: metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+resp.GetSessionToken())}
}
