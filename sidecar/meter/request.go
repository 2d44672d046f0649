package meter

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
)

// Request is what a request body says that metering needs.
type Request struct {
	// Stream is the body's "stream": true.
	Stream bool
	// MaxOutput is the output limit the request names (max_tokens,
	// max_completion_tokens, max_output_tokens; the largest if several);
	// 0 when it names none.
	MaxOutput int64
	// IncludeUsage is stream_options.include_usage: true (OpenAI).
	IncludeUsage bool
	// streamOptions is whether the body has a stream_options object.
	streamOptions bool
}

// ErrNotJSONObject is a request body metering cannot read.
var ErrNotJSONObject = errors.New("the request body is not a JSON object")

// ReadRequest reads a request body. An empty body is a request that names
// nothing.
func ReadRequest(body []byte) (Request, error) {
	var r Request
	if len(bytes.TrimSpace(body)) == 0 {
		return r, nil
	}
	var b struct {
		Stream              *bool  `json:"stream"`
		MaxTokens           *int64 `json:"max_tokens"`
		MaxCompletionTokens *int64 `json:"max_completion_tokens"`
		MaxOutputTokens     *int64 `json:"max_output_tokens"`
		StreamOptions       *struct {
			IncludeUsage *bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		return r, ErrNotJSONObject
	}
	r.Stream = b.Stream != nil && *b.Stream
	for _, v := range []*int64{b.MaxTokens, b.MaxCompletionTokens, b.MaxOutputTokens} {
		if v != nil && *v > r.MaxOutput {
			r.MaxOutput = *v
		}
	}
	if o := b.StreamOptions; o != nil {
		r.streamOptions = true
		r.IncludeUsage = o.IncludeUsage != nil && *o.IncludeUsage
	}
	return r, nil
}

// Estimate is the tokens to reserve for a request: its output limit, or
// def when it names none, plus its input estimated from the body's size
// at bytesPerToken (at least 1). One byte a token is an upper bound for
// text, so that a budget is never exceeded; more bytes a token reserve less.
func Estimate(r Request, bodyLen int, bytesPerToken int, def int64) int64 {
	out := r.MaxOutput
	if out <= 0 {
		out = def
	}
	bytesPerToken = max(bytesPerToken, 1)
	return out + int64((bodyLen+bytesPerToken-1)/bytesPerToken)
}

// AsksUsage reports whether an OpenAI streaming request on path needs
// stream_options.include_usage added to report its usage: chat completions
// and completions report none in a stream unless asked; the responses API
// always does (and refuses the option).
func AsksUsage(path string, r Request) bool {
	if !r.Stream || r.IncludeUsage {
		return false
	}
	p := strings.TrimSuffix(path, "/")
	return strings.HasSuffix(p, "/chat/completions") || strings.HasSuffix(p, "/completions")
}

// AddIncludeUsage returns body with stream_options.include_usage set to
// true, keeping the rest of the body as it was (other stream_options keys
// included).
func AddIncludeUsage(body []byte) ([]byte, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil || top == nil {
		return nil, ErrNotJSONObject
	}
	opts := map[string]json.RawMessage{}
	if raw, ok := top["stream_options"]; ok && !bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		if err := json.Unmarshal(raw, &opts); err != nil {
			return nil, errors.New("stream_options is not an object")
		}
	}
	opts["include_usage"] = json.RawMessage("true")
	raw, err := json.Marshal(opts)
	if err != nil {
		return nil, err
	}
	if _, ok := top["stream_options"]; !ok {
		// The common case: append the key, leaving every byte before it.
		trimmed := bytes.TrimRight(body, " \t\r\n")
		if len(trimmed) == 0 || trimmed[len(trimmed)-1] != '}' {
			return nil, ErrNotJSONObject
		}
		out := make([]byte, 0, len(trimmed)+len(raw)+20)
		out = append(out, trimmed[:len(trimmed)-1]...)
		if len(top) > 0 {
			out = append(out, ',')
		}
		out = append(out, `"stream_options":`...)
		out = append(out, raw...)
		return append(out, '}'), nil
	}
	top["stream_options"] = raw
	return json.Marshal(top)
}
