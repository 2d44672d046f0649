package pgwire

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/governor-project/governor/classify"
	"github.com/governor-project/governor/classify/sqlclass"
)

const bufSize = 32 << 10

// denyMarker is in the text of the statement the proxy sends the server in
// place of a denied one (see denyStatement); the server's error for it is
// recognised by this marker and replaced by the denial.
const denyMarker = "governor-proxy: statement denied"

// denyStatement fails on the server without touching anything: the cast of
// a constant fails during parse analysis (22P02), which aborts an open
// transaction, so a later COMMIT rolls back. It needs no function, schema
// or language, and it names itself in the server's log.
const denyStatement = "SELECT '" + denyMarker + "'::pg_catalog.int4"

// conn is one client connection and its upstream connection.
type conn struct {
	p      *Proxy
	client net.Conn
	server net.Conn

	ctx    context.Context // ends when the connection does
	cancel context.CancelFunc

	cr *bufio.Reader
	sr *bufio.Reader
	sw *bufio.Writer // written by the client goroutine only

	cwMu   sync.Mutex // guards cw: both goroutines and the wait notice write to the client
	cw     *bufio.Writer
	cwDone bool // the proxy has said its last word to the client

	database, user, appName string
	upTLS                   bool

	key   cancelKey // what the client was given
	upPID uint32    // what the server gave
	upKey []byte

	mu         sync.Mutex
	queue      []*pending   // one per ReadyForQuery the server owes
	status     byte         // from the last ReadyForQuery
	inBatch    bool         // extended-protocol messages sent since the last Sync
	tickets    []heldTicket // the transaction's leases, one per class (govern.go)
	overloaded bool
	// capNoticed: the transaction has had its NOTICE of a cap near or over
	// (notice.go).
	capNoticed bool
	// What the statements run (statements.go).
	lex         sqlclass.Settings // how the server lexes text, from ParameterStatus
	names       names             // its prepared statements and portals
	batches     uint64            // Queries, FunctionCalls and Syncs sent, each owed a ReadyForQuery
	done        uint64            // ReadyForQuery received for them
	answered    chan struct{}     // closed when the server owes nothing more; see settle
	batchRan    bool              // an Execute was sent since the last Sync
	sending     bool              // a message admitted and not yet sent (govern.go)
	unconfirmed atomic.Int32      // len(names.undo), read without mu
	relaying    bool              // both loops run, or ran (lifecycle.go)
	stopping    bool              // Proxy.Close is ending the connection
	clientDone  bool              // clientLoop has returned
	serverDone  bool              // serverLoop has returned

	srvFatal bool // the server's last ErrorResponse was FATAL or PANIC; the server goroutine's own

	// The client goroutine's own state.
	rulesSeen   *classify.Rules   // the rules connRule was decided under
	connRule    classify.Decision // what they decide by the connection alone,
	connMatched bool              // whether a rule matched that way,
	connDecides bool              // and whether that decides every statement
	// queryText is the text of the Query being admitted, which a text
	// decided by the connection alone (byConnection) is classified from
	// only to tell whether it writes (writes).
	queryText   []byte
	series      *ruleSeries // the metrics last counted into
	discarding  bool        // after a denial in the extended protocol, until Sync
	pendingDeny []byte      // that denial, for the Sync's ReadyForQuery
	hdr         [headerLen]byte
	buf         []byte
}

// pending is a ReadyForQuery the server owes the client. deny, when set, is
// the denial to show instead of the server's error for denyStatement.
// parses and closes count the Parse and Close messages sent up to it.
type pending struct {
	deny           []byte
	parses, closes uint64
}

func (c *conn) abort() {
	c.client.Close()
	if c.server != nil {
		c.server.Close()
	}
}

func (c *conn) fail(f Failure, err error) {
	c.p.count(f)
	if c.p.Logger != nil {
		c.p.Logger.Info("pgwire: connection failed", "kind", f.String(), "remote", c.client.RemoteAddr().String(), "err", err)
	}
}

func (c *conn) serve() {
	defer c.client.Close()
	c.ctx, c.cancel = context.WithCancel(context.Background())
	defer c.cancel()
	c.client.SetDeadline(time.Now().Add(DefaultStartupTimeout))
	params, minor, ok := c.startup()
	if !ok {
		return
	}
	c.database, c.user, c.appName = params["database"], params["user"], params["application_name"]
	if c.database == "" {
		c.database = c.user
	}
	up, err := c.p.dialUpstream(c.ctx)
	if err != nil {
		c.fail(FailUpstream, err)
		c.writeFatalNow("08001", "governor-proxy: cannot reach the database server")
		return
	}
	c.p.mu.Lock()
	if c.p.closed {
		c.p.mu.Unlock()
		up.Close()
		return
	}
	c.server = up
	c.p.mu.Unlock()
	defer up.Close()
	_, c.upTLS = up.(*tls.Conn)
	c.cr = bufio.NewReaderSize(c.client, bufSize)
	c.cw = bufio.NewWriterSize(c.client, bufSize)
	c.sr = bufio.NewReaderSize(up, bufSize)
	c.sw = bufio.NewWriterSize(up, bufSize)
	c.names = names{stmts: make(map[string]*sqlclass.Class), portals: make(map[string]*sqlclass.Class)}
	defer c.p.unregister(c)

	if minor != 0 {
		// We speak 3.0 upstream; tell the client so, as a server would.
		b, _ := (&pgproto3.NegotiateProtocolVersion{NewestMinorProtocol: 0}).Encode(nil)
		c.cw.Write(b)
	}
	if err := c.sendStartup(params); err != nil {
		c.fail(FailUpstream, err)
		return
	}
	if err := c.authenticate(); err != nil {
		if errors.Is(err, ErrMessageTooLarge) {
			c.fail(FailTooLarge, err)
			c.writeFatalNow("08P01", "governor-proxy: "+err.Error())
			closeWrite(c.client)
			c.linger()
			return
		}
		if !errors.Is(err, errStopping) {
			c.fail(FailAuth, err)
		}
		return
	}
	c.client.SetReadDeadline(time.Time{})
	c.mu.Lock()
	if !c.stopping { // stop's write deadline (closeGrace) stays
		c.client.SetWriteDeadline(time.Time{})
	}
	c.mu.Unlock()
	up.SetDeadline(time.Time{})

	done := make(chan error, 1)
	go func() {
		err := c.serverLoop()
		c.serverEnded(err)
		done <- err
	}()
	err = c.clientLoop()
	c.clientEnded(err)
	c.abort()
	serr := <-done
	c.endTx(true)
	for _, e := range []error{err, serr} {
		switch {
		case e == nil, errors.Is(e, io.EOF), errors.Is(e, net.ErrClosed):
		case errors.Is(e, ErrMessageTooLarge):
			c.fail(FailTooLarge, e)
		case errors.Is(e, ErrBadLength), errors.Is(e, errProtocol):
			c.fail(FailProtocol, e)
		}
	}
}

var errProtocol = errors.New("protocol violation")

// startup reads startup packets until a StartupMessage, answering
// SSLRequest and GSSENCRequest and serving a CancelRequest. It returns the
// startup parameters in order of appearance (as a map) and the protocol's
// minor version.
func (c *conn) startup() (map[string]string, uint16, bool) {
	tlsDone := false
	for {
		code, payload, err := readStartup(c.client)
		if err != nil {
			if !errors.Is(err, io.EOF) {
				c.fail(FailStartup, err)
			}
			return nil, 0, false
		}
		switch {
		case code == CodeSSLRequest && len(payload) == 0 && !tlsDone:
			if c.p.TLSConfig == nil {
				if _, err := c.client.Write([]byte{answerNo}); err != nil {
					return nil, 0, false
				}
				continue
			}
			if _, err := c.client.Write([]byte{answerYes}); err != nil {
				return nil, 0, false
			}
			tc := tls.Server(c.client, c.p.TLSConfig)
			if err := tc.HandshakeContext(c.ctx); err != nil {
				c.fail(FailTLS, err)
				return nil, 0, false
			}
			c.client = tc
			tlsDone = true
		case code == CodeGSSENCRequest && len(payload) == 0:
			if _, err := c.client.Write([]byte{answerNo}); err != nil {
				return nil, 0, false
			}
		case code == CodeCancelRequest:
			if err := c.p.cancel(payload); err != nil {
				c.fail(FailCancel, err)
			}
			return nil, 0, false
		case code>>protocolMajorShift == 3:
			params, err := parseParams(payload)
			if err != nil {
				c.fail(FailStartup, err)
				c.writeFatalNow("08P01", "invalid startup packet: "+err.Error())
				return nil, 0, false
			}
			if params["user"] == "" {
				c.fail(FailStartup, errors.New("no user in the startup packet"))
				c.writeFatalNow("28000", "no PostgreSQL user name specified in startup packet")
				return nil, 0, false
			}
			return params, uint16(code), true
		default:
			c.fail(FailStartup, fmt.Errorf("unsupported startup code %d", code))
			c.writeFatalNow("0A000", fmt.Sprintf("unsupported frontend protocol %d.%d", code>>16, code&0xffff))
			return nil, 0, false
		}
	}
}

func parseParams(b []byte) (map[string]string, error) {
	m := make(map[string]string)
	for len(b) > 0 && b[0] != 0 {
		k, rest, ok := cstring(b)
		if !ok {
			return nil, errors.New("unterminated parameter name")
		}
		v, rest, ok := cstring(rest)
		if !ok {
			return nil, fmt.Errorf("unterminated value of %q", k)
		}
		m[k] = v
		b = rest
	}
	if len(b) == 0 {
		return nil, errors.New("missing terminator")
	}
	return m, nil
}

func (c *conn) sendStartup(params map[string]string) error {
	msg := &pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion30, Parameters: params}
	b, err := msg.Encode(nil)
	if err != nil {
		return err
	}
	_, err = c.server.Write(b)
	return err
}

// authenticate relays the login: the server's Authentication requests to
// the client and the client's answers back, until the first ReadyForQuery.
func (c *conn) authenticate() error {
	max := c.p.maxMessage()
	for {
		t, n, err := readHeader(c.sr, &c.hdr, max)
		if err != nil {
			return fmt.Errorf("read from server during login: %w", err)
		}
		body, err := readBody(c.sr, nil, n)
		if err != nil {
			return fmt.Errorf("read from server during login: %w", err)
		}
		switch t {
		case MsgAuthentication:
			if len(body) < 4 {
				return fmt.Errorf("authentication message of %d bytes: %w", len(body), errProtocol)
			}
			code := binary.BigEndian.Uint32(body)
			if code == authSASL && c.upTLS {
				body = stripChannelBinding(body)
			}
			c.cw.Write(appendMsg(nil, t, body))
			if err := c.cw.Flush(); err != nil {
				return err
			}
			switch code {
			case authCleartextPassword, authMD5Password, authSASL, authSASLContinue, authGSS, authGSSContinue, authSSPI:
				// Before login, a client's message is held to the server's
				// own cap on it, not to the cap after login.
				ct, cn, err := readHeader(c.cr, &c.hdr, MaxAuthMessageSize)
				if err != nil {
					return fmt.Errorf("read client's answer to authentication %d: %w", code, err)
				}
				if ct != MsgPassword {
					return fmt.Errorf("client answered authentication with %q: %w", byte(ct), errProtocol)
				}
				cb, err := readBody(c.cr, nil, cn)
				if err != nil {
					return err
				}
				if _, err := c.server.Write(appendMsg(nil, ct, cb)); err != nil {
					return err
				}
			}
		case MsgBackendKeyData:
			if len(body) < 8 {
				return fmt.Errorf("BackendKeyData of %d bytes: %w", len(body), errProtocol)
			}
			c.upPID = binary.BigEndian.Uint32(body)
			c.upKey = bytes.Clone(body[4:])
			c.key = c.p.register(c, c.upPID)
			b, _ := (&pgproto3.BackendKeyData{ProcessID: c.key.pid, SecretKey: binary.BigEndian.AppendUint32(nil, c.key.secret)}).Encode(nil)
			c.cw.Write(b)
		case MsgErrorResponse:
			c.cw.Write(appendMsg(nil, t, body))
			c.cw.Flush()
			code, msg := errorFields(body)
			return fmt.Errorf("server refused the login: %s %s", code, msg)
		case MsgReadyForQuery:
			if len(body) != 1 {
				return fmt.Errorf("ReadyForQuery of %d bytes: %w", len(body), errProtocol)
			}
			c.status = body[0]
			// Relaying from before the client learns it is logged in, so
			// that a Proxy.Close from then on ends the connection with
			// FATAL 57P01, never in silence.
			if !c.startRelay() {
				return errStopping
			}
			c.cw.Write(appendMsg(nil, t, body))
			return c.cw.Flush()
		default: // ParameterStatus, NoticeResponse, NegotiateProtocolVersion
			if t == MsgParameterStatus {
				c.noteParameter(body)
			}
			c.cw.Write(appendMsg(nil, t, body))
		}
	}
}

// stripChannelBinding removes SCRAM-SHA-256-PLUS from an AuthenticationSASL
// body. Channel binding binds the SCRAM exchange to the server's TLS
// certificate, which the client never sees through the proxy, so a client
// that chose -PLUS would fail; offered only SCRAM-SHA-256 it does not.
func stripChannelBinding(body []byte) []byte {
	var m pgproto3.AuthenticationSASL
	if err := m.Decode(body); err != nil {
		return body
	}
	kept := m.AuthMechanisms[:0]
	for _, mech := range m.AuthMechanisms {
		if mech != "SCRAM-SHA-256-PLUS" {
			kept = append(kept, mech)
		}
	}
	m.AuthMechanisms = kept
	b, err := m.Encode(nil)
	if err != nil {
		return body
	}
	return b[headerLen:]
}

func (c *conn) writeFatalNow(code, msg string) {
	c.client.Write(errorResponse("FATAL", code, msg))
}

// writeClient writes b to the client, flushing when asked.
func (c *conn) writeClient(b []byte, flush bool) error {
	c.cwMu.Lock()
	defer c.cwMu.Unlock()
	if c.cwDone {
		return net.ErrClosed
	}
	if _, err := c.cw.Write(b); err != nil {
		return err
	}
	if flush {
		return c.cw.Flush()
	}
	return nil
}

// serverLoop relays the server's messages to the client. It decodes only
// ReadyForQuery (transaction state, lease release) and ErrorResponse
// (overload, denial substitution); everything else is streamed.
func (c *conn) serverLoop() error {
	max := c.p.maxMessage()
	var hdr [headerLen]byte
	var body []byte
	for {
		if c.sr.Buffered() == 0 {
			c.cwMu.Lock()
			err := c.cw.Flush()
			c.cwMu.Unlock()
			if err != nil {
				return err
			}
		}
		t, n, err := readHeader(c.sr, &hdr, max)
		if err != nil {
			return err
		}
		switch t {
		case MsgReadyForQuery:
			if body, err = readBody(c.sr, body, n); err != nil {
				return err
			}
			if len(body) != 1 {
				return fmt.Errorf("ReadyForQuery of %d bytes: %w", len(body), errProtocol)
			}
			// The transaction's state is settled, and its slot given back,
			// before the client learns it may go on: a client that sends
			// its next statement at once, on this connection or another,
			// must find the connection idle and the slot free.
			c.readyForQuery(body[0])()
			rfq := [headerLen + 1]byte{hdr[0], hdr[1], hdr[2], hdr[3], hdr[4], body[0]}
			if err := c.writeClient(rfq[:], c.sr.Buffered() == 0); err != nil {
				return err
			}
		case MsgErrorResponse:
			if body, err = readBody(c.sr, body, n); err != nil {
				return err
			}
			c.srvFatal = fatal(body)
			out := c.serverError(body)
			if out == nil {
				out = appendMsg(nil, t, body)
			}
			if err := c.writeClient(out, false); err != nil {
				return err
			}
			body = shrink(body)
		default:
			c.noteServer(t, n) // settings, and confirmations of prepared statements
			c.cwMu.Lock()
			err := net.ErrClosed
			if !c.cwDone {
				_, err = c.cw.Write(hdr[:])
			}
			if err == nil {
				if err = relay(c.cw, c.sr, n); err != nil {
					err = fmt.Errorf("%w: %w", errCut, err)
				}
			}
			c.cwMu.Unlock()
			if err != nil {
				return err
			}
		}
	}
}

// serverError notes an error's SQLSTATE for the lease's report and returns
// the denial to show instead, when the error is the server's answer to
// denyStatement.
func (c *conn) serverError(body []byte) []byte {
	code, msg := errorFields(body)
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.tickets) > 0 && overloadedCode(code) {
		c.overloaded = true
	}
	if c.unconfirmed.Load() > 0 {
		c.undoBatch() // the rest of the Query or batch is skipped
	}
	if len(c.queue) > 0 {
		if p := c.queue[0]; p.deny != nil && (strings.Contains(msg, denyMarker) || code == "25P02") {
			d := p.deny
			p.deny = nil
			return d
		}
	}
	return nil
}

// readyForQuery records the server's transaction state and ends the
// admitted transaction when the connection is idle again.
func (c *conn) readyForQuery(status byte) (end func()) {
	c.mu.Lock()
	c.status = status
	if len(c.queue) > 0 {
		p := c.queue[0]
		c.queue[0] = nil
		c.queue = c.queue[1:]
		c.noteAnswered(p)
	}
	c.mu.Unlock()
	return c.detachTx(false)
}

// endTx ends the transaction's ticket when the connection is idle (or,
// with dropped, regardless).
func (c *conn) endTx(dropped bool) { c.detachTx(dropped)() }

// detachTx takes the transaction's ticket off the connection when it is
// idle (or, with dropped, regardless) and returns what ends it, to be
// called outside c.mu. The serverLoop calls it before it forwards the
// ReadyForQuery; a shutdown waiting for the last transaction cannot cut that
// ReadyForQuery off, since Proxy.Close ends a connection by its server leg
// (conn.stop).
func (c *conn) detachTx(dropped bool) (end func()) {
	c.mu.Lock()
	ts := c.tickets
	if len(ts) == 0 || (!dropped && (c.status != TxIdle || len(c.queue) > 0 || c.inBatch || c.sending)) {
		c.mu.Unlock()
		return func() {}
	}
	c.tickets = nil
	over := c.overloaded
	c.mu.Unlock()
	return func() {
		now := time.Now()
		for _, h := range ts {
			h.t.End(now.Sub(h.since), over)
		}
	}
}

// clientLoop relays the client's messages to the server, classifying and
// admitting the ones that run SQL.
func (c *conn) clientLoop() error {
	max := c.p.maxMessage()
	for {
		c.buf = shrink(c.buf)
		if c.cr.Buffered() == 0 {
			if err := c.sw.Flush(); err != nil {
				return err
			}
		}
		t, n, err := readHeader(c.cr, &c.hdr, max)
		if err != nil {
			return err
		}
		if c.discarding {
			switch t {
			case MsgSync, MsgTerminate:
			case MsgFlush:
				if err := c.forwardRaw(t, n); err != nil {
					return err
				}
				continue
			default:
				if _, err := c.cr.Discard(n); err != nil {
					return noEOF(err)
				}
				continue
			}
		}
		switch t {
		case MsgQuery:
			if err := c.readBody(n); err != nil {
				return err
			}
			end := bytes.IndexByte(c.buf, 0)
			if end < 0 {
				return fmt.Errorf("query without terminator: %w", errProtocol)
			}
			cl := c.classifyQuery(c.buf[:end])
			run, changes := c.toRun(cl)
			c.queryText = c.buf[:end]
			deny := c.admit(cl, run)
			c.queryText = nil
			if deny != nil {
				if err := c.denySimple(deny); err != nil {
					return err
				}
				continue
			}
			c.commitChanges(changes)
			c.expect(nil)
			c.send(t, c.buf)
		case MsgFunctionCall:
			if err := c.readBody(n); err != nil {
				return err
			}
			if deny := c.admit(functionCallClass, functionCallClass.Statements); deny != nil {
				if err := c.denySimple(deny); err != nil {
					return err
				}
				continue
			}
			c.expect(nil)
			c.send(t, c.buf)
		case MsgParse:
			if err := c.readBody(n); err != nil {
				return err
			}
			name, rest, ok := cstring(c.buf)
			end := bytes.IndexByte(rest, 0)
			if !ok || end < 0 {
				return fmt.Errorf("malformed Parse: %w", errProtocol)
			}
			if cl := c.classifyParse(rest[:end]); cl != nil {
				c.parse(name, cl)
			}
			c.batch()
			c.send(t, c.buf)
		case MsgBind:
			if err := c.readBody(n); err != nil {
				return err
			}
			portal, rest, ok := cstring(c.buf)
			stmt, _, ok2 := cstring(rest)
			if !ok || !ok2 {
				return fmt.Errorf("malformed Bind: %w", errProtocol)
			}
			if c.governs() {
				c.bind(portal, stmt)
			}
			c.batch()
			c.send(t, c.buf)
		case MsgExecute:
			if err := c.readBody(n); err != nil {
				return err
			}
			portal, _, ok := cstring(c.buf)
			if !ok {
				return fmt.Errorf("malformed Execute: %w", errProtocol)
			}
			c.batch()
			var cl *sqlclass.Class
			if c.governs() {
				cl = c.portal(portal)
			}
			run, changes := c.toRun(cl)
			if deny := c.admit(cl, run); deny != nil {
				c.discarding, c.pendingDeny = true, deny
				c.mu.Lock()
				c.names.parses++
				c.mu.Unlock()
				b, _ := (&pgproto3.Parse{Query: denyStatement}).Encode(nil)
				c.sw.Write(b)
				continue
			}
			c.commitChanges(changes)
			c.mu.Lock()
			c.batchRan = true
			c.mu.Unlock()
			c.send(t, c.buf)
		case MsgClose:
			if err := c.readBody(n); err != nil {
				return err
			}
			if len(c.buf) > 1 && c.governs() {
				name, _, _ := cstring(c.buf[1:])
				c.closeName(c.buf[0], name)
			}
			c.batch()
			c.send(t, c.buf)
		case MsgSync:
			if err := c.readBody(n); err != nil {
				return err
			}
			c.expect(c.pendingDeny)
			c.discarding, c.pendingDeny = false, nil
			c.send(t, c.buf)
		case MsgTerminate:
			c.send(t, nil)
			c.sw.Flush()
			return nil
		default: // Describe, Flush, CopyData, CopyDone, CopyFail, ...
			if t == MsgDescribe {
				c.batch()
			}
			if err := c.forwardRaw(t, n); err != nil {
				return err
			}
		}
	}
}

var functionCallClass = &sqlclass.Class{Statements: []sqlclass.Statement{sqlclass.FunctionCall}}

// send writes a message to the server's buffer.
func (c *conn) send(t MsgType, body []byte) {
	var h [headerLen]byte
	h[0] = byte(t)
	binary.BigEndian.PutUint32(h[1:], uint32(len(body)+4))
	c.sw.Write(h[:])
	c.sw.Write(body)
}

func (c *conn) readBody(n int) error {
	b, err := readBody(c.cr, c.buf, n)
	c.buf = b
	return err
}

// forwardRaw streams a message the proxy need not look into.
func (c *conn) forwardRaw(t MsgType, n int) error {
	if _, err := c.sw.Write(c.hdr[:]); err != nil {
		return err
	}
	return relay(c.sw, c.cr, n)
}

// relay copies the next n bytes of r to w straight from r's buffer: no
// allocation, and no read while the buffer holds them.
func relay(w *bufio.Writer, r *bufio.Reader, n int) error {
	for n > 0 {
		k := r.Buffered()
		if k == 0 {
			if _, err := r.Peek(1); err != nil {
				return noEOF(err)
			}
			k = r.Buffered()
		}
		b, _ := r.Peek(min(k, n))
		if _, err := w.Write(b); err != nil {
			return err
		}
		r.Discard(len(b))
		n -= len(b)
	}
	return nil
}

// expect records that the server owes a ReadyForQuery for the message about
// to be sent (a Query, FunctionCall or Sync). It is recorded before the
// message goes out, so the answer cannot overtake it.
func (c *conn) expect(deny []byte) {
	c.mu.Lock()
	c.queue = append(c.queue, &pending{deny: deny, parses: c.names.parses, closes: c.names.closes})
	c.batches++
	c.inBatch, c.batchRan, c.sending = false, false, false
	c.mu.Unlock()
}

func (c *conn) batch() {
	c.mu.Lock()
	c.inBatch = true
	c.mu.Unlock()
}
