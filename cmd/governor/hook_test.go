package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/internal/govtest"
)

// payload reads a testdata payload (captured from the real CLI by
// hook_agentcli_test.go) and gives it another tool_use_id.
func payload(t *testing.T, file, toolUseID string) string {
	t.Helper()
	return payloadOf(t, file, "", toolUseID)
}

// payloadOf is payload in another session too.
func payloadOf(t *testing.T, file, session, toolUseID string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata/hook", file))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	if toolUseID != "" {
		m["tool_use_id"] = toolUseID
	}
	if session != "" {
		m["session_id"] = session
	}
	out, _ := json.Marshal(m)
	return string(out)
}

// sessionNode is the path of the node of a testdata payload's session.
func sessionNode(t *testing.T, file string) string {
	t.Helper()
	var p hookPayload
	if err := json.Unmarshal([]byte(payload(t, file, "")), &p); err != nil || p.SessionID == "" {
		t.Fatalf("%s: no session_id (%v)", file, err)
	}
	return govtest.Tenant + "/" + nodeName("agent-", p.SessionID)
}

type hookResult struct {
	code           int
	stdout, stderr string
}

func runHook(t *testing.T, stdin string, args ...string) hookResult {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(append([]string{"hook"}, args...), strings.NewReader(stdin), &out, &errOut)
	return hookResult{code, out.String(), errOut.String()}
}

// claudeDecision is Claude Code's PreToolUse JSON answer.
type claudeDecision struct {
	Continue           *bool  `json:"continue"`
	StopReason         string `json:"stopReason"`
	SystemMessage      string `json:"systemMessage"`
	HookSpecificOutput struct {
		HookEventName            string `json:"hookEventName"`
		PermissionDecision       string `json:"permissionDecision"`
		PermissionDecisionReason string `json:"permissionDecisionReason"`
	} `json:"hookSpecificOutput"`
}

func (r hookResult) claude(t *testing.T) claudeDecision {
	t.Helper()
	var d claudeDecision
	if err := json.Unmarshal([]byte(r.stdout), &d); err != nil {
		t.Fatalf("claude answer %q: %v", r.stdout, err)
	}
	return d
}

func (r hookResult) allowed(t *testing.T, what string) {
	t.Helper()
	if r.code != 0 || r.stdout != "" {
		t.Fatalf("%s: exit %d, stdout %q, stderr %q; want allowed (exit 0, nothing printed)", what, r.code, r.stdout, r.stderr)
	}
}

func (r hookResult) claudeDenied(t *testing.T, what string, stop bool, reason string) {
	t.Helper()
	d := r.claude(t)
	if r.code != 0 || d.HookSpecificOutput.HookEventName != "PreToolUse" || d.HookSpecificOutput.PermissionDecision != "deny" ||
		!strings.Contains(d.HookSpecificOutput.PermissionDecisionReason, reason) || (d.Continue != nil && !*d.Continue) != stop {
		t.Fatalf("%s: exit %d, answer %s; want a deny with %q (stop %v)", what, r.code, r.stdout, reason, stop)
	}
}

// runUsed is how much the agent session's node has spent.
func runUsed(t *testing.T, admin governorpb.GovernorClient, path string) map[string]int64 {
	t.Helper()
	n, err := admin.GetNode(context.Background(), &governorpb.GetNodeRequest{Path: path})
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return n.GetUsed()
}

// Real-shaped payloads of both CLIs get the right decision and exit code:
// calls are counted once each, a retry (even across a governord restart)
// is not charged again, a spent budget is refused in each CLI's format, and
// subagents have their own budget.
func TestHookBudgets(t *testing.T) {
	dbPath := filepath.Join(t.TempDir(), "governor.db")
	srv := startDurable(t, dbPath)
	admin := adminRPC(t, srv.Addr())
	t.Setenv("GOVERNOR_API_KEY", govtest.TenantKey)
	claude := []string{"-agent", "claude", "-max-calls", "2", "-max-subagents", "1"}
	run := sessionNode(t, "claude-pretooluse-bash.json")
	if run != sessionNode(t, "claude-pretooluse-agent.json") {
		t.Fatal("claude's two payloads are of two sessions")
	}

	runHook(t, payload(t, "claude-pretooluse-bash.json", ""), claude...).allowed(t, "the first call")
	runHook(t, payload(t, "claude-pretooluse-bash.json", ""), claude...).allowed(t, "its retry")
	if got := runUsed(t, admin, run)[resourceToolCalls]; got != 1 {
		t.Fatalf("after a call and its retry tool_calls is %d, want 1", got)
	}

	// governord restarts; the retry is still known.
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	srv = startDurable(t, dbPath)
	t.Cleanup(func() { srv.Close() })
	admin = adminRPC(t, srv.Addr())
	runHook(t, payload(t, "claude-pretooluse-bash.json", ""), claude...).allowed(t, "the retry after a restart")
	if got := runUsed(t, admin, run)[resourceToolCalls]; got != 1 {
		t.Fatalf("after a retry across a restart tool_calls is %d, want 1", got)
	}

	runHook(t, payload(t, "claude-pretooluse-agent.json", ""), claude...).allowed(t, "a subagent")
	runHook(t, payload(t, "claude-pretooluse-agent.json", "toolu_second_task"), claude...).claudeDenied(t, "a third call", true, "budget for tool_calls is spent (2 of 2")
	if got := runUsed(t, admin, run); got[resourceToolCalls] != 2 || got[resourceSubagents] != 1 {
		t.Fatalf("used %v, want 2 tool calls and 1 subagent", got)
	}

	// Subagents run out before calls do: only subagents are refused.
	many := []string{"-agent", "claude", "-max-calls", "10", "-max-subagents", "1"}
	const other = "4a2d3b0f-8b7d-4e2f-9a61-0c5d7e8f9a10"
	runHook(t, payloadOf(t, "claude-pretooluse-agent.json", other, ""), many...).allowed(t, "another session's subagent")
	runHook(t, payloadOf(t, "claude-pretooluse-agent.json", other, "toolu_b"), many...).claudeDenied(t, "its second subagent", false, "may start no more subagents (1 of 1 used)")
	runHook(t, payloadOf(t, "claude-pretooluse-bash.json", other, "toolu_c"), many...).allowed(t, "a plain call after subagents ran out")

	// Codex: exit 2 with the reason on stderr.
	codex := []string{"-agent", "codex", "-max-calls", "1"}
	runHook(t, payload(t, "codex-pretooluse-bash.json", ""), codex...).allowed(t, "codex's first call")
	r := runHook(t, payload(t, "codex-pretooluse-bash.json", "call_second"), codex...)
	if r.code != 2 || r.stdout != "" || !strings.Contains(r.stderr, "budget for tool_calls is spent (1 of 1") || !strings.Contains(r.stderr, "Stop now") {
		t.Fatalf("codex's second call: exit %d, stdout %q, stderr %q; want exit 2 and the reason on stderr", r.code, r.stdout, r.stderr)
	}
	// Codex quotes the reason as "<reason>. Command: ...": it comes without
	// its own full stop.
	if strings.HasSuffix(strings.TrimSpace(r.stderr), ".") {
		t.Fatalf("codex's reason %q ends in a full stop", r.stderr)
	}
	// Codex's subagent tool, spawn_agent, is a subagent.
	const codexOther = "01a233ff-0000-7000-8000-000000000001"
	r = runHook(t, payloadOf(t, "codex-pretooluse-spawn-agent.json", codexOther, ""), "-agent", "codex", "-max-subagents", "0")
	if r.code != 2 || !strings.Contains(r.stderr, "may start no more subagents (0 of 0 used)") {
		t.Fatalf("codex's spawn_agent with no subagents left: exit %d, stderr %q", r.code, r.stderr)
	}
	runHook(t, payloadOf(t, "codex-pretooluse-bash.json", codexOther, ""), "-agent", "codex", "-max-subagents", "0").allowed(t, "a codex call after subagents ran out")
}

// The run's time is the node's deadline on governord's clock: once it has
// passed, every call is refused, and a new node by the same name does not
// give the session a second budget.
func TestHookTimeBudget(t *testing.T) {
	srv := govtest.Start(t, nil)
	t.Setenv("GOVERNOR_ADDR", srv.Addr())
	t.Setenv("GOVERNOR_API_KEY", govtest.TenantKey)
	admin := adminRPC(t, srv.Addr())
	args := []string{"-agent", "claude", "-max-duration", "1h"}
	runHook(t, payload(t, "claude-pretooluse-bash.json", ""), args...).allowed(t, "the first call")
	node, err := admin.GetNode(context.Background(), &governorpb.GetNodeRequest{Path: sessionNode(t, "claude-pretooluse-bash.json")})
	if err != nil {
		t.Fatal(err)
	}
	// Its hour is up (as if): the deadline moves to the past.
	if _, err := admin.SetCaps(context.Background(), &governorpb.SetCapsRequest{NodeId: node.GetId(),
		Deadline: timestamppb.New(time.Now().Add(-time.Second)), Reason: "test: the hour is up"}); err != nil {
		t.Fatal(err)
	}
	for i, id := range []string{"toolu_late_1", "toolu_late_2"} {
		runHook(t, payload(t, "claude-pretooluse-bash.json", id), args...).claudeDenied(t, "a call after the time", true, "time budget is spent")
		_ = i
	}
	r := runHook(t, payload(t, "codex-pretooluse-bash.json", ""), "-agent", "codex", "-max-duration", "1h")
	if r.code != 0 {
		t.Fatalf("another session is not affected: exit %d %s", r.code, r.stderr)
	}
}

// When governord cannot be reached the tool is refused (fail closed) in
// each CLI's format; -warn-only lets it run and says so. A payload the hook
// cannot read is refused too; bad flags exit 2.
func TestHookFailsClosed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	t.Setenv("GOVERNOR_ADDR", addr)
	t.Setenv("GOVERNOR_API_KEY", govtest.TenantKey)
	runHook(t, payload(t, "claude-pretooluse-bash.json", ""), "-agent", "claude", "-timeout", "300ms").
		claudeDenied(t, "claude, governord down", false, "cannot reach governord")
	r := runHook(t, payload(t, "codex-pretooluse-bash.json", ""), "-agent", "codex", "-timeout", "300ms")
	if r.code != 2 || !strings.Contains(r.stderr, "cannot reach governord") {
		t.Fatalf("codex, governord down: exit %d, stderr %q", r.code, r.stderr)
	}
	r = runHook(t, payload(t, "claude-pretooluse-bash.json", ""), "-agent", "claude", "-timeout", "300ms", "-warn-only")
	if d := r.claude(t); r.code != 0 || d.HookSpecificOutput.PermissionDecision != "" || !strings.Contains(d.SystemMessage, "not counted") {
		t.Fatalf("claude, warn-only: exit %d, %s", r.code, r.stdout)
	}
	r = runHook(t, payload(t, "codex-pretooluse-bash.json", ""), "-agent", "codex", "-timeout", "300ms", "-warn-only")
	if r.code != 0 || r.stdout != "" || !strings.Contains(r.stderr, "warn-only") {
		t.Fatalf("codex, warn-only: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	runHook(t, "{not json", "-agent", "claude").claudeDenied(t, "a payload that is not JSON", false, "could not read")
	if r := runHook(t, `{"tool_name":"Bash"}`, "-agent", "codex"); r.code != 2 || !strings.Contains(r.stderr, "no session_id") {
		t.Fatalf("a payload without a session: exit %d %q", r.code, r.stderr)
	}
	for _, args := range [][]string{{}, {"-agent", "gemini"}, {"-agent", "claude", "-max-calls", "0"}, {"-agent", "claude", "extra"}} {
		if r := runHook(t, "{}", args...); r.code != 2 {
			t.Errorf("%v: exit %d, want 2", args, r.code)
		}
	}
}

// A subagent's tool calls, which both CLIs send with the session's id and
// the subagent's agent_id, are charged to the session.
func TestHookSubagentCalls(t *testing.T) {
	srv := govtest.Start(t, nil)
	t.Setenv("GOVERNOR_ADDR", srv.Addr())
	t.Setenv("GOVERNOR_API_KEY", govtest.TenantKey)
	admin := adminRPC(t, srv.Addr())
	for _, c := range []struct{ agent, file string }{{"claude", "claude-pretooluse-subagent-bash.json"}, {"codex", "codex-pretooluse-subagent-bash.json"}} {
		var p struct {
			AgentID string `json:"agent_id"`
		}
		if err := json.Unmarshal([]byte(payload(t, c.file, "")), &p); err != nil || p.AgentID == "" {
			t.Fatalf("%s: no agent_id (%v)", c.file, err)
		}
		runHook(t, payload(t, c.file, ""), "-agent", c.agent).allowed(t, c.file)
		if got := runUsed(t, admin, sessionNode(t, c.file))[resourceToolCalls]; got != 1 {
			t.Fatalf("%s: the session's node used %d tool calls, want 1", c.file, got)
		}
	}
}

// hookBin runs the built governor hook, as an agent CLI does.
func hookBin(t *testing.T, stdin string, args ...string) hookResult {
	t.Helper()
	code, out, errOut := runCLI(t, buildCLI(t), stdin, append([]string{"hook"}, args...)...)
	return hookResult{code, out, errOut}
}

// Each refusal tells the model its own cause: a suspended tenant is told
// that, with the operator's reason, not that its time is up; a session the
// operator ended is told it was ended; a closing tenant refuses a new
// session; and a time budget that is spent is still told as such.
func TestHookSaysEachCause(t *testing.T) {
	srv := govtest.Start(t, nil)
	t.Setenv("GOVERNOR_ADDR", srv.Addr())
	admin := adminRPC(t, srv.Addr())
	claude := []string{"-agent", "claude"}
	t.Setenv("GOVERNOR_API_KEY", govtest.TenantKey)
	hookBin(t, payload(t, "claude-pretooluse-bash.json", ""), claude...).allowed(t, "the first call")

	t.Setenv("GOVERNOR_API_KEY", govtest.AdminKey)
	if code, out, errOut := gov(t, "tenant", "payments", "suspend", "-reason", "incident 42"); code != 0 {
		t.Fatalf("suspend: exit %d\n%s%s", code, out, errOut)
	}
	t.Setenv("GOVERNOR_API_KEY", govtest.TenantKey)
	suspended := `Governor: tenant "payments" is suspended; new work is refused (incident 42), so no tool may run. Stop now`
	for _, file := range []string{"claude-pretooluse-bash.json", "claude-pretooluse-agent.json"} {
		r := hookBin(t, payload(t, file, "toolu_after_suspend"), claude...)
		r.claudeDenied(t, file+" while suspended", true, suspended)
		if strings.Contains(r.stdout, "time budget") {
			t.Fatalf("%s while suspended: told its time is spent: %s", file, r.stdout)
		}
	}
	r := hookBin(t, payload(t, "codex-pretooluse-bash.json", ""), "-agent", "codex")
	if r.code != 2 || !strings.Contains(r.stderr, suspended) || strings.Contains(r.stderr, "time budget") {
		t.Fatalf("codex while suspended: exit %d, stderr %q", r.code, r.stderr)
	}

	t.Setenv("GOVERNOR_API_KEY", govtest.AdminKey)
	if code, out, errOut := gov(t, "tenant", "payments", "close", "-reason", "retiring"); code != 0 {
		t.Fatalf("close: exit %d\n%s%s", code, out, errOut)
	}
	t.Setenv("GOVERNOR_API_KEY", govtest.TenantKey)
	hookBin(t, payloadOf(t, "claude-pretooluse-bash.json", "0f0f0f0f-new-session", ""), claude...).
		claudeDenied(t, "a new session of a closing tenant", true, `tenant "payments" is closing; a new task is refused (retiring)`)

	t.Setenv("GOVERNOR_API_KEY", govtest.AdminKey)
	if code, out, errOut := gov(t, "tenant", "payments", "resume", "-reason", "resolved"); code != 0 {
		t.Fatalf("resume: exit %d\n%s%s", code, out, errOut)
	}
	t.Setenv("GOVERNOR_API_KEY", govtest.TenantKey)
	hookBin(t, payload(t, "claude-pretooluse-bash.json", "toolu_after_resume"), claude...).allowed(t, "a call after the resume")

	// The operator ends the session's node: it was ended, its time is not up.
	run, err := admin.GetNode(context.Background(), &governorpb.GetNodeRequest{Path: sessionNode(t, "claude-pretooluse-bash.json")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CancelNode(context.Background(), &governorpb.CancelNodeRequest{NodeId: run.GetId()}); err != nil {
		t.Fatal(err)
	}
	r = hookBin(t, payload(t, "claude-pretooluse-bash.json", "toolu_after_cancel"), claude...)
	r.claudeDenied(t, "a call after the operator ended the session", true, "this agent session has been ended")
	if strings.Contains(r.stdout, "time budget") {
		t.Fatalf("a cancelled session is told its time is spent: %s", r.stdout)
	}
}

// With governord down, -warn-only lets the tool run and says exactly that:
// its message never tells the model to stop, in either CLI.
func TestHookWarnOnlySaysTheToolRuns(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	t.Setenv("GOVERNOR_ADDR", addr)
	t.Setenv("GOVERNOR_API_KEY", govtest.TenantKey)
	r := hookBin(t, payload(t, "claude-pretooluse-bash.json", ""), "-agent", "claude", "-timeout", "300ms", "-warn-only")
	d := r.claude(t)
	if r.code != 0 || d.HookSpecificOutput.PermissionDecision != "" || d.Continue != nil ||
		!strings.Contains(d.SystemMessage, "cannot reach governord") || !strings.Contains(d.SystemMessage, "-warn-only lets this tool call run, not counted") ||
		strings.Contains(d.SystemMessage, "no tool may run") || strings.Contains(strings.ToLower(d.SystemMessage), "stop") {
		t.Fatalf("claude, warn-only: exit %d, %s", r.code, r.stdout)
	}
	r = hookBin(t, payload(t, "codex-pretooluse-bash.json", ""), "-agent", "codex", "-timeout", "300ms", "-warn-only")
	if r.code != 0 || r.stdout != "" || !strings.Contains(r.stderr, "-warn-only lets this tool call run, not counted") ||
		strings.Contains(r.stderr, "no tool may run") || strings.Contains(strings.ToLower(r.stderr), "stop") {
		t.Fatalf("codex, warn-only: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	// Without -warn-only the refusal still says to stop.
	hookBin(t, payload(t, "claude-pretooluse-bash.json", ""), "-agent", "claude", "-timeout", "300ms").
		claudeDenied(t, "claude, governord down", false, "so no tool may run; stop and tell the user")
}

// With the admin key (scoped to the root) and no -parent, the hook would
// make each agent session a tenant of its own under the root: it refuses,
// saying -parent is required, and makes nothing; with -parent it works.
func TestHookAdminKeyNeedsParent(t *testing.T) {
	srv := govtest.Start(t, nil)
	t.Setenv("GOVERNOR_ADDR", srv.Addr())
	t.Setenv("GOVERNOR_API_KEY", govtest.AdminKey)
	admin := adminRPC(t, srv.Addr())
	for _, args := range [][]string{{"-agent", "claude"}, {"-agent", "claude", "-parent", "/"}} {
		r := hookBin(t, payload(t, "claude-pretooluse-bash.json", ""), args...)
		if r.code == 0 && r.stdout == "" {
			t.Fatalf("the admin key with %v: the call was let through, its session's node made under the root", args)
		}
		r.claudeDenied(t, fmt.Sprintf("the admin key with %v", args), false, "its key is the admin key, scoped to the root, so -parent is required")
	}
	r := hookBin(t, payload(t, "codex-pretooluse-bash.json", ""), "-agent", "codex")
	if r.code != 2 || !strings.Contains(r.stderr, "-parent is required") {
		t.Fatalf("codex with the admin key: exit %d, stderr %q", r.code, r.stderr)
	}
	kids, err := admin.ListChildren(context.Background(), &governorpb.ListChildrenRequest{NodeId: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kids.GetNodes() {
		if k.GetName() != govtest.Tenant {
			t.Fatalf("the refused hook calls made %q under the root", k.GetName())
		}
	}
	if code, out, _ := gov(t, "usage", "-by", "tenant"); code != 0 || strings.Contains(out, "agent-") {
		t.Fatalf("usage -by tenant: exit %d\n%s", code, out)
	}
	hookBin(t, payload(t, "claude-pretooluse-bash.json", ""), "-agent", "claude", "-parent", "payments").allowed(t, "the admin key with -parent payments")
	if got := runUsed(t, admin, sessionNode(t, "claude-pretooluse-bash.json"))[resourceToolCalls]; got != 1 {
		t.Fatalf("the session under payments spent %d tool calls, want 1", got)
	}
}

// Agent sessions run with -max-subagents 0 have a subagents quota of 0 by
// design: doctor says so once, as fine, instead of warning that each
// admits nothing; a 0 on any other node is still a warning.
func TestDoctorKnowsHookSessions(t *testing.T) {
	srv := govtest.Start(t, nil)
	t.Setenv("GOVERNOR_ADDR", srv.Addr())
	t.Setenv("GOVERNOR_API_KEY", govtest.TenantKey)
	for _, session := range []string{"11111111-aaaa", "22222222-bbbb"} {
		hookBin(t, payloadOf(t, "claude-pretooluse-bash.json", session, ""), "-agent", "claude", "-max-subagents", "0").allowed(t, session)
	}
	code, out, errOut := gov(t, "doctor")
	if code != 0 || strings.Contains(out, "it admits nothing") ||
		!strings.Contains(out, "OK    caps         2 agent sessions of governor hook may start no subagents (-max-subagents 0)") {
		t.Fatalf("doctor over two hook sessions: exit %d\n%s%s", code, out, errOut)
	}
	if _, err := adminRPC(t, srv.Addr()).CreateNode(context.Background(), &governorpb.CreateNodeRequest{ParentId: 2,
		Spec: &governorpb.NodeSpec{Name: "agent-by-hand", Quotas: map[string]int64{resourceSubagents: 0}}}); err != nil {
		t.Fatal(err)
	}
	if code, out, _ := gov(t, "doctor"); code != 1 || !strings.Contains(out, "payments/agent-by-hand: quota subagents is 0: it admits nothing") {
		t.Fatalf("doctor over a node with a zero cap the hook did not make: exit %d\n%s", code, out)
	}
}
