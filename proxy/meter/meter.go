// Package meter reads what an LLM call costs in tokens from the call itself:
// the request's output limit (for the estimate reserved before it is
// forwarded) and the usage the provider reports in the response (for the
// charge it settles to), for OpenAI-style APIs (chat completions,
// completions, responses) and Anthropic's messages API, as JSON bodies and
// as server-sent-event streams.
//
// A stream is read as its bytes pass through (Body): every chunk reaches
// the client as soon as it arrives, and only an unfinished line is kept.
//
// It may import the standard library only.
//
// # Files
//
//   - meter.go: APIs, Usage, and the JSON usage of each API.
//   - request.go: what a request body says (stream, output limit) and the
//     estimate; adding stream_options.include_usage.
//   - sse.go: the incremental reader of an event stream's usage.
//   - body.go: Body, the response body that meters as it is read.
package meter

import (
	"encoding/json"
	"fmt"
)

// API is the wire format of a provider.
type API uint8

// The APIs.
const (
	OpenAI    API = iota + 1 // chat completions, completions, responses (and compatible servers)
	Anthropic                // messages
)

// ParseAPI reads an API's name as the rules write it.
func ParseAPI(s string) (API, error) {
	switch s {
	case "openai":
		return OpenAI, nil
	case "anthropic":
		return Anthropic, nil
	}
	return 0, fmt.Errorf("%q is not an API the sidecar meters (openai, anthropic)", s)
}

func (a API) String() string {
	switch a {
	case OpenAI:
		return "openai"
	case Anthropic:
		return "anthropic"
	}
	return fmt.Sprintf("api(%d)", uint8(a))
}

// Usage is the tokens one call used, as its provider reported them.
type Usage struct {
	// Input counts the prompt's tokens. For OpenAI it includes the cached
	// ones (CacheRead); for Anthropic it does not (see Tokens).
	Input  int64
	Output int64
	// CacheRead are input tokens read from the provider's prompt cache
	// (OpenAI's cached_tokens, Anthropic's cache_read_input_tokens);
	// CacheWrite are those written to it (Anthropic's
	// cache_creation_input_tokens).
	CacheRead  int64
	CacheWrite int64
	// Total is the provider's own total, when it reports one (OpenAI).
	Total int64
}

// Tokens is what the call is charged: every token the provider processed.
// OpenAI's total (or input plus output; its input includes cached tokens);
// Anthropic's input, output and both kinds of cache tokens, which its
// input_tokens leaves out.
// A sum past int64's end is int64's end: a provider's counts are not
// trusted to be sane.
func (u Usage) Tokens(api API) int64 {
	if api == Anthropic {
		return addSat(addSat(u.Input, u.Output), addSat(u.CacheRead, u.CacheWrite))
	}
	if u.Total > 0 {
		return u.Total
	}
	return addSat(u.Input, u.Output)
}

// openaiUsage is OpenAI's usage object, in both of its namings: chat
// completions' prompt/completion and the responses API's input/output.
type openaiUsage struct {
	PromptTokens        *int64 `json:"prompt_tokens"`
	CompletionTokens    *int64 `json:"completion_tokens"`
	InputTokens         *int64 `json:"input_tokens"`
	OutputTokens        *int64 `json:"output_tokens"`
	TotalTokens         *int64 `json:"total_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	InputTokensDetails *struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
}

func (o *openaiUsage) usage() (Usage, bool) {
	if o == nil {
		return Usage{}, false
	}
	var u Usage
	known := false
	pick := func(dst *int64, vs ...*int64) {
		for _, v := range vs {
			if v != nil {
				*dst, known = *v, true
				return
			}
		}
	}
	pick(&u.Input, o.PromptTokens, o.InputTokens)
	pick(&u.Output, o.CompletionTokens, o.OutputTokens)
	pick(&u.Total, o.TotalTokens)
	if d := o.PromptTokensDetails; d != nil {
		u.CacheRead = d.CachedTokens
	}
	if d := o.InputTokensDetails; d != nil {
		u.CacheRead = d.CachedTokens
	}
	return u, known && u.valid()
}

// anthropicUsage is Anthropic's usage object.
type anthropicUsage struct {
	InputTokens              *int64 `json:"input_tokens"`
	OutputTokens             *int64 `json:"output_tokens"`
	CacheCreationInputTokens *int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     *int64 `json:"cache_read_input_tokens"`
}

// merge sets the fields a (possibly partial, cumulative) usage object
// names; it reports whether it named any.
func (a *anthropicUsage) merge(u *Usage) bool {
	if a == nil {
		return false
	}
	known := false
	set := func(dst *int64, v *int64) {
		if v != nil {
			*dst, known = *v, true
		}
	}
	set(&u.Input, a.InputTokens)
	set(&u.Output, a.OutputTokens)
	set(&u.CacheWrite, a.CacheCreationInputTokens)
	set(&u.CacheRead, a.CacheReadInputTokens)
	return known
}

// valid refuses negative counts, which no provider sends: such a usage is
// not believed, and the call is charged what was reserved.
func (u Usage) valid() bool {
	return u.Input >= 0 && u.Output >= 0 && u.CacheRead >= 0 && u.CacheWrite >= 0 && u.Total >= 0
}

// ParseJSON reads the usage of a complete JSON response body: OpenAI's
// top-level usage (chat completions, completions, responses) or
// Anthropic's. ok is false when the body is not JSON or reports no usage
// (an error body, say).
func ParseJSON(api API, body []byte) (u Usage, ok bool) {
	switch api {
	case OpenAI:
		var b struct {
			Usage *openaiUsage `json:"usage"`
		}
		if json.Unmarshal(body, &b) != nil {
			return Usage{}, false
		}
		return b.Usage.usage()
	case Anthropic:
		var b struct {
			Type  string          `json:"type"`
			Usage *anthropicUsage `json:"usage"`
		}
		if json.Unmarshal(body, &b) != nil || b.Type == "error" {
			return Usage{}, false
		}
		if !b.Usage.merge(&u) || !u.valid() {
			return Usage{}, false
		}
		return u, true
	}
	return Usage{}, false
}
