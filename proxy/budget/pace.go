package budget

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/internal/retry"
	"github.com/governor-project/governor/proxy/admission"
)

// Pacing. Work that a rate refuses is held until the rate has room, within
// its wait timeout (the deadline of its ctx), rather than refused at once:
// a client that does not retry sees a slower answer, not a 429. Within the
// sidecar, work waiting on the same subtask and resource is served in
// arrival order: only the oldest (the head) asks governord again, and the
// rest wait behind it, so that none starves while newer work gets through.
// The head asks with the charge waiting for the rate at governord, within
// what is left of its wait timeout, so that governord grants the rate's
// tokens to the tenants' heads in weighted round robin (rather than to
// whichever sidecar retries first); a governord that refuses it anyway is
// asked again once the refusal's RetryAfter has passed. Work is refused
// for rate (with the wait it would need as Retry-After) at once when that
// wait cannot fit in what is left of its wait timeout, and when its wait
// timeout passes in the queue. A cancelled waiter (its client gone)
// leaves the queue. A rule with on_rate: deny (Request.DenyRate) is not
// paced.

// paceKey names a queue: work on one subtask ("" is the task) waiting for
// room in the rates of one resource.
type paceKey struct{ subtask, resource string }

// pacer holds the queues of work refused for a rate.
type pacer struct {
	m *Metrics
	// now and sleep are the clock; nil: the wall clock and a timer.
	now   func() time.Time
	sleep func(ctx context.Context, d time.Duration) error

	mu     sync.Mutex
	queues map[paceKey]*paceQueue
}

// paceQueue is one queue, oldest first: waiters[0] is the head.
type paceQueue struct {
	waiters []*paceWaiter
	last    governor.RateLimitedError // the latest refusal of its head
	lastAt  time.Time                 // when it came
}

type paceWaiter struct {
	amount int64         // what it charges of the resource
	turn   chan struct{} // closed when it becomes the head
}

func (p *pacer) clock() time.Time {
	if p.now != nil {
		return p.now()
	}
	return time.Now()
}

func (p *pacer) wait(ctx context.Context, d time.Duration) error {
	if p.sleep != nil {
		return p.sleep(ctx, d)
	}
	return retry.Sleep(ctx, d)
}

// admit runs try, which admits r (waiting at governord for a rate that
// refuses it when asked to), pacing it while a rate refuses it. Work that
// arrives while a queue of its subtask and a resource it charges is
// waiting joins that queue without trying, so as not to pass it.
func (p *pacer) admit(ctx context.Context, r admission.Request, try func(waitRate bool) error) error {
	if r.DenyRate || r.Spent || len(r.Charges) == 0 {
		return try(false)
	}
	key, queued := p.queued(r)
	var first *governor.RateLimitedError
	if !queued {
		err := try(false)
		if !errors.As(err, &first) {
			return err
		}
		key = paceKey{r.Subtask, first.Resource}
	}
	w, est := p.join(key, r.Charges[key.resource], first)
	if !p.fits(ctx, est.RetryAfter) {
		p.leave(key, w)
		p.m.paced(key.resource, "refused", 0)
		return est
	}
	began := p.clock()
	err := p.paced(ctx, key, w, try)
	p.m.paced(key.resource, paceStatus(err), p.clock().Sub(began))
	return err
}

// paceStatus is how paced work ended, for the metrics' status label.
func paceStatus(err error) string {
	var rl *governor.RateLimitedError
	switch {
	case err == nil:
		return "admitted"
	case errors.As(err, &rl):
		return "refused"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	return "denied"
}

// queued returns the queue r must join: of its subtask and the first
// resource it charges (in name order) that has work waiting.
func (p *pacer) queued(r admission.Request) (paceKey, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.queues) == 0 {
		return paceKey{}, false
	}
	for _, res := range slices.Sorted(maps.Keys(r.Charges)) {
		if k := (paceKey{r.Subtask, res}); p.queues[k] != nil {
			return k, true
		}
	}
	return paceKey{}, false
}

// join puts a waiter at the tail of key's queue (creating it with the
// refusal that starts it) and returns it with the refusal it stands
// behind: the head's, with RetryAfter the least the new waiter must wait
// (what is left of the head's wait, and then the time the rate takes to
// refill what the waiters between charge, and its own amount). The rate
// may be shared with other sidecars, so it may have to wait longer.
func (p *pacer) join(key paceKey, amount int64, refusal *governor.RateLimitedError) (*paceWaiter, *governor.RateLimitedError) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.queues == nil {
		p.queues = map[paceKey]*paceQueue{}
	}
	now := p.clock()
	q := p.queues[key]
	if q == nil {
		q = &paceQueue{}
		p.queues[key] = q
	}
	if refusal != nil && (len(q.waiters) == 0 || q.lastAt.IsZero()) {
		q.last, q.lastAt = *refusal, now
	}
	w := &paceWaiter{amount: amount, turn: make(chan struct{})}
	q.waiters = append(q.waiters, w)
	est := q.refusal(now, w)
	if q.waiters[0] == w {
		close(w.turn)
	}
	return w, est
}

// refusal is the rate refusal waiter w stands behind at now: the head's
// last one, with what is left of its wait and the refill of what the
// waiters after the head, up to w, charge.
func (q *paceQueue) refusal(now time.Time, w *paceWaiter) *governor.RateLimitedError {
	r := q.last
	r.RetryAfter = max(0, r.RetryAfter-now.Sub(q.lastAt))
	r.Amount = w.amount
	var behind int64
	for _, o := range q.waiters[1:] {
		behind += o.amount
		if o == w {
			break
		}
	}
	if q.waiters[0] != w && r.Units > 0 && r.Per > 0 {
		r.RetryAfter += refill(behind, r.Units, r.Per)
	}
	return &r
}

// refill is how long a rate of units per per takes to give amount units,
// saturated rather than wrapped.
func refill(amount, units int64, per time.Duration) time.Duration {
	const most = time.Duration(1<<63 - 1)
	if amount <= 0 {
		return 0
	}
	d := float64(amount) * float64(per) / float64(units)
	if d >= float64(most) {
		return most
	}
	return time.Duration(d)
}

// fits says whether a wait of d fits before ctx's deadline.
func (p *pacer) fits(ctx context.Context, d time.Duration) bool {
	deadline, ok := ctx.Deadline()
	return !ok || deadline.Sub(p.clock()) >= d
}

// paced waits for w's turn, then, as the head, asks with the charge
// waiting for the rate at governord, until it is admitted, refused for
// something else, or ctx cannot wait for the rate any longer. A refusal
// for rate all the same (a governord that does not wait) is waited out
// here, and asked again.
func (p *pacer) paced(ctx context.Context, key paceKey, w *paceWaiter, try func(waitRate bool) error) error {
	defer p.leave(key, w)
	select {
	case <-w.turn:
	case <-ctx.Done():
		return p.gaveUp(ctx, key, w)
	}
	for {
		if est := p.refusalFor(key, w); !p.fits(ctx, est.RetryAfter) {
			return est
		}
		err := try(true)
		var rl *governor.RateLimitedError
		if !errors.As(err, &rl) {
			if err != nil && ctx.Err() != nil {
				return p.gaveUp(ctx, key, w) // the wait at governord ran out
			}
			return err
		}
		p.refused(key, rl)
		if err := p.wait(ctx, rl.RetryAfter); err != nil {
			return p.gaveUp(ctx, key, w)
		}
	}
}

// gaveUp is what paced work whose ctx ended gets: a rate refusal when its
// wait timeout passed (the wait it would still need as RetryAfter), the
// ctx's error when its client went away.
func (p *pacer) gaveUp(ctx context.Context, key paceKey, w *paceWaiter) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return p.refusalFor(key, w)
	}
	return ctx.Err()
}

func (p *pacer) refusalFor(key paceKey, w *paceWaiter) *governor.RateLimitedError {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.queues[key].refusal(p.clock(), w)
}

// refused notes the head's latest refusal.
func (p *pacer) refused(key paceKey, rl *governor.RateLimitedError) {
	p.mu.Lock()
	defer p.mu.Unlock()
	q := p.queues[key]
	q.last, q.lastAt = *rl, p.clock()
}

// leave takes w out of key's queue; the next waiter becomes the head when
// w was, and an empty queue is dropped.
func (p *pacer) leave(key paceKey, w *paceWaiter) {
	p.mu.Lock()
	defer p.mu.Unlock()
	q := p.queues[key]
	i := slices.Index(q.waiters, w)
	if i < 0 {
		return
	}
	q.waiters = slices.Delete(q.waiters, i, i+1)
	switch {
	case len(q.waiters) == 0:
		delete(p.queues, key)
	case i == 0:
		close(q.waiters[0].turn)
	}
}

// waiting is how many requests wait in key's queue.
func (p *pacer) waiting(key paceKey) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if q := p.queues[key]; q != nil {
		return len(q.waiters)
	}
	return 0
}
