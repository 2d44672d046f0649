package server

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/governor-project/governor/governor/engine"
)

// flights tracks requests by their request id while they matter to the
// server: a retry that races its first attempt waits for it and shares its
// answer, and a request its caller abandoned (it gave up without an answer
// and said so) grants nothing more. Once an attempt has replied, its event
// is durable and the engine's own request memory answers later retries.
type flights struct {
	mu     sync.Mutex
	calls  map[flightKey]*flight
	joined int // callers waiting on another's attempt right now

	// abandoned holds the request ids given up on in the last
	// abandonedFor, oldest first in abandonedOrder, at most maxAbandoned.
	abandoned      map[flightKey]time.Time
	abandonedOrder []flightKey
}

// How long, and how many, abandoned request ids are remembered. A copy of
// an abandoned request still on its way arrives within moments; the bound
// keeps a client that abandons without end from growing the server.
const (
	abandonedFor = time.Minute
	maxAbandoned = 1 << 16
)

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

// abandon notes that key's caller gave up on it.
func (f *flights) abandon(key flightKey, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.expire(now)
	if f.abandoned == nil {
		f.abandoned = make(map[flightKey]time.Time)
	}
	if _, ok := f.abandoned[key]; !ok {
		f.abandonedOrder = append(f.abandonedOrder, key)
	}
	f.abandoned[key] = now
	for len(f.abandonedOrder) > maxAbandoned {
		delete(f.abandoned, f.abandonedOrder[0])
		f.abandonedOrder = f.abandonedOrder[1:]
	}
}

// isAbandoned reports whether key's caller gave up on it.
func (f *flights) isAbandoned(key flightKey) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.abandoned[key]
	return ok
}

// forgetAbandoned forgets the abandoned ids older than abandonedFor,
// without waiting for the next abandon to (housekeeping.go).
func (f *flights) forgetAbandoned(now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.expire(now)
}

// expire forgets the abandoned ids older than abandonedFor. f.mu is held.
func (f *flights) expire(now time.Time) {
	i := 0
	for ; i < len(f.abandonedOrder); i++ {
		key := f.abandonedOrder[i]
		if now.Sub(f.abandoned[key]) < abandonedFor {
			break
		}
		delete(f.abandoned, key)
	}
	f.abandonedOrder = f.abandonedOrder[i:]
	if len(f.abandoned) == 0 {
		// A map keeps its room, and an emptied slice its array.
		f.abandoned, f.abandonedOrder = nil, nil
	}
}
