package sidecar

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/governor-project/governor/sidecar/meter/fakellm"
)

// The official SDKs (openai, @anthropic-ai/sdk; testdata/llmsdk, installed by
// scripts/llmsdk.sh, which ./test.sh runs) against metered routes. Without
// their node_modules these tests skip, unless GOVERNOR_TEST_LLMSDK=1 says
// they must run.

const llmsdkDir = "testdata/llmsdk"

func needSDKs(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	_, statErr := os.Stat(filepath.Join(llmsdkDir, "node_modules", "openai"))
	if err != nil || statErr != nil {
		if os.Getenv("GOVERNOR_TEST_LLMSDK") == "1" {
			t.Fatalf("node (%v) or the SDKs (%v) are missing; run scripts/llmsdk.sh", err, statErr)
		}
		t.Skip("the SDKs are not installed (scripts/llmsdk.sh installs them)")
	}
	return node
}

// sdk runs one scenario of sdk.mjs against e, calling onLine with each line
// it prints, and returns the lines.
func (e *llmEnv) sdk(t *testing.T, node, scenario string, onLine func(string)) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "sdk.mjs", scenario)
	cmd.Dir = llmsdkDir
	cmd.Env = append(os.Environ(), "SIDECAR="+e.base, "HTTP_PROXY=", "HTTPS_PROXY=", "http_proxy=", "https_proxy=")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var lines []string
	sc := bufio.NewScanner(stdout)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if onLine != nil {
			onLine(sc.Text())
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("node sdk.mjs %s: %v\n%s", scenario, err, stderr.String())
	}
	return lines
}

// Three sub-agents make every kind of call with the SDKs, JSON and
// streamed; when all have completed, the tokens charged are exactly those
// the provider reported.
func TestSDKsChargedExactlyTheirUsage(t *testing.T) {
	node := needSDKs(t)
	e := startLLM(t, 1_000_000, &fakellm.Provider{})
	lines := e.sdk(t, node, "exact", nil)
	reported, calls := e.fake.Reported()
	if len(lines) != 1 || lines[0] != fmt.Sprintf(`{"calls":%d}`, calls) || calls != 21 {
		t.Fatalf("the SDKs said %v; the fake reported usage for %d calls", lines, calls)
	}
	if used := e.used(); used != reported {
		t.Errorf("governord counts %d tokens; the provider reported %d", used, reported)
	}
	for _, agent := range []string{"agent-0", "agent-1", "agent-2"} {
		if u := e.adm.node("payments", "pod-7", agent).GetUsed()["tokens"]; u == 0 {
			t.Errorf("%s was charged nothing", agent)
		}
	}
}

// Three sub-agents call until refused, under a budget of 10,000 tokens:
// the budget is never exceeded, every token the provider reported is
// charged exactly, up to the budget's edge, and each refusal is the SDK's
// RateLimitError, raised without a retry.
func TestSDKsHeldToABudget(t *testing.T) {
	node := needSDKs(t)
	const budget = 10_000
	e := startLLM(t, budget, &fakellm.Provider{Output: 150})
	lines := e.sdk(t, node, "budget", nil)
	var got struct {
		Agents []struct {
			Agent, Error, Message string
			Calls, Status         int
		}
	}
	if len(lines) != 1 || json.Unmarshal([]byte(lines[0]), &got) != nil || len(got.Agents) != 3 {
		t.Fatalf("the SDKs said %v", lines)
	}
	succeeded := 0
	for _, a := range got.Agents {
		// The last call is refused as the budget runs out: spent, or with
		// too little left for the call's estimate.
		refused := strings.Contains(a.Message, "quota spent") || strings.Contains(a.Message, "does not fit")
		if a.Error != "RateLimitError" || a.Status != 429 || !refused {
			t.Errorf("%s ended with %s %d %q, want RateLimitError 429 for the quota", a.Agent, a.Error, a.Status, a.Message)
		}
		succeeded += a.Calls
	}
	reported, calls := e.fake.Reported()
	if used := e.used(); used > budget || reported > budget || used != reported {
		t.Errorf("governord counts %d tokens and the provider reported %d; the budget is %d, and every response completed", used, reported, budget)
	}
	// No retries: every request the provider saw succeeded, and the sidecar
	// refused exactly one request per agent.
	if n := e.fake.Requests(); n != int64(succeeded) || calls != int64(succeeded) {
		t.Errorf("the provider saw %d requests and reported %d calls; the agents completed %d", n, calls, succeeded)
	}
	if denied := e.p.metric(`governor_proxy_requests_total{outcome="denied",rule="openai"}`) +
		e.p.metric(`governor_proxy_requests_total{outcome="denied",rule="anthropic"}`); denied != 3 {
		t.Errorf("the sidecar refused %v requests, want 3 (one per agent, no retries)", denied)
	}
	t.Logf("%d calls, %d tokens reported, %d charged of %d", calls, reported, e.used(), budget)
}

// The SDKs hand out each piece of a stream before the fake sends the next:
// the fake waits on the gate, which the test opens only once the SDK has
// printed what it got.
func TestSDKsStreamIncrementally(t *testing.T) {
	node := needSDKs(t)
	gate := make(chan struct{})
	e := startLLM(t, 1_000_000, &fakellm.Provider{Gate: gate})
	t.Cleanup(func() { close(gate) }) // a failed test leaves no stream waiting on it
	open := func(n int) {
		for range n {
			select {
			case gate <- struct{}{}:
			case <-time.After(waitFor):
				t.Errorf("the fake did not ask for its next piece")
			}
		}
	}
	pieces := 0
	e.sdk(t, node, "stream", func(line string) {
		var l struct {
			API, Event string
			Finish     *string
			Done       bool
		}
		json.Unmarshal([]byte(line), &l)
		pieces++
		switch {
		case l.Done, l.Event == "message_stop":
		case l.Finish != nil && *l.Finish == "stop":
			open(2) // the usage chunk the client does not see, then [DONE]
		case l.Event == "content_block_start":
			open(2) // a ping, which the SDK does not hand out, then a delta
		default:
			open(1)
		}
	})
	if pieces != 8+11+1 {
		t.Errorf("the SDKs handed out %d pieces, want 8 chunks, 11 events and the end", pieces)
	}
}

// A call refused for tokens raises the SDK's RateLimitError at once: the
// SDKs read x-should-retry: false and do not retry.
func TestSDKsDoNotRetryADenial(t *testing.T) {
	node := needSDKs(t)
	e := startLLM(t, 1000, &fakellm.Provider{})
	lines := e.sdk(t, node, "deny", nil)
	var got struct {
		Denials []struct {
			Error, Type, Message string
			Status               int
		}
	}
	if len(lines) != 1 || json.Unmarshal([]byte(lines[0]), &got) != nil || len(got.Denials) != 2 {
		t.Fatalf("the SDKs said %v", lines)
	}
	for _, d := range got.Denials {
		if d.Error != "RateLimitError" || d.Status != 429 {
			t.Errorf("a denial raised %+v", d)
		}
	}
	if denied := e.p.metric(`governor_proxy_requests_total{outcome="denied",rule="openai"}`) +
		e.p.metric(`governor_proxy_requests_total{outcome="denied",rule="anthropic"}`); denied != 2 || e.fake.Requests() != 0 {
		t.Errorf("%v requests refused and %d forwarded; want 2 and none (no retries)", denied, e.fake.Requests())
	}
}
