package engine

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"time"
)

// maxSamples bounds the memory of one interval; beyond it the newest
// releases overwrite the oldest.
const maxSamples = 4096

// controller is an AIMD controller for one class's root limit: additive
// increase, multiplicative decrease, the shape of TCP congestion control
// and for the same reason: back off fast, probe slowly.
//
// It raises at most once an interval, but it cuts as soon as the interval's
// verdict is certain: when the window's overloaded or slow calls are
// already too many for the rule to pass even if every other call of an
// interval as busy as the last whole one were healthy. And it counts only
// calls that began after its last cut (a lease's call by its grant): a cut revokes nothing, so calls
// admitted under the old limit go on ending overloaded for a while, and
// counting them would cut again for the same excess (TCP cuts once per
// window of data for the same reason).
type controller struct {
	cfg        Adaptive
	last       int64 // when it last decided
	cutAt      int64 // when it last cut
	lastCount  int   // calls counted in the last whole interval
	latencies  []time.Duration
	next       int // ring position once latencies is full
	slow       int // samples in latencies over TargetP95
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

// observe counts a call of latency begun at began, unless that is before
// the last cut.
func (c *controller) observe(latency time.Duration, overloaded bool, began int64) {
	if began < c.cutAt {
		return
	}
	if len(c.latencies) < maxSamples {
		c.latencies = append(c.latencies, latency)
	} else {
		if c.latencies[c.next] > c.cfg.TargetP95 {
			c.slow--
		}
		c.latencies[c.next] = latency
		c.next = (c.next + 1) % maxSamples
	}
	if latency > c.cfg.TargetP95 {
		c.slow++
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
	next := current
	if current < math.MaxInt64 { // a root limit may be set to anything
		next++
	}
	next = c.clamp(next)
	if c.fails(len(c.latencies), c.count) {
		next = c.cut(current)
	}
	return next, next != current
}

func (c *controller) cut(current int64) int64 {
	return c.clamp(int64(float64(current) * AdaptiveDecrease))
}

func (c *controller) clamp(limit int64) int64 {
	return min(max(limit, c.cfg.MinLimit), c.cfg.MaxLimit)
}

// fails reports whether an interval of window latencies and count calls,
// the window's slow and overloaded ones among them and every other one
// healthy, fails the rule: a p95 over target or an overloaded share over
// the maximum. The p95 (nearest rank) is over target exactly when fewer
// calls than its rank are within target, so a count of the slow ones
// answers without sorting.
func (c *controller) fails(window, count int) bool {
	rank := (95*window + 99) / 100
	return window-c.slow < rank || float64(c.overloaded)/float64(count) > c.cfg.MaxOverload
}

// tick decides once per interval and starts a fresh sample window.
func (c *controller) tick(e *Engine, now int64) {
	if now-c.last < int64(c.cfg.Interval) {
		return
	}
	current, ok := c.current(e)
	if next, moved := c.decide(current); moved || !ok {
		c.adjust(e, now, current, next)
	}
	c.lastCount = c.count
	c.restart(now)
}

// cutEarly cuts the limit at once, without waiting for the interval's end,
// when the window holds enough samples and its verdict is certain: it
// fails the rule even as part of an interval as busy as the last whole one
// whose other calls are all healthy.
func (c *controller) cutEarly(e *Engine, now int64) {
	expect := max(c.lastCount, c.count)
	if c.count < c.cfg.MinSamples || !c.fails(min(expect, maxSamples), expect) {
		return
	}
	current, _ := c.current(e)
	if next := c.cut(current); next < current {
		c.adjust(e, now, current, next)
		c.restart(now)
	}
}

func (c *controller) adjust(e *Engine, now, current, next int64) {
	e.emit(Event{Kind: EvLimitAdjusted, At: now, Node: RootID, Resource: c.cfg.Class, Amount: next})
	if next < current {
		c.cutAt = now
		// Blocks follow the limit down: idle slots above it go back.
		e.recallUnder(e.root, c.cfg.Class, "")
	}
	e.dispatch(c.cfg.Class)
}

// current is the class's root limit, or MaxLimit when the root has none
// (and whether it has one).
func (c *controller) current(e *Engine) (int64, bool) {
	if v, ok := e.root.limit.capOf(c.cfg.Class); ok {
		return v, true
	}
	return c.cfg.MaxLimit, false
}

// restart empties the window after a decision.
func (c *controller) restart(now int64) {
	c.last = now
	c.latencies, c.next, c.slow, c.overloaded, c.count = c.latencies[:0], 0, 0, 0, 0
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
	c := e.adaptive[class]
	if c == nil {
		return 0, fmt.Errorf("%w: no adaptive class %q", ErrNotFound, class)
	}
	v, _ := c.current(e)
	return v, nil
}

// Sample is how one call went, for an adaptive limit: what a release
// reports, sent in batches for the slots of a block.
type Sample struct {
	Latency    time.Duration
	Overloaded bool
}

// Observe reports calls made in slots of the session's blocks of class, as
// releases report theirs. The samples are not recorded (adaptive samples
// are not state), but a cut they call for is, as an EvLimitAdjusted event.
// A class that is not adaptive ignores them.
func (e *Engine) Observe(sid SessionID, class string, samples []Sample) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, err := e.session(sid, e.tick()); err != nil {
		return err
	}
	for _, s := range samples {
		if s.Latency < 0 {
			return invalid("a sample's latency %v is negative", s.Latency)
		}
	}
	c := e.adaptive[class]
	if c == nil {
		return nil
	}
	now := e.tick()
	for _, s := range samples {
		// A slot's call is known only by its end and latency.
		c.observe(s.Latency, s.Overloaded, now-int64(s.Latency))
	}
	c.cutEarly(e, now)
	return nil
}
