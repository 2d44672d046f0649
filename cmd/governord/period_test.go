package main

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor"
)

// periodSlack is how late after its boundary a 10s quota may admit again.
const periodSlack = 50 * time.Millisecond

// A quota of 5 per 10s: spent, refused with its reset, governord killed
// with SIGKILL and restarted mid-window, still refused (the window is
// state, not restarted), and admitted again within periodSlack of the
// boundary on the wall clock.
func TestPeriodResetsAtTheBoundaryAcrossKill9(t *testing.T) {
	st := sqliteStore(t)
	d := startDaemon(t, func(port int) string {
		return fmt.Sprintf(`listen: 127.0.0.1:%d
metrics_listen: ""
store: {driver: %s, dsn: %q}
tenants:
  - name: a
    api_key: key-a
    quotas: {calls: {cap: 5, period: 10s}}
`, port, st.driver, st.dsn)
	})
	cli := governorpb.NewGovernorClient(d.conn)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A window with at least 6s left, so that the kill and restart fit in
	// it: waiting for a wall-clock boundary, not for readiness.
	boundary := time.Now().Truncate(10 * time.Second).Add(10 * time.Second)
	if time.Until(boundary) < 6*time.Second {
		time.Sleep(time.Until(boundary))
		boundary = boundary.Add(10 * time.Second)
	}
	sess, err := openSession(ctx, cli, "key-a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	sctx := bearer(ctx, sess.GetSessionToken())
	consume := func(n int64) error {
		_, err := cli.Consume(sctx, &governorpb.ConsumeRequest{NodeId: sess.GetScopeNodeId(), Resource: "calls", Amount: n})
		return err
	}
	if err := consume(5); err != nil {
		t.Fatal(err)
	}
	var d1 *governor.Denial
	if err := governor.RawError("consume", consume(1)); !errors.As(err, &d1) || !d1.ResetAt.Equal(boundary) {
		t.Fatalf("the sixth call: %v; want a denial resetting at %v", err, boundary)
	}
	d.kill()
	d.restart()
	err = consume(1)
	left := time.Until(boundary)
	t.Logf("after kill -9 and a restart, %v before the boundary: %v", left, err)
	if left <= 0 {
		t.Fatalf("after kill -9 and a restart only %v after the boundary: the window could not be checked", -left)
	}
	if err := governor.RawError("consume", err); !errors.As(err, &d1) || !d1.ResetAt.Equal(boundary) {
		t.Fatalf("after kill -9 and a restart, before the boundary: %v; want the quota still spent, resetting at %v", err, boundary)
	}
	time.Sleep(time.Until(boundary))
	var late time.Duration
	for {
		// Timed from when the call was sent: on a loaded machine its
		// round trip is the machine's, and a call sent then was admitted.
		sent := time.Since(boundary)
		err := consume(5)
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
	t.Logf("admitted %v after the boundary, across a kill -9", late)
	if late > periodSlack {
		t.Errorf("admitted %v after the boundary; want within %v", late, periodSlack)
	}
}
