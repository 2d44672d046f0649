package proxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/governor-project/governor/proxy/meter/fakellm"
)

// Hostile numbers in a metered call, through the real binaries in both
// delegation modes: an output limit at 2^31, 2^53, 2^63-1, past int64,
// negative or not an integer is refused with 400 naming the field, before
// anything is held or forwarded; a provider that reports more than any call
// could use is charged no further than the cap; and afterwards the sidecar
// still meters normally, its books sane, and governord's hard cap held.
func TestMeteredHostileNumbers(t *testing.T) {
	for _, delegation := range []string{"on", "off"} {
		t.Run("delegation="+delegation, func(t *testing.T) { meteredHostileNumbers(t, delegation == "on") })
	}
}

func meteredHostileNumbers(t *testing.T, delegate bool) {
	const budget = 1000
	g := startGovProc(t, fmt.Sprintf("tenants:\n  - {name: payments, api_key: %s, quotas: {tokens: %d}}\n", tenantKey, budget))
	fake := &fakellm.Provider{}
	up := originURL(t, fake)
	s := startSidecarProc(t, g, tenantKey, "pod-h", fmt.Sprintf(`routes:
  - {prefix: /openai/, upstream: "%s/v1"}
rules:
  - {name: openai, match: {path: /v1, method: POST}, class: llm, meter: {api: openai, reserve: 100}}
delegation: {enabled: %v, settle_every: 50ms}
`, up, delegate))
	adm := newAdmin(t, g.addr)
	post := func(maxTokens string, hdr ...string) (int, string, string) {
		t.Helper()
		body := `{"model":"m","messages":[{"role":"user","content":"hi"}]`
		if maxTokens != "" {
			body += `,"max_tokens":` + maxTokens
		}
		body += "}"
		req, err := http.NewRequest(http.MethodPost, "http://"+s.http+"/openai/chat/completions", strings.NewReader(body))
		must(t, err)
		req.Header.Set("Content-Type", "application/json")
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := noProxyClient.Do(req)
		must(t, err)
		return resp.StatusCode, resp.Header.Get("Governor-Denied"), readAll(t, resp)
	}
	used := func() int64 { return adm.node("payments").GetUsed()["tokens"] }
	// Settled: governord counts exactly what the provider reported.
	settled := func() int64 {
		t.Helper()
		reported, _ := fake.Reported()
		eventually(t, "the sidecar's settlement", func() bool { return used() == reported })
		return reported
	}

	// A call first, so that with delegation the sidecar holds a reservation
	// the hostile calls could corrupt.
	if code, denied, body := post("10"); code != 200 {
		t.Fatalf("a first call: %d %s %s", code, denied, body)
	}
	for _, v := range []struct{ value, problem string }{
		{"2147483648", "over 16777216"},
		{"9007199254740992", "over 16777216"},
		{"9223372036854775807", "over 16777216"},
		{"92233720368547758070", "over 16777216"},
		{"-1", "negative"},
		{"-9223372036854775808", "negative"},
		{"1e30", "not an integer"},
		{"500.5", "not an integer"},
		{`"abc"`, "not a number"},
	} {
		code, denied, body := post(v.value)
		var e struct {
			Error struct{ Message string } `json:"error"`
		}
		json.Unmarshal([]byte(body), &e)
		want := fmt.Sprintf("max_tokens is %s: %s", v.value, v.problem)
		if code != 400 || denied != "bad-request" || !strings.Contains(e.Error.Message, want) {
			t.Errorf("max_tokens %s: %d %q %s, want 400 bad-request saying %q", v.value, code, denied, body, want)
		}
	}
	if n := fake.Requests(); n != 1 {
		t.Errorf("%d requests reached the provider; the refused ones must not", n)
	}
	if unspent := s.metric(t, `governor_proxy_reserved_units{resource="tokens",state="unspent"}`); unspent < 0 || unspent > budget {
		t.Errorf("the sidecar holds %v unspent tokens", unspent)
	}
	// Normal calls still go through and are settled exactly, not refused as
	// unavailable by a sidecar whose books went wrong.
	for range 3 {
		if code, denied, body := post("10"); code != 200 {
			t.Fatalf("a call after the hostile ones: %d %s %s", code, denied, body)
		}
	}
	if !ready(s.metrics) {
		t.Error("the sidecar is not ready")
	}
	if got := settled(); got == 0 || got > budget {
		t.Fatalf("%d tokens reported", got)
	}
	// A provider reporting far more than any call could use: charged as far
	// as the cap allows, never past it.
	if code, _, body := post("10", fakellm.HeaderOutput, "4611686018427387904"); code != 200 {
		t.Fatalf("the call whose usage is hostile: %d %s", code, body)
	}
	eventually(t, "the hostile usage charged up to the cap", func() bool { return used() == budget })
	n := adm.node("payments")
	if u, r := n.GetUsed()["tokens"], n.GetReserved()["tokens"]; u+r > budget {
		t.Errorf("governord's hard cap passed: used %d + reserved %d of %d", u, r, budget)
	}
	if code, denied, _ := post("10"); code != 429 || denied != "quota" {
		t.Errorf("a call once the budget is spent: %d %q", code, denied)
	}
	if logs := s.proc.logs.String(); strings.Contains(logs, "settling a reservation failed") || strings.Contains(logs, "settle more than") {
		t.Errorf("the sidecar's settlements failed:\n%s", logs)
	}
}
