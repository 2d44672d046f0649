package pgwire_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/governor-project/governor/pgwire"
)

// Issue 10, point 4: before login, a client's answer to an authentication
// request is held to PostgreSQL's own cap (65,535 bytes), not to the cap
// after login. A client that announces a larger one is refused at once,
// before the proxy allocates or waits for it; before, the proxy took up to
// 256 MiB and waited for it until the startup timeout.
func TestLoginMessageCap(t *testing.T) {
	p := &pgwire.Proxy{}
	addr := startProxy(t, p)
	for i, tc := range []struct {
		user string
		size int // the body length announced
	}{
		{"gov_scram", 10 << 20},         // SASLInitialResponse
		{"gov_password", 65535 - 4 + 1}, // a cleartext password one byte over
	} {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		nc.SetDeadline(time.Now().Add(5 * time.Second))
		fe := pgproto3.NewFrontend(nc, nc)
		fe.Send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion30,
			Parameters: map[string]string{"user": tc.user, "database": "governor"}})
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
		m, err := fe.Receive()
		if err != nil {
			t.Fatalf("%s: %v", tc.user, err)
		}
		switch m.(type) {
		case *pgproto3.AuthenticationSASL, *pgproto3.AuthenticationCleartextPassword:
		default:
			t.Fatalf("%s: got %#v, want a password request", tc.user, m)
		}
		// The header alone, and the first bytes of the body.
		hdr := binary.BigEndian.AppendUint32([]byte{'p'}, uint32(4+tc.size))
		if _, err := nc.Write(append(hdr, "SCRAM-SHA-256\x00"...)); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		m, err = fe.Receive()
		var e *pgproto3.ErrorResponse
		if err != nil || !asError(m, &e) || e.Severity != "FATAL" || e.Code != "08P01" || !strings.Contains(e.Message, "too large") {
			t.Fatalf("%s: got %#v, %v; want FATAL 08P01, message too large", tc.user, m, err)
		}
		if _, err := fe.Receive(); !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("%s: after the FATAL: %v, want EOF", tc.user, err)
		}
		t.Logf("%s: refused after %v: %s", tc.user, time.Since(start).Round(time.Millisecond), e.Message)
		if got := p.Counts()["too_large"]; got != uint64(i+1) {
			t.Fatalf("too_large counted %d times, want %d", got, i+1)
		}
	}
	// A login within the caps goes on as before.
	for _, user := range []struct{ u, p string }{{"gov_scram", "scrampass"}, {"gov_password", "cleartextpass"}} {
		connect(t, dsn(addr, user.u, user.p, ""))
	}
}

func asError(m pgproto3.BackendMessage, e **pgproto3.ErrorResponse) bool {
	var ok bool
	*e, ok = m.(*pgproto3.ErrorResponse)
	return ok
}

// MaxMessageSize is the cap after login. A message over it ends the
// connection with a FATAL that says why (08P01), not in silence; one
// under it goes through.
func TestMaxMessageSize(t *testing.T) {
	const limit = 64 << 10
	p := &pgwire.Proxy{MaxMessageSize: limit}
	addr := startProxy(t, p)
	c := connect(t, superDSN(addr))
	ctx := context.Background()
	pad := func(n int) string { return "SELECT 1 -- " + strings.Repeat("x", n) }
	if _, err := c.Exec(ctx, pad(limit-100)); err != nil {
		t.Fatalf("a query under the cap: %v", err)
	}
	_, err := c.Exec(ctx, pad(limit+100))
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Severity != "FATAL" || pe.Code != "08P01" || !strings.Contains(pe.Message, fmt.Sprint(limit)) {
		t.Fatalf("a query over the cap: %v, want FATAL 08P01 naming the cap %d", err, limit)
	}
	if !c.IsClosed() {
		t.Fatal("the connection is still open")
	}
	p.Close() // waits for the connection's end, which counts it
	if got := p.Counts()["too_large"]; got != 1 {
		t.Fatalf("too_large counted %d times, want 1", got)
	}
}

// Issue 10, point 4: a connection lets go of a buffer it grew for one
// large message. Sixteen connections each send a 4 MiB statement and get a
// 2 MiB error back, then sit idle: before, each held both buffers (96 MiB
// in all) for as long as it stayed open.
func TestBuffersShrinkAfterLargeMessages(t *testing.T) {
	addr := startProxy(t, &pgwire.Proxy{})
	const conns = 16
	big := "SELECT 1 -- " + strings.Repeat("x", 4<<20)
	raise := "DO $$BEGIN RAISE EXCEPTION '%', repeat('y', 2 << 20); END$$"
	ncs := make([]net.Conn, conns)
	fes := make([]*pgproto3.Frontend, conns)
	for i := range ncs {
		ncs[i], fes[i] = rawLogin(t, addr)
	}
	before := heapInUse()
	for i, fe := range fes {
		for _, q := range []string{big, raise} {
			fe.Send(&pgproto3.Query{String: q})
			if err := fe.Flush(); err != nil {
				t.Fatal(err)
			}
			for done := false; !done; {
				m, err := fe.Receive()
				if err != nil {
					t.Fatalf("conn %d: %v", i, err)
				}
				_, done = m.(*pgproto3.ReadyForQuery)
			}
		}
		fes[i] = nil // the client's own buffers go with it
	}
	grew := heapInUse() - before
	t.Logf("the heap grew by %.1f MiB with %d idle connections after 6 MiB of messages each", float64(grew)/(1<<20), conns)
	if grew > 16<<20 {
		t.Fatalf("the heap grew by %.1f MiB: the connections keep their large buffers", float64(grew)/(1<<20))
	}
	runtime.KeepAlive(ncs)
}

func heapInUse() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}
