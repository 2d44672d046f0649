package engine

import (
	"fmt"
	"maps"
	"slices"
	"time"
)

// maxSamples bounds the memory of one interval; beyond it the newest
// releases overwrite the oldest.
const maxSamples = 4096

// controller is an AIMD controller for one class's root limit: additive
// increase, multiplicative decrease, the shape of TCP congestion control
// and for the same reason: back off fast, probe slowly.
type controller struct {
	cfg        Adaptive
	last       int64 // when it last decided
	latencies  []time.Duration
	next       int // ring position once latencies is full
	overloaded int
	count      int
}

func newController(a Adaptive, now int64) (*controller, error) {
	if err := validName("adaptive class", a.Class); err != nil {
		return nil, err
	}
	switch {
	case a.MinLimit < 1:
		return nil, invalid("adaptive %q: min_limit %d is below 1", a.Class, a.MinLimit)
	case a.MaxLimit < a.MinLimit:
		return nil, invalid("adaptive %q: max_limit %d is below min_limit %d", a.Class, a.MaxLimit, a.MinLimit)
	case a.TargetP95 <= 0:
		return nil, invalid("adaptive %q: target_p95 must be positive", a.Class)
	case !(a.MaxOverload >= 0 && a.MaxOverload <= 1): // also refuses NaN
		return nil, invalid("adaptive %q: max_overload %v is not a share in [0, 1]", a.Class, a.MaxOverload)
	case a.Interval < 0 || a.MinSamples < 0:
		return nil, invalid("adaptive %q: interval and min_samples cannot be negative", a.Class)
	}
	if a.Interval == 0 {
		a.Interval = DefaultAdaptiveInterval
	}
	if a.MinSamples == 0 {
		a.MinSamples = DefaultMinSamples
	}
	return &controller{cfg: a, last: now}, nil
}

func (c *controller) observe(latency time.Duration, overloaded bool) {
	if len(c.latencies) < maxSamples {
		c.latencies = append(c.latencies, latency)
	} else {
		c.latencies[c.next] = latency
		c.next = (c.next + 1) % maxSamples
	}
	c.count++
	if overloaded {
		c.overloaded++
	}
}

// decide returns the limit that should follow current, and whether it moves.
func (c *controller) decide(current int64) (int64, bool) {
	if c.count < c.cfg.MinSamples {
		return current, false
	}
	p95 := percentile(c.latencies, 0.95)
	share := float64(c.overloaded) / float64(c.count)
	next := current + 1
	if p95 > c.cfg.TargetP95 || share > c.cfg.MaxOverload {
		next = int64(float64(current) * AdaptiveDecrease)
	}
	next = min(max(next, c.cfg.MinLimit), c.cfg.MaxLimit)
	return next, next != current
}

// tick decides once per interval and starts a fresh sample window.
func (c *controller) tick(e *Engine, now int64) {
	if now-c.last < int64(c.cfg.Interval) {
		return
	}
	current, ok := e.root.limit.capOf(c.cfg.Class)
	if !ok {
		current = c.cfg.MaxLimit
	}
	if next, moved := c.decide(current); moved || !ok {
		e.emit(Event{Kind: EvLimitAdjusted, At: now, Node: RootID, Resource: c.cfg.Class, Amount: next})
		if next < current {
			// Blocks follow the limit down: idle slots above it go back.
			e.recallUnder(e.root, c.cfg.Class, "")
		}
		e.dispatch(c.cfg.Class)
	}
	c.last = now
	c.latencies, c.next, c.overloaded, c.count = c.latencies[:0], 0, 0, 0
}

// percentile returns the p-th latency (nearest rank) of samples.
func percentile(samples []time.Duration, p float64) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	rank := int(p*float64(len(s))+0.999999) - 1
	return s[min(max(rank, 0), len(s)-1)]
}

// startAdaptive gives each adaptive class without a root limit its MaxLimit,
// so the class is never unlimited while the controller waits for samples.
// It is configuration, applied the same way by New and Restore, so live and
// replayed engines agree.
func (e *Engine) startAdaptive() {
	for _, class := range e.sortedAdaptive() {
		if _, ok := e.root.limit.capOf(class); !ok {
			e.root.limit.setCap(class, e.adaptive[class].cfg.MaxLimit)
		}
	}
}

func (e *Engine) sortedAdaptive() []string {
	return slices.Sorted(maps.Keys(e.adaptive))
}

// AdaptiveLimit returns the current limit of an adaptive class.
func (e *Engine) AdaptiveLimit(class string) (int64, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.adaptive[class] == nil {
		return 0, fmt.Errorf("%w: no adaptive class %q", ErrNotFound, class)
	}
	if v, ok := e.root.limit.capOf(class); ok {
		return v, nil
	}
	return e.adaptive[class].cfg.MaxLimit, nil
}

// Sample is how one call went, for an adaptive limit: what a release
// reports, sent in batches for the slots of a block.
type Sample struct {
	Latency    time.Duration
	Overloaded bool
}

// Observe reports calls made in slots of the session's blocks of class, as
// releases report theirs. It is not recorded: adaptive samples are not
// state. A class that is not adaptive ignores them.
func (e *Engine) Observe(sid SessionID, class string, samples []Sample) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, err := e.session(sid, e.now()); err != nil {
		return err
	}
	c := e.adaptive[class]
	if c == nil {
		return nil
	}
	for _, s := range samples {
		if s.Latency < 0 {
			return invalid("a sample's latency %v is negative", s.Latency)
		}
	}
	for _, s := range samples {
		c.observe(s.Latency, s.Overloaded)
	}
	return nil
}
