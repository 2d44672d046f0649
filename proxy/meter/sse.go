package meter

import (
	"bytes"
	"encoding/json"
)

// DefaultMaxLine bounds the unfinished line an SSE reader keeps. A longer
// line makes it give up: the call is charged what was reserved.
const DefaultMaxLine = 1 << 20

// SSE reads the usage of a server-sent-event stream as its bytes pass by,
// keeping only the line not yet finished:
//
//   - OpenAI chat completions and completions: the chunk whose usage is
//     not null (sent last, before [DONE], when stream_options.include_usage
//     is true);
//   - OpenAI responses: the response.completed (or .incomplete, .failed)
//     event's response.usage;
//   - Anthropic messages: message_start's message.usage (input and cache
//     tokens) and then message_delta's usage, which is cumulative.
//
// With Strip, the reader also removes what adding include_usage put into
// the stream, so the client sees the stream it asked for: the usage-only
// chunk (no choices) with the blank line that ends its event, and the
// "usage":null each other chunk carries. Strip changes the bytes, so it
// is used with Filter; without it, Observe only watches.
//
// An SSE is used by one goroutine at a time.
type SSE struct {
	API API
	// Strip removes the usage the sidecar asked for (OpenAI only).
	Strip bool
	// MaxLine bounds the unfinished line kept; 0: DefaultMaxLine.
	MaxLine int

	line      []byte // the unfinished line
	dropBlank bool   // a data line was dropped: so is the blank line after it
	gaveUp    bool   // a line was too long: stop reading
	usage     Usage
	sawUsage  bool // OpenAI: a usage object; Anthropic: message_delta's
	started   bool // Anthropic: message_start's usage
}

// Observe reads p, a piece of the stream the client gets unchanged.
func (s *SSE) Observe(p []byte) {
	s.feed(p, nil, false)
}

// Filter reads p and appends to out what the client gets of the stream so
// far: every line finished, as Strip says; an unfinished line is held until
// its end arrives.
func (s *SSE) Filter(p, out []byte) []byte {
	return s.feed(p, out, true)
}

// Flush returns the unfinished line held by Filter, as it is (the stream
// ended without ending it).
func (s *SSE) Flush(out []byte) []byte {
	out = append(out, s.line...)
	s.line = s.line[:0]
	return out
}

// Usage returns the usage the stream reported, and whether it reported all
// of it (for Anthropic, message_start and message_delta both).
func (s *SSE) Usage() (Usage, bool) {
	if s.gaveUp || !s.sawUsage || (s.API == Anthropic && !s.started) || !s.usage.valid() {
		return Usage{}, false
	}
	return s.usage, true
}

func (s *SSE) feed(p, out []byte, filter bool) []byte {
	if s.gaveUp {
		return append(out, p...)
	}
	max := s.MaxLine
	if max <= 0 {
		max = DefaultMaxLine
	}
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			if len(s.line)+len(p) > max {
				s.gaveUp = true
				out = append(append(out, s.line...), p...)
				s.line = nil
				return out
			}
			s.line = append(s.line, p...)
			return out
		}
		raw := p[:i+1]
		p = p[i+1:]
		if len(s.line) > 0 {
			s.line = append(s.line, raw...)
			raw = s.line
		}
		out = s.onLine(raw, out, filter)
		s.line = s.line[:0]
	}
	return out
}

// onLine handles one finished line, with its end of line.
func (s *SSE) onLine(raw, out []byte, filter bool) []byte {
	text := bytes.TrimRight(raw, "\r\n")
	if len(text) == 0 {
		if s.dropBlank {
			s.dropBlank = false
			return out
		}
		return append(out, raw...)
	}
	data, ok := bytes.CutPrefix(text, []byte("data:"))
	if !ok {
		return append(out, raw...)
	}
	data = bytes.TrimPrefix(data, []byte(" "))
	switch s.API {
	case OpenAI:
		return s.openAI(raw, data, out, filter)
	case Anthropic:
		s.anthropic(data)
	}
	return append(out, raw...)
}

var (
	usageKey    = []byte(`"usage"`)
	msgStartKey = []byte(`"message_start"`)
	msgDeltaKey = []byte(`"message_delta"`)
)

func (s *SSE) openAI(raw, data, out []byte, filter bool) []byte {
	if !bytes.Contains(data, usageKey) {
		return append(out, raw...)
	}
	if start, end, ok := usageNull(raw); ok {
		// A chunk without usage (one object has one usage key): no
		// need to parse it.
		if s.Strip && filter {
			out = append(out, raw[:start]...)
			return append(out, raw[end:]...)
		}
		return append(out, raw...)
	}
	var ev struct {
		Type     string            `json:"type"`
		Choices  []json.RawMessage `json:"choices"`
		Usage    *openaiUsage      `json:"usage"`
		Response *struct {
			Usage *openaiUsage `json:"usage"`
		} `json:"response"`
	}
	if json.Unmarshal(data, &ev) != nil {
		return append(out, raw...)
	}
	if u, ok := ev.Usage.usage(); ok {
		s.usage, s.sawUsage = u, true
		if s.Strip && filter && len(ev.Choices) == 0 {
			s.dropBlank = true // the client did not ask for this chunk
			return out
		}
	} else if ev.Response != nil {
		if u, ok := ev.Response.Usage.usage(); ok {
			s.usage, s.sawUsage = u, true
		}
	}
	return append(out, raw...)
}

func (s *SSE) anthropic(data []byte) {
	start := bytes.Contains(data, msgStartKey)
	if !start && !bytes.Contains(data, msgDeltaKey) {
		return
	}
	var ev struct {
		Type    string `json:"type"`
		Message *struct {
			Usage *anthropicUsage `json:"usage"`
		} `json:"message"`
		Usage *anthropicUsage `json:"usage"`
	}
	if json.Unmarshal(data, &ev) != nil {
		return
	}
	switch ev.Type {
	case "message_start":
		if ev.Message != nil && ev.Message.Usage.merge(&s.usage) {
			s.started = true
		}
	case "message_delta":
		if ev.Usage.merge(&s.usage) {
			s.sawUsage = true
		}
	}
}

// usageNull finds the member "usage": null in a chunk's line, however the
// upstream spaced its JSON, with the separator that goes with it: the comma
// and the blanks before it (",\"usage\":null" as Go writes it, ",
// \"usage\": null" as Python's json.dumps does), or after it when it is the
// object's first member. Cutting raw[start:end] out leaves the line the
// upstream writes without the option, byte for byte.
func usageNull(raw []byte) (start, end int, ok bool) {
	i := bytes.Index(raw, usageKey)
	if i < 0 {
		return 0, 0, false
	}
	j := skipBlanks(raw, i+len(usageKey))
	if j >= len(raw) || raw[j] != ':' {
		return 0, 0, false
	}
	j = skipBlanks(raw, j+1)
	if !bytes.HasPrefix(raw[j:], []byte("null")) {
		return 0, 0, false
	}
	end = j + len("null")
	if after := skipBlanks(raw, end); after < len(raw) && raw[after] != ',' && raw[after] != '}' {
		return 0, 0, false // not the literal null
	}
	k := i - 1
	for k >= 0 && isBlank(raw[k]) {
		k--
	}
	if k >= 0 && raw[k] == ',' {
		return k, end, true // a later member: its comma and blanks go with it
	}
	// The first member: the comma after it and the blanks that follow go.
	m := skipBlanks(raw, end)
	if m < len(raw) && raw[m] == ',' {
		return i, skipBlanks(raw, m+1), true
	}
	return 0, 0, false
}

func skipBlanks(b []byte, i int) int {
	for i < len(b) && isBlank(b[i]) {
		i++
	}
	return i
}

func isBlank(c byte) bool { return c == ' ' || c == '\t' }
