package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elazarl/goproxy"

	"github.com/governor-project/governor/classify"
)

// dialConnect is goproxy's dialer for CONNECT. It is where a tunnel is
// governed: goproxy has hijacked the client's connection and waits for the
// upstream one, so a refusal here is written by connectError with the reason
// in the status line, and the lease is tied to the connection it returns,
// released when the tunnel closes rather than when the request context ends.
//
// A CONNECT shows only host:port, so rules match it by host and port.
func (p *Proxy) dialConnect(req *http.Request, network, addr string) (net.Conn, error) {
	ex := &exchange{kind: "connect", start: time.Now()}
	if err := p.dialer.refuseLiteral(addr, "443"); err != nil {
		ex.rule = ruleUnmatched
		p.finish(ex, outcomeRefused)
		return nil, &connectError{err: err}
	}
	q := classify.HTTPRequestFrom(req)
	q.Host = addr
	if err := p.decide(req.Context(), req, q, ex); err != nil {
		return nil, &connectError{err: err}
	}
	conn, err := p.dialer.DialContext(req.Context(), network, addr)
	if err != nil {
		ex.lease.release(0, false)
		ref := upstreamRefusal(err)
		outcome := outcomeUpstreamError
		switch ref.code {
		case http.StatusGatewayTimeout:
			outcome = outcomeTimeout
		case http.StatusBadGateway:
		default:
			outcome = outcomeRefused
		}
		p.finish(ex, outcome)
		p.log.Info("upstream failed", "kind", "connect", "rule", ex.rule, "subtask", ex.subtask, "host", addr,
			"status", ref.code, "err", err)
		return nil, &connectError{err: ref}
	}
	p.finish(ex, outcomeForwarded)
	t := &tunnelConn{Conn: conn, idle: p.cfg.HTTP.TunnelIdleTimeout, lease: ex.lease}
	t.touch()
	t.untrack = p.tunnels.add(t)
	return t, nil
}

// connectError carries the proxy's answer to a CONNECT it did not open.
type connectError struct{ err error }

func (e *connectError) Error() string { return e.err.Error() }
func (e *connectError) Unwrap() error { return e.err }

// connectErrorHandler is goproxy's ConnectionErrHandler. It writes the
// answer to a CONNECT that dialConnect refused onto the hijacked client
// connection, reason in the status line, e.g.
//
//	HTTP/1.1 429 Governor quota spent: llm_calls on "pod-7"
//
// goproxy also calls it when a tunnel fails midway; then the connection
// carries the tunnel's bytes and nothing may be written into them.
func (p *Proxy) connectErrorHandler(w io.Writer, pctx *goproxy.ProxyCtx, err error) {
	var ce *connectError
	if !errors.As(err, &ce) {
		return
	}
	r := asResponder(ce.err)
	if r == nil {
		r = upstreamRefusal(ce.err)
	}
	resp := r.response(pctx.Req)
	if err := resp.Write(w); err != nil {
		p.log.Debug("governor-proxy: cannot write a CONNECT refusal", "err", err)
	}
}

// tunnelConn is the upstream side of a CONNECT tunnel. It holds the
// tunnel's lease until it is closed, and closes itself after idle with no
// bytes in either direction (every byte of the tunnel passes through it:
// reads come from the upstream, writes go to it).
type tunnelConn struct {
	net.Conn
	idle    time.Duration
	lease   *lease
	last    atomic.Int64 // UnixNano of the last byte either way
	untrack func()
	once    sync.Once
}

func (t *tunnelConn) touch() { t.last.Store(time.Now().UnixNano()) }

func (t *tunnelConn) idleFor() time.Duration {
	return time.Duration(time.Now().UnixNano() - t.last.Load())
}

func (t *tunnelConn) Read(b []byte) (int, error) {
	for {
		t.Conn.SetReadDeadline(time.Now().Add(t.idle))
		n, err := t.Conn.Read(b)
		if n > 0 {
			t.touch()
		}
		if n == 0 && errors.Is(err, os.ErrDeadlineExceeded) && t.idleFor() < t.idle {
			continue // the other direction was busy: not idle
		}
		return n, err
	}
}

func (t *tunnelConn) Write(b []byte) (int, error) {
	t.Conn.SetWriteDeadline(time.Now().Add(t.idle))
	n, err := t.Conn.Write(b)
	if n > 0 {
		t.touch()
	}
	return n, err
}

// CloseWrite and CloseRead let goproxy half-close the tunnel as it does a
// bare TCP connection.
func (t *tunnelConn) CloseWrite() error {
	if c, ok := t.Conn.(interface{ CloseWrite() error }); ok {
		return c.CloseWrite()
	}
	return t.Close()
}

func (t *tunnelConn) CloseRead() error {
	if c, ok := t.Conn.(interface{ CloseRead() error }); ok {
		return c.CloseRead()
	}
	return nil
}

// Close closes the upstream connection and releases the tunnel's lease.
func (t *tunnelConn) Close() error {
	err := t.Conn.Close()
	t.once.Do(func() {
		t.lease.release(0, false) // a tunnel's lifetime says nothing about the upstream's latency
		t.untrack()
	})
	return err
}

// tunnelSet tracks the connections that http.Server.Shutdown does not see
// (CONNECT tunnels and upgraded connections), so that a shutdown can wait
// for them and then close them, releasing their leases.
type tunnelSet struct {
	gauge interface{ Add(float64) }

	mu    sync.Mutex
	open  map[io.Closer]struct{}
	empty chan struct{} // closed when open becomes empty; nil while it is
}

func (s *tunnelSet) add(c io.Closer) (untrack func()) {
	s.mu.Lock()
	if s.open == nil {
		s.open = map[io.Closer]struct{}{}
	}
	s.open[c] = struct{}{}
	s.mu.Unlock()
	s.gauge.Add(1)
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			delete(s.open, c)
			if len(s.open) == 0 && s.empty != nil {
				close(s.empty)
				s.empty = nil
			}
			s.mu.Unlock()
			s.gauge.Add(-1)
		})
	}
}

// wait returns when no tunnel is open, or ctx ends.
func (s *tunnelSet) wait(ctx context.Context) error {
	s.mu.Lock()
	if len(s.open) == 0 {
		s.mu.Unlock()
		return nil
	}
	if s.empty == nil {
		s.empty = make(chan struct{})
	}
	ch := s.empty
	s.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// closeAll closes every open tunnel.
func (s *tunnelSet) closeAll() {
	s.mu.Lock()
	open := make([]io.Closer, 0, len(s.open))
	for c := range s.open {
		open = append(open, c)
	}
	s.mu.Unlock()
	for _, c := range open {
		c.Close()
	}
}
