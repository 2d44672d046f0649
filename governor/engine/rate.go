package engine

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"math/bits"
	"slices"
	"time"
)

// Rate is a token bucket on a resource of a node: Units per Per
// nanoseconds refill it, and it holds at most Burst units (0 means Units:
// one period's worth). A charge of the resource on the node or below it
// takes its amount out of the bucket, and is refused while the bucket
// holds less (ErrRateLimited). In a CapsEdit, a Rate whose Units is NoCap
// removes the rate.
type Rate struct {
	Units int64 `json:"u"`
	Per   int64 `json:"per,omitempty"` // nanoseconds
	Burst int64 `json:"b,omitempty"`
}

// size is the bucket's size: Burst, or one period's worth when it is 0.
func (r Rate) size() int64 {
	if r.Burst > 0 {
		return r.Burst
	}
	return r.Units
}

func (r Rate) validate(what string) error {
	if r.Units == NoCap {
		if r.Per != 0 || r.Burst != 0 {
			return invalid("%s: a rate removed (%d) has no period or burst", what, NoCap)
		}
		return nil
	}
	if r.Units <= 0 {
		return invalid("%s: rate of %d units is not positive", what, r.Units)
	}
	if r.Per <= 0 {
		return invalid("%s: period of %d ns is not positive", what, r.Per)
	}
	if r.Burst < 0 {
		return invalid("%s: burst %d is negative", what, r.Burst)
	}
	return nil
}

func validRates(what string, m map[string]Rate) error {
	for k, r := range m {
		if err := validName(what+" name", k); err != nil {
			return err
		}
		if err := r.validate(fmt.Sprintf("%s %q", what, k)); err != nil {
			return err
		}
	}
	return nil
}

// bucket is a rate's state. It refills continuously and exactly: credit
// is kept in unit-nanoseconds (Units per Per ns is Units unit-ns per ns),
// so that whole units are level and the remainder, less than Per, is acc.
// Nothing changes it but an event (at that event's time), so replay and a
// snapshot restore it exactly; reads compute the fill at a time without
// storing it.
type bucket struct {
	Rate
	level int64 // whole units in the bucket at stamp
	acc   int64 // credit toward the next unit, in unit-ns, in [0, Per)
	stamp int64 // the time (unix ns) refill was credited to
	// carves are the live slices of the bucket's refill and burst, by
	// slice id (slice.go); carved and carvedSize are their sums. While
	// they live the bucket refills at Units - carved per Per and holds at
	// most its size less carvedSize.
	carves     map[uint64]carve
	carved     int64
	carvedSize int64
}

// carve is what one slice takes of a bucket: units of its refill per its
// Per, and burst of its size, until its slice's term ends (unless renewed;
// the slice's until, kept here so that a wait can count it).
type carve struct{ units, burst, until int64 }

// refill is the units per Per the bucket refills at, less its slices'.
func (b *bucket) refill() int64 { return max(0, b.Units-b.carved) }

// room is the most the bucket holds, less its slices' bursts.
func (b *bucket) room() int64 { return max(0, b.size()-b.carvedSize) }

// BucketView is a rate and its bucket as stored, in a NodeView and so in
// a snapshot: Level units and Acc unit-ns of credit at Stamp.
type BucketView struct {
	Rate
	Level int64 `json:"lv,omitempty"`
	Acc   int64 `json:"acc,omitempty"`
	Stamp int64 `json:"at,omitempty"`
	// Carves are the live slices carved from it, by slice id (slice.go).
	Carves []BucketCarve `json:"cv,omitempty"`
}

// BucketCarve is one slice's carve of a bucket, as stored.
type BucketCarve struct {
	Slice uint64 `json:"id"`
	Units int64  `json:"u"`
	Burst int64  `json:"b,omitempty"`
}

// at is the bucket's level and credit at now. A time before stamp (a clock
// that went back, as a new leader's may) credits nothing: the bucket never
// drains or refills but by elapsed time on the engine's clock. A full
// bucket keeps no credit.
func (b *bucket) at(now int64) (level, acc int64) {
	size, units := b.room(), b.refill()
	if now <= b.stamp || b.level >= size || units == 0 {
		if b.level >= size {
			return size, 0
		}
		return b.level, b.acc
	}
	elapsed := uint64(now) - uint64(b.stamp) // now > stamp: exact in uint64
	hi, lo := bits.Mul64(elapsed, uint64(units))
	var c uint64
	lo, c = bits.Add64(lo, uint64(b.acc), 0)
	hi += c // elapsed*Units < 2^127, so this cannot wrap
	per := uint64(b.Per)
	if hi >= per { // at least 2^64 units: full
		return size, 0
	}
	q, rem := bits.Div64(hi, lo, per)
	if q >= uint64(size-b.level) {
		return size, 0
	}
	return b.level + int64(q), int64(rem)
}

// wait is how long until the bucket, holding level units and acc credit,
// holds amount (more than level): ceil(((amount-level)*Per - acc) / Units)
// nanoseconds, at most math.MaxInt64. Units is what the bucket refills
// at now (refill): slices' carves slow it down.
func (b *bucket) wait(amount, level, acc int64) int64 {
	units := b.refill()
	if units == 0 {
		return math.MaxInt64
	}
	hi, lo := bits.Mul64(uint64(amount-level), uint64(b.Per))
	var c uint64
	lo, c = bits.Sub64(lo, uint64(acc), 0)
	hi -= c // acc < Per <= (amount-level)*Per
	lo, c = bits.Add64(lo, uint64(units)-1, 0)
	hi += c
	if hi >= uint64(units) {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, uint64(units))
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

// waitFor is how long from now, when the bucket holds lv units and acc
// credit (at), until it holds amount, when
// nothing takes from it and no slice is renewed: each slice's carve ends
// at its term (one already past ends now, at the next reap), crediting the
// refill up to then under it, and then gives back its share of the refill
// and of the room, as uncarve does. While carves remain, amount must fit
// the room they leave; after the last, the wait is wait's (which, for what
// rate waiters ask on top, counts past the size). At most math.MaxInt64.
func (b *bucket) waitFor(amount, now, lv, acc int64) int64 {
	if len(b.carves) == 0 {
		return b.wait(amount, lv, acc)
	}
	sim := bucket{Rate: b.Rate, level: lv, acc: acc, stamp: now}
	for t := now; ; {
		sim.carved, sim.carvedSize = 0, 0
		next := int64(math.MaxInt64)
		for _, c := range b.carves {
			if c.until > t {
				sim.carved += c.units
				sim.carvedSize += c.burst
				next = min(next, c.until)
			}
		}
		if sim.level >= amount {
			return t - now
		}
		if next == math.MaxInt64 || amount <= sim.room() {
			if w := sim.wait(amount, sim.level, sim.acc); next == math.MaxInt64 || w <= next-t {
				return min(t-now, math.MaxInt64-w) + w
			}
		}
		sim.level, sim.acc = sim.at(next)
		sim.stamp, t = next, next
	}
}

// take refills to now and takes amount out; the caller has checked that
// it fits. A give-back puts units back (negative amount), never past the
// bucket's size.
func (b *bucket) take(amount, now int64) {
	b.level, b.acc = b.at(now)
	b.stamp = max(b.stamp, now)
	if amount < 0 {
		b.level += min(-amount, max(0, b.room()-b.level))
		if b.level >= b.room() {
			b.acc = 0
		}
		return
	}
	b.level -= amount
}

// set gives the bucket a new rate at now: what it holds is refilled under
// the old rate first and kept, up to the new size; a new bucket starts full.
func (b *bucket) set(r Rate, now int64, fresh bool) {
	if fresh {
		b.Rate, b.level, b.acc, b.stamp = r, r.size(), 0, now
		return
	}
	b.level, _ = b.at(now)
	b.stamp = max(b.stamp, now)
	b.Rate, b.acc = r, 0
	b.level = min(b.level, b.room())
}

func (b *bucket) view() BucketView {
	v := BucketView{Rate: b.Rate, Level: b.level, Acc: b.acc, Stamp: b.stamp}
	for _, id := range slices.Sorted(maps.Keys(b.carves)) {
		c := b.carves[id]
		v.Carves = append(v.Carves, BucketCarve{Slice: id, Units: c.units, Burst: c.burst})
	}
	return v
}

// RateError is a charge refused for a rate: the bucket of Resource on
// Node holds Level units and the charge asked Amount; it will hold enough
// RetryAfter from the refusal, when nothing else takes from it and no slice
// of it is renewed (bucket.waitFor). It matches
// ErrRateLimited.
type RateError struct {
	Resource   string
	Node       NodeID
	NodeName   string
	Rate       Rate
	Level      int64
	Amount     int64
	RetryAfter time.Duration
}

func (e *RateError) Error() string {
	return fmt.Sprintf("rate limited: %s on %q (node %d) is %d per %v, burst %d: %d left, asked %d; retry after %v",
		e.Resource, e.NodeName, e.Node, e.Rate.Units, time.Duration(e.Rate.Per), e.Rate.size(), e.Level, e.Amount, e.RetryAfter)
}

// Is makes errors.Is(e, ErrRateLimited) true.
func (e *RateError) Is(target error) bool { return target == ErrRateLimited }

// checkRateAhead returns nil when amount of r fits in every bucket of r on
// n's chain at now, leaving in each what the rate waiters below it ask
// (ahead, nil when none wait; ratewait.go). A charge larger than some
// bucket's size can never fit: it is ErrInvalid, not a wait. Otherwise it
// returns the *RateError of the bucket that takes longest to hold the
// waiters' charges and its own.
func (n *node) checkRateAhead(r string, amount, now int64, ahead func(*node, string) int64) error {
	var worst *node
	var wait, level int64
	for a := n; a != nil; a = a.parent {
		b := a.rates[r]
		if b == nil {
			continue
		}
		if amount > b.size() {
			return invalid("a charge of %d %s can never fit the rate on %q: %d per %v holds at most %d",
				amount, r, a.name, b.Units, time.Duration(b.Per), b.size())
		}
		need := amount
		if ahead != nil {
			need = saturatingAdd(amount, ahead(a, r))
		}
		lv, acc := b.at(now)
		if lv >= need {
			continue
		}
		if w := b.waitFor(need, now, lv, acc); worst == nil || w > wait {
			worst, wait, level = a, w, lv
		}
	}
	if worst == nil {
		return nil
	}
	return &RateError{Resource: r, Node: worst.id, NodeName: worst.name, Rate: worst.rates[r].Rate,
		Level: level, Amount: amount, RetryAfter: time.Duration(wait)}
}

// checkRates is checkRate for several charges made together (each names
// another resource), answering the longest wait.
func (n *node) checkRates(charges []Charge, now int64) error {
	return n.checkRatesAhead(charges, now, nil)
}

// checkRatesAhead is checkRateAhead for several charges made together.
func (n *node) checkRatesAhead(charges []Charge, now int64, ahead func(*node, string) int64) error {
	var worst *RateError
	for _, c := range charges {
		err := n.checkRateAhead(c.Resource, c.Amount, now, ahead)
		var re *RateError
		if !errors.As(err, &re) {
			if err != nil {
				return err
			}
			continue
		}
		if worst == nil || re.RetryAfter > worst.RetryAfter {
			worst = re
		}
	}
	if worst == nil {
		return nil
	}
	return worst
}

// takeRate takes amount of r from every bucket on n's chain at at (apply's
// time), or, negative, gives it back. Taking nothing changes nothing.
func (n *node) takeRate(r string, amount, at int64) {
	if amount == 0 {
		return
	}
	for a := n; a != nil; a = a.parent {
		if b := a.rates[r]; b != nil {
			b.take(amount, at)
		}
	}
}

func (n *node) takeRates(charges []Charge, at int64, sign int64) {
	for _, c := range charges {
		n.takeRate(c.Resource, sign*c.Amount, at)
	}
}

// setRates applies an edit of n's rates at now; NoCap removes one.
func (n *node) setRates(edit map[string]Rate, now int64) {
	for k, r := range edit {
		if r.Units == NoCap {
			delete(n.rates, k)
			continue
		}
		if n.rates == nil {
			n.rates = make(map[string]*bucket)
		}
		b := n.rates[k]
		fresh := b == nil
		if fresh {
			b = &bucket{}
			n.rates[k] = b
		}
		b.set(r, now, fresh)
	}
	if len(n.rates) == 0 {
		n.rates = nil
	}
}

// rateViews is n's buckets as stored, nil when it has none.
func (n *node) rateViews() map[string]BucketView {
	if len(n.rates) == 0 {
		return nil
	}
	out := make(map[string]BucketView, len(n.rates))
	for k, b := range n.rates {
		out[k] = b.view()
	}
	return out
}

// restoreRates rebuilds n's buckets from a snapshot, with their carves;
// restoreSlices checks that each carve's slice lives.
func (n *node) restoreRates(v map[string]BucketView) error {
	for k, bv := range v {
		if err := bv.Rate.validate("rate " + k); err != nil || bv.Units == NoCap ||
			bv.Level < 0 || bv.Level > bv.size() || bv.Acc < 0 || bv.Acc >= bv.Per {
			return fmt.Errorf("%w: snapshot node %d has a bad rate on %s", ErrCorrupt, n.id, k)
		}
		if n.rates == nil {
			n.rates = make(map[string]*bucket, len(v))
		}
		b := &bucket{Rate: bv.Rate, level: bv.Level, acc: bv.Acc, stamp: bv.Stamp}
		for _, c := range bv.Carves {
			if c.Units < 1 || c.Burst < 1 || c.Units > math.MaxInt64-b.carved || c.Burst > math.MaxInt64-b.carvedSize || b.carves[c.Slice] != (carve{}) {
				return fmt.Errorf("%w: snapshot node %d has a bad carve of slice %d on %s", ErrCorrupt, n.id, c.Slice, k)
			}
			b.addCarve(c.Slice, carve{units: c.Units, burst: c.Burst}) // until: restoreSlices
		}
		if b.level > b.room() {
			return fmt.Errorf("%w: snapshot node %d holds %d %s, more than its slices leave", ErrCorrupt, n.id, b.level, k)
		}
		n.rates[k] = b
	}
	return nil
}

// RateStatus is where one rate stands at the time it is read.
type RateStatus struct {
	Node     NodeID
	NodeName string
	Name     string // the resource
	Rate     Rate
	Size     int64 // the bucket's size (Burst, or Units when Burst is 0)
	Level    int64 // units in the bucket now
	// Full is how long until the bucket is full again, 0 when it is: its
	// slices' carves end at their terms first (bucket.waitFor).
	Full time.Duration
	// Slices is how many live slices carve the bucket (slice.go): Lent
	// units of its size and LentUnits of its refill per Per are theirs,
	// spent by their holders from local buckets until their terms end.
	Slices    int
	Lent      int64
	LentUnits int64
}

// RateStatus lists the rates on id's chain, from id up to the root, each
// node's sorted by resource, with their fill at the engine's clock. It
// reads under the lock and emits nothing.
func (e *Engine) RateStatus(sid SessionID, id NodeID) ([]RateStatus, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.tick()
	n, err := e.sessionTarget(sid, id, now)
	if err != nil {
		return nil, err
	}
	var out []RateStatus
	for a := n; a != nil; a = a.parent {
		out = a.appendRateStatus(out, now)
	}
	return out, nil
}

// appendRateStatus appends n's own rates, sorted by resource, with their
// fill at now.
func (n *node) appendRateStatus(out []RateStatus, now int64) []RateStatus {
	for _, k := range slices.Sorted(maps.Keys(n.rates)) {
		b := n.rates[k]
		lv, acc := b.at(now)
		st := RateStatus{Node: n.id, NodeName: n.name, Name: k, Rate: b.Rate, Size: b.size(), Level: lv,
			Slices: len(b.carves), Lent: b.carvedSize, LentUnits: b.carved}
		if lv < b.size() {
			st.Full = time.Duration(b.waitFor(b.size(), now, lv, acc))
		}
		out = append(out, st)
	}
	return out
}

func validRateSets(rates, defRates map[string]Rate) error {
	if err := validRates("rate", rates); err != nil {
		return err
	}
	return validRates("default rate", defRates)
}

// mergeRates is base with edit applied; NoCap removes a rate.
func mergeRates(base, edit map[string]Rate) map[string]Rate {
	return mergeMap(base, edit, func(r Rate) bool { return r.Units == NoCap })
}

// fingerprintRates adds rates to a request's fingerprint, only when some
// are set, so that an edit or spec without them keeps the fingerprint it
// always had.
func fingerprintRates(h uint64, sets ...map[string]Rate) uint64 {
	for i, m := range sets {
		if m == nil {
			continue
		}
		h = fnvAdd(h, uint64(i+11))
		for _, k := range slices.Sorted(maps.Keys(m)) {
			r := m[k]
			h = fnvAdd(fnvAdd(fnvAdd(fnvString(h, k), uint64(r.Units)), uint64(r.Per)), uint64(r.Burst))
		}
	}
	return h
}

// rated reports whether a rate binds r on n's chain: a bucket of r on n or
// an ancestor. Such a resource is not delegated (Reservation.Rated).
func (n *node) rated(r string) bool {
	for a := n; a != nil; a = a.parent {
		if a.rates[r] != nil {
			return true
		}
	}
	return false
}

// reserveRate checks an exact reservation's grant (one call's hold) against
// the rates on n's chain: it takes all of it from every bucket when
// reserved, or is refused as a charge of it would be. Units returned
// unspent do not go back, since the time they stood for has passed. A
// reservation that is not exact never meets a rate: a rated resource is
// not delegated (reserveWant).
func (n *node) reserveRate(r ReserveRequest, grant, now int64, ahead func(*node, string) int64) (int64, error) {
	if r.Exact {
		return grant, n.checkRateAhead(r.Resource, grant, now, ahead)
	}
	return grant, nil
}
