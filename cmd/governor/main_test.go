package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const example = "../../proxy.example.yaml"

func TestExplain(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want []string
	}{
		{[]string{"-config", example, "POST", "https://api.openai.com/v1/chat/completions"}, 0,
			[]string{"1. openai-chat: MATCH", "charge llm_calls=1, tokens=1 and take a lease of class llm", "after the response: charge tokens",
				"CONNECT api.openai.com:443", "no rule matches the tunnel"}},
		{[]string{"-config", example, "GET", "https://api.openai.com/v1/chat/completions"}, 0,
			[]string{`openai-chat: no match: match.method: "GET" is not POST`, "anthropic: no match", "payment-writes: no match: a SQL rule",
				"no rule matches; http.unmatched is forward"}},
		{[]string{"-config", example, "-H", "X-Job-Kind: batch-7", "https://example.org/"}, 0,
			[]string{"3. batch: MATCH", "take a lease of class batch"}},
		{[]string{"-config", example, "CONNECT", "api.anthropic.com:443"}, 0,
			[]string{"openai-chat: no match", "anthropic: MATCH", "held until the tunnel's connection closes"}},
		{[]string{"-config", example, "POST", "/openai/v1/chat/completions"}, 0,
			[]string{"route: /openai/ -> https://api.openai.com", "request: POST https://api.openai.com/v1/chat/completions", "openai-chat: MATCH"}},
		{[]string{"-config", example, "/nowhere"}, 1, []string{"no base-URL route"}},
		{[]string{"-config", example, "--sql", "INSERT INTO payments VALUES (1)"}, 0,
			[]string{"as the pgwire parser reads it: kinds [insert], tables [payments]", "payment-writes: no match: match.database", "decision: no rule matches"}},
		{[]string{"-config", example, "--sql", "WITH x AS (DELETE FROM payments_2026 RETURNING *) SELECT 1", "-database", "app"}, 0,
			[]string{"kinds [delete], tables [payments_2026]", "payment-writes: MATCH"}},
		{[]string{"-config", example, "--sql", "INSERT INTO payments VALUES (1)", "-kind", "insert", "-tables", "payments", "-database", "app"}, 0,
			[]string{"payment-writes: MATCH", "charge db_writes=1, and hold a lease of class db"}},
		{[]string{"-config", example, "--sql", "SELECT 1 FROM reports; DELETE FROM payments", "-database", "app"}, 0,
			[]string{"statement 1 of 2", "kinds [select], tables [reports]", "statement 2 of 2", "kinds [delete], tables [payments]", "payment-writes: MATCH"}},
	} {
		var out, errOut bytes.Buffer
		code := run(append([]string{"explain"}, tc.args...), nil, &out, &errOut)
		if code != tc.code {
			t.Errorf("%v: exit %d, want %d\n%s%s", tc.args, code, tc.code, out.String(), errOut.String())
		}
		for _, w := range tc.want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("%v: output lacks %q:\n%s", tc.args, w, out.String())
			}
		}
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{nil, {"nope"}, {"top", "extra"}, {"explain"}, {"explain", "-config", example},
		{"explain", "-config", example, "GET"}, {"explain", "-config", "/no/such/file", "GET", "https://x/"},
		{"explain", "-config", example, "CONNECT", "https://x/"}, {"explain", "-config", example, "-H", "nocolon", "https://x/"}} {
		var out, errOut bytes.Buffer
		if code := run(args, nil, &out, &errOut); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
}

// With http.intercept listing a host, explain says that its requests are
// decided one by one inside the tunnel, and that the tunnel itself is not
// governed.
func TestExplainIntercepted(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "proxy.yaml")
	if err := os.WriteFile(cfg, []byte(`governor: {api_key: k-0123456789abcdef}
task: {name: pod-7}
http:
  intercept: {hosts: [api.openai.com], ca_cert: ca.pem, ca_key: ca-key.pem}
rules:
  - {name: chat, match: {host: api.openai.com, path: /v1/chat/*, method: POST}, charge: {calls: 1}}
  - {name: tunnels, match: {method: CONNECT}, charge: {tunnels: 1}}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args      []string
		want, not []string
	}{
		{[]string{"POST", "https://api.openai.com/v1/chat/completions"},
			[]string{"chat: MATCH", "api.openai.com is intercepted (http.intercept)", "request by request"}, []string{"only host and port are seen"}},
		{[]string{"CONNECT", "api.openai.com:443"}, []string{"the tunnel itself is not governed"}, []string{"tunnels: MATCH"}},
		{[]string{"CONNECT", "api.anthropic.com:443"}, []string{"tunnels: MATCH"}, []string{"intercepted"}},
	} {
		var out, errOut bytes.Buffer
		if code := run(append([]string{"explain", "-config", cfg}, tc.args...), nil, &out, &errOut); code != 0 {
			t.Errorf("%v: exit %d: %s", tc.args, code, errOut.String())
		}
		for _, w := range tc.want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("%v: output lacks %q:\n%s", tc.args, w, out.String())
			}
		}
		for _, n := range tc.not {
			if strings.Contains(out.String(), n) {
				t.Errorf("%v: output says %q:\n%s", tc.args, n, out.String())
			}
		}
	}
}

// The URL a worker given a base URL actually calls, at the sidecar's own
// listen address, is explained as the sidecar takes it: the path through
// its route, matched as the upstream request; another address on the same
// host is not the sidecar and is explained as before.
func TestExplainBaseURLAsTheWorkerCallsIt(t *testing.T) {
	bin := buildCLI(t)
	for _, target := range []string{"http://127.0.0.1:7700/openai/v1/chat/completions", "http://localhost:7700/openai/v1/chat/completions"} {
		code, out, errOut := runCLI(t, bin, "", "explain", "-config", example, "POST", target)
		for _, want := range []string{"is governor-proxy's own address (http.listen 127.0.0.1:7700)", "route: /openai/ -> https://api.openai.com",
			"request: POST https://api.openai.com/v1/chat/completions", "1. openai-chat: MATCH", "charge llm_calls=1, tokens=1 and take a lease of class llm"} {
			if code != 0 || !strings.Contains(out, want) {
				t.Errorf("explain POST %s: exit %d, output lacks %q:\n%s%s", target, code, want, out, errOut)
			}
		}
		if strings.Contains(out, "no rule matches") {
			t.Errorf("explain POST %s says no rule matches:\n%s", target, out)
		}
	}
	code, out, _ := runCLI(t, bin, "", "explain", "-config", example, "POST", "http://127.0.0.1:7700/nowhere")
	if code != 1 || !strings.Contains(out, "no base-URL route covers /nowhere; governor-proxy answers 404") {
		t.Errorf("a path no route covers, at the sidecar's address: exit %d\n%s", code, out)
	}
	code, out, _ = runCLI(t, bin, "", "explain", "-config", example, "POST", "http://127.0.0.1:8080/openai/v1/chat/completions")
	if code != 0 || strings.Contains(out, "own address") || !strings.Contains(out, "no rule matches; http.unmatched is forward") {
		t.Errorf("another server on loopback is not the sidecar: exit %d\n%s", code, out)
	}
}
