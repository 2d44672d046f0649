// Command quickstart uses the Go SDK against a running governord: it creates
// a task with a small quota, spends it until governord says no and prints
// why, then takes and releases a lease.
//
// Start governord, then point this program at it with the tenant's key:
//
//	PAYMENTS_KEY=pay-secret governord -config governor.example.yaml
//	GOVERNOR_API_KEY=pay-secret go run ./examples/quickstart
//
// GOVERNOR_ADDR defaults to 127.0.0.1:7600, where the example config listens.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"time"

	"github.com/governor-project/governor/governor"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	client, err := governor.Dial(ctx)
	if err != nil {
		return err
	}
	defer client.Close()
	fmt.Printf("session open: tenant node %d, TTL %v\n", client.ScopeID(), client.TTL())

	// The task's context is cancelled when the task ends for any reason, so
	// work started under it stops with it.
	ctx, task, err := client.NewTask(ctx, governor.Spec{
		Name:     fmt.Sprintf("quickstart-%d", os.Getpid()),
		Quotas:   map[string]int64{"calls": 3},
		Deadline: time.Now().Add(time.Minute),
	})
	if err != nil {
		return err
	}
	defer task.Close()
	fmt.Printf("task %q is node %d, with a budget of 3 calls\n", task.Name(), task.ID())

	// Spend the budget one call at a time until governord refuses.
	for i := 1; ; i++ {
		err := task.Consume(ctx, "calls", 1)
		var denial *governor.Denial
		if errors.As(err, &denial) {
			fmt.Printf("call %d denied: %s is spent on %q (%d of %d used)\n",
				i, denial.Resource, denial.NodeName, denial.Used, denial.Limit)
			break
		}
		if err != nil {
			return err
		}
		fmt.Printf("call %d admitted\n", i)
	}

	// A lease is one slot of a concurrency limit; the example config caps
	// "db" at 40 for everyone. Its id is a fencing token.
	lease, err := task.Acquire(ctx, "db")
	if err != nil {
		return err
	}
	fmt.Printf("holding db lease %d\n", lease.ID())
	start := time.Now()
	if err := lease.Validate(ctx); err != nil {
		return err
	}
	if err := lease.Release(ctx, time.Since(start), false); err != nil {
		return err
	}
	fmt.Println("released the lease")

	if err := task.Close(); err != nil {
		return err
	}
	fmt.Println("task closed")
	return client.Close()
}
