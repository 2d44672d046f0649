package governor

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Group runs functions as subtasks of one task, each holding a lease of one
// class while it runs, so the class's limits bound how many run at once. Like
// errgroup, the first error cancels the group's context and is what Wait
// returns.
type Group struct {
	class  string
	parent *Task
	// ctx is the group's context, which every subtask's context derives from.
	// It is stored because Go's functions receive a context made from it, as
	// errgroup.WithContext's goroutines share the context it returned.
	ctx    context.Context
	cancel context.CancelCauseFunc

	wg      sync.WaitGroup
	errOnce sync.Once
	err     error
}

// NewGroup returns a group whose functions run as subtasks of the task ctx
// carries, each under a lease of class, and a context that is cancelled when
// a function fails or Wait returns. If ctx carries no task, nothing runs and
// Wait returns an error wrapping ErrNoTask.
func NewGroup(ctx context.Context, class string) (*Group, context.Context) {
	gctx, cancel := context.WithCancelCause(ctx)
	g := &Group{class: class, parent: TaskFromContext(ctx), ctx: gctx, cancel: cancel}
	if g.parent == nil {
		g.fail(fmt.Errorf("governor: NewGroup: %w", ErrNoTask))
	}
	return g, gctx
}

// Go runs fn in a new goroutine as a subtask created from spec (its Name
// must be unique among the task's open subtasks; leave it empty for a random
// one). The subtask
// first waits for a lease of the group's class; fn gets the subtask's
// context. When fn returns, the lease is released (reporting fn's duration
// as its latency) and the subtask is closed. An error from any of these
// steps fails the group.
func (g *Group) Go(spec Spec, fn func(ctx context.Context) error) {
	if g.parent == nil {
		return
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		if err := g.run(spec, fn); err != nil {
			g.fail(err)
		}
	}()
}

func (g *Group) run(spec Spec, fn func(ctx context.Context) error) error {
	if err := context.Cause(g.ctx); err != nil {
		return err // the group already failed; start nothing new
	}
	ctx, task, err := g.parent.c.NewTask(g.ctx, spec)
	if err != nil {
		return err
	}
	lease, err := task.Acquire(ctx, g.class)
	if err != nil {
		return errors.Join(err, task.Close())
	}
	start := time.Now()
	ferr := fn(ctx)
	rerr := release(ctx, lease, time.Since(start), false)
	return errors.Join(ferr, rerr, task.Close())
}

func (g *Group) fail(err error) {
	g.errOnce.Do(func() {
		g.err = err
		g.cancel(err)
	})
}

// Wait waits for every function started with Go, then returns the first
// error, if any.
func (g *Group) Wait() error {
	g.wg.Wait()
	g.cancel(context.Canceled)
	return g.err
}
