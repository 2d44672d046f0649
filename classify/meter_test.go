package classify

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
)

func TestMeterRules(t *testing.T) {
	rs, err := Parse([]byte(`
rules:
  - name: openai
    match: {path: /v1/chat/completions}
    class: llm
    charge: {llm_calls: 1}
    meter: openai
  - name: anthropic
    match: {path: /v1/messages}
    meter: {api: anthropic, resource: claude_tokens, reserve: 1000, bytes_per_token: 3, max_body: 1024, oversize: unmetered}
`))
	if err != nil {
		t.Fatal(err)
	}
	match := func(path string) Decision {
		u, _ := url.Parse("https://api.example.com" + path)
		d, ok := rs.MatchHTTP(HTTPRequestFrom(&http.Request{Method: "POST", URL: u, Host: u.Host, Header: http.Header{}}))
		if !ok {
			t.Fatalf("%s: no match", path)
		}
		return d
	}
	if m := match("/v1/chat/completions").Meter; m == nil || *m != (Meter{API: "openai", Resource: "tokens", Reserve: DefaultMeterReserve, BytesPerToken: 1, MaxBody: DefaultMeterMaxBody}) {
		t.Errorf("meter: openai is %+v", m)
	}
	if m := match("/v1/messages").Meter; m == nil || *m != (Meter{API: "anthropic", Resource: "claude_tokens", Reserve: 1000, BytesPerToken: 3, MaxBody: 1024, Unmetered: true}) {
		t.Errorf("the mapping is %+v", m)
	}
	if s := match("/v1/messages").String(); !strings.Contains(s, "meter anthropic claude_tokens") {
		t.Errorf("String: %s", s)
	}
	for doc, want := range map[string]string{
		`{name: a, meter: gemini}`:                                               `meter.api (rule "a"): "gemini" is not an API`,
		`{name: a, meter: {resource: tokens}}`:                                   `meter.api (rule "a"): is missing`,
		`{name: a, meter: {api: openai, reserve: 0}}`:                            `meter.reserve (rule "a"): 0 is not from 1 to 16777216`,
		`{name: a, meter: {api: openai, reserve: -1}}`:                           `meter.reserve (rule "a"): -1 is not from 1`,
		`{name: a, meter: {api: openai, reserve: 2147483648}}`:                   `meter.reserve (rule "a"): 2147483648 is not from 1 to 16777216`,
		`{name: a, meter: {api: openai, reserve: 9223372036854775807}}`:          `meter.reserve (rule "a"): 9223372036854775807 is not from 1`,
		`{name: a, meter: {api: openai, reserve: 9007199254740992}}`:             `meter.reserve (rule "a"): 9007199254740992 is not from 1`,
		`{name: a, meter: {api: openai, reserve: abc}}`:                          `is not a whole number`,
		`{name: a, meter: {api: openai, bytes_per_token: 9223372036854775807}}`:  `meter.bytes_per_token (rule "a"): 9223372036854775807 is not from 1 to 1048576`,
		`{name: a, meter: {api: openai, max_body: 2147483648}}`:                  `meter.max_body (rule "a"): 2147483648 is not from 1 to 1073741824`,
		`{name: a, meter: {api: openai, on_over_estimate: maybe}}`:               `meter.on_over_estimate (rule "a"): "maybe" is not refuse or clamp`,
		`{name: a, meter: {api: openai, oversize: maybe}}`:                       `meter.oversize (rule "a"): "maybe" is not refuse or unmetered`,
		`{name: a, meter: {api: openai, budget: 3}}`:                             `meter.budget (rule "a"): line 2: unknown key`,
		`{name: a, charge: {tokens: 1}, meter: openai}`:                          `tokens is metered; the rule cannot charge it too`,
		`{name: a, charge_from_header: {resource: t, header: x}, meter: openai}`: `charges from a header or meters`,
	} {
		_, err := Parse([]byte("rules:\n  - " + doc + "\n"))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", doc, err, want)
		}
	}
}
