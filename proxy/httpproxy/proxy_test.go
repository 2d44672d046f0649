package httpproxy_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/governor-project/governor/classify"
	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/proxy/admission"
	"github.com/governor-project/governor/proxy/httpproxy"
)

// The HTTP side as an http.Handler, on an admitter of the test's own: no
// governord, no session, only the handler's contract with the admission
// layer.

// fakeAdmitter admits or refuses as the test says, and records what it was
// asked and what ended.
type fakeAdmitter struct {
	mu    sync.Mutex
	deny  *admission.Denial
	asked []admission.Request
	ended int
}

func (f *fakeAdmitter) Admit(_ context.Context, r admission.Request) (admission.Ticket, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, r)
	if f.deny != nil {
		return nil, f.deny
	}
	if r.Class == "" {
		return nil, nil
	}
	return ticket{f}, nil
}

type ticket struct{ f *fakeAdmitter }

func (t ticket) End(time.Duration, bool) {
	t.f.mu.Lock()
	t.f.ended++
	t.f.mu.Unlock()
}

// loopback resolves every name to 127.0.0.1.
type loopback struct{}

func (loopback) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
}

func newProxy(t *testing.T, adm admission.Admitter, rules string) *url.URL {
	t.Helper()
	rs, err := classify.Parse([]byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	// The origins are on loopback, which the proxy refuses unless allowed.
	local, err := httpproxy.ParseTarget("localhost")
	if err != nil {
		t.Fatal(err)
	}
	p := &httpproxy.Proxy{Admitter: adm, Rules: func() *classify.Rules { return rs }, Resolver: loopback{},
		Config: httpproxy.Config{WaitTimeout: time.Second, AllowTargets: local}}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	return u
}

func client(proxy *url.URL, subtask string) *http.Client {
	u := *proxy
	if subtask != "" {
		u.User = url.UserPassword(subtask, "")
	}
	return &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(&u)}, Timeout: 10 * time.Second}
}

func TestHandlerAdmitsThroughItsAdmitter(t *testing.T) {
	o := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello") }))
	defer o.Close()
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(o.URL, "http://"))
	adm := &fakeAdmitter{}
	proxy := newProxy(t, adm, "rules:\n  - {name: llm, match: {host: origin.test}, class: llm, charge: {calls: 2}}\n")
	resp, err := client(proxy, "crawl-7").Get("http://origin.test:" + port + "/v1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "hello" {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	adm.mu.Lock()
	defer adm.mu.Unlock()
	if len(adm.asked) != 1 || adm.asked[0].Subtask != "crawl-7" || adm.asked[0].Class != "llm" || adm.asked[0].Charges["calls"] != 2 {
		t.Errorf("the admitter was asked %+v", adm.asked)
	}
	if adm.ended != 1 {
		t.Errorf("%d tickets ended after the response, want 1", adm.ended)
	}
}

// Each cause renders as docs/proxy.md's table of denials says.
func TestHandlerRendersEachCause(t *testing.T) {
	for _, tc := range []struct {
		denial *admission.Denial
		status int
		header string
	}{
		{&admission.Denial{Cause: admission.CauseQuota, Quota: &governor.Denial{Resource: "calls", NodeName: "pod-7", Used: 5, Limit: 5, Amount: 1}}, 429, "quota"},
		{&admission.Denial{Cause: admission.CauseWaitTimeout, Class: "llm", Wait: time.Second}, 503, "wait-timeout"},
		{&admission.Denial{Cause: admission.CauseUnavailable}, 503, "unavailable"},
		{&admission.Denial{Cause: admission.CauseTaskEnded, Ended: &governor.TaskEndedError{NodeName: "pod-7", State: governor.NodeClosed}}, 403, "task-ended"},
		{&admission.Denial{Cause: admission.CauseStopping}, 503, "unavailable"},
		{&admission.Denial{Cause: admission.CauseBadRequest}, 400, "bad-request"},
	} {
		t.Run(tc.header, func(t *testing.T) {
			proxy := newProxy(t, &fakeAdmitter{deny: tc.denial}, "rules:\n  - {name: any, class: api}\n")
			resp, err := client(proxy, "").Get("http://origin.test/")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var body struct {
				Error struct{ Cause, Message string } `json:"error"`
			}
			json.NewDecoder(resp.Body).Decode(&body)
			if resp.StatusCode != tc.status || resp.Header.Get(httpproxy.HeaderDenied) != tc.header ||
				body.Error.Cause != tc.header || body.Error.Message != tc.denial.Message() {
				t.Errorf("%v: %d, Governor-Denied %q, body %+v; want %d and %q", tc.denial.Cause, resp.StatusCode,
					resp.Header.Get(httpproxy.HeaderDenied), body, tc.status, tc.header)
			}
		})
	}
}
