package budget

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/proxy/admission"
)

// fakeRate is a rate of one unit per tick with no unit in hand, on a fake
// clock that only the test moves, and a pacer whose sleeps the test lets
// go one at a time.
type fakeRate struct {
	t    *testing.T
	tick time.Duration

	mu     sync.Mutex
	now    time.Time
	next   time.Time // when the next unit is there
	order  []string  // who was admitted, in order
	tries  map[string]int
	sleeps chan time.Duration
	wake   chan struct{}
}

func newFakeRate(t *testing.T) (*fakeRate, *pacer) {
	now := time.Now()
	f := &fakeRate{t: t, tick: 100 * time.Millisecond, now: now, next: now.Add(100 * time.Millisecond),
		tries: map[string]int{}, sleeps: make(chan time.Duration), wake: make(chan struct{})}
	p := &pacer{m: NewMetrics(), now: f.clock, sleep: f.sleep}
	return f, p
}

func (f *fakeRate) clock() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// sleep reports the wait asked and blocks until the test wakes it; the
// clock has then moved by the wait.
func (f *fakeRate) sleep(ctx context.Context, d time.Duration) error {
	select {
	case f.sleeps <- d:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-f.wake:
		f.mu.Lock()
		f.now = f.now.Add(d)
		f.mu.Unlock()
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// try is an admission of who against the rate.
func (f *fakeRate) try(who string) func(bool) error {
	return func(bool) error {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.tries[who]++
		if f.now.Before(f.next) {
			return &governor.RateLimitedError{Resource: "calls", Units: 1, Per: f.tick, Amount: 1, RetryAfter: f.next.Sub(f.now)}
		}
		f.next = f.now.Add(f.tick)
		f.order = append(f.order, who)
		return nil
	}
}

func (f *fakeRate) triesOf(who string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tries[who]
}

var calls = admission.Request{Charges: map[string]int64{"calls": 1}}

// waitFor polls cond, the signal that a goroutine got where the test needs
// it, rather than sleeping for it.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestPacingServesInArrivalOrder: work a rate refuses waits in one queue
// per subtask and resource, served oldest first; only the head asks again
// (after the refusal's RetryAfter), work that arrives while others wait
// joins the tail without asking, and a waiter whose client goes away
// leaves the queue without holding up the rest.
func TestPacingServesInArrivalOrder(t *testing.T) {
	f, p := newFakeRate(t)
	key := paceKey{"", "calls"}
	results := make(chan error, 8)
	admit := func(ctx context.Context, who string) {
		go func() { results <- p.admit(ctx, calls, f.try(who)) }()
	}
	admit(context.Background(), "a")
	if d := <-f.sleeps; d != 100*time.Millisecond {
		t.Fatalf("the head waits %v, want the refusal's RetryAfter of 100ms", d)
	}
	admit(context.Background(), "b")
	waitFor(t, "b queues", func() bool { return p.waiting(key) == 2 })
	gone, leave := context.WithCancel(context.Background())
	admit(gone, "gone")
	waitFor(t, "gone queues", func() bool { return p.waiting(key) == 3 })
	admit(context.Background(), "c")
	waitFor(t, "c queues", func() bool { return p.waiting(key) == 4 })
	leave()
	if err := <-results; !errors.Is(err, context.Canceled) {
		t.Fatalf("a waiter whose client went away got %v, want context.Canceled", err)
	}
	waitFor(t, "gone leaves", func() bool { return p.waiting(key) == 3 })
	for _, who := range []string{"b", "c", "gone"} {
		if n := f.triesOf(who); n != 0 {
			t.Errorf("%s asked %d times while it queued behind the head, want 0", who, n)
		}
	}
	for range 2 {
		f.wake <- struct{}{} // the head asks again, is admitted; the next is refused and sleeps
		<-f.sleeps
	}
	f.wake <- struct{}{}
	for range 3 {
		if err := <-results; err != nil {
			t.Fatalf("paced work got %v, want admitted", err)
		}
	}
	if got := f.order; len(got) != 3 || got[0] != "a" || got[1] != "b" || got[2] != "c" {
		t.Errorf("admitted in order %v, want [a b c]", got)
	}
	if p.waiting(key) != 0 || len(p.queues) != 0 {
		t.Errorf("%d queues left after every waiter was served", len(p.queues))
	}
}

// TestPacingRefusesAWaitThatCannotFit: work whose wait for the rate is
// longer than what is left of its wait timeout is refused for rate at once,
// without sleeping, with the wait it would need; so is work that would
// queue behind others for longer than it may wait.
func TestPacingRefusesAWaitThatCannotFit(t *testing.T) {
	f, p := newFakeRate(t)
	ctx, cancel := context.WithDeadline(context.Background(), f.clock().Add(50*time.Millisecond+time.Hour))
	defer cancel()
	// The clock's deadline is an hour and 50ms away: move the rate so that
	// the first unit is two hours away.
	f.next = f.clock().Add(2 * time.Hour)
	err := p.admit(ctx, calls, f.try("far"))
	var rl *governor.RateLimitedError
	if !errors.As(err, &rl) || rl.RetryAfter != 2*time.Hour {
		t.Fatalf("got %v, want a rate refusal with RetryAfter 2h", err)
	}
	if n := f.triesOf("far"); n != 1 {
		t.Errorf("asked %d times, want once", n)
	}

	// A head waits 100ms; work behind it needs 200ms (the head's unit,
	// then its own) and may wait 150ms.
	f.next = f.clock().Add(100 * time.Millisecond)
	head := make(chan error, 1)
	go func() { head <- p.admit(context.Background(), calls, f.try("head")) }()
	<-f.sleeps
	short, cancel2 := context.WithDeadline(context.Background(), f.clock().Add(150*time.Millisecond))
	defer cancel2()
	err = p.admit(short, calls, f.try("behind"))
	if !errors.As(err, &rl) || rl.RetryAfter != 200*time.Millisecond {
		t.Fatalf("work behind the head got %v, want a rate refusal with RetryAfter 200ms", err)
	}
	if n := f.triesOf("behind"); n != 0 {
		t.Errorf("work behind the head asked %d times, want 0", n)
	}
	f.wake <- struct{}{}
	if err := <-head; err != nil {
		t.Fatalf("the head got %v, want admitted", err)
	}
}

// TestPacingDenyRefusesAtOnce: on_rate: deny (DenyRate) is not paced.
func TestPacingDenyRefusesAtOnce(t *testing.T) {
	f, p := newFakeRate(t)
	r := calls
	r.DenyRate = true
	err := p.admit(context.Background(), r, f.try("deny"))
	var rl *governor.RateLimitedError
	if !errors.As(err, &rl) {
		t.Fatalf("got %v, want the rate refusal at once", err)
	}
	if len(p.queues) != 0 {
		t.Errorf("on_rate: deny left a queue")
	}
}

// TestPacingWaitTimeoutInQueue: work whose wait timeout passes while it
// queues (its estimate fitted, but the rate is shared with other sidecars
// and the head is held up) is refused for rate, not as a wait timeout; a
// waiter whose client goes away gets context.Canceled.
func TestPacingWaitTimeoutInQueue(t *testing.T) {
	f, p := newFakeRate(t)
	p.now = nil                // the wall clock, so that real deadlines pass
	held := func(bool) error { // the head's rate stays 10ms from room until woken
		return &governor.RateLimitedError{Resource: "calls", Units: 1, Per: 10 * time.Millisecond, Amount: 1, RetryAfter: 10 * time.Millisecond}
	}
	woken := false
	head := make(chan error, 1)
	go func() {
		head <- p.admit(context.Background(), calls, func(bool) error {
			if woken {
				return nil
			}
			return held(false)
		})
	}()
	<-f.sleeps
	key := paceKey{"", "calls"}
	queued := make(chan error, 1)
	gone, leave := context.WithCancel(context.Background())
	go func() { queued <- p.admit(gone, calls, held) }()
	waitFor(t, "it queues", func() bool { return p.waiting(key) == 2 })
	leave()
	if err := <-queued; !errors.Is(err, context.Canceled) {
		t.Fatalf("a waiter whose client went away got %v, want context.Canceled", err)
	}
	ctx, cancel := admission.WithWaitTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	go func() { queued <- p.admit(ctx, calls, held) }()
	err := <-queued
	var rl *governor.RateLimitedError
	if !errors.As(err, &rl) {
		t.Fatalf("got %v, want a rate refusal when the wait timeout passed in the queue", err)
	}
	if d := admission.Deny(ctx, err, "", 50*time.Millisecond); d.Cause != admission.CauseRate {
		t.Errorf("denied as %v, want rate", d.Cause)
	}
	woken = true
	f.wake <- struct{}{}
	if err := <-head; err != nil {
		t.Fatalf("the head got %v", err)
	}
}
