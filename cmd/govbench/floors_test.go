package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// The floors and the peers must relay what a client asks, over keep-alive,
// or the benchmark measures an error page.

func TestHTTPFloorsAndPeersForward(t *testing.T) {
	body := strings.Repeat("x", 1024)
	var served sync.Map // the origin's connections, to see keep-alive upstream too
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Store(r.RemoteAddr, true)
		w.Header().Set("X-Origin", "yes")
		io.WriteString(w, body+r.URL.Path)
	}))
	defer origin.Close()
	targets := map[string]func(t *testing.T) string{
		"nethttp":   startNetHTTPFloor,
		"fasthttp":  startFastHTTPFloor,
		"squid":     func(t *testing.T) string { return startPeerForTest(t, startSquid) },
		"tinyproxy": func(t *testing.T) string { return startPeerForTest(t, startTinyproxy) },
	}
	for name, startTarget := range targets {
		t.Run(name, func(t *testing.T) {
			proxy := startTarget(t)
			tr := &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: proxy})}
			defer tr.CloseIdleConnections()
			client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
			for i := range 3 {
				path := fmt.Sprintf("/req-%d", i)
				resp, err := client.Get(origin.URL + path)
				if err != nil {
					t.Fatal(err)
				}
				got, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil {
					t.Fatal(err)
				}
				if resp.StatusCode != 200 || string(got) != body+path || resp.Header.Get("X-Origin") != "yes" {
					t.Fatalf("through %s: %s, %d bytes, X-Origin %q; want 200, the origin's %d bytes and header",
						name, resp.Status, len(got), resp.Header.Get("X-Origin"), len(body+path))
				}
			}
		})
	}
}

func startNetHTTPFloor(t *testing.T) string {
	srv := httptest.NewServer(netHTTPFloor())
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

func startFastHTTPFloor(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := fastHTTPFloor()
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Shutdown()
		<-done
	})
	return ln.Addr().String()
}

// startPeerForTest starts a peer from Debian's packages, or skips when it
// is not installed (scripts/sidecarbench.sh installs them).
func startPeerForTest(t *testing.T, startIt func(dir string) (*proc, string, error)) string {
	dir, err := os.MkdirTemp("", "govbench-peer-")
	if err != nil {
		t.Fatal(err)
	}
	// A peer run as root drops to its own user, which must reach its folder.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	p, addr, err := startIt(dir)
	if err != nil && strings.Contains(err.Error(), "is not installed") {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.stop)
	return addr
}

// Both relay floors carry bytes both ways on many connections at once, and
// a client's close reaches upstream.
func TestRelayFloorsCarryBothWays(t *testing.T) {
	for _, core := range []string{"copy", "gnet"} {
		t.Run(core, func(t *testing.T) {
			upstream, closed := startEchoUpstream(t)
			relay := relayCopy
			if core == "gnet" {
				loop, err := newGnetRelay()
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { loop.close() })
				relay = loop.relay
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			go serveRelayOn(ln, upstream, relay)
			t.Cleanup(func() { ln.Close() })
			const conns, rounds = 8, 50
			var wg sync.WaitGroup
			errs := make(chan error, conns)
			for i := range conns {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs <- echoThrough(ln.Addr().String(), i, rounds)
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for n := 0; n < conns; n++ {
				select {
				case <-closed:
				case <-ctx.Done():
					t.Fatalf("%d of %d client closes reached upstream", n, conns)
				}
			}
		})
	}
}

// echoThrough sends rounds of lines through addr, each answered before
// the next, as a query and its result are.
func echoThrough(addr string, id, rounds int) error {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(c)
	for i := range rounds {
		line := fmt.Sprintf("conn %d round %d %s\n", id, i, strings.Repeat("y", i*100))
		if _, err := io.WriteString(c, line); err != nil {
			return err
		}
		got, err := r.ReadString('\n')
		if err != nil {
			return fmt.Errorf("conn %d round %d: %w", id, i, err)
		}
		if got != line {
			return fmt.Errorf("conn %d round %d: got %q back", id, i, got)
		}
	}
	return nil
}

// startEchoUpstream echoes every connection's bytes and signals each
// connection whose client end closed.
func startEchoUpstream(t *testing.T) (addr string, closed <-chan struct{}) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	ends := make(chan struct{}, 64)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
				ends <- struct{}{}
			}()
		}
	}()
	return ln.Addr().String(), ends
}

// topLines keeps each perf table's heading and its first rows, so that
// what -profile prints is the top of every table.
func TestTopLinesKeepsEachTablesTop(t *testing.T) {
	report := `# Samples: 10K of event 'cpu-clock'
#
# Overhead  Shared Object
# ........  .............
#
    60.00%  [kernel.kallsyms]
    39.00%  govbench
     1.00%  libc.so.6

# Overhead  Symbol
# ........  ......
    50.00%  [k] pvm_irq_enable
    10.00%  [.] runtime.futex
     5.00%  [.] runtime.usleep
`
	want := "# Overhead  Shared Object\n    60.00%  [kernel.kallsyms]\n    39.00%  govbench\n" +
		"# Overhead  Symbol\n    50.00%  [k] pvm_irq_enable\n    10.00%  [.] runtime.futex"
	if got := topLines(report, 2); got != want {
		t.Errorf("topLines:\n%s\nwant:\n%s", got, want)
	}
}

// serve-relay refuses bad flags with status 2 and a message naming the
// flag, before it changes the runtime or listens.
func TestServeRelayRefusesBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-procs", "-1"}, "-procs -1"},
		{[]string{"-procs", "1025"}, "-procs 1025"},
		{[]string{"-procs", "2147483648"}, "-procs 2147483648"},
		{[]string{"-procs", "9007199254740992"}, "-procs 9007199254740992"},
		{[]string{"-procs", "9223372036854775807"}, "-procs 9223372036854775807"},
		{[]string{"-procs", "9223372036854775808"}, "-procs"},
		{[]string{"-procs", "one"}, "-procs"},
		{[]string{"-core", "epoll"}, `-core "epoll"`},
		{nil, "-upstream is required"},
	} {
		args := tc.args
		if tc.want != "-upstream is required" {
			args = append([]string{"-upstream", "127.0.0.1:1"}, args...)
		}
		var stdout, stderr strings.Builder
		if code := serveRelay(args, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), tc.want) || stdout.Len() > 0 {
			t.Errorf("serve-relay %v: status %d, stdout %q, stderr %q; want 2, nothing, and %q", args, code, stdout.String(), stderr.String(), tc.want)
		}
	}
}
