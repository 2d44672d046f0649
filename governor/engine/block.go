package engine

import (
	"fmt"
	"math"
)

// A block is a lease that holds any number of slots of one class on one
// node: what governord delegates to a sidecar, which grants the slots
// locally. Each session has at most one block per node and class. It is
// charged against every limit on its chain exactly like that many leases,
// so limits hold at every instant however many sessions hold blocks. It
// grows only by what fits now and only while no acquire of its class
// queues (so the fair queue stays exact under contention), and it shrinks
// when its holder gives idle slots back. It ends like any lease: released,
// with its session, or revoked with its node. Its slots share the block's
// id, so a block is no fencing token for the work done in each slot.

// blockKey names a session's block.
type blockKey struct {
	node  NodeID
	class string
}

// BlockRequest grows or shrinks the session's block of Class on Node,
// creating it (with the slots that fit, possibly none) when there is none.
type BlockRequest struct {
	Node  NodeID
	Class string
	// Want is how many slots to add. Fewer are added when fewer fit, and
	// none while acquires of the class queue.
	Want int64
	// Return is how many idle slots to give back. A request either grows or
	// shrinks: Want and Return are not both set.
	Return    int64
	RequestID string
}

// BlockGrant is a block after a BlockRequest.
type BlockGrant struct {
	Lease LeaseID
	Node  NodeID
	Class string
	// Count is how many slots the block holds now.
	Count int64
	// Granted is how many slots this request added.
	Granted int64
	// Contended is set while acquires of the class queue: the holder should
	// take single leases through Acquire rather than grow its block.
	Contended bool
	// Adaptive says the class has an adaptive limit: the holder should
	// report how its slots' calls went (Observe).
	Adaptive bool
	// ReadOnly, set while the node's tenant is read_only, is the refusal a
	// write gets: the holder grants no write from the block.
	ReadOnly *TenantStateError
}

// Block grows or shrinks the session's block of r.Class on r.Node. Growing
// adds the slots that fit under every limit on the chain now, up to
// r.Want; it never waits. Shrinking gives r.Return idle slots back and
// hands them to waiters. A retry with the same request id returns the
// original grant and changes nothing.
func (e *Engine) Block(sid SessionID, r BlockRequest) (BlockGrant, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.tick()
	s, err := e.session(sid, now)
	if err != nil {
		return BlockGrant{}, err
	}
	if err := r.check(s); err != nil {
		return BlockGrant{}, err
	}
	fp := uint64(0)
	if r.RequestID != "" {
		fp = r.fingerprint()
		if res, ok, err := s.requests.lookup(r.RequestID, fp); ok || err != nil {
			if err != nil {
				return BlockGrant{}, err
			}
			return e.blockRetried(r, res), nil
		}
	}
	n, err := e.target(s, r.Node)
	if err != nil {
		return BlockGrant{}, err
	}
	if err := e.checkClass(n.tenant, r.Class); err != nil {
		return BlockGrant{}, err
	}
	l := s.blocks[blockKey{n.id, r.Class}]
	if r.Return > 0 {
		return e.shrinkBlock(s, n, l, r, fp, now)
	}
	return e.growBlock(s, n, l, r, fp, now)
}

// check refuses what no block request may ask, before anything is looked
// up.
func (r *BlockRequest) check(s *session) error {
	if s.id == System {
		return invalid("the system session holds no blocks")
	}
	if err := validName("lease class", r.Class); err != nil {
		return err
	}
	switch {
	case r.Want < 0 || r.Return < 0:
		return invalid("want %d and return %d cannot be negative", r.Want, r.Return)
	case r.Want > 0 && r.Return > 0:
		return invalid("a block request either grows (want) or shrinks (return), not both")
	}
	return nil
}

// blockRetried is the answer to a retry of a request already made: its
// original grant, with the block as it stands now.
func (e *Engine) blockRetried(r BlockRequest, res requestResult) BlockGrant {
	g := BlockGrant{Lease: res.lease, Node: r.Node, Class: r.Class, Granted: max(res.amount, 0),
		Contended: e.contended(r.Class), Adaptive: e.adaptive[r.Class] != nil}
	if l := e.leases[res.lease]; l != nil {
		g.Count = l.count
		g.ReadOnly = l.node.writesRefused()
	}
	return g
}

// shrinkBlock gives r.Return idle slots of s's block l back and hands them
// to waiters.
func (e *Engine) shrinkBlock(s *session, n *node, l *lease, r BlockRequest, fp uint64, now int64) (BlockGrant, error) {
	if l == nil {
		if err := e.checkOpen(n, now); err != nil {
			return BlockGrant{}, err
		}
		return BlockGrant{}, fmt.Errorf("%w: the session holds no block of %s on node %d", ErrNotFound, r.Class, n.id)
	}
	id := l.id
	if l = e.touch(l, now); l == nil {
		return BlockGrant{}, e.ended(s, id, now)
	}
	if r.Return > l.count {
		return BlockGrant{}, invalid("cannot give back %d slots of a block of %d", r.Return, l.count)
	}
	e.emit(Event{Kind: EvBlockResized, At: now, Session: s.id, Node: n.id, Lease: l.id, Resource: l.class,
		Amount: -r.Return, RequestID: r.RequestID, Fingerprint: fp})
	e.dispatch(l.class)
	return BlockGrant{Lease: l.id, Node: n.id, Class: l.class, Count: l.count, Contended: e.contended(l.class),
		Adaptive: e.adaptive[l.class] != nil, ReadOnly: n.writesRefused()}, nil
}

// growBlock adds to s's block of r.Class on n (l, or a new one) the slots
// that fit under every limit on the chain now, up to r.Want; none while
// anyone waits for the class.
func (e *Engine) growBlock(s *session, n *node, l *lease, r BlockRequest, fp uint64, now int64) (BlockGrant, error) {
	if err := e.checkOpen(n, now); err != nil {
		return BlockGrant{}, err
	}
	if err := n.admits(false, false); err != nil {
		return BlockGrant{}, err
	}
	var err error
	grow := int64(0)
	contended := e.contended(r.Class)
	if !contended {
		if grow, err = n.headroom(r.Class, r.Want); err != nil {
			return BlockGrant{}, err
		}
	}
	if l == nil {
		id := e.nextLease
		e.emit(Event{Kind: EvLeaseGranted, At: now, Session: s.id, Node: n.id, Lease: id, Resource: r.Class,
			Block: true, Amount: grow, RequestID: r.RequestID, Fingerprint: fp, Warnings: n.warnings(nil, r.Class, grow)})
		return BlockGrant{Lease: id, Node: n.id, Class: r.Class, Count: grow, Granted: grow, Contended: contended,
			Adaptive: e.adaptive[r.Class] != nil, ReadOnly: n.writesRefused()}, nil
	}
	if grow > 0 {
		e.emit(Event{Kind: EvBlockResized, At: now, Session: s.id, Node: n.id, Lease: l.id, Resource: l.class,
			Amount: grow, RequestID: r.RequestID, Fingerprint: fp, Warnings: n.warnings(nil, l.class, grow)})
	}
	return BlockGrant{Lease: l.id, Node: n.id, Class: l.class, Count: l.count, Granted: grow, Contended: contended,
		Adaptive: e.adaptive[l.class] != nil, ReadOnly: n.writesRefused()}, nil
}

// fingerprint tells a retry of r from another request with its id.
func (r *BlockRequest) fingerprint() uint64 {
	return fingerprint(opBlock, r.Node, r.Class, r.Want-r.Return)
}

// headroom is how many more slots of class fit under every limit on n's
// chain, at most want. Slots that would take a node's count past MaxInt64
// (where no limit stops them first) are refused as invalid, except on the
// root, whose count saturates (node.saturates).
func (n *node) headroom(class string, want int64) (int64, error) {
	room, space := want, int64(math.MaxInt64)
	for a := n; a != nil; a = a.parent {
		if g := a.limit[class]; g != nil {
			if eff, ok := g.enforced(); ok {
				room = min(room, max(eff-g.n, 0))
			}
			if !a.saturates(g) {
				space = min(space, math.MaxInt64-g.n)
			}
		}
	}
	if room > space {
		return 0, invalid("%d more slots of %s on node %d would overflow", room, class, n.id)
	}
	return room, nil
}

func (e *Engine) applyBlockResized(ev *Event) error {
	l := e.leases[ev.Lease]
	if l == nil || !l.block || l.count+ev.Amount < 0 || ev.Amount == 0 {
		return fmt.Errorf("%w: resize of block %d by %d", ErrCorrupt, ev.Lease, ev.Amount)
	}
	l.count += ev.Amount
	for a := l.node; a != nil; a = a.parent {
		a.limit.add(l.class, ev.Amount, a.isRoot())
	}
	return nil
}
