package httpproxy_test

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/governor-project/governor/classify"
	"github.com/governor-project/governor/proxy/httpproxy"
	"github.com/governor-project/governor/proxy/intercept"
)

// interceptingProxy is a proxy intercepting example.com and 127.0.0.1,
// served until the test ends; panics in its handler are recorded rather
// than recovered out of sight by net/http.
func interceptingProxy(t testing.TB) (addr string, panics func() []any) {
	t.Helper()
	certPEM, keyPEM, err := intercept.NewCA(intercept.CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ca, err := intercept.ParseCA(certPEM, keyPEM, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	hosts, _ := intercept.ParseHosts([]string{"example.com", "127.0.0.1"})
	rs, _ := classify.Parse([]byte("rules:\n  - {name: any, match: {host: example.com}, class: api}\n"))
	local, _ := httpproxy.ParseTarget("localhost")
	p := &httpproxy.Proxy{Admitter: &fakeAdmitter{}, Rules: func() *classify.Rules { return rs }, Resolver: loopback{},
		Intercept: &intercept.Interceptor{Hosts: hosts, Minter: intercept.NewMinter(ca)},
		Config:    httpproxy.Config{WaitTimeout: time.Second, AllowTargets: local, ReadHeaderTimeout: 200 * time.Millisecond}}
	var mu sync.Mutex
	var seen []any
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil && v != http.ErrAbortHandler {
				mu.Lock()
				seen = append(seen, v)
				mu.Unlock()
			}
		}()
		p.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String(), func() []any {
		mu.Lock()
		defer mu.Unlock()
		return append([]any(nil), seen...)
	}
}

// clientHello is what a TLS client first sends for serverName.
func clientHello(serverName string, protos ...string) []byte {
	a, b := net.Pipe()
	defer a.Close()
	go tls.Client(a, &tls.Config{ServerName: serverName, NextProtos: protos}).Handshake()
	buf := make([]byte, 4096)
	b.SetReadDeadline(time.Now().Add(time.Second))
	n, _ := b.Read(buf)
	b.Close()
	return buf[:n]
}

// FuzzInterceptConnect sends a CONNECT to any host, followed by any bytes
// (a ClientHello, part of one, cleartext, nothing), and half-closes: the
// proxy answers the CONNECT with a status, ends the connection within its
// handshake bound, and never panics.
func FuzzInterceptConnect(f *testing.F) {
	hello := clientHello("example.com", "h2", "http/1.1")
	for _, s := range []struct {
		target string
		after  []byte
	}{
		{"example.com:443", hello},
		{"example.com:443", hello[:len(hello)/2]},
		{"example.com:443", clientHello("other.example")},
		{"127.0.0.1:8443", clientHello("")},
		{"[::1]:443", hello},
		{"example.com", hello},
		{"example.com:443", []byte("GET / HTTP/1.1\r\nHost: example.com\r\n\r\n")},
		{"example.com:443", []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")},
		{"example.com:443", nil},
		{"example.com:99999", hello},
		{"example.com.:443", hello},
		{"EXAMPLE.COM:443", hello},
		{"exa mple.com:443", hello},
		{"example.com:0", hello},
	} {
		f.Add(s.target, s.after)
	}
	addr, panics := interceptingProxy(f)
	f.Fuzz(func(t *testing.T, target string, after []byte) {
		if strings.ContainsAny(target, "\r\n") {
			return // not one request line
		}
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
		c.Write(after)
		c.(*net.TCPConn).CloseWrite()
		br := bufio.NewReader(c)
		if resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect}); err == nil && resp.StatusCode == 200 {
			// A handshake follows, which the bytes sent may or may not
			// complete; either way the connection must end.
			if _, err := io.Copy(io.Discard, br); err != nil && !isReset(err) {
				t.Fatalf("CONNECT %q: the connection did not end: %v", target, err)
			}
		}
		if p := panics(); len(p) > 0 {
			t.Fatalf("CONNECT %q then %q: the proxy panicked: %v", target, after, p)
		}
	})
}

func isReset(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "connection reset") || bytes.Contains([]byte(err.Error()), []byte("broken pipe")))
}
