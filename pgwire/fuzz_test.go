package pgwire

import (
	"bytes"
	"errors"
	"io"
	"slices"
	"testing"

	"github.com/governor-project/governor/classify"
)

// FuzzClassifySQL: any text classifies without panicking, to known kinds,
// the same way twice. Seeds: testdata/fuzz/FuzzClassifySQL.
func FuzzClassifySQL(f *testing.F) {
	f.Add("WITH x AS (DELETE FROM a RETURNING *) SELECT * FROM x FOR UPDATE")
	f.Add("SELECT $$a$$, $t$;$t$, E'\\'', U&\"x\" /* /* */ */ FROM b; --")
	known := map[string]bool{}
	for _, k := range classify.SQLKinds() {
		known[k] = true
	}
	f.Fuzz(func(t *testing.T, sql string) {
		a, b := ClassifySQL(sql), ClassifySQL(sql)
		if !slices.Equal(a.Kinds, b.Kinds) || !slices.Equal(a.Tables, b.Tables) {
			t.Fatalf("not deterministic: %+v vs %+v", a, b)
		}
		for _, k := range a.Kinds {
			if !known[k] {
				t.Fatalf("unknown kind %q", k)
			}
		}
		for _, tb := range a.Tables {
			if tb == "" {
				t.Fatal("empty table name")
			}
		}
	})
}

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
