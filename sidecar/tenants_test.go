package sidecar

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/server"
	"github.com/governor-project/governor/sidecar/httpproxy"
)

// A 429 for a quota on the root, which the sidecar's tenant shares with
// another, says the root is spent by "another tenant" and names neither
// that tenant, nor its task, nor its use: not in the header, the JSON body
// or the message (which is also the SQL error's).
func TestDenialOnTheRootNamesNoOtherTenantOverHTTP(t *testing.T) {
	const otherKey = "recon-key-for-tests"
	g := startGovernord(t, func(c *server.Config) {
		c.Root.Quotas = map[string]int64{"llm_calls": 6}
		c.Tenants = append(c.Tenants, server.TenantConfig{Name: "reconciliation", APIKey: otherKey, Weight: 1})
	})
	other, err := governor.Dial(context.Background(), governor.WithAddr(g.Addr()), governor.WithAPIKey(otherKey))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	_, secret, err := other.NewTask(context.Background(), governor.Spec{Name: "recon-secret-batch"})
	if err != nil {
		t.Fatal(err)
	}
	defer secret.Close()
	if err := secret.Consume(context.Background(), "llm_calls", 5); err != nil {
		t.Fatal(err)
	}

	o := origin(t, http.HandlerFunc(hello), false, false)
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: `
rules:
  - {name: llm, match: {host: origin.test, method: POST, path: /v1/}, class: llm, charge: {llm_calls: 1}}
`})
	c := p.client("crawl-42", nil)
	var resp *http.Response
	var body string
	for range 2 { // the root has 1 call left
		if resp, err = c.Post(hostURL(o, "origin.test")+"/v1/chat", "application/json", strings.NewReader(`{}`)); err != nil {
			t.Fatal(err)
		}
		body = readAll(t, resp)
	}
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get(httpproxy.HeaderDenied) != "quota" {
		t.Fatalf("the second call: %d %v %q, want a 429 for the quota", resp.StatusCode, resp.Header, body)
	}
	var d deniedBody
	if err := json.Unmarshal([]byte(body), &d); err != nil {
		t.Fatalf("body %q: %v", body, err)
	}
	if e := d.Error; e.Cap != "llm_calls" || e.Node != "root" || e.Used == nil || *e.Used != 6 || e.Limit == nil || *e.Limit != 6 ||
		e.LargestConsumer != nil {
		t.Errorf("denial body %s; want the root's 6 of 6 and no consumer", body)
	}
	if !strings.Contains(d.Error.Message, "the largest consumer is another tenant") {
		t.Errorf("message %q does not say another tenant spent the root", d.Error.Message)
	}
	seen := body
	for k, vs := range resp.Header {
		seen += "\n" + k + ": " + strings.Join(vs, ",")
	}
	for _, leak := range []string{"reconciliation", "recon-secret-batch", " 5"} {
		if strings.Contains(seen, leak) {
			t.Errorf("the denial names %q:\n%s", leak, seen)
		}
	}
}
