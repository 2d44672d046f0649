package pgwire

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/governor-project/governor/classify"
	"github.com/governor-project/governor/classify/sqlclass"
	"github.com/governor-project/governor/proxy/admission"
)

// Defaults for the Proxy's zero fields.
const (
	DefaultWaitTimeout    = 30 * time.Second
	DefaultStartupTimeout = 30 * time.Second
	// WaitNoticeAfter: a client that waits this long for a lease gets a
	// NOTICE saying so.
	WaitNoticeAfter = time.Second
)

// ErrClosed is returned by Serve after Close.
var ErrClosed = errors.New("pgwire: proxy closed")

// Proxy relays PostgreSQL connections to one upstream server, governing
// them through Admitter. Set its fields, then call Serve; do not change them
// after. The zero value of every field but Upstream is usable.
type Proxy struct {
	// Upstream is the server's host:port.
	Upstream string
	// UpstreamTLS, when not nil, makes the upstream leg TLS (an SSLRequest
	// the server must accept). Nil: plain TCP.
	UpstreamTLS *tls.Config
	// TLSConfig, when not nil, terminates a client's SSLRequest with TLS.
	// Nil: SSLRequest is answered 'N' and the client goes on in plain text
	// (or gives up, with sslmode=require).
	TLSConfig *tls.Config
	// Dial opens the upstream connection. Nil: a net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)

	// Rules returns the rules in force; it is called for each statement,
	// so a classify.Watcher's Rules method fits. Nil, or a nil result: no
	// statement matches, so nothing is governed.
	Rules func() *classify.Rules
	// Admitter admits each transaction (a slot of its first governed
	// statement's class, and that statement's charges) and charges each
	// later statement. Nil: the proxy is a pure passthrough that classifies
	// nothing.
	Admitter admission.Admitter
	// WaitTimeout bounds each admission. Zero: DefaultWaitTimeout.
	WaitTimeout time.Duration
	// Metrics, if not nil, counts transactions, charges and denials.
	Metrics *Metrics
	// TaskFromApplicationName charges each connection's transactions to a
	// subtask named after its application_name (Tx.Subtask); a connection
	// without one is charged to the task itself.
	TaskFromApplicationName bool
	// Caps, when not nil, is read after each governed admission, and the
	// first time a transaction runs near or over a cap the client gets a
	// NOTICE naming it (notice.go). Nil: no such notices.
	Caps admission.CapReader
	// DryRun, when not nil, is asked about the statements of rules in dry
	// run (a rule's mode: shadow, or Shadow for every rule) instead of
	// admitting them: they run all the same, and a would-be denial is
	// logged and counted (notice.go). Nil: such statements run unasked,
	// counted as cause "unavailable".
	DryRun admission.DryRunner
	// WriteCheck, when not nil, is asked whether a write may go on in a
	// transaction whose leases were taken for reads (BEGIN; SELECT;
	// UPDATE), which a read_only tenant refuses. Nil: it goes on.
	WriteCheck admission.WriteChecker
	// Shadow puts every rule in dry run.
	Shadow bool

	// MaxMessageSize caps a message after startup. Zero:
	// DefaultMaxMessageSize.
	MaxMessageSize int
	// CacheEntries bounds the statement classification cache. Zero:
	// DefaultCacheEntries.
	CacheEntries int
	// Logger gets one line per failed connection. Nil: no logging.
	Logger *slog.Logger

	init   sync.Once
	cache  *sqlclass.Cache
	counts [failureCount]atomic.Uint64

	mu        sync.Mutex
	closed    bool
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	keys      map[cancelKey]*conn
	wg        sync.WaitGroup
}

// Failure is a kind of failure or denial, counted by the Proxy.
type Failure int

// The failures counted by Counts.
const (
	FailStartup     Failure = iota // a bad or unsupported startup packet
	FailTLS                        // a TLS handshake with a client failed
	FailUpstream                   // the upstream could not be reached or refused TLS
	FailAuth                       // the server refused the login
	FailTooLarge                   // a message over MaxMessageSize
	FailProtocol                   // a malformed message after startup
	FailCancel                     // a CancelRequest for an unknown key, or one not delivered
	DenyQuota                      // a statement denied: quota spent
	DenyWaitTimeout                // a statement denied: waited past WaitTimeout
	DenyUnavailable                // a statement denied: governord unreachable
	DenyTaskEnded                  // a statement denied: the task ended
	DenyBadRequest                 // a statement denied: its application_name cannot name a subtask
	DenySuspended                  // a statement denied: the tenant is suspended
	DenyReadOnly                   // a write denied: the tenant is read-only
	DenyRate                       // a statement denied: over a rate
	failureCount
)

var failureNames = [failureCount]string{"startup", "tls", "upstream", "auth", "too_large", "protocol",
	"cancel", "deny_quota", "deny_wait_timeout", "deny_unavailable", "deny_task_ended", "deny_bad_request",
	"deny_suspended", "deny_read_only", "deny_rate"}

func (f Failure) String() string {
	if f >= 0 && f < failureCount {
		return failureNames[f]
	}
	return fmt.Sprintf("Failure(%d)", int(f))
}

// Counts returns how many failures of each kind the proxy has seen, by name.
func (p *Proxy) Counts() map[string]uint64 {
	m := make(map[string]uint64, failureCount)
	for i := range p.counts {
		m[Failure(i).String()] = p.counts[i].Load()
	}
	return m
}

func (p *Proxy) count(f Failure) { p.counts[f].Add(1) }

func (p *Proxy) setup() {
	p.init.Do(func() {
		p.cache = sqlclass.NewCache(p.CacheEntries)
		p.listeners = make(map[net.Listener]struct{})
		p.conns = make(map[*conn]struct{})
		p.keys = make(map[cancelKey]*conn)
	})
}

func (p *Proxy) maxMessage() int {
	if p.MaxMessageSize > 0 {
		return p.MaxMessageSize
	}
	return DefaultMaxMessageSize
}

func (p *Proxy) waitTimeout() time.Duration {
	if p.WaitTimeout > 0 {
		return p.WaitTimeout
	}
	return DefaultWaitTimeout
}

// Serve accepts connections on ln and relays each until it ends. It
// returns ErrClosed after Close, or the listener's error. Serve may be
// called on several listeners at once.
func (p *Proxy) Serve(ln net.Listener) error {
	p.setup()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		ln.Close()
		return ErrClosed
	}
	p.listeners[ln] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.listeners, ln)
		p.mu.Unlock()
	}()
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			p.mu.Lock()
			closed := p.closed
			p.mu.Unlock()
			if closed {
				return ErrClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				time.Sleep(backoff) // accept is failing (say, out of file descriptors): slow down
				continue
			}
			return fmt.Errorf("pgwire: accept: %w", err)
		}
		backoff = 0
		c := &conn{p: p, client: nc}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			nc.Close()
			return ErrClosed
		}
		p.conns[c] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go func() {
			defer p.wg.Done()
			c.serve()
			p.mu.Lock()
			delete(p.conns, c)
			p.mu.Unlock()
		}()
	}
}

// Close stops every Serve, closes every connection (releasing their
// leases) and waits for their goroutines to end. A client gets what its
// server had sent, then a FATAL (57P01) saying the proxy is shutting down,
// then EOF; a client that does not close its end is cut off after
// closeGrace.
func (p *Proxy) Close() error {
	p.setup()
	p.mu.Lock()
	p.closed = true
	for ln := range p.listeners {
		ln.Close()
	}
	for c := range p.conns {
		c.stop()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return nil
}

// cancelKey is the (pid, secret) the proxy handed a client. The pid is the
// server's own, so that what the client knows as its backend's pid is what
// pg_backend_pid(), pg_stat_activity and pg_terminate_backend know; the
// secret is the proxy's, so the server's never leaves the proxy.
type cancelKey struct {
	pid    uint32
	secret uint32
}

// register gives c a key of its own for the backend pid: a fresh secret.
func (p *Proxy) register(c *conn, pid uint32) cancelKey {
	var b [8]byte
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		if _, err := rand.Read(b[:]); err != nil {
			panic(err) // crypto/rand does not fail on supported platforms
		}
		k := cancelKey{pid: pid, secret: binary.BigEndian.Uint32(b[4:])}
		if pid == 0 { // no server gives pid 0; if one did, the client gets a random pid
			k.pid = binary.BigEndian.Uint32(b[:4])&0x7fffffff | 1
		}
		if _, taken := p.keys[k]; !taken {
			p.keys[k] = c
			return k
		}
	}
}

// unregister forgets c's key, if c was given one.
func (p *Proxy) unregister(c *conn) {
	p.mu.Lock()
	if p.keys[c.key] == c {
		delete(p.keys, c.key)
	}
	p.mu.Unlock()
}

// cancel forwards a client's CancelRequest, by the key the proxy handed
// out, to the backend it stands for. An unknown key is dropped silently, as
// the server does.
func (p *Proxy) cancel(payload []byte) error {
	if len(payload) != 8 {
		return fmt.Errorf("cancel request of %d bytes", len(payload)+8)
	}
	k := cancelKey{pid: binary.BigEndian.Uint32(payload[:4]), secret: binary.BigEndian.Uint32(payload[4:])}
	p.mu.Lock()
	c := p.keys[k]
	p.mu.Unlock()
	if c == nil {
		return errors.New("cancel request for an unknown key")
	}
	ctx, stop := context.WithTimeout(context.Background(), DefaultStartupTimeout)
	defer stop()
	up, err := p.dialUpstream(ctx)
	if err != nil {
		return err
	}
	defer up.Close()
	msg := binary.BigEndian.AppendUint32(nil, uint32(8+4+len(c.upKey)))
	msg = binary.BigEndian.AppendUint32(msg, CodeCancelRequest)
	msg = binary.BigEndian.AppendUint32(msg, c.upPID)
	msg = append(msg, c.upKey...)
	if _, err := up.Write(msg); err != nil {
		return fmt.Errorf("send cancel upstream: %w", err)
	}
	// The server answers nothing; wait for it to close so the cancel has
	// been read before we return.
	_, _ = io.Copy(io.Discard, up)
	return nil
}

// dialUpstream connects to the server, with TLS when configured.
func (p *Proxy) dialUpstream(ctx context.Context) (net.Conn, error) {
	dial := p.Dial
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	nc, err := dial(ctx, "tcp", p.Upstream)
	if err != nil {
		return nil, fmt.Errorf("dial upstream %s: %w", p.Upstream, err)
	}
	if p.UpstreamTLS == nil {
		return nc, nil
	}
	if d, ok := ctx.Deadline(); ok {
		nc.SetDeadline(d)
	}
	req := binary.BigEndian.AppendUint32(nil, 8)
	req = binary.BigEndian.AppendUint32(req, CodeSSLRequest)
	var ans [1]byte
	if _, err := nc.Write(req); err != nil {
		nc.Close()
		return nil, fmt.Errorf("upstream SSLRequest: %w", err)
	}
	if _, err := io.ReadFull(nc, ans[:]); err != nil {
		nc.Close()
		return nil, fmt.Errorf("upstream SSLRequest: %w", err)
	}
	if ans[0] != answerYes {
		nc.Close()
		return nil, fmt.Errorf("upstream %s refused TLS (answered %q)", p.Upstream, ans[0])
	}
	cfg := p.UpstreamTLS.Clone()
	if cfg.ServerName == "" {
		host, _, _ := net.SplitHostPort(p.Upstream)
		cfg.ServerName = host
	}
	tc := tls.Client(nc, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		nc.Close()
		return nil, fmt.Errorf("upstream TLS: %w", err)
	}
	nc.SetDeadline(time.Time{})
	return tc, nil
}
