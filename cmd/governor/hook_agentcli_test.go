package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/internal/govtest"
)

// The real agent CLIs (Claude Code and Codex, pinned in
// testdata/agentcli/package-lock.json and installed by scripts/agentcli.sh)
// run against a scripted fake model with governor hook installed as their
// PreToolUse hook, the way docs/cli.md tells a user to install it. The
// payloads they send are kept; with -update-hook-payloads they replace
// testdata/hook's, scrubbed of this machine's paths, and without it they
// must have the same fields as those.

var updateHookPayloads = flag.Bool("update-hook-payloads", false, "write the payloads the real agent CLIs send into testdata/hook")

// agentCLI is the path of an installed agent CLI; without it the test
// skips, unless GOVERNOR_TEST_AGENTCLI=1 (test.sh) says it must be there.
func agentCLI(t *testing.T, name string) string {
	t.Helper()
	bin, err := filepath.Abs(filepath.Join("testdata/agentcli/node_modules/.bin", name))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(bin); err != nil {
		if os.Getenv("GOVERNOR_TEST_AGENTCLI") == "1" {
			t.Fatalf("%s is not installed: %v (scripts/agentcli.sh installs it)", name, err)
		}
		t.Skipf("%s is not installed (scripts/agentcli.sh installs it)", name)
	}
	return bin
}

// agentRig is one agent CLI's world: governord, the fake model, a home and a
// project directory of its own, and a hook command that keeps each payload
// it is given before it hands it to governor hook.
type agentRig struct {
	home, project, captured string
	hookCmd                 string
	modelURL                string
	govAddr                 string
	admin                   governorpb.GovernorClient
	model                   *scriptedModel
}

func newAgentRig(t *testing.T, model *scriptedModel, hookArgs ...string) *agentRig {
	t.Helper()
	governorBin := buildCLI(t)
	srv := govtest.Start(t, nil)
	r := &agentRig{home: realDir(t), project: realDir(t), captured: realDir(t), model: model,
		govAddr: srv.Addr(), admin: adminRPC(t, srv.Addr())}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: model, ReadHeaderTimeout: time.Minute}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { _ = hs.Close() })
	r.modelURL = "http://" + ln.Addr().String()

	// The wrapper keeps the payload in a file of its own, then runs the hook
	// on it: what the CLI sees is governor hook's answer and exit code.
	r.hookCmd = filepath.Join(realDir(t), "hook.sh")
	script := "#!/bin/sh\nf=$(mktemp " + shellQuote(filepath.Join(r.captured, "payload-XXXXXXXX")) + ") || exit 2\ncat > \"$f\" || exit 2\nexec " +
		shellQuote(governorBin) + " hook"
	for _, a := range hookArgs {
		script += " " + shellQuote(a)
	}
	script += " < \"$f\"\n"
	if err := os.WriteFile(r.hookCmd, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return r
}

// realDir is a temporary directory by the path the CLIs will report.
func realDir(t *testing.T) string {
	t.Helper()
	d, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// docMatcher is the matcher docs/cli.md's settings snippet gives the
// agent's PreToolUse hook (the first JSON block under "### Settings" is
// Claude Code's, the second Codex's): the tests install the hook as a user
// following the docs would.
func docMatcher(t *testing.T, agent string) string {
	t.Helper()
	doc, err := os.ReadFile("../../docs/cli.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(doc), "## governor hook\n")
	_, section, _ = strings.Cut(section, "### Settings\n")
	section, _, _ = strings.Cut(section, "\n### ")
	blocks := strings.Split(section, "```json\n")
	want := map[string]int{"claude": 1, "codex": 2}[agent]
	if len(blocks) <= want {
		t.Fatalf("docs/cli.md's hook settings have %d JSON blocks, want Claude Code's and Codex's", len(blocks)-1)
	}
	block, _, _ := strings.Cut(blocks[want], "```")
	var settings struct {
		Hooks struct {
			PreToolUse []struct {
				Matcher string `json:"matcher"`
				Hooks   []struct {
					Command string `json:"command"`
				} `json:"hooks"`
			} `json:"PreToolUse"`
		} `json:"hooks"`
	}
	if err := json.Unmarshal([]byte(block), &settings); err != nil {
		t.Fatalf("docs/cli.md's %s settings: %v\n%s", agent, err, block)
	}
	pre := settings.Hooks.PreToolUse
	if len(pre) != 1 || len(pre[0].Hooks) != 1 || !strings.Contains(pre[0].Hooks[0].Command, "governor hook -agent "+agent) {
		t.Fatalf("docs/cli.md's %s settings do not install governor hook -agent %s:\n%s", agent, agent, block)
	}
	return pre[0].Matcher
}

// hooksJSON is the PreToolUse hooks setting, in the form both CLIs read.
func (r *agentRig) hooksJSON(t *testing.T, matcher string) string {
	t.Helper()
	b, err := json.MarshalIndent(map[string]any{"hooks": map[string]any{"PreToolUse": []any{map[string]any{
		"matcher": matcher,
		"hooks":   []any{map[string]any{"type": "command", "command": r.hookCmd, "timeout": 120}},
	}}}}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// run runs the CLI in the project directory with a bounded time, in an
// environment of its own: the rig's home, governord's address and key, and
// extra (the fake model's address, telemetry off).
func (r *agentRig) run(t *testing.T, bin string, extra []string, args ...string) (stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = r.project
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + r.home, "LANG=C.UTF-8", "TERM=dumb", "NO_COLOR=1",
		"GOVERNOR_ADDR=" + r.govAddr, "GOVERNOR_API_KEY=" + govtest.TenantKey}, extra...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %v: %v\nstdout:\n%s\nstderr:\n%s\nthe model saw:\n%s", filepath.Base(bin), args, err, out.String(), errOut.String(), r.model.Requests())
	}
	return out.String(), errOut.String()
}

// capturedPayload is one payload the hook was given.
type capturedPayload struct {
	raw []byte
	hookPayload
}

// payloads are the payloads the hook was given, by tool_use_id.
func (r *agentRig) payloads(t *testing.T) map[string]capturedPayload {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(r.captured, "payload-*"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]capturedPayload{}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var p capturedPayload
		if err := json.Unmarshal(raw, &p.hookPayload); err != nil {
			t.Fatalf("%s: %v: %s", f, err, raw)
		}
		if _, dup := out[p.ToolUseID]; dup {
			t.Fatalf("two payloads for %q", p.ToolUseID)
		}
		p.raw = raw
		out[p.ToolUseID] = p
	}
	return out
}

// checkPayloads checks that the hook was given a PreToolUse payload of
// session for each call in want (tool_use_id to tool_name) and no other.
func checkPayloads(t *testing.T, got map[string]capturedPayload, session string, want map[string]string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("the hook was given %d payloads, want %d: %v", len(got), len(want), slices.Sorted(maps.Keys(got)))
	}
	for id, tool := range want {
		p, ok := got[id]
		if !ok || p.SessionID != session || p.HookEventName != "PreToolUse" || p.ToolName != tool || len(p.ToolInput) == 0 {
			t.Fatalf("payload of %s: %s; want session %s, PreToolUse, tool %s", id, p.raw, session, tool)
		}
	}
}

// scrub replaces the rig's directories in a payload with a user's, and
// indents it.
func (r *agentRig) scrub(t *testing.T, raw []byte) []byte {
	t.Helper()
	// Claude Code names a project's transcript folder after its path, every
	// character but letters and digits a dash.
	dashed := regexp.MustCompile(`[^A-Za-z0-9]`)
	s := string(raw)
	s = strings.ReplaceAll(s, dashed.ReplaceAllString(r.project, "-"), "-home-dev-shop")
	s = strings.ReplaceAll(s, r.project, "/home/dev/shop")
	s = strings.ReplaceAll(s, r.home, "/home/dev")
	if strings.Contains(s, os.TempDir()) || strings.Contains(s, t.Name()) {
		t.Fatalf("a payload still names this machine's paths after scrubbing: %s", s)
	}
	var out bytes.Buffer
	if err := json.Indent(&out, []byte(s), "", "  "); err != nil {
		t.Fatal(err)
	}
	out.WriteByte('\n')
	return out.Bytes()
}

// keepPayload writes a captured payload to testdata/hook with
// -update-hook-payloads, and otherwise checks that the one there has the
// same fields (at the top and in tool_input) as the CLI sends today.
func (r *agentRig) keepPayload(t *testing.T, p capturedPayload, file string) {
	t.Helper()
	scrubbed := r.scrub(t, p.raw)
	path := filepath.Join("testdata/hook", file)
	if *updateHookPayloads {
		if err := os.WriteFile(path, scrubbed, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	kept, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test -run %s -update-hook-payloads writes it)", err, t.Name())
	}
	if got, want := payloadFields(t, scrubbed), payloadFields(t, kept); !slices.Equal(got, want) {
		t.Fatalf("the CLI's payload has fields %v, %s has %v: run go test -run %s -update-hook-payloads and check hook.go reads it",
			got, path, want, t.Name())
	}
}

// payloadFields lists a payload's top-level fields and tool_input's.
func payloadFields(t *testing.T, raw []byte) []string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	var in map[string]json.RawMessage
	_ = json.Unmarshal(m["tool_input"], &in)
	var out []string
	for k := range m {
		out = append(out, k)
	}
	for k := range in {
		out = append(out, "tool_input."+k)
	}
	slices.Sort(out)
	return out
}

// used is what an agent session's node has spent.
func (r *agentRig) used(t *testing.T, session string) map[string]int64 {
	t.Helper()
	return runUsed(t, r.admin, govtest.Tenant+"/"+nodeName("agent-", session))
}

// claudeResult is the part of `claude -p --output-format json`'s result
// the test reads.
type claudeResult struct {
	SessionID         string `json:"session_id"`
	IsError           bool   `json:"is_error"`
	TerminalReason    string `json:"terminal_reason"`
	PermissionDenials []struct {
		ToolName  string `json:"tool_name"`
		ToolUseID string `json:"tool_use_id"`
	} `json:"permission_denials"`
}

// claudeRig is an agentRig for Claude Code: the hook in the project's
// .claude/settings.json (with the matcher docs/cli.md gives) and the fake
// model as its API. Its run function runs `claude` with args and the
// options every run has, and reads its JSON result.
func claudeRig(t *testing.T, model *scriptedModel, hookArgs ...string) (*agentRig, func(t *testing.T, args ...string) (claudeResult, string)) {
	t.Helper()
	bin := agentCLI(t, "claude")
	r := newAgentRig(t, model, hookArgs...)
	writeFile(t, filepath.Join(r.project, ".claude", "settings.json"), r.hooksJSON(t, docMatcher(t, "claude")))
	env := []string{"ANTHROPIC_BASE_URL=" + r.modelURL, "ANTHROPIC_API_KEY=sk-ant-fake-for-tests",
		// Nothing but the model's requests leave the CLI.
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1", "DISABLE_TELEMETRY=1", "DISABLE_AUTOUPDATER=1",
		"DISABLE_ERROR_REPORTING=1", "DISABLE_BUG_COMMAND=1"}
	return r, func(t *testing.T, args ...string) (claudeResult, string) {
		t.Helper()
		out, _ := r.run(t, bin, env, append(args, "--output-format", "json", "--allowedTools", "Bash", "--max-turns", "10")...)
		var res claudeResult
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			t.Fatalf("claude's result %q: %v", out, err)
		}
		return res, out
	}
}

// Claude Code runs with the hook in its project settings and a budget of 2
// tool calls and no subagents. The model asks for a subagent (refused, and
// it is told why in the tool result, and the run goes on), two shell calls
// (allowed, they run) and a third (refused with "continue": false: Claude
// Code ends the run and reports it as stopped by the hook). Resumed, the
// session is the same agent session: the model is given the refusal, asks
// again, and is refused again without a second budget.
func TestHookInClaudeCode(t *testing.T) {
	model := newScriptedModel("Agent", "Bash", "Bash", "Bash", "Bash")
	r, claude := claudeRig(t, model, "-agent", "claude", "-max-calls", "2", "-max-subagents", "0")

	res, out := claude(t, "-p", agentPrompt)
	// (Its result names the Agent tool by its old name, Task; the hook is
	// given Agent.)
	var denied []string
	for _, d := range res.PermissionDenials {
		denied = append(denied, d.ToolUseID)
	}
	if res.SessionID == "" || res.IsError || res.TerminalReason != "hook_stopped" ||
		!slices.Equal(denied, []string{"toolu_call_fake_1", "toolu_call_fake_4"}) {
		t.Fatalf("claude's result %s; want the run stopped by the hook after denying the Agent call and the third Bash call", out)
	}
	session := res.SessionID
	checkPayloads(t, r.payloads(t), session, map[string]string{"toolu_call_fake_1": "Agent",
		"toolu_call_fake_2": "Bash", "toolu_call_fake_3": "Bash", "toolu_call_fake_4": "Bash"})
	results := model.Results()
	if len(results) != 3 || model.Asked() != 4 {
		t.Fatalf("the model asked for %d calls and got %d results back, want 4 and 3 (the run ends at the refusal): %+v", model.Asked(), len(results), results)
	}
	if !results[0].IsError || !strings.Contains(results[0].Content, "Governor: this agent session may start no more subagents (0 of 0 used)") {
		t.Fatalf("the refused subagent's result: %+v", results[0])
	}
	for _, res := range results[1:] {
		if res.IsError || strings.TrimSpace(res.Content) != "hi" {
			t.Fatalf("an allowed call's result: %+v, want hi", res)
		}
	}
	if got := r.used(t, session); got[resourceToolCalls] != 2 || got[resourceSubagents] != 0 {
		t.Fatalf("the session's node used %v, want 2 tool calls and no subagents", got)
	}
	payloads := r.payloads(t)
	r.keepPayload(t, payloads["toolu_call_fake_2"], "claude-pretooluse-bash.json")
	r.keepPayload(t, payloads["toolu_call_fake_1"], "claude-pretooluse-agent.json")

	// Resumed: the model now reads the refusal that ended the run, asks for
	// one more call, and the same session's spent budget refuses it.
	res, out = claude(t, "-p", "Go on.", "--resume", session)
	if res.SessionID != session || res.TerminalReason != "hook_stopped" {
		t.Fatalf("the resumed run's result %s; want session %s stopped by the hook", out, session)
	}
	results = model.Results()
	if len(results) != 4 || !results[3].IsError || results[3].CallID != "toolu_call_fake_4" ||
		!strings.Contains(results[3].Content, "Governor: the budget for tool_calls is spent (2 of 2") || !strings.Contains(results[3].Content, "Stop now") {
		t.Fatalf("the results the model got back: %+v; want the fourth the refusal with its reason", results)
	}
	if len(r.payloads(t)) != 5 || model.Asked() != 5 {
		t.Fatalf("after the resume the hook saw %d calls and the model asked for %d, want 5 and 5", len(r.payloads(t)), model.Asked())
	}
	if got := r.used(t, session); got[resourceToolCalls] != 2 {
		t.Fatalf("after the resume the session's node used %v, want still 2 tool calls", got)
	}
}

// A Claude Code subagent's tool calls are the session's: the hook is given
// them with the session's id (and the subagent's agent_id), so they spend
// the session's budget. With 3 calls and 1 subagent: the Agent call (1)
// starts a subagent, which waits for it; the subagent's two shell calls (2,
// 3) run; the agent's own shell call after it is refused, the budget spent.
func TestHookInClaudeCodeSubagent(t *testing.T) {
	model := newScriptedModel("Agent", "Bash")
	model.SubSteps = []string{"Bash", "Bash"}
	r, claude := claudeRig(t, model, "-agent", "claude", "-max-calls", "3", "-max-subagents", "1")
	res, out := claude(t, "-p", agentPrompt)
	if res.SessionID == "" || res.TerminalReason != "hook_stopped" {
		t.Fatalf("claude's result %s; want the run stopped by the hook", out)
	}
	payloads := r.payloads(t)
	checkPayloads(t, payloads, res.SessionID, map[string]string{"toolu_call_fake_1": "Agent",
		"toolu_call_sub_1": "Bash", "toolu_call_sub_2": "Bash", "toolu_call_fake_2": "Bash"})
	for id, p := range payloads {
		var who struct {
			AgentID   string `json:"agent_id"`
			AgentType string `json:"agent_type"`
		}
		if err := json.Unmarshal(p.raw, &who); err != nil {
			t.Fatal(err)
		}
		if sub := strings.HasPrefix(id, "toolu_call_sub_"); sub != (who.AgentID != "") || sub != (who.AgentType == "general-purpose") {
			t.Fatalf("payload of %s: %s; want agent_id and agent_type exactly on the subagent's calls", id, p.raw)
		}
	}
	results := map[string]toolResult{}
	for _, res := range model.Results() {
		results[res.CallID] = res
	}
	for _, id := range []string{"toolu_call_sub_1", "toolu_call_sub_2"} {
		if res := results[id]; res.IsError || strings.TrimSpace(res.Content) != "hi" {
			t.Fatalf("the subagent's call %s: %+v, want hi", id, res)
		}
	}
	if got := r.used(t, res.SessionID); got[resourceToolCalls] != 3 || got[resourceSubagents] != 1 {
		t.Fatalf("the session's node used %v, want 3 tool calls (1 of them the subagent's start, 2 the subagent's) and 1 subagent", got)
	}
	if len(res.PermissionDenials) != 1 || res.PermissionDenials[0].ToolUseID != "toolu_call_fake_2" {
		t.Fatalf("claude's result %s; want the agent's own shell call refused", out)
	}
	r.keepPayload(t, payloads["toolu_call_sub_1"], "claude-pretooluse-subagent-bash.json")
}

// codexRig is an agentRig for Codex: the hook in ~/.codex/hooks.json (with
// the matcher docs/cli.md gives) and the fake model as its provider.
func codexRig(t *testing.T, model *scriptedModel, hookArgs ...string) (r *agentRig, bin string, env []string) {
	t.Helper()
	bin = agentCLI(t, "codex")
	r = newAgentRig(t, model, hookArgs...)
	codexHome := filepath.Join(r.home, ".codex")
	writeFile(t, filepath.Join(codexHome, "hooks.json"), r.hooksJSON(t, docMatcher(t, "codex")))
	writeFile(t, filepath.Join(codexHome, "config.toml"), `model = "gpt-fake"
model_provider = "fake"
check_for_update_on_startup = false

[model_providers.fake]
name = "fake"
base_url = "`+r.modelURL+`/v1"
env_key = "FAKE_OPENAI_API_KEY"
wire_api = "responses"

[analytics]
enabled = false

# Plugins and apps are synced from GitHub on start: off, so that nothing
# but the model's requests leaves the CLI.
[features]
plugins = false
remote_plugin = false
apps = false
`)
	return r, bin, []string{"CODEX_HOME=" + codexHome, "FAKE_OPENAI_API_KEY=sk-fake-for-tests"}
}

// codexExec's arguments, before the prompt. --strict-config refuses a
// config key this Codex does not know.
var codexExec = []string{"exec", "--strict-config", "--skip-git-repo-check", "--sandbox", "danger-full-access", "--json"}

// Codex runs `codex exec` with the hook in ~/.codex/hooks.json and a budget
// of 2 tool calls and no subagents. The model asks for a subagent (blocked:
// exit 2, the reason on stderr, which the model is given as the call's
// output), then three shell calls: two run, the third is blocked with the
// reason to stop, and the model finishes.
func TestHookInCodex(t *testing.T) {
	model := newScriptedModel("spawn_agent", "Bash", "Bash", "Bash")
	r, codex, env := codexRig(t, model, "-agent", "codex", "-max-calls", "2", "-max-subagents", "0")
	// Codex runs a hook only once it is trusted (its /hooks screen); a run
	// with no terminal trusts it with --dangerously-bypass-hook-trust.
	out, _ := r.run(t, codex, env, append(codexExec, "--dangerously-bypass-hook-trust", agentPrompt)...)

	session, ran, final := codexEvents(t, out)
	if session == "" || ran != 2 || final != scriptedFinal {
		t.Fatalf("codex's events:\n%s\nwant a thread, 2 commands run and the final message", out)
	}
	checkPayloads(t, r.payloads(t), session, map[string]string{"call_fake_1": "spawn_agent",
		"call_fake_2": "Bash", "call_fake_3": "Bash", "call_fake_4": "Bash"})
	results := model.Results()
	if len(results) != 4 || model.Asked() != 4 {
		t.Fatalf("the model asked for %d calls and got %d results back, want 4 and 4: %+v", model.Asked(), len(results), results)
	}
	// Codex quotes the reason as "<reason>. Tool: <name>" (or ". Command:
	// <command>"): the hook leaves its own full stop off.
	const noSubagents = "Tool call blocked by PreToolUse hook: Governor: this agent session may start no more subagents (0 of 0 used). Do the rest yourself, without starting subagents. Tool: spawn_agent"
	if res := results[0]; res.CallID != "call_fake_1" || res.Content != noSubagents {
		t.Fatalf("the blocked subagent's output: %+v; want %q", res, noSubagents)
	}
	for _, res := range results[1:3] {
		if !strings.Contains(res.Content, "Output:\nhi") {
			t.Fatalf("an allowed call's output: %+v", res)
		}
	}
	const blocked = "Command blocked by PreToolUse hook: Governor: the budget for tool_calls is spent (2 of 2"
	if res := results[3]; res.CallID != "call_fake_4" || !strings.HasPrefix(res.Content, blocked) ||
		!strings.HasSuffix(res.Content, "tell the user what is done and what is left. Command: echo hi") {
		t.Fatalf("the blocked call's output: %+v; want Codex's block message with the hook's reason", res)
	}
	if got := r.used(t, session); got[resourceToolCalls] != 2 || got[resourceSubagents] != 0 {
		t.Fatalf("the session's node used %v, want 2 tool calls and no subagents", got)
	}
	payloads := r.payloads(t)
	r.keepPayload(t, payloads["call_fake_2"], "codex-pretooluse-bash.json")
	r.keepPayload(t, payloads["call_fake_1"], "codex-pretooluse-spawn-agent.json")
}

// A Codex subagent's tool calls are the session's, as in Claude Code: the
// hook is given them with the session's id (and the subagent's agent_id).
// With 4 calls and 1 subagent: spawn_agent (1) and wait_agent (2), the
// subagent's two shell calls (3, 4), and the agent's own shell call after
// the wait is refused, the budget spent.
func TestHookInCodexSubagent(t *testing.T) {
	model := newScriptedModel("spawn_agent", "wait_agent", "Bash")
	model.SubSteps = []string{"Bash", "Bash"}
	r, codex, env := codexRig(t, model, "-agent", "codex", "-max-calls", "4", "-max-subagents", "1")
	out, _ := r.run(t, codex, env, append(codexExec, "--dangerously-bypass-hook-trust", agentPrompt)...)
	session, ran, final := codexEvents(t, out)
	if session == "" || final != scriptedFinal {
		t.Fatalf("codex's events:\n%s\nwant a thread and the final message", out)
	}
	payloads := r.payloads(t)
	// (Codex 0.169.0 names wait_agent by its namespace and name run
	// together; spawn_agent by its name.)
	checkPayloads(t, payloads, session, map[string]string{"call_fake_1": "spawn_agent", "call_fake_2": "multi_agent_v1wait_agent",
		"call_sub_1": "Bash", "call_sub_2": "Bash", "call_fake_3": "Bash"})
	for id, p := range payloads {
		var who struct {
			AgentID string `json:"agent_id"`
		}
		if err := json.Unmarshal(p.raw, &who); err != nil {
			t.Fatal(err)
		}
		if sub := strings.HasPrefix(id, "call_sub_"); sub != (who.AgentID != "") {
			t.Fatalf("payload of %s: %s; want an agent_id exactly on the subagent's calls", id, p.raw)
		}
	}
	results := map[string]toolResult{}
	for _, res := range model.Results() {
		results[res.CallID] = res
	}
	for _, id := range []string{"call_sub_1", "call_sub_2"} {
		if !strings.Contains(results[id].Content, "Output:\nhi") {
			t.Fatalf("the subagent's call %s: %+v, want hi", id, results[id])
		}
	}
	if res := results["call_fake_3"]; !strings.HasPrefix(res.Content, "Command blocked by PreToolUse hook: Governor: the budget for tool_calls is spent (4 of 4") {
		t.Fatalf("the agent's own shell call: %+v; want it blocked, the budget spent", res)
	}
	if got := r.used(t, session); got[resourceToolCalls] != 4 || got[resourceSubagents] != 1 {
		t.Fatalf("the session's node used %v, want 4 tool calls and 1 subagent", got)
	}
	_ = ran // the subagent's commands are its own thread's events, not exec's
	r.keepPayload(t, payloads["call_sub_1"], "codex-pretooluse-subagent-bash.json")
}

// A hook Codex has not been told to trust does not run, and `codex exec`
// says nothing about it: every call runs, uncounted. docs/cli.md tells the
// user to trust it.
func TestHookInCodexUntrusted(t *testing.T) {
	model := newScriptedModel("Bash", "Bash", "Bash")
	r, codex, env := codexRig(t, model, "-agent", "codex", "-max-calls", "2")
	out, _ := r.run(t, codex, env, append(codexExec, agentPrompt)...)
	_, ran, _ := codexEvents(t, out)
	if ran != 3 || len(r.payloads(t)) != 0 {
		t.Fatalf("an untrusted hook: %d commands ran and the hook was given %d payloads, want 3 and none\n%s", ran, len(r.payloads(t)), out)
	}
}

// codexEvents reads `codex exec --json`'s events: the session (thread) id,
// the commands that ran (each must have printed hi), and the final message.
func codexEvents(t *testing.T, out string) (session string, ran int, final string) {
	t.Helper()
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var ev struct {
			Type     string `json:"type"`
			ThreadID string `json:"thread_id"`
			Item     struct {
				Type             string `json:"type"`
				AggregatedOutput string `json:"aggregated_output"`
				Text             string `json:"text"`
				ExitCode         *int   `json:"exit_code"`
			} `json:"item"`
		}
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("codex's event %q: %v", line, err)
		}
		switch {
		case ev.Type == "thread.started":
			session = ev.ThreadID
		case ev.Type == "item.completed" && ev.Item.Type == "command_execution":
			if ev.Item.ExitCode == nil || *ev.Item.ExitCode != 0 || ev.Item.AggregatedOutput != "hi\n" {
				t.Fatalf("a command ran with %s", line)
			}
			ran++
		case ev.Type == "item.completed" && ev.Item.Type == "agent_message":
			final = ev.Item.Text
		}
	}
	return session, ran, final
}
