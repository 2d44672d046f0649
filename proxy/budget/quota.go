package budget

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/proxy/admission"
)

// reservation is a node's units of one resource that governord reserved
// for the session. Every unit governord counts as reserved is in exactly
// one of these states here, so that what is settled is exactly what work
// was admitted with:
//
//	unspent   free to take
//	held      taken by a request still waiting for its slot
//	spent     taken by admitted work, not yet reported
//	settling  being reported as spent
//	returning being given back
type reservation struct {
	n        *node
	resource string

	mu         sync.Mutex
	unspent    int64
	held       int64
	spent      int64
	settling   int64
	returning  int64
	lastGrant  int64
	lastUse    time.Time
	lastSettle time.Time
	topUp      *flight
	waiting    int64
	// owed is how many of the held units were held when governord last
	// recalled the reservation: as their requests are refused they go back
	// to governord, not to unspent, so that after a recall only units of
	// later top-ups are spent (tenantstate.go).
	owed int64
	// ratedUntil: governord said a rate binds the resource (it reserves
	// none of it, since units spent here later would escape the rate's
	// buckets), so until then each request charges it at governord, and
	// the next top-up after it asks again (the rate may be gone).
	ratedUntil time.Time
	// slice is governord's slice of the rate that binds the resource,
	// while it is held (slice.go): units are spent as its bucket allows.
	slice *localSlice
}

// errRated: see take.
var errRated = errors.New("budget: a rate binds the resource; it is charged per request")

// ratedLocked says whether the resource is charged per request now: a
// rate binds it and no slice of the rate lives.
func (q *reservation) ratedLocked(now time.Time) bool {
	return now.Before(q.ratedUntil) || (q.slice != nil && !q.slice.lives(now))
}

// errShortTopUp: see take.
var errShortTopUp = errors.New("budget: a top-up came back short of the charge")

// take holds amount units for a request, topping the reservation up in one
// call when it is short. The units are spent when the request is admitted
// (spend) or freed again when it is not (untake).
//
// It returns errShortTopUp when a top-up it asked for came back short of
// what the request needs: governord reserves a share of what is left, so
// the quota is near its edge, and gathering the rest a share at a time
// could go on for as long as other sessions' recalls take this one's units.
//
// It returns errRated while governord says a rate binds the resource: the
// request is charged at governord instead, as with delegation off.
func (q *reservation) take(ctx context.Context, amount int64) error {
	var mine *flight
	var needed int64
	for {
		q.mu.Lock()
		now := time.Now()
		if q.ratedLocked(now) {
			q.refillLocked() // a slice past its term is asked for again
			q.mu.Unlock()
			return errRated
		}
		if q.unspent >= amount {
			if q.slice != nil && !q.sliceTakeLocked(amount, now) {
				q.mu.Unlock()
				return errRated // charged at governord, from what the slices leave
			}
			q.unspent -= amount
			q.held += amount
			q.lastUse = time.Now()
			q.refillLocked()
			q.mu.Unlock()
			return nil
		}
		if f := q.topUp; f != nil {
			q.waiting++
			q.mu.Unlock()
			select {
			case <-f.done:
			case <-ctx.Done():
				q.mu.Lock()
				q.waiting--
				q.mu.Unlock()
				return &admission.QuotaWait{Resource: q.resource, Amount: amount, Err: ctx.Err()}
			}
			q.mu.Lock()
			q.waiting--
			q.mu.Unlock()
			if f.err != nil {
				if ctx.Err() != nil { // the top-up gave up with the wait
					return &admission.QuotaWait{Resource: q.resource, Amount: amount, Err: f.err}
				}
				return f.err
			}
			if f == mine && f.granted < needed && !f.rated {
				return errShortTopUp
			}
			continue
		}
		// Ask for what is short, or twice the last grant (demand is
		// growing), whichever is more, within the maximum; an amount
		// larger than the maximum is asked for whole.
		need := amount - q.unspent
		want := max(need, min(2*max(q.lastGrant, 1), q.n.s.a.cfg.MaxReservation))
		f := &flight{done: make(chan struct{}), epoch: q.n.ts.begin()}
		q.topUp = f
		mine, needed = f, need
		spent := q.spent // settled by the same call
		q.spent = 0
		q.settling += spent
		q.mu.Unlock()
		q.n.s.a.bg.Go(func() { q.grow(f, spent, want) })
	}
}

// refillLocked tops the reservation up in the background once less than
// half of its last grant is left, so that requests rarely wait for a top-up
// and a short governord outage finds units in hand.
//
// A slice of a rate is renewed the same way, past half its term.
func (q *reservation) refillLocked() {
	now := time.Now()
	renew := q.renewDueLocked(now)
	if !renew && (q.topUp != nil || q.lastGrant == 0 || q.unspent >= q.lastGrant/2 || q.ratedLocked(now)) {
		return
	}
	want := min(2*max(q.lastGrant, 1), q.n.s.a.cfg.MaxReservation)
	f := &flight{done: make(chan struct{}), epoch: q.n.ts.begin()}
	q.topUp = f
	spent := q.spent
	q.spent = 0
	q.settling += spent
	q.n.s.a.bg.Spawn(func() { q.grow(f, spent, want) }) // q.mu is held, and grow takes it
}

// unspentNow is how many units are free to take: reserved at governord,
// spent by nothing here; and whether a top-up or a give-back is under way,
// which governord may have counted already or not.
func (q *reservation) unspentNow() (units int64, moving bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.unspent, q.topUp != nil || q.returning > 0
}

// tryTake holds amount units if the reservation has them now.
func (q *reservation) tryTake(amount int64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := time.Now()
	if q.unspent < amount || q.ratedLocked(now) || (q.slice != nil && !q.sliceTakeLocked(amount, now)) {
		return false
	}
	q.unspent -= amount
	q.held += amount
	q.lastUse = time.Now()
	q.refillLocked()
	return true
}

// grow settles spent units, then reserves up to want more. The two are
// separate calls: a top-up may wait while governord recalls units from
// other sessions, and a settlement must never wait behind it (two sidecars
// topping up at once would each hold the units the other waits for).
func (q *reservation) grow(f *flight, spent, want int64) {
	defer close(f.done)
	ctx, cancel := context.WithTimeout(q.n.s.life, callTimeout)
	defer cancel()
	var err error
	if spent > 0 {
		_, err = q.n.t.Reserve(ctx, q.resource, spent, 0, 0)
		q.mu.Lock()
		q.settling -= spent
		if err != nil {
			q.spent += spent // not reported: the next settlement does it
		} else {
			q.lastSettle = time.Now()
		}
		spent = 0
		q.mu.Unlock()
	}
	var r governor.Reservation
	sent := time.Now() // a slice's term counts from here
	if err == nil {
		r, err = q.n.t.Reserve(ctx, q.resource, 0, 0, want)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.topUp = nil
	if err != nil {
		f.err = err
		q.n.failed(err)
		outcome := "failed"
		if errors.Is(err, governor.ErrQuotaExhausted) {
			outcome = "denied"
		}
		q.n.s.a.m.topUps.WithLabelValues("quota", outcome).Inc()
		return
	}
	q.lastSettle = time.Now()
	outcome := "granted"
	switch {
	case r.Rated && (r.Slice == nil || r.Granted == 0):
		// No slice, or one not renewed under contention: per request.
		q.learnRated(f)
		return
	case r.Slice != nil:
		q.learnSlice(r.Slice, sent)
		outcome = "slice"
	}
	if q.n.ts.learn(f.epoch, r.ReadOnly) { // before any unit can be taken
		q.unspent += r.Granted
	} else if r.Granted > 0 {
		// A recall of everything came while the call was out: the units
		// go back with the others (tenantstate.go).
		q.returning += r.Granted
		q.n.s.a.bg.Spawn(func() { // q.mu is held
			ctx, cancel := context.WithTimeout(q.n.s.life, callTimeout)
			defer cancel()
			q.finishSettle(ctx, settlement{ret: r.Granted})
		})
	}
	q.lastGrant = r.Granted
	f.granted = r.Granted
	q.n.s.a.m.topUps.WithLabelValues("quota", outcome).Inc()
}

// learnRated acts on governord's answer that a rate binds the resource
// and no slice of it is granted or renewed: nothing was reserved, requests
// charge it at governord until the recheck is due, and units still unspent
// from before go back, with the slice if one is held, so that none is
// spent here past the rate. q.mu is held.
func (q *reservation) learnRated(f *flight) {
	q.ratedUntil = time.Now().Add(q.n.s.a.cfg.RatedRecheck)
	q.lastGrant, f.granted, f.rated = 0, 0, true
	q.n.s.a.m.topUps.WithLabelValues("quota", "rated").Inc()
	st, ok := q.startSettle(true)
	if !ok {
		return
	}
	q.n.s.a.bg.Spawn(func() { // q.mu is held
		ctx, cancel := context.WithTimeout(q.n.s.life, callTimeout)
		defer cancel()
		q.finishSettle(ctx, st)
	})
}

// spend marks held units as spent: their request was admitted.
func (q *reservation) spend(amount int64) {
	q.mu.Lock()
	q.held -= amount
	q.owed -= min(amount, q.owed)
	q.spent += amount
	q.mu.Unlock()
}

// untake frees held units: their request was not admitted after all.
// Units owed since a recall go back to governord.
func (q *reservation) untake(amount int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.held -= amount
	owed := min(amount, q.owed)
	q.owed -= owed
	q.unspent += amount - owed
	if owed > 0 {
		q.returning += owed
		q.n.s.a.bg.Spawn(func() { // q.mu is held
			ctx, cancel := context.WithTimeout(q.n.s.life, callTimeout)
			defer cancel()
			q.finishSettle(ctx, settlement{ret: owed})
		})
	}
}

// recall gives back every unspent unit now, and the held ones as their
// requests are refused: governord asked for them.
func (q *reservation) recall() {
	q.mu.Lock()
	q.owed = q.held
	q.mu.Unlock()
	q.settle(true)
}

// spendUpTo spends up to amount units for work that has already run: what
// the reservation has unspent, and the rest at governord directly, as far
// as the caps allow (consumeUpTo). What was spent was spent; beyond the
// quota nothing more is charged. One call at most, however large the
// amount: topping the reservation up a share at a time could take as many
// calls as the amount has units.
func (q *reservation) spendUpTo(ctx context.Context, amount int64) {
	q.mu.Lock()
	k := min(amount, q.unspent)
	q.unspent -= k
	q.spent += k
	q.lastUse = time.Now()
	q.mu.Unlock()
	if rest := amount - k; rest > 0 {
		q.n.consumeUpTo(ctx, q.resource, rest)
	}
}

// settle reports the spent units, and with all gives back the unspent ones
// too, and the slice of a rate if one is held, in the background.
func (q *reservation) settle(all bool) {
	q.mu.Lock()
	st, ok := q.startSettle(all)
	q.mu.Unlock()
	if !ok {
		return
	}
	q.n.s.a.bg.Go(func() {
		ctx, cancel := context.WithTimeout(q.n.s.life, callTimeout)
		defer cancel()
		q.finishSettle(ctx, st)
	})
}

// settleNow is settle, waiting for the answer (shutdown).
func (q *reservation) settleNow(ctx context.Context, all bool) {
	q.mu.Lock()
	st, ok := q.startSettle(all)
	q.mu.Unlock()
	if ok {
		q.finishSettle(ctx, st)
	}
}

// settlement is one call's report: units spent, units given back, and
// whether the slice of a rate goes back with them.
type settlement struct {
	spent, ret int64
	endSlice   bool
}

// startSettle takes what a settlement reports out of the reservation; with
// all, the unspent units and the slice too, which admits nothing more.
// q.mu is held.
func (q *reservation) startSettle(all bool) (settlement, bool) {
	st := settlement{spent: q.spent}
	if all {
		st.ret = q.unspent
		st.endSlice = q.slice != nil
		q.slice = nil
	}
	if st.spent == 0 && st.ret == 0 && !st.endSlice {
		return st, false
	}
	q.spent -= st.spent
	q.unspent -= st.ret
	q.settling += st.spent
	q.returning += st.ret
	return st, true
}

func (q *reservation) finishSettle(ctx context.Context, st settlement) {
	var err error
	if st.endSlice {
		_, err = q.n.t.EndSlice(ctx, q.resource, st.spent, st.ret)
		if err == nil {
			q.n.s.a.m.topUps.WithLabelValues("quota", "slice_returned").Inc()
		}
	} else {
		_, err = q.n.t.Reserve(ctx, q.resource, st.spent, st.ret, 0)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.settling -= st.spent
	q.returning -= st.ret
	if err != nil {
		// Kept for the next settlement. A session that ends first has all
		// of it counted as spent by governord. A slice not given back ends
		// at its term.
		q.spent += st.spent
		q.unspent += st.ret
		q.n.s.a.log.Debug("governor-proxy: settling a reservation failed", "resource", q.resource, "err", err)
		return
	}
	q.lastSettle = time.Now()
}

// tick settles what was spent a settle interval ago, and gives back what
// has been unspent and unasked for for the linger.
func (q *reservation) tick(now time.Time, linger, settleEvery time.Duration) {
	q.mu.Lock()
	idle := (q.unspent > 0 || q.slice != nil) && q.held == 0 && q.topUp == nil && now.Sub(q.lastUse) >= linger
	due := q.spent > 0 && now.Sub(q.lastSettle) >= settleEvery
	q.mu.Unlock()
	if idle || due {
		q.settle(idle)
	}
}
