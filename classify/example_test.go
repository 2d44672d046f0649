package classify_test

import (
	"fmt"
	"net/http"

	"github.com/governor-project/governor/classify"
)

const proxyYAML = `
http: {listen: 127.0.0.1:7700}   # the proxy's own keys: Parse ignores them
rules:
  - name: llm
    match: {host: api.openai.com, method: POST, path: /v1/}
    class: llm
    charge: {llm_calls: 1}
    charge_from_header: {resource: tokens, header: x-usage-tokens}
  - name: writes
    match: {sql: [insert, update, delete, merge, copy], tables: ["payments*"]}
    class: db
    charge: {db_writes: 1}
  - name: any-sql
    match: {sql: any}
    class: db
`

func ExampleRules_MatchHTTP() {
	rules, err := classify.Parse([]byte(proxyYAML))
	if err != nil {
		panic(err)
	}
	req, _ := http.NewRequest("POST", "https://api.openai.com/v1/chat/completions", nil)
	d, ok := rules.MatchHTTP(classify.HTTPRequestFrom(req))
	fmt.Println(ok, d)

	// After the response: the charge from its header.
	resp := http.Header{"X-Usage-Tokens": {"1234"}}
	n, err := d.ChargeFromHeader.Amount(resp)
	fmt.Println(n, err)
	// Output:
	// true rule "llm": class llm; charge llm_calls=1; after the response, charge tokens from header X-Usage-Tokens
	// 1234 <nil>
}

func ExampleRules_MatchSQL() {
	rules, _ := classify.Parse([]byte(proxyYAML))
	d, _ := rules.MatchSQL(classify.SQLStatement{Kinds: []string{classify.KindInsert}, Tables: []string{"public.payments"}})
	fmt.Println(d)
	d, _ = rules.MatchSQL(classify.SQLStatement{Kinds: []string{classify.KindSelect}, Tables: []string{"payments"}})
	fmt.Println(d)
	// Output:
	// rule "writes": class db; charge db_writes=1
	// rule "any-sql": class db; no charge
}

func ExampleRules_ExplainHTTP() {
	rules, _ := classify.Parse([]byte(proxyYAML))
	for _, step := range rules.ExplainHTTP(classify.HTTPRequest{Scheme: "https", Host: "api.openai.com", Method: "GET", Path: "/v1/models"}) {
		fmt.Println(step)
	}
	// Output:
	// llm: no match: match.method: "GET" is not POST
	// writes: no match: a SQL rule (it has sql, tables); never matches HTTP
	// any-sql: no match: a SQL rule (it has sql); never matches HTTP
}

func ExampleParse_error() {
	_, err := classify.Parse([]byte(`rules:
  - {name: a, match: {host: a.test}}
  - {name: b, match: {sql: select}}
  - {name: writes, match: {method: FETCH}}
`))
	fmt.Println(err)
	// Output:
	// config: rules[2].match.method (rule "writes"): "FETCH" is not an HTTP method (one of GET, HEAD, POST, PUT, PATCH, DELETE, CONNECT, OPTIONS, TRACE)
}
