package httpproxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// idleExchange bounds how long a plain HTTP exchange may go without a byte
// moving between the proxy and its client. Each read of the request body
// and each write of the response counts as progress; a watchdog closes the
// client's connection when there has been none for idle, which ends the
// exchange and gives its lease back. It uses no connection deadlines, which
// net/http's own reads and writes would trip over. CONNECT tunnels have their
// own watchdog (connect.go).
type idleExchange struct {
	http.ResponseWriter
	client net.Conn
	idle   time.Duration
	last   atomic.Int64 // unix nanoseconds of the last progress
	mu     sync.Mutex
	timer  *time.Timer
	ended  bool
	lazy   bool // the watchdog starts with the response
}

func newIdleExchange(w http.ResponseWriter, r *http.Request, idle time.Duration) *idleExchange {
	x := &idleExchange{ResponseWriter: w, idle: idle}
	x.client, _ = r.Context().Value(clientConnKey{}).(net.Conn)
	x.touch()
	if x.client == nil {
		return x
	}
	// net/http decides whether a 100-continue request's connection can be
	// reused by looking at the request's own body type, and drains the body
	// (asking the client for it) when it cannot tell. So such a body is not
	// wrapped, and its exchange is watched from the first byte of the
	// response on; any other body counts its reads as progress.
	if strings.EqualFold(r.Header.Get("Expect"), "100-continue") {
		x.lazy = true
		return x
	}
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = &idleBody{ReadCloser: r.Body, x: x}
	}
	x.timer = time.AfterFunc(idle, x.check)
	return x
}

func (x *idleExchange) touch() { x.last.Store(time.Now().UnixNano()) }

// check closes the client's connection if nothing moved for idle, and
// otherwise waits for the rest of the period.
func (x *idleExchange) check() {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.ended {
		return
	}
	if left := time.Until(time.Unix(0, x.last.Load()).Add(x.idle)); left > 0 {
		x.timer.Reset(left)
		return
	}
	x.ended = true
	x.client.Close()
}

func (x *idleExchange) Write(p []byte) (int, error) {
	x.touch()
	x.arm()
	n, err := x.ResponseWriter.Write(p)
	x.touch()
	return n, err
}

// copyBuffers lends ReadFrom its buffers.
var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// ReadFrom copies a response body through Write with a pooled buffer. The
// wrapper hides the underlying writer's own ReadFrom, and without this
// io.Copy (which goproxy copies every response with) would allocate and
// clear 32 KiB for every response.
func (x *idleExchange) ReadFrom(src io.Reader) (int64, error) {
	b := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(b)
	return io.CopyBuffer(writerOnly{x}, src, *b)
}

// writerOnly hides ReadFrom, so that io.CopyBuffer uses the buffer given.
type writerOnly struct{ io.Writer }

// arm starts a lazy watchdog.
func (x *idleExchange) arm() {
	if !x.lazy {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.timer == nil && !x.ended {
		x.timer = time.AfterFunc(x.idle, x.check)
	}
}

// Flush keeps streamed responses streaming through the wrapper.
func (x *idleExchange) Flush() {
	x.touch()
	x.arm()
	http.NewResponseController(x.ResponseWriter).Flush()
}

// Hijack hands the connection over (an upgrade); the watchdog stops, since
// the upgraded connection is relayed and closed elsewhere.
func (x *idleExchange) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	h, ok := x.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("the connection cannot be taken over")
	}
	x.done()
	return h.Hijack()
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (x *idleExchange) Unwrap() http.ResponseWriter { return x.ResponseWriter }

// done stops the watchdog.
func (x *idleExchange) done() {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.ended = true
	if x.timer != nil {
		x.timer.Stop()
	}
}

type idleBody struct {
	io.ReadCloser
	x *idleExchange
}

func (b *idleBody) Read(p []byte) (int, error) {
	b.x.touch()
	n, err := b.ReadCloser.Read(p)
	b.x.touch()
	return n, err
}
