// Package faultproxy is a TCP proxy that a test controls, to put faults
// between a process and the service it depends on: a blackhole (bytes stop
// flowing both ways, connections stay open, as when a network partition
// drops packets), a cut (every connection is reset), and a lost answer (the
// upstream acts on a gRPC call, and its answer never reaches the client:
// answer.go). It imports only the standard library.
package faultproxy

import (
	"net"
	"sync"
)

// Proxy forwards each connection accepted on its listener to Upstream.
type Proxy struct {
	ln       net.Listener
	upstream string

	mu    sync.Mutex
	open  chan struct{} // closed while bytes flow; a fresh one while blackholed
	conns map[net.Conn]struct{}
	done  bool
	wg    sync.WaitGroup
	// dropArmed: the answer to the next call a client starts is to be
	// dropped (DropNextAnswer); dropped counts those dropped.
	dropArmed bool
	dropped   int
}

// New starts a proxy that accepts on ln and forwards to upstream. Close it
// when done.
func New(ln net.Listener, upstream string) *Proxy {
	p := &Proxy{ln: ln, upstream: upstream, open: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	close(p.open)
	p.wg.Add(1)
	go p.accept()
	return p
}

// Addr is the address clients dial instead of the upstream's.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Blackhole stops (on) or resumes (off) every byte in both directions, on
// connections open now and later. Bytes already read are held, not lost:
// they are delivered when the blackhole ends, as TCP would retransmit.
func (p *Proxy) Blackhole(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
		if on {
			p.open = make(chan struct{})
		}
	default:
		if !on {
			close(p.open)
		}
	}
}

// Cut closes every connection open now; new ones are still accepted.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

// Close stops accepting, closes every connection and waits for the
// proxy's goroutines.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	p.mu.Lock()
	p.done = true
	for c := range p.conns {
		c.Close()
	}
	select {
	case <-p.open:
	default:
		close(p.open)
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.forward(c)
	}
}

// track adds c to the open connections, or closes it if the proxy is done.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *Proxy) forward(client net.Conn) {
	defer p.wg.Done()
	if !p.track(client) {
		return
	}
	defer p.untrack(client)
	p.wait()
	up, err := net.Dial("tcp", p.upstream)
	if err != nil {
		return
	}
	if !p.track(up) {
		return
	}
	defer p.untrack(up)
	l := newLink()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pipe(up, client, l.fromClient) }()
	go func() { defer wg.Done(); p.pipe(client, up, l.fromUpstream) }()
	wg.Wait()
}

// wait returns once bytes may flow.
func (p *Proxy) wait() {
	p.mu.Lock()
	open := p.open
	p.mu.Unlock()
	<-open
}

// pipe copies from src to dst, holding each chunk while blackholed. look
// sees each chunk first and says how much of it to pass on, and whether to
// cut the connection after that. When either side ends, both are closed.
func (p *Proxy) pipe(dst, src net.Conn, look func(p *Proxy, chunk []byte) (pass int, cut bool)) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.wait()
			pass, cut := look(p, buf[:n])
			if _, werr := dst.Write(buf[:pass]); werr != nil || cut {
				return
			}
		}
		if err != nil {
			return // io.EOF or a failure: either way this leg is over
		}
	}
}
