package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A client that stalls its upload, or stops reading a streamed response, is
// cut off after body_idle_timeout and its lease comes back; a client that
// keeps moving bytes is not.
func TestStalledClientReleasesItsLease(t *testing.T) {
	g := startGovernord(t, nil)
	more := make(chan struct{})
	defer close(more)
	o := origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut {
			io.Copy(io.Discard, r.Body) // blocks while the client stalls
			return
		}
		fl := w.(http.Flusher)
		for i := 0; ; i++ { // an endless stream the client stops reading
			if _, err := fmt.Fprintf(w, "%s\n", strings.Repeat("x", 64<<10)); err != nil {
				return
			}
			fl.Flush()
			select {
			case <-more:
				return
			case <-r.Context().Done():
				return
			default:
			}
		}
	}), false, false)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: `
http: {listen: 127.0.0.1:0, allow_targets: [localhost], connect_ports: [1-65535], body_idle_timeout: 300ms}
rules:
  - {name: up, match: {host: origin.test}, class: up}
`})
	a := newAdmin(t, g.Addr())
	held := func() int64 {
		n := a.node("payments", "pod-7")
		if n == nil {
			return -1
		}
		return n.GetHeld()["up"]
	}
	target := hostURL(o, "origin.test")

	up := dialRaw(t, p.Addr())
	fmt.Fprintf(up, "PUT %s/ HTTP/1.1\r\nHost: origin.test\r\nContent-Length: 100\r\n\r\n0123456789", target)
	eventually(t, "the upload's lease held", func() bool { return held() == 1 })
	eventually(t, "the stalled upload's lease released", func() bool { return held() == 0 })

	down := dialRaw(t, p.Addr())
	fmt.Fprintf(down, "GET %s/stream HTTP/1.1\r\nHost: origin.test\r\n\r\n", target)
	eventually(t, "the stream's lease held", func() bool { return held() == 1 })
	// The client reads nothing: the proxy's writes block, then it gives up.
	eventually(t, "the stalled reader's lease released", func() bool { return held() == 0 })

	// A client that keeps its upload moving is not cut off.
	slow := dialRaw(t, p.Addr())
	fmt.Fprintf(slow, "PUT %s/ HTTP/1.1\r\nHost: origin.test\r\nContent-Length: 8\r\n\r\n", target)
	for range 8 {
		time.Sleep(100 * time.Millisecond) // slower in total than the idle timeout, never idle for it
		if _, err := io.WriteString(slow, "x"); err != nil {
			t.Fatalf("a moving upload was cut off: %v", err)
		}
	}
	resp, err := http.ReadResponse(bufio.NewReader(slow), nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("the slow upload: %v %v", resp, err)
	}
}
