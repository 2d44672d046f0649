package meter

import (
	"testing"
)

// The work metering adds to a streamed chat completion, by part: reading
// the request, adding include_usage, and filtering the stream.
//
//	go test -run '^$' -bench . ./proxy/meter
func BenchmarkRequestSide(b *testing.B) {
	body := []byte(`{"model":"gpt-4o-mini","stream":true,"max_tokens":100,"messages":[{"role":"user","content":"Say hello."}]}`)
	b.Run("ReadRequest", func(b *testing.B) {
		for range b.N {
			if _, err := ReadRequest(body); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("AddIncludeUsage", func(b *testing.B) {
		for range b.N {
			if _, err := AddIncludeUsage(body); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkStreamSide(b *testing.B) {
	stream, err := readFixture("openai_chat_usage.sse")
	if err != nil {
		b.Fatal(err)
	}
	b.Run("Filter", func(b *testing.B) {
		var out []byte
		b.SetBytes(int64(len(stream)))
		for range b.N {
			s := SSE{API: OpenAI, Strip: true}
			out = s.Filter(stream, out[:0])
		}
	})
	b.Run("Observe", func(b *testing.B) {
		b.SetBytes(int64(len(stream)))
		for range b.N {
			s := SSE{API: OpenAI}
			s.Observe(stream)
		}
	})
}
