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
	mu    sync.Mutex
	calls map[flightKey]*flight
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
			f.mu.Unlock()
			select {
			case <-c.done:
			case <-ctx.Done():
				return nil, ctx.Err()
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
