//go:build linux || darwin

package pgwire_test

import (
	"context"
	"encoding/binary"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/pgwire"
)

// readyQueued reports whether a ReadyForQuery has reached nc's receive
// queue, peeking at it without taking anything. Nothing may be reading nc
// meanwhile.
func readyQueued(t *testing.T, nc net.Conn) bool {
	raw, err := nc.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Error(err)
		return false
	}
	buf := make([]byte, 1<<20)
	n := 0
	raw.Control(func(fd uintptr) {
		n, _, _ = syscall.Recvfrom(int(fd), buf, syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	})
	for b := buf[:max(n, 0)]; len(b) >= 5; {
		if b[0] == 'Z' {
			return true
		}
		b = b[min(len(b), 1+int(binary.BigEndian.Uint32(b[1:5]))):]
	}
	return false
}

// Issue 10, point 5: a transaction's slot goes back before its
// ReadyForQuery is forwarded. Each round is one transaction, in the simple
// or the extended protocol; as its ticket ends, the test looks into the
// client's socket, which it does not read until then: the ReadyForQuery
// must not be there yet. The other order (forward, then end) fails this
// every time, since a write to a loopback socket is in the peer's queue
// when it returns.
func TestSlotFreeBeforeReadyForQuery(t *testing.T) {
	pgPort(t)
	srv := governord(t, 1)
	var tr *tracker
	addr := governedProxy(t, srv, governor.Spec{Name: "rfq-order"}, func(p *pgwire.Proxy) { tr = track(p) })
	nc, fe := rawLogin(t, addr)
	var early atomic.Int64
	ended := make(chan struct{}, 1)
	tr.onEnd = func() {
		if readyQueued(t, nc) {
			early.Add(1)
		}
		ended <- struct{}{}
	}
	const rounds = 20
	for i := range rounds {
		if i%2 == 0 {
			fe.Send(&pgproto3.Query{String: "SELECT 1"})
		} else {
			fe.Send(&pgproto3.Parse{Query: "SELECT $1::int"})
			fe.Send(&pgproto3.Bind{Parameters: [][]byte{[]byte("1")}})
			fe.Send(&pgproto3.Execute{})
			fe.Send(&pgproto3.Sync{})
		}
		if err := fe.Flush(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ended:
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: the transaction's ticket never ended", i)
		}
		for {
			m, err := fe.Receive()
			if err != nil {
				t.Fatal(err)
			}
			if e, ok := m.(*pgproto3.ErrorResponse); ok {
				t.Fatalf("%s %s", e.Code, e.Message)
			}
			if _, ok := m.(*pgproto3.ReadyForQuery); ok {
				break
			}
		}
	}
	if early.Load() > 0 {
		t.Fatalf("%d of %d ReadyForQuery reached the client before their slot went back", early.Load(), rounds)
	}
}

// A pool of one slot and two connections taking turns, each starting its
// transaction the moment the other's ReadyForQuery arrives: every
// admission after the first finds the slot free and is granted at once,
// with no wait.
func TestTurnsOnOneSlot(t *testing.T) {
	pgPort(t)
	srv := governord(t, 1)
	var tr *tracker
	addr := governedProxy(t, srv, governor.Spec{Name: "turns"}, func(p *pgwire.Proxy) { tr = track(p) })
	a, b := connect(t, superDSN(addr)), connect(t, superDSN(addr))
	ctx := context.Background()
	const rounds = 300
	for i := range rounds {
		for _, c := range []*pgx.Conn{a, b} {
			if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
				t.Fatalf("round %d: %v", i, err)
			}
		}
	}
	// The first admission fetches the slot from governord.
	if n := tr.slow.Load(); n > 1 {
		t.Fatalf("%d of %d admissions waited for the slot; only the first should have", n, 2*rounds)
	}
}
