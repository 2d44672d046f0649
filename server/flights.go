package server

import (
	"context"
	"errors"
	"sync"

	"github.com/governor-project/governor/governor/engine"
)

// flights makes a retry that races its first attempt wait for it and share
// its answer. Once the first attempt has replied, its event is durable and
// the engine's own request memory answers later retries.
type flights struct {
	mu     sync.Mutex
	calls  map[flightKey]*flight
	joined int // callers waiting on another's attempt right now
}

type flightKey struct {
	session engine.SessionID
	request string
}

type flight struct {
	done chan struct{}
	val  any
	err  error
}

// waiting is how many callers wait on another caller's attempt.
func (f *flights) waiting() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.joined
}

// do runs fn once per key at a time. A caller that finds the key in flight
// waits for it; if that attempt ended only because its own caller went away,
// the waiter runs fn itself.
func (f *flights) do(ctx context.Context, key flightKey, fn func() (any, error)) (any, error) {
	for {
		f.mu.Lock()
		if f.calls == nil {
			f.calls = make(map[flightKey]*flight)
		}
		if c := f.calls[key]; c != nil {
			f.joined++
			f.mu.Unlock()
			var err error
			select {
			case <-c.done:
			case <-ctx.Done():
				err = ctx.Err()
			}
			f.mu.Lock()
			f.joined--
			f.mu.Unlock()
			if err != nil {
				return nil, err
			}
			if errors.Is(c.err, context.Canceled) || errors.Is(c.err, context.DeadlineExceeded) {
				continue
			}
			return c.val, c.err
		}
		c := &flight{done: make(chan struct{})}
		f.calls[key] = c
		f.mu.Unlock()
		c.val, c.err = fn()
		f.mu.Lock()
		delete(f.calls, key)
		f.mu.Unlock()
		close(c.done)
		return c.val, c.err
	}
}
