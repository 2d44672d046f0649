package engine

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
)

// NoticeKind says what a session holding delegated budgets must do.
type NoticeKind uint8

// The kinds of notice.
const (
	// NoticeContended: acquires queue for Class. Give idle slots of its
	// blocks back now, and take single leases through the fair queue
	// instead of growing blocks, until NoticeUncontended.
	NoticeContended NoticeKind = iota + 1
	// NoticeUncontended: nothing queues for Class any more; blocks may grow.
	NoticeUncontended
	// NoticeRecall: give back the idle slots and unspent reservations held
	// on Node or below it: of Class only when Class is set, of Resource only
	// when Resource is set, everything when neither is (its caps changed).
	NoticeRecall
	// NoticeEnded: Node has ended. Its blocks are revoked (Class names one),
	// and its reservations must be settled; nothing more may be granted
	// from them.
	NoticeEnded
)

var noticeNames = [...]string{
	NoticeContended:   "contended",
	NoticeUncontended: "uncontended",
	NoticeRecall:      "recall",
	NoticeEnded:       "ended",
}

func (k NoticeKind) String() string {
	if int(k) < len(noticeNames) && noticeNames[k] != "" {
		return noticeNames[k]
	}
	return fmt.Sprintf("notice(%d)", uint8(k))
}

// Notice tells one session about a change to what it was delegated. Notices
// are not state: they are not recorded and not replayed. A session that
// misses one loses nothing the engine guarantees (caps hold at every
// instant either way); it only holds idle capacity longer than it should.
type Notice struct {
	Session  SessionID
	Kind     NoticeKind
	Node     NodeID
	Class    string
	Resource string
}

// Notifier receives notices while the engine's lock is held. Notify must
// queue and return; it must never block or call back into the engine.
type Notifier interface {
	Notify(Notice)
}

// notify hands n to the notifier, on the live path only: a replay tells
// nobody anything.
func (e *Engine) notify(n Notice) {
	if e.notifier == nil || e.replaying {
		return
	}
	e.notifier.Notify(n)
}

// contention tells the holders of blocks of class when acquires start or
// stop queueing for it. It runs after every change to the class's queue.
func (e *Engine) contention(class string, q *classQueue) {
	busy := q.waiting > 0
	if busy == q.contended {
		return
	}
	q.contended = busy
	kind := NoticeUncontended
	if busy {
		kind = NoticeContended
	}
	for _, l := range sortedBlocks(e.blocks[class]) {
		e.notify(Notice{Session: l.session.id, Kind: kind, Node: l.node.id, Class: class})
	}
}

// contended reports whether acquires queue for class.
func (e *Engine) contended(class string) bool {
	q := e.queues[class]
	return q != nil && q.waiting > 0
}

// recallUnder tells every session that holds delegated budgets on n or
// below it to give back what is idle: of class, of resource, or (both
// empty) everything.
func (e *Engine) recallUnder(n *node, class, resource string) {
	if e.notifier == nil || e.replaying {
		return
	}
	told := map[SessionID]bool{}
	tell := func(sid SessionID) {
		if !told[sid] {
			told[sid] = true
			e.notify(Notice{Session: sid, Kind: NoticeRecall, Node: n.id, Class: class, Resource: resource})
		}
	}
	if resource == "" {
		classes := slices.Sorted(maps.Keys(e.blocks))
		if class != "" {
			classes = []string{class}
		}
		for _, c := range classes {
			for _, l := range sortedBlocks(e.blocks[c]) {
				if l.count > 0 && l.node.within(n) {
					tell(l.session.id)
				}
			}
		}
	}
	if class == "" {
		resources := slices.Sorted(maps.Keys(e.reserved))
		if resource != "" {
			resources = []string{resource}
		}
		for _, r := range resources {
			for _, res := range sortedReservations(e.reserved[r]) {
				if res.node.within(n) {
					tell(res.session.id)
				}
			}
		}
	}
}

func sortedBlocks(m map[LeaseID]*lease) []*lease {
	out := make([]*lease, 0, len(m))
	for _, id := range sortedKeys(m) {
		out = append(out, m[id])
	}
	return out
}

func sortedReservations(m map[*reservation]struct{}) []*reservation {
	out := make([]*reservation, 0, len(m))
	for r := range m {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b *reservation) int {
		return cmp.Or(cmp.Compare(a.session.id, b.session.id), cmp.Compare(a.node.id, b.node.id))
	})
	return out
}

// Contention returns, for each of the session's blocks, a NoticeContended
// or NoticeUncontended saying whether acquires of its class queue now: what
// a session that starts to watch must know first.
func (e *Engine) Contention(sid SessionID) ([]Notice, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	s, err := e.session(sid, e.tick())
	if err != nil {
		return nil, err
	}
	var out []Notice
	for _, l := range sortedBlocks(s.leases) {
		if !l.block {
			continue
		}
		kind := NoticeUncontended
		if e.contended(l.class) {
			kind = NoticeContended
		}
		out = append(out, Notice{Session: s.id, Kind: kind, Node: l.node.id, Class: l.class})
	}
	return out, nil
}

// Alive reports whether a session is open and within its TTL. It changes
// nothing: an expired session is ended by the next call that touches it.
func (e *Engine) Alive(sid SessionID) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.sessions[sid]
	return s != nil && !s.expired(e.now())
}

// RemindContention tells the holders of busy blocks of every class that
// acquires still queue for, again. Notices can be lost (a holder's stream
// breaks, an answer overtakes one), and a holder that missed one would keep
// its slots from the queue; a server calls this now and then so that such a
// holder catches up.
func (e *Engine) RemindContention() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, class := range e.sortedQueues() {
		if !e.contended(class) {
			continue
		}
		for _, l := range sortedBlocks(e.blocks[class]) {
			if l.count > 0 {
				e.notify(Notice{Session: l.session.id, Kind: NoticeContended, Node: l.node.id, Class: class})
			}
		}
	}
}
