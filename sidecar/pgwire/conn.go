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
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/governor-project/governor/classify"
	"github.com/governor-project/governor/classify/sqlclass"
	"github.com/governor-project/governor/sidecar/admission"
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
	queue      []*pending // one per ReadyForQuery the server owes
	status     byte       // from the last ReadyForQuery
	inBatch    bool       // extended-protocol messages sent since the last Sync
	ticket     admission.Ticket
	txStart    time.Time
	overloaded bool
	relaying   bool // both loops run, or ran (lifecycle.go)
	stopping   bool // Proxy.Close is ending the connection
	clientDone bool // clientLoop has returned
	serverDone bool // serverLoop has returned

	srvFatal bool // the server's last ErrorResponse was FATAL or PANIC; the server goroutine's own

	// The client goroutine's own state.
	rulesSeen   *classify.Rules            // the rules connRule was decided under
	connRule    classify.Decision          // what they decide by the connection alone,
	connMatched bool                       // whether a rule matched that way,
	connDecides bool                       // and whether that decides every statement
	series      *ruleSeries                // the metrics last counted into
	prepared    map[string]*sqlclass.Class // by prepared statement name
	portals     map[string]*sqlclass.Class // by portal name
	sqlPrepared map[string]*sqlclass.Class // SQL-level PREPARE, by name
	discarding  bool                       // after a denial in the extended protocol, until Sync
	pendingDeny []byte                     // that denial, for the Sync's ReadyForQuery
	hdr         [headerLen]byte
	buf         []byte
}

// pending is a ReadyForQuery the server owes the client. deny, when set, is
// the denial to show instead of the server's error for denyStatement.
type pending struct {
	deny []byte
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
	c.prepared = make(map[string]*sqlclass.Class)
	c.portals = make(map[string]*sqlclass.Class)
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
		c.fail(FailAuth, err)
		return
	}
	c.client.SetDeadline(time.Time{})
	up.SetDeadline(time.Time{})

	done := make(chan error, 1)
	if !c.startRelay() {
		return
	}
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
			c.cw.Write(appendMsg(nil, t, body))
			return c.cw.Flush()
		default: // ParameterStatus, NoticeResponse, NegotiateProtocolVersion
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
	if c.ticket != nil && overloadedCode(code) {
		c.overloaded = true
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
	if len(c.queue) > 0 {
		c.queue[0] = nil
		c.queue = c.queue[1:]
	}
	c.status = status
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
	t := c.ticket
	if t == nil || (!dropped && (c.status != TxIdle || len(c.queue) > 0 || c.inBatch)) {
		c.mu.Unlock()
		return func() {}
	}
	c.ticket = nil
	latency, over := time.Since(c.txStart), c.overloaded
	c.mu.Unlock()
	return func() { t.End(latency, over) }
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
			cl := c.classifyQuery(c.buf[:end], true)
			if deny := c.admit(cl); deny != nil {
				if err := c.denySimple(deny); err != nil {
					return err
				}
				continue
			}
			c.expect(nil)
			c.send(t, c.buf)
		case MsgFunctionCall:
			if err := c.readBody(n); err != nil {
				return err
			}
			if deny := c.admit(functionCallClass); deny != nil {
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
			// A prepared statement is classified whole, whatever the rules
			// say now: they may change before it runs.
			c.prepared[name] = c.classifyQuery(rest[:end], false)
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
			c.portals[portal] = c.prepared[stmt]
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
			if deny := c.admit(c.portals[portal]); deny != nil {
				c.discarding, c.pendingDeny = true, deny
				b, _ := (&pgproto3.Parse{Query: denyStatement}).Encode(nil)
				c.sw.Write(b)
				continue
			}
			c.send(t, c.buf)
		case MsgClose:
			if err := c.readBody(n); err != nil {
				return err
			}
			if len(c.buf) > 1 {
				name, _, _ := cstring(c.buf[1:])
				if c.buf[0] == 'S' {
					delete(c.prepared, name)
				} else {
					delete(c.portals, name)
				}
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

var functionCallClass = &sqlclass.Class{Kinds: []string{classify.KindCall}}

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
	c.queue = append(c.queue, &pending{deny: deny})
	c.inBatch = false
	c.mu.Unlock()
}

func (c *conn) batch() {
	c.mu.Lock()
	c.inBatch = true
	c.mu.Unlock()
}

// classifyQuery classifies a Query's or Parse's text, with SQL-level
// PREPARE/EXECUTE followed on this connection. A passthrough proxy (no
// Admitter or no Rules) admits nothing, so it classifies nothing; admit
// treats a nil class as "forward". With shortcut, a statement the rules
// decide by its connection alone (say, under `sql: any`) is not classified
// at all: it gets byConnection.
func (c *conn) classifyQuery(sql []byte, shortcut bool) *sqlclass.Class {
	if c.p.Admitter == nil || c.p.Rules == nil {
		return nil
	}
	if shortcut && c.decidedByConnection() {
		return byConnection
	}
	cl := c.p.cache.ClassifyBytes(sql)
	for _, p := range cl.Prepares {
		if c.sqlPrepared == nil {
			c.sqlPrepared = make(map[string]*sqlclass.Class)
		}
		c.sqlPrepared[p.Name] = p.Class
	}
	return cl.Executing(func(name string) *sqlclass.Class { return c.sqlPrepared[name] })
}

// byConnection is the Class of a statement the rules in force decide by its
// connection alone (classify.Rules.MatchSQLConnection).
var byConnection = &sqlclass.Class{}

// decidedByConnection reports whether the rules in force decide every
// statement of this connection without looking at it, keeping the answer
// for as long as the rules stay the same.
func (c *conn) decidedByConnection() bool {
	rules := c.p.Rules()
	if rules != c.rulesSeen {
		c.rulesSeen = rules
		c.connRule, c.connMatched, c.connDecides = rules.MatchSQLConnection(c.statement(nil))
	}
	return c.connDecides
}

func (c *conn) statement(cl *sqlclass.Class) classify.SQLStatement {
	st := classify.SQLStatement{Database: c.database, User: c.user, ApplicationName: c.appName}
	if cl != nil {
		st.Kinds, st.Tables = cl.Kinds, cl.Tables
	}
	return st
}

// admit asks the Admitter about a statement about to be sent. It returns
// nil to forward it, or the ErrorResponse of its denial.
func (c *conn) admit(cl *sqlclass.Class) []byte {
	a := c.p.Admitter
	if a == nil || cl == nil || c.p.Rules == nil {
		return nil
	}
	var d classify.Decision
	var ok bool
	if cl == byConnection {
		d, ok = c.connRule, c.connMatched
	} else {
		d, ok = c.p.Rules().MatchSQL(c.statement(cl))
	}
	if !ok || (d.Class == "" && len(d.Charges) == 0) {
		return nil
	}
	c.mu.Lock()
	have := c.ticket != nil
	c.mu.Unlock()
	if have && len(d.Charges) == 0 {
		return nil
	}
	req := admission.Request{Charges: d.Charges}
	if !have {
		req.Class = d.Class // the transaction's slot; later statements only charge
	}
	wait := c.p.waitTimeout()
	if c.p.TaskFromApplicationName {
		if err := checkSubtask(c.appName); err != nil {
			return c.deny(d, req, &admission.Denial{Cause: admission.CauseBadRequest, Class: req.Class, Err: err}, 0)
		}
		req.Subtask = c.appName
	}
	if f, ok := a.(admission.Fast); ok {
		if t, ok := f.TryAdmit(req); ok {
			c.admitted(d, req, t, 0)
			return nil
		}
	}
	// What was already forwarded must not wait behind our wait.
	if err := c.sw.Flush(); err != nil {
		return nil // the connection is failing; the next read says so
	}
	ctx, stop := admission.WithWaitTimeout(c.ctx, wait)
	defer stop()
	notice := time.AfterFunc(WaitNoticeAfter, func() {
		c.writeClient(noticeResponse(fmt.Sprintf("governor: waiting for a %q lease (rule %q)", d.Class, d.Rule)), true)
	})
	defer notice.Stop()
	began := time.Now()
	t, err := a.Admit(ctx, req)
	waited := time.Since(began)
	if err != nil {
		return c.deny(d, req, admission.Deny(ctx, err, req.Class, wait), waited)
	}
	c.admitted(d, req, t, waited)
	return nil
}

// admitted takes on an admitted statement's ticket, counts it, and logs it
// at debug level: a database client may run thousands of transactions a
// second.
func (c *conn) admitted(d classify.Decision, req admission.Request, t admission.Ticket, waited time.Duration) {
	if t != nil {
		c.mu.Lock()
		c.ticket, c.txStart, c.overloaded = t, time.Now(), false
		c.mu.Unlock()
	}
	c.p.Metrics.admitted(&c.series, d.Rule, req.Class, waited)
	if c.p.Logger != nil && c.p.Logger.Enabled(context.Background(), slog.LevelDebug) {
		c.p.Logger.LogAttrs(context.Background(), slog.LevelDebug, "decision",
			slog.String("kind", "pgwire"), slog.String("rule", d.Rule), slog.String("class", req.Class),
			slog.String("subtask", req.Subtask), slog.String("outcome", "admitted"), slog.Duration("wait", waited),
			slog.String("database", c.database))
	}
}

// deny counts and logs a refused statement, and returns the ERROR the
// client gets.
func (c *conn) deny(d classify.Decision, req admission.Request, den *admission.Denial, waited time.Duration) []byte {
	code, f := sqlState(den)
	c.p.count(f)
	c.p.Metrics.denied(d.Rule, req.Class, den.Cause, waited)
	if c.p.Logger != nil {
		c.p.Logger.LogAttrs(context.Background(), slog.LevelInfo, "decision",
			slog.String("kind", "pgwire"), slog.String("rule", d.Rule), slog.String("class", d.Class),
			slog.String("subtask", req.Subtask), slog.String("outcome", "denied"), slog.String("cause", den.Cause.String()),
			slog.String("sqlstate", code), slog.Duration("wait", waited), slog.String("database", c.database),
			slog.String("err", den.Error()))
	}
	return errorResponse("ERROR", code, den.Message())
}

// checkSubtask applies the rules of a Proxy-Authorization username to an
// application_name used as a subtask name.
func checkSubtask(name string) error {
	switch {
	case len(name) > 255:
		return errors.New("application_name names the subtask and is longer than 255 bytes")
	case !utf8.ValidString(name) || strings.IndexByte(name, 0) >= 0:
		return errors.New("application_name names the subtask and is not valid UTF-8")
	}
	return nil
}

// denySimple answers a denied Query or FunctionCall. When the connection is
// idle with nothing in flight, the proxy answers alone: the error and
// ReadyForQuery(I). Otherwise the server must take part, so that its
// transaction is aborted and the answers stay in order: it gets
// denyStatement instead, and its error is replaced by the denial.
func (c *conn) denySimple(deny []byte) error {
	c.mu.Lock()
	quiet := len(c.queue) == 0 && c.status == TxIdle && !c.inBatch && c.ticket == nil
	if !quiet {
		c.queue = append(c.queue, &pending{deny: deny})
	}
	c.mu.Unlock()
	if quiet {
		return c.writeClient(append(deny, readyForQuery(TxIdle)...), true)
	}
	b, _ := (&pgproto3.Query{String: denyStatement}).Encode(nil)
	_, err := c.sw.Write(b)
	return err
}
