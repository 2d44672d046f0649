package budget

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/governor-project/governor/governor"
)

// pool is a node's slots of one class: the block governord delegated, and
// the work holding its slots now.
type pool struct {
	n     *node
	class string

	mu        sync.Mutex
	count     int64 // slots the block holds, as governord last said
	inUse     int64 // slots held by work now
	returning int64 // idle slots being given back
	contended bool  // acquires of the class queue at governord
	// shrinking: governord lowered a limit above the block (a recall): each
	// slot goes back as its work ends, until a growth shows the block fits
	// under the limits again. No running work is revoked.
	shrinking bool
	lastUse   time.Time
	growth    *flight           // the top-up in flight, if any
	waiting   int64             // requests waiting on it
	gen       uint64            // moves when the block is revoked: slots of an older one are not given back
	samples   []governor.Sample // calls made in the block's slots, not yet reported
	adaptive  bool              // the class has an adaptive limit: note its calls
	// busy lists the slots of the block that hold work, in the order they
	// were taken, so the first has been held longest: what governord is
	// told of the block (usereport.go), to tell stuck work from idle slots.
	busyFirst, busyLast *blockTicket
}

// flight is a call that requests wait on.
type flight struct {
	done    chan struct{}
	granted int64
	err     error
	rated   bool // a reservation's top-up that governord answered Rated
	// epoch is the node's tenantView epoch when the call began: its answer
	// is stale if a recall of everything came since.
	epoch uint64
}

// idle is how many slots are neither held by work nor being given back.
func (p *pool) idle() int64 { return p.count - p.inUse - p.returning }

// take takes a slot: from the block when one is idle and nothing queues at
// governord; by growing the block in one call when the block is full; or,
// while the class is contended or the block cannot grow, as a single lease
// through governord's fair queue, marked a write when it is one.
func (p *pool) take(ctx context.Context, write bool) (ticket, error) {
	for {
		if t, ok := p.tryTake(); ok {
			return t, nil
		}
		p.mu.Lock()
		switch {
		case !p.contended && !p.shrinking && p.idle() > 0:
			p.mu.Unlock() // freed since tryTake looked: look again
		case p.contended:
			p.mu.Unlock()
			return p.single(ctx, write)
		case p.growth != nil:
			f := p.growth
			p.waiting++
			p.mu.Unlock()
			select {
			case <-f.done:
			case <-ctx.Done():
				p.mu.Lock()
				p.waiting--
				p.mu.Unlock()
				return nil, ctx.Err()
			}
			p.mu.Lock()
			p.waiting--
			p.mu.Unlock()
			if f.err != nil {
				return nil, f.err
			}
			if f.granted == 0 {
				if t, ok := p.tryTake(); ok { // a slot of ours came back meanwhile
					return t, nil
				}
				return p.single(ctx, write) // no room now: queue at governord like anyone
			}
		default:
			limit := p.n.s.a.cfg.MaxBlock
			if p.count >= limit {
				p.mu.Unlock()
				return p.single(ctx, write)
			}
			// Ask for what the requests waiting now need, or double the
			// block, whichever is more.
			want := min(max(p.count, p.waiting+1), limit-p.count)
			f := &flight{done: make(chan struct{}), epoch: p.n.ts.begin()}
			p.growth = f
			p.mu.Unlock()
			p.n.s.a.bg.Go(func() { p.grow(f, want) })
		}
	}
}

// tryTake takes an idle slot of the block, if there is one to take now.
func (p *pool) tryTake() (ticket, bool) {
	p.mu.Lock()
	if p.contended || p.shrinking || p.idle() <= 0 {
		p.mu.Unlock()
		return nil, false
	}
	p.inUse++
	p.lastUse = time.Now()
	t := &blockTicket{p: p, gen: p.gen, taken: p.lastUse}
	p.linkBusy(t)
	p.mu.Unlock()
	p.n.s.a.m.blockGrants.Inc()
	return t, true
}

// linkBusy puts t, just taken, last on the busy list.
func (p *pool) linkBusy(t *blockTicket) {
	t.prev = p.busyLast
	if p.busyLast != nil {
		p.busyLast.next = t
	} else {
		p.busyFirst = t
	}
	p.busyLast = t
}

// unlinkBusy takes t, whose work ended, off the busy list.
func (p *pool) unlinkBusy(t *blockTicket) {
	if t.prev != nil {
		t.prev.next = t.next
	} else {
		p.busyFirst = t.next
	}
	if t.next != nil {
		t.next.prev = t.prev
	} else {
		p.busyLast = t.prev
	}
	t.prev, t.next = nil, nil
}

// use is how many of the block's slots hold work, and since when the one
// held longest has (zero when none is).
func (p *pool) use() (inUse int64, since time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.busyFirst != nil {
		since = p.busyFirst.taken
	}
	return p.inUse, since
}

// grow asks governord for want more slots, and tells the waiters.
func (p *pool) grow(f *flight, want int64) {
	defer close(f.done)
	ctx, cancel := context.WithTimeout(p.n.s.life, callTimeout)
	defer cancel()
	b, err := p.n.t.ResizeBlock(ctx, p.class, want, 0)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.growth = nil
	if err != nil {
		f.err = err
		p.n.failed(err)
		p.n.s.a.m.topUps.WithLabelValues("slots", "failed").Inc()
		return
	}
	current := p.n.ts.learn(f.epoch, b.ReadOnly) // before any slot can be taken
	p.count += b.Granted
	p.adaptive = b.Adaptive
	// The answer may be older than a notice already acted on: it can say
	// that acquires queue, never that they stopped (only a notice does).
	if b.Contended && !p.contended {
		p.contended = true
		p.giveBackLocked(p.idle())
	}
	switch {
	case !current:
		// A recall of everything came while the call was out: the slots
		// go back with the others, and the block grants nothing until it
		// grows again (tenantstate.go).
		p.shrinking = true
		p.giveBackLocked(p.idle())
	case b.Granted > 0:
		p.shrinking = false // the chain had room: the block fits again
	}
	f.granted = b.Granted
	outcome := "granted"
	if b.Granted == 0 {
		outcome = "none"
	}
	p.n.s.a.m.topUps.WithLabelValues("slots", outcome).Inc()
}

// single takes one lease through governord's fair queue; a write is marked
// as one, so that a read_only tenant refuses it there.
func (p *pool) single(ctx context.Context, write bool) (ticket, error) {
	var l *governor.Lease
	var err error
	if write {
		l, err = p.n.t.ChargeAndAcquireWrite(ctx, p.class, nil)
	} else {
		l, err = p.n.t.Acquire(ctx, p.class)
	}
	if err != nil {
		p.n.failed(err)
		return nil, counted(err)
	}
	p.n.s.a.m.slotGrants.WithLabelValues("single").Inc()
	return &leaseTicket{s: p.n.s, n: p.n, l: l}, nil
}

// put gives a block's slot back to the pool when its work ends, noting how
// the call went for the next report. While the class is contended the slot
// goes straight back to governord, whose queue decides who gets it.
func (p *pool) put(t *blockTicket, latency time.Duration, overloaded bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.adaptive && len(p.samples) < maxSamples {
		p.samples = append(p.samples, governor.Sample{Latency: latency, Overloaded: overloaded})
	}
	if t.gen != p.gen {
		return // the block was revoked meanwhile: there is nothing to give back
	}
	p.inUse--
	p.unlinkBusy(t)
	p.lastUse = time.Now()
	if p.contended || p.shrinking {
		p.giveBackLocked(p.idle())
	}
}

// untake gives a block's slot back unused: the work it was taken for was
// refused after all. No call was made in it, so there is nothing to note.
func (p *pool) untake(t *blockTicket) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t.gen != p.gen {
		return
	}
	p.inUse--
	p.unlinkBusy(t)
	if p.contended || p.shrinking {
		p.giveBackLocked(p.idle())
	}
}

// setContended records what governord said of the class; once contended,
// idle slots go back at once.
func (p *pool) setContended(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.contended = on
	if on {
		p.giveBackLocked(p.idle())
	}
}

// recall gives every idle slot back, and each busy one as its work ends:
// governord lowered a limit the block is charged against.
func (p *pool) recall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.shrinking = true
	p.giveBackLocked(p.idle())
}

// tick gives idle slots back once nothing has asked for one for linger.
func (p *pool) tick(now time.Time, linger time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.idle() > 0 && now.Sub(p.lastUse) >= linger {
		p.giveBackLocked(p.idle())
	}
}

// giveBackLocked gives k idle slots back in the background.
func (p *pool) giveBackLocked(k int64) {
	if k <= 0 {
		return
	}
	p.returning += k
	gen := p.gen
	p.n.s.a.bg.Spawn(func() { // p.mu is held, and giveBack takes it
		ctx, cancel := context.WithTimeout(p.n.s.life, callTimeout)
		defer cancel()
		p.giveBack(ctx, gen, k)
	})
}

// giveBack tells governord that k slots are back, and counts them out.
func (p *pool) giveBack(ctx context.Context, gen uint64, k int64) {
	_, err := p.n.t.ResizeBlock(ctx, p.class, 0, k)
	p.mu.Lock()
	defer p.mu.Unlock()
	if gen != p.gen {
		return
	}
	p.returning -= k
	switch {
	case err == nil:
		p.count -= k
	case errors.Is(err, governor.ErrTaskEnded), errors.Is(err, governor.ErrLeaseRevoked), errors.Is(err, governor.ErrNotFound):
		p.revokedLocked()
	default:
		// The slots stay idle in the block; the next tick tries again.
		p.n.s.a.log.Debug("governor-proxy: giving idle slots back failed", "class", p.class, "slots", k, "err", err)
	}
}

// returnIdle gives every idle slot back and waits for the answer (shutdown).
func (p *pool) returnIdle(ctx context.Context) {
	p.mu.Lock()
	k, gen := p.idle(), p.gen
	p.returning += k
	p.mu.Unlock()
	if k > 0 {
		p.giveBack(ctx, gen, k)
	}
}

// revoked forgets the block: governord ended it with its node.
func (p *pool) revoked() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.revokedLocked()
}

func (p *pool) revokedLocked() {
	p.gen++
	p.count, p.inUse, p.returning = 0, 0, 0
	p.busyFirst, p.busyLast = nil, nil // the tickets of the old block are not put back
}

// failed marks n ended when a call says so.
func (n *node) failed(err error) {
	var ended *governor.TaskEndedError
	if errors.As(err, &ended) {
		n.ended(ended)
	}
}

// ticket is admitted work holding a slot.
type ticket interface {
	End(latency time.Duration, overloaded bool)
	// abandon gives the slot back unused, instead of End, when the work
	// is refused after all; the node stays in use for the caller to unuse.
	abandon()
}

// blockTicket is a slot of a block.
type blockTicket struct {
	p     *pool
	gen   uint64
	taken time.Time
	once  sync.Once
	// prev and next place it on its pool's busy list, under the pool's mu.
	prev, next *blockTicket
}

func (t *blockTicket) End(latency time.Duration, overloaded bool) {
	t.once.Do(func() {
		t.p.put(t, latency, overloaded)
		t.p.n.unuse()
	})
}

func (t *blockTicket) abandon() { t.once.Do(func() { t.p.untake(t) }) }

// takeSamples returns the calls noted since the last report.
func (p *pool) takeSamples() []governor.Sample {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.samples
	p.samples = nil
	return out
}

// leaseTicket is a single lease, released in the background.
type leaseTicket struct {
	s    *session
	n    *node
	l    *governor.Lease
	once sync.Once
}

func (t *leaseTicket) End(latency time.Duration, overloaded bool) {
	t.once.Do(func() {
		t.n.unuse()
		t.release(latency, overloaded)
	})
}

func (t *leaseTicket) abandon() { t.once.Do(func() { t.release(0, false) }) } // 0: no sample

func (t *leaseTicket) release(latency time.Duration, overloaded bool) {
	t.s.a.bg.Go(func() {
		if t.s.client.Err() != nil {
			return // the session ended, and its leases with it
		}
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		if err := t.l.Release(ctx, latency, overloaded); err != nil {
			t.s.a.m.releaseFailures.Inc()
			t.s.a.log.Warn("governor-proxy: release failed", "lease", t.l.ID(), "class", t.l.Class(), "err", err)
		}
	})
}
