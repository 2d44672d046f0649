package httpproxy

import (
	"bytes"
	"io"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestIdleExchangeCopiesWithoutAllocatingABuffer: goproxy copies every
// response with io.Copy into the wrapper, which must neither lose bytes nor
// allocate a 32 KiB buffer per response (it did, until it had a ReadFrom
// of its own).
func TestIdleExchangeCopiesWithoutAllocatingABuffer(t *testing.T) {
	body := strings.Repeat("x", 1024)
	r := httptest.NewRequest("GET", "http://example.com/", nil)
	const n = 200
	copyOnce := func() {
		rec := httptest.NewRecorder()
		x := newIdleExchange(rec, r, time.Minute)
		before := x.last.Load()
		got, err := io.Copy(x, struct{ io.Reader }{strings.NewReader(body)}) // a body, as a response's is, with no WriteTo
		x.done()
		if err != nil || got != int64(len(body)) || rec.Body.String() != body {
			t.Fatalf("copied %d bytes (%v), the client got %q", got, err, rec.Body.String())
		}
		if x.last.Load() < before {
			t.Fatal("the copy did not count as progress")
		}
	}
	copyOnce()
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	for range n {
		copyOnce()
	}
	runtime.ReadMemStats(&m1)
	if per := (m1.TotalAlloc - m0.TotalAlloc) / n; per >= 16<<10 {
		t.Errorf("%d bytes allocated per copy of a 1 KiB body; a 32 KiB copy buffer is being allocated each time", per)
	}
}

// TestIdleExchangeReadFromWritesThroughTheWrapper: a copy's writes count
// as the exchange's progress, so a slow but moving download is not cut.
func TestIdleExchangeReadFromWritesThroughTheWrapper(t *testing.T) {
	rec := httptest.NewRecorder()
	x := newIdleExchange(rec, httptest.NewRequest("GET", "http://example.com/", nil), time.Minute)
	defer x.done()
	x.last.Store(0)
	rf, ok := any(x).(io.ReaderFrom)
	if !ok {
		t.Fatal("the idle exchange has no ReadFrom")
	}
	if _, err := rf.ReadFrom(bytes.NewReader([]byte("abc"))); err != nil {
		t.Fatal(err)
	}
	if x.last.Load() == 0 || rec.Body.String() != "abc" {
		t.Fatalf("progress %d, body %q", x.last.Load(), rec.Body.String())
	}
}
