package proxy

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/governor-project/governor/governor/engine"
)

// bytesProxy is an in-process governord and sidecar whose task has a bytes
// quota of quota, with one bytes rule for origin.test counting count.
func bytesProxy(t *testing.T, quota int64, count string) (*testProxy, *admin) {
	t.Helper()
	g := startGovernord(t, nil)
	return startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: fmt.Sprintf(`
task: {name: pod-7, quotas: {egress_bytes: %d}}
rules:
  - {name: bytes, match: {host: origin.test}, bytes: {resource: egress_bytes, count: %s}}
`, quota, count)}), newAdmin(t, g.Addr())
}

// TestBytesHostileContentLength: what a client's Content-Length can be
// when it reaches a bytes rule. Go's server refuses a negative, a
// malformed and an over-int64 one (400) before the proxy sees it; the
// proxy refuses one over the most a charge may be (2^53) as a bad request,
// and charges any other whole, so that a 5 MiB quota refuses 2^31, 2^53
// and 6 MiB with 429 quota. None reaches the origin, and nothing is
// charged for them.
func TestBytesHostileContentLength(t *testing.T) {
	o := &uploads{}
	srv := origin(t, o, false, false)
	p, a := bytesProxy(t, 5*mib, "request")
	for _, tc := range []struct {
		length string
		status int
		denied string
	}{
		{"-1", 400, ""},
		{"abc", 400, ""},
		{"9223372036854775808", 400, ""},
		{"9223372036854775807", 400, "bad-request"},
		{"9007199254740993", 400, "bad-request"},
		{"9007199254740992", 429, "quota"},
		{"2147483648", 429, "quota"},
		{"6291456", 429, "quota"},
	} {
		c := dialRaw(t, p.Addr())
		fmt.Fprintf(c, "POST %s/x HTTP/1.1\r\nHost: origin.test\r\nContent-Length: %s\r\n\r\nabc", hostURL(srv, "origin.test"), tc.length)
		// The body ends here, short of what it declared: the server's
		// discard of what the handler did not read ends at once.
		c.(*net.TCPConn).CloseWrite()
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("Content-Length %s: %v", tc.length, err)
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		c.Close()
		if resp.StatusCode != tc.status || resp.Header.Get("Governor-Denied") != tc.denied {
			t.Errorf("Content-Length %s: %s Governor-Denied %q, want %d %q\n%s", tc.length, resp.Status,
				resp.Header.Get("Governor-Denied"), tc.status, tc.denied, body)
		}
		if tc.denied == "bad-request" && !strings.Contains(string(body), "is over 9007199254740992") {
			t.Errorf("Content-Length %s: body %s, want it to say the length is over the most a charge may be", tc.length, body)
		}
	}
	if n := o.requests.Load(); n != 0 {
		t.Errorf("the origin saw %d requests", n)
	}
	p.settle()
	if used := a.node("payments", "pod-7").GetUsed()["egress_bytes"]; used != 0 {
		t.Errorf("governord counts %d bytes for requests that were all refused", used)
	}
}

// TestBytesStreamedUploadCutAtQuota: an upload of unknown length
// (chunked) past a 1 MiB quota is cut where the quota ends; the client is
// answered 429 quota, not a 502.
func TestBytesStreamedUploadCutAtQuota(t *testing.T) {
	o := &uploads{}
	srv := origin(t, o, false, false)
	p, _ := bytesProxy(t, mib, "request")
	body := io.MultiReader(strings.NewReader(strings.Repeat("y", 3*mib))) // no Len: sent chunked
	req, _ := http.NewRequest("POST", hostURL(srv, "origin.test")+"/up", body)
	resp, err := p.client("", nil).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b := readAll(t, resp)
	if resp.StatusCode != 429 || resp.Header.Get("Governor-Denied") != "quota" {
		t.Fatalf("%s %v, want 429 quota\n%s", resp.Status, resp.Header, b)
	}
	if got := p.metric(`governor_proxy_bytes_cut_total{cause="quota",resource="egress_bytes",rule="bytes"}`); got != 1 {
		t.Errorf("cuts counted: %v, want 1", got)
	}
	if n := o.bytes.Load(); n > mib {
		t.Errorf("the origin got %d bytes of the upload under a quota of %d", n, mib)
	}
	if !strings.Contains(p.logs.String(), "a transfer was cut") {
		t.Errorf("no log line of the cut:\n%s", p.logs.String())
	}
}

// TestBytesTunnelCutAtQuota: a CONNECT tunnel that is not intercepted
// carries no more than its 1 MiB quota of bytes (both ways), then closes.
func TestBytesTunnelCutAtQuota(t *testing.T) {
	srv := origin(t, download{size: 4 * mib}, true, false)
	p, a := bytesProxy(t, mib, "both")
	c, br, resp := connect(t, p.Addr(), "origin.test:"+port(srv), "")
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %s", resp.Status)
	}
	tc := tls.Client(&bufferedConn{Conn: c, r: br}, &tls.Config{RootCAs: certPool(srv), ServerName: "example.com"})
	// The origin closes after its answer, and a tunnel that is not cut
	// fails the test in waitFor rather than hanging.
	tc.SetDeadline(time.Now().Add(waitFor))
	fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: example.com\r\nConnection: close\r\n\r\n")
	n, err := io.Copy(io.Discard, tc)
	if err == nil && n >= 4*mib {
		t.Fatalf("the tunnel carried %d bytes under a quota of %d", n, mib)
	}
	if n > mib {
		t.Errorf("the client read %d bytes through a tunnel under a quota of %d", n, mib)
	}
	eventually(t, "the cut counted", func() bool {
		return p.metric(`governor_proxy_bytes_cut_total{cause="quota",resource="egress_bytes",rule="bytes"}`) == 1
	})
	p.settle()
	if used := a.node("payments", "pod-7").GetUsed()["egress_bytes"]; used > mib {
		t.Errorf("governord counts %d bytes under a quota of %d", used, mib)
	}
}

// TestBytesChunkOverTheBurstShrinks: a rule whose chunk (4 MiB) no bucket
// of the rate can ever hold (a burst of 64 KiB) is not refused: the chunk
// shrinks until it fits, and a download of unknown length goes through at
// the rate (4 MiB/s: 2 MiB in about half a second, the burst at once).
func TestBytesChunkOverTheBurstShrinks(t *testing.T) {
	g := startGovernord(t, func(c *serverConfig) {
		c.Tenants[0].Rates = map[string]engine.Rate{"egress_bytes": {Units: 4 * mib, Per: int64(time.Second), Burst: 64 << 10}}
	})
	srv := origin(t, download{size: 2 * mib, streamed: true}, false, false)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: `
rules:
  - {name: bytes, match: {host: origin.test}, bytes: {resource: egress_bytes, count: response, chunk: 4194304}}
`})
	began := time.Now()
	resp, err := p.client("", nil).Get(hostURL(srv, "origin.test") + "/")
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	took := time.Since(began)
	if err != nil || n != 2*mib || resp.StatusCode != 200 {
		t.Fatalf("status %d, %d bytes, err %v; want 200 and all 2 MiB", resp.StatusCode, n, err)
	}
	if took < 400*time.Millisecond || took > 5*time.Second {
		t.Errorf("2 MiB at 4 MiB/s (burst 64 KiB) took %v, want about 0.5 s", took)
	}
	if c := p.metric(`governor_proxy_bytes_cut_total{cause="bad-request",resource="egress_bytes",rule="bytes"}`); c != 0 {
		t.Errorf("%v cuts for a chunk over the burst", c)
	}
}
