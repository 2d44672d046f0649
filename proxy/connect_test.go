package proxy

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/websocket"

	"github.com/governor-project/governor/proxy/httpproxy"
)

func TestConnectTunnelHoldsLeaseUntilItCloses(t *testing.T) {
	g := startGovernord(t, nil)
	o := origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, r.Proto)
	}), true, true)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: fmt.Sprintf(`
task: {name: pod-7, quotas: {tunnels: 2}}
rules:
  - {name: tunnel, match: {host: example.com, port: %s}, class: tunnel, charge: {tunnels: 1}}
`, port(o))})
	a := newAdmin(t, g.Addr())
	held := func() int64 { return a.node("payments", "pod-7").GetHeld()["tunnel"] }

	conn, br, resp := connect(t, p.Addr(), "example.com:"+port(o), "crawl-3")
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %s", resp.Status)
	}
	if held() != 1 {
		t.Fatalf("held while the tunnel is open: %d, want 1", held())
	}
	// The tunnel carries TLS, and HTTP/2 inside it, end to end.
	tc := tls.Client(&bufferedConn{Conn: conn, r: br}, &tls.Config{RootCAs: certPool(o), ServerName: "example.com", NextProtos: []string{"http/1.1"}})
	req, _ := http.NewRequest(http.MethodGet, "https://example.com/", nil)
	if err := req.Write(tc); err != nil {
		t.Fatal(err)
	}
	tresp, err := http.ReadResponse(bufioReader(tc), req)
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, tresp); body != "HTTP/1.1" {
		t.Errorf("through the tunnel: %q", body)
	}
	// Long after the CONNECT request is done, the lease is still held.
	if held() != 1 {
		t.Fatalf("held after a request through the tunnel: %d, want 1", held())
	}
	conn.Close()
	eventually(t, "the tunnel's lease to be released when it closes", func() bool { return held() == 0 })

	// A Go client over the tunnel, with HTTP/2.
	c := p.client("crawl-3", certPool(o))
	gresp, err := c.Get(hostURL(o, "example.com") + "/")
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, gresp); body != "HTTP/2.0" {
		t.Errorf("HTTP/2 through the tunnel: %q", body)
	}
	c.Transport.(*http.Transport).CloseIdleConnections()
	eventually(t, "the second tunnel's lease to be released", func() bool { return held() == 0 })

	// The quota of two tunnels is spent: the reason is in the status line.
	_, _, resp = connect(t, p.Addr(), "example.com:"+port(o), "crawl-3")
	if resp.StatusCode != 429 || resp.Status != `429 Governor quota spent: tunnels on "pod-7"` ||
		resp.Header.Get(httpproxy.HeaderDenied) != "quota" || resp.Header.Get("X-Should-Retry") != "false" {
		t.Errorf("third CONNECT: %q %v", resp.Status, resp.Header)
	}
	if body := readAll(t, resp); !strings.Contains(body, `"largest_consumer":{"node":"crawl-3"`) {
		t.Errorf("third CONNECT body: %s", body)
	}
}

func TestTunnelIdleTimeout(t *testing.T) {
	g := startGovernord(t, nil)
	o := origin(t, http.HandlerFunc(hello), false, false)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: `
http: {listen: 127.0.0.1:0, allow_targets: [localhost], connect_ports: [1-65535], tunnel_idle_timeout: 300ms}
rules:
  - {name: tunnel, match: {host: origin.test}, class: tunnel}
`})
	a := newAdmin(t, g.Addr())
	conn, br, resp := connect(t, p.Addr(), "origin.test:"+port(o), "")
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %s", resp.Status)
	}
	// Busy for longer than the idle timeout: requests every 100ms keep it
	// open.
	began := time.Now()
	for time.Since(began) < 600*time.Millisecond {
		req, _ := http.NewRequest(http.MethodGet, "http://origin.test/", nil)
		if err := req.Write(conn); err != nil {
			t.Fatalf("a busy tunnel closed after %v: %v", time.Since(began), err)
		}
		r, err := http.ReadResponse(br, req)
		if err != nil {
			t.Fatalf("a busy tunnel closed after %v: %v", time.Since(began), err)
		}
		readAll(t, r)
		time.Sleep(100 * time.Millisecond)
	}
	// Then idle: the proxy closes it.
	conn.SetReadDeadline(time.Now().Add(waitFor))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Errorf("an idle tunnel: read %v, want EOF", err)
	}
	eventually(t, "the idle tunnel's lease to be released", func() bool { return a.node("payments", "pod-7").GetHeld()["tunnel"] == 0 })
}

func TestWebsocketThroughTheProxy(t *testing.T) {
	g := startGovernord(t, nil)
	o := origin(t, websocket.Handler(func(ws *websocket.Conn) { io.Copy(ws, ws) }), false, false)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: `
rules:
  - {name: ws, match: {host: origin.test, path: /ws}, class: ws}
`})
	a := newAdmin(t, g.Addr())
	held := func() int64 { return a.node("payments", "pod-7").GetHeld()["ws"] }
	hostport := "origin.test:" + port(o)
	// A websocket client sends ws:// through an HTTP proxy in absolute
	// form: GET http://origin.test:port/ws with Upgrade: websocket.
	cfg, err := websocket.NewConfig("ws://"+hostport+"/ws", "http://origin.test/")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Location = &url.URL{Scheme: "http", Opaque: "//" + hostport + "/ws", Host: hostport}
	conn := dialRaw(t, p.Addr())
	ws, err := websocket.NewClient(cfg, conn)
	if err != nil {
		t.Fatalf("handshake through the proxy: %v", err)
	}
	for _, msg := range []string{"ping", "pong"} {
		if err := websocket.Message.Send(ws, msg); err != nil {
			t.Fatal(err)
		}
		var got string
		if err := websocket.Message.Receive(ws, &got); err != nil || got != msg {
			t.Fatalf("echo %q: %q %v", msg, got, err)
		}
	}
	if held() != 1 {
		t.Errorf("held while the websocket is open: %d", held())
	}
	ws.Close()
	eventually(t, "the websocket's lease to be released", func() bool { return held() == 0 })
}

// TestTwoSidecarsShareOneLimit runs 20 slow requests through two sidecars
// of one tenant whose class limit is 2, and counts at the upstream.
func TestTwoSidecarsShareOneLimit(t *testing.T) {
	g := startGovernord(t, func(c *serverConfig) { c.Tenants[0].Limits = map[string]int64{"slow": 2} })
	var inflight, most atomic.Int64
	o := origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inflight.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(20 * time.Millisecond) // a slow upstream
		inflight.Add(-1)
		hello(w, r)
	}), false, false)
	rules := `
rules:
  - {name: slow, match: {host: origin.test}, class: slow}
`
	pa := startProxy(t, proxyOpts{gaddr: g.Addr(), task: "pod-a", yaml: rules})
	pb := startProxy(t, proxyOpts{gaddr: g.Addr(), task: "pod-b", yaml: rules})
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := range 20 {
		c := pa.client(fmt.Sprint("w", i), nil)
		if i%2 == 1 {
			c = pb.client(fmt.Sprint("w", i), nil)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := c.Get(hostURL(o, "origin.test") + "/")
			if err != nil {
				errs <- err
				return
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				errs <- fmt.Errorf("status %d", resp.StatusCode)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if most.Load() > 2 {
		t.Errorf("the upstream saw %d requests at once, over the tenant's limit of 2", most.Load())
	}
	if most.Load() < 2 {
		t.Logf("the upstream never saw 2 at once (%d); the limit held, but the run was not concurrent", most.Load())
	}
}

// TestConnectClientLeavingTheQueueIsNotCharged: a client that gives up
// while its CONNECT waits for a lease is withdrawn from governord's queue;
// it is neither charged nor granted the lease the first tunnel frees.
func TestConnectClientLeavingTheQueueIsNotCharged(t *testing.T) {
	g := startGovernord(t, nil)
	o := origin(t, http.HandlerFunc(hello), false, false)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: `
task: {name: pod-7, limits: {tunnel: 1}}
rules:
  - {name: tunnel, match: {host: origin.test}, class: tunnel, charge: {tunnels: 1}}
`})
	a := newAdmin(t, g.Addr())
	held := func() int64 { return a.node("payments", "pod-7").GetHeld()["tunnel"] }
	used := func() int64 { p.settle(); return a.node("payments", "pod-7").GetUsed()["tunnels"] }
	target := "origin.test:" + port(o)

	first, _, resp := connect(t, p.Addr(), target, "")
	if resp.StatusCode != 200 {
		t.Fatalf("first CONNECT: %s", resp.Status)
	}
	// A second client queues for the only slot, then hangs up.
	second := dialRaw(t, p.Addr())
	fmt.Fprintf(second, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	eventually(t, "the second CONNECT to queue at governord", func() bool { return a.waiters("payments", "pod-7") == 1 })
	second.Close()
	canceled := `governor_proxy_requests_total{outcome="canceled",rule="tunnel"}`
	eventually(t, "the departed CONNECT to be counted as canceled", func() bool { return p.metric(canceled) == 1 })
	// Out of governord's queue, it can be granted nothing.
	eventually(t, "the departed CONNECT to leave governord's queue", func() bool { return a.waiters("payments", "pod-7") == 0 })
	// The first tunnel ends: its slot must not go to the client that left.
	first.Close()
	eventually(t, "no tunnel lease held", func() bool { return held() == 0 })
	if h, u := held(), used(); h != 0 || u != 1 {
		t.Errorf("after both clients left: held %d, tunnels used %d; want 0 and 1 (the departed waiter charged or granted)", h, u)
	}
}

// TestTunnelIdleAfterUpstreamHalfCloses: the upstream says "bye" and
// half-closes; the client keeps its side open and says nothing. The tunnel
// is idle both ways, so the proxy closes it, upstream and client, and
// releases its lease.
func TestTunnelIdleAfterUpstreamHalfCloses(t *testing.T) {
	g := startGovernord(t, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	upstreamDone := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			upstreamDone <- err
			return
		}
		defer c.Close()
		io.WriteString(c, "bye")
		c.(*net.TCPConn).CloseWrite()
		c.SetReadDeadline(time.Now().Add(waitFor))
		_, err = io.Copy(io.Discard, c) // until the proxy closes its side
		upstreamDone <- err
	}()
	_, lport, _ := net.SplitHostPort(ln.Addr().String())
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: `
http: {listen: 127.0.0.1:0, allow_targets: [localhost], connect_ports: [1-65535], tunnel_idle_timeout: 300ms}
rules:
  - {name: tunnel, match: {host: origin.test}, class: tunnel}
`})
	a := newAdmin(t, g.Addr())
	held := func() int64 { return a.node("payments", "pod-7").GetHeld()["tunnel"] }
	conn, br, resp := connect(t, p.Addr(), "origin.test:"+lport, "")
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %s", resp.Status)
	}
	conn.SetReadDeadline(time.Now().Add(waitFor))
	got, err := io.ReadAll(br) // "bye", then the upstream's half-close
	if string(got) != "bye" || err != nil {
		t.Fatalf("through the tunnel: %q %v", got, err)
	}
	// The client keeps its side open and stays quiet.
	const bound = 3 * time.Second
	began := time.Now()
	for held() != 0 {
		if time.Since(began) > bound {
			t.Fatalf("the tunnel's lease is still held %v after the upstream half-closed (tunnel_idle_timeout 300ms)", bound)
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case err := <-upstreamDone:
		if err != nil {
			t.Errorf("the upstream's side: %v, want EOF when the proxy closes it", err)
		}
	case <-time.After(bound):
		t.Fatalf("the proxy did not close the upstream connection of an idle tunnel")
	}
	// The client's connection is closed too: writes fail once the proxy's
	// reset arrives.
	closed := false
	for deadline := time.Now().Add(bound); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		conn.SetWriteDeadline(time.Now().Add(time.Second))
		if _, err := conn.Write([]byte("x")); err != nil {
			closed = true
			break
		}
	}
	if !closed {
		t.Errorf("the client's connection of an idle tunnel stayed open")
	}
}
