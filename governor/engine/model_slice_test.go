package engine

import (
	"math/big"
	"slices"
	"time"

	"maps"
)

// The model's slices of rates (slice.go), checked as they are granted,
// renewed and ended (I29): a slice is granted only when every bucket of
// its resource on its chain is quiet (holds at least half of what it may
// hold, in whole units), is sized as the rule says, and carves from every
// bucket at least its own rate, in that bucket's units, and its burst,
// which the bucket holds at that instant; no bucket's slices carve more
// than half its refill or half its size when granted. The model's buckets
// then refill at their rate less the carves (model_rate_test.go), and a
// slice's end credits the refill up to its instant first.

type mSlice struct {
	session  SessionID
	node     NodeID
	resource string
	rate     Rate
	until    int64
}

// quiet is the engine's test of contention, on the model's rationals.
func (b *mBucket) quiet(now int64) bool {
	c := b.at(now)
	whole := new(big.Int).Quo(c.Num(), c.Denom())
	room := new(big.Int).Quo(b.size().Num(), b.size().Denom())
	return new(big.Int).Mul(whole, big.NewInt(2)).Cmp(room) >= 0
}

// expectedSlice is the slice the rule grants on id's chain at now, nil
// when none: computed apart from the engine, in big integers.
func (m *model) expectedSlice(id NodeID, r string, now int64) *SliceGrant {
	var per int64
	units, burst := big.NewInt(1<<62), int64(1<<62)
	var buckets []*mBucket
	var nodes []NodeID
	for _, a := range m.chain(id) {
		b := m.rates[a][r]
		if b == nil {
			continue
		}
		buckets, nodes = append(buckets, b), append(nodes, a)
		if per == 0 {
			per = b.rate.Per
		}
		if !b.quiet(now) {
			return nil
		}
		cu, cb := b.carvedSums()
		share := new(big.Int).Mul(big.NewInt((b.rate.Units/2-cu)/2), big.NewInt(per))
		share.Quo(share, big.NewInt(b.rate.Per))
		if share.Cmp(units) < 0 {
			units = share
		}
		c := b.at(now)
		whole := new(big.Int).Quo(c.Num(), c.Denom()).Int64()
		burst = min(burst, (b.full()/2-cb)/2, whole)
	}
	if per == 0 || units.Sign() <= 0 || burst < 1 {
		return nil
	}
	g := &SliceGrant{Rate: Rate{Units: units.Int64(), Per: per, Burst: burst}, Until: expiry(now, SliceTerm)}
	for i, b := range buckets {
		c := new(big.Int).Mul(units, big.NewInt(b.rate.Per))
		q, rem := new(big.Int).QuoRem(c, big.NewInt(per), new(big.Int))
		if rem.Sign() > 0 {
			q.Add(q, big.NewInt(1))
		}
		cu, _ := b.carvedSums()
		if !q.IsInt64() || q.Int64() > b.rate.Units/2-cu {
			return nil
		}
		g.Carves = append(g.Carves, SliceCarve{Node: nodes[i], Units: q.Int64()})
	}
	return g
}

// sliceEvent checks and applies the slice an EvReserved grants or renews.
func (m *model) sliceEvent(ev Event) {
	g := ev.Slice
	if g.ID != 0 {
		sl := m.slices[g.ID]
		if sl == nil || sl.session != ev.Session || sl.node != ev.Node || sl.resource != ev.Resource {
			m.failf("I29 slices: event %d renews slice %d, which session %d does not hold on n%d", ev.Seq, g.ID, ev.Session, ev.Node)
			return
		}
		for _, a := range m.chain(ev.Node) {
			b := m.rates[a][ev.Resource]
			if b == nil {
				continue
			}
			cu, cb := b.carvedSums()
			if _, ok := b.carves[g.ID]; !ok || !b.quiet(ev.At) || cu > b.rate.Units/2 || cb > b.full()/2 {
				m.failf("I29 slices: event %d renews slice %d while n%d's bucket of %s is contended, not carved by it, or carved past half", ev.Seq, g.ID, a, ev.Resource)
			}
		}
		sl.until = max(sl.until, g.Until)
		return
	}
	want := m.expectedSlice(ev.Node, ev.Resource, ev.At)
	if want == nil || want.Rate != g.Rate || want.Until != g.Until || !slices.Equal(want.Carves, g.Carves) {
		m.failf("I29 slices: event %d grants slice %+v of %s on n%d; the model's rule gives %+v", ev.Seq, g, ev.Resource, ev.Node, want)
	}
	for _, c := range g.Carves {
		b := m.rates[c.Node][ev.Resource]
		if b == nil {
			m.failf("I29 slices: event %d carves n%d, which has no bucket of %s", ev.Seq, c.Node, ev.Resource)
			continue
		}
		// The carve covers the slice's rate: c/Per_b >= units/per.
		if new(big.Int).Mul(big.NewInt(c.Units), big.NewInt(g.Rate.Per)).Cmp(
			new(big.Int).Mul(big.NewInt(g.Rate.Units), big.NewInt(b.rate.Per))) < 0 {
			m.failf("I29 slices: event %d carves %d per %v of n%d's %s for a slice of %d per %v", ev.Seq, c.Units,
				time.Duration(b.rate.Per), c.Node, ev.Resource, g.Rate.Units, time.Duration(g.Rate.Per))
		}
		b.take(g.Rate.Burst, ev.At) // checks it holds the burst, as a charge
		if b.content.Sign() < 0 {
			m.failf("I29 slices: event %d takes a burst of %d from n%d's %s, which holds less", ev.Seq, g.Rate.Burst, c.Node, ev.Resource)
		}
		if b.carves == nil {
			b.carves = map[uint64][2]int64{}
		}
		b.carves[ev.Seq] = [2]int64{c.Units, g.Rate.Burst}
	}
	m.slices[ev.Seq] = &mSlice{session: ev.Session, node: ev.Node, resource: ev.Resource, rate: g.Rate, until: g.Until}
}

// slicesEnded ends the slice an EvSliceEnded names, or every slice of an
// ended session, crediting each bucket's refill up to the event first.
func (m *model) slicesEnded(ev Event) {
	found := false
	for _, id := range slices.Sorted(maps.Keys(m.slices)) {
		sl := m.slices[id]
		if sl.session != ev.Session || (ev.Kind == EvSliceEnded && (sl.node != ev.Node || sl.resource != ev.Resource)) {
			continue
		}
		found = true
		for _, a := range m.chain(sl.node) {
			b := m.rates[a][sl.resource]
			if b == nil || b.carves == nil {
				continue
			}
			if _, ok := b.carves[id]; !ok {
				continue
			}
			b.content, b.stamp = b.at(ev.At), max(b.stamp, ev.At)
			delete(b.carves, id)
		}
		delete(m.slices, id)
	}
	if ev.Kind == EvSliceEnded && !found {
		m.failf("I29 slices: event %d ends a slice of %s on n%d that session %d does not hold", ev.Seq, ev.Resource, ev.Node, ev.Session)
	}
}

// checkSlices compares the engine's slices and carves with the model's.
func (w *world) checkSlices() {
	if len(w.e.slices) != len(w.m.slices) {
		w.fail("I29 slices: engine holds %d slices, model %d", len(w.e.slices), len(w.m.slices))
	}
	for id, sl := range w.e.slices {
		ms := w.m.slices[id]
		if ms == nil || ms.session != sl.session.id || ms.node != sl.node.id || ms.resource != sl.resource || ms.rate != sl.rate || ms.until != sl.until {
			w.fail("I29 slices: engine slice %d %+v, model %+v", id, *sl, ms)
		}
		if sl.session.slices[resKey{sl.node.id, sl.resource}] != sl {
			w.fail("I29 slices: slice %d is not its session's", id)
		}
	}
	for id, n := range w.e.nodes {
		for k, b := range n.rates {
			mb := w.m.rates[id][k]
			if mb == nil {
				continue // checkRates reports it
			}
			got := map[uint64][2]int64{}
			for sid, c := range b.carves {
				got[sid] = [2]int64{c.units, c.burst}
			}
			if len(got) != len(mb.carves) || !maps.Equal(got, mb.carves) {
				w.fail("I29 slices: node %d rate %s carves %v, model %v", id, k, got, mb.carves)
			}
		}
	}
}
