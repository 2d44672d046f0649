package governor_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"sync"
	"time"

	"github.com/governor-project/governor/governor"
)

// A task with a small budget, spent until governord refuses. Dial reads
// GOVERNOR_ADDR and GOVERNOR_API_KEY.
func Example() {
	ctx := context.Background()
	client, err := governor.Dial(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	// The context is cancelled when the task ends, for any reason.
	ctx, task, err := client.NewTask(ctx, governor.Spec{
		Name:     "example-report",
		Quotas:   map[string]int64{"llm_calls": 2},
		Deadline: time.Now().Add(time.Minute),
	})
	if err != nil {
		log.Fatal(err)
	}
	defer task.Close()

	for i := 1; i <= 3; i++ {
		err := task.Consume(ctx, "llm_calls", 1)
		var denial *governor.Denial
		switch {
		case errors.As(err, &denial):
			fmt.Printf("call %d denied: %s on %q is %d of %d\n", i, denial.Resource, denial.NodeName, denial.Used, denial.Limit)
		case err != nil:
			log.Fatal(err)
		default:
			fmt.Printf("call %d admitted\n", i)
		}
	}
	// Output:
	// call 1 admitted
	// call 2 admitted
	// call 3 denied: llm_calls on "example-report" is 2 of 2
}

// Every request made with the client is charged to the task in its context
// and holds an "http" lease until its body is closed.
func ExampleTransport() {
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "pong")
	}))
	defer origin.Close()

	ctx := context.Background()
	client, err := governor.Dial(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	ctx, task, err := client.NewTask(ctx, governor.Spec{
		Name:   "example-transport",
		Quotas: map[string]int64{"http": 1},
		Limits: map[string]int64{"http": 4},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer task.Close()

	httpClient := &http.Client{Transport: governor.Transport(origin.Client().Transport)}
	for range 2 {
		req, _ := http.NewRequestWithContext(ctx, "GET", origin.URL, nil)
		resp, err := httpClient.Do(req)
		if errors.Is(err, governor.ErrQuotaExhausted) {
			fmt.Println("denied: the http budget is spent")
			continue
		}
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.Status, string(body))
	}
	// Output:
	// 200 OK pong
	// denied: the http budget is spent
}

// Fan-out: each function is a subtask that waits for an "agents" lease, so
// no more than the task's agents limit run at once.
func ExampleNewGroup() {
	ctx := context.Background()
	client, err := governor.Dial(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	ctx, task, err := client.NewTask(ctx, governor.Spec{
		Name:   "example-crawl",
		Limits: map[string]int64{governor.ClassAgents: 2},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer task.Close()

	var (
		mu              sync.Mutex
		running, most   int
		pages, finished = []string{"/a", "/b", "/c", "/d", "/e"}, 0
	)
	g, ctx := governor.NewGroup(ctx, governor.ClassAgents)
	for _, page := range pages {
		g.Go(governor.Spec{Name: page}, func(ctx context.Context) error {
			mu.Lock()
			running++
			most = max(most, running)
			mu.Unlock()
			time.Sleep(10 * time.Millisecond) // the work
			mu.Lock()
			running--
			finished++
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("crawled %d pages, never more than 2 at once: %v\n", finished, most <= 2)
	// Output:
	// crawled 5 pages, never more than 2 at once: true
}

// Retries draw on the task's "retry" budget; the first attempt is free. This
// tenant gives each task retry: 3 by default, so a call that keeps failing
// is tried four times and then its last error is returned.
func ExampleRetry() {
	ctx := context.Background()
	client, err := governor.Dial(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	ctx, task, err := client.NewTask(ctx, governor.Spec{Name: "example-retry"})
	if err != nil {
		log.Fatal(err)
	}
	defer task.Close()

	attempts := 0
	err = governor.Retry(ctx, func(ctx context.Context) error {
		attempts++
		return errors.New("payment provider timed out")
	}, governor.WithBackoff(time.Millisecond, 10*time.Millisecond))
	fmt.Println("attempts:", attempts)
	fmt.Println("budget spent:", errors.Is(err, governor.ErrQuotaExhausted))
	// Output:
	// attempts: 4
	// budget spent: true
}

// A lease is one slot of a concurrency limit. Its id is a fencing token.
func ExampleTask_Acquire() {
	ctx := context.Background()
	client, err := governor.Dial(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	ctx, task, err := client.NewTask(ctx, governor.Spec{Name: "example-lease"})
	if err != nil {
		log.Fatal(err)
	}
	defer task.Close()

	lease, err := task.Acquire(ctx, "db")
	if err != nil {
		log.Fatal(err)
	}
	start := time.Now()
	// ... the database work, passing lease.ID() along as a fencing token ...
	if err := lease.Release(ctx, time.Since(start), false); err != nil {
		log.Fatal(err)
	}
	err = lease.Validate(ctx)
	var ended *governor.LeaseEndedError
	if errors.As(err, &ended) {
		fmt.Println("lease", ended.Reason)
	}
	// Output:
	// lease released
}
