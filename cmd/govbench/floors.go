package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"sync"

	"github.com/panjf2000/gnet/v2"
	"github.com/valyala/fasthttp"
)

// The floors of the sidecar scenario: the smallest relays each core can
// express, governing nothing, so that a reader sees what the relay itself
// costs before governance adds anything. Each runs in a process of its own
// (a hidden mode of govbench), prints its address and serves until killed.
//
//   - serve-nethttp: an HTTP forward proxy on net/http (Server, Clone,
//     Transport.RoundTrip, io.Copy): what the sidecar's HTTP side is
//     built on, without goproxy;
//   - serve-fasthttp: the same on github.com/valyala/fasthttp (its Server
//     and Client, the response read whole);
//   - serve-relay -core copy: a TCP relay with a goroutine per direction
//     and io.Copy, the model of pgwire's relay loops;
//   - serve-relay -core gnet: a TCP relay on one event loop of
//     github.com/panjf2000/gnet/v2 (epoll, one locked thread), which
//     handles every ready connection per wake-up, as pgbouncer does; with
//     -procs 1 the Go runtime has one P too, as pgbouncer has one thread.

// serveNetHTTP serves the net/http floor.
func serveNetHTTP(args []string, stdout, stderr io.Writer) int {
	if flagSet("serve-nethttp", stderr).Parse(args) != nil {
		return 2
	}
	ln, ok := listenAnnounced(stdout, stderr)
	if !ok {
		return 1
	}
	return serveUntilKilled(ln, netHTTPFloor(), stderr)
}

// netHTTPFloor is the smallest forward proxy net/http can express.
func netHTTPFloor() http.Handler {
	tr := &http.Transport{Proxy: nil, MaxIdleConns: 1024, MaxIdleConnsPerHost: 256}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		out := r.Clone(r.Context())
		out.RequestURI = "" // a client request must not carry one
		resp, err := tr.RoundTrip(out)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, resp.Body)
	})
}

// serveFastHTTP serves the fasthttp floor.
func serveFastHTTP(args []string, stdout, stderr io.Writer) int {
	if flagSet("serve-fasthttp", stderr).Parse(args) != nil {
		return 2
	}
	ln, ok := listenAnnounced(stdout, stderr)
	if !ok {
		return 1
	}
	if err := fastHTTPFloor().Serve(ln); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}

// fastHTTPFloor is the smallest forward proxy fasthttp can express. A
// request in absolute form names the origin in its URI, which fasthttp's
// Client dials and sends as Host.
func fastHTTPFloor() *fasthttp.Server {
	client := &fasthttp.Client{MaxConnsPerHost: 1024, NoDefaultUserAgentHeader: true, DisablePathNormalizing: true}
	return &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			if err := client.Do(&ctx.Request, &ctx.Response); err != nil {
				ctx.Error(err.Error(), fasthttp.StatusBadGateway)
			}
		},
		NoDefaultServerHeader: true,
		NoDefaultDate:         true,
		NoDefaultContentType:  true,
	}
}

// serveRelay serves a TCP relay floor in front of -upstream.
func serveRelay(args []string, stdout, stderr io.Writer) int {
	fs := flagSet("serve-relay", stderr)
	upstream := fs.String("upstream", "", "the address to relay to (host:port)")
	core := fs.String("core", "copy", "copy (a goroutine per direction) or gnet (one event loop)")
	procs := fs.Int("procs", 0, "GOMAXPROCS (0: Go's default, one per core)")
	if fs.Parse(args) != nil {
		return 2
	}
	if *upstream == "" {
		fmt.Fprintln(stderr, "govbench serve-relay: -upstream is required")
		return 2
	}
	if *procs < 0 || *procs > maxProcs {
		fmt.Fprintf(stderr, "govbench serve-relay: -procs %d: want 0 (Go's default) to %d\n", *procs, maxProcs)
		return 2
	}
	if *procs > 0 {
		runtime.GOMAXPROCS(*procs)
	}
	relay, err := relayFloor(*core)
	if err != nil {
		fmt.Fprintln(stderr, "govbench serve-relay:", err)
		return 2
	}
	ln, ok := listenAnnounced(stdout, stderr)
	if !ok {
		return 1
	}
	if err := serveRelayOn(ln, *upstream, relay); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}

// maxProcs bounds -procs: far above any machine this runs on, and below
// what the runtime would quietly clamp.
const maxProcs = 1024

// A relayFunc carries one accepted connection to upstream until either
// end closes.
type relayFunc func(c net.Conn, upstream string)

// relayFloor is the relay of core: copy or gnet.
func relayFloor(core string) (relayFunc, error) {
	switch core {
	case "copy":
		return relayCopy, nil
	case "gnet":
		loop, err := newGnetRelay()
		if err != nil {
			return nil, err
		}
		return loop.relay, nil
	}
	return nil, fmt.Errorf("-core %q: want copy or gnet", core)
}

// serveRelayOn relays every connection ln accepts until ln fails.
func serveRelayOn(ln net.Listener, upstream string, relay relayFunc) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go relay(c, upstream)
	}
}

// relayCopy relays c to upstream with a goroutine per direction.
func relayCopy(c net.Conn, upstream string) {
	defer c.Close()
	u, err := net.Dial("tcp", upstream)
	if err != nil {
		return
	}
	defer u.Close()
	go func() {
		io.Copy(u, c)
		u.(*net.TCPConn).CloseWrite()
	}()
	io.Copy(c, u)
}

// gnetRelay is one gnet event loop that carries every relayed connection:
// both ends of a pair live on it, so that a callback may write to the
// other end directly.
type gnetRelay struct {
	gnet.BuiltinEventEngine
	client *gnet.Client
}

// gnetPair is a relayed connection's two ends, as they open.
type gnetPair struct {
	mu         sync.Mutex // the accepting goroutine enrolls, the loop opens
	down, up   gnet.Conn
	downOpened bool
}

func newGnetRelay() (*gnetRelay, error) {
	r := &gnetRelay{}
	client, err := gnet.NewClient(r, gnet.WithMulticore(false), gnet.WithNumEventLoop(1), gnet.WithLockOSThread(true),
		gnet.WithTCPNoDelay(gnet.TCPNoDelay), gnet.WithLogger(quietLogger{}))
	if err != nil {
		return nil, fmt.Errorf("gnet: %w", err)
	}
	if err := client.Start(); err != nil {
		return nil, fmt.Errorf("gnet: %w", err)
	}
	r.client = client
	return r, nil
}

// quietLogger keeps gnet's informational lines off standard output, whose
// first line is the relay's address; warnings and errors go to standard
// error.
type quietLogger struct{}

func (quietLogger) Debugf(string, ...any)         {}
func (quietLogger) Infof(string, ...any)          {}
func (quietLogger) Warnf(format string, a ...any) { fmt.Fprintf(os.Stderr, "gnet: "+format+"\n", a...) }
func (quietLogger) Errorf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "gnet: "+format+"\n", a...)
}
func (quietLogger) Fatalf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "gnet: "+format+"\n", a...)
	os.Exit(1)
}

// close stops the loop and closes what it carries.
func (r *gnetRelay) close() error { return r.client.Stop() }

// relay dials upstream and hands both ends to the loop, upstream first, so
// that whatever the client sends finds its way out.
func (r *gnetRelay) relay(c net.Conn, upstream string) {
	u, err := net.Dial("tcp", upstream)
	if err != nil {
		c.Close()
		return
	}
	p := &gnetPair{}
	if _, err := r.client.EnrollContext(u, p); err != nil {
		c.Close()
		return
	}
	if _, err := r.client.EnrollContext(c, p); err != nil {
		p.mu.Lock()
		up := p.up
		p.mu.Unlock()
		if up != nil {
			up.Close()
		}
	}
}

func (r *gnetRelay) OnOpen(c gnet.Conn) ([]byte, gnet.Action) {
	p := c.Context().(*gnetPair)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.up == nil {
		p.up = c
		return nil, gnet.None
	}
	p.down, p.downOpened = c, true
	// What upstream said before the client end opened goes out first.
	early, _ := p.up.Next(-1)
	return early, gnet.None
}

// peer is the other end of c, nil until both have opened.
func (r *gnetRelay) peer(c gnet.Conn) gnet.Conn {
	p := c.Context().(*gnetPair)
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.downOpened {
		return nil
	}
	if c == p.up {
		return p.down
	}
	return p.up
}

func (r *gnetRelay) OnTraffic(c gnet.Conn) gnet.Action {
	peer := r.peer(c)
	if peer == nil {
		return gnet.None // left in c's buffer until the client end opens
	}
	buf, _ := c.Next(-1)
	if _, err := peer.Write(buf); err != nil {
		return gnet.Close
	}
	return gnet.None
}

func (r *gnetRelay) OnClose(c gnet.Conn, _ error) gnet.Action {
	if peer := r.peer(c); peer != nil {
		peer.Close()
	}
	return gnet.None
}
