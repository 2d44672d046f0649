package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/governor-project/governor/proxy/meter/fakellm"
)

// llmEnv is a sidecar whose base-URL routes lead, over HTTPS, to a fake
// LLM provider, with metered rules for OpenAI's and Anthropic's APIs; the
// worker's task has a budget of tokens.
type llmEnv struct {
	t    testing.TB
	fake *fakellm.Provider
	p    *testProxy
	adm  *admin
	base string // the sidecar's base URL, http://127.0.0.1:port; "" when intercepted
	// sdkEnv is the environment sdk.mjs is run with (metering_sdk_test.go).
	sdkEnv      []string
	intercepted bool // reached by interception, not through routes (startInterceptedLLM)
}

func startLLM(t testing.TB, tokens int64, fake *fakellm.Provider, extraYAML ...string) *llmEnv {
	t.Helper()
	srv := startGovernord(t, nil)
	up := origin(t, fake, true, false)
	p := startProxy(t, proxyOpts{gaddr: srv.Addr(), tls: certPool(up), yaml: fmt.Sprintf(`
task: {name: pod-7, quotas: {tokens: %d}}
routes:
  - {prefix: /openai/, upstream: "%s/v1"}
  - {prefix: /anthropic/, upstream: "%s"}
rules:
  - {name: anthropic, match: {path: /v1/messages, method: POST}, class: llm, meter: anthropic}
  - {name: openai, match: {path: /v1, method: POST}, class: llm, meter: {api: openai, reserve: 1000}}
%s`, tokens, hostURL(up, "example.com"), hostURL(up, "example.com"), strings.Join(extraYAML, "\n"))})
	base := "http://" + p.Addr()
	return &llmEnv{t: t, fake: fake, p: p, adm: newAdmin(t, srv.Addr()), base: base, sdkEnv: []string{"SIDECAR=" + base}}
}

// used is the tokens governord counts as spent on the task, once the
// sidecar has reported what it spent.
func (e *llmEnv) used() int64 {
	e.p.settle()
	return e.adm.node("payments", "pod-7").GetUsed()["tokens"]
}

// post sends a request to the sidecar's route, as a subtask.
func (e *llmEnv) post(path, subtask, body string, hdr ...string) *http.Response {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.base+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if subtask != "" {
		req.Header.Set("Proxy-Authorization", "Basic "+basic(subtask))
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := noProxyClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp
}

// Every kind of call, JSON and streamed, is settled to the usage the
// provider reported: governord counts exactly what the fake reported.
func TestMeteredCallsSettleToTheirUsage(t *testing.T) {
	e := startLLM(t, 1_000_000, &fakellm.Provider{})
	calls := []struct{ path, body string }{
		{"/openai/chat/completions", `{"model":"gpt-4o-mini","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`},
		{"/openai/chat/completions", `{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hi"}]}`},
		{"/openai/chat/completions", `{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":5,"messages":[]}`},
		{"/openai/responses", `{"model":"gpt-4.1","input":"hi","max_output_tokens":30}`},
		{"/openai/responses", `{"model":"gpt-4.1","input":"hi","stream":true}`},
		{"/anthropic/v1/messages", `{"model":"claude-sonnet-4-5","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`},
		{"/anthropic/v1/messages", `{"model":"claude-sonnet-4-5","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}`},
	}
	for _, c := range calls {
		resp := e.post(c.path, "agent-1", c.body)
		got := readAll(t, resp)
		if resp.StatusCode != 200 {
			t.Fatalf("%s %s: %d %s", c.path, c.body, resp.StatusCode, got)
		}
		// A stream that did not ask for usage shows none: the sidecar
		// asked for it, and took it out again.
		if strings.Contains(c.body, `"stream":true,"messages"`) && strings.Contains(c.path, "chat") {
			if strings.Contains(got, `"usage"`) || !strings.HasSuffix(got, "data: [DONE]\n\n") {
				t.Errorf("the client sees the usage it did not ask for:\n%s", got)
			}
		}
		if strings.Contains(c.body, `"include_usage":true`) && (!strings.Contains(got, `"choices":[]`) || !strings.Contains(got, `"usage":{`)) {
			t.Errorf("the client lost the usage chunk it asked for:\n%s", got)
		}
	}
	reported, n := e.fake.Reported()
	if n != int64(len(calls)) {
		t.Fatalf("the fake reported usage for %d calls of %d", n, len(calls))
	}
	if used := e.used(); used != reported {
		t.Errorf("governord counts %d tokens; the fake reported %d", used, reported)
	}
	if v := e.p.metric(`governor_proxy_meter_settlements_total{outcome="usage",rule="openai"}`); v != 5 {
		t.Errorf("%v OpenAI calls settled to their usage, want 5", v)
	}
}

// A call that reports no usage (a stream dropped or ended by an error, an
// upstream error) is charged what was reserved for it, and counted.
func TestMeteredCallsWithoutUsageSpendTheirReservation(t *testing.T) {
	e := startLLM(t, 1_000_000, &fakellm.Provider{})
	var want int64
	for _, c := range []struct{ path, body, fail string }{
		{"/openai/chat/completions", `{"model":"m","stream":true,"max_tokens":50,"messages":[]}`, "midstream"},
		{"/openai/chat/completions", `{"model":"m","stream":true,"max_tokens":50,"messages":[]}`, "error"},
		{"/openai/responses", `{"model":"m","max_output_tokens":70}`, "status"},
		{"/anthropic/v1/messages", `{"model":"m","stream":true,"max_tokens":60,"messages":[]}`, "error"},
		{"/anthropic/v1/messages", `{"model":"m","stream":true,"max_tokens":60,"messages":[]}`, "midstream"},
	} {
		var req struct {
			A int64 `json:"max_tokens"`
			B int64 `json:"max_output_tokens"`
		}
		json.Unmarshal([]byte(c.body), &req)
		want += req.A + req.B + int64(len(c.body)) // the estimate: the limit and a token a byte
		resp := e.post(c.path, "", c.body, fakellm.HeaderFail, c.fail)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	if reported, _ := e.fake.Reported(); reported != 0 {
		t.Fatalf("the fake reported %d tokens", reported)
	}
	// The sidecar ends a failed call after its client has seen the end.
	eventually(t, fmt.Sprintf("governord to count the %d tokens reserved", want), func() bool { return e.used() == want })
	if v := e.p.metric(`governor_proxy_meter_settlements_total{outcome="no_usage",rule="openai"}`) +
		e.p.metric(`governor_proxy_meter_settlements_total{outcome="no_usage",rule="anthropic"}`); v != 5 {
		t.Errorf("%v calls settled without usage, want 5", v)
	}
}

// readEvent reads one SSE event (through its blank line).
func readEvent(t testing.TB, r *bufio.Reader) string {
	t.Helper()
	var b strings.Builder
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("after %q: %v", b.String(), err)
		}
		b.WriteString(line)
		if line == "\n" {
			return b.String()
		}
	}
}

// A metered stream reaches the client a chunk at a time: the client reads
// each event while the fake still holds the next one back.
func TestMeteredStreamsArriveAsTheyAreSent(t *testing.T) {
	gate := make(chan struct{})
	e := startLLM(t, 1_000_000, &fakellm.Provider{Gate: gate})
	t.Cleanup(func() { close(gate) }) // a failed test leaves no stream waiting on it
	for _, c := range []struct{ path, body, last string }{
		{"/openai/chat/completions", `{"model":"m","stream":true,"messages":[]}`, "data: [DONE]\n\n"},
		{"/anthropic/v1/messages", `{"model":"m","stream":true,"max_tokens":60,"messages":[]}`, "event: message_stop\n"},
	} {
		resp := e.post(c.path, "", c.body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d", c.path, resp.StatusCode)
		}
		r := bufio.NewReader(resp.Body)
		events := 0
		for {
			ev := readEvent(t, r) // the fake waits on the gate for the next one
			events++
			if strings.HasPrefix(ev, c.last) {
				break
			}
			if strings.Contains(ev, `"finish_reason":"stop"`) {
				// Next: the usage chunk the client does not see, then [DONE].
				gate <- struct{}{}
			}
			gate <- struct{}{}
		}
		resp.Body.Close()
		if events < 5 {
			t.Errorf("%s: %d events", c.path, events)
		}
	}
}

// A call denied for tokens gets a 429 in its provider's error shape that
// the SDKs do not retry, and never reaches the provider.
func TestMeteredDenialsInTheProvidersShape(t *testing.T) {
	e := startLLM(t, 500, &fakellm.Provider{})
	for _, c := range []struct{ path, body string }{
		{"/openai/chat/completions", `{"model":"m","max_tokens":1000,"messages":[]}`},
		{"/anthropic/v1/messages", `{"model":"m","max_tokens":1000,"messages":[]}`},
	} {
		resp := e.post(c.path, "", c.body)
		body := readAll(t, resp)
		h := resp.Header
		if resp.StatusCode != 429 || h.Get("Governor-Denied") != "quota" || h.Get("X-Should-Retry") != "false" || h.Get("Retry-After") != "" {
			t.Errorf("%s: %d %v", c.path, resp.StatusCode, h)
		}
		var b struct {
			Type  string `json:"type"`
			Error struct {
				Type, Message, Code, Cap string
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(body), &b); err != nil || b.Error.Type != "governor_denied" || b.Error.Cap != "tokens" || b.Error.Message == "" {
			t.Errorf("%s: body %s", c.path, body)
		}
		if strings.HasPrefix(c.path, "/anthropic/") != (b.Type == "error") || strings.HasPrefix(c.path, "/openai/") != (b.Error.Code == "quota") {
			t.Errorf("%s: not in the provider's shape: %s", c.path, body)
		}
	}
	if n := e.fake.Requests(); n != 0 {
		t.Errorf("%d denied requests reached the provider", n)
	}
}

// Three sub-agents calling at once, streamed and not, until each is
// refused: the budget of 10,000 tokens is never exceeded, counted by
// governord or by the provider, and since every response completes,
// governord charges exactly what the provider reported, up to the budget's
// edge (where each call's estimate is held at governord and settled to its
// usage), with delegated budgets and without.
func TestMeteredBudgetAcrossSubagents(t *testing.T) {
	for _, delegation := range []string{"", "delegation: {enabled: false}"} {
		t.Run(fmt.Sprintf("delegation=%v", delegation == ""), func(t *testing.T) {
			meteredBudgetAcrossSubagents(t, delegation)
		})
	}
}

func meteredBudgetAcrossSubagents(t *testing.T, delegation string) {
	const budget = 10_000
	e := startLLM(t, budget, &fakellm.Provider{Output: 150}, delegation)
	var wg sync.WaitGroup
	for a := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				body := `{"model":"m","max_tokens":200,"messages":[{"role":"user","content":"` + strings.Repeat("x", 100*a) + `"}]}`
				if i%2 == 1 {
					body = strings.Replace(body, `"model"`, `"stream":true,"model"`, 1)
				}
				path := "/openai/chat/completions"
				if a == 2 {
					path = "/anthropic/v1/messages"
				}
				resp := e.post(path, fmt.Sprint("agent-", a), body)
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == 429 {
					return
				}
				if resp.StatusCode != 200 {
					t.Errorf("agent %d: %d", a, resp.StatusCode)
					return
				}
			}
		}()
	}
	wg.Wait()
	reported, calls := e.fake.Reported()
	used := e.used()
	if used > budget || reported > budget {
		t.Errorf("governord counts %d tokens and the provider reported %d; the budget is %d", used, reported, budget)
	}
	if calls < 10 || used != reported {
		t.Errorf("%d calls, %d tokens reported, %d charged: want them charged exactly", calls, reported, used)
	}
	t.Logf("%d calls, %d tokens reported, %d charged of %d", calls, reported, used, budget)
}

// curl, as a user would run it against the route, sees the stream as the
// provider sent it and no usage it did not ask for.
func TestMeteredStreamWithCurl(t *testing.T) {
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Skip("no curl")
	}
	e := startLLM(t, 1_000_000, &fakellm.Provider{})
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	out, err := exec.CommandContext(ctx, curl, "-sS", "-N", "--noproxy", "*", "-H", "Content-Type: application/json",
		"-d", `{"model":"m","stream":true,"messages":[]}`, e.base+"/openai/chat/completions").Output()
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(out, []byte(`"usage"`)) || !bytes.HasSuffix(out, []byte("data: [DONE]\n\n")) || bytes.Count(out, []byte("data: ")) != 9 {
		t.Errorf("curl got:\n%s", out)
	}
	reported, _ := e.fake.Reported()
	if used := e.used(); used != reported || used == 0 {
		t.Errorf("charged %d, reported %d", used, reported)
	}
}

// A provider reporting far more tokens than the call's estimate is believed
// (it bills them) and charged as far as the caps allow, but said: a warning
// naming the rule, a count of such calls and of the tokens beyond the
// estimates, and governor_proxy_meter_tokens_total grows by the estimate,
// not by the provider's number.
func TestMeteredUsageAboveTheEstimateIsSaid(t *testing.T) {
	e := startLLM(t, 5000, &fakellm.Provider{})
	resp := e.post("/openai/chat/completions", "", `{"model":"m","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`,
		fakellm.HeaderOutput, "1000000000")
	readAll(t, resp)
	if resp.StatusCode != 200 {
		t.Fatalf("%d", resp.StatusCode)
	}
	eventually(t, "the usage above the estimate charged up to the cap", func() bool { return e.used() == 5000 })
	if v := e.p.metric(`governor_proxy_meter_over_estimate_total{rule="openai"}`); v != 1 {
		t.Errorf("%v calls counted over their estimate", v)
	}
	tokens := e.p.metric(`governor_proxy_meter_tokens_total{rule="openai"}`)
	over := e.p.metric(`governor_proxy_meter_over_estimate_tokens_total{rule="openai"}`)
	if tokens <= 0 || tokens > 200 || tokens+over != 1000000000+float64(len(`{"model":"m","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`)/4) {
		t.Errorf("tokens_total %v, over_estimate_tokens_total %v", tokens, over)
	}
	if !strings.Contains(e.p.logs.String(), "reported more tokens than the call's estimate") || !strings.Contains(e.p.logs.String(), "rule=openai") {
		t.Errorf("no warning naming the rule:\n%s", e.p.logs.String())
	}
}

// A call that waits for tokens held by another call in flight, and runs out
// of its wait, is told it waited for tokens (how many), not for a lease of
// its class; in both delegation modes.
func TestMeteredWaitForTokensSaysSo(t *testing.T) {
	for _, delegation := range []string{"", "delegation: {enabled: false}"} {
		t.Run(fmt.Sprintf("delegation=%v", delegation == ""), func(t *testing.T) {
			gate := make(chan struct{})
			fake := &fakellm.Provider{Gate: gate}
			e := startLLM(t, 1000, fake, "http: {listen: 127.0.0.1:0, allow_targets: [localhost], wait_timeout: 1s}", delegation)
			held := e.post("/openai/chat/completions", "", `{"model":"m","stream":true,"max_tokens":700,"messages":[]}`)
			if held.StatusCode != 200 {
				t.Fatalf("the first call: %d", held.StatusCode)
			}
			resp := e.post("/openai/chat/completions", "", `{"model":"m","max_tokens":300,"messages":[]}`)
			body := readAll(t, resp)
			close(gate)
			readAll(t, held)
			var b struct {
				Error struct {
					Message   string
					Cap       string
					Requested int64
				} `json:"error"`
			}
			json.Unmarshal([]byte(body), &b)
			if resp.StatusCode != 503 || resp.Header.Get("Governor-Denied") != "wait-timeout" ||
				!strings.Contains(b.Error.Message, "waited 1s for 3") || !strings.Contains(b.Error.Message, " tokens;") ||
				strings.Contains(b.Error.Message, "lease") || b.Error.Cap != "tokens" || b.Error.Requested < 300 {
				t.Errorf("a call that waited for tokens: %d %q %s", resp.StatusCode, resp.Header.Get("Governor-Denied"), body)
			}
		})
	}
}

// A call whose estimate does not fit in what the budget has left, while
// the budget is not spent, is told so and what would fit, not that the
// quota is spent; with on_over_estimate: clamp its output limit is lowered
// to that, the call goes ahead within the budget, and the response says
// what was clamped. In both delegation modes.
func TestMeteredEstimateOverWhatIsLeft(t *testing.T) {
	for _, delegation := range []string{"", "delegation: {enabled: false}"} {
		t.Run(fmt.Sprintf("delegation=%v", delegation == ""), func(t *testing.T) {
			fake := &fakellm.Provider{Output: 5000}
			srv := startGovernord(t, nil)
			up := origin(t, fake, true, false)
			p := startProxy(t, proxyOpts{gaddr: srv.Addr(), tls: certPool(up), yaml: fmt.Sprintf(`
task: {name: pod-7, quotas: {tokens: 1000}}
routes:
  - {prefix: /l/, upstream: "%[1]s/lenient"}
  - {prefix: /s/, upstream: "%[1]s/strict"}
rules:
  - {name: lenient, match: {path: /lenient, method: POST}, class: llm, meter: {api: openai, on_over_estimate: clamp}}
  - {name: strict, match: {path: /strict, method: POST}, class: llm, meter: {api: openai}}
%[2]s
`, hostURL(up, "example.com"), delegation)})
			e := &llmEnv{t: t, fake: fake, p: p, adm: newAdmin(t, srv.Addr()), base: "http://" + p.Addr()}
			body := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
			resp := e.post("/s/chat/completions", "", body)
			got := readAll(t, resp)
			var b struct {
				Error struct {
					Message     string
					OutputField string `json:"output_field"`
					OutputFits  int64  `json:"output_fits"`
				} `json:"error"`
			}
			json.Unmarshal([]byte(got), &b)
			fits := int64(1000 - len(body))
			want := fmt.Sprintf("has 1000 of 1000 left; set max_completion_tokens to at most %d", fits)
			if resp.StatusCode != 429 || !strings.Contains(b.Error.Message, "this call's estimate of") || !strings.Contains(b.Error.Message, want) ||
				strings.Contains(b.Error.Message, "quota spent") || b.Error.OutputField != "max_completion_tokens" || b.Error.OutputFits != fits {
				t.Errorf("an estimate over what is left: %d %s, want a message with %q", resp.StatusCode, got, want)
			}
			resp = e.post("/l/chat/completions", "", body)
			readAll(t, resp)
			if resp.StatusCode != 200 || resp.Header.Get("Governor-Clamped") != fmt.Sprintf("max_completion_tokens=%d", fits) {
				t.Errorf("clamped: %d, Governor-Clamped %q", resp.StatusCode, resp.Header.Get("Governor-Clamped"))
			}
			reported, calls := fake.Reported()
			if calls != 1 || reported > 1000 {
				t.Errorf("the provider reported %d tokens in %d calls", reported, calls)
			}
			eventually(t, "the clamped call's settlement", func() bool { return e.used() == reported })
		})
	}
}
