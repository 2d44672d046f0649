package classify

import (
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// TestBytesAndResultRules: bytes: and result: compile with their defaults,
// and say what they charge in explanations.
func TestBytesAndResultRules(t *testing.T) {
	rs, err := Parse([]byte(`
rules:
  - {name: dl, match: {host: a.test}, bytes: {resource: egress_bytes, count: response}}
  - {name: up, match: {host: b.test}, bytes: {resource: ingress, count: request, chunk: 1024}}
  - {name: all, match: {host: c.test}, bytes: {resource: wire}}
  - {name: q, match: {sql: select}, result: {rows: rows_read, bytes: result_bytes}}
  - {name: r, match: {sql: any}, result: {rows: rows_read}}
`))
	if err != nil {
		t.Fatal(err)
	}
	http := func(host string) Decision {
		u, _ := url.Parse("https://" + host + "/x")
		d, ok := rs.MatchHTTP(HTTPRequestFrom(&http.Request{Method: "GET", URL: u, Host: u.Host, Header: http.Header{}}))
		if !ok {
			t.Fatalf("%s: no match", host)
		}
		return d
	}
	for host, want := range map[string]Bytes{
		"a.test": {Resource: "egress_bytes", Response: true, Chunk: DefaultBytesChunk},
		"b.test": {Resource: "ingress", Request: true, Chunk: 1024},
		"c.test": {Resource: "wire", Request: true, Response: true, Chunk: DefaultBytesChunk},
	} {
		if b := http(host).Bytes; b == nil || *b != want {
			t.Errorf("%s: bytes %+v, want %+v", host, b, want)
		}
	}
	if s := http("a.test").String(); !strings.Contains(s, "charge the bytes of response bodies (what a tunnel's upstream sends, when not intercepted) to egress_bytes, up to 65536 a charge as they stream") {
		t.Errorf("String: %s", s)
	}
	d, ok := rs.MatchSQL(SQLStatement{Kinds: []string{KindSelect}})
	if !ok || d.Result == nil || *d.Result != (Result{Rows: "rows_read", Bytes: "result_bytes"}) {
		t.Fatalf("result: %+v", d.Result)
	}
	if s := d.String(); !strings.Contains(s, "charge the rows a statement returns to rows_read and their bytes to result_bytes") {
		t.Errorf("String: %s", s)
	}
}

// TestBytesAndResultRefused: every bad value of the new keys is refused
// naming its key: hostile numbers (0, negative, 2^31, 2^53, 2^63-1, a
// fraction, a string), an unknown count, a missing or empty resource, the
// wrong key for the rule's kind, and keys that are not mappings.
func TestBytesAndResultRefused(t *testing.T) {
	for _, tc := range []struct{ rule, key, problem string }{
		{`bytes: {resource: e, chunk: 0}`, "bytes.chunk", "0 is not from 1 to 67108864"},
		{`bytes: {resource: e, chunk: -1}`, "bytes.chunk", "-1 is not from 1 to"},
		{`bytes: {resource: e, chunk: 2147483648}`, "bytes.chunk", "2147483648 is not from 1 to"},
		{`bytes: {resource: e, chunk: 9007199254740992}`, "bytes.chunk", "9007199254740992 is not from 1 to"},
		{`bytes: {resource: e, chunk: 9223372036854775807}`, "bytes.chunk", "9223372036854775807 is not from 1 to"},
		{`bytes: {resource: e, chunk: 9223372036854775808}`, "bytes.chunk", "cannot unmarshal"},
		{`bytes: {resource: e, chunk: 1.5}`, "bytes.chunk", "not a whole number"},
		{`bytes: {resource: e, chunk: lots}`, "bytes.chunk", "not a whole number"},
		{`bytes: {resource: e, count: upload}`, "bytes.count", `"upload" is not request, response or both`},
		{`bytes: {resource: e, count: 3}`, "bytes.count", `"3" is not request, response or both`},
		{`bytes: {count: both}`, "bytes.resource", "is missing"},
		{`bytes: {resource: ""}`, "bytes.resource", "is empty"},
		{`bytes: {resource: e, chunks: 5}`, "bytes", "chunks"},
		{`bytes: 5`, "bytes", ""},
		{`bytes: egress_bytes`, "bytes", ""},
		{`match: {sql: select}, bytes: {resource: e}`, "bytes", "is for HTTP rules"},
		{`meter: openai, bytes: {resource: e}`, "bytes", "meters LLM tokens or charges bytes, not both"},
		{`match: {host: a.test}, result: {rows: r}`, "result", "is for SQL rules"},
		{`result: {}`, "result", "names no resource"},
		{`result: {rows: ""}`, "result.rows", "is empty"},
		{`result: {rows: r, bytes: r}`, "result", "name two resources"},
		{`result: {rows: r, cells: c}`, "result", "cells"},
		{`result: rows`, "result", ""},
	} {
		_, err := Parse([]byte("rules:\n  - {name: x, " + tc.rule + "}\n"))
		var e *Error
		if !errors.As(err, &e) {
			t.Errorf("%s: got %v, want a config error", tc.rule, err)
			continue
		}
		if !strings.HasPrefix(e.Key, "rules[0]."+tc.key) || !strings.Contains(err.Error(), tc.problem) {
			t.Errorf("%s: got %q (key %q), want key rules[0].%s and %q", tc.rule, err, e.Key, tc.key, tc.problem)
		}
	}
}
