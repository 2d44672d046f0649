package faultproxy

import (
	"encoding/binary"
	"sync"
)

// A lost answer: the call reaches the upstream, which acts on it, and the
// connection breaks before the answer gets back. The client cannot tell
// whether the call took effect; that is the fault request ids exist for.
// The proxy finds calls and answers in the HTTP/2 frames gRPC sends (one
// stream per call), reading only the frames' 9-byte headers, never their
// contents.

// DropNextAnswer loses the answer to the next call a client starts through
// the proxy: when the upstream's answer to it (the HEADERS frame that opens
// the reply) arrives, the connection it came on is cut instead, and
// whatever the upstream sent before it on that connection is passed on.
// Connections that do not speak HTTP/2 are never cut by it.
func (p *Proxy) DropNextAnswer() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropArmed = true
}

// AnswersDropped is how many answers DropNextAnswer has lost so far.
func (p *Proxy) AnswersDropped() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dropped
}

// http2Preface opens every HTTP/2 connection a client makes.
const http2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// HTTP/2 frames (RFC 9113, section 4.1): a 9-byte header of a 24-bit
// payload length, a type, flags and a 31-bit stream id.
const (
	frameHeaderLen = 9
	frameHeaders   = 0x1
	frameSettings  = 0x4
)

// link is one proxied connection's view of its HTTP/2 frames.
type link struct {
	client, upstream frames

	mu       sync.Mutex
	newest   uint32 // the newest stream the client opened
	watching uint32 // the stream whose answer is to be dropped; 0 for none
}

func newLink() *link {
	return &link{client: frames{preface: len(http2Preface)}}
}

// fromClient passes every byte on; a call the client opens while an answer
// is to be dropped becomes the one whose answer is.
func (l *link) fromClient(p *Proxy, chunk []byte) (int, bool) {
	l.client.scan(chunk, func(_ int, kind byte, stream uint32) {
		if kind != frameHeaders || stream <= l.newest {
			return // not a new call: trailers, or another frame
		}
		l.newest = stream
		p.mu.Lock()
		defer p.mu.Unlock()
		l.mu.Lock()
		defer l.mu.Unlock()
		if p.dropArmed && l.watching == 0 {
			p.dropArmed, l.watching = false, stream
		}
	})
	return len(chunk), false
}

// fromUpstream passes bytes on up to the answer to the watched call, and
// then has the connection cut.
func (l *link) fromUpstream(p *Proxy, chunk []byte) (int, bool) {
	l.mu.Lock()
	watching := l.watching
	l.mu.Unlock()
	cutAt := -1
	l.upstream.scan(chunk, func(at int, kind byte, stream uint32) {
		if cutAt < 0 && watching != 0 && kind == frameHeaders && stream == watching {
			cutAt = at
		}
	})
	if cutAt < 0 {
		return len(chunk), false
	}
	p.mu.Lock()
	p.dropped++
	p.mu.Unlock()
	return cutAt, true
}

// frames follows the frame boundaries of one direction of a connection
// across reads.
type frames struct {
	preface int    // bytes of the client's preface still to check
	checked int    // bytes of the preface checked so far
	head    []byte // a frame header read in part
	payload int    // bytes of the current frame's payload still to come
	first   bool   // the first frame has been seen
	off     bool   // not HTTP/2: look no further
}

// scan calls found for each frame whose header ends in chunk, with where
// the frame starts in chunk (0 when it began in an earlier one).
func (f *frames) scan(chunk []byte, found func(at int, kind byte, stream uint32)) {
	for i := 0; i < len(chunk) && !f.off; {
		switch {
		case f.preface > 0:
			n := min(f.preface, len(chunk)-i)
			if string(chunk[i:i+n]) != http2Preface[f.checked:f.checked+n] {
				f.off = true
				return
			}
			f.preface -= n
			f.checked += n
			i += n
		case f.payload > 0:
			n := min(f.payload, len(chunk)-i)
			f.payload -= n
			i += n
		default:
			start := i - len(f.head)
			n := min(frameHeaderLen-len(f.head), len(chunk)-i)
			f.head = append(f.head, chunk[i:i+n]...)
			i += n
			if len(f.head) < frameHeaderLen {
				return
			}
			kind := f.head[3]
			if !f.first && kind != frameSettings {
				f.off = true // every HTTP/2 endpoint starts with SETTINGS
				return
			}
			f.first = true
			f.payload = int(f.head[0])<<16 | int(f.head[1])<<8 | int(f.head[2])
			stream := binary.BigEndian.Uint32(f.head[5:9]) & (1<<31 - 1)
			f.head = f.head[:0]
			found(max(start, 0), kind, stream)
		}
	}
}
