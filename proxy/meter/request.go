package meter

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
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
	// OutputField is the output limit's field the body names ("" when it
	// names none): the one SetOutputLimit changes.
	OutputField string
	// streamOptions is whether the body has a stream_options object.
	streamOptions bool
}

// ErrNotJSONObject is a request body metering cannot read.
var ErrNotJSONObject = errors.New("the request body is not a JSON object")

// MaxOutputLimit is the largest output limit (max_tokens and its kin) a
// metered request may name: 2^24, far beyond what any provider accepts
// today (their largest are in the hundreds of thousands). A larger one is
// refused rather than reserved: no call can use it, and an estimate near
// int64's end would wrap around.
const MaxOutputLimit = 1 << 24

// A FieldError is a request body field metering refuses, named as the body
// names it.
type FieldError struct {
	Field   string
	Value   string // as the body wrote it
	Problem string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("%s is %s: %s", e.Field, e.Value, e.Problem)
}

// outputLimitFields are the names of a request's output limit, by API:
// chat completions and Anthropic's messages (max_tokens), OpenAI's newer
// chat completions (max_completion_tokens), the responses API
// (max_output_tokens).
var outputLimitFields = [...]string{"max_tokens", "max_completion_tokens", "max_output_tokens"}

// ReadRequest reads a request body. An empty body is a request that names
// nothing. An output limit that is not a whole number from 0 to
// MaxOutputLimit is a *FieldError naming the field.
func ReadRequest(body []byte) (Request, error) {
	var r Request
	if len(bytes.TrimSpace(body)) == 0 {
		return r, nil
	}
	var b struct {
		Stream              json.RawMessage `json:"stream"`
		MaxTokens           json.RawMessage `json:"max_tokens"`
		MaxCompletionTokens json.RawMessage `json:"max_completion_tokens"`
		MaxOutputTokens     json.RawMessage `json:"max_output_tokens"`
		StreamOptions       json.RawMessage `json:"stream_options"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		return r, ErrNotJSONObject
	}
	for i, raw := range [...]json.RawMessage{b.MaxTokens, b.MaxCompletionTokens, b.MaxOutputTokens} {
		raw = bytes.TrimSpace(raw)
		if bytes.Equal(raw, []byte("null")) {
			raw = nil
		}
		v, err := outputLimit(outputLimitFields[i], raw)
		if err != nil {
			return r, err
		}
		if v > r.MaxOutput || (len(raw) > 0 && r.OutputField == "") {
			r.OutputField = outputLimitFields[i]
		}
		r.MaxOutput = max(r.MaxOutput, v)
	}
	// stream and stream_options are the provider's to refuse when they are
	// of the wrong type; metering reads what it can.
	_ = json.Unmarshal(b.Stream, &r.Stream)
	if o := bytes.TrimSpace(b.StreamOptions); len(o) > 0 && !bytes.Equal(o, []byte("null")) {
		r.streamOptions = true
		var opts struct {
			IncludeUsage bool `json:"include_usage"`
		}
		if json.Unmarshal(o, &opts) == nil {
			r.IncludeUsage = opts.IncludeUsage
		}
	}
	return r, nil
}

// outputLimit reads one output limit field: absent or null is 0.
func outputLimit(field string, raw json.RawMessage) (int64, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return 0, nil
	}
	bad := func(problem string) error {
		v := string(raw)
		if len(v) > 40 {
			v = v[:37] + "..."
		}
		return &FieldError{Field: field, Value: v, Problem: problem}
	}
	if raw[0] != '-' && (raw[0] < '0' || raw[0] > '9') {
		return 0, bad("not a number of tokens")
	}
	var n json.Number
	if err := json.Unmarshal(raw, &n); err != nil {
		return 0, bad("not a number of tokens")
	}
	v, err := strconv.ParseInt(n.String(), 10, 64)
	switch {
	case err == nil && v < 0:
		return 0, bad("negative")
	case err == nil && v > MaxOutputLimit:
		return 0, bad(fmt.Sprintf("over %d, more than any provider accepts", MaxOutputLimit))
	case err == nil:
		return v, nil
	case strings.ContainsAny(n.String(), ".eE"):
		return 0, bad("not an integer")
	case strings.HasPrefix(n.String(), "-"):
		return 0, bad("negative")
	}
	return 0, bad(fmt.Sprintf("over %d, more than any provider accepts", MaxOutputLimit))
}

// Estimate is the tokens to reserve for a request: its output limit, or
// def when it names none, plus its input estimated from the body's size
// at bytesPerToken (at least 1). One byte a token is an upper bound for
// text, so that a budget is never exceeded; more bytes a token reserve less.
// It never wraps around: a sum past int64's end is int64's end.
func Estimate(r Request, bodyLen int, bytesPerToken int, def int64) int64 {
	out := r.MaxOutput
	if out <= 0 {
		out = max(def, 0)
	}
	return addSat(out, InputEstimate(bodyLen, bytesPerToken))
}

// InputEstimate is the input part of an estimate: a body's size at
// bytesPerToken (at least 1), rounded up.
func InputEstimate(bodyLen int, bytesPerToken int) int64 {
	bytesPerToken = max(bytesPerToken, 1)
	return int64(max(bodyLen, 0)/bytesPerToken) + int64(b2i(max(bodyLen, 0)%bytesPerToken != 0))
}

// OutputField is the output limit's field a request on path names, or
// would name: the one it names, else the API's own (Anthropic's and the
// completions API's max_tokens, the responses API's max_output_tokens,
// chat completions' max_completion_tokens).
func OutputField(api API, path string, r Request) string {
	if r.OutputField != "" {
		return r.OutputField
	}
	p := strings.TrimSuffix(path, "/")
	switch {
	case api == Anthropic, strings.HasSuffix(p, "/completions") && !strings.HasSuffix(p, "/chat/completions"):
		return "max_tokens"
	case strings.HasSuffix(p, "/responses"):
		return "max_output_tokens"
	}
	return "max_completion_tokens"
}

// SetOutputLimit returns body with its top-level field set to v: the
// value replaced where the body has the field, the field appended where it
// has not, every other byte as it was.
func SetOutputLimit(body []byte, field string, v int64) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, ErrNotJSONObject
	}
	value := strconv.FormatInt(v, 10)
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, ErrNotJSONObject
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, ErrNotJSONObject
		}
		if t == field {
			end := int(dec.InputOffset())
			start := end - len(raw)
			out := make([]byte, 0, len(body)+len(value))
			out = append(append(append(out, body[:start]...), value...), body[end:]...)
			return out, nil
		}
	}
	trimmed := bytes.TrimRight(body, " \t\r\n")
	if len(trimmed) == 0 || trimmed[len(trimmed)-1] != '}' {
		return nil, ErrNotJSONObject
	}
	inside := trimmed[:len(trimmed)-1]
	out := make([]byte, 0, len(trimmed)+len(field)+len(value)+4)
	out = append(out, inside...)
	if !bytes.HasSuffix(bytes.TrimRight(inside, " \t\r\n"), []byte("{")) {
		out = append(out, ',')
	}
	out = append(append(append(out, '"'), field...), `":`...)
	out = append(out, value...)
	return append(out, '}'), nil
}

// addSat is a + b for counts (both >= 0), stopping at int64's end.
func addSat(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
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
