package budget

import (
	"errors"
	"math"
	"math/bits"
	"time"

	"github.com/governor-project/governor/governor"
)

// A slice of a rate. While nobody contends for a rate, governord answers a
// top-up of the resource with units and a slice of the rate's refill
// (governor.RateSlice): work is then admitted from a local bucket at the
// slice's rate, spending the reserved units, with no call, until the
// slice's term (counted from before the top-up was sent, so that the
// sidecar stops first). Each top-up while it lives renews it, when
// governord still sees no contention. Work the local bucket cannot take
// now is charged at governord per request, as when no slice is held, and
// a refusal there waits no longer than the local bucket needs (pacing).
// Once the term passes unrenewed, the resource is charged per request and
// the next top-up asks again. An idle reservation gives its slice back
// with its units, and so do a recall and a shutdown. What a request took
// from the local bucket is not put back when its work is then refused (a
// slot, a write): the slice may have been replaced meanwhile, and a unit
// lost only slows the sidecar down.

// localSlice is the sidecar's bucket for a slice: refilled exactly, in
// unit-nanoseconds, as governord's buckets are, so that it never admits
// more than units·t/per + burst.
type localSlice struct {
	id    uint64
	units int64 // per per
	per   int64 // ns
	burst int64
	until time.Time     // its term ends here (local clock, conservative)
	term  time.Duration // as the last answer gave it

	level int64     // whole units at stamp
	acc   int64     // credit toward the next unit, unit-ns, in [0, per)
	stamp time.Time // refill credited up to here
}

// maxSliceTerm bounds the term a slice is trusted for, whatever an answer
// says: governord's is 4 s.
const maxSliceTerm = time.Minute

func newLocalSlice(s *governor.RateSlice, sent time.Time) *localSlice {
	term := min(s.Term, maxSliceTerm)
	return &localSlice{id: s.ID, units: s.Units, per: int64(s.Per), burst: s.Burst, level: s.Burst, stamp: sent,
		until: sent.Add(term), term: term}
}

// lives reports whether the slice may admit at now.
func (l *localSlice) lives(now time.Time) bool { return l != nil && now.Before(l.until) }

// refill credits the bucket up to now.
func (l *localSlice) refill(now time.Time) {
	if !now.After(l.stamp) {
		return
	}
	el := uint64(now.Sub(l.stamp))
	l.stamp = now
	if l.level >= l.burst {
		l.level, l.acc = l.burst, 0
		return
	}
	hi, lo := bits.Mul64(el, uint64(l.units))
	var c uint64
	lo, c = bits.Add64(lo, uint64(l.acc), 0)
	hi += c
	if hi >= uint64(l.per) {
		l.level, l.acc = l.burst, 0
		return
	}
	q, rem := bits.Div64(hi, lo, uint64(l.per))
	if q >= uint64(l.burst-l.level) {
		l.level, l.acc = l.burst, 0
		return
	}
	l.level += int64(q)
	l.acc = int64(rem)
}

// take takes amount from the bucket at now when it holds that much.
func (l *localSlice) take(amount int64, now time.Time) bool {
	l.refill(now)
	if l.level < amount {
		return false
	}
	l.level -= amount
	return true
}

// wait is how long from now until the bucket holds amount, or false when
// it never will before the slice's term ends (or cannot hold it at all).
func (l *localSlice) wait(amount int64, now time.Time) (time.Duration, bool) {
	l.refill(now)
	if amount > l.burst {
		return 0, false
	}
	if l.level >= amount {
		return 0, true
	}
	hi, lo := bits.Mul64(uint64(amount-l.level), uint64(l.per))
	var c uint64
	lo, c = bits.Sub64(lo, uint64(l.acc), 0)
	hi -= c
	lo, c = bits.Add64(lo, uint64(l.units)-1, 0)
	hi += c
	if hi >= uint64(l.units) {
		return 0, false
	}
	q, _ := bits.Div64(hi, lo, uint64(l.units))
	if q > math.MaxInt64 {
		return 0, false
	}
	d := time.Duration(q)
	return d, now.Add(d).Before(l.until)
}

// learnSlice acts on a top-up's slice, asked at sent: the same slice is
// renewed (its bucket kept), another replaces it with a full bucket.
// q.mu is held.
func (q *reservation) learnSlice(s *governor.RateSlice, sent time.Time) {
	q.ratedUntil = time.Time{}
	if q.slice != nil && q.slice.id == s.ID {
		term := min(s.Term, maxSliceTerm)
		q.slice.until, q.slice.term = sent.Add(term), term
		return
	}
	q.slice = newLocalSlice(s, sent)
}

// sliceTakeLocked takes amount from the live slice's bucket; false when
// there is no live slice, or it does not hold amount now: the request is
// then charged per request. q.mu is held.
func (q *reservation) sliceTakeLocked(amount int64, now time.Time) bool {
	if !q.slice.lives(now) || !q.slice.take(amount, now) {
		return false
	}
	q.n.s.a.m.sliceAdmitted.Inc()
	return true
}

// sliceWait is how long until the live slice's bucket holds amount, when
// that comes before its term ends.
func (q *reservation) sliceWait(amount int64) (time.Duration, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := time.Now()
	if !q.slice.lives(now) {
		return 0, false
	}
	return q.slice.wait(amount, now)
}

// renewDueLocked says whether a top-up should go out now to renew the
// slice: past half its term. q.mu is held.
func (q *reservation) renewDueLocked(now time.Time) bool {
	if q.slice == nil || q.topUp != nil {
		return false
	}
	return !now.Before(q.slice.until.Add(-q.slice.term / 2))
}

// sliceRetry shortens a rate refusal of work charged per request to when
// a slice's bucket of the resource will hold its charge, if sooner: the
// work is tried again then (pacing) and admitted locally.
func (n *node) sliceRetry(err error, charges map[string]int64) error {
	var rl *governor.RateLimitedError
	if !errors.As(err, &rl) {
		return err
	}
	if w, ok := n.reservation(rl.Resource).sliceWait(charges[rl.Resource]); ok && w < rl.RetryAfter {
		rl.RetryAfter = w
	}
	return err
}
