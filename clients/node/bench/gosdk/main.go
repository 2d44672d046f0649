// Command gosdk measures acquire+release round trips per second through the
// Go SDK, for comparison with the Node.js client in the same run
// (clients/node/bench/bench.js starts governord and runs both).
//
//	gosdk -addr 127.0.0.1:7600 -key KEY -callers 64 -duration 5s
//
// It prints one JSON line: {"callers":64,"ops":N,"seconds":S,"per_second":R}.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/governor-project/governor/governor"
)

func main() {
	addr := flag.String("addr", governor.DefaultAddr, "governord's address")
	key := flag.String("key", "", "the tenant's API key")
	callers := flag.Int("callers", 1, "concurrent callers")
	duration := flag.Duration("duration", 5*time.Second, "how long to measure")
	warmup := flag.Duration("warmup", time.Second, "how long to run before measuring")
	flag.Parse()
	if *callers < 1 || *duration <= 0 || *key == "" {
		fmt.Fprintln(os.Stderr, "gosdk: want -key, -callers >= 1 and a positive -duration")
		os.Exit(2)
	}
	if err := run(*addr, *key, *callers, *warmup, *duration); err != nil {
		fmt.Fprintln(os.Stderr, "gosdk:", err)
		os.Exit(1)
	}
}

func run(addr, key string, callers int, warmup, duration time.Duration) error {
	ctx := context.Background()
	client, err := governor.Dial(ctx, governor.WithAddr(addr), governor.WithAPIKey(key))
	if err != nil {
		return err
	}
	defer client.Close()
	_, task, err := client.NewTask(ctx, governor.Spec{})
	if err != nil {
		return err
	}
	defer task.Close()

	var ops atomic.Int64
	var measuring atomic.Bool
	var failure error
	var once sync.Once
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				lease, err := task.Acquire(ctx, "bench")
				if err == nil {
					err = lease.Release(ctx, 0, false)
				}
				if err != nil {
					once.Do(func() { failure = err })
					return
				}
				if measuring.Load() {
					ops.Add(1)
				}
			}
		}()
	}
	time.Sleep(warmup)
	measuring.Store(true)
	began := time.Now()
	time.Sleep(duration)
	measuring.Store(false)
	elapsed := time.Since(began)
	close(stop)
	wg.Wait()
	if failure != nil {
		return failure
	}
	n := ops.Load()
	return json.NewEncoder(os.Stdout).Encode(map[string]any{
		"callers": callers, "ops": n, "seconds": elapsed.Seconds(), "per_second": float64(n) / elapsed.Seconds(),
	})
}
