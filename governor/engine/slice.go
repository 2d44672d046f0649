package engine

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"math/bits"
	"slices"
	"time"
)

// A slice is a rate delegated to a session: a share of the refill of every
// bucket of one resource on a node's chain, and of their bursts, granted
// for a short term with a reservation of the resource (Reserve). While it
// lives each bucket refills at Units - Σ carved per Per and holds at most
// its size less the carved bursts, and the holder runs a local bucket at
// the slice's rate (Units per Per, holding Burst, full at the grant: the
// burst was taken from every bucket's level then). In any window of W ns
// the holders admit at most Σ(rᵢ·W + bᵢ) and the shared buckets at most
// (rate - Σrᵢ)·W + (size - Σbᵢ): the fleet never passes rate·W + size.
// Each carve of a bucket is at least the slice's rate in that bucket's
// units (rounded up), so buckets of other periods on the chain hold too.
//
// A slice is granted only while nobody contends for the rate: every
// bucket on the chain holds at least half of what it may hold, and its
// slices have carved at most half its refill and half its size, each new
// one at most half of what is left. Renewing one (another Reserve that
// wants units while it lives) extends its term under the same rule; under
// contention it is not renewed, and ends at its term, so that the rate is
// decided charge by charge again. It ends when given back (EndSlice), at
// its term (Reap), or with its session, and its buckets then refill at
// their whole rate again from that instant, credited up to it first.

// SliceTerm is how long a slice lives unless renewed.
const SliceTerm = 4 * time.Second

type slice struct {
	id       uint64 // the Seq of the event that granted it
	session  *session
	node     *node
	resource string
	rate     Rate  // the holder's local bucket
	until    int64 // when its term ends (engine time)
}

// SliceGrant is a slice granted or renewed, in its EvReserved.
type SliceGrant struct {
	// ID is the slice a renewal extends; 0 for a new slice, whose id is
	// the Seq of its event.
	ID    uint64 `json:"id,omitempty"`
	Rate  Rate   `json:"rate"`
	Until int64  `json:"until"`
	// Carves are what a new slice takes of each bucket's refill, in that
	// bucket's units per its Per; each bucket's size and level give up
	// Rate.Burst.
	Carves []SliceCarve `json:"cv,omitempty"`
}

// SliceCarve is a new slice's carve of the bucket of its resource on Node.
type SliceCarve struct {
	Node  NodeID `json:"n"`
	Units int64  `json:"u"`
}

// Slice is a live slice as its holder is told of it (Reservation.Slice).
type Slice struct {
	ID    uint64
	Rate  Rate  // the local bucket: Units per Per, holding Burst
	Until int64 // when its term ends, on the engine's clock
	// Left is how long its term has left at the answer: the holder counts
	// it from before it asked, so that it stops first.
	Left time.Duration
}

func (b *bucket) addCarve(id uint64, c carve) {
	if b.carves == nil {
		b.carves = make(map[uint64]carve)
	}
	b.carves[id] = c
	b.carved += c.units
	b.carvedSize += c.burst
}

// uncarve ends slice id's carve of b at at: the refill is credited up to
// at under the carve, and runs at the whole rate from then.
func (b *bucket) uncarve(id uint64, at int64) {
	c, ok := b.carves[id]
	if !ok {
		return
	}
	b.level, b.acc = b.at(at)
	b.stamp = max(b.stamp, at)
	delete(b.carves, id)
	b.carved -= c.units
	b.carvedSize -= c.burst
	if len(b.carves) == 0 {
		b.carves = nil
	}
}

// quiet reports whether nobody contends for b at now: it holds at least
// half of what it may hold.
func (b *bucket) quiet(now int64) bool {
	lv, _ := b.at(now)
	return lv >= b.room()-lv
}

// mulDiv is x·y/d rounded down (up with ceil), at most math.MaxInt64.
func mulDiv(x, y, d int64, ceil bool) int64 {
	hi, lo := bits.Mul64(uint64(x), uint64(y))
	if ceil {
		var c uint64
		lo, c = bits.Add64(lo, uint64(d)-1, 0)
		hi += c
	}
	if hi >= uint64(d) {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, uint64(d))
	return int64(min(q, math.MaxInt64))
}

// newSlice sizes a new slice of r on n's chain at now, or returns nil when
// none may be granted: no bucket, contention, or too little left to carve.
// Its period is the nearest bucket's.
func (n *node) newSlice(r string, now int64) *SliceGrant {
	var per int64
	units, burst := int64(math.MaxInt64), int64(math.MaxInt64)
	for a := n; a != nil; a = a.parent {
		b := a.rates[r]
		if b == nil {
			continue
		}
		if per == 0 {
			per = b.Per
		}
		lv, _ := b.at(now)
		if !b.quiet(now) {
			return nil
		}
		units = min(units, mulDiv((b.Units/2-b.carved)/2, per, b.Per, false))
		burst = min(burst, (b.size()/2-b.carvedSize)/2, lv)
	}
	if per == 0 || units < 1 || burst < 1 {
		return nil
	}
	g := &SliceGrant{Rate: Rate{Units: units, Per: per, Burst: burst}, Until: expiry(now, SliceTerm)}
	for a := n; a != nil; a = a.parent {
		if b := a.rates[r]; b != nil {
			c := mulDiv(units, b.Per, per, true)
			if c > b.Units/2-b.carved {
				return nil
			}
			g.Carves = append(g.Carves, SliceCarve{Node: a.id, Units: c})
		}
	}
	return g
}

// renews reports whether sl may be renewed at now: every bucket of its
// resource on its chain is carved by it, carved at most half, and quiet.
func (sl *slice) renews(now int64) bool {
	for a := sl.node; a != nil; a = a.parent {
		b := a.rates[sl.resource]
		if b == nil {
			continue
		}
		if _, ok := b.carves[sl.id]; !ok || b.carved > b.Units/2 || b.carvedSize > b.size()/2 || !b.quiet(now) {
			return false
		}
	}
	return true
}

// sliceFor is the slice a reservation of r on n by s is granted at now: a
// renewal of the one s holds there, a new one, or nil.
func (e *Engine) sliceFor(s *session, n *node, r string, now int64) *SliceGrant {
	if sl := s.slices[resKey{n.id, r}]; sl != nil {
		if !sl.renews(now) {
			return nil
		}
		return &SliceGrant{ID: sl.id, Rate: sl.rate, Until: expiry(now, SliceTerm)}
	}
	return n.newSlice(r, now)
}

// sliceView is s's slice of r on node as its holder is told of it at now.
func (s *session) sliceView(node NodeID, r string, now int64) *Slice {
	sl := s.slices[resKey{node, r}]
	if sl == nil {
		return nil
	}
	return &Slice{ID: sl.id, Rate: sl.rate, Until: sl.until, Left: time.Duration(max(0, sl.until-now))}
}

// checkSlice refuses the slice of ev (an EvReserved) on n when it is
// corrupt, before anything of ev applies: a bad rate, a renewal of a slice
// not held, a second slice, or a carve of no bucket on the chain, of one
// bucket twice, or of more than a bucket holds.
func (e *Engine) checkSlice(s *session, n *node, ev *Event) error {
	g, key := ev.Slice, resKey{n.id, ev.Resource}
	if err := g.Rate.validate("slice"); err != nil || g.Rate.Units == NoCap || g.Rate.Burst < 1 {
		return fmt.Errorf("%w: slice of %s on node %d: bad rate %+v", ErrCorrupt, ev.Resource, n.id, g.Rate)
	}
	if g.ID != 0 {
		if sl := s.slices[key]; sl == nil || sl.id != g.ID || len(g.Carves) != 0 {
			return fmt.Errorf("%w: renewal of slice %d of %s on node %d not held", ErrCorrupt, g.ID, ev.Resource, n.id)
		}
		return nil
	}
	if s.slices[key] != nil || e.slices[ev.Seq] != nil {
		return fmt.Errorf("%w: session %d holds a slice of %s on node %d already", ErrCorrupt, s.id, ev.Resource, n.id)
	}
	for i, c := range g.Carves {
		a := e.nodes[c.Node]
		if a == nil || !n.within(a) || a.rates[ev.Resource] == nil || c.Units < 1 ||
			slices.ContainsFunc(g.Carves[:i], func(d SliceCarve) bool { return d.Node == c.Node }) {
			return fmt.Errorf("%w: slice carves %s on node %d", ErrCorrupt, ev.Resource, c.Node)
		}
		b := a.rates[ev.Resource]
		if lv, _ := b.at(ev.At); lv < g.Rate.Burst || b.carved > math.MaxInt64-c.Units {
			return fmt.Errorf("%w: slice carves %d of %s on node %d holding %d", ErrCorrupt, g.Rate.Burst, ev.Resource, c.Node, lv)
		}
	}
	return nil
}

// applySlice grants or renews the slice of ev (an EvReserved) on n, which
// checkSlice has found sound.
func (e *Engine) applySlice(s *session, n *node, ev *Event) {
	g, key := ev.Slice, resKey{n.id, ev.Resource}
	if g.ID != 0 {
		sl := s.slices[key]
		sl.until = max(sl.until, g.Until)
		sl.eachBucket(func(b *bucket) {
			if c, ok := b.carves[sl.id]; ok {
				c.until = sl.until
				b.carves[sl.id] = c
			}
		})
		return
	}
	for _, c := range g.Carves {
		b := e.nodes[c.Node].rates[ev.Resource]
		b.level, b.acc = b.at(ev.At)
		b.stamp = max(b.stamp, ev.At)
		b.level -= g.Rate.Burst
		b.addCarve(ev.Seq, carve{units: c.Units, burst: g.Rate.Burst, until: g.Until})
	}
	e.addSlice(&slice{id: ev.Seq, session: s, node: n, resource: ev.Resource, rate: g.Rate, until: g.Until})
}

func (e *Engine) addSlice(sl *slice) {
	s := sl.session
	if s.slices == nil {
		s.slices = make(map[resKey]*slice)
	}
	s.slices[resKey{sl.node.id, sl.resource}] = sl
	e.slices[sl.id] = sl
	sl.node.pins++
}

// eachBucket calls f with every bucket of sl's resource on its chain.
func (sl *slice) eachBucket(f func(*bucket)) {
	for a := sl.node; a != nil; a = a.parent {
		if b := a.rates[sl.resource]; b != nil {
			f(b)
		}
	}
}

// endSlice ends sl at at: every bucket it carved refills whole again.
func (e *Engine) endSlice(sl *slice, at int64) {
	sl.eachBucket(func(b *bucket) { b.uncarve(sl.id, at) })
	delete(sl.session.slices, resKey{sl.node.id, sl.resource})
	delete(e.slices, sl.id)
	sl.node.pins--
}

// endSlices ends every slice of s at at, when s ends.
func (e *Engine) endSlices(s *session, at int64) {
	for _, sl := range s.sortedSlices() {
		e.endSlice(sl, at)
	}
}

func (e *Engine) applySliceEnded(ev *Event) error {
	s := e.sessions[ev.Session]
	if s == nil || s.slices[resKey{ev.Node, ev.Resource}] == nil {
		return fmt.Errorf("%w: end of a slice of %s on node %d not held by session %d", ErrCorrupt, ev.Resource, ev.Node, ev.Session)
	}
	e.endSlice(s.slices[resKey{ev.Node, ev.Resource}], ev.At)
	return nil
}

// endDueSlices ends, at now, the slices whose term has passed (Reap).
func (e *Engine) endDueSlices(now int64) {
	for _, id := range slices.Sorted(maps.Keys(e.slices)) {
		if sl := e.slices[id]; sl.until <= now {
			e.emit(Event{Kind: EvSliceEnded, At: now, Session: sl.session.id, Node: sl.node.id, Resource: sl.resource})
		}
	}
}

// nextSliceEnd is the earlier of next and the soonest end of a slice's
// term (DueIn).
func (e *Engine) nextSliceEnd(next int64) int64 {
	for _, sl := range e.slices {
		next = min(next, sl.until)
	}
	return next
}

func (s *session) sortedSlices() []*slice {
	out := slices.Collect(maps.Values(s.slices))
	slices.SortFunc(out, func(a, b *slice) int { return cmp.Compare(a.id, b.id) })
	return out
}

// SliceSnapshot is a live slice as recorded, in its session's snapshot.
type SliceSnapshot struct {
	ID       uint64
	Node     NodeID
	Resource string
	Rate     Rate
	Until    int64
}

func (s *session) sliceSnapshots() []SliceSnapshot {
	var out []SliceSnapshot
	for _, sl := range s.sortedSlices() {
		out = append(out, SliceSnapshot{ID: sl.id, Node: sl.node.id, Resource: sl.resource, Rate: sl.rate, Until: sl.until})
	}
	return out
}

// restoreSlices attaches the snapshot's slices to their sessions and
// nodes, checks that every carve of a bucket is a live slice's, of its
// resource, below the bucket's node, and gives each carve its slice's term.
func restoreSlices(snap Snapshot, sessions map[SessionID]*session, nodes map[NodeID]*node) (map[uint64]*slice, error) {
	all := make(map[uint64]*slice)
	for _, ss := range snap.Sessions {
		s := sessions[ss.ID]
		for _, v := range ss.Slices {
			n := nodes[v.Node]
			if n == nil || v.ID == 0 || v.ID > snap.Seq || all[v.ID] != nil || s.slices[resKey{v.Node, v.Resource}] != nil ||
				v.Rate.validate("slice") != nil || v.Rate.Units == NoCap || v.Rate.Burst < 1 {
				return nil, fmt.Errorf("%w: snapshot slice %d of session %d", ErrCorrupt, v.ID, ss.ID)
			}
			sl := &slice{id: v.ID, session: s, node: n, resource: v.Resource, rate: v.Rate, until: v.Until}
			if s.slices == nil {
				s.slices = make(map[resKey]*slice)
			}
			s.slices[resKey{n.id, v.Resource}] = sl
			all[sl.id] = sl
			n.pins++
		}
	}
	for _, n := range nodes {
		for r, b := range n.rates {
			for id := range b.carves {
				sl := all[id]
				if sl == nil || sl.resource != r || !sl.node.within(n) {
					return nil, fmt.Errorf("%w: snapshot node %d carves %s for slice %d, which is not below it", ErrCorrupt, n.id, r, id)
				}
				c := b.carves[id]
				c.until = sl.until
				b.carves[id] = c
			}
		}
	}
	return all, nil
}
