package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/proxy/httpproxy"
	"github.com/governor-project/governor/server"
	"github.com/governor-project/governor/server/serverconfig"
)

// sharedRoot starts governord with a second tenant, "reconciliation", whose
// task "recon-secret-batch" has spent 5 of the root's 6 units of resource.
func sharedRoot(t *testing.T, resource string) *server.Server {
	const otherKey = "recon-key-for-tests"
	g := startGovernord(t, func(c *serverconfig.Config) {
		c.Root.Quotas = map[string]int64{resource: 6}
		c.Tenants = append(c.Tenants, serverconfig.TenantConfig{Name: "reconciliation", APIKey: otherKey, Weight: 1})
	})
	other, err := governor.Dial(context.Background(), governor.WithAddr(g.Addr()), governor.WithAPIKey(otherKey))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	_, secret, err := other.NewTask(context.Background(), governor.Spec{Name: "recon-secret-batch"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { secret.Close() })
	if err := secret.Consume(context.Background(), resource, 5); err != nil {
		t.Fatal(err)
	}
	return g
}

// otherTenantLeaks are what a denial must not name: the other tenant, its
// task, its use.
var otherTenantLeaks = []string{"reconciliation", "recon-secret-batch", " 5"}

// A 429 for a quota on the root, which the sidecar's tenant shares with
// another, says the root is spent by "another tenant" and names neither
// that tenant, nor its task, nor its use: not in the header, the JSON body
// or the message (which is also the SQL error's).
func TestDenialOnTheRootNamesNoOtherTenantOverHTTP(t *testing.T) {
	g := sharedRoot(t, "llm_calls")
	var err error
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
	for _, leak := range otherTenantLeaks {
		if strings.Contains(seen, leak) {
			t.Errorf("the denial names %q:\n%s", leak, seen)
		}
	}
}

// The same denial through pgwire: an ERROR 53400 whose message says
// another tenant spent the root, and names nothing of it.
func TestDenialOnTheRootNamesNoOtherTenantOverSQL(t *testing.T) {
	pgUpstream(t)
	freshPGTable(t, "pgq_tenants")
	g := sharedRoot(t, "db_writes")
	p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: "task: {name: pod-tenants}\n" + pgListenerYAML(t, "") + pgRules})
	c := pgConnect(t, pgDSN(p.PGWireAddrs()[0], "crawl-42"))
	pgExec(t, c, "INSERT INTO pgq_tenants VALUES (1)") // the root's last unit
	wantPGError(t, c, "53400", "the largest consumer is another tenant", "INSERT INTO pgq_tenants VALUES (2)")
	_, err := c.Exec(context.Background(), "INSERT INTO pgq_tenants VALUES (3)")
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		t.Fatalf("the third insert: %v, want a denial", err)
	}
	for _, leak := range otherTenantLeaks {
		if strings.Contains(pe.Message+pe.Detail+pe.Hint, leak) {
			t.Errorf("the SQL error names %q: %+v", leak, pe)
		}
	}
	pgAlive(t, c)
}
