package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/proxy/httpproxy"
)

func hello(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain")
	io.WriteString(w, "hello")
}

func TestForwardChargesHoldsAndReleases(t *testing.T) {
	g := startGovernord(t, nil)
	var inside atomic.Int64
	var a *admin
	o := origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inside.Store(a.node("payments", "pod-7").GetHeld()["api"])
		hello(w, r)
	}), false, false)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: `
rules:
  - {name: api, match: {host: origin.test, path: /v1/}, class: api, charge: {api_calls: 1}}
`})
	a = newAdmin(t, g.Addr())
	resp, err := p.client("crawl-42", nil).Get(hostURL(o, "origin.test") + "/v1/x")
	if err != nil {
		t.Fatal(err)
	}
	if resp.ContentLength != 5 || resp.Header.Get("Content-Length") != "5" {
		t.Errorf("Content-Length %d %q, want 5: the proxy must keep it", resp.ContentLength, resp.Header.Get("Content-Length"))
	}
	if body := readAll(t, resp); resp.StatusCode != 200 || body != "hello" {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	if inside.Load() != 1 {
		t.Errorf("held api leases while the origin served: %d, want 1", inside.Load())
	}
	p.settle()
	sub := a.node("payments", "pod-7", "crawl-42")
	if sub == nil || sub.GetUsed()["api_calls"] != 1 {
		t.Fatalf("subtask crawl-42: %v, want api_calls used 1", sub)
	}
	eventually(t, "the lease to be released", func() bool { return a.node("payments", "pod-7").GetHeld()["api"] == 0 })
	if got := p.metric(`governor_proxy_requests_total{outcome="forwarded",rule="api"}`); got != 1 {
		t.Errorf("requests forwarded by rule api: %v", got)
	}
	// HEAD keeps the upstream's Content-Length, with no body.
	head, err := p.client("crawl-42", nil).Head(hostURL(o, "origin.test") + "/v1/x")
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, head); head.ContentLength != 5 || body != "" {
		t.Errorf("HEAD: Content-Length %d, body %q; want 5 and none", head.ContentLength, body)
	}
	// A keep-alive connection carries the next request too.
	resp, err = p.client("crawl-42", nil).Get(hostURL(o, "origin.test") + "/other")
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if got := p.metric(`governor_proxy_requests_total{outcome="forwarded",rule="(unmatched)"}`); got != 1 {
		t.Errorf("unmatched requests forwarded: %v, want 1 (http.unmatched defaults to forward)", got)
	}
	if !strings.Contains(p.logs.String(), `msg=decision kind=http rule=api class=api subtask=crawl-42 outcome=admitted`) {
		t.Errorf("no decision line in the log:\n%s", p.logs.String())
	}
}

// deniedBody is the JSON of a denial.
type deniedBody struct {
	Error struct {
		Type            string `json:"type"`
		Cause           string `json:"cause"`
		Message         string `json:"message"`
		Cap             string `json:"cap"`
		Node            string `json:"node"`
		Used            *int64 `json:"used"`
		Limit           *int64 `json:"limit"`
		Requested       int64  `json:"requested"`
		LargestConsumer *struct {
			Node string `json:"node"`
			Used int64  `json:"used"`
		} `json:"largest_consumer"`
	} `json:"error"`
}

func TestQuotaOfFiveAllowsFive(t *testing.T) {
	g := startGovernord(t, nil)
	var served atomic.Int64
	o := origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		w.Header().Set("Governor-Denied", "quota") // a spoof; the proxy strips it
		hello(w, r)
	}), false, false)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: `
task: {name: pod-7, quotas: {llm_calls: 5}}
rules:
  - {name: llm, match: {host: origin.test, method: POST, path: /v1/}, class: llm, charge: {llm_calls: 1}}
`})
	c := p.client("crawl-42", nil)
	for i := 1; i <= 6; i++ {
		resp, err := c.Post(hostURL(o, "origin.test")+"/v1/chat/completions", "application/json", strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		body := readAll(t, resp)
		if i <= 5 {
			if resp.StatusCode != 200 || resp.Header.Get(httpproxy.HeaderDenied) != "" {
				t.Fatalf("request %d: %d %v %q", i, resp.StatusCode, resp.Header, body)
			}
			continue
		}
		if resp.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("request 6: %d %q, want 429", resp.StatusCode, body)
		}
		for h, want := range map[string]string{httpproxy.HeaderDenied: "quota", "X-Should-Retry": "false", "Content-Type": "application/json"} {
			if got := resp.Header.Get(h); got != want {
				t.Errorf("%s: %q, want %q", h, got, want)
			}
		}
		var d deniedBody
		if err := json.Unmarshal([]byte(body), &d); err != nil {
			t.Fatalf("body %q: %v", body, err)
		}
		e := d.Error
		if e.Type != "governor_denied" || e.Cause != "quota" || e.Cap != "llm_calls" || e.Node != "pod-7" ||
			e.Used == nil || *e.Used != 5 || e.Limit == nil || *e.Limit != 5 || e.Requested != 1 ||
			e.LargestConsumer == nil || e.LargestConsumer.Node != "crawl-42" || e.LargestConsumer.Used != 5 {
			t.Errorf("denial body %s", body)
		}
		if !strings.Contains(e.Message, `llm_calls on "pod-7" is 5 of 5`) {
			t.Errorf("message %q", e.Message)
		}
	}
	if served.Load() != 5 {
		t.Errorf("the origin served %d requests, want exactly 5", served.Load())
	}
	if got := p.metric(`governor_proxy_denials_total{cause="quota"}`); got != 1 {
		t.Errorf("quota denials counted: %v", got)
	}
}

func TestUpstreamCannotSpoofGovernorDenied(t *testing.T) {
	g := startGovernord(t, nil)
	o := origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "Governor-Denied")
		w.Header().Set("Governor-Denied", "quota")
		w.Header().Set("Retry-After", "3")
		w.WriteHeader(http.StatusTooManyRequests)
		io.WriteString(w, "slow down")
		w.Header().Set("Governor-Denied", "task-ended")
	}), false, false)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: `
rules:
  - {name: api, match: {host: origin.test}, class: api}
`})
	resp, err := p.client("", nil).Get(hostURL(o, "origin.test") + "/")
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp)
	if resp.StatusCode != 429 || body != "slow down" || resp.Header.Get("Retry-After") != "3" {
		t.Fatalf("the upstream's own 429 must pass through: %d %q %v", resp.StatusCode, body, resp.Header)
	}
	if v := resp.Header.Values(httpproxy.HeaderDenied); len(v) != 0 {
		t.Errorf("Governor-Denied from the upstream reached the client: %q", v)
	}
	if v := resp.Trailer.Values(httpproxy.HeaderDenied); len(v) != 0 {
		t.Errorf("Governor-Denied trailer from the upstream reached the client: %q", v)
	}
}

func TestUpstreamErrorsAre502And504(t *testing.T) {
	g := startGovernord(t, nil)
	gate := make(chan struct{})
	slow := origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-gate:
		case <-r.Context().Done():
		}
	}), false, false)
	t.Cleanup(func() { close(gate) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedPort := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: `
http: {listen: 127.0.0.1:0, allow_targets: [localhost], connect_ports: [1-65535], response_header_timeout: 200ms}
rules:
  - {name: any, class: api}
`})
	a := newAdmin(t, g.Addr())
	c := p.client("", nil)
	for _, tc := range []struct {
		url  string
		code int
	}{
		{fmt.Sprintf("http://origin.test:%d/", closedPort), http.StatusBadGateway},
		{"http://no-such-host.test/", http.StatusBadGateway},
		{hostURL(slow, "origin.test") + "/", http.StatusGatewayTimeout},
	} {
		resp, err := c.Get(tc.url)
		if err != nil {
			t.Fatal(err)
		}
		body := readAll(t, resp)
		if resp.StatusCode != tc.code || resp.Header.Get(httpproxy.HeaderDenied) != "" {
			t.Errorf("%s: %d %q, want %d without Governor-Denied", tc.url, resp.StatusCode, body, tc.code)
		}
	}
	eventually(t, "the leases of failed requests to be released", func() bool { return a.node("payments", "pod-7").GetHeld()["api"] == 0 })
	if got := p.metric(`governor_proxy_requests_total{outcome="upstream_timeout",rule="any"}`); got != 1 {
		t.Errorf("upstream timeouts counted: %v", got)
	}
	// CONNECT to a closed port: the status line says so.
	_, _, resp := connect(t, p.Addr(), fmt.Sprintf("origin.test:%d", closedPort), "")
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("CONNECT to a closed port: %s", resp.Status)
	}
}

func TestLinkLocalAndMetadataRefused(t *testing.T) {
	g := startGovernord(t, nil)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: `
rules:
  - {name: any, class: api, charge: {calls: 1}}
`})
	a := newAdmin(t, g.Addr())
	c := p.client("", nil)
	for _, u := range []string{"http://169.254.169.254/latest/meta-data/", "http://metadata.test/",
		"http://[fd00:ec2::254]/", "http://metadata6.test/", "http://mapped-meta.test/", "http://[fe80::1]:8080/"} {
		resp, err := c.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		body := readAll(t, resp)
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "link-local") {
			t.Errorf("%s: %d %q, want 403", u, resp.StatusCode, body)
		}
	}
	// An address literal is refused before anything is charged.
	p.settle()
	if used := a.node("payments", "pod-7").GetUsed()["calls"]; used != 3 {
		t.Errorf("calls charged: %d, want 3 (only the three names, which are refused when dialed)", used)
	}
	for _, target := range []string{"169.254.169.254:443", "metadata.test:443"} {
		_, _, resp := connect(t, p.Addr(), target, "")
		if resp.StatusCode != http.StatusForbidden || resp.Status != "403 Forbidden link-local destination" {
			t.Errorf("CONNECT %s: %q", target, resp.Status)
		}
	}
}

func TestNeverProxiesToItself(t *testing.T) {
	// The sidecar inherits the worker's environment: proxies it must not
	// use. If it read them, every request would go to a closed port.
	for _, v := range []string{"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"} {
		t.Setenv(v, "http://127.0.0.1:9")
	}
	t.Setenv("NO_PROXY", "")
	g := startGovernord(t, nil)
	o := origin(t, http.HandlerFunc(hello), false, false)
	tlsO := origin(t, http.HandlerFunc(hello), true, false)
	p := startProxy(t, proxyOpts{gaddr: g.Addr()})
	for _, v := range []string{"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"} {
		t.Setenv(v, "http://"+p.Addr()) // pointing at itself
	}
	c := p.client("", certPool(tlsO))
	for _, u := range []string{hostURL(o, "origin.test") + "/", hostURL(tlsO, "example.com") + "/"} {
		resp, err := c.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		if body := readAll(t, resp); resp.StatusCode != 200 || body != "hello" {
			t.Errorf("%s with HTTP(S)_PROXY set: %d %q", u, resp.StatusCode, body)
		}
	}
	_, pport, _ := net.SplitHostPort(p.Addr())
	_, mport, _ := net.SplitHostPort(p.MetricsAddr())
	for _, u := range []string{"http://" + p.Addr() + "/", "http://localhost:" + pport + "/x",
		"http://0.0.0.0:" + pport + "/", "http://localhost:" + mport + "/metrics"} {
		resp, err := c.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		body := readAll(t, resp)
		if resp.StatusCode != http.StatusLoopDetected || !strings.Contains(body, "itself") {
			t.Errorf("%s: %d %q, want 508", u, resp.StatusCode, body)
		}
	}
	_, _, resp := connect(t, p.Addr(), "localhost:"+pport, "")
	if resp.StatusCode != http.StatusLoopDetected {
		t.Errorf("CONNECT to itself: %s", resp.Status)
	}
}

func TestStreamingArrivesIncrementally(t *testing.T) {
	g := startGovernord(t, nil)
	next := make(chan struct{})
	stream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ct := "text/event-stream"
		first, second := "data: one\n\n", "data: two\n\n"
		if strings.HasSuffix(r.URL.Path, "ndjson") {
			ct, first, second = "application/x-ndjson", `{"n":1}`+"\n", `{"n":2}`+"\n"
		}
		w.Header().Set("Content-Type", ct)
		io.WriteString(w, first)
		w.(http.Flusher).Flush()
		select { // the client must have seen the first piece before the second is written
		case <-next:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, second)
	})
	plain := origin(t, stream, false, false)
	h2 := origin(t, stream, true, true)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), tls: certPool(h2), yaml: fmt.Sprintf(`
routes:
  - {prefix: /h2/, upstream: "%s"}
rules:
  - {name: stream, class: llm, charge: {calls: 1}}
`, hostURL(h2, "example.com"))})
	a := newAdmin(t, g.Addr())
	held := func() int64 { return a.node("payments", "pod-7").GetHeld()["llm"] }
	c := p.client("", nil)
	for i, u := range []string{hostURL(plain, "origin.test") + "/sse", hostURL(plain, "origin.test") + "/ndjson",
		"http://" + p.Addr() + "/h2/sse", "http://" + p.Addr() + "/h2/ndjson"} {
		t.Run(u, func(t *testing.T) {
			// A routed URL is got both directly (origin form) and through
			// the proxy (absolute form naming the proxy itself).
			client := c
			if i == 3 {
				client = noProxyClient
			}
			resp, err := client.Get(u)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			line, err := br.ReadString('\n')
			if err != nil || !(strings.Contains(line, "one") || strings.Contains(line, `"n":1`)) {
				t.Fatalf("first piece %q %v", line, err)
			}
			// The headers and the first piece are out, the origin has not
			// finished: the lease is held while the body streams.
			if h := held(); h != 1 {
				t.Errorf("held while the body streams: %d, want 1", h)
			}
			next <- struct{}{}
			rest, _ := io.ReadAll(br)
			if !(strings.Contains(string(rest), "two") || strings.Contains(string(rest), `"n":2`)) {
				t.Fatalf("rest %q", rest)
			}
			eventually(t, "the lease to be released at the end of the body", func() bool { return held() == 0 })
		})
	}
}

func TestLargeBodiesStreamBothWays(t *testing.T) {
	g := startGovernord(t, nil)
	const size = 16 << 20
	blob := bytes.Repeat([]byte("governor"), size/8)
	sum := sha256.Sum256(blob)
	o := origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/upload":
			h := sha256.New()
			n, _ := io.Copy(h, r.Body)
			fmt.Fprintf(w, "%d %x", n, h.Sum(nil))
		case "/download":
			w.Header().Set("Content-Length", fmt.Sprint(size))
			w.Write(blob)
		case "/chunked":
			for i := 0; i < size; i += 1 << 20 {
				w.Write(blob[i : i+1<<20])
				w.(http.Flusher).Flush()
			}
		}
	}), false, false)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: `
rules:
  - {name: bulk, class: bulk}
`})
	a := newAdmin(t, g.Addr())
	c := p.client("", nil)
	resp, err := c.Post(hostURL(o, "origin.test")+"/upload", "application/octet-stream", io.NopCloser(bytes.NewReader(blob)))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := readAll(t, resp), fmt.Sprintf("%d %x", size, sum); got != want {
		t.Errorf("upload: origin saw %q, want %q", got, want)
	}
	for _, path := range []string{"/download", "/chunked"} {
		resp, err := c.Get(hostURL(o, "origin.test") + path)
		if err != nil {
			t.Fatal(err)
		}
		if path == "/download" && resp.ContentLength != size {
			t.Errorf("download Content-Length %d, want %d", resp.ContentLength, size)
		}
		if got := sha256.Sum256([]byte(readAll(t, resp))); got != sum {
			t.Errorf("%s: the body changed on the way", path)
		}
	}
	eventually(t, "leases released", func() bool { return a.node("payments", "pod-7").GetHeld()["bulk"] == 0 })
}

func TestExpectContinue(t *testing.T) {
	g := startGovernord(t, nil)
	o := origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, n)
	}), false, false)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: `
task: {name: pod-7, quotas: {uploads: 1}}
rules:
  - {name: upload, match: {method: PUT}, charge: {uploads: 1}}
`})
	tr := &http.Transport{Proxy: http.ProxyURL(p.url("")), ExpectContinueTimeout: waitFor}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	for i, want := range []int{200, 429} {
		var read atomic.Bool
		body := &readFlag{r: bytes.NewReader(make([]byte, 1<<20)), read: &read}
		req, _ := http.NewRequest(http.MethodPut, hostURL(o, "origin.test")+"/", body)
		req.ContentLength = 1 << 20
		req.Header.Set("Expect", "100-continue")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got := readAll(t, resp)
		if resp.StatusCode != want {
			t.Fatalf("upload %d: %d %q, want %d", i, resp.StatusCode, got, want)
		}
		if want == 200 && got != fmt.Sprint(1<<20) {
			t.Errorf("origin read %s bytes", got)
		}
		if want == 429 && read.Load() {
			t.Errorf("the client sent the body of a denied request: the proxy must answer before 100 Continue")
		}
	}
}

type readFlag struct {
	r    io.Reader
	read *atomic.Bool
}

func (f *readFlag) Read(p []byte) (int, error) { f.read.Store(true); return f.r.Read(p) }

func TestWaitTimeout(t *testing.T) {
	g := startGovernord(t, nil)
	arrived, gate := make(chan struct{}, 1), make(chan struct{})
	o := origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-gate
		hello(w, r)
	}), false, false)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: `
task: {name: pod-7, limits: {slow: 1}}
http: {listen: 127.0.0.1:0, allow_targets: [localhost], connect_ports: [1-65535], wait_timeout: 200ms}
rules:
  - {name: slow, match: {host: origin.test}, class: slow}
`})
	c := p.client("", nil)
	first := make(chan error, 1)
	go func() {
		resp, err := c.Get(hostURL(o, "origin.test") + "/")
		if err == nil {
			readAll(t, resp)
		}
		first <- err
	}()
	<-arrived // the first request holds the only slot
	resp, err := c.Get(hostURL(o, "origin.test") + "/")
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp)
	if resp.StatusCode != 503 || resp.Header.Get(httpproxy.HeaderDenied) != "wait-timeout" || resp.Header.Get("Retry-After") == "" {
		t.Errorf("second request: %d %v %q", resp.StatusCode, resp.Header, body)
	}
	_, _, cresp := connect(t, p.Addr(), "origin.test:"+port(o), "")
	if cresp.Status != "503 Governor wait timeout: no slow lease within 200ms" || cresp.Header.Get(httpproxy.HeaderDenied) != "wait-timeout" {
		t.Errorf("CONNECT: %q %v", cresp.Status, cresp.Header)
	}
	close(gate)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
}

func TestTaskEnded(t *testing.T) {
	g := startGovernord(t, nil)
	o := origin(t, http.HandlerFunc(hello), false, false)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: `
rules:
  - {name: any, class: api}
`})
	a := newAdmin(t, g.Addr())
	task := a.node("payments", "pod-7")
	if _, err := a.c.Raw().CloseNode(context.Background(), &governorpb.CloseNodeRequest{NodeId: task.GetId()}); err != nil {
		t.Fatal(err)
	}
	resp, err := p.client("crawl-1", nil).Get(hostURL(o, "origin.test") + "/")
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp)
	if resp.StatusCode != 403 || resp.Header.Get(httpproxy.HeaderDenied) != "task-ended" || !strings.Contains(body, `"pod-7"`) {
		t.Errorf("after the task closed: %d %v %q", resp.StatusCode, resp.Header, body)
	}
	_, _, cresp := connect(t, p.Addr(), "origin.test:"+port(o), "")
	if cresp.Status != `403 Governor task ended: "pod-7" closed` {
		t.Errorf("CONNECT: %q", cresp.Status)
	}
}

func TestChargeFromHeader(t *testing.T) {
	g := startGovernord(t, nil)
	o := origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Usage-Tokens", strings.TrimPrefix(r.URL.Path, "/"))
		hello(w, r)
	}), false, false)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: `
rules:
  - {name: llm, match: {host: origin.test}, class: llm, charge_from_header: {resource: tokens, header: x-usage-tokens}}
`})
	a := newAdmin(t, g.Addr())
	c := p.client("crawl-9", nil)
	for _, path := range []string{"/7", "/lots", "/5"} {
		resp, err := c.Get(hostURL(o, "origin.test") + path)
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
	}
	eventually(t, "12 tokens charged", func() bool {
		n := a.node("payments", "pod-7", "crawl-9")
		return n != nil && n.GetUsed()["tokens"] == 12
	})
	if got := p.metric(`governor_proxy_header_charges_total{outcome="not_a_number",rule="llm"}`); got != 1 {
		t.Errorf("non-numeric header counted %v times, want 1", got)
	}
}

// A budget charged from a response header is enforced through its upfront
// charge: the header settles the rest, a settlement that would pass the cap
// charges up to the cap, and the next request is refused.
func TestChargeFromHeaderBudgetIsEnforced(t *testing.T) {
	g := startGovernord(t, nil)
	o := origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Usage-Tokens", "6")
		hello(w, r)
	}), false, false)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: `
task: {name: pod-7, quotas: {tokens: 10}}
rules:
  - {name: llm, match: {host: origin.test}, class: llm, charge: {tokens: 1}, charge_from_header: {resource: tokens, header: x-usage-tokens}}
`})
	a := newAdmin(t, g.Addr())
	c := p.client("", nil)
	get := func() int {
		resp, err := c.Get(hostURL(o, "origin.test") + "/")
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
		return resp.StatusCode
	}
	used := func() int64 {
		n := a.node("payments", "pod-7")
		if n == nil {
			return -1
		}
		return n.GetUsed()["tokens"]
	}
	if code := get(); code != 200 {
		t.Fatalf("first request: %d", code)
	}
	eventually(t, "6 tokens used (1 upfront + 5 settled)", func() bool { return used() == 6 })
	if code := get(); code != 200 {
		t.Fatalf("second request: %d", code)
	}
	eventually(t, "the budget spent to its cap of 10", func() bool { return used() == 10 })
	if code := get(); code != 429 {
		t.Fatalf("a request after the header budget was spent got %d, want 429", code)
	}
}

func TestUnmatchedDenyAndBadProxyAuthorization(t *testing.T) {
	g := startGovernord(t, nil)
	o := origin(t, http.HandlerFunc(hello), false, false)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: `
http: {listen: 127.0.0.1:0, allow_targets: [localhost], connect_ports: [1-65535], unmatched: deny}
rules:
  - {name: known, match: {path: /known}}
`})
	c := p.client("", nil)
	resp, err := c.Get(hostURL(o, "origin.test") + "/other")
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if resp.StatusCode != 403 || resp.Header.Get(httpproxy.HeaderDenied) != "unmatched" {
		t.Errorf("unmatched with deny: %d %v", resp.StatusCode, resp.Header)
	}
	// A rule with neither class nor charge forwards without asking governord.
	resp, err = c.Get(hostURL(o, "origin.test") + "/known")
	if err != nil {
		t.Fatal(err)
	}
	if readAll(t, resp); resp.StatusCode != 200 {
		t.Errorf("known: %d", resp.StatusCode)
	}
	// Proxy-Authorization is read only to charge a subtask: a Bearer one
	// (inherited by the worker, say) does not stop ungoverned traffic.
	if bresp, body := rawGet(t, p.Addr(), hostURL(o, "origin.test")+"/known", "Bearer abc"); bresp.StatusCode != 200 {
		t.Errorf("Bearer Proxy-Authorization, ungoverned rule: %d %q, want 200", bresp.StatusCode, body)
	}
	if bresp, _ := rawGet(t, p.Addr(), hostURL(o, "origin.test")+"/other", "Bearer abc"); bresp.StatusCode != 403 ||
		bresp.Header.Get(httpproxy.HeaderDenied) != "unmatched" {
		t.Errorf("Bearer Proxy-Authorization, unmatched with deny: %d %v, want 403 unmatched", bresp.StatusCode, bresp.Header)
	}
}

// rawGet sends a GET in absolute form to the proxy by hand, with
// proxyAuth as Proxy-Authorization (none if ""): http.Transport sets that
// header only from the proxy URL, as Basic.
func rawGet(t testing.TB, proxyAddr, target, proxyAuth string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, target, nil)
	conn := dialRaw(t, proxyAddr)
	fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n", target, req.URL.Host)
	if proxyAuth != "" {
		fmt.Fprintf(conn, "Proxy-Authorization: %s\r\n", proxyAuth)
	}
	io.WriteString(conn, "\r\n")
	conn.SetReadDeadline(time.Now().Add(waitFor))
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		t.Fatal(err)
	}
	return resp, readAll(t, resp)
}

// TestProxyAuthorizationOnlyForGovernedTraffic: a Proxy-Authorization that
// does not name a subtask is a 400 only when a governed rule needs the
// subtask; otherwise it is ignored, and never forwarded upstream.
func TestProxyAuthorizationOnlyForGovernedTraffic(t *testing.T) {
	g := startGovernord(t, nil)
	var seen atomic.Value
	o := origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Store(r.Header.Get("Proxy-Authorization"))
		hello(w, r)
	}), false, false)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: `
rules:
  - {name: api, match: {host: origin.test, path: /governed}, class: api, charge: {calls: 1}}
`})
	a := newAdmin(t, g.Addr())
	// Unmatched (http.unmatched: forward): forwarded, the header stripped.
	resp, body := rawGet(t, p.Addr(), hostURL(o, "origin.test")+"/free", "Bearer sk-inherited")
	if resp.StatusCode != 200 || body != "hello" {
		t.Errorf("Bearer on ungoverned traffic: %d %q, want 200", resp.StatusCode, body)
	}
	if v, _ := seen.Load().(string); v != "" {
		t.Errorf("the upstream saw Proxy-Authorization %q", v)
	}
	// CONNECT, ungoverned: the tunnel opens.
	conn := dialRaw(t, p.Addr())
	target := "origin.test:" + port(o)
	fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Bearer sk-inherited\r\n\r\n", target, target)
	conn.SetReadDeadline(time.Now().Add(waitFor))
	cresp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatal(err)
	}
	if cresp.StatusCode != 200 {
		t.Errorf("Bearer on an ungoverned CONNECT: %s, want 200", cresp.Status)
	}
	// Governed: the subtask is needed, and Bearer names none.
	resp, body = rawGet(t, p.Addr(), hostURL(o, "origin.test")+"/governed", "Bearer sk-inherited")
	if resp.StatusCode != 400 || !strings.Contains(body, "Basic") || resp.Header.Get(httpproxy.HeaderDenied) != "bad-request" {
		t.Errorf("Bearer on governed traffic: %d %v %q, want 400 naming Basic, with Governor-Denied: bad-request", resp.StatusCode, resp.Header, body)
	}
	var d deniedBody
	if err := json.Unmarshal([]byte(body), &d); err != nil || d.Error.Type != "governor_denied" || d.Error.Cause != "bad-request" {
		t.Errorf("400 body: %q (%v), want type governor_denied, cause bad-request", body, err)
	}
	p.settle()
	if used := a.node("payments", "pod-7").GetUsed()["calls"]; used != 0 {
		t.Errorf("calls charged: %d, want 0", used)
	}
	// Basic still names the subtask.
	resp, _ = rawGet(t, p.Addr(), hostURL(o, "origin.test")+"/governed", "Basic "+basic("crawl-5"))
	p.settle()
	if sub := a.node("payments", "pod-7", "crawl-5"); resp.StatusCode != 200 || sub == nil || sub.GetUsed()["calls"] != 1 {
		t.Errorf("Basic crawl-5: %d, subtask %v", resp.StatusCode, sub)
	}
	if v, _ := seen.Load().(string); v != "" {
		t.Errorf("the upstream saw Proxy-Authorization %q", v)
	}
}

func TestSubtaskNameRejectsControlCharacters(t *testing.T) {
	g := startGovernord(t, nil)
	var served atomic.Int64
	o := origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		hello(w, r)
	}), false, false)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: `
rules:
  - {name: api, match: {host: origin.test}, class: api, charge: {calls: 1}}
`})
	for _, name := range []string{"crawl\x01", "a\tb", "line\nbreak", "esc\x1b[31m", "del\x7f", "nel\u0085", "csi\u009b"} {
		resp, body := rawGet(t, p.Addr(), hostURL(o, "origin.test")+"/", "Basic "+basic(name))
		if resp.StatusCode != 400 || resp.Header.Get(httpproxy.HeaderDenied) != "bad-request" || !strings.Contains(body, "control") {
			t.Errorf("subtask %q: %d %v %q, want 400 naming the control character", name, resp.StatusCode, resp.Header, body)
		}
	}
	if n := served.Load(); n != 0 {
		t.Errorf("the origin served %d requests with bad subtask names", n)
	}
	// Letters of any script are fine.
	resp, body := rawGet(t, p.Addr(), hostURL(o, "origin.test")+"/", "Basic "+basic("crawl-ß-東京"))
	if resp.StatusCode != 200 {
		t.Errorf("subtask crawl-ß-東京: %d %q", resp.StatusCode, body)
	}
}

// TestLocalhostToItselfRefusedBeforeCharging: localhost, or a name that
// resolves to the proxy, is refused (508) before anything is charged.
func TestLocalhostToItselfRefusedBeforeCharging(t *testing.T) {
	g := startGovernord(t, nil)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: `
rules:
  - {name: any, class: api, charge: {calls: 1}}
`})
	a := newAdmin(t, g.Addr())
	_, pport, _ := net.SplitHostPort(p.Addr())
	_, mport, _ := net.SplitHostPort(p.MetricsAddr())
	for _, target := range []string{"localhost:" + pport, "LocalHost.:" + pport, "localhost:" + mport, "nowhere.test:" + pport} {
		_, _, resp := connect(t, p.Addr(), target, "")
		if resp.StatusCode != http.StatusLoopDetected {
			t.Errorf("CONNECT %s: %s, want 508", target, resp.Status)
		}
	}
	resp, body := rawGet(t, p.Addr(), "http://localhost:"+mport+"/metrics", "")
	if resp.StatusCode != http.StatusLoopDetected {
		t.Errorf("GET localhost:%s: %d %q, want 508", mport, resp.StatusCode, body)
	}
	p.settle()
	if used := a.node("payments", "pod-7").GetUsed()["calls"]; used != 0 {
		t.Errorf("calls charged for requests to the proxy itself: %d, want 0", used)
	}
}

func TestRoutesOriginateTLSAndApplyPathRules(t *testing.T) {
	g := startGovernord(t, nil)
	o := origin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s %s %s", r.Proto, r.Host, r.URL.Path, r.URL.RawQuery)
	}), true, true)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), tls: certPool(o), yaml: fmt.Sprintf(`
routes:
  - {prefix: /openai/, upstream: "%s/base"}
rules:
  - {name: chat, match: {host: example.com, scheme: https, path: /base/v1/*/completions}, class: llm, charge: {llm_calls: 1}}
`, hostURL(o, "example.com"))})
	a := newAdmin(t, g.Addr())
	resp, err := noProxyClient.Get("http://" + p.Addr() + "/openai/v1/chat/completions?stream=true")
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp)
	want := fmt.Sprintf("HTTP/2.0 example.com:%s /base/v1/chat/completions stream=true", port(o))
	if resp.StatusCode != 200 || body != want {
		t.Fatalf("routed: %d %q, want %q", resp.StatusCode, body, want)
	}
	p.settle()
	if used := a.node("payments", "pod-7").GetUsed()["llm_calls"]; used != 1 {
		t.Errorf("the path rule charged %d, want 1", used)
	}
	resp, err = noProxyClient.Get("http://" + p.Addr() + "/nope")
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, resp); resp.StatusCode != 404 || !strings.Contains(body, "/openai/") {
		t.Errorf("origin-form outside the routes: %d %q", resp.StatusCode, body)
	}
}

// With delegation off, governord's absence denies new work at once. With
// it on (the default), the sidecar goes on granting from the slots it holds
// until its local deadline (80% of the TTL after its last good heartbeat),
// then denies: both fail closed.
func TestGovernordStopFailsClosed(t *testing.T) {
	for _, delegation := range []bool{false, true} {
		t.Run(fmt.Sprintf("delegation=%v", delegation), func(t *testing.T) { testGovernordStopFailsClosed(t, delegation) })
	}
}

func testGovernordStopFailsClosed(t *testing.T, delegation bool) {
	g := startGovernord(t, nil)
	o := origin(t, http.HandlerFunc(hello), false, false)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: fmt.Sprintf(`
delegation: {enabled: %v}
rules:
  - {name: api, match: {path: /governed}, class: api}
`, delegation), opts: func(o *Options) {
		o.GovernorOptions = []governor.Option{governor.WithTTL(500 * time.Millisecond)}
	}})
	c := p.client("", nil)
	get := func(path string) *http.Response {
		resp, err := c.Get(hostURL(o, "origin.test") + path)
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
		return resp
	}
	if r := get("/governed"); r.StatusCode != 200 {
		t.Fatalf("before the stop: %d", r.StatusCode)
	}
	stopped := time.Now()
	g.Close()
	if delegation {
		eventually(t, "the local deadline to pass", func() bool { return get("/governed").StatusCode == 503 })
		if d := time.Since(stopped); d > 2*time.Second {
			t.Errorf("still admitting %v after governord stopped, with a TTL of 500ms", d)
		}
	}
	r := get("/governed")
	if r.StatusCode != 503 || r.Header.Get(httpproxy.HeaderDenied) != "unavailable" || r.Header.Get("Retry-After") == "" {
		t.Errorf("with governord stopped: %d %v", r.StatusCode, r.Header)
	}
	_, _, cresp := connect(t, p.Addr(), "origin.test:"+port(o), "")
	if cresp.StatusCode != http.StatusOK {
		// Tunnels are unmatched here (rule api needs a path), so they go on.
		t.Errorf("ungoverned CONNECT with governord stopped: %s", cresp.Status)
	}
	if r := get("/ungoverned"); r.StatusCode != 200 {
		t.Errorf("unmatched traffic is forwarded ungoverned: %d", r.StatusCode)
	}
}

func TestHeaderBounds(t *testing.T) {
	g := startGovernord(t, nil)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: `
http: {listen: 127.0.0.1:0, allow_targets: [localhost], connect_ports: [1-65535], read_header_timeout: 200ms, max_header_bytes: 4096}
`})
	// A client that never finishes its headers is cut off.
	slow := dialRaw(t, p.Addr())
	io.WriteString(slow, "GET http://origin.test/ HTTP/1.1\r\nHost: origin.test\r\n")
	slow.SetReadDeadline(time.Now().Add(waitFor))
	if _, err := io.ReadAll(slow); err != nil {
		t.Errorf("a client stuck in its headers: %v, want the proxy to close the connection", err)
	}
	// Too large a header block: 431.
	big := dialRaw(t, p.Addr())
	fmt.Fprintf(big, "GET http://origin.test/ HTTP/1.1\r\nHost: origin.test\r\nX-Big: %s\r\n\r\n", strings.Repeat("a", 64<<10))
	resp, err := http.ReadResponse(bufio.NewReader(big), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("a 64 KiB header: %d, want 431", resp.StatusCode)
	}
}
