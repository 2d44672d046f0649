package proxy

import (
	"fmt"
	"strings"
	"testing"

	"github.com/governor-project/governor/proxy/meter/fakellm"
)

// A request body over a metered rule's max_body is refused, unless the
// rule lets it through unmetered; a body that is not JSON is refused; a
// metered rule refuses a CONNECT tunnel, which hides the body.
func TestMeteredGuards(t *testing.T) {
	srv := startGovernord(t, nil)
	fake := &fakellm.Provider{}
	up := origin(t, fake, true, false)
	p := startProxy(t, proxyOpts{gaddr: srv.Addr(), tls: certPool(up), yaml: fmt.Sprintf(`
task: {name: pod-7, quotas: {tokens: 100000}}
routes:
  - {prefix: /strict/, upstream: "%s/strict"}
  - {prefix: /lenient/, upstream: "%s/lenient"}
rules:
  - {name: strict, match: {path: /strict, method: POST}, meter: {api: openai, max_body: 200}}
  - {name: lenient, match: {path: /lenient, method: POST}, meter: {api: openai, max_body: 200, oversize: unmetered}}
  - {name: tunnel, match: {method: CONNECT}, meter: openai}
`, hostURL(up, "example.com"), hostURL(up, "example.com"))})
	e := &llmEnv{t: t, fake: fake, p: p, adm: newAdmin(t, srv.Addr()), base: "http://" + p.Addr()}
	big := `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"` + strings.Repeat("x", 300) + `"}]}`
	for _, c := range []struct {
		path, body string
		status     int
		denied     string
	}{
		{"/strict/v1/chat/completions", big, 400, "bad-request"},
		{"/strict/v1/chat/completions", `not json`, 400, "bad-request"},
		{"/lenient/v1/chat/completions", big, 200, ""},
		{"/strict/v1/chat/completions", `{"model":"m","max_tokens":10,"messages":[]}`, 200, ""},
	} {
		resp := e.post(c.path, "", c.body)
		body := readAll(t, resp)
		if resp.StatusCode != c.status || resp.Header.Get("Governor-Denied") != c.denied {
			t.Errorf("%s with %d bytes: %d %q %s", c.path, len(c.body), resp.StatusCode, resp.Header.Get("Governor-Denied"), body)
		}
	}
	if n := fake.Requests(); n != 2 {
		t.Errorf("%d requests reached the provider, want 2", n)
	}
	if v := p.metric(`governor_proxy_meter_settlements_total{outcome="unmetered",rule="lenient"}`); v != 1 {
		t.Errorf("%v bodies let through unmetered, want 1", v)
	}
	_, calls := fake.Reported()
	if calls != 2 {
		t.Fatalf("%d calls reported usage", calls)
	}
	conn, _, resp := connect(t, p.Addr(), "example.com:443", "")
	conn.Close()
	if resp.StatusCode != 400 || resp.Header.Get("Governor-Denied") != "bad-request" {
		t.Errorf("a CONNECT under a metered rule: %d %q", resp.StatusCode, resp.Header.Get("Governor-Denied"))
	}
}
