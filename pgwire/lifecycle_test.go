package pgwire_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/pgwire"
	"github.com/governor-project/governor/proxy/admission"
)

// tracker is an Admitter around the sidecar's real one that notes what the
// proxy does with it: admissions that could not be granted at once (Admit
// called after TryAdmit said no), tickets open, and a hook run as each
// ticket ends, before the slot goes back.
type tracker struct {
	next interface {
		admission.Admitter
		admission.Fast
	}
	slow  atomic.Int64
	open  atomic.Int64
	onEnd func()     // nil: none
	ended chan ended // each End, when not nil (buffered; never blocks)
}

type ended struct{ at time.Time }

func track(p *pgwire.Proxy) *tracker {
	tr := &tracker{next: p.Admitter.(interface {
		admission.Admitter
		admission.Fast
	})}
	p.Admitter = tr
	return tr
}

func (tr *tracker) Admit(ctx context.Context, r admission.Request) (admission.Ticket, error) {
	tr.slow.Add(1)
	t, err := tr.next.Admit(ctx, r)
	return tr.wrap(t), err
}

func (tr *tracker) TryAdmit(r admission.Request) (admission.Ticket, bool) {
	t, ok := tr.next.TryAdmit(r)
	return tr.wrap(t), ok
}

func (tr *tracker) wrap(t admission.Ticket) admission.Ticket {
	if t == nil {
		return nil
	}
	tr.open.Add(1)
	return &trackedTicket{t: t, tr: tr}
}

type trackedTicket struct {
	t  admission.Ticket
	tr *tracker
}

func (t *trackedTicket) End(latency time.Duration, overloaded bool) {
	if t.tr.onEnd != nil {
		t.tr.onEnd()
	}
	t.t.End(latency, overloaded)
	t.tr.open.Add(-1)
	if t.tr.ended != nil {
		select {
		case t.tr.ended <- ended{at: time.Now()}:
		default:
		}
	}
}

// waitActive polls pg_stat_activity until a backend runs a query that
// contains marker, and returns its pid.
func waitActive(t *testing.T, marker string) int {
	t.Helper()
	direct := connect(t, superDSN("127.0.0.1:"+pgPort(t)))
	deadline := time.Now().Add(10 * time.Second)
	for {
		var pid int
		err := direct.QueryRow(context.Background(), `SELECT pid FROM pg_stat_activity
			WHERE state = 'active' AND query LIKE '%' || $1 || '%' AND pid <> pg_backend_pid()`, marker).Scan(&pid)
		if err == nil {
			return pid
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no backend ran %q within 10 s", marker)
		}
		runtime.Gosched()
	}
}

func terminate(t *testing.T, pid int) time.Time {
	t.Helper()
	direct := connect(t, superDSN("127.0.0.1:"+pgPort(t)))
	var ok bool
	if err := direct.QueryRow(context.Background(), "SELECT pg_terminate_backend($1)", pid).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d): %v, %v", pid, ok, err)
	}
	return time.Now()
}

// Issue 10, point 1: psql runs pg_sleep through the proxy and its backend is
// terminated. psql must get the server's FATAL and end, and the
// transaction's slot must go back, at once; before, psql hung and the slot
// stayed held until psql wrote again.
func TestServerTerminatedUnderPsql(t *testing.T) {
	pgPort(t)
	srv := governord(t, 1)
	var tr *tracker
	addr := governedProxy(t, srv, governor.Spec{Name: "terminated"}, func(p *pgwire.Proxy) {
		tr = track(p)
		tr.ended = make(chan ended, 16)
		p.WaitTimeout = time.Second
	})
	host, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command("psql", "-X", "-At", "-h", host, "-p", port, "-U", "governor", "-d", "governor",
		"-c", "SELECT pg_sleep(30) -- terminate me")
	cmd.Env = append(os.Environ(), "PGPASSWORD=governor", "PGCONNECT_TIMEOUT=10")
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		cmd.Process.Kill()
		<-exited
	}()

	at := terminate(t, waitActive(t, "terminate me"))
	select {
	case err := <-exited:
		exited <- err
		took := time.Since(at)
		t.Logf("psql ended %v after pg_terminate_backend returned: %v\n%s", took.Round(time.Millisecond), err, out.String())
		if took > 2*time.Second {
			t.Fatalf("psql took %v to end", took)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("psql still hangs 10 s after its backend was terminated:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "FATAL") || !strings.Contains(out.String(), "terminating connection due to administrator command") {
		t.Fatalf("psql did not show the server's FATAL:\n%s", out.String())
	}
	select {
	case e := <-tr.ended:
		if e.at.Sub(at) > time.Second {
			t.Fatalf("the slot went back %v after the termination", e.at.Sub(at))
		}
	default:
		t.Fatal("the terminated transaction's ticket has not ended")
	}
	if n := tr.open.Load(); n != 0 {
		t.Fatalf("%d tickets open", n)
	}
	// The pool's one slot is free: a new transaction gets it at once.
	c := connect(t, superDSN(addr))
	var one int
	if err := c.QueryRow(context.Background(), "SELECT 1").Scan(&one); err != nil {
		t.Fatalf("after the termination: %v", err)
	}
}

// pgx's TestFatalRxError and TestFatalTxError, through the proxy: the pid
// the client knows is its backend's, so that it can be terminated, and the
// client gets the FATAL and sees its connection closed, whether the backend
// dies under a query or while idle.
func TestServerTerminatedUnderPgx(t *testing.T) {
	addr := startProxy(t, &pgwire.Proxy{})
	ctx := context.Background()
	for _, busy := range []bool{true, false} {
		c := connect(t, superDSN(addr))
		var pid uint32
		if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			t.Fatal(err)
		}
		if pid != c.PgConn().PID() {
			t.Fatalf("BackendKeyData's pid %d, pg_backend_pid() %d: want the same", c.PgConn().PID(), pid)
		}
		var err error
		if busy {
			errc := make(chan error, 1)
			go func() {
				_, err := c.Exec(ctx, "SELECT pg_sleep(30) -- pgx under a query")
				errc <- err
			}()
			at := terminate(t, waitActive(t, "pgx under a query"))
			select {
			case err = <-errc:
				t.Logf("the query failed %v after the termination", time.Since(at).Round(time.Millisecond))
			case <-time.After(10 * time.Second):
				t.Fatal("the query still hangs 10 s after its backend was terminated")
			}
		} else {
			terminate(t, int(pid))
			_, err = c.Exec(ctx, "SELECT 1")
		}
		var pe *pgconn.PgError
		if busy && (!errors.As(err, &pe) || pe.Severity != "FATAL" || pe.Code != "57P01") {
			t.Fatalf("busy: %v, want the server's FATAL 57P01", err)
		}
		if err == nil {
			t.Fatal("idle: a query on a terminated backend succeeded")
		}
		if !c.IsClosed() {
			t.Fatalf("busy=%v: the connection is not closed after %v", busy, err)
		}
	}
}

// forwarder relays TCP connections to the real server, and lets the test
// end every one of them from the server's side, as a crash (a reset) or a
// server that closes without a word (a FIN) would.
type forwarder struct {
	ln    net.Listener
	up    string
	mu    sync.Mutex
	conns []*net.TCPConn // the proxy-facing ends
	wg    sync.WaitGroup
}

func forward(t *testing.T, upstream string) *forwarder {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &forwarder{ln: ln, up: upstream}
	f.wg.Add(1)
	go f.serve()
	t.Cleanup(func() {
		ln.Close()
		f.cut(false)
		f.wg.Wait()
	})
	return f
}

func (f *forwarder) serve() {
	defer f.wg.Done()
	for {
		nc, err := f.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", f.up)
		if err != nil {
			nc.Close()
			continue
		}
		f.mu.Lock()
		f.conns = append(f.conns, nc.(*net.TCPConn))
		f.mu.Unlock()
		f.wg.Add(2)
		go func() { defer f.wg.Done(); io.Copy(up, nc); up.Close() }()
		go func() { defer f.wg.Done(); io.Copy(nc, up); nc.Close() }()
	}
}

// cut ends every connection on the proxy's side: with a reset, or with a
// plain close.
func (f *forwarder) cut(reset bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, nc := range f.conns {
		if reset {
			nc.SetLinger(0)
		}
		nc.Close()
	}
	f.conns = nil
}

// When the server's connection is lost without a word (a reset, or a
// close with no FATAL), the client gets a FATAL of the proxy's own (08006)
// at once and its connection closes, and the transaction's slot goes back.
func TestServerLostWithoutFatal(t *testing.T) {
	srv := governord(t, 1)
	for _, reset := range []bool{true, false} {
		f := forward(t, "127.0.0.1:"+pgPort(t))
		var tr *tracker
		addr := governedProxy(t, srv, governor.Spec{Name: fmt.Sprintf("lost-%v", reset)}, func(p *pgwire.Proxy) {
			p.Upstream = f.ln.Addr().String()
			tr = track(p)
			p.WaitTimeout = time.Second
		})
		ctx := context.Background()
		c := connect(t, superDSN(addr))
		errc := make(chan error, 1)
		go func() {
			_, err := c.Exec(ctx, "SELECT pg_sleep(30) -- lost connection")
			errc <- err
		}()
		pid := waitActive(t, "lost connection")
		at := time.Now()
		f.cut(reset)
		var err error
		select {
		case err = <-errc:
		case <-time.After(10 * time.Second):
			t.Fatalf("reset=%v: the client still hangs 10 s after its server connection was lost", reset)
		}
		took := time.Since(at)
		t.Logf("reset=%v: the client got %v after %v", reset, err, took.Round(time.Millisecond))
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Severity != "FATAL" || pe.Code != "08006" {
			t.Fatalf("reset=%v: got %v, want FATAL 08006 from the proxy", reset, err)
		}
		if took > time.Second {
			t.Fatalf("reset=%v: the client learned of it after %v", reset, took)
		}
		if !c.IsClosed() {
			t.Fatalf("reset=%v: the client's connection is not closed", reset)
		}
		if n := tr.open.Load(); n != 0 {
			t.Fatalf("reset=%v: %d tickets still open", reset, n)
		}
		terminate(t, pid) // the orphaned pg_sleep
		c2 := connect(t, superDSN(addr))
		if _, err := c2.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatalf("reset=%v: the pool's one slot is not free: %v", reset, err)
		}
	}
}

// rawLogin logs in as gov_trust with a bare frontend, so that a test sees
// every byte the proxy sends.
func rawLogin(t *testing.T, addr string) (net.Conn, *pgproto3.Frontend) {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	fe := pgproto3.NewFrontend(nc, nc)
	fe.Send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion30,
		Parameters: map[string]string{"user": "gov_trust", "database": "governor"}})
	if err := fe.Flush(); err != nil {
		t.Fatal(err)
	}
	for {
		m, err := fe.Receive()
		if err != nil {
			t.Fatalf("login: %v", err)
		}
		switch m := m.(type) {
		case *pgproto3.ErrorResponse:
			t.Fatalf("login: %s %s", m.Code, m.Message)
		case *pgproto3.ReadyForQuery:
			nc.SetDeadline(time.Time{})
			return nc, fe
		}
	}
}

// Proxy.Close tells each client why its connection ends (FATAL 57P01) and
// then closes it, rather than cutting it off in silence.
func TestCloseTellsClients(t *testing.T) {
	pgPort(t)
	p := &pgwire.Proxy{}
	addr := startProxy(t, p)
	nc, fe := rawLogin(t, addr)
	start := time.Now()
	closed := make(chan struct{})
	go func() { p.Close(); close(closed) }()
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	m, err := fe.Receive()
	if e, ok := m.(*pgproto3.ErrorResponse); err != nil || !ok || e.Severity != "FATAL" || e.Code != "57P01" {
		t.Fatalf("got %#v, %v; want FATAL 57P01", m, err)
	}
	if _, err := fe.Receive(); !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("after the FATAL: %v, want EOF", err)
	}
	<-closed
	t.Logf("Close returned after %v", time.Since(start).Round(time.Millisecond))
}
