package hacheck

import "sync"

// downstream is what a limit-1 class protects: a resource that admits a
// holder only with a fencing token (a lease id) at least as new as any it
// has seen, and counts the times it found two admitted holders at once.
type downstream struct {
	mu         sync.Mutex
	newest     int64
	active     int64
	doubleHeld int
	fenced     int
}

// enter admits the holder of token, or refuses a stale token.
func (d *downstream) enter(token int64) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if token < d.newest {
		d.fenced++
		return false
	}
	d.newest = token
	if d.active != 0 && d.active != token {
		d.doubleHeld++
	}
	d.active = token
	return true
}

func (d *downstream) leave(token int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.active == token {
		d.active = 0
	}
}
