package httpproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/elazarl/goproxy"

	"github.com/governor-project/governor/classify"
	"github.com/governor-project/governor/proxy/admission"
)

// onConnect is goproxy's CONNECT hook, where a tunnel is governed. It runs
// before goproxy takes the client's connection over, while net/http still
// watches that connection: a client that hangs up while its CONNECT waits
// for a lease ends the request's context, which withdraws the wait from
// governord's queue, so the client is neither charged nor granted. (Once
// goproxy has hijacked the connection, the context no longer ends when the
// client leaves.) A refusal is answered here, with the reason in the status
// line; an admitted tunnel goes on to dialConnect, which ties the lease to
// the upstream connection.
//
// A CONNECT shows only host:port, so rules match it by host and port.
func (p *Proxy) onConnect(host string, pctx *goproxy.ProxyCtx) (*goproxy.ConnectAction, string) {
	req := pctx.Req
	if _, _, err := net.SplitHostPort(host); err != nil {
		host += ":80" // as goproxy would dial it
	}
	pt, err := p.admitConnect(req, host)
	if err != nil {
		r := asResponder(err)
		if r == nil {
			r = upstreamRefusal(err)
		}
		pctx.Resp = r.response(req)
		return &goproxy.ConnectAction{Action: goproxy.ConnectReject}, host
	}
	// goproxy hands dialConnect the request alone: the admission rides in
	// its context. Should goproxy return without dialing (the client left
	// just now, or the connection could not be taken over), the lease goes
	// back when the request ends.
	pctx.Req = req.WithContext(context.WithValue(req.Context(), pendingKey{}, pt))
	pt.stop = context.AfterFunc(req.Context(), func() {
		if pt.claim() {
			pt.ex.end(0, false)
			p.finish(pt.ex, outcomeCanceled)
		}
	})
	return goproxy.OkConnect, host
}

// pendingTunnel is a CONNECT admitted by onConnect, not yet dialed.
type pendingTunnel struct {
	ex      *exchange
	target  target // the upstream's addresses, checked before anything was charged; none if the lookup failed
	claimed atomic.Bool
	stop    func() bool
}

type pendingKey struct{}

// claim takes the admission, once: for dialConnect, or for onConnect's
// clean-up when no dial comes.
func (pt *pendingTunnel) claim() bool { return pt.claimed.CompareAndSwap(false, true) }

// admitConnect decides a CONNECT to addr ("host:port"). Before anything is
// charged it resolves the target and refuses it if it is link-local,
// metadata or the proxy itself; then it classifies and admits, in the
// client's request context. A non-nil error is a *denial or *refusal,
// already counted and logged.
func (p *Proxy) admitConnect(req *http.Request, addr string) (*pendingTunnel, error) {
	ex := &exchange{kind: "connect", rule: ruleUnmatched}
	if err := p.checkConnectPort(addr); err != nil {
		p.refused(ex, addr, err)
		return nil, err
	}
	if err := p.dialer.refuseLiteral(req.Context(), addr, "443"); err != nil {
		p.refused(ex, addr, err)
		return nil, err
	}
	q := classify.HTTPRequestFrom(req)
	q.Host = addr
	// One lookup, before the charge; dialConnect dials what it found. A
	// lookup that fails (no such host, a DNS outage) refuses nothing here:
	// admission decides first, as for plain HTTP, and the dial looks again.
	t, err := p.dialer.lookupTimeout(req.Context(), addr)
	var ref *refusal
	if errors.As(err, &ref) {
		ex.rule = ruleUnmatched
		if rs := p.rules(); rs != nil {
			if d, ok := rs.MatchHTTP(q); ok {
				ex.rule = d.Rule // as when the name was refused at the dial
			}
		}
		return nil, p.connectFailed(req, ex, addr, err)
	}
	if err := p.decide(req.Context(), req, q, ex); err != nil {
		return nil, err
	}
	return &pendingTunnel{ex: ex, target: t}, nil
}

// checkConnectPort refuses a CONNECT to a port outside
// http.connect_ports, before anything else is done for it: a tunnel to
// port 22 or 5432 is a way into SSH or a database, not an HTTPS request.
func (p *Proxy) checkConnectPort(addr string) error {
	_, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return &refusal{code: http.StatusBadRequest, reason: "Bad Request", err: fmt.Errorf("CONNECT %q: not host:port", addr)}
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err == nil && connectAllowed(p.Config.ConnectPorts, uint16(port)) {
		return nil
	}
	return forbidden("Forbidden CONNECT port",
		"CONNECT to port %s is refused: http.connect_ports allows %s", portStr, portList(p.Config.ConnectPorts))
}

// refused counts and logs a target the proxy refused before anything was
// charged for it.
func (p *Proxy) refused(ex *exchange, addr string, err error) {
	p.finish(ex, outcomeRefused)
	var ref *refusal
	if errors.As(err, &ref) && ref.cause != "" {
		p.m.denials.WithLabelValues(ref.cause).Inc()
	}
	p.log.Info("refused", "kind", ex.kind, "host", addr, "err", err)
}

// connectFailed counts and logs a CONNECT whose upstream could not be
// reached or was refused, and returns the answer.
func (p *Proxy) connectFailed(req *http.Request, ex *exchange, addr string, err error) *refusal {
	ref := upstreamRefusal(err)
	p.finish(ex, ref.outcome(req))
	if ref.cause != "" {
		p.m.denials.WithLabelValues(ref.cause).Inc()
	}
	p.log.Info("upstream failed", "kind", "connect", "rule", ex.rule, "subtask", ex.subtask, "host", addr,
		"status", ref.code, "err", err)
	return ref
}

// dialConnect is goproxy's dialer for CONNECT. goproxy has hijacked the
// client's connection and waits for the upstream one, so a failure here is
// written by connectErrorHandler with the reason in the status line. The
// tunnel was admitted by onConnect; its lease is tied to the connection
// returned here, released when the tunnel closes rather than when the
// request context ends.
func (p *Proxy) dialConnect(req *http.Request, network, addr string) (net.Conn, error) {
	pt, _ := req.Context().Value(pendingKey{}).(*pendingTunnel)
	if pt == nil {
		// Only onConnect opens tunnels: goproxy is wired without it.
		return nil, &connectError{err: &refusal{code: http.StatusInternalServerError, reason: "Internal Server Error",
			err: errors.New("a CONNECT reached the dialer without being admitted")}}
	}
	if !pt.claim() {
		return nil, &connectError{err: &admission.Denial{Cause: admission.CauseCanceled, Err: errors.New("the client went away")}}
	}
	pt.stop()
	ex := pt.ex
	var conn net.Conn
	var err error
	if len(pt.target.ips) == 0 {
		conn, err = p.dialer.DialContext(req.Context(), network, addr)
	} else {
		ctx, cancel := context.WithTimeout(req.Context(), p.dialer.timeout)
		conn, err = p.dialer.dialTarget(ctx, network, pt.target)
		cancel()
	}
	if err != nil {
		ex.end(0, false)
		return nil, &connectError{err: p.connectFailed(req, ex, addr, err)}
	}
	p.finish(ex, outcomeForwarded)
	client, _ := req.Context().Value(clientConnKey{}).(net.Conn)
	t := &tunnelConn{Conn: conn, client: client, idle: p.Config.TunnelIdleTimeout, ex: ex}
	p.tunnelBytes(t)
	t.touch()
	t.track(&p.tunnels)
	t.watch()
	return t, nil
}

// connectError carries the proxy's answer to a CONNECT it did not open.
type connectError struct{ err error }

func (e *connectError) Error() string { return e.err.Error() }
func (e *connectError) Unwrap() error { return e.err }

// connectErrorHandler is goproxy's ConnectionErrHandler. It writes the
// answer to a CONNECT that dialConnect could not open onto the hijacked
// client connection, reason in the status line, e.g.
//
//	HTTP/1.1 502 Bad Gateway
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

// tunnelConn is the upstream side of a CONNECT tunnel. Every byte of the
// tunnel passes through it (reads come from the upstream, writes go to it).
// It holds the tunnel's lease until it is closed, and a watchdog closes it,
// and the client's connection, after idle with no byte in either direction.
// The watchdog does not depend on a read or write being under way: after
// the upstream half-closes, goproxy only waits on the client's connection,
// and the tunnel must still end when both sides go quiet.
type tunnelConn struct {
	net.Conn
	client net.Conn // the client's connection; nil if unknown
	idle   time.Duration
	ex     *exchange    // holds the tunnel's ticket
	last   atomic.Int64 // UnixNano of the last byte either way
	// down and up charge the bytes of a bytes rule (bytes.go); nil
	// without one. stopBytes ends their waits.
	down, up  *byteMeter
	stopBytes func()

	mu      sync.Mutex
	closed  bool
	timer   *time.Timer // the idle watchdog
	untrack func()
}

func (t *tunnelConn) touch() { t.last.Store(time.Now().UnixNano()) }

func (t *tunnelConn) idleFor() time.Duration {
	return time.Duration(time.Now().UnixNano() - t.last.Load())
}

func (t *tunnelConn) Read(b []byte) (int, error) {
	if t.down != nil {
		return t.readMetered(b)
	}
	n, err := t.Conn.Read(b)
	if n > 0 {
		t.touch()
	}
	return n, err
}

func (t *tunnelConn) Write(b []byte) (int, error) {
	if t.up != nil {
		return t.writeMetered(b)
	}
	n, err := t.Conn.Write(b)
	if n > 0 {
		t.touch()
	}
	return n, err
}

// track adds the tunnel to s until it closes.
func (t *tunnelConn) track(s *tunnelSet) {
	untrack := s.add(t)
	t.mu.Lock()
	closed := t.closed
	if !closed {
		t.untrack = untrack
	}
	t.mu.Unlock()
	if closed {
		untrack()
	}
}

// watch starts the idle watchdog. Read and Write only note the time of the
// last byte; the watchdog wakes when the tunnel could first be idle, and
// sleeps again for the rest of the period if a byte passed meanwhile.
func (t *tunnelConn) watch() {
	if t.idle <= 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.closed {
		t.timer = time.AfterFunc(t.idle, t.checkIdle)
	}
}

func (t *tunnelConn) checkIdle() {
	if left := t.idle - t.idleFor(); left > 0 {
		t.mu.Lock()
		if !t.closed {
			t.timer.Reset(left)
		}
		t.mu.Unlock()
		return
	}
	t.Close()
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

// Close ends the tunnel: it closes the upstream connection and the
// client's (goproxy closes both when the tunnel ends by itself; the
// watchdog and a shutdown must not leave goproxy waiting on either), and
// releases the tunnel's lease.
func (t *tunnelConn) Close() error {
	err := t.Conn.Close()
	t.mu.Lock()
	first := !t.closed
	t.closed = true
	if t.timer != nil {
		t.timer.Stop()
	}
	untrack := t.untrack
	t.mu.Unlock()
	if !first {
		return err
	}
	if t.client != nil {
		t.client.Close()
	}
	if t.stopBytes != nil {
		t.stopBytes()
	}
	t.ex.end(0, false) // a tunnel's lifetime says nothing about the upstream's latency
	if untrack != nil {
		untrack()
	}
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
	untrack = s.untracker(c)
	s.register(c)
	return untrack
}

// register adds c to the set. Callers that must hold c's untrack function
// before anyone can close c (a shutdown may close it at once) take it from
// untracker first.
func (s *tunnelSet) register(c io.Closer) {
	s.mu.Lock()
	if s.open == nil {
		s.open = map[io.Closer]struct{}{}
	}
	s.open[c] = struct{}{}
	s.mu.Unlock()
	s.gauge.Add(1)
}

// untracker returns the function that removes c from the set, once.
func (s *tunnelSet) untracker(c io.Closer) (untrack func()) {
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
