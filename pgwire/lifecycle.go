package pgwire

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// How a relaying connection ends. Either side may end first: the client
// (Terminate, a close, a broken message), the server (pg_terminate_backend,
// a crash, a restart, a broken message) or the proxy (Proxy.Close, which
// ends the server's leg so that the same path runs).
//
// When the server's side ends first, the client must not hang waiting for
// an answer that will never come, nor keep a slot: the transaction's ticket
// ends at once, an admission the client waits on gives up, and the client
// gets what the server had sent, then a FATAL of the proxy's own unless the
// server's last word was one, then EOF (its connection closed for
// writing). What the client still sends is read and dropped until it
// closes its end too, is quiet for lingerQuiet, or closeGrace runs out:
// closing a socket with unread input resets it, and a reset can destroy the
// FATAL the client has not read yet.
const (
	// closeGrace bounds how long an ending connection waits on its client:
	// to take what is left to write, and to close its end.
	closeGrace = time.Second
	// lingerQuiet is how long the client may send nothing before its
	// connection is closed; a client that has read the FATAL and EOF
	// closes at once.
	lingerQuiet = 50 * time.Millisecond
)

// errCut marks a server error that came in the middle of a message the
// client has already seen the start of: no message of the proxy's may
// follow it.
var errCut = errors.New("connection cut in the middle of a message")

// errStopping: Proxy.Close ended the connection before it was relaying.
var errStopping = errors.New("governor-proxy is shutting down")

// startRelay marks the connection as relaying, unless Proxy.Close got to it
// first.
func (c *conn) startRelay() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopping {
		return false
	}
	c.relaying = true
	return true
}

// stop ends the connection for Proxy.Close. A relaying connection is ended
// by its server's leg, so that the client gets whatever the server had sent
// (a ReadyForQuery whose slot is already back, say) before its FATAL; a
// write to a client that does not read gives up after closeGrace. Any
// other connection is closed at once.
func (c *conn) stop() {
	c.mu.Lock()
	c.stopping = true
	relaying := c.relaying
	c.mu.Unlock()
	if !relaying {
		c.abort()
		return
	}
	c.client.SetWriteDeadline(time.Now().Add(closeGrace))
	c.server.Close()
}

// serverEnded runs on the server's goroutine when serverLoop returns with
// err. Unless the client ended first, it ends the transaction, tells the
// client and closes the client's connection for writing.
func (c *conn) serverEnded(err error) {
	c.mu.Lock()
	c.serverDone = true
	clientDone, stopping, saidFatal := c.clientDone, c.stopping, c.m.saidFatal
	c.mu.Unlock()
	if clientDone {
		return // serve is closing both legs
	}
	c.cancel() // an admission the client waits on gives up
	c.endTx()
	c.server.Close()
	// The client goroutine's read of a silent client ends soon; linger
	// goes on reading while the client keeps talking.
	c.client.SetReadDeadline(time.Now().Add(lingerQuiet))
	c.client.SetWriteDeadline(time.Now().Add(closeGrace))
	c.cwMu.Lock()
	if !saidFatal && !errors.Is(err, errCut) {
		code, msg := serverGone(err, stopping)
		c.cw.Write(errorResponse("FATAL", code, msg))
	}
	c.cw.Flush()
	c.cwDone = true
	c.cwMu.Unlock()
	closeWrite(c.client)
}

// serverGone is the SQLSTATE and message of the FATAL a client gets when
// its server's side ended with err without saying why.
func serverGone(err error, stopping bool) (code, msg string) {
	switch {
	case stopping:
		return "57P01", "terminating connection because governor-proxy is shutting down"
	case err == nil, errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "08006", "governor-proxy: the database server closed the connection unexpectedly"
	case errors.Is(err, ErrMessageTooLarge), errors.Is(err, ErrBadLength), errors.Is(err, errProtocol):
		return "08P01", fmt.Sprintf("governor-proxy: the database server broke the protocol: %v", err)
	}
	return "08006", fmt.Sprintf("governor-proxy: lost the connection to the database server: %v", err)
}

// clientEnded runs when clientLoop returns with err. A client that broke
// the protocol (a message over the cap, a bad length) is told why; one
// whose server ended first has been told already. Either way the client
// is given its chance to read that before serve closes the connection.
func (c *conn) clientEnded(err error) {
	c.mu.Lock()
	c.clientDone = true
	serverDone := c.serverDone
	c.mu.Unlock()
	if !serverDone {
		if !errors.Is(err, ErrMessageTooLarge) && !errors.Is(err, ErrBadLength) && !errors.Is(err, errProtocol) {
			return
		}
		c.client.SetWriteDeadline(time.Now().Add(closeGrace))
		c.cwMu.Lock()
		c.cw.Write(errorResponse("FATAL", "08P01", "governor-proxy: "+err.Error()))
		c.cw.Flush()
		c.cwDone = true
		c.cwMu.Unlock()
		closeWrite(c.client)
	}
	c.linger()
}

// linger reads and drops what the client still sends, until it closes its
// end, is quiet for lingerQuiet, or closeGrace passes.
func (c *conn) linger() {
	deadline := time.Now().Add(closeGrace)
	for {
		quiet := time.Now().Add(lingerQuiet)
		if quiet.After(deadline) {
			quiet = deadline
		}
		c.client.SetReadDeadline(quiet)
		if _, err := c.cr.Discard(max(c.cr.Buffered(), 1)); err != nil {
			return
		}
	}
}

// closeWrite closes nc for writing, so that its peer reads EOF after what
// it was sent, while what the peer still sends can be read; a connection
// that cannot half-close is closed.
func closeWrite(nc net.Conn) {
	if tc, ok := nc.(*tls.Conn); ok {
		tc.CloseWrite() // close_notify: EOF to a TLS peer
		nc = tc.NetConn()
	}
	if hc, ok := nc.(interface{ CloseWrite() error }); ok {
		hc.CloseWrite()
		return
	}
	nc.Close()
}
