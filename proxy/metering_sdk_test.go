package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/governor-project/governor/internal/testcert"
	"github.com/governor-project/governor/proxy/meter/fakellm"
)

// The official SDKs (openai, @anthropic-ai/sdk; testdata/llmsdk, installed by
// scripts/llmsdk.sh, which ./test.sh runs) against metered rules, reached two
// ways: through base-URL routes (startLLM), and with no configuration at all
// but HTTPS_PROXY and the interception CA (startInterceptedLLM). Without
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
// it prints, and returns the lines. env is added to e's.
func (e *llmEnv) sdk(t *testing.T, node, scenario string, onLine func(string), env ...string) []string {
	t.Helper()
	lines, err := e.runSDK(node, scenario, onLine, env...)
	if err != nil {
		t.Fatal(err)
	}
	return lines
}

func (e *llmEnv) runSDK(node, scenario string, onLine func(string), env ...string) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "sdk.mjs", scenario)
	cmd.Dir = llmsdkDir
	cmd.Env = append(append(sdkEnviron(), e.sdkEnv...), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
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
		return nil, fmt.Errorf("node sdk.mjs %s: %v\n%s", scenario, err, stderr.String())
	}
	return lines, nil
}

// sdkEnviron is the machine's environment without what would configure the
// SDKs or Node: each test says what they get.
func sdkEnviron() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch u := strings.ToUpper(k); {
		case u == "HTTP_PROXY", u == "HTTPS_PROXY", u == "NO_PROXY", u == "ALL_PROXY",
			strings.HasPrefix(u, "OPENAI_"), strings.HasPrefix(u, "ANTHROPIC_"), strings.HasPrefix(u, "NODE_"):
			continue
		}
		env = append(env, kv)
	}
	return env
}

// startInterceptedLLM is startLLM without routes: the SDKs are given no base
// URL, and call https://api.openai.com and https://api.anthropic.com as
// they do by default. The sidecar's resolver gives both names a loopback
// address of their own, where the fake provider serves them over TLS on
// port 443, the port those URLs name; http.intercept lists them. The SDKs'
// environment is what a worker's would be: HTTPS_PROXY (sdkProxy), the
// interception CA in NODE_EXTRA_CA_CERTS, and env-proxy.cjs preloaded by
// NODE_OPTIONS, since Node 20's fetch ignores HTTPS_PROXY.
func startInterceptedLLM(t *testing.T, tokens int64, fake *fakellm.Provider) *llmEnv {
	t.Helper()
	srv := startGovernord(t, nil)
	ln := listen443(t)
	names := []string{"api.openai.com", "api.anthropic.com"}
	cert := testcert.New(t, names...)
	up := httptest.NewUnstartedServer(fake)
	up.Listener.Close()
	up.Listener = ln
	up.TLS = &tls.Config{Certificates: []tls.Certificate{cert.TLS}}
	up.StartTLS()
	t.Cleanup(up.Close)
	ip, _, _ := net.SplitHostPort(ln.Addr().String())
	caCert, caKey, _ := caFiles(t)
	p := startProxy(t, proxyOpts{gaddr: srv.Addr(), yaml: interceptYAML(caCert, caKey, cert.CertFile, names...) + fmt.Sprintf(`
task: {name: pod-7, quotas: {tokens: %d}}
rules:
  - {name: anthropic, match: {host: api.anthropic.com, path: /v1/messages, method: POST}, class: llm, meter: anthropic}
  - {name: openai, match: {host: api.openai.com, path: /v1, method: POST}, class: llm, meter: {api: openai, reserve: 1000}}
`, tokens), opts: func(o *Options) { o.Resolver = hosts{names[0]: ip, names[1]: ip} }})
	preload, err := filepath.Abs(filepath.Join(llmsdkDir, "env-proxy.cjs"))
	if err != nil {
		t.Fatal(err)
	}
	e := &llmEnv{t: t, fake: fake, p: p, adm: newAdmin(t, srv.Addr()), intercepted: true}
	e.sdkEnv = []string{"OPENAI_API_KEY=sk-test", "ANTHROPIC_API_KEY=sk-ant-test", "NODE_EXTRA_CA_CERTS=" + caCert,
		"NODE_OPTIONS=--require=" + preload, e.sdkProxy("")}
	return e
}

// sdkProxy is the HTTPS_PROXY that names subtask. undici sends the
// credentials of a proxy URL only when it has both a username and a
// password: a password is given, which the sidecar ignores unless
// http.password is set.
func (e *llmEnv) sdkProxy(subtask string) string {
	u := &url.URL{Scheme: "http", Host: e.p.Addr()}
	if subtask != "" {
		u.User = url.UserPassword(subtask, "x")
	}
	return "HTTPS_PROXY=" + u.String()
}

// listen443 listens on port 443 of a loopback address no other test uses:
// 127.0.0.0/8 is loopback on Linux, and a random address in it is this
// test's as a port of :0 would be. Port 443 is below 1024: the test needs
// root, CAP_NET_BIND_SERVICE or net.ipv4.ip_unprivileged_port_start <= 443
// (a container's default).
func listen443(t *testing.T) net.Listener {
	t.Helper()
	var err error
	for range 20 {
		addr := fmt.Sprintf("127.%d.%d.%d:443", 1+rand.IntN(254), rand.IntN(256), 1+rand.IntN(254))
		var ln net.Listener
		if ln, err = net.Listen("tcp", addr); err == nil {
			return ln
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	msg := fmt.Sprintf("cannot serve the fake provider on port 443, where an SDK with no base URL calls: %v "+
		"(run as root, or with net.ipv4.ip_unprivileged_port_start=443)", err)
	if os.Getenv("GOVERNOR_TEST_LLMSDK") == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return nil
}

// sdkWays are the two ways the SDKs reach the provider through the sidecar.
var sdkWays = []struct {
	name  string
	start func(t *testing.T, tokens int64, fake *fakellm.Provider) *llmEnv
}{
	{"route", func(t *testing.T, tokens int64, fake *fakellm.Provider) *llmEnv { return startLLM(t, tokens, fake) }},
	{"intercepted", startInterceptedLLM},
}

// checkIntercepted fails t unless e's SDKs reached the provider through
// intercepted tunnels: at least one handshake with the sidecar's CA, and
// none refused.
func (e *llmEnv) checkIntercepted(t *testing.T) {
	t.Helper()
	if !e.intercepted {
		return
	}
	if ok := e.p.metric(`governor_proxy_intercept_handshakes_total{reason="ok"}`); ok < 1 {
		t.Errorf("%v intercepted handshakes", ok)
	}
	if n := e.p.metric(`governor_proxy_intercept_handshakes_total{reason="client_refused_certificate"}`); n != 0 {
		t.Errorf("%v handshakes refused the sidecar's certificate", n)
	}
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

// With no base URL, three sub-agents, one process each whose HTTPS_PROXY
// names it, make every kind of call, JSON and streamed, straight to the
// providers' hosts through intercepted tunnels: the tokens charged are
// exactly those the provider reported, each agent charged its own.
func TestSDKsInterceptedChargedExactlyTheirUsage(t *testing.T) {
	node := needSDKs(t)
	e := startInterceptedLLM(t, 1_000_000, &fakellm.Provider{})
	agents := []string{"agent-0", "agent-1", "agent-2"}
	said := make([][]string, len(agents))
	errs := make([]error, len(agents))
	var wg sync.WaitGroup
	for i, agent := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			said[i], errs[i] = e.runSDK(node, "exact", nil, "AGENTS="+agent, e.sdkProxy(agent))
		}()
	}
	wg.Wait()
	for i := range agents {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if len(said[i]) != 1 || said[i][0] != `{"calls":7}` {
			t.Errorf("%s said %v", agents[i], said[i])
		}
	}
	reported, calls := e.fake.Reported()
	if calls != 21 {
		t.Errorf("the fake reported usage for %d calls, want 21", calls)
	}
	if used := e.used(); used != reported {
		t.Errorf("governord counts %d tokens; the provider reported %d", used, reported)
	}
	for _, agent := range agents {
		if u := e.adm.node("payments", "pod-7", agent).GetUsed()["tokens"]; u == 0 {
			t.Errorf("%s was charged nothing", agent)
		}
	}
	e.checkIntercepted(t)
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

// The SDKs hand out each piece of a stream before the fake sends the next,
// through a route and through an intercepted tunnel: the fake waits on the
// gate, which the test opens only once the SDK has printed what it got.
func TestSDKsStreamIncrementally(t *testing.T) {
	node := needSDKs(t)
	for _, way := range sdkWays {
		t.Run(way.name, func(t *testing.T) {
			gate := make(chan struct{})
			e := way.start(t, 1_000_000, &fakellm.Provider{Gate: gate})
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
			e.checkIntercepted(t)
		})
	}
}

// A call refused for tokens raises the SDK's RateLimitError at once,
// through a route and through an intercepted tunnel alike: the SDKs read
// x-should-retry: false and do not retry.
func TestSDKsDoNotRetryADenial(t *testing.T) {
	node := needSDKs(t)
	for _, way := range sdkWays {
		t.Run(way.name, func(t *testing.T) {
			e := way.start(t, 1000, &fakellm.Provider{})
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
			e.checkIntercepted(t)
		})
	}
}

// The official SDKs' requests under a budget smaller than their estimates
// (OpenAI's with no output limit, so the default reserve of 4096;
// Anthropic's with max_tokens 8192): with on_over_estimate: clamp, each
// goes ahead with its output limit lowered to what the budget can still
// cover, says so in Governor-Clamped, and the budget is never exceeded.
func TestSDKsClampedToWhatIsLeft(t *testing.T) {
	node := needSDKs(t)
	fake := &fakellm.Provider{Output: 500} // each call uses less than it was clamped to
	srv := startGovernord(t, nil)
	up := origin(t, fake, true, false)
	p := startProxy(t, proxyOpts{gaddr: srv.Addr(), tls: certPool(up), yaml: fmt.Sprintf(`
task: {name: pod-7, quotas: {tokens: 3000}}
routes:
  - {prefix: /openai/, upstream: "%[1]s/v1"}
  - {prefix: /anthropic/, upstream: "%[1]s"}
rules:
  - {name: anthropic, match: {path: /v1/messages, method: POST}, class: llm, meter: {api: anthropic, on_over_estimate: clamp}}
  - {name: openai, match: {path: /v1, method: POST}, class: llm, meter: {api: openai, on_over_estimate: clamp}}
`, hostURL(up, "example.com"))})
	base := "http://" + p.Addr()
	e := &llmEnv{t: t, fake: fake, p: p, adm: newAdmin(t, srv.Addr()), base: base, sdkEnv: []string{"SIDECAR=" + base}}
	lines := e.sdk(t, node, "clamp", nil)
	var got struct {
		Clamped []struct {
			API     string
			Clamped string
			Tokens  int64
		}
	}
	if len(lines) != 1 || json.Unmarshal([]byte(lines[0]), &got) != nil || len(got.Clamped) != 2 {
		t.Fatalf("the SDKs printed %q", lines)
	}
	for i, want := range []string{"max_completion_tokens=", "max_tokens="} {
		c := got.Clamped[i]
		if !strings.HasPrefix(c.Clamped, want) || c.Tokens <= 0 {
			t.Errorf("%s: Governor-Clamped %q, %d tokens", c.API, c.Clamped, c.Tokens)
		}
	}
	reported, calls := fake.Reported()
	if calls != 2 || reported > 3000 {
		t.Errorf("the provider reported %d tokens in %d calls under a budget of 3000", reported, calls)
	}
	eventually(t, "the clamped calls' settlement", func() bool { return e.used() == reported })
}
