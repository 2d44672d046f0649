package meter

import (
	"io"
	"mime"
	"sync"
)

// DefaultMaxJSON bounds the JSON response body a Body keeps to read its
// usage at the end. A longer body is passed on whole but not read: the
// call is charged what was reserved.
const DefaultMaxJSON = 4 << 20

// Format is how a response carries its usage.
type Format uint8

// The formats.
const (
	FormatNone Format = iota // neither: no usage to read
	FormatJSON               // one JSON body, usage read at its end
	FormatSSE                // a server-sent-event stream
)

// FormatOf tells a response's format by its Content-Type, whatever the
// request asked for: a request that said "stream": true is metered as the
// JSON body it got, and one that did not as the stream it got.
func FormatOf(contentType string) Format {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return FormatNone
	}
	switch {
	case mt == "text/event-stream":
		return FormatSSE
	case mt == "application/json" || (len(mt) > 5 && mt[len(mt)-5:] == "+json"):
		return FormatJSON
	}
	return FormatNone
}

// Body is a response body that reads the call's usage as the client reads
// the body, handing each piece on as it arrives. When the body ends (its
// end read, a read error, or Close), Done is called once, with the usage
// and whether the response reported it whole.
type Body struct {
	rc     io.ReadCloser
	api    API
	format Format
	sse    SSE
	strip  bool
	max    int
	json   []byte
	over   bool
	held   []byte // filtered bytes not yet handed to the client
	done   func(Usage, bool)
	once   sync.Once
}

// BodyOptions are a Body's settings.
type BodyOptions struct {
	API    API
	Format Format
	// Strip removes from an OpenAI stream the usage the sidecar asked for
	// (see SSE.Strip).
	Strip bool
	// MaxJSON bounds the JSON body kept; 0: DefaultMaxJSON. MaxLine
	// bounds an SSE line; 0: DefaultMaxLine.
	MaxJSON, MaxLine int
}

// NewBody meters rc. done is called once, when the body ends.
func NewBody(rc io.ReadCloser, o BodyOptions, done func(Usage, bool)) *Body {
	b := &Body{rc: rc, api: o.API, format: o.Format, strip: o.Strip && o.Format == FormatSSE && o.API == OpenAI,
		max: o.MaxJSON, done: done}
	if b.max <= 0 {
		b.max = DefaultMaxJSON
	}
	b.sse = SSE{API: o.API, Strip: b.strip, MaxLine: o.MaxLine}
	return b
}

func (b *Body) Read(p []byte) (int, error) {
	if b.strip {
		return b.readFiltered(p)
	}
	n, err := b.rc.Read(p)
	switch b.format {
	case FormatSSE:
		b.sse.Observe(p[:n])
	case FormatJSON:
		if !b.over {
			if len(b.json)+n > b.max {
				b.over, b.json = true, nil
			} else {
				b.json = append(b.json, p[:n]...)
			}
		}
	}
	if err != nil {
		b.end(err == io.EOF)
	}
	return n, err
}

// readFiltered reads through the SSE filter: what it holds back (the end
// of an unfinished line) is handed on once the line ends.
func (b *Body) readFiltered(p []byte) (int, error) {
	for {
		if len(b.held) > 0 {
			n := copy(p, b.held)
			b.held = b.held[n:]
			return n, nil
		}
		// Read into p itself and filter into held, which needs only as
		// much room as one event: no buffer of the reader's size per
		// stream.
		n, err := b.rc.Read(p)
		b.held = b.sse.Filter(p[:n], b.held[:0])
		if err != nil {
			b.held = b.sse.Flush(b.held)
			b.end(err == io.EOF)
			if len(b.held) > 0 {
				// What is left now; the next Read hands on the rest, then
				// reads err from rc again.
				n := copy(p, b.held)
				b.held = b.held[n:]
				return n, nil
			}
			return 0, err
		}
		if len(b.held) == 0 && n == 0 {
			return 0, nil
		}
	}
}

// Close closes the upstream body. A stream closed after it reported its
// usage (a client that stops reading at [DONE]) counts it.
func (b *Body) Close() error {
	err := b.rc.Close()
	b.end(false)
	return err
}

func (b *Body) end(eof bool) {
	b.once.Do(func() {
		var u Usage
		ok := false
		switch b.format {
		case FormatSSE:
			u, ok = b.sse.Usage()
		case FormatJSON:
			if eof && !b.over {
				u, ok = ParseJSON(b.api, b.json)
			}
			b.json = nil
		}
		if b.done != nil {
			b.done(u, ok)
		}
	})
}
