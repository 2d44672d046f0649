package pgwire

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/governor-project/governor/governor"
)

// releaseTimeout bounds a lease's release after a transaction.
const releaseTimeout = 5 * time.Second

// TaskAdmitter is the Admitter for a worker's task, through the Go SDK:
// each transaction's lease and charges are taken on Task, or on a subtask
// of it when Tx.Subtask is set.
type TaskAdmitter struct {
	Task *governor.Task
	// NewSubtask creates the subtask called name under Task. Nil: Tx.Subtask
	// is ignored and everything is charged to Task. Subtasks are created
	// once per name and kept.
	NewSubtask func(ctx context.Context, name string) (*governor.Task, error)

	mu       sync.Mutex
	subtasks map[string]*governor.Task
}

// BeginTx takes tx.Class's lease and tx.Charges in one step.
func (a *TaskAdmitter) BeginTx(ctx context.Context, tx Tx) (Ticket, error) {
	task, err := a.task(ctx, tx.Subtask)
	if err != nil {
		return nil, sdkDenial(err)
	}
	lease, err := task.ChargeAndAcquire(ctx, tx.Class, tx.Charges)
	if err != nil {
		return nil, sdkDenial(err)
	}
	if lease == nil {
		return nil, nil
	}
	return leaseTicket{lease}, nil
}

// Charge charges all of charges or none.
func (a *TaskAdmitter) Charge(ctx context.Context, tx Tx, charges map[string]int64) error {
	task, err := a.task(ctx, tx.Subtask)
	if err != nil {
		return sdkDenial(err)
	}
	if _, err := task.ChargeAndAcquire(ctx, "", charges); err != nil {
		return sdkDenial(err)
	}
	return nil
}

func (a *TaskAdmitter) task(ctx context.Context, name string) (*governor.Task, error) {
	if name == "" || a.NewSubtask == nil {
		return a.Task, nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if t := a.subtasks[name]; t != nil {
		return t, nil
	}
	t, err := a.NewSubtask(ctx, name)
	if err != nil {
		return nil, err
	}
	if a.subtasks == nil {
		a.subtasks = make(map[string]*governor.Task)
	}
	a.subtasks[name] = t
	return t, nil
}

type leaseTicket struct{ l *governor.Lease }

func (t leaseTicket) End(latency time.Duration, overloaded bool) {
	ctx, stop := context.WithTimeout(context.Background(), releaseTimeout)
	defer stop()
	// A failed release is the server's business now: the lease expires
	// with the session, and an error here cannot reach any client.
	_ = t.l.Release(ctx, latency, overloaded)
}

// sdkDenial maps the SDK's errors to the SQLSTATEs of DESIGN.md. A plain
// deadline is left alone: the proxy reports it as a wait timeout.
func sdkDenial(err error) error {
	var d *governor.Denial
	switch {
	case errors.As(err, &d):
		return &Denial{Code: SQLStateQuota, Message: "governor: " + d.Error(), Err: err}
	case errors.Is(err, governor.ErrTaskEnded):
		return &Denial{Code: SQLStateTaskEnded, Message: "governor: " + err.Error(), Err: fmt.Errorf("%w: %w", errTaskEnded, err)}
	case errors.Is(err, governor.ErrUnavailable), errors.Is(err, governor.ErrSessionLost), errors.Is(err, governor.ErrClosed):
		return &Denial{Code: SQLStateUnavailable, Message: "governor: governord unavailable, new work is denied: " + err.Error(), Err: err}
	case errors.Is(err, context.DeadlineExceeded):
		return err
	}
	return &Denial{Code: SQLStateUnavailable, Message: "governor: " + err.Error(), Err: err}
}
