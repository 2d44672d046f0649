package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/server/serverconfig"
)

// governor explain -live asks governord, in dry run, how it would answer
// the request on a node now, and says a shadow rule is one: for a shadow
// rule counting the shadow ledger (what its requests would have spent), for
// an enforced one not; a request whose quota is spent reads as refused for
// quota, and nothing is charged.
func TestExplainLive(t *testing.T) {
	srv := govtest.Start(t, nil)
	t.Setenv("GOVERNOR_ADDR", srv.Addr())
	t.Setenv("GOVERNOR_API_KEY", govtest.AdminKey)
	admin := adminRPC(t, srv.Addr())
	if _, err := admin.SetCaps(context.Background(), &governorpb.SetCapsRequest{NodeId: 2, Quotas: map[string]int64{"calls": 1}, Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	c, err := governor.Dial(context.Background(), governor.WithAddr(srv.Addr()), governor.WithAPIKey(govtest.TenantKey))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, task, err := c.NewTask(context.Background(), governor.Spec{Name: "pod-7"})
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "proxy.yaml")
	if err := os.WriteFile(cfg, []byte("rules:\n  - {name: api, match: {host: api.test}, charge: {calls: 1}, mode: shadow}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := cli(t, "explain", "-config", cfg, "-live", "payments/pod-7", "POST", "http://api.test/v1")
	if code != 0 || !strings.Contains(out, "mode: shadow") || !strings.Contains(out, "live, on payments/pod-7") || !strings.Contains(out, "  admitted") {
		t.Fatalf("explain -live with room: %d\n%s%s", code, out, errOut)
	}
	// The shadow rule's own request, recorded in the shadow ledger, spends
	// the quota of 1 as it would enforced: explain counts it.
	if r, err := c.Raw().DryRun(context.Background(), &governorpb.DryRunRequest{NodeId: task.ID(), Charges: map[string]int64{"calls": 1}, Record: true}); err != nil || r.GetOutcome() != "admitted" {
		t.Fatalf("a recorded dry run: %v %v", r, err)
	}
	code, out, errOut = cli(t, "explain", "-config", cfg, "-live", "payments/pod-7", "POST", "http://api.test/v1")
	if code != 0 || !strings.Contains(out, "counting the shadow ledger") || !strings.Contains(out, "refused (quota)") {
		t.Fatalf("explain -live with the shadow ledger full: %d\n%s%s", code, out, errOut)
	}
	// The same rule enforced does not count the ledger: room again, until
	// real work spends the quota.
	enforced := filepath.Join(t.TempDir(), "proxy.yaml")
	if err := os.WriteFile(enforced, []byte("rules:\n  - {name: api, match: {host: api.test}, charge: {calls: 1}}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = cli(t, "explain", "-config", enforced, "-live", "payments/pod-7", "POST", "http://api.test/v1")
	if code != 0 || strings.Contains(out, "shadow") || !strings.Contains(out, "  admitted") {
		t.Fatalf("explain -live of the rule enforced: %d\n%s%s", code, out, errOut)
	}
	if err := task.Consume(context.Background(), "calls", 1); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = cli(t, "explain", "-config", enforced, "-live", "payments/pod-7", "POST", "http://api.test/v1")
	if code != 0 || !strings.Contains(out, "refused (quota)") {
		t.Fatalf("explain -live with the quota spent: %d\n%s%s", code, out, errOut)
	}
	n, err := admin.GetNode(context.Background(), &governorpb.GetNodeRequest{NodeId: 2})
	if err != nil || n.GetUsed()["calls"] != 1 {
		t.Fatalf("a dry run charged something: %v %v", n.GetUsed(), err)
	}
}

// explain -live asks governord for what the sidecar would ask: for a
// metered call, the meter's estimate read from the body (-d). A call the
// real sidecar refuses (429) because its estimate does not fit in what the
// budget has left is refused by explain too, in the sidecar's words; one
// whose estimate fits is admitted by both.
func TestExplainLiveMeteredCall(t *testing.T) {
	srv := govtest.Start(t, func(c *serverconfig.Config) { c.Tenants[0].Quotas = map[string]int64{"tokens": 1000} })
	t.Setenv("GOVERNOR_ADDR", srv.Addr())
	t.Setenv("GOVERNOR_API_KEY", govtest.TenantKey)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c1","object":"chat.completion","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}}`)
	}))
	defer upstream.Close()
	u, _ := url.Parse(upstream.URL)
	side, config := startSidecar(t, fmt.Sprintf(`governor: {addr: %q, api_key: %s}
task: {name: pod-7}
metrics_listen: 127.0.0.1:0
http: {listen: 127.0.0.1:0, allow_targets: [%q]}
routes:
  - {prefix: /openai/, upstream: %q}
rules:
  - name: chat
    match: {path: /v1/chat/completions, method: POST}
    charge: {llm_calls: 1}
    meter: openai
`, srv.Addr(), govtest.TenantKey, u.Host, upstream.URL))
	client, base := viaSidecar(side)

	for _, c := range []struct {
		body, outcome string
		status        int
	}{
		{`{"model":"m","max_completion_tokens":4096,"messages":[{"role":"user","content":"hi"}]}`, "refused (quota)", 429},
		{`{"model":"m","max_completion_tokens":100,"messages":[{"role":"user","content":"hi"}]}`, "admitted", 200},
	} {
		resp, err := client.Post(base.String()+"/openai/v1/chat/completions", "application/json", strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		sidecarSaid, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status {
			t.Fatalf("the sidecar answered %d to %s, want %d: %s", resp.StatusCode, c.body, c.status, sidecarSaid)
		}
		code, out, errOut := gov(t, "explain", "-config", config, "-d", c.body, "-live", "payments/pod-7", "POST", "/openai/v1/chat/completions")
		est := int64(len(c.body)) + map[int]int64{429: 4096, 200: 100}[c.status]
		for _, want := range []string{fmt.Sprintf("meter (openai): before forwarding, holds an estimate of %d tokens", est),
			fmt.Sprintf("asked for: llm_calls=1, tokens=%d (tokens: the meter's estimate)", est), "  " + c.outcome} {
			if code != 0 || !strings.Contains(out, want) {
				t.Errorf("explain -live for the call the sidecar answered %d: exit %d, output lacks %q\n%s%s", c.status, code, want, out, errOut)
			}
		}
		if c.status == 429 {
			if want := fmt.Sprintf("the sidecar answers 429: governor: this call's estimate of %d tokens does not fit", est); !strings.Contains(out, want) ||
				!strings.Contains(string(sidecarSaid), "does not fit") {
				t.Errorf("explain does not say what the sidecar said (%s):\n%s", sidecarSaid, out)
			}
		}
	}
	// Without the body it cannot ask what the sidecar would: it says so.
	code, out, errOut := gov(t, "explain", "-config", config, "-live", "payments/pod-7", "POST", "/openai/v1/chat/completions")
	if code != 2 || !strings.Contains(errOut, `rule "chat" meters tokens`) || !strings.Contains(errOut, "give it with -d") {
		t.Errorf("-live on a metered rule without -d: exit %d\n%s%s", code, out, errOut)
	}
}
