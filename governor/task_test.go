package governor_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor"
)

func TestNewTaskUnderTenantWithDefaults(t *testing.T) {
	c := dialReal(t)
	ctx, task := newTask(t, t.Context(), c, governor.Spec{Limits: map[string]int64{"db": 2}, Priority: 5})
	if governor.TaskFromContext(ctx) != task {
		t.Fatal("the task's context does not carry the task")
	}
	n, err := c.Raw().GetNode(ctx, &governorpb.GetNodeRequest{NodeId: task.ID()})
	if err != nil {
		t.Fatal(err)
	}
	if n.GetParentId() != c.ScopeID() || n.GetKind() != governorpb.NodeKind_NODE_KIND_TASK || n.GetName() != t.Name() {
		t.Fatalf("node = %v, want a task named %q under the tenant %d", n, t.Name(), c.ScopeID())
	}
	if n.GetQuotas()["retry"] != 3 || n.GetLimits()["db"] != 2 || n.GetPriority() != 5 {
		t.Fatalf("caps = %v %v priority %d, want the tenant's default retry 3, db 2, priority 5",
			n.GetQuotas(), n.GetLimits(), n.GetPriority())
	}

	// A subtask is created under the task its context carries.
	_, sub := newTask(t, ctx, c, governor.Spec{Name: "sub"})
	sn, err := c.Raw().GetNode(ctx, &governorpb.GetNodeRequest{NodeId: sub.ID()})
	if err != nil {
		t.Fatal(err)
	}
	if sn.GetParentId() != task.ID() || sn.GetKind() != governorpb.NodeKind_NODE_KIND_SUBTASK {
		t.Fatalf("subtask = %v, want a subtask of %d", sn, task.ID())
	}

	// Names are unique among open siblings.
	_, _, err = c.NewTask(ctx, governor.Spec{Name: "sub"})
	if !errors.Is(err, governor.ErrAlreadyExists) || status.Code(err) != codes.AlreadyExists {
		t.Fatalf("second subtask named sub: %v, want ErrAlreadyExists", err)
	}
}

func TestConsumeDenialNamesCapAndLargestConsumer(t *testing.T) {
	c := dialReal(t)
	ctx, parent := newTask(t, t.Context(), c, governor.Spec{Quotas: map[string]int64{"calls": 3}})
	_, a := newTask(t, ctx, c, governor.Spec{Name: "a"})
	_, b := newTask(t, ctx, c, governor.Spec{Name: "b"})
	for _, step := range []struct {
		task   *governor.Task
		amount int64
	}{{a, 2}, {b, 1}} {
		if err := step.task.Consume(ctx, "calls", step.amount); err != nil {
			t.Fatal(err)
		}
	}
	err := b.Consume(ctx, "calls", 1)
	var d *governor.Denial
	if !errors.As(err, &d) || !errors.Is(err, governor.ErrQuotaExhausted) {
		t.Fatalf("Consume over the parent's quota: %v, want a *Denial", err)
	}
	want := governor.Denial{Resource: "calls", NodeID: parent.ID(), NodeName: parent.Name(), Used: 3, Limit: 3, Amount: 1,
		LargestConsumerID: a.ID(), LargestConsumerName: "a", LargestConsumerUsed: 2}
	if *d != want {
		t.Fatalf("denial = %+v\nwant      %+v", *d, want)
	}
	// The error still carries the gRPC status with its detail.
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.ResourceExhausted || len(st.Details()) != 1 {
		t.Fatalf("status = %v, want RESOURCE_EXHAUSTED with a Denial detail", st)
	}
	var se *governor.StatusError
	if !errors.As(err, &se) || se.Op != "Consume" {
		t.Fatalf("err = %#v, want a *StatusError for Consume", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "calls") || !strings.Contains(msg, `"a"`) {
		t.Fatalf("message %q does not name the cap and the largest consumer", msg)
	}
	// Nothing was charged by the denied call.
	n, err := c.Raw().GetNode(ctx, &governorpb.GetNodeRequest{NodeId: parent.ID()})
	if err != nil {
		t.Fatal(err)
	}
	if n.GetUsed()["calls"] != 3 {
		t.Fatalf("used = %d, want 3", n.GetUsed()["calls"])
	}
}

func TestAcquireReleaseValidate(t *testing.T) {
	c := dialReal(t)
	ctx, task := newTask(t, t.Context(), c, governor.Spec{Limits: map[string]int64{"db": 1}})
	first, err := task.Acquire(ctx, "db")
	if err != nil {
		t.Fatal(err)
	}
	if first.NodeID() != task.ID() || first.Class() != "db" {
		t.Fatalf("lease on node %d class %q, want %d db", first.NodeID(), first.Class(), task.ID())
	}
	if err := first.Validate(ctx); err != nil {
		t.Fatalf("Validate of a held lease: %v", err)
	}

	// The limit is full: Acquire waits, and gives up cleanly with its context.
	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err = task.Acquire(wctx, "db")
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire on a full limit: %v, want DeadlineExceeded", err)
	}
	if held := heldOn(t, c, task.ID(), "db"); held != 1 {
		t.Fatalf("held = %d after a cancelled wait, want 1", held)
	}

	// A waiter gets the slot once it is released.
	got := make(chan *governor.Lease, 1)
	errc := make(chan error, 1)
	go func() {
		l, err := task.Acquire(ctx, "db")
		got <- l
		errc <- err
	}()
	if err := first.Release(ctx, 5*time.Millisecond, false); err != nil {
		t.Fatal(err)
	}
	second, err := <-got, <-errc
	if err != nil {
		t.Fatal(err)
	}
	if second.ID() <= first.ID() {
		t.Fatalf("lease ids %d then %d: fencing tokens must grow", first.ID(), second.ID())
	}

	// A second release is a no-op; Validate says how the lease ended.
	if err := first.Release(ctx, 0, false); err != nil {
		t.Fatalf("second Release: %v, want nil", err)
	}
	err = first.Validate(ctx)
	var le *governor.LeaseEndedError
	if !errors.As(err, &le) || le.Reason != governor.LeaseReleased || le.LeaseID != first.ID() ||
		!errors.Is(err, governor.ErrLeaseReleased) {
		t.Fatalf("Validate of a released lease: %v, want LeaseEndedError released", err)
	}
	if err := second.Release(ctx, 0, false); err != nil {
		t.Fatal(err)
	}
}

func TestChargeAndAcquire(t *testing.T) {
	c := dialReal(t)
	ctx, task := newTask(t, t.Context(), c, governor.Spec{Quotas: map[string]int64{"tokens": 10}})
	l, err := task.ChargeAndAcquire(ctx, "db", map[string]int64{"tokens": 7})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx, 0, false); err != nil {
		t.Fatal(err)
	}
	// A spent quota fails at once and takes no lease.
	if _, err := task.ChargeAndAcquire(ctx, "db", map[string]int64{"tokens": 7}); !errors.Is(err, governor.ErrQuotaExhausted) {
		t.Fatalf("ChargeAndAcquire over quota: %v, want ErrQuotaExhausted", err)
	}
	// No class: charge only.
	l, err = task.ChargeAndAcquire(ctx, "", map[string]int64{"tokens": 3})
	if err != nil || l != nil {
		t.Fatalf("charge only = %v, %v; want no lease and no error", l, err)
	}
	if held := heldOn(t, c, task.ID(), "db"); held != 0 {
		t.Fatalf("held = %d, want 0", held)
	}
}

func TestTaskContextEndsOnClose(t *testing.T) {
	c := dialReal(t)
	ctx, task := newTask(t, t.Context(), c, governor.Spec{})
	subCtx, sub := newTask(t, ctx, c, governor.Spec{Name: "sub"})
	if err := task.Close(); err != nil {
		t.Fatal(err)
	}
	for _, x := range []context.Context{ctx, subCtx} {
		<-x.Done()
		if !errors.Is(context.Cause(x), governor.ErrTaskEnded) {
			t.Fatalf("cause = %v, want ErrTaskEnded", context.Cause(x))
		}
	}
	// Both refuse work without asking the server.
	for _, tk := range []*governor.Task{task, sub} {
		if err := tk.Consume(t.Context(), "calls", 1); !errors.Is(err, governor.ErrTaskEnded) {
			t.Fatalf("Consume on %q after Close: %v, want ErrTaskEnded", tk.Name(), err)
		}
	}
	if err := task.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	n, err := c.Raw().GetNode(t.Context(), &governorpb.GetNodeRequest{NodeId: sub.ID()})
	if err != nil {
		t.Fatal(err)
	}
	if n.GetState() != governorpb.NodeState_NODE_STATE_CLOSED {
		t.Fatalf("subtask state %v, want CLOSED with its parent", n.GetState())
	}
}

func TestTaskContextEndsAtDeadline(t *testing.T) {
	c := dialReal(t)
	deadline := time.Now().Add(150 * time.Millisecond)
	ctx, task := newTask(t, t.Context(), c, governor.Spec{Deadline: deadline})
	if d, ok := ctx.Deadline(); !ok || !d.Equal(deadline) {
		t.Fatalf("context deadline = %v, want %v", d, deadline)
	}
	<-ctx.Done()
	var te *governor.TaskEndedError
	if !errors.As(context.Cause(ctx), &te) || te.State != governor.NodeExpired || te.NodeID != task.ID() {
		t.Fatalf("cause = %v, want the task expired", context.Cause(ctx))
	}
	if err := task.Consume(t.Context(), "calls", 1); !errors.Is(err, governor.ErrTaskEnded) {
		t.Fatalf("Consume after the deadline: %v, want ErrTaskEnded", err)
	}
}

func TestTaskContextEndsWhenServerSaysSo(t *testing.T) {
	c := dialReal(t)
	ctx, parent := newTask(t, t.Context(), c, governor.Spec{})
	subCtx, sub := newTask(t, ctx, c, governor.Spec{Name: "sub"})

	// Someone else cancels the parent; this client learns it on its next call.
	other := dialReal(t)
	if _, err := other.Raw().CancelNode(t.Context(), &governorpb.CancelNodeRequest{NodeId: parent.ID()}); err != nil {
		t.Fatal(err)
	}
	err := sub.Consume(subCtx, "calls", 1)
	var te *governor.TaskEndedError
	// The server may name the subtask (ended with its parent) or the parent.
	if !errors.As(err, &te) || (te.NodeID != sub.ID() && te.NodeID != parent.ID()) || te.State != governor.NodeCancelled {
		t.Fatalf("Consume under a cancelled parent: %v, want a TaskEndedError, cancelled", err)
	}
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("code = %v, want FailedPrecondition", status.Code(err))
	}
	<-subCtx.Done()
	if !errors.Is(context.Cause(subCtx), governor.ErrTaskEnded) {
		t.Fatalf("cause = %v, want ErrTaskEnded", context.Cause(subCtx))
	}

	// The parent learns it on its own next call, and its context ends.
	err = parent.Consume(ctx, "calls", 1)
	if !errors.As(err, &te) || te.NodeID != parent.ID() {
		t.Fatalf("Consume on the parent: %v, want TaskEndedError for node %d", err, parent.ID())
	}
	<-ctx.Done()
	if err := parent.Consume(t.Context(), "calls", 1); !errors.Is(err, governor.ErrTaskEnded) {
		t.Fatalf("Consume on the parent again: %v, want ErrTaskEnded", err)
	}
}

func TestCloseEndsSessionLeasesAndTasks(t *testing.T) {
	c, err := governor.Dial(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	ctx, task, err := c.NewTask(t.Context(), governor.Spec{Name: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := task.Acquire(ctx, "db")
	if err != nil {
		t.Fatal(err)
	}
	if err := task.Close(); err != nil {
		t.Fatal(err)
	}
	ctx2, task2, err := c.NewTask(t.Context(), governor.Spec{Name: t.Name() + "-2"})
	if err != nil {
		t.Fatal(err)
	}
	lease2, err := task2.Acquire(ctx2, "db")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	<-c.Done()
	<-ctx2.Done()
	if !errors.Is(c.Err(), governor.ErrClosed) || !errors.Is(context.Cause(ctx2), governor.ErrClosed) {
		t.Fatalf("Err = %v, cause = %v; want ErrClosed", c.Err(), context.Cause(ctx2))
	}
	if err := task2.Consume(t.Context(), "calls", 1); !errors.Is(err, governor.ErrClosed) {
		t.Fatalf("Consume after Close: %v, want ErrClosed", err)
	}

	// Another session sees how each lease ended: revoked with its task,
	// released with the session.
	other := dialReal(t)
	for _, tc := range []struct {
		lease *governor.Lease
		want  governor.LeaseEndReason
	}{{lease, governor.LeaseRevoked}, {lease2, governor.LeaseReleased}} {
		_, err := other.Raw().Validate(t.Context(), &governorpb.ValidateRequest{LeaseId: tc.lease.ID()})
		st := status.Convert(err)
		var reason governorpb.LeaseEndReason
		for _, d := range st.Details() {
			if d, ok := d.(*governorpb.LeaseEnded); ok {
				reason = d.GetReason()
			}
		}
		if governor.LeaseEndReason(reason) != tc.want {
			t.Errorf("lease %d: %v, want ended %v", tc.lease.ID(), err, tc.want)
		}
	}
	// Nodes outlive sessions: the closed client's task is still open.
	if _, err := other.Raw().CloseNode(t.Context(), &governorpb.CloseNodeRequest{NodeId: task2.ID()}); err != nil {
		t.Fatal(err)
	}
}

func TestRawIsScopedToTheTenant(t *testing.T) {
	c := dialReal(t)
	if _, err := c.Raw().GetNode(t.Context(), &governorpb.GetNodeRequest{NodeId: c.ScopeID()}); err != nil {
		t.Fatalf("GetNode of the own tenant: %v", err)
	}
	_, err := c.Raw().GetNode(t.Context(), &governorpb.GetNodeRequest{NodeId: 1})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("GetNode of the root: %v, want NotFound: what lies outside the scope is not there to a tenant", err)
	}
}

func TestDialRejectsBadKey(t *testing.T) {
	_, err := governor.Dial(t.Context(), governor.WithAPIKey("wrong"))
	if !errors.Is(err, governor.ErrUnauthenticated) || status.Code(err) != codes.Unauthenticated {
		t.Fatalf("Dial with a bad key: %v, want ErrUnauthenticated", err)
	}
}

func TestDialWithTTL(t *testing.T) {
	c := dialReal(t, governor.WithTTL(time.Second))
	if c.TTL() != time.Second {
		t.Fatalf("TTL = %v, want the 1s asked for", c.TTL())
	}
}

// heldOn reads how many leases of class the node's subtree holds.
func heldOn(t *testing.T, c *governor.Client, node int64, class string) int64 {
	t.Helper()
	n, err := c.Raw().GetNode(t.Context(), &governorpb.GetNodeRequest{NodeId: node})
	if err != nil {
		t.Fatal(err)
	}
	return n.GetHeld()[class]
}
