package classify

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// benchRules is a realistic rule file of 20 rules: a mix of HTTP rules with
// host globs, methods, paths and headers, and SQL rules, with the rule that
// the benchmark request hits near the end.
func benchRules(tb testing.TB) *Rules {
	tb.Helper()
	var b strings.Builder
	b.WriteString("rules:\n")
	for i := 0; i < 8; i++ {
		fmt.Fprintf(&b, "  - {name: svc-%d, match: {host: \"*.svc%d.internal\", method: [GET, POST], path: \"/api/v%d/*\"}, class: svc, charge: {calls: 1}}\n", i, i, i)
	}
	for i := 0; i < 5; i++ {
		fmt.Fprintf(&b, "  - {name: sql-%d, match: {sql: [insert, update], tables: [\"t%d_*\", \"public.x%d\"]}, class: db}\n", i, i, i)
	}
	b.WriteString(`  - {name: tenant, match: {host: "*.example.com", header: {x-tenant: "team-[ab]*"}}, class: tenant}
  - {name: github, match: {host: api.github.com, scheme: https}, class: github}
  - {name: anthropic, match: {host: api.anthropic.com, method: POST, path: /v1/messages}, class: llm, charge: {llm_calls: 1}}
  - {name: openai-models, match: {host: api.openai.com, method: GET, path: /v1/models}}
  - name: openai
    match: {host: "*.openai.com", method: POST, path: "/v1/*/completions", port: 443}
    class: llm
    charge: {llm_calls: 1}
    charge_from_header: {resource: tokens, header: x-usage-tokens}
  - {name: writes, match: {sql: any, database: "app*"}, class: db}
  - {name: rest, match: {}}
`)
	rules, err := Parse([]byte(b.String()))
	if err != nil {
		tb.Fatal(err)
	}
	if rules.Len() != 20 {
		tb.Fatalf("%d rules", rules.Len())
	}
	return rules
}

func benchRequest() HTTPRequest {
	return HTTPRequest{Scheme: "https", Host: "api.openai.com", Method: "POST",
		Path: "/v1/chat/completions", Header: http.Header{"Content-Type": {"application/json"}}}
}

// BenchmarkMatchHTTP matches a request that passes 17 rules to hit the 18th.
func BenchmarkMatchHTTP(b *testing.B) {
	rules := benchRules(b)
	req := benchRequest()
	if d, ok := rules.MatchHTTP(req); !ok || d.Rule != "openai" {
		b.Fatalf("matched %q", d.Rule)
	}
	b.ReportAllocs()
	for b.Loop() {
		rules.MatchHTTP(req)
	}
}

// BenchmarkMatchHTTPParallel is BenchmarkMatchHTTP from every core at once,
// as the proxy's connections run.
func BenchmarkMatchHTTPParallel(b *testing.B) {
	rules := benchRules(b)
	req := benchRequest()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			rules.MatchHTTP(req)
		}
	})
}

func BenchmarkMatchSQL(b *testing.B) {
	rules := benchRules(b)
	st := SQLStatement{Kinds: []string{"select"}, Tables: []string{"public.accounts"}, Database: "app_main", User: "svc"}
	if d, ok := rules.MatchSQL(st); !ok || d.Rule != "writes" {
		b.Fatalf("matched %q", d.Rule)
	}
	b.ReportAllocs()
	for b.Loop() {
		rules.MatchSQL(st)
	}
}

func BenchmarkParse(b *testing.B) {
	benchRules(b)
	var text strings.Builder
	text.WriteString("rules:\n")
	for i := 0; i < 20; i++ {
		fmt.Fprintf(&text, "  - {name: r%d, match: {host: \"*.s%d.test\", method: POST, path: /v1/*}, class: c, charge: {x: 1}}\n", i, i)
	}
	data := []byte(text.String())
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(data); err != nil {
			b.Fatal(err)
		}
	}
}
