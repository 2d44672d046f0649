// Package filepoll watches files by reading them on a timer and comparing
// their content, which, unlike file-system events or modification times,
// catches a file rewritten in place, a rename over it and a Kubernetes
// volume whose "..data" symlink is swapped. A change is acted on once the
// content has read the same on two polls in a row, so a writer caught
// halfway (an editor writing in place, a certificate replaced before its
// key) is never acted on. An unreadable file is an observation too: acted
// on once, and only if it lasts two polls (a rename over a file can leave
// it briefly missing).
//
// It may import only the standard library.
package filepoll

import (
	"crypto/sha256"
	"encoding/binary"
	"sync"
	"time"
)

// Poller reads what it watches every interval until Close.
type Poller struct {
	read  func() ([][]byte, error)
	apply func([][]byte, error)

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once

	// Owned by the polling goroutine.
	handled [sha256.Size]byte // the content last applied
	pending [sha256.Size]byte // content seen once, waiting for a second look
	waiting bool
}

// Start polls every interval. read returns the files' contents; apply is
// called from the polling goroutine with what read returned once it has
// changed from what was last applied and then read the same twice. current
// is what is in force now, as read would return it.
func Start(interval time.Duration, current [][]byte, read func() ([][]byte, error), apply func([][]byte, error)) *Poller {
	p := &Poller{read: read, apply: apply, handled: digest(current, nil),
		stop: make(chan struct{}), done: make(chan struct{})}
	go p.run(interval)
	return p
}

// Close stops polling and waits until the polling goroutine has ended. It
// may be called more than once, but not from apply.
func (p *Poller) Close() {
	p.closeOnce.Do(func() { close(p.stop) })
	<-p.done
}

func (p *Poller) run(interval time.Duration) {
	defer close(p.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			p.Poll()
		}
	}
}

// Poll reads once and applies a change that has settled, as each tick
// does; a test with a long interval drives the Poller by hand with it.
func (p *Poller) Poll() {
	contents, err := p.read()
	key := digest(contents, err)
	if key == p.handled {
		p.waiting = false
		return
	}
	if !p.waiting || key != p.pending {
		p.pending, p.waiting = key, true
		return
	}
	p.handled, p.waiting = key, false
	p.apply(contents, err)
}

// digest identifies contents, or a read error.
func digest(contents [][]byte, err error) [sha256.Size]byte {
	h := sha256.New()
	if err != nil {
		h.Write([]byte("\x00read error\x00" + err.Error()))
	} else {
		for _, c := range contents {
			h.Write(binary.AppendUvarint(nil, uint64(len(c))))
			h.Write(c)
		}
	}
	var d [sha256.Size]byte
	h.Sum(d[:0])
	return d
}
