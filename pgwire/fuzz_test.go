package pgwire

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

// FuzzFraming: arbitrary bytes as a startup packet and then messages never
// panic, never allocate past the caps, and end in a clean error.
func FuzzFraming(f *testing.F) {
	f.Add([]byte{0, 0, 0, 8, 4, 210, 22, 47}) // SSLRequest
	f.Add([]byte{0, 0, 0, 8, 0, 3, 0, 0, 'Q', 0, 0, 0, 9, 'S', 'E', 'L', '1', 0})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		code, payload, err := readStartup(r)
		if err != nil {
			if !errors.Is(err, ErrBadLength) && !errors.Is(err, ErrMessageTooLarge) && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("startup: unexpected error %v", err)
			}
			return
		}
		if len(payload) > MaxStartupPacketSize {
			t.Fatalf("payload of %d bytes", len(payload))
		}
		if code>>16 == 3 {
			_, _ = parseParams(payload)
		}
		var hdr [headerLen]byte
		var buf []byte
		const max = 1 << 16
		for {
			typ, n, err := readHeader(r, &hdr, max)
			if err != nil {
				return
			}
			if n > max {
				t.Fatalf("body of %d bytes over the cap", n)
			}
			if buf, err = readBody(r, buf, n); err != nil {
				return
			}
			switch typ {
			case MsgErrorResponse:
				errorFields(buf)
			case MsgAuthentication:
				if len(buf) >= 4 {
					stripChannelBinding(buf)
				}
			}
		}
	})
}
