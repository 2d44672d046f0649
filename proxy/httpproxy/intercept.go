package httpproxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
)

// Interceptor is what the proxy needs to terminate the TLS of a CONNECT
// tunnel (package intercept's Interceptor is the one governor-proxy runs).
type Interceptor interface {
	// Intercepts reports whether a tunnel to host (a name or an IP
	// literal, without a port) is terminated here.
	Intercepts(host string) bool
	// Certificate is the certificate the proxy shows a client for host,
	// its chain included.
	Certificate(host string) (*tls.Certificate, error)
}

// Interception. A CONNECT to a host the Interceptor lists is not relayed as
// bytes: the proxy answers 200 itself, takes the client's TLS handshake
// with a certificate minted for the host, and serves the decrypted
// connection with its own HTTP server (HTTP/1.1, or HTTP/2 when the client
// offers h2 in ALPN). Each request on it, each HTTP/2 stream, is then
// handed to ServeHTTP as an https:// request to the CONNECT's host and
// port, exactly as a plain request is: classified, charged, leased,
// metered, refused with a real HTTP response, and forwarded over the same
// transport (TLS verified, pooled, HTTP/2 when the upstream offers it).
// The CONNECT's target is checked as any CONNECT's is (its port, the
// addresses it names or resolves to) before anything is answered, and
// again at each dial. goproxy's own MITM mode is not used: it has no way to
// answer a failed upstream with a response, and the server net/http
// provides already handles HTTP/2, trailers, pipelining and upgrades.

// interceptHandshakeTimeout bounds a client's TLS handshake when
// http.read_header_timeout is off.
const interceptHandshakeTimeout = 10 * time.Second

// Reasons an intercepted handshake fails: the "reason" label of
// governor_proxy_intercept_handshakes_total (with "ok").
const (
	handshakeOK            = "ok"
	handshakeRefusedCA     = "client_refused_certificate" // the client does not trust the CA (or pins another)
	handshakeClientClosed  = "client_closed"              // the client hung up mid-handshake, as a pinning client may
	handshakeNotTLS        = "not_tls"                    // the client spoke something else inside the tunnel
	handshakeSNIMismatch   = "sni_mismatch"               // the client asked for another name than the CONNECT's
	handshakeNoCertificate = "no_certificate"             // no certificate could be minted (the CA expired, say)
	handshakeTimeout       = "timeout"
	handshakeOther         = "other"
)

// errSNIMismatch: the ClientHello names another host than the CONNECT.
var errSNIMismatch = errors.New("the TLS server name is not the CONNECT's host")

// tunnelTarget is what an intercepted connection's requests are for.
type tunnelTarget struct {
	host      string // as the CONNECT named it, lower case
	port      string
	authority string // the URL host requests are sent to: host, or host:port when not 443
	proxyAuth string // the CONNECT's Proxy-Authorization, which names the subtask
	h2        bool
	done      chan struct{} // closed when the connection is closed or hijacked
	doneOnce  sync.Once
}

type tunnelTargetKey struct{}

// interceptor holds the HTTP server of intercepted connections.
type interceptor struct {
	srv   *http.Server
	conns sync.Map // *tls.Conn -> *tunnelTarget
}

// newInterceptor builds the server the decrypted connections are served
// by; h serves each of their requests.
func (p *Proxy) newInterceptor() *interceptor {
	ic := &interceptor{}
	ic.srv = &http.Server{
		Handler:           http.HandlerFunc(p.serveIntercepted),
		ReadHeaderTimeout: p.Config.ReadHeaderTimeout,
		MaxHeaderBytes:    p.Config.MaxHeaderBytes,
		IdleTimeout:       p.Config.IdleTimeout,
		ErrorLog:          slog.NewLogLogger(p.log.Handler(), slog.LevelDebug),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			t := ic.target(c)
			if t == nil {
				return ctx
			}
			ctx = context.WithValue(ctx, tunnelTargetKey{}, t)
			if !t.h2 {
				// An HTTP/1.1 connection is one exchange at a time: the
				// idle watchdog and an upgrade may close it.
				ctx = context.WithValue(ctx, clientConnKey{}, c)
			}
			return ctx
		},
		ConnState: func(c net.Conn, s http.ConnState) {
			if s == http.StateClosed || s == http.StateHijacked {
				if t := ic.target(c); t != nil {
					ic.conns.Delete(c)
					t.doneOnce.Do(func() { close(t.done) })
				}
			}
		},
	}
	// HTTP/2 for clients that offer h2 in ALPN, with its settings stated
	// rather than left to net/http's defaults.
	if err := http2.ConfigureServer(ic.srv, &http2.Server{MaxConcurrentStreams: 250, IdleTimeout: p.Config.IdleTimeout}); err != nil {
		p.log.Warn("governor-proxy: HTTP/2 is off for intercepted tunnels", "err", err)
	}
	return ic
}

func (ic *interceptor) target(c net.Conn) *tunnelTarget {
	v, ok := ic.conns.Load(c)
	if !ok {
		return nil
	}
	return v.(*tunnelTarget)
}

// intercepts reports whether a CONNECT to addr ("host:port") is
// intercepted.
func (p *Proxy) intercepts(addr string) bool {
	if p.Intercept == nil {
		return false
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	return p.Intercept.Intercepts(host)
}

// intercept serves a CONNECT to a listed host: its target checked, the
// client's connection taken over, the TLS handshake made with the host's
// certificate, and the decrypted connection served until it closes.
func (p *Proxy) intercept(w http.ResponseWriter, r *http.Request) {
	addr := r.Host
	if _, _, err := net.SplitHostPort(addr); err != nil {
		addr += ":443"
	}
	host, port, _ := net.SplitHostPort(addr)
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	hj, ok := w.(http.Hijacker)
	if !ok {
		http.Error(w, "governor-proxy: this connection cannot be intercepted", http.StatusInternalServerError)
		return
	}
	refuse := p.checkConnectTarget(r, addr)
	raw, brw, err := hj.Hijack()
	if err != nil {
		p.log.Debug("governor-proxy: cannot take over an intercepted CONNECT's connection", "host", addr, "err", err)
		return
	}
	if refuse != nil {
		resp := refuse.response(r)
		resp.Write(raw)
		raw.Close()
		return
	}
	if _, err := io.WriteString(raw, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		raw.Close()
		return
	}
	// The client may have sent its ClientHello with the CONNECT: those
	// bytes are in the server's reader.
	conn := &tunnelConn{Conn: &bufferedConn{Conn: raw, r: brw.Reader}, idle: p.Config.TunnelIdleTimeout, ex: &exchange{}}
	conn.touch()
	conn.track(&p.tunnels)
	conn.watch()
	var certSent atomic.Bool
	tlsConn := tls.Server(conn, p.interceptTLS(host, &certSent))
	timeout := p.Config.ReadHeaderTimeout
	if timeout <= 0 {
		timeout = interceptHandshakeTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	err = tlsConn.HandshakeContext(ctx)
	cancel()
	if err != nil {
		reason := handshakeFailure(err, certSent.Load())
		p.m.interceptHandshakes.WithLabelValues(reason).Inc()
		p.log.Warn("governor-proxy: an intercepted TLS handshake failed", "host", host, "reason", reason, "err", err)
		conn.Close()
		return
	}
	p.m.interceptHandshakes.WithLabelValues(handshakeOK).Inc()
	authority := host
	if strings.Contains(host, ":") {
		authority = "[" + host + "]"
	}
	if port != "443" {
		authority = net.JoinHostPort(host, port)
	}
	t := &tunnelTarget{host: host, port: port, authority: authority, proxyAuth: r.Header.Get("Proxy-Authorization"),
		h2: tlsConn.ConnectionState().NegotiatedProtocol == http2.NextProtoTLS, done: make(chan struct{})}
	p.inter.conns.Store(tlsConn, t)
	p.m.intercepted.Inc()
	defer p.m.intercepted.Dec()
	// Serve returns once the connection is closed or hijacked (an
	// upgrade): oneConnListener's second Accept waits for that. It also
	// returns when the server shuts down; the connection then ends as the
	// shutdown ends it, unless it was never served.
	l := &oneConnListener{conn: tlsConn, done: t.done}
	p.inter.srv.Serve(l)
	if l.servedConn() {
		<-t.done
		return
	}
	p.inter.conns.Delete(tlsConn)
	tlsConn.Close()
}

// checkConnectTarget refuses a CONNECT's target before anything is
// answered for it, as admitConnect does: a port outside
// http.connect_ports, or an address the proxy must not reach, named or
// resolved.
func (p *Proxy) checkConnectTarget(r *http.Request, addr string) *refusal {
	ex := &exchange{kind: "connect", rule: ruleUnmatched}
	if err := p.checkConnectPort(addr); err != nil {
		p.refused(ex, addr, err)
		return upstreamRefusal(err)
	}
	if err := p.dialer.refuseLiteral(r.Context(), addr, "443"); err != nil {
		p.refused(ex, addr, err)
		return upstreamRefusal(err)
	}
	if _, err := p.dialer.lookupTimeout(r.Context(), addr); err != nil {
		var ref *refusal
		if errors.As(err, &ref) {
			p.refused(ex, addr, err)
			return ref
		}
		// A lookup that fails refuses nothing here: each request's dial
		// looks again, and its failure is that request's 502.
	}
	return nil
}

// interceptTLS is the server side of an intercepted tunnel to host;
// certSent is set once the handshake has a certificate to show.
func (p *Proxy) interceptTLS(host string, certSent *atomic.Bool) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{http2.NextProtoTLS, "http/1.1"},
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			if sni := strings.ToLower(strings.TrimSuffix(hello.ServerName, ".")); sni != "" && sni != host {
				return nil, fmt.Errorf("%w: %q, not %q", errSNIMismatch, hello.ServerName, host)
			}
			c, err := p.Intercept.Certificate(host)
			if err != nil {
				return nil, &mintError{err}
			}
			certSent.Store(true)
			return c, nil
		},
	}
}

// mintError is a certificate that could not be minted.
type mintError struct{ err error }

func (e *mintError) Error() string { return "no certificate: " + e.err.Error() }
func (e *mintError) Unwrap() error { return e.err }

// handshakeFailure names why an intercepted handshake failed. Once the
// certificate has been sent, the client's next move is to check it and
// finish; a client that refuses it says so in ways that differ by TLS
// library and version (an alert, an alert the server cannot read as one in
// TLS 1.3, or a closed connection, as Node and Java do), so any failure
// after that point but a timeout counts as a refused certificate.
func handshakeFailure(err error, certSent bool) string {
	var me *mintError
	var ne net.Error
	msg := err.Error()
	switch {
	case errors.Is(err, errSNIMismatch):
		return handshakeSNIMismatch
	case errors.As(err, &me):
		return handshakeNoCertificate
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return handshakeTimeout
	case certSent:
		return handshakeRefusedCA
	case errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed), strings.Contains(msg, "connection reset"):
		return handshakeClientClosed
	case strings.Contains(msg, "does not look like a TLS handshake"), strings.Contains(msg, "first record"):
		return handshakeNotTLS
	}
	return handshakeOther
}

// serveIntercepted serves one request of an intercepted connection: it
// becomes an https:// request to the tunnel's host and port, carrying the
// CONNECT's Proxy-Authorization (which names the subtask), and goes
// through ServeHTTP like any other.
func (p *Proxy) serveIntercepted(w http.ResponseWriter, r *http.Request) {
	t, _ := r.Context().Value(tunnelTargetKey{}).(*tunnelTarget)
	if t == nil {
		http.Error(w, "governor-proxy: a request on a connection that is not an intercepted tunnel", http.StatusInternalServerError)
		return
	}
	if r.Method == http.MethodConnect {
		writeLocal(w, (&refusal{code: http.StatusMethodNotAllowed, reason: "Method Not Allowed",
			err: fmt.Errorf("a CONNECT inside a tunnel to %s is not relayed", t.authority)}).response(r))
		return
	}
	host, port, err := net.SplitHostPort(r.Host)
	if err != nil {
		host, port = r.Host, ""
	}
	host = strings.ToLower(strings.TrimSuffix(strings.Trim(host, "[]"), "."))
	if host != t.host || (port != "" && port != t.port) {
		// A request for another host must open its own tunnel, which is
		// checked and classified for that host.
		writeLocal(w, (&refusal{code: http.StatusMisdirectedRequest, reason: "Misdirected Request",
			err: fmt.Errorf("this tunnel was opened to %s:%s; a request for %s must open its own", t.host, t.port, r.Host)}).response(r))
		return
	}
	r.URL.Scheme, r.URL.Host = "https", t.authority
	r.RequestURI = ""
	r.Header.Del("Proxy-Authorization")
	if t.proxyAuth != "" {
		r.Header.Set("Proxy-Authorization", t.proxyAuth)
	}
	p.ServeHTTP(w, r)
}

// writeLocal writes a response the proxy made itself.
func writeLocal(w http.ResponseWriter, resp *http.Response) {
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	io.Copy(w, resp.Body)
}

// bufferedConn reads what a reader holds of the connection first.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(b []byte) (int, error) {
	if c.r != nil && c.r.Buffered() > 0 {
		return c.r.Read(b)
	}
	return c.Conn.Read(b)
}

// oneConnListener hands its connection to http.Server.Serve once, then
// blocks until done (the connection closed or hijacked) or Close.
type oneConnListener struct {
	conn   net.Conn
	done   <-chan struct{}
	once   sync.Once
	closed chan struct{}
	mu     sync.Mutex
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	if l.closed == nil {
		l.closed = make(chan struct{})
	}
	c := l.conn
	l.conn = nil
	closed := l.closed
	l.mu.Unlock()
	if c != nil {
		return c, nil
	}
	select {
	case <-l.done:
	case <-closed:
	}
	return nil, net.ErrClosed
}

// servedConn reports whether Accept handed the connection out.
func (l *oneConnListener) servedConn() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conn == nil
}

func (l *oneConnListener) Close() error {
	l.mu.Lock()
	if l.closed == nil {
		l.closed = make(chan struct{})
	}
	l.once.Do(func() { close(l.closed) })
	l.mu.Unlock()
	return nil
}

func (l *oneConnListener) Addr() net.Addr { return &net.TCPAddr{} }
