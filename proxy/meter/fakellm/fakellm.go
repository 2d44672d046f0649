// Package fakellm is a fake LLM provider for tests: an http.Handler that
// answers OpenAI's chat completions and responses and Anthropic's messages
// in their documented JSON and server-sent-event formats, with usage
// (cache tokens included), and counts what it reported. A Gate holds a
// stream between its chunks until the test lets the next one go, so a
// test can see that a chunk arrived before the next one existed.
//
// It may import the standard library only.
package fakellm

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// Provider is the fake. Its zero value is ready; set fields before serving.
type Provider struct {
	// Output is the output tokens a call reports when its request names a
	// larger limit (or none). Zero: 40.
	Output int64
	// Gate, if not nil, is received from before each chunk of a stream
	// but the first.
	Gate chan struct{}

	requests atomic.Int64
	mu       sync.Mutex
	reported int64 // tokens reported in usage, as each API charges them
	calls    int64 // calls that reported usage
}

// Requests is how many requests reached the fake.
func (p *Provider) Requests() int64 { return p.requests.Load() }

// Reported is the tokens the fake reported as used (OpenAI's total;
// Anthropic's input, output and cache tokens), and by how many calls.
func (p *Provider) Reported() (tokens, calls int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reported, p.calls
}

// Failures a request asks for with the header X-Fake-Fail:
//
//	midstream  a stream ends after two chunks, without usage or its end
//	error      a stream sends the API's error event instead of finishing
//	status     a 500 with the API's error body, no usage
const HeaderFail = "X-Fake-Fail"

// HeaderOutput, when a request sends it, is the output tokens its usage
// reports, whatever the request's limit: a provider whose word is wrong.
const HeaderOutput = "X-Fake-Output"

type request struct {
	Model         string `json:"model"`
	Stream        bool   `json:"stream"`
	MaxTokens     int64  `json:"max_tokens"`
	MaxCompletion int64  `json:"max_completion_tokens"`
	MaxOutput     int64  `json:"max_output_tokens"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// usage is what one call reports: input from the body's size (a token per
// 4 bytes, under any estimate that counts a token per byte), output up to
// the request's limit.
type usage struct {
	input, output, cacheRead, cacheWrite int64
}

func (p *Provider) usageFor(body []byte, r request) usage {
	out := p.Output
	if out == 0 {
		out = 40
	}
	for _, lim := range []int64{r.MaxTokens, r.MaxCompletion, r.MaxOutput} {
		if lim > 0 && lim < out {
			out = lim
		}
	}
	in := int64(len(body)) / 4
	return usage{input: in, output: out, cacheRead: in / 4, cacheWrite: in / 8}
}

func (p *Provider) count(tokens int64) {
	p.mu.Lock()
	p.reported += tokens
	p.calls++
	p.mu.Unlock()
}

// ServeHTTP answers POST .../chat/completions, .../responses and
// .../messages.
func (p *Provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.requests.Add(1)
	body, err := io.ReadAll(r.Body)
	var req request
	if err == nil {
		err = json.Unmarshal(body, &req)
	}
	if err != nil || r.Method != http.MethodPost {
		http.Error(w, `{"error":{"type":"invalid_request_error","message":"bad request"}}`, http.StatusBadRequest)
		return
	}
	u := p.usageFor(body, req)
	if v := r.Header.Get(HeaderOutput); v != "" {
		if u.output, err = strconv.ParseInt(v, 10, 64); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
	}
	fail := r.Header.Get(HeaderFail)
	path := strings.TrimSuffix(r.URL.Path, "/")
	switch {
	case strings.HasSuffix(path, "/chat/completions"):
		p.chat(w, req, u, fail)
	case strings.HasSuffix(path, "/responses"):
		p.responses(w, req, u, fail)
	case strings.HasSuffix(path, "/messages"):
		p.messages(w, req, u, fail)
	default:
		http.NotFound(w, r)
	}
}

var words = []string{"Hello", " from", " the", " fake", " provider", "."}

// stream writes SSE events, each flushed at once, waiting on the gate
// between them.
type stream struct {
	w     http.ResponseWriter
	gate  chan struct{}
	first bool
}

func (p *Provider) newStream(w http.ResponseWriter) *stream {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	return &stream{w: w, gate: p.Gate, first: true}
}

func (s *stream) event(name string, data any) {
	if !s.first && s.gate != nil {
		<-s.gate
	}
	s.first = false
	b, _ := json.Marshal(data)
	if name != "" {
		fmt.Fprintf(s.w, "event: %s\n", name)
	}
	fmt.Fprintf(s.w, "data: %s\n\n", b)
	s.w.(http.Flusher).Flush()
}

func (s *stream) raw(line string) {
	if s.gate != nil {
		<-s.gate
	}
	fmt.Fprintf(s.w, "%s\n\n", line)
	s.w.(http.Flusher).Flush()
}

func openaiError(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusInternalServerError)
	io.WriteString(w, `{"error":{"message":"The server had an error while processing your request.","type":"server_error","param":null,"code":null}}`)
}

func (p *Provider) chat(w http.ResponseWriter, req request, u usage, fail string) {
	total := u.input + u.output
	usageObj := map[string]any{"prompt_tokens": u.input, "completion_tokens": u.output, "total_tokens": total,
		"prompt_tokens_details":     map[string]any{"cached_tokens": u.cacheRead, "audio_tokens": 0},
		"completion_tokens_details": map[string]any{"reasoning_tokens": 0, "audio_tokens": 0, "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}}
	if fail == "status" {
		openaiError(w)
		return
	}
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"id": "chatcmpl-fake", "object": "chat.completion", "created": 1700000000, "model": req.Model,
			"choices": []any{map[string]any{"index": 0, "message": map[string]any{"role": "assistant", "content": strings.Join(words, ""), "refusal": nil},
				"logprobs": nil, "finish_reason": "stop"}},
			"usage": usageObj, "system_fingerprint": "fp_fake"})
		p.count(total)
		return
	}
	withUsage := req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	s := p.newStream(w)
	chunk := func(delta map[string]any, finish any) map[string]any {
		c := map[string]any{"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1700000000, "model": req.Model,
			"system_fingerprint": "fp_fake", "choices": []any{map[string]any{"index": 0, "delta": delta, "logprobs": nil, "finish_reason": finish}}}
		if withUsage {
			c["usage"] = nil
		}
		return c
	}
	s.event("", chunk(map[string]any{"role": "assistant", "content": ""}, nil))
	for i, wd := range words {
		if i == 2 && fail == "midstream" {
			panic(http.ErrAbortHandler) // the connection drops mid-stream
		}
		if i == 2 && fail == "error" {
			s.event("", map[string]any{"error": map[string]any{"message": "The server had an error while processing your request.", "type": "server_error"}})
			return
		}
		s.event("", chunk(map[string]any{"content": wd}, nil))
	}
	s.event("", chunk(map[string]any{}, "stop"))
	if withUsage {
		s.event("", map[string]any{"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1700000000, "model": req.Model,
			"system_fingerprint": "fp_fake", "choices": []any{}, "usage": usageObj})
		p.count(total)
	}
	s.raw("data: [DONE]")
}

func (p *Provider) responses(w http.ResponseWriter, req request, u usage, fail string) {
	total := u.input + u.output
	usageObj := map[string]any{"input_tokens": u.input, "input_tokens_details": map[string]any{"cached_tokens": u.cacheRead},
		"output_tokens": u.output, "output_tokens_details": map[string]any{"reasoning_tokens": 0}, "total_tokens": total}
	if fail == "status" {
		openaiError(w)
		return
	}
	text := strings.Join(words, "")
	resp := func(status string, usage any, output []any) map[string]any {
		return map[string]any{"id": "resp_fake", "object": "response", "created_at": 1700000000, "status": status, "error": nil,
			"incomplete_details": nil, "model": req.Model, "output": output, "parallel_tool_calls": true, "tool_choice": "auto", "tools": []any{},
			"usage": usage}
	}
	msg := []any{map[string]any{"type": "message", "id": "msg_fake", "status": "completed", "role": "assistant",
		"content": []any{map[string]any{"type": "output_text", "text": text, "annotations": []any{}}}}}
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(resp("completed", usageObj, msg))
		p.count(total)
		return
	}
	s := p.newStream(w)
	seq := 0
	ev := func(typ string, fields map[string]any) {
		fields["type"], fields["sequence_number"] = typ, seq
		seq++
		s.event(typ, fields)
	}
	ev("response.created", map[string]any{"response": resp("in_progress", nil, []any{})})
	for i, wd := range words {
		if i == 2 && fail == "midstream" {
			panic(http.ErrAbortHandler)
		}
		ev("response.output_text.delta", map[string]any{"item_id": "msg_fake", "output_index": 0, "content_index": 0, "delta": wd})
	}
	ev("response.completed", map[string]any{"response": resp("completed", usageObj, msg)})
	p.count(total)
}

func (p *Provider) messages(w http.ResponseWriter, req request, u usage, fail string) {
	total := u.input + u.output + u.cacheRead + u.cacheWrite
	if fail == "status" {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		io.WriteString(w, `{"type":"error","error":{"type":"api_error","message":"Internal server error"}}`)
		return
	}
	usageObj := map[string]any{"input_tokens": u.input, "output_tokens": u.output,
		"cache_creation_input_tokens": u.cacheWrite, "cache_read_input_tokens": u.cacheRead}
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"id": "msg_fake", "type": "message", "role": "assistant", "model": req.Model,
			"content": []any{map[string]any{"type": "text", "text": strings.Join(words, "")}}, "stop_reason": "end_turn", "stop_sequence": nil,
			"usage": usageObj})
		p.count(total)
		return
	}
	s := p.newStream(w)
	start := map[string]any{"input_tokens": u.input, "output_tokens": 1, "cache_creation_input_tokens": u.cacheWrite, "cache_read_input_tokens": u.cacheRead}
	s.event("message_start", map[string]any{"type": "message_start", "message": map[string]any{"id": "msg_fake", "type": "message", "role": "assistant",
		"content": []any{}, "model": req.Model, "stop_reason": nil, "stop_sequence": nil, "usage": start}})
	s.event("content_block_start", map[string]any{"type": "content_block_start", "index": 0, "content_block": map[string]any{"type": "text", "text": ""}})
	s.event("ping", map[string]any{"type": "ping"})
	for i, wd := range words {
		if i == 2 && fail == "midstream" {
			panic(http.ErrAbortHandler)
		}
		if i == 2 && fail == "error" {
			s.event("error", map[string]any{"type": "error", "error": map[string]any{"type": "overloaded_error", "message": "Overloaded"}})
			return
		}
		s.event("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0, "delta": map[string]any{"type": "text_delta", "text": wd}})
	}
	s.event("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
	s.event("message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": "end_turn", "stop_sequence": nil},
		"usage": map[string]any{"output_tokens": u.output}})
	s.event("message_stop", map[string]any{"type": "message_stop"})
	p.count(total)
}
