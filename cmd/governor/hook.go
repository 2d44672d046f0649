package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/proxy/admission"
)

const hookUsage = `usage: governor hook -agent claude|codex [-max-calls N] [-max-subagents N] [-max-duration D] [-parent NODE] [-warn-only]

A PreToolUse hook for Claude Code and Codex: it reads the hook's JSON on
stdin and lets the tool run (exit 0, nothing printed) or refuses it in the
agent's own format. Each agent session is a node below -parent (default:
the key's tenant) named after its session id, created with the budgets on
its first call; each tool call charges tool_calls 1 (and subagents 1 when it
starts a subagent) through a node named after the call, so a retried hook
call, even across a governord restart, is charged once. The run's time
budget is the node's deadline, on governord's clock. When governord cannot
be reached the tool is refused, unless -warn-only. See docs/cli.md.

flags:
`

// The resources a hook charges.
const (
	resourceToolCalls = "tool_calls"
	resourceSubagents = "subagents"
)

// hookPayload is the part of the PreToolUse input the hook reads: Claude
// Code's and Codex's share these fields (code.claude.com/docs/en/hooks,
// developers.openai.com/codex/hooks).
type hookPayload struct {
	SessionID     string          `json:"session_id"`
	TurnID        string          `json:"turn_id"`
	HookEventName string          `json:"hook_event_name"`
	ToolName      string          `json:"tool_name"`
	ToolUseID     string          `json:"tool_use_id"`
	ToolInput     json.RawMessage `json:"tool_input"`
}

type hookOptions struct {
	agent         string
	maxCalls      int64
	maxSubagents  int64
	maxDuration   time.Duration
	parent        string
	warnOnly      bool
	timeout       time.Duration
	subagentTools []string
}

func hook(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("governor hook", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, hookUsage); fs.PrintDefaults() }
	var o hookOptions
	fs.StringVar(&o.agent, "agent", "", "claude or codex: whose hook contract to answer in (required)")
	fs.Int64Var(&o.maxCalls, "max-calls", 200, "the most tool calls a session may make")
	fs.Int64Var(&o.maxSubagents, "max-subagents", 10, "the most subagents a session may start")
	fs.DurationVar(&o.maxDuration, "max-duration", 2*time.Hour, "how long a session may keep going after its first tool call")
	fs.StringVar(&o.parent, "parent", "", "the node sessions go below (id or path); default the key's tenant")
	fs.BoolVar(&o.warnOnly, "warn-only", false, "when governord cannot be reached, let the tool run and say so (default: refuse it)")
	fs.DurationVar(&o.timeout, "timeout", 5*time.Second, "how long to try to reach governord")
	subagents := fs.String("subagent-tools", "Task,Agent,spawn_agent", "tool names that start a subagent, comma separated")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	for _, name := range strings.Split(*subagents, ",") {
		if name = strings.TrimSpace(name); name != "" {
			o.subagentTools = append(o.subagentTools, name) // tool names are case-sensitive
		}
	}
	if (o.agent != "claude" && o.agent != "codex") || fs.NArg() > 0 || o.maxCalls < 1 || o.maxSubagents < 0 || o.maxDuration <= 0 || o.timeout <= 0 {
		fmt.Fprintln(stderr, "governor hook: -agent claude|codex is required; -max-calls >= 1, -max-subagents >= 0, durations > 0")
		return 2
	}
	raw, err := io.ReadAll(io.LimitReader(stdin, 4<<20))
	var p hookPayload
	if err == nil {
		err = json.Unmarshal(raw, &p)
	}
	if err == nil && p.SessionID == "" {
		err = errors.New("no session_id")
	}
	if err != nil {
		// A payload the hook cannot read is refused: it would be uncounted.
		return refuse(o, stdout, stderr, fmt.Sprintf("Governor could not read this hook call (%v); the tool is refused.", err), false)
	}
	v := decideHook(context.Background(), o, p, raw)
	switch {
	case v.allow:
		return 0
	case v.unreachable != nil && o.warnOnly:
		// Not the refusal's words: they tell the model to stop, and the
		// tool runs.
		msg := fmt.Sprintf("Governor cannot reach governord (%v); -warn-only lets this tool call run, not counted.", v.unreachable)
		fmt.Fprintln(stderr, "governor hook:", msg)
		if o.agent == "claude" {
			_ = json.NewEncoder(stdout).Encode(map[string]any{"systemMessage": msg})
		}
		return 0
	}
	return refuse(o, stdout, stderr, v.message, v.stop)
}

// verdict is what the hook decided.
type verdict struct {
	allow       bool
	message     string // why not, for the model
	stop        bool   // the whole run is over, not just this kind of call
	unreachable error  // why governord could not be asked; nil when it was
}

// unreachable is the verdict when governord cannot be asked: refused,
// failing closed (-warn-only turns it into a warning).
func unreachable(err error) verdict {
	return verdict{message: fmt.Sprintf("Governor cannot reach governord (%v), so no tool may run; stop and tell the user", err), unreachable: err}
}

// The instructions that end a refusal, by what the model should do next.
const (
	stopAndReport = " Stop now: make no more tool calls, and tell the user what is done and what is left."
	stopAndTell   = " Stop now: make no more tool calls, and tell the user."
)

// refuse answers a refusal in the agent's own format. Claude Code: a
// PreToolUse decision "deny" as JSON on stdout, exit 0, with "continue":
// false when the run is over; Codex: exit 2 with the reason on stderr, which
// Codex gives the model as "Command blocked by PreToolUse hook: <reason>.
// Command: <command>" (so the reason's own full stop is left off).
func refuse(o hookOptions, stdout, stderr io.Writer, message string, stop bool) int {
	if o.agent == "codex" {
		fmt.Fprintln(stderr, strings.TrimSuffix(message, "."))
		return 2
	}
	out := map[string]any{"hookSpecificOutput": map[string]any{"hookEventName": "PreToolUse",
		"permissionDecision": "deny", "permissionDecisionReason": message}}
	if stop {
		out["continue"] = false
		out["stopReason"] = message
	}
	if err := json.NewEncoder(stdout).Encode(out); err != nil {
		fmt.Fprintln(stderr, message)
		return 2
	}
	return 0
}

func decideHook(ctx context.Context, o hookOptions, p hookPayload, raw []byte) verdict {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	c, err := connectWithin(ctx, o.timeout)
	if err != nil {
		return unreachable(err)
	}
	defer c.Close()
	rpc := c.Raw()

	parent := c.ScopeID()
	if o.parent != "" {
		n, err := resolve(ctx, rpc, o.parent)
		if err != nil {
			return verdict{message: fmt.Sprintf("Governor's hook is misconfigured (-parent %s: %v); stop and tell the user", o.parent, err)}
		}
		parent = n.GetId()
	}
	if parent == rootID {
		// A session's node directly under the root would be a tenant of
		// its own, outside every tenant's caps.
		return verdict{message: "Governor's hook is misconfigured: its key is the admin key, scoped to the root, so -parent is required " +
			"(a tenant or a node below one, e.g. -parent payments); stop and tell the user"}
	}
	runName := nodeName(runPrefix, p.SessionID)
	run, err := rpc.FindOrCreateNode(ctx, &governorpb.FindOrCreateNodeRequest{ParentId: parent, Spec: &governorpb.NodeSpec{Name: runName,
		Quotas:   map[string]int64{resourceToolCalls: o.maxCalls, resourceSubagents: o.maxSubagents},
		Deadline: timestamppb.New(time.Now().Add(o.maxDuration))}})
	if err != nil {
		return hookError(ctx, err)
	}
	if run.GetCreated() {
		if ended := endedBefore(ctx, rpc, parent, runName, run.GetNode().GetId()); ended != nil {
			// The session's run ended (its time ran out, or the operator
			// ended it) and governord still remembers it: the node just
			// made is a second budget it must not get.
			_, _ = rpc.CancelNode(ctx, &governorpb.CancelNodeRequest{NodeId: run.GetNode().GetId()})
			return sessionEnded(ended.GetName(), governor.NodeState(ended.GetState()))
		}
	}
	// The call's own node carries its charge, so that a retry of this hook
	// call finds it charged: governord remembers the tree across restarts.
	callID := p.ToolUseID
	if callID == "" {
		callID = p.TurnID + "\x00" + p.ToolName + "\x00" + string(raw)
	}
	call, err := rpc.FindOrCreateNode(ctx, &governorpb.FindOrCreateNodeRequest{ParentId: run.GetNode().GetId(),
		Spec: &governorpb.NodeSpec{Name: nodeName("call-", callID)}})
	if err != nil {
		return hookError(ctx, err)
	}
	if call.GetNode().GetUsed()[resourceToolCalls] > 0 {
		return verdict{allow: true} // a retry of a call already charged
	}
	if rn := run.GetNode(); rn.GetUsed()[resourceToolCalls] >= rn.GetQuotas()[resourceToolCalls] && rn.GetQuotas()[resourceToolCalls] > 0 {
		// Spent already: say so, rather than whichever cap a charge of both
		// would name first.
		return budgetSpent(resourceToolCalls, rn.GetUsed()[resourceToolCalls], rn.GetQuotas()[resourceToolCalls], rn.GetName())
	}
	charges := map[string]int64{resourceToolCalls: 1}
	if slices.Contains(o.subagentTools, p.ToolName) {
		charges[resourceSubagents] = 1
	}
	_, err = rpc.ChargeAndAcquire(ctx, &governorpb.ChargeAndAcquireRequest{NodeId: call.GetNode().GetId(), Charges: charges})
	if err != nil {
		return hookError(ctx, err)
	}
	return verdict{allow: true}
}

// hookError turns governord's refusal into the model's instructions. The
// cause is the sidecar's (admission.Deny: one vocabulary for a refusal,
// whoever answers it), and each cause has its own words here.
func hookError(ctx context.Context, err error) verdict {
	sdkErr := governor.RawError("hook", err)
	d := admission.Deny(ctx, sdkErr, "", 0)
	switch d.Cause {
	case admission.CauseQuota:
		q := d.Quota
		switch {
		case q == nil:
			return verdict{message: "Governor: a budget is spent (" + plainStatus(err).Error() + ")." + stopAndTell, stop: true}
		case q.Resource == resourceSubagents:
			return verdict{message: fmt.Sprintf("Governor: this agent session may start no more subagents (%d of %d used). Do the rest yourself, without starting subagents.", q.Used, q.Limit)}
		}
		return budgetSpent(q.Resource, q.Used, q.Limit, q.NodeName)
	case admission.CauseSuspended, admission.CauseReadOnly:
		return tenantRefused(d)
	case admission.CauseRate:
		return verdict{message: d.Message() + ". Wait that long, then try this tool call again."}
	case admission.CauseTaskEnded:
		switch e := d.Ended; {
		case d.Tenant != nil: // a closing tenant refuses a new session's node
			return tenantRefused(d)
		case e != nil:
			return sessionEnded(e.NodeName, e.State)
		}
		return verdict{message: "Governor: this agent session has ended." + stopAndReport, stop: true}
	case admission.CauseUnavailable, admission.CauseWaitTimeout, admission.CauseCanceled:
		// admission names whatever it cannot place "unavailable"; only a
		// governord that was not there is one here.
		if errors.Is(sdkErr, governor.ErrUnavailable) || errors.Is(sdkErr, governor.ErrSessionLost) || errors.Is(sdkErr, governor.ErrClosed) ||
			errors.Is(sdkErr, context.DeadlineExceeded) || errors.Is(sdkErr, context.Canceled) {
			return unreachable(err)
		}
	}
	return verdict{message: fmt.Sprintf("Governor refused this tool call (%v); stop and tell the user", plainStatus(err))}
}

// sessionEnded is the refusal of a call in an agent session whose node (or
// one above it, named) has ended: by its deadline, the time budget; else
// by the operator's hand.
func sessionEnded(node string, state governor.NodeState) verdict {
	if state == governor.NodeExpired {
		return verdict{message: "Governor: this agent session's time budget is spent." + stopAndReport, stop: true}
	}
	return verdict{message: fmt.Sprintf("Governor: this agent session has been ended (%q is %s), so no tool may run.", node, state) + stopAndReport, stop: true}
}

// budgetSpent is the refusal of a call past a spent budget.
func budgetSpent(resource string, used, limit int64, node string) verdict {
	return verdict{message: fmt.Sprintf("Governor: the budget for %s is spent (%d of %d, on %s).", resource, used, limit, node) + stopAndReport, stop: true}
}

// tenantRefused is the refusal of work by its tenant's state, in governord's
// words (who, the state, what is refused, the operator's reason).
func tenantRefused(d *admission.Denial) verdict {
	what := "the tenant's state refuses it"
	if t := d.Tenant; t != nil {
		what = t.Error()
	}
	return verdict{message: "Governor: " + what + ", so no tool may run." + stopAndTell, stop: true}
}

// endedBefore returns parent's ended child named name other than id, or
// nil: a run that ended and must not start again.
func endedBefore(ctx context.Context, rpc governorpb.GovernorClient, parent int64, name string, id int64) *governorpb.Node {
	token := ""
	for {
		page, err := rpc.ListChildren(ctx, &governorpb.ListChildrenRequest{NodeId: parent, PageSize: 1000, PageToken: token})
		if err != nil {
			return nil
		}
		for _, c := range page.GetNodes() {
			if c.GetName() == name && c.GetId() != id && c.GetState() != governorpb.NodeState_NODE_STATE_OPEN {
				return c
			}
		}
		if token = page.GetNextPageToken(); token == "" {
			return nil
		}
	}
}

// runPrefix begins the name of an agent session's node.
const runPrefix = "agent-"

// isHookSession reports whether n is an agent session's node as the hook
// makes it: named for the session, with both of the hook's budgets, so
// that a budget of 0 (-max-subagents 0) is known to be the one asked for.
func isHookSession(n *governorpb.Node) bool {
	_, calls := n.GetQuotas()[resourceToolCalls]
	_, subagents := n.GetQuotas()[resourceSubagents]
	return strings.HasPrefix(n.GetName(), runPrefix) && calls && subagents
}

// nodeName is prefix and id, or prefix and id's hash when id is long or
// holds a "/" (which paths use).
func nodeName(prefix, id string) string {
	if len(id) <= 200 && !strings.Contains(id, "/") && id != "" {
		return prefix + id
	}
	sum := sha256.Sum256([]byte(id))
	return prefix + hex.EncodeToString(sum[:16])
}
