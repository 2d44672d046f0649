package main

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/governor-project/governor/governor"
)

// sim runs simulated activities one at a time on a virtual clock, so that a
// run is a function of its seed: the downstream draws its randomness in the
// same order every time, and governord gets the same calls in the same
// order, so it makes the same decisions. Only the activity holding the
// baton runs; it hands it back when it sleeps, waits, or waits at governord.
//
// An Acquire that governord queues is detected by its queue depth rising,
// and a grant by it falling after a release; the grants are handed on in
// lease id order, which is the order governord made them.
type sim struct {
	now    time.Duration
	seq    int
	wakes  wakeHeap
	yield  chan struct{} // the running activity hands the baton back
	rng    *rand.Rand
	gov    *governord // nil for a run without Governor
	class  string     // the lease class governord governs
	parked []*parked  // activities whose Acquire governord queued
	err    error      // the first failure to observe governord
}

type wake struct {
	at  time.Duration
	seq int
	ch  chan struct{}
}

type wakeHeap []wake

func (h wakeHeap) Len() int { return len(h) }
func (h wakeHeap) Less(i, j int) bool {
	return h[i].at < h[j].at || (h[i].at == h[j].at && h[i].seq < h[j].seq)
}
func (h wakeHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *wakeHeap) Push(x any)   { *h = append(*h, x.(wake)) }
func (h *wakeHeap) Pop() any {
	old := *h
	w := old[len(old)-1]
	*h = old[:len(old)-1]
	return w
}

func newSim(seed int64, gov *governord, class string) *sim {
	return &sim{yield: make(chan struct{}), rng: rand.New(rand.NewPCG(uint64(seed), 0x90feb)), gov: gov, class: class}
}

// at schedules ch to be woken at t.
func (s *sim) at(t time.Duration, ch chan struct{}) {
	s.seq++
	heap.Push(&s.wakes, wake{at: t, seq: s.seq, ch: ch})
}

// run runs main and everything it starts until nothing is left to wake.
func (s *sim) run(main func()) error {
	s.spawn(main)
	for s.wakes.Len() > 0 && s.err == nil {
		w := heap.Pop(&s.wakes).(wake)
		s.now = w.at
		w.ch <- struct{}{}
		<-s.yield
	}
	if s.err == nil && len(s.parked) > 0 {
		s.err = fmt.Errorf("%d acquires still wait at governord with nothing left to release", len(s.parked))
	}
	return s.err
}

// spawn starts fn as an activity, now, after the running one yields.
func (s *sim) spawn(fn func()) {
	ch := make(chan struct{}, 1)
	s.at(s.now, ch)
	go func() {
		<-ch
		fn()
		s.yield <- struct{}{}
	}()
}

// sleep lets d of virtual time pass for the running activity.
func (s *sim) sleep(d time.Duration) {
	ch := make(chan struct{}, 1)
	s.at(s.now+d, ch)
	s.yield <- struct{}{}
	<-ch
}

// group waits for activities, as sync.WaitGroup does, in virtual time.
type group struct {
	s      *sim
	left   int
	waiter chan struct{}
}

func (g *group) goFn(fn func()) {
	g.left++
	g.s.spawn(func() {
		fn()
		g.left--
		if g.left == 0 && g.waiter != nil {
			g.s.at(g.s.now, g.waiter)
		}
	})
}

func (g *group) wait() {
	if g.left == 0 {
		return
	}
	g.waiter = make(chan struct{}, 1)
	g.s.yield <- struct{}{}
	<-g.waiter
	g.waiter = nil
}

// parked is an activity whose Acquire governord queued.
type parked struct {
	res   chan acquired
	got   *acquired
	wakes chan struct{}
}

type acquired struct {
	lease *governor.Lease
	err   error
}

// errSim is a failure to observe governord: the run is void.
var errSim = errors.New("simulation lost track of governord")

// acquire takes a lease of the sim's class for task, waiting in virtual
// time while governord queues it.
func (s *sim) acquire(ctx context.Context, task *governor.Task) (*governor.Lease, error) {
	res := make(chan acquired, 1)
	go func() {
		l, err := task.Acquire(ctx, s.class)
		res <- acquired{l, err}
	}()
	for queued := false; !queued; {
		select {
		case r := <-res:
			return r.lease, r.err
		case <-time.After(200 * time.Microsecond):
		}
		depth, err := s.queueDepth()
		if err != nil {
			s.fail(err)
			return nil, err
		}
		queued = depth == len(s.parked)+1
	}
	p := &parked{res: res, wakes: make(chan struct{}, 1)}
	s.parked = append(s.parked, p)
	s.yield <- struct{}{}
	<-p.wakes
	return p.got.lease, p.got.err
}

// release releases l, reporting how the call went, and hands the slot's
// grant (if governord made one) to the activity it went to.
func (s *sim) release(ctx context.Context, l *governor.Lease, latency time.Duration, overloaded bool) error {
	err := l.Release(ctx, latency, overloaded)
	if len(s.parked) == 0 {
		return err
	}
	depth, derr := s.queueDepth()
	if derr != nil {
		s.fail(derr)
		return derr
	}
	granted := len(s.parked) - depth
	var got []*parked
	for deadline := time.Now().Add(10 * time.Second); len(got) < granted; {
		for _, p := range s.parked {
			if p.got != nil {
				continue
			}
			select {
			case r := <-p.res:
				p.got = &r
				got = append(got, p)
			default:
			}
		}
		if time.Now().After(deadline) {
			s.fail(fmt.Errorf("%w: %d grants never arrived", errSim, granted-len(got)))
			return s.err
		}
		if len(got) < granted {
			time.Sleep(100 * time.Microsecond)
		}
	}
	s.parked = slices.DeleteFunc(s.parked, func(p *parked) bool { return p.got != nil })
	slices.SortFunc(got, func(a, b *parked) int { return int(leaseID(a) - leaseID(b)) })
	for _, p := range got {
		s.at(s.now, p.wakes)
	}
	return err
}

func leaseID(p *parked) int64 {
	if p.got.lease == nil {
		return 0
	}
	return p.got.lease.ID()
}

func (s *sim) queueDepth() (int, error) {
	v, err := s.gov.metric(fmt.Sprintf("governor_queue_depth{class=%q}", s.class))
	if err != nil {
		return 0, fmt.Errorf("%w: %w", errSim, err)
	}
	return int(v), nil
}

func (s *sim) fail(err error) {
	if s.err == nil {
		s.err = err
	}
}
