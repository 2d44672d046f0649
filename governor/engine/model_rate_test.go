package engine

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"math/big"
	"slices"
	"strings"
	"time"
)

// The model's rates (rate.go), kept apart from the engine's arithmetic: a
// bucket holds an exact rational number of units, refilled by elapsed ns ×
// units / per and clipped to its size, in math/big rather than the
// engine's 128-bit words. It checks I26 on each event that takes from a
// bucket and answers the refusals the driver checks.

// mBucket is one rate on one node.
type mBucket struct {
	rate    Rate
	content *big.Rat // units in the bucket at stamp
	stamp   int64
	// carves are the live slices' carves, by slice id: units of the
	// refill per the rate's period, and of the size (model_slice_test.go).
	carves map[uint64][2]int64
}

// carvedSums are the carves' units and bursts.
func (b *mBucket) carvedSums() (units, burst int64) {
	for _, c := range b.carves {
		units += c[0]
		burst += c[1]
	}
	return units, burst
}

// refill is the units per period the bucket refills at: its rate's, less
// its slices'.
func (b *mBucket) refill() int64 {
	u, _ := b.carvedSums()
	return max(0, b.rate.Units-u)
}

type modelRates struct {
	// slices are the live slices of rates, by id (model_slice_test.go).
	slices   map[uint64]*mSlice
	rates    map[NodeID]map[string]*mBucket
	defRates map[NodeID]map[string]Rate
	// rateTaken counts takes from buckets, for the run's coverage.
	rateTaken int
}

// neverFitsRate reports whether err is the refusal of a charge larger
// than a bucket's size (rate.go), an ErrInvalid the model decides apart.
func neverFitsRate(err error) bool {
	return errors.Is(err, ErrInvalid) && strings.Contains(err.Error(), "can never fit the rate")
}

func (m *model) initRates() {
	m.rates = map[NodeID]map[string]*mBucket{}
	m.defRates = map[NodeID]map[string]Rate{}
	m.slices = map[uint64]*mSlice{}
}

// full is the bucket's size: what a charge can never be larger than.
func (b *mBucket) full() int64 {
	if b.rate.Burst == 0 {
		return b.rate.Units
	}
	return b.rate.Burst
}

// size is what the bucket may hold: its size less its slices' bursts.
func (b *mBucket) size() *big.Rat {
	_, burst := b.carvedSums()
	return new(big.Rat).SetInt64(max(0, b.full()-burst))
}

// at is the bucket's content at now: no credit for a time before stamp.
func (b *mBucket) at(now int64) *big.Rat {
	c := new(big.Rat).Set(b.content)
	if now > b.stamp {
		el := new(big.Int).Sub(big.NewInt(now), big.NewInt(b.stamp))
		credit := new(big.Rat).SetFrac(el.Mul(el, big.NewInt(b.refill())), big.NewInt(b.rate.Per))
		c.Add(c, credit)
	}
	if s := b.size(); c.Cmp(s) > 0 {
		c = s
	}
	return c
}

// wait is how long until the bucket holds amount, from content c:
// ceil((amount - c) × per / units) ns, saturated at math.MaxInt64.
func (b *mBucket) wait(amount int64, c *big.Rat) int64 {
	need := new(big.Rat).Sub(new(big.Rat).SetInt64(amount), c)
	if need.Sign() <= 0 {
		return 0
	}
	if b.refill() == 0 {
		return math.MaxInt64
	}
	ns := need.Mul(need, new(big.Rat).SetFrac(big.NewInt(b.rate.Per), big.NewInt(b.refill())))
	q, r := new(big.Int).QuoRem(ns.Num(), ns.Denom(), new(big.Int))
	if r.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	if !q.IsInt64() {
		return math.MaxInt64
	}
	return q.Int64()
}

func (b *mBucket) take(amount, at int64) {
	b.content = b.at(at)
	b.stamp = max(b.stamp, at)
	b.content.Sub(b.content, new(big.Rat).SetInt64(amount))
	if s := b.size(); b.content.Cmp(s) > 0 { // a give-back never overfills
		b.content = s
	}
}

func ratOverlay(base, edit map[string]Rate) map[string]Rate {
	out := map[string]Rate{}
	for k, r := range base {
		out[k] = r
	}
	for k, r := range edit {
		if r.Units == NoCap {
			delete(out, k)
		} else {
			out[k] = r
		}
	}
	return out
}

// setRate gives node id the rate r on resource k at at: a new bucket is
// full; an edited one keeps its whole units, up to the new size.
func (m *model) setRate(id NodeID, k string, r Rate, at int64) {
	if m.rates[id] == nil {
		m.rates[id] = map[string]*mBucket{}
	}
	b := m.rates[id][k]
	if r.Units == NoCap {
		delete(m.rates[id], k)
		return
	}
	if b == nil {
		b = &mBucket{rate: r, stamp: at}
		b.content = b.size()
		m.rates[id][k] = b
		return
	}
	c := b.at(at)
	whole := new(big.Int).Quo(c.Num(), c.Denom()) // content is never negative
	b.rate, b.stamp = r, max(b.stamp, at)
	b.content = new(big.Rat).SetInt(whole)
	if s := b.size(); b.content.Cmp(s) > 0 {
		b.content = s
	}
}

// rateEvent follows the events that touch rates. It runs before the
// model's own apply, which forgets a released lease and reclaimed nodes.
func (m *model) rateEvent(ev Event) {
	switch ev.Kind {
	case EvNodeCreated:
		for k, r := range ratOverlay(m.defRates[ev.Parent], ev.Spec.Rates) {
			m.setRate(ev.Node, k, r, ev.At)
		}
		m.defRates[ev.Node] = ratOverlay(m.defRates[ev.Parent], nil)
		if ev.Spec.DefaultRates != nil {
			m.defRates[ev.Node] = ratOverlay(nil, ev.Spec.DefaultRates)
		}
	case EvCapsSet:
		for k, r := range ev.Caps.Rates {
			m.setRate(ev.Node, k, r, ev.At)
		}
		m.defRates[ev.Node] = ratOverlay(m.defRates[ev.Node], ev.Caps.DefaultRates)
	case EvConsumed:
		m.takeRate(ev, ev.Node, ev.Resource, ev.Amount)
	case EvCharged, EvLeaseGranted:
		if ev.GivenBack { // a charge without a lease undone (EvCharged)
			m.giveRatesBack(ev.Node, ev.Charges, ev.At)
			break
		}
		for _, c := range ev.Charges {
			m.takeRate(ev, ev.Node, c.Resource, c.Amount)
		}
	case EvReserved:
		if ev.Slice != nil {
			m.sliceEvent(ev)
		} else if ev.Amount > 0 {
			m.takeRate(ev, ev.Node, ev.Resource, ev.Amount)
		}
	case EvSliceEnded, EvSessionEnded:
		m.slicesEnded(ev)
	case EvLeaseReleased:
		if l, ok := m.leases[ev.Lease]; ok && ev.GivenBack {
			m.giveRatesBack(l.node, ev.Charges, ev.At)
		}
	case EvNodesReclaimed:
		for _, root := range ev.Nodes {
			for _, id := range m.subtree(root) {
				delete(m.rates, id)
				delete(m.defRates, id)
			}
		}
	}
}

// takeRate checks I26 (no charge or reservation takes more than a bucket
// on its chain holds at its time) and takes it.
func (m *model) takeRate(ev Event, id NodeID, r string, amount int64) {
	for _, a := range m.chain(id) {
		b := m.rates[a][r]
		if b == nil {
			continue
		}
		if c := b.at(ev.At); c.Cmp(new(big.Rat).SetInt64(amount)) < 0 {
			m.failf("I26 rates: event %d (%s) takes %d of %s on node %d; node %d's bucket (%d per %v, size %v) holds %s",
				ev.Seq, ev.Kind, amount, r, id, a, b.rate.Units, time.Duration(b.rate.Per), b.size(), c.FloatString(3))
		}
		b.take(amount, ev.At)
		m.rateTaken++
	}
}

// ratesFit: every charge fits every bucket on id's chain at now.
func (m *model) ratesFit(id NodeID, charges map[string]int64, now int64) bool {
	for r, amount := range charges {
		if !m.rateFits(id, r, amount, now) {
			return false
		}
	}
	return true
}

func (m *model) rateFits(id NodeID, r string, amount, now int64) bool {
	for _, a := range m.chain(id) {
		if b := m.rates[a][r]; b != nil && b.at(now).Cmp(new(big.Rat).SetInt64(amount)) < 0 {
			return false
		}
	}
	return true
}

// rateWait is the longest wait of the buckets on id's chain for amount
// of r at now; tooBig is set when some bucket can never hold it.
func (m *model) rateWait(id NodeID, r string, amount, now int64) (wait int64, tooBig bool) {
	_, wait, tooBig = m.rateWorst(id, r, amount, now)
	return wait, tooBig
}

// rateWorst is rateWait with the node whose bucket waits longest (the
// lowest on a tie), 0 when none waits.
func (m *model) rateWorst(id NodeID, r string, amount, now int64) (node NodeID, wait int64, tooBig bool) {
	for _, a := range m.chain(id) {
		b := m.rates[a][r]
		if b == nil {
			continue
		}
		if b.full() < amount {
			return 0, 0, true
		}
		if w := m.bucketWait(b, amount, now); w > wait {
			node, wait = a, w
		}
	}
	return node, wait, false
}

// bucketWait is how long from now until b holds amount, with nothing
// taken from it and no slice renewed: the model's slices end at their
// terms (one past its term at now), each crediting the refill up to then
// under its carve and then giving back its share of the refill and the
// room. While carves remain, amount must fit the room they leave; after
// the last, the wait is wait's.
func (m *model) bucketWait(b *mBucket, amount, now int64) int64 {
	sim := &mBucket{rate: b.rate, content: b.at(now), stamp: now, carves: maps.Clone(b.carves)}
	for t := now; ; {
		maps.DeleteFunc(sim.carves, func(id uint64, _ [2]int64) bool { return m.slices[id].until <= t })
		next := int64(math.MaxInt64)
		for id := range sim.carves {
			next = min(next, m.slices[id].until)
		}
		w := sim.wait(amount, sim.content)
		if next == math.MaxInt64 || (sim.size().Cmp(new(big.Rat).SetInt64(amount)) >= 0 && t+w <= next && w <= math.MaxInt64-t) {
			return saturatingAdd(t-now, w)
		}
		sim.content, sim.stamp, t = sim.at(next), next, next
	}
}

// rateRefusal is how charges on id are refused for rate at now, as
// dryRunAnswer writes it: invalid when one can never fit, else the
// longest wait (the first charge by name, the lowest node, on a tie); ""
// when every bucket holds them.
func (m *model) rateRefusal(id NodeID, charges map[string]int64, now int64) string {
	var worst string
	var node NodeID
	var wait int64
	for _, r := range slices.Sorted(maps.Keys(charges)) {
		n, w, tooBig := m.rateWorst(id, r, charges[r], now)
		if tooBig {
			return "invalid"
		}
		if w > wait {
			worst, node, wait = r, n, w
		}
	}
	if worst == "" {
		return ""
	}
	return fmt.Sprintf("rate limited %d of %s at n%d, retry after %v", charges[worst], worst, node, time.Duration(wait))
}

// giveRatesBack puts charges given back whole into every bucket on id's
// chain, never past what it may hold.
func (m *model) giveRatesBack(id NodeID, charges []Charge, at int64) {
	for _, c := range charges {
		for _, a := range m.chain(id) {
			if b := m.rates[a][c.Resource]; b != nil {
				b.take(-c.Amount, at)
			}
		}
	}
}

// checkRates compares the engine's buckets with the model's: the same
// rates and defaults, and the same content at the same stamp.
func (w *world) checkRates() {
	for id, n := range w.e.nodes {
		mr := w.m.rates[id]
		if len(n.rates) != len(mr) {
			w.fail("node %d rates: engine %v, model %d buckets", id, n.rateViews(), len(mr))
			continue
		}
		for k, b := range n.rates {
			mb := mr[k]
			if mb == nil || mb.rate != b.Rate || mb.stamp != b.stamp {
				w.fail("node %d rate %s: engine %+v, model %+v", id, k, b.view(), mb)
				continue
			}
			got := new(big.Rat).Add(new(big.Rat).SetInt64(b.level), new(big.Rat).SetFrac64(b.acc, b.Per))
			if got.Cmp(mb.content) != 0 {
				w.fail("node %d rate %s: engine holds %s (%+v), model %s", id, k, got.FloatString(3), b.view(), mb.content.FloatString(3))
			}
		}
		if !mapsEqualRates(n.defRates, w.m.defRates[id]) {
			w.fail("node %d default rates: engine %v, model %v", id, n.defRates, w.m.defRates[id])
		}
	}
}

func mapsEqualRates(a, b map[string]Rate) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// checkRateRefusal checks a refusal for rate (I27): the bucket it names
// is on the chain and holds less than asked, and the wait is the longest
// of the chain's, exactly; a charge larger than a bucket is invalid.
func (w *world) checkRateRefusal(what string, err error, n NodeID, r string, amount int64) {
	if neverFitsRate(err) {
		w.tally.rateNever++
		if _, tooBig := w.m.rateWait(n, r, amount, w.clock.Now().UnixNano()); !tooBig {
			w.fail("I27 %s: %v, but every bucket on the chain can hold %d", what, err, amount)
		}
	}
	re, ok := err.(*RateError)
	if !ok {
		return
	}
	w.tally.rateRefused++
	now := w.clock.Now().UnixNano()
	want, tooBig := w.m.rateWait(n, r, amount, now)
	switch {
	case tooBig:
		w.fail("I27 %s: refused for rate (%v), but %d can never fit: it must be invalid", what, err, amount)
	case re.Resource != r || re.Amount != amount || re.Node != func() NodeID { id, _, _ := w.m.rateWorst(n, r, amount, now); return id }():
		w.fail("I27 %s: refused for rate naming %s %d on node %d, asked %d of %s on node %d", what, re.Resource, re.Amount, re.Node, amount, r, n)
	case w.m.rateFits(n, r, amount, now):
		w.fail("I27 %s: refused for rate (%v), but every bucket on the chain holds %d", what, err, amount)
	case int64(re.RetryAfter) != want:
		w.fail("I27 %s: retry after %v, the model's longest wait is %v", what, re.RetryAfter, time.Duration(want))
	}
}
