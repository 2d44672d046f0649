package governor

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/internal/retry"
)

// Spec describes a task to create. In the maps, a key names a resource (for
// quotas) or a lease class (for limits); -1 means no cap, even where the
// parent's defaults would give one, and 0 is a real cap of zero.
type Spec struct {
	// Name is unique among the parent's open children (1 to 255 bytes). An
	// empty Name gets a random one.
	Name string
	// Quotas are budgets that never refill, e.g. {"retry": 3}.
	Quotas map[string]int64
	// Limits cap how many leases of a class the task's subtree holds at once.
	Limits map[string]int64
	// DefaultQuotas and DefaultLimits are given to each subtask created
	// later, for keys its own Spec does not name.
	DefaultQuotas map[string]int64
	DefaultLimits map[string]int64
	// Deadline, if not zero, ends the task (and its subtasks) when it passes.
	Deadline time.Time
	// Priority orders waiters within the tenant: higher is served first.
	Priority int64
}

func (s Spec) proto(name string) *governorpb.NodeSpec {
	p := &governorpb.NodeSpec{Name: name, Quotas: maps.Clone(s.Quotas), Limits: maps.Clone(s.Limits),
		DefaultQuotas: maps.Clone(s.DefaultQuotas), DefaultLimits: maps.Clone(s.DefaultLimits), Priority: s.Priority}
	if !s.Deadline.IsZero() {
		p.Deadline = timestamppb.New(s.Deadline)
	}
	return p
}

// Task is a node of the tree that work is charged to: a task under the
// session's tenant, or a subtask under another task. Its methods are safe for
// concurrent use.
type Task struct {
	c        *Client
	id       int64
	name     string
	parent   *Task // nil for a task directly under the session's scope
	deadline time.Time
	cancel   context.CancelCauseFunc // ends the task's context

	mu     sync.Mutex
	ended  error // why the task ended, once this client knows it has
	closed bool  // the server acknowledged Close or Cancel
}

type taskKey struct{}

// TaskFromContext returns the task ctx carries, or nil.
func TaskFromContext(ctx context.Context) *Task {
	t, _ := ctx.Value(taskKey{}).(*Task)
	return t
}

// NewTask creates a task and returns a context that carries it. The parent
// is the task ctx carries, if any, else the session's scope node (the
// tenant). The returned context is cancelled when the task ends for any
// reason: Close or Cancel, its Deadline, the session ending, or a call that
// learns from the server that the task (or an ancestor) has ended. Always
// Close the task, or Cancel it, when done with it.
//
// On error the returned context is ctx itself.
func (c *Client) NewTask(ctx context.Context, spec Spec) (context.Context, *Task, error) {
	parent, parentID, err := c.parentOf(ctx)
	if err != nil {
		return ctx, nil, err
	}
	name := spec.Name
	if name == "" {
		name = "task-" + retry.RequestID()[:12]
	}
	req := &governorpb.CreateNodeRequest{ParentId: parentID, Spec: spec.proto(name)}
	var node *governorpb.Node
	err = c.call(ctx, "CreateNode", func(ctx context.Context, id string) error {
		req.RequestId = id
		var err error
		node, err = c.rpc.CreateNode(ctx, req)
		return err
	})
	if err != nil {
		if parent != nil {
			parent.observe(err)
		}
		return ctx, nil, err
	}
	tctx, t := c.taskFor(ctx, parent, node, spec.Deadline)
	return tctx, t, nil
}

// FindOrCreateTask returns the open task named spec.Name under the task ctx
// carries (or under the session's scope), leaving it as it is, or creates it
// from spec when there is none; created says which. It is how a process
// that restarts finds its task again: a sidecar names its task after its
// pod. The returned context is like NewTask's. spec.Name is required; the
// deadline is the one spec gives, whichever happened.
func (c *Client) FindOrCreateTask(ctx context.Context, spec Spec) (tctx context.Context, t *Task, created bool, err error) {
	if spec.Name == "" {
		return ctx, nil, false, fmt.Errorf("governor: FindOrCreateTask: %w: the task needs a name", ErrInvalidArgument)
	}
	parent, parentID, err := c.parentOf(ctx)
	if err != nil {
		return ctx, nil, false, err
	}
	req := &governorpb.FindOrCreateNodeRequest{ParentId: parentID, Spec: spec.proto(spec.Name)}
	var resp *governorpb.FindOrCreateNodeResponse
	err = c.call(ctx, "FindOrCreateNode", func(ctx context.Context, id string) error {
		req.RequestId = id
		var err error
		resp, err = c.rpc.FindOrCreateNode(ctx, req)
		return err
	})
	if err != nil {
		if parent != nil {
			parent.observe(err)
		}
		return ctx, nil, false, err
	}
	tctx, t = c.taskFor(ctx, parent, resp.GetNode(), spec.Deadline)
	return tctx, t, resp.GetCreated(), nil
}

// parentOf is the task ctx carries, if any, and the id of the node a new
// task goes under: that task, or the session's scope.
func (c *Client) parentOf(ctx context.Context) (*Task, int64, error) {
	parent := TaskFromContext(ctx)
	if parent == nil {
		return nil, c.scope, nil
	}
	if err := parent.alive(); err != nil {
		return nil, 0, err
	}
	return parent, parent.id, nil
}

// taskFor makes the Task for a node the server returned, and its context.
func (c *Client) taskFor(ctx context.Context, parent *Task, node *governorpb.Node, deadline time.Time) (context.Context, *Task) {
	if d := node.GetDeadline(); d != nil {
		deadline = d.AsTime()
	}
	t := &Task{c: c, id: node.GetId(), name: node.GetName(), parent: parent, deadline: deadline}
	tctx, cancel := context.WithCancelCause(context.WithValue(ctx, taskKey{}, t))
	t.cancel = cancel
	stopDeadline := func() {}
	if !deadline.IsZero() {
		tctx, stopDeadline = context.WithDeadlineCause(tctx, deadline, t.expired())
	}
	stopLife := context.AfterFunc(c.life, func() { cancel(context.Cause(c.life)) })
	// Once the task's context is done, drop its hooks on the session.
	context.AfterFunc(tctx, func() { stopLife(); stopDeadline() })
	return tctx, t
}

// ID is the task's node id.
func (t *Task) ID() int64 { return t.id }

// Name is the task's name.
func (t *Task) Name() string { return t.name }

// MaxAmount is the largest amount one call may charge, reserve, settle or
// return of one resource (2^53, the largest integer a JSON number carries
// exactly); governord refuses a larger or negative one with
// INVALID_ARGUMENT (ErrInvalidArgument).
const MaxAmount = governorpb.MaxAmount

// Consume charges amount of resource to the task and every ancestor, all or
// none. When a quota would be exceeded nothing is charged and the error is a
// *Denial (errors.Is(err, ErrQuotaExhausted)). Quota is never refunded.
// amount is from 1 to MaxAmount.
func (t *Task) Consume(ctx context.Context, resource string, amount int64) error {
	if err := t.alive(); err != nil {
		return err
	}
	req := &governorpb.ConsumeRequest{NodeId: t.id, Resource: resource, Amount: amount}
	err := t.c.call(ctx, "Consume", func(ctx context.Context, id string) error {
		req.RequestId = id
		_, err := t.c.rpc.Consume(ctx, req)
		return err
	})
	t.observe(err)
	return err
}

// Acquire takes a lease of class on the task, waiting while the limit of
// that class is full on the task or any ancestor. When ctx ends the wait is
// withdrawn and no lease is held: a lease granted as ctx ended is given
// back before Acquire returns (unless governord cannot be reached; then it
// is given back once it can be, or ends with the session). Release the
// lease when the work is done.
func (t *Task) Acquire(ctx context.Context, class string) (*Lease, error) {
	if err := t.alive(); err != nil {
		return nil, err
	}
	req := &governorpb.AcquireRequest{NodeId: t.id, Class: class}
	var pl *governorpb.Lease
	err := t.c.grant(ctx, "Acquire", func(ctx context.Context, id string) error {
		req.RequestId = id
		var err error
		pl, err = t.c.rpc.Acquire(ctx, req)
		return err
	}, func(ctx context.Context, id string) error {
		_, err := t.c.rpc.Acquire(ctx, &governorpb.AcquireRequest{RequestId: id, NodeId: t.id, Class: class, Abandon: true})
		return err
	})
	if err != nil {
		t.observe(err)
		return nil, err
	}
	return t.c.newLease(pl), nil
}

// ChargeAndAcquire charges the amounts in charges and takes a lease of class
// in one all-or-nothing step: it waits like Acquire, and the charges apply at
// the instant the lease is granted. A quota already spent fails at once. A
// lease granted as ctx ended is given back, charges included, as Acquire
// does. With an empty class it only charges and returns a nil lease. A
// rate that refuses the charges fails it with a *RateLimitedError at once
// (governor.Retry waits and calls again), unless WaitForRate is given.
func (t *Task) ChargeAndAcquire(ctx context.Context, class string, charges map[string]int64, opts ...ChargeOption) (*Lease, error) {
	return t.chargeAndAcquire(ctx, class, charges, false, opts)
}

// ChargeAndAcquireWrite is ChargeAndAcquire for work classified as a
// write, which a read_only tenant refuses (a *TenantStateError).
func (t *Task) ChargeAndAcquireWrite(ctx context.Context, class string, charges map[string]int64, opts ...ChargeOption) (*Lease, error) {
	return t.chargeAndAcquire(ctx, class, charges, true, opts)
}

// ChargeOption changes how ChargeAndAcquire asks.
type ChargeOption func(*governorpb.ChargeAndAcquireRequest)

// WaitForRate makes a charge that a rate refuses wait for the rate at
// governord rather than fail: it is queued with the other rate waiters
// and granted when the buckets hold its charges, tenants taking turns by
// weight, so that a contended rate is shared by weight rather than by
// who retries first. It waits until ctx ends, which then fails it with
// ctx's error: give ctx a deadline. A grant that comes as ctx ends is
// undone whole, a charge without a class included (governord refunds it).
func WaitForRate() ChargeOption {
	return func(r *governorpb.ChargeAndAcquireRequest) { r.WaitForRate = true }
}

func (t *Task) chargeAndAcquire(ctx context.Context, class string, charges map[string]int64, write bool, opts []ChargeOption) (*Lease, error) {
	if err := t.alive(); err != nil {
		return nil, err
	}
	req := &governorpb.ChargeAndAcquireRequest{NodeId: t.id, Class: class, Charges: maps.Clone(charges), Write: write}
	for _, o := range opts {
		o(req)
	}
	var resp *governorpb.ChargeAndAcquireResponse
	err := t.c.grant(ctx, "ChargeAndAcquire", func(ctx context.Context, id string) error {
		req.RequestId = id
		var err error
		resp, err = t.c.rpc.ChargeAndAcquire(ctx, req)
		return err
	}, func(ctx context.Context, id string) error {
		_, err := t.c.rpc.ChargeAndAcquire(ctx, &governorpb.ChargeAndAcquireRequest{RequestId: id, NodeId: t.id,
			Class: class, Charges: req.GetCharges(), Abandon: true, Write: write, WaitForRate: req.GetWaitForRate()})
		return err
	})
	if err != nil {
		t.observe(err)
		return nil, err
	}
	if resp.GetLease() == nil {
		return nil, nil
	}
	return t.c.newLease(resp.GetLease()), nil
}

// Close ends the task and its subtasks normally. The server revokes their
// leases and fails their waiting acquires. The task's context is cancelled
// even if the server cannot be told, so no more work starts under it. Closing
// an ended task is not an error.
func (t *Task) Close() error { return t.finish("CloseNode", NodeClosed) }

// Cancel ends the task and its subtasks abnormally; otherwise it is Close.
func (t *Task) Cancel() error { return t.finish("CancelNode", NodeCancelled) }

func (t *Task) finish(op string, state NodeState) error {
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	err := t.c.call(ctx, op, func(ctx context.Context, id string) error {
		var err error
		if state == NodeCancelled {
			_, err = t.c.rpc.CancelNode(ctx, &governorpb.CancelNodeRequest{RequestId: id, NodeId: t.id})
		} else {
			_, err = t.c.rpc.CloseNode(ctx, &governorpb.CloseNodeRequest{RequestId: id, NodeId: t.id})
		}
		return err
	})
	t.observe(err)
	t.mu.Lock()
	t.closed = err == nil
	t.mu.Unlock()
	t.markEnded(&TaskEndedError{NodeID: t.id, NodeName: t.name, State: state})
	return err
}

// alive returns why the task can take no more work, without asking the
// server, or nil: the session ended, or the task or an ancestor ended or
// passed its deadline.
func (t *Task) alive() error {
	if err := t.c.Err(); err != nil {
		return fmt.Errorf("governor: task %q: %w", t.name, err)
	}
	now := time.Now()
	for n := t; n != nil; n = n.parent {
		n.mu.Lock()
		ended := n.ended
		n.mu.Unlock()
		if ended == nil && !n.deadline.IsZero() && !now.Before(n.deadline) {
			ended = n.expired()
		}
		if ended != nil {
			return fmt.Errorf("governor: task %q: %w", t.name, ended)
		}
	}
	return nil
}

// observe reacts to a call's error: if the server said that the task or an
// ancestor has ended, the task that ended, and with it every task below it
// here, is marked ended and its context cancelled.
func (t *Task) observe(err error) {
	var te *TaskEndedError
	if !errors.As(err, &te) {
		return
	}
	target := t
	for n := t; n != nil; n = n.parent {
		target = n
		if n.id == te.NodeID {
			break
		}
	}
	// If no task of ours is the one that ended, it lies above them all, so
	// the topmost one ended with it.
	target.markEnded(te)
}

func (t *Task) markEnded(why *TaskEndedError) {
	t.mu.Lock()
	if t.ended == nil {
		t.ended = why
	}
	t.mu.Unlock()
	t.cancel(why)
}

func (t *Task) expired() *TaskEndedError {
	return &TaskEndedError{NodeID: t.id, NodeName: t.name, State: NodeExpired}
}

// Lease is a slot of a lease class held on a task. Its id is a fencing
// token: ids only grow, so a downstream that remembers the highest id it has
// seen can refuse a holder whose lease has since ended.
type Lease struct {
	c     *Client
	id    int64
	node  int64
	class string
}

func (c *Client) newLease(p *governorpb.Lease) *Lease {
	return &Lease{c: c, id: p.GetId(), node: p.GetNodeId(), class: p.GetClass()}
}

// ID is the lease id, usable as a fencing token.
func (l *Lease) ID() int64 { return l.id }

// NodeID is the id of the task the lease is held on.
func (l *Lease) NodeID() int64 { return l.node }

// Class is the lease class.
func (l *Lease) Class() string { return l.class }

// Release frees the lease's slot and reports how the work went, for adaptive
// limits: latency is how long it took (0 for no sample), and overloaded says
// the downstream pushed back (HTTP 429 or 503, too many connections...). A
// second release is a no-op. A lease that expired or was revoked first
// returns a *LeaseEndedError: the work ran without cover.
func (l *Lease) Release(ctx context.Context, latency time.Duration, overloaded bool) error {
	req := &governorpb.ReleaseRequest{LeaseId: l.id, Overloaded: overloaded}
	if latency > 0 {
		req.Latency = durationpb.New(latency)
	}
	return l.c.giveBack(ctx, "Release", func(ctx context.Context, id string) error {
		req.RequestId = id
		_, err := l.c.rpc.Release(ctx, req)
		return err
	})
}

// Validate checks with the server that the lease is still held, before
// irreversible work. It returns a *LeaseEndedError if the lease ended in the
// last minute, and an error wrapping ErrNotFound if it ended earlier. The
// lease can still end just after Validate returns; a downstream that checks
// the fencing token itself closes that gap.
func (l *Lease) Validate(ctx context.Context) error {
	return l.c.call(ctx, "Validate", func(ctx context.Context, _ string) error {
		_, err := l.c.rpc.Validate(ctx, &governorpb.ValidateRequest{LeaseId: l.id})
		return err
	})
}
