package engine

import (
	"sync/atomic"
	"time"
)

// fakeClock is a Clock that moves only when told to.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}

func (c *fakeClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// recorder keeps every event it is given.
type recorder struct{ events []Event }

func (r *recorder) Emit(ev Event) { r.events = append(r.events, ev) }

// sinks fans events out to several sinks, in order.
type sinks []Sink

func (s sinks) Emit(ev Event) {
	for _, k := range s {
		k.Emit(ev)
	}
}
