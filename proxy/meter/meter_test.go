package meter

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"
)

func fixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The fixtures are written from the providers' public API references: the
// response objects' usage, and their streams' events.
func TestParseJSON(t *testing.T) {
	for _, tc := range []struct {
		file   string
		api    API
		want   Usage
		ok     bool
		tokens int64
	}{
		{"openai_chat.json", OpenAI, Usage{Input: 1117, Output: 12, CacheRead: 1024, Total: 1129}, true, 1129},
		{"openai_responses.json", OpenAI, Usage{Input: 36, Output: 87, Total: 123}, true, 123},
		{"anthropic_message.json", Anthropic, Usage{Input: 2095, Output: 503, CacheWrite: 2051, CacheRead: 4096}, true, 2095 + 503 + 2051 + 4096},
		{"anthropic_error.json", Anthropic, Usage{}, false, 0},
	} {
		got, ok := ParseJSON(tc.api, fixture(t, tc.file))
		if ok != tc.ok || got != tc.want {
			t.Errorf("%s: %+v %v, want %+v %v", tc.file, got, ok, tc.want, tc.ok)
		}
		if ok && got.Tokens(tc.api) != tc.tokens {
			t.Errorf("%s: %d tokens, want %d", tc.file, got.Tokens(tc.api), tc.tokens)
		}
	}
	for _, bad := range []string{``, `[1]`, `{"usage":null}`, `{"usage":{"prompt_tokens":-1,"completion_tokens":2}}`, `{"usage":{}}`, `not json`} {
		if u, ok := ParseJSON(OpenAI, []byte(bad)); ok {
			t.Errorf("%q: read %+v", bad, u)
		}
	}
}

// Every way of cutting a stream into pieces reads the same usage: a line
// split anywhere, or many lines in one piece.
func TestSSEUsage(t *testing.T) {
	for _, tc := range []struct {
		file string
		api  API
		want Usage
		ok   bool
	}{
		{"openai_chat_usage.sse", OpenAI, Usage{Input: 18, Output: 2, Total: 20}, true},
		{"openai_chat_plain.sse", OpenAI, Usage{}, false},
		{"openai_responses.sse", OpenAI, Usage{Input: 37, Output: 11, CacheRead: 32, Total: 48}, true},
		{"anthropic.sse", Anthropic, Usage{Input: 25, Output: 15, CacheWrite: 100, CacheRead: 50}, true},
		{"anthropic_error.sse", Anthropic, Usage{}, false},
	} {
		stream := fixture(t, tc.file)
		for piece := 1; piece <= len(stream); piece = piece*2 + 1 {
			s := SSE{API: tc.api}
			for p := stream; len(p) > 0; {
				n := min(piece, len(p))
				s.Observe(p[:n])
				p = p[n:]
			}
			got, ok := s.Usage()
			if ok != tc.ok || got != tc.want {
				t.Errorf("%s in pieces of %d: %+v %v, want %+v %v", tc.file, piece, got, ok, tc.want, tc.ok)
			}
		}
	}
	// An Anthropic stream cut before message_delta reported no output.
	s := SSE{API: Anthropic}
	full := fixture(t, "anthropic.sse")
	s.Observe(full[:bytes.Index(full, []byte("event: message_delta"))])
	if u, ok := s.Usage(); ok {
		t.Errorf("a stream cut before message_delta: %+v", u)
	}
}

// Stripping the usage the sidecar asked for gives back, byte for byte, the
// stream the client would have had without include_usage.
// Both as Go and as Python's json.dumps space a chunk's JSON.
func TestSSEStrip(t *testing.T) {
	for _, spacing := range []string{"", "_spaced"} {
		with, without := fixture(t, "openai_chat_usage"+spacing+".sse"), fixture(t, "openai_chat_plain"+spacing+".sse")
		testSSEStrip(t, with, without)
	}
}

func testSSEStrip(t *testing.T, with, without []byte) {
	for piece := 1; piece <= len(with); piece++ {
		s := SSE{API: OpenAI, Strip: true}
		var out []byte
		for p := with; len(p) > 0; {
			n := min(piece, len(p))
			out = s.Filter(p[:n], out)
			p = p[n:]
		}
		out = s.Flush(out)
		if !bytes.Equal(out, without) {
			t.Fatalf("in pieces of %d:\n%s\nwant\n%s", piece, out, without)
		}
		if u, ok := s.Usage(); !ok || u.Total != 20 {
			t.Fatalf("in pieces of %d: usage %+v %v", piece, u, ok)
		}
	}
}

func TestSSELineBound(t *testing.T) {
	s := SSE{API: OpenAI, MaxLine: 64}
	s.Observe(bytes.Repeat([]byte("x"), 65))
	s.Observe(fixture(t, "openai_chat_usage.sse"))
	if u, ok := s.Usage(); ok {
		t.Fatalf("a stream past the line bound was read: %+v", u)
	}
	if len(s.line) != 0 {
		t.Fatalf("%d bytes kept after giving up", len(s.line))
	}
}

func TestReadRequest(t *testing.T) {
	for _, tc := range []struct {
		body string
		want Request
	}{
		{`{"model":"m","max_tokens":100,"messages":[]}`, Request{MaxOutput: 100, OutputField: "max_tokens"}},
		{`{"stream":true,"max_completion_tokens":50}`, Request{Stream: true, MaxOutput: 50, OutputField: "max_completion_tokens"}},
		{`{"stream":true,"max_output_tokens":70,"stream_options":{"include_usage":true}}`, Request{Stream: true, MaxOutput: 70, IncludeUsage: true, OutputField: "max_output_tokens", streamOptions: true}},
		{``, Request{}},
	} {
		got, err := ReadRequest([]byte(tc.body))
		if err != nil || got != tc.want {
			t.Errorf("%s: %+v %v, want %+v", tc.body, got, err, tc.want)
		}
	}
	if _, err := ReadRequest([]byte(`[1,2]`)); err == nil {
		t.Error("a JSON array was read as a request")
	}
	if got := Estimate(Request{MaxOutput: 100}, 301, 4, 999); got != 100+76 {
		t.Errorf("estimate %d, want 176", got)
	}
	if got := Estimate(Request{}, 10, 0, 500); got != 510 {
		t.Errorf("estimate with the default %d, want 510", got)
	}
}

func TestAddIncludeUsage(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"stream":true}`, `{"stream":true,"stream_options":{"include_usage":true}}`},
		{"{\"stream\":true}\n", `{"stream":true,"stream_options":{"include_usage":true}}`},
		{`{"stream":true,"stream_options":{"include_usage":false}}`, `{"stream":true,"stream_options":{"include_usage":true}}`},
		{`{"stream":true,"stream_options":null}`, `{"stream":true,"stream_options":{"include_usage":true}}`},
	} {
		got, err := AddIncludeUsage([]byte(tc.in))
		if err != nil || string(got) != tc.want {
			t.Errorf("%s: %s %v, want %s", tc.in, got, err, tc.want)
		}
	}
	if _, err := AddIncludeUsage([]byte(`{"stream_options":3}`)); err == nil {
		t.Error("stream_options 3 was accepted")
	}
	if !AsksUsage("/v1/chat/completions", Request{Stream: true}) || AsksUsage("/v1/responses", Request{Stream: true}) ||
		AsksUsage("/v1/chat/completions", Request{}) || AsksUsage("/v1/chat/completions", Request{Stream: true, IncludeUsage: true}) {
		t.Error("AsksUsage")
	}
}

func TestFormatOf(t *testing.T) {
	for ct, want := range map[string]Format{"text/event-stream; charset=utf-8": FormatSSE, "application/json": FormatJSON,
		"application/problem+json": FormatJSON, "text/plain": FormatNone, "": FormatNone} {
		if got := FormatOf(ct); got != want {
			t.Errorf("%q: %v, want %v", ct, got, want)
		}
	}
}

// pieces is an upstream body that hands out one piece per Read, each only
// once the test sends it, so the test can see what the client got before
// the next piece exists.
type pieces struct{ ch chan []byte }

func (p pieces) Read(b []byte) (int, error) {
	s, ok := <-p.ch
	if !ok {
		return 0, io.EOF
	}
	return copy(b, s), nil
}
func (p pieces) Close() error { return nil }

// A Body hands each piece to its reader before the next piece is sent
// upstream, with or without stripping, and reports the usage at the end.
func TestBodyPassesPiecesAsTheyCome(t *testing.T) {
	for _, strip := range []bool{false, true} {
		src := pieces{ch: make(chan []byte)}
		var got Usage
		var ok, called bool
		b := NewBody(src, BodyOptions{API: OpenAI, Format: FormatSSE, Strip: strip}, func(u Usage, k bool) { got, ok, called = u, k, true })
		stream := fixture(t, "openai_chat_usage.sse")
		var seen []byte
		buf := make([]byte, 4096)
		events := bytes.SplitAfter(stream, []byte("\n\n"))
		for i := 0; i < len(events); i++ {
			ev := events[i]
			if len(ev) == 0 {
				continue
			}
			if strip && bytes.Contains(ev, []byte(`"choices":[]`)) {
				// The client gets nothing of this event: it goes up
				// with the next one.
				i++
				ev = append(append([]byte(nil), ev...), events[i]...)
			}
			go func() { src.ch <- ev }()
			n, err := b.Read(buf)
			if err != nil || n == 0 {
				t.Fatalf("strip %v: read %d, %v", strip, n, err)
			}
			seen = append(seen, buf[:n]...)
		}
		close(src.ch)
		if _, err := b.Read(buf); err != io.EOF {
			t.Fatalf("strip %v: %v at the end", strip, err)
		}
		want := stream
		if strip {
			want = fixture(t, "openai_chat_plain.sse")
		}
		if !bytes.Equal(seen, want) || !called || !ok || got.Total != 20 {
			t.Fatalf("strip %v: saw\n%s\nusage %+v %v %v", strip, seen, got, ok, called)
		}
	}
}

func TestBodyJSON(t *testing.T) {
	var got Usage
	var ok bool
	b := NewBody(io.NopCloser(bytes.NewReader(fixture(t, "anthropic_message.json"))), BodyOptions{API: Anthropic, Format: FormatJSON},
		func(u Usage, k bool) { got, ok = u, k })
	if _, err := io.Copy(io.Discard, b); err != nil {
		t.Fatal(err)
	}
	if !ok || got.Output != 503 {
		t.Fatalf("%+v %v", got, ok)
	}
	// Over the bound: passed on, not read.
	body := fixture(t, "openai_chat.json")
	called := false
	b = NewBody(io.NopCloser(bytes.NewReader(body)), BodyOptions{API: OpenAI, Format: FormatJSON, MaxJSON: 100},
		func(u Usage, k bool) { ok, called = k, true })
	out, _ := io.ReadAll(b)
	if !bytes.Equal(out, body) || !called || ok {
		t.Fatalf("over the bound: ok %v called %v", ok, called)
	}
	// Closed before its end: no usage.
	b = NewBody(io.NopCloser(bytes.NewReader(body)), BodyOptions{API: OpenAI, Format: FormatJSON}, func(u Usage, k bool) { ok, called = k, true })
	b.Read(make([]byte, 10))
	b.Close()
	if ok {
		t.Fatal("a body closed before its end reported usage")
	}
}

func readFixture(name string) ([]byte, error) { return os.ReadFile(filepath.Join("testdata", name)) }
