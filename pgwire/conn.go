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

	// cwMu guards cw: both goroutines and the wait notice write to the
	// client. The server goroutine takes it with mu held (fromServer);
	// nothing takes mu with it held.
	cwMu   sync.Mutex
	cw     *bufio.Writer
	cwDone bool // the proxy has said its last word to the client

	database, user, appName string
	upTLS                   bool

	key   cancelKey // what the client was given
	upPID uint32    // what the server gave
	upKey []byte

	mu         sync.Mutex
	m          *machine      // the protocol's state (machine.go)
	wake       chan struct{} // the server's side's actWake, to the client's side's actAwait
	relaying   bool          // both loops run, or ran (lifecycle.go)
	stopping   bool          // Proxy.Close is ending the connection
	clientDone bool          // clientLoop has returned
	serverDone bool          // serverLoop has returned

	// resultsOn: a message of this connection has had its result charged
	// (result.go), so DataRows are counted.
	resultsOn atomic.Bool

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
	var cl textClassifier
	if c.governs() {
		cl = c.p.cache
	}
	c.m = newMachine(cl, c.p.TLSConfig != nil)
	c.wake = make(chan struct{}, 1)
	params, ok := c.startup()
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
		c.client.Write(errorResponse("FATAL", "08001", "governor-proxy: cannot reach the database server"))
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
	defer c.p.unregister(c)
	if c.login() {
		c.relay()
	}
}

// login relays the startup and authentication, and reports whether the
// client is logged in.
func (c *conn) login() bool {
	if err := c.authenticate(); err != nil {
		if errors.Is(err, ErrMessageTooLarge) {
			c.fail(FailTooLarge, err)
			c.client.Write(errorResponse("FATAL", "08P01", "governor-proxy: "+err.Error()))
			closeWrite(c.client)
			c.linger()
			return false
		}
		switch {
		case errors.Is(err, errSendStartup):
			c.fail(FailUpstream, err)
		case !errors.Is(err, errStopping):
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

var (
	errProtocol    = errors.New("protocol violation")
	errSendStartup = errors.New("send the startup to the server")
)

// startup reads the client's startup packets and carries out what the
// machine answers, until a StartupMessage, whose parameters it returns.
func (c *conn) startup() (map[string]string, bool) {
	for {
		code, payload, err := readStartup(c.client)
		if err != nil {
			if !errors.Is(err, io.EOF) {
				c.fail(FailStartup, err)
			}
			return nil, false
		}
		c.mu.Lock()
		acts := c.m.startup(code, payload)
		c.mu.Unlock()
		for _, a := range acts {
			switch a.kind {
			case actClient:
				_, err = c.client.Write(a.data)
			case actTLS:
				err = c.startTLS(a.data)
			case actCancel:
				if err := c.p.cancel(a.data); err != nil {
					c.fail(FailCancel, err)
				}
				return nil, false
			case actFail:
				c.fail(a.failure, a.err)
				c.client.Write(a.data)
				return nil, false
			case actDial:
				return a.params, true
			}
			if err != nil {
				return nil, false
			}
		}
	}
}

// startTLS answers an SSLRequest with yes and takes the client's TLS
// handshake.
func (c *conn) startTLS(yes []byte) error {
	if _, err := c.client.Write(yes); err != nil {
		return err
	}
	tc := tls.Server(c.client, c.p.TLSConfig)
	if err := tc.HandshakeContext(c.ctx); err != nil {
		c.fail(FailTLS, err)
		return err
	}
	c.client = tc
	return nil
}

// authenticate relays the login, as the machine says, until the first
// ReadyForQuery.
func (c *conn) authenticate() error {
	c.mu.Lock()
	acts := c.m.dialed(c.upTLS)
	c.mu.Unlock()
	if _, err := c.loginActs(acts, 0, nil); err != nil {
		return fmt.Errorf("%w: %w", errSendStartup, err)
	}
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
		c.mu.Lock()
		acts := c.m.server(t, body)
		c.mu.Unlock()
		if done, err := c.loginActs(acts, t, body); done || err != nil {
			return err
		}
	}
}

// loginActs carries out the machine's actions on the server's message t
// (body) during the login, and reports whether the client is logged in.
func (c *conn) loginActs(acts []action, t MsgType, body []byte) (bool, error) {
	loggedIn := false
	for _, a := range acts {
		var err error
		switch a.kind {
		case actForward:
			_, err = c.cw.Write(appendMsg(nil, t, body))
		case actClient:
			_, err = c.cw.Write(a.data)
		case actServer:
			if _, err = c.sw.Write(a.data); err == nil {
				err = c.sw.Flush()
			}
		case actReadAuth:
			err = c.relayAnswer()
		case actRegister:
			c.upPID, c.upKey = binary.BigEndian.Uint32(a.data), a.data[4:]
			c.key = c.p.register(c, c.upPID)
			b, _ := (&pgproto3.BackendKeyData{ProcessID: c.key.pid, SecretKey: binary.BigEndian.AppendUint32(nil, c.key.secret)}).Encode(nil)
			_, err = c.cw.Write(b)
		case actLoggedIn:
			// Relaying from before the client learns it is logged in, so
			// that a Proxy.Close from then on ends the connection with
			// FATAL 57P01, never in silence.
			if !c.startRelay() {
				return false, errStopping
			}
			loggedIn = true
		case actFail:
			c.cw.Flush()
			return false, a.err
		}
		if err != nil {
			return false, err
		}
	}
	if loggedIn {
		return true, c.cw.Flush()
	}
	return false, nil
}

// relayAnswer relays the client's answer to an authentication request.
// Before login, a client's message is held to the server's own cap on it,
// not to the cap after login.
func (c *conn) relayAnswer() error {
	if err := c.cw.Flush(); err != nil {
		return err
	}
	ct, cn, err := readHeader(c.cr, &c.hdr, MaxAuthMessageSize)
	if err != nil {
		return fmt.Errorf("read client's answer to authentication: %w", err)
	}
	cb, err := readBody(c.cr, nil, cn)
	if err != nil {
		return err
	}
	c.mu.Lock()
	acts := c.m.client(clientMsg{t: ct})
	c.mu.Unlock()
	for _, a := range acts {
		if a.kind == actFail {
			return a.err
		}
	}
	if _, err := c.sw.Write(appendMsg(nil, ct, cb)); err != nil {
		return err
	}
	return c.sw.Flush()
}

// writeClient writes b to the client, flushing when asked.
func (c *conn) writeClient(b []byte, flush bool) error {
	c.cwMu.Lock()
	defer c.cwMu.Unlock()
	return c.writeClientLocked(b, flush)
}

// writeClientLocked is writeClient with c.cwMu held.
func (c *conn) writeClientLocked(b []byte, flush bool) error {
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
// carries out what it says. The client's writer is taken before the
// machine is let go (duty 2): a denial the client's side answers alone,
// on what the machine knows from this message, follows what this message
// forwards.
func (c *conn) fromServer(t MsgType, hdr *[headerLen]byte, body []byte) error {
	if t == MsgReadyForQuery && len(body) != 1 {
		return fmt.Errorf("ReadyForQuery of %d bytes: %w", len(body), errProtocol)
	}
	c.mu.Lock()
	acts := c.m.server(t, body)
	c.cwMu.Lock()
	c.mu.Unlock()
	defer c.cwMu.Unlock()
	for _, a := range acts {
		var err error
		switch a.kind {
		case actEnd:
			endTickets(a)
		case actSettle:
			c.settleResults(a.results)
		case actClient:
			err = c.writeClientLocked(a.data, false)
		case actWake:
			c.wakeClient()
		case actForward:
			if t == MsgReadyForQuery {
				rfq := [headerLen + 1]byte{hdr[0], hdr[1], hdr[2], hdr[3], hdr[4], body[0]}
				err = c.writeClientLocked(rfq[:], c.sr.Buffered() == 0)
			} else {
				err = c.writeClientLocked(appendMsg(nil, t, body), false)
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// wakeClient carries out an actWake; a wake the client's side no longer
// waits for is taken by its next wait, which the machine then renews.
func (c *conn) wakeClient() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
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
	acts := c.m.server(t, body) // a forward, done by the caller
	c.mu.Unlock()
	for _, a := range acts {
		if a.kind == actWake {
			c.wakeClient()
		}
	}
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
// SQL or name prepared statements are framed and fed to the machine, the
// rest streamed (or dropped) as it says.
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
// and n bytes, in c.buf when read, and those of the machine's answers to
// the questions it ends on (actAsk, actAwait).
func (c *conn) apply(acts []action, t MsgType, n int, read bool) error {
	var wait *time.Timer // bounds the message's waits for the server, together
	defer func() {
		if wait != nil {
			wait.Stop()
		}
	}()
	for len(acts) > 0 {
		last := acts[len(acts)-1]
		for _, a := range acts {
			if err := c.act(a, t, n, read); err != nil {
				return err
			}
		}
		switch last.kind {
		case actAsk:
			acts = c.ask(last.ask)
		case actAwait:
			acts = c.await(&wait)
		default:
			return nil
		}
	}
	return nil
}

// act carries out one of apply's actions.
func (c *conn) act(a action, t MsgType, n int, read bool) error {
	switch a.kind {
	case actForward:
		if read {
			c.send(t, c.buf)
			return nil
		}
		return c.forwardRaw(t, n)
	case actDrop:
		if !read {
			_, err := c.cr.Discard(n)
			return noEOF(err)
		}
	case actServer:
		_, err := c.sw.Write(a.data)
		return err
	case actClient:
		return c.writeClient(a.data, true)
	}
	return nil
}

// ask carries out an actAsk: admission's verdict, or the machine's
// classification first when admission needs it.
func (c *conn) ask(q admitReq) []action {
	var buf [2]heldTicket
	v, ok := c.admit(q, buf[:0])
	if v.result != nil {
		c.resultsOn.Store(true)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !ok {
		return c.m.classified()
	}
	return c.m.answered(v)
}

// await carries out an actAwait: what was sent goes to the server, and
// the client's side waits for the machine's actWake, or gives up when
// wait runs out or the connection ends.
func (c *conn) await(wait **time.Timer) []action {
	gaveUp := c.sw.Flush() != nil
	if !gaveUp {
		if *wait == nil {
			*wait = time.NewTimer(c.p.waitTimeout())
		}
		select {
		case <-c.wake:
		case <-(*wait).C:
			gaveUp = true
		case <-c.ctx.Done():
			gaveUp = true
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m.resumed(gaveUp)
}

// decode reads a client's message of type t and n bytes into c.buf, and
// frames what the machine needs of it: the text, the names.
func (c *conn) decode(t MsgType, n int) (clientMsg, error) {
	msg := clientMsg{t: t}
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
		msg.byConn = c.governs() && c.decidedByConnection() && len(c.connRule.Charges) == 0
	case MsgParse:
		var rest []byte
		msg.name, rest, ok = cstring(c.buf)
		end := bytes.IndexByte(rest, 0)
		if !ok || end < 0 {
			return msg, fmt.Errorf("malformed Parse: %w", errProtocol)
		}
		msg.text = rest[:end]
	case MsgBind:
		var rest []byte
		msg.name, rest, ok = cstring(c.buf)
		stmt, _, ok2 := cstring(rest)
		if !ok || !ok2 {
			return msg, fmt.Errorf("malformed Bind: %w", errProtocol)
		}
		msg.stmt = stmt
	case MsgExecute:
		if msg.name, _, ok = cstring(c.buf); !ok {
			return msg, fmt.Errorf("malformed Execute: %w", errProtocol)
		}
	case MsgClose:
		if len(c.buf) > 1 {
			msg.kind = c.buf[0]
			msg.name, _, _ = cstring(c.buf[1:])
		}
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
