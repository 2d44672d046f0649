package budget

import (
	"errors"
	"time"
)

// Idle subtasks. Each Proxy-Authorization username (or application_name)
// names a subtask of the worker's task, found or created at its first use.
// Names come and go with the clients, so a subtask that has held nothing
// and run nothing for Config.SubtaskIdle is closed at governord (which
// reclaims it after its retention) and forgotten here; its next use finds
// or creates it again, as the first did.
//
// A subtask closed this way starts afresh when it comes back: its usage,
// and caps edited on it at governord, do not carry over (what it spent is
// still counted on the task and above). Quotas meant to bound a name for
// good belong on the task, or on a subtask kept busy, or with a longer
// subtask_idle.

// errIdle ends an idle subtask's context.
var errIdle = errors.New("the subtask was idle and has been closed")

// use marks a subtask as in use by one more request; unuse ends that use.
// The task itself is never ended for idleness, so it is not counted.
func (n *node) use() {
	if n.name != "" {
		n.users.Add(1)
	}
}

func (n *node) unuse() {
	if n.name != "" {
		n.lastUse.Store(time.Now().UnixNano()) // before the count drops, so an idle check sees it
		n.users.Add(-1)
	}
}

// retireIdle closes the subtasks idle since before now less SubtaskIdle:
// no request in use, nothing held in their pools or reservations.
func (s *session) retireIdle(now time.Time) {
	cutoff := now.Add(-s.a.cfg.SubtaskIdle).UnixNano()
	var idle []*node
	s.mu.Lock()
	for _, n := range s.nodes {
		if n == s.task || n.retiring != nil || n.users.Load() != 0 || !n.resolved() || n.lastUse.Load() > cutoff || !n.empty() {
			continue
		}
		n.retiring = make(chan struct{})
		idle = append(idle, n)
	}
	s.mu.Unlock()
	for _, n := range idle {
		s.a.bg.Go(func() { s.retire(n) })
	}
}

// resolved reports whether n's subtask is known.
func (n *node) resolved() bool {
	select {
	case <-n.done:
		return n.err == nil
	default:
		return false
	}
}

// empty reports whether n holds nothing delegated: no slot (in use, idle
// or going back) and no unit (unspent, held, spent or in a call).
func (n *node) empty() bool {
	pools, quota := n.holdings()
	for _, p := range pools {
		p.mu.Lock()
		busy := p.count != 0 || p.inUse != 0 || p.returning != 0 || p.growth != nil
		p.mu.Unlock()
		if busy {
			return false
		}
	}
	for _, q := range quota {
		q.mu.Lock()
		busy := q.unspent != 0 || q.held != 0 || q.spent != 0 || q.settling != 0 || q.returning != 0 || q.topUp != nil
		q.mu.Unlock()
		if busy {
			return false
		}
	}
	return true
}

// retire closes idle subtask n at governord and forgets it. If governord
// cannot be told, the subtask stays open there, and the next use of its
// name finds it again.
func (s *session) retire(n *node) {
	err := n.t.Close()
	n.ended(errIdle)
	s.mu.Lock()
	if s.nodes[n.name] == n {
		delete(s.nodes, n.name)
	}
	if s.byID[n.t.ID()] == n {
		delete(s.byID, n.t.ID())
	}
	close(n.retiring)
	s.mu.Unlock()
	s.a.m.subtasksIdle.Inc()
	if err != nil {
		s.a.log.Debug("governor-proxy: closing an idle subtask failed; it stays open at governord", "subtask", n.name, "err", err)
	}
}
