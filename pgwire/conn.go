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

	mu sync.Mutex
	m  *machine // the protocol's state (machine.go)
	// capNoticed: the transaction has had its NOTICE of a cap near or over
	// (notice.go).
	capNoticed bool
	answered   chan struct{} // closed when the server owes nothing more; see settle
	relaying   bool          // both loops run, or ran (lifecycle.go)
	stopping   bool          // Proxy.Close is ending the connection
	clientDone bool          // clientLoop has returned
	serverDone bool          // serverLoop has returned

	srvFatal bool // the server's last ErrorResponse was FATAL or PANIC; the server goroutine's own

	// resultsOn: a message of this connection has had its result charged
	// (result.go), so DataRows are counted; nextResult is the charge of
	// the message just admitted, the client goroutine's own until the
	// machine takes it.
	resultsOn  atomic.Bool
	nextResult *resultCharge

	// The client goroutine's own state.
	rulesSeen   *classify.Rules   // the rules connRule was decided under
	connRule    classify.Decision // what they decide by the connection alone,
	connMatched bool              // whether a rule matched that way,
	connDecides bool              // and whether that decides every statement
	series      *ruleSeries       // the metrics last counted into
	planBuf     plan              // admit's, reused
	hdr         [headerLen]byte
	buf         []byte
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
	c.m = newMachine(c.governs())
	defer c.p.unregister(c)
	if c.login(params, minor) {
		c.relay()
	}
}

// login relays the startup and authentication, and reports whether the
// client is logged in.
func (c *conn) login(params map[string]string, minor uint16) bool {
	if minor != 0 {
		// We speak 3.0 upstream; tell the client so, as a server would.
		b, _ := (&pgproto3.NegotiateProtocolVersion{NewestMinorProtocol: 0}).Encode(nil)
		c.cw.Write(b)
	}
	if err := c.sendStartup(params); err != nil {
		c.fail(FailUpstream, err)
		return false
	}
	if err := c.authenticate(); err != nil {
		if errors.Is(err, ErrMessageTooLarge) {
			c.fail(FailTooLarge, err)
			c.writeFatalNow("08P01", "governor-proxy: "+err.Error())
			closeWrite(c.client)
			c.linger()
			return false
		}
		if !errors.Is(err, errStopping) {
			c.fail(FailAuth, err)
		}
		return false
	}
	c.client.SetReadDeadline(time.Time{})
	c.mu.Lock()
	if !c.stopping { // stop's write deadline (closeGrace) stays
		c.client.SetWriteDeadline(time.Time{})
	}
	c.mu.Unlock()
	c.server.SetDeadline(time.Time{})
	return true
}

// relay runs both directions at once until both have ended.
func (c *conn) relay() {
	done := make(chan error, 1)
	go func() {
		err := c.serverLoop()
		c.serverEnded(err)
		done <- err
	}()
	err := c.clientLoop()
	c.clientEnded(err)
	c.abort()
	serr := <-done
	c.endTx()
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
				if err := c.relayAnswer(code); err != nil {
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
			c.mu.Lock()
			c.m.status = body[0]
			c.mu.Unlock()
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
				c.mu.Lock()
				c.m.noteParameter(body)
				c.mu.Unlock()
			}
			c.cw.Write(appendMsg(nil, t, body))
		}
	}
}

// relayAnswer relays the client's answer to an authentication request.
// Before login, a client's message is held to the server's own cap on it,
// not to the cap after login.
func (c *conn) relayAnswer(code uint32) error {
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
	_, err = c.server.Write(appendMsg(nil, ct, cb))
	return err
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

// serverLoop relays the server's messages to the client. The machine reads
// ReadyForQuery and ErrorResponse, and peeks at what confirms prepared
// statements and reports settings; everything else is streamed.
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
		case MsgReadyForQuery, MsgErrorResponse:
			if body, err = readBody(c.sr, body, n); err != nil {
				return err
			}
			if err := c.fromServer(t, &hdr, body); err != nil {
				return err
			}
			body = shrink(body)
			continue
		case MsgParameterStatus, MsgParseComplete, MsgCloseComplete, MsgCommandComplete:
			c.peekServer(t, n)
		case MsgDataRow:
			if c.resultsOn.Load() {
				c.countRow(n)
			}
		}
		if err := c.streamServer(&hdr, n); err != nil {
			return err
		}
	}
}

// fromServer feeds the machine a ReadyForQuery or ErrorResponse and
// carries out what it says.
func (c *conn) fromServer(t MsgType, hdr *[headerLen]byte, body []byte) error {
	if t == MsgReadyForQuery && len(body) != 1 {
		return fmt.Errorf("ReadyForQuery of %d bytes: %w", len(body), errProtocol)
	}
	if t == MsgErrorResponse {
		c.srvFatal = fatal(body)
	}
	c.mu.Lock()
	acts := c.m.server(t, body)
	if c.m.idle() && c.answered != nil {
		close(c.answered)
		c.answered = nil
	}
	c.mu.Unlock()
	for _, a := range acts {
		var err error
		switch a.kind {
		case actEnd:
			endTickets(a)
		case actSettle:
			c.settleResults(a.results)
		case actClient:
			err = c.writeClient(a.data, false)
		case actForward:
			if t == MsgReadyForQuery {
				rfq := [headerLen + 1]byte{hdr[0], hdr[1], hdr[2], hdr[3], hdr[4], body[0]}
				err = c.writeClient(rfq[:], c.sr.Buffered() == 0)
			} else {
				err = c.writeClient(appendMsg(nil, t, body), false)
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// peekServer feeds the machine a message it reads without taking it off
// the stream: its body is small, and still buffered when streamed.
func (c *conn) peekServer(t MsgType, n int) {
	var body []byte
	if n > 0 && n <= c.sr.Size() {
		if b, err := c.sr.Peek(n); err == nil {
			body = b
		}
	}
	c.mu.Lock()
	c.m.server(t, body) // a forward, done by the caller
	c.mu.Unlock()
}

// streamServer streams a server's message to the client.
func (c *conn) streamServer(hdr *[headerLen]byte, n int) error {
	c.cwMu.Lock()
	defer c.cwMu.Unlock()
	if c.cwDone {
		return net.ErrClosed
	}
	if _, err := c.cw.Write(hdr[:]); err != nil {
		return err
	}
	if err := relay(c.cw, c.sr, n); err != nil {
		return fmt.Errorf("%w: %w", errCut, err)
	}
	return nil
}

// endTx ends the transaction's leases, whatever its state: the connection
// is ending.
func (c *conn) endTx() {
	c.mu.Lock()
	acts := c.m.ended()
	c.mu.Unlock()
	for _, a := range acts {
		if a.kind == actSettle {
			c.settleResults(a.results)
			continue
		}
		endTickets(a)
	}
}

// endTickets carries out an actEnd.
func endTickets(a action) {
	now := time.Now()
	for _, h := range a.end {
		h.t.End(now.Sub(h.since), a.overloaded)
	}
}

// clientLoop relays the client's messages to the server: the ones that run
// SQL or name prepared statements are decoded, classified and fed to the
// machine, the rest streamed (or dropped) as it says.
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
		msg, read := clientMsg{t: t}, false
		if decoded(t) && !c.dropping(t) {
			if msg, err = c.decode(t, n); err != nil {
				return err
			}
			read = true
		}
		c.mu.Lock()
		acts := c.m.client(msg)
		c.mu.Unlock()
		if err := c.apply(acts, t, n, read); err != nil {
			return err
		}
		if t == MsgTerminate {
			c.sw.Flush()
			return nil
		}
	}
}

// decoded reports the client's messages the proxy reads into memory.
func decoded(t MsgType) bool {
	switch t {
	case MsgQuery, MsgFunctionCall, MsgParse, MsgBind, MsgExecute, MsgClose, MsgSync:
		return true
	}
	return false
}

func (c *conn) dropping(t MsgType) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m.drops(t)
}

// apply carries out the machine's actions on a client's message of type t
// and n bytes, in c.buf when read.
func (c *conn) apply(acts []action, t MsgType, n int, read bool) error {
	for _, a := range acts {
		var err error
		switch a.kind {
		case actForward:
			if read {
				c.send(t, c.buf)
			} else {
				err = c.forwardRaw(t, n)
			}
		case actDrop:
			if !read {
				_, err = c.cr.Discard(n)
				err = noEOF(err)
			}
		case actServer:
			_, err = c.sw.Write(a.data)
		case actClient:
			err = c.writeClient(a.data, true)
		case actAsk:
			var buf [2]heldTicket
			deny, grants := c.admit(a.ask, buf[:0])
			c.mu.Lock()
			c.m.nextResult, c.nextResult = c.nextResult, nil
			next := c.m.answered(deny, grants)
			c.mu.Unlock()
			return c.apply(next, t, n, read)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// decode reads a client's message of type t and n bytes into c.buf, and
// what it runs or names.
func (c *conn) decode(t MsgType, n int) (clientMsg, error) {
	msg := clientMsg{t: t, settled: true}
	if err := c.readBody(n); err != nil {
		return msg, err
	}
	var ok bool
	switch t {
	case MsgQuery:
		end := bytes.IndexByte(c.buf, 0)
		if end < 0 {
			return msg, fmt.Errorf("query without terminator: %w", errProtocol)
		}
		msg.text = c.buf[:end]
		msg.cl = c.classifyQuery(msg.text)
		msg.run, msg.changes = c.toRun(msg.cl)
	case MsgFunctionCall:
		if c.governs() {
			msg.cl, msg.run = functionCallClass, functionCallClass.Statements
		}
	case MsgParse:
		var rest []byte
		msg.name, rest, ok = cstring(c.buf)
		end := bytes.IndexByte(rest, 0)
		if !ok || end < 0 {
			return msg, fmt.Errorf("malformed Parse: %w", errProtocol)
		}
		if msg.cl = c.classifyParse(rest[:end]); msg.cl != nil {
			msg.settled = c.settled(msg.name)
		}
	case MsgBind:
		return c.decodeBind(msg)
	case MsgExecute:
		if msg.name, _, ok = cstring(c.buf); !ok {
			return msg, fmt.Errorf("malformed Execute: %w", errProtocol)
		}
		if c.governs() {
			c.mu.Lock()
			msg.cl = c.m.portal(msg.name)
			c.mu.Unlock()
		}
		msg.run, msg.changes = c.toRun(msg.cl)
	case MsgClose:
		if len(c.buf) > 1 && c.governs() {
			msg.kind = c.buf[0]
			msg.name, _, _ = cstring(c.buf[1:])
			msg.settled = msg.kind != 'S' || c.settled(msg.name)
		}
	}
	return msg, nil
}

func (c *conn) decodeBind(msg clientMsg) (clientMsg, error) {
	portal, rest, ok := cstring(c.buf)
	stmt, _, ok2 := cstring(rest)
	if !ok || !ok2 {
		return msg, fmt.Errorf("malformed Bind: %w", errProtocol)
	}
	msg.name, msg.stmt = portal, stmt
	if c.governs() {
		msg.settled = c.settled(stmt)
	}
	return msg, nil
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
