package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
)

// scriptedModel is a fake model provider for the agent CLIs: it speaks
// Anthropic's messages API (Claude Code) and OpenAI's responses API (Codex),
// streamed as server-sent events or not, and plays one script: on the
// agent's main loop, while the conversation holds fewer tool results than
// Steps, it asks for the next step's tool call, then it answers with a final
// text. A step is "Bash" (a shell call, `echo hi`), "Agent" (Claude Code's
// subagent tool, which waits for the subagent), "spawn_agent" (Codex's) or
// "wait_agent" (Codex's wait for the subagent spawn_agent started).
// A subagent's own loop (a conversation that holds agentSubPrompt and not
// agentPrompt) plays SubSteps instead, with call ids of its own. Every tool
// result it is sent is recorded, so a test can read what the agent told the
// model when a call was refused. Requests outside the main loop (those that
// offer no shell tool) get a short text.
type scriptedModel struct {
	Steps, SubSteps []string

	mu       sync.Mutex
	results  []toolResult // every tool result seen, by call id (the first sighting)
	seen     map[string]bool
	asked    int      // tool calls asked for
	requests []string // method, path and the tools offered, in order
}

// toolResult is what the agent sent back for one tool call.
type toolResult struct {
	CallID  string
	Content string
	IsError bool
}

func newScriptedModel(steps ...string) *scriptedModel {
	return &scriptedModel{Steps: steps, seen: map[string]bool{}}
}

// Results is every tool result the agent sent, in the order first seen.
func (m *scriptedModel) Results() []toolResult {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]toolResult(nil), m.results...)
}

// Asked is how many tool calls the model asked for.
func (m *scriptedModel) Asked() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.asked
}

// Requests lists the requests that reached the model, for a failure's
// message.
func (m *scriptedModel) Requests() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return strings.Join(m.requests, "\n")
}

func (m *scriptedModel) record(r toolResult) {
	if !m.seen[r.CallID] {
		m.seen[r.CallID] = true
		m.results = append(m.results, r)
	}
}

func (m *scriptedModel) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 32<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	switch {
	case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/messages/count_tokens"):
		m.note(r, nil)
		writeJSON(w, map[string]any{"input_tokens": len(body) / 4})
	case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/messages"):
		m.anthropic(w, r, body)
	case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/responses"):
		m.openai(w, r, body)
	case r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/models"):
		m.note(r, nil)
		writeJSON(w, map[string]any{"object": "list", "data": []any{}, "models": []any{}})
	default:
		m.note(r, nil)
		http.NotFound(w, r)
	}
}

func (m *scriptedModel) note(r *http.Request, tools []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.requests = append(m.requests, fmt.Sprintf("%s %s tools=%v", r.Method, r.URL.Path, tools))
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// sse writes one server-sent event and flushes it.
func sse(w http.ResponseWriter, event string, data any) {
	b, _ := json.Marshal(data)
	fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, b)
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
}

// textOf flattens a tool result's content: a string, or a list of blocks
// with text.
func textOf(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var blocks []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &blocks) == nil {
		var parts []string
		for _, b := range blocks {
			parts = append(parts, b.Text)
		}
		return strings.Join(parts, "\n")
	}
	return string(raw)
}

// next decides the main loop's next turn from the tool results the
// conversation holds: another call (its tool and id), or the end ("").
func (m *scriptedModel) next(results int, body []byte) (tool, id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	steps, prefix := m.Steps, "call_fake_"
	if !bytes.Contains(body, []byte(agentPrompt)) && bytes.Contains(body, []byte(agentSubPrompt)) {
		steps, prefix = m.SubSteps, "call_sub_"
	}
	if results >= len(steps) {
		return "", ""
	}
	m.asked++
	return steps[results], fmt.Sprintf("%s%d", prefix, results+1)
}

// The prompts of the scripted runs: the agent's, and the one its subagent
// is given.
const (
	agentPrompt    = "Say hi with the shell."
	agentSubPrompt = "Count the files in this directory and say how many."
)

const scriptedFinal = "All done."

// anthropic answers Anthropic's messages API.
func (m *scriptedModel) anthropic(w http.ResponseWriter, r *http.Request, body []byte) {
	var req struct {
		Model    string                  `json:"model"`
		Stream   bool                    `json:"stream"`
		Tools    []struct{ Name string } `json:"tools"`
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var tools []string
	bash := false
	for _, t := range req.Tools {
		tools = append(tools, t.Name)
		bash = bash || t.Name == "Bash"
	}
	m.note(r, tools)
	results := 0
	for _, msg := range req.Messages {
		var blocks []struct {
			Type      string          `json:"type"`
			ToolUseID string          `json:"tool_use_id"`
			Content   json.RawMessage `json:"content"`
			IsError   bool            `json:"is_error"`
		}
		if json.Unmarshal(msg.Content, &blocks) != nil {
			continue
		}
		for _, b := range blocks {
			if b.Type == "tool_result" {
				results++
				m.mu.Lock()
				m.record(toolResult{CallID: b.ToolUseID, Content: textOf(b.Content), IsError: b.IsError})
				m.mu.Unlock()
			}
		}
	}
	tool, id := "", ""
	if bash {
		tool, id = m.next(results, body)
	}
	var content []map[string]any
	stop := "end_turn"
	if tool != "" {
		stop = "tool_use"
		input := map[string]any{"command": "echo hi", "description": "Say hi"}
		if tool == "Agent" {
			input = map[string]any{"description": "Count the files", "prompt": agentSubPrompt, "subagent_type": "general-purpose", "run_in_background": false}
		}
		content = []map[string]any{{"type": "tool_use", "id": "toolu_" + id, "name": tool, "input": input}}
	} else {
		content = []map[string]any{{"type": "text", "text": scriptedFinal}}
	}
	usage := map[string]any{"input_tokens": len(body) / 4, "output_tokens": 10}
	msg := map[string]any{"id": "msg_" + fmt.Sprint(len(body)), "type": "message", "role": "assistant", "model": req.Model,
		"content": content, "stop_reason": stop, "stop_sequence": nil, "usage": usage}
	if !req.Stream {
		writeJSON(w, msg)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	start := map[string]any{}
	for k, v := range msg {
		start[k] = v
	}
	start["content"], start["stop_reason"] = []any{}, nil
	sse(w, "message_start", map[string]any{"type": "message_start", "message": start})
	for i, c := range content {
		if c["type"] == "tool_use" {
			input, _ := json.Marshal(c["input"])
			sse(w, "content_block_start", map[string]any{"type": "content_block_start", "index": i,
				"content_block": map[string]any{"type": "tool_use", "id": c["id"], "name": c["name"], "input": map[string]any{}}})
			sse(w, "content_block_delta", map[string]any{"type": "content_block_delta", "index": i,
				"delta": map[string]any{"type": "input_json_delta", "partial_json": string(input)}})
		} else {
			sse(w, "content_block_start", map[string]any{"type": "content_block_start", "index": i,
				"content_block": map[string]any{"type": "text", "text": ""}})
			sse(w, "content_block_delta", map[string]any{"type": "content_block_delta", "index": i,
				"delta": map[string]any{"type": "text_delta", "text": c["text"]}})
		}
		sse(w, "content_block_stop", map[string]any{"type": "content_block_stop", "index": i})
	}
	sse(w, "message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": stop, "stop_sequence": nil},
		"usage": map[string]any{"output_tokens": 10}})
	sse(w, "message_stop", map[string]any{"type": "message_stop"})
}

// openai answers OpenAI's responses API.
func (m *scriptedModel) openai(w http.ResponseWriter, r *http.Request, body []byte) {
	var req struct {
		Model  string `json:"model"`
		Stream bool   `json:"stream"`
		Tools  []struct {
			Type string `json:"type"`
			Name string `json:"name"`
		} `json:"tools"`
		Input json.RawMessage `json:"input"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var tools []string
	shell := ""
	for _, t := range req.Tools {
		tools = append(tools, t.Name)
		switch t.Name {
		case "exec_command", "shell_command", "shell":
			if shell == "" {
				shell = t.Name
			}
		}
	}
	m.note(r, tools)
	var items []struct {
		Type   string          `json:"type"`
		CallID string          `json:"call_id"`
		Output json.RawMessage `json:"output"`
	}
	_ = json.Unmarshal(req.Input, &items)
	results, spawned := 0, ""
	for _, it := range items {
		if it.Type == "function_call_output" || it.Type == "custom_tool_call_output" {
			results++
			out := textOf(it.Output)
			m.mu.Lock()
			m.record(toolResult{CallID: it.CallID, Content: out})
			m.mu.Unlock()
			var agent struct {
				AgentID string `json:"agent_id"`
			}
			if json.Unmarshal([]byte(out), &agent) == nil && agent.AgentID != "" {
				spawned = agent.AgentID // what spawn_agent answered
			}
		}
	}
	tool, id := "", ""
	if shell != "" {
		tool, id = m.next(results, body)
	}
	var item map[string]any
	switch {
	case tool == "spawn_agent": // Codex's subagent tool, in its multi_agent_v1 namespace
		a, _ := json.Marshal(map[string]any{"message": agentSubPrompt})
		item = map[string]any{"type": "function_call", "id": "fc_" + id, "call_id": id, "namespace": "multi_agent_v1",
			"name": "spawn_agent", "arguments": string(a), "status": "completed"}
	case tool == "wait_agent": // wait for the subagent spawn_agent started
		a, _ := json.Marshal(map[string]any{"targets": []string{spawned}, "timeout_ms": 600000})
		item = map[string]any{"type": "function_call", "id": "fc_" + id, "call_id": id, "namespace": "multi_agent_v1",
			"name": "wait_agent", "arguments": string(a), "status": "completed"}
	case tool != "": // a shell call, in the shell tool Codex offers
		var args any
		switch shell {
		case "exec_command":
			args = map[string]any{"cmd": "echo hi"}
		case "shell_command":
			args = map[string]any{"command": "echo hi"}
		default:
			args = map[string]any{"command": []string{"bash", "-lc", "echo hi"}}
		}
		a, _ := json.Marshal(args)
		item = map[string]any{"type": "function_call", "id": "fc_" + id, "call_id": id, "name": shell, "arguments": string(a), "status": "completed"}
	default:
		item = map[string]any{"type": "message", "id": "msg_final", "role": "assistant", "status": "completed",
			"content": []any{map[string]any{"type": "output_text", "text": scriptedFinal, "annotations": []any{}}}}
	}
	usage := map[string]any{"input_tokens": len(body) / 4, "output_tokens": 10, "total_tokens": len(body)/4 + 10,
		"input_tokens_details": map[string]any{"cached_tokens": 0}, "output_tokens_details": map[string]any{"reasoning_tokens": 0}}
	resp := func(status string, output []any, u any) map[string]any {
		return map[string]any{"id": "resp_" + fmt.Sprint(len(body)), "object": "response", "status": status, "model": req.Model, "output": output, "usage": u}
	}
	if !req.Stream {
		writeJSON(w, resp("completed", []any{item}, usage))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	sse(w, "response.created", map[string]any{"type": "response.created", "response": resp("in_progress", []any{}, nil)})
	sse(w, "response.output_item.added", map[string]any{"type": "response.output_item.added", "output_index": 0, "item": item})
	sse(w, "response.output_item.done", map[string]any{"type": "response.output_item.done", "output_index": 0, "item": item})
	sse(w, "response.completed", map[string]any{"type": "response.completed", "response": resp("completed", []any{item}, usage)})
}
