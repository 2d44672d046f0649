package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/proxy/httpproxy"
	"github.com/governor-project/governor/proxy/meter/fakellm"
)

// The phases of a read-only test's load: what a request that ran within
// one may get.
const (
	phaseActive   int32 = iota // before read_only: everything passes
	phaseChanging              // a change is under way: not checked
	phaseReadOnly              // read_only in force here: writes refused, reads pass
	phaseResumed               // active again in force here: everything passes
	phaseCount
)

// recallsActedOn is how many recalls of delegated budgets the sidecar has
// acted on.
const recallsActedOn = `governor_proxy_notices_total{kind="recall"}`

// readOnlyLoad drives a tenant from active to read_only and back while
// workers keep sending reads and writes through the real sidecar, and
// checks each answer against the phase its request ran in. The state
// is in force in the sidecar once SetTenantState has returned (delegation
// off: every request is a call) or once the sidecar has acted on the recall
// the change sent (delegation on); at that instant the test's own next
// write must get the new answer (within one call), and so must every
// request the workers send from then on until the next change.
type readOnlyLoad struct {
	t        *testing.T
	p        *testProxy
	delegate bool
	setState func(state string)
	// write and read send one request (worker w, or -1: the test's own)
	// and return whether it was admitted, or the refusal's cause as the
	// client sees it ("" for anything else, with err).
	write, read func(w int) (admitted bool, refusal string, err error)

	phase   atomic.Int32
	checked [phaseCount][2]atomic.Int64 // by phase, read (0) or write (1)
}

func (l *readOnlyLoad) run(workers int) {
	t := l.t
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				l.one(w, i%2 == 1)
			}
		})
	}
	defer func() { stop(); wg.Wait() }()

	l.await(phaseActive, 20)
	l.change("read_only", phaseReadOnly)
	if ok, why, err := l.write(-1); ok || why != "read-only" {
		t.Fatalf("the first write once read_only was in force: admitted %t, refused %q, %v; want refused read-only", ok, why, err)
	}
	if ok, why, err := l.read(-1); !ok {
		t.Fatalf("the first read once read_only was in force: refused %q, %v", why, err)
	}
	l.await(phaseReadOnly, 20)
	l.change("active", phaseResumed)
	if ok, why, err := l.write(-1); !ok {
		t.Fatalf("the first write once resumed: refused %q, %v", why, err)
	}
	l.await(phaseResumed, 20)
	if l.delegate && l.p.metric(`governor_proxy_slot_grants_total{how="block"}`) == 0 {
		t.Errorf("with delegation on, no slot was granted from a delegated block")
	}
}

// one sends one request and checks its answer against the phase it ran
// in; one that ran across a change of phase is checked only for an answer
// of either state.
func (l *readOnlyLoad) one(w int, write bool) {
	ph := l.phase.Load()
	send, kind := l.read, "read"
	if write {
		send, kind = l.write, "write"
	}
	ok, why, err := send(w)
	if l.phase.Load() != ph {
		ph = phaseChanging
	}
	switch {
	case ph == phaseChanging:
		if !ok && why != "read-only" {
			l.t.Errorf("worker %d: a %s while the state changed: refused %q, %v", w, kind, why, err)
		}
		return
	case ph == phaseReadOnly && write:
		if ok || why != "read-only" {
			l.t.Errorf("worker %d: a write started once read_only was in force: admitted %t, refused %q, %v", w, ok, why, err)
		}
	case !ok:
		l.t.Errorf("worker %d: a %s in phase %d: refused %q, %v", w, kind, ph, why, err)
	}
	if write {
		l.checked[ph][1].Add(1)
	} else {
		l.checked[ph][0].Add(1)
	}
}

// await waits until at least n reads and n writes started in phase ph
// were checked.
func (l *readOnlyLoad) await(ph int32, n int64) {
	l.t.Helper()
	eventually(l.t, fmt.Sprintf("%d reads and writes in phase %d", n, ph), func() bool {
		return l.checked[ph][0].Load() >= n && l.checked[ph][1].Load() >= n
	})
}

// change sets the tenant's state and enters phase ph once it is in force
// in the sidecar.
func (l *readOnlyLoad) change(state string, ph int32) {
	l.t.Helper()
	recalls := l.p.metric(recallsActedOn)
	l.phase.Store(phaseChanging)
	l.setState(state)
	if l.delegate {
		eventually(l.t, "the sidecar acting on the recall of "+state, func() bool { return l.p.metric(recallsActedOn) > recalls })
	}
	l.phase.Store(ph)
}

// A tenant goes read_only mid-load, through the real sidecar, both ways:
// once the change is in force there (delegation on: the sidecar has acted
// on the recall it sent), its next write and every write started
// afterwards is 403 Governor-Denied: read-only, on a rule with a class and
// a charge, with a charge only and with a class only, while reads still
// pass; resuming lets writes in again as promptly.
func TestReadOnlyMidLoad(t *testing.T) {
	for _, delegate := range []bool{false, true} {
		t.Run(fmt.Sprintf("delegation=%t", delegate), func(t *testing.T) {
			g := startGovernord(t, nil)
			o := origin(t, http.HandlerFunc(hello), false, false)
			base := hostURL(o, "origin.test")
			p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: fmt.Sprintf("delegation: {enabled: %t}\n", delegate) + `rules:
  - {name: both, match: {host: origin.test, path: /both}, class: api, charge: {calls: 1}}
  - {name: charge, match: {host: origin.test, path: /charge}, charge: {calls: 1}}
  - {name: slot, match: {host: origin.test, path: /slot}, class: api}
`})
			paths := []string{"/both", "/charge", "/slot"}
			var n atomic.Int64
			client := p.client("", nil) // one, so that connections are reused
			send := func(method string) func(int) (bool, string, error) {
				return func(int) (bool, string, error) {
					path := paths[n.Add(1)%int64(len(paths))]
					req, err := http.NewRequest(method, base+path, strings.NewReader("x"))
					if err != nil {
						return false, "", err
					}
					resp, err := client.Do(req)
					if err != nil {
						return false, "", err
					}
					readAll(t, resp)
					if resp.StatusCode == 200 {
						return true, "", nil
					}
					if resp.StatusCode == 403 {
						return false, resp.Header.Get(httpproxy.HeaderDenied), nil
					}
					return false, "", fmt.Errorf("%s %s: %d %q", method, path, resp.StatusCode, resp.Header.Get(httpproxy.HeaderDenied))
				}
			}
			l := &readOnlyLoad{t: t, p: p, delegate: delegate, setState: stateSetter(t, newAdmin(t, g.Addr())),
				write: send(http.MethodPost), read: send(http.MethodGet)}
			l.run(4)
		})
	}
}

// pgwire, the same: once read_only is in force in the sidecar, an INSERT
// (a rule with a charge only) and one in a transaction with a class are
// ERROR 25006 while SELECTs run, and the connections stay usable; after
// resuming INSERTs run again.
func TestReadOnlyMidLoadThroughPGWire(t *testing.T) {
	pgUpstream(t)
	for _, delegate := range []bool{false, true} {
		t.Run(fmt.Sprintf("delegation=%t", delegate), func(t *testing.T) {
			table := "pgq_romidload"
			freshPGTable(t, table)
			g := startGovernord(t, nil)
			p := startProxy(t, proxyOpts{gaddr: g.Addr(), yaml: fmt.Sprintf("delegation: {enabled: %t}\n", delegate) + pgListenerYAML(t, "") + `rules:
  - {name: writes, match: {sql: [insert], tables: ["pgq_*"]}, charge: {db_writes: 1}}
  - {name: reads, match: {sql: any}, class: db}
`})
			const workers = 3
			conns := make([]*pgx.Conn, workers+1) // the last is the test's own
			for i := range conns {
				conns[i] = pgConnect(t, pgDSN(p.PGWireAddrs()[0], ""))
			}
			conn := func(w int) *pgx.Conn {
				if w < 0 {
					return conns[workers]
				}
				return conns[w]
			}
			var n atomic.Int64
			run := func(sql func() string) func(int) (bool, string, error) {
				return func(w int) (bool, string, error) {
					_, err := conn(w).Exec(context.Background(), sql())
					if err == nil {
						return true, "", nil
					}
					var pe *pgconn.PgError
					if errors.As(err, &pe) && pe.Severity == "ERROR" && pe.Code == "25006" && strings.Contains(pe.Message, "read-only") {
						return false, "read-only", nil
					}
					return false, "", err
				}
			}
			write := run(func() string {
				if n.Add(1)%2 == 0 { // in a transaction that holds a db slot first
					return fmt.Sprintf("BEGIN; SELECT 1; INSERT INTO %s VALUES (%d); COMMIT", table, n.Load())
				}
				return fmt.Sprintf("INSERT INTO %s VALUES (%d)", table, n.Load())
			})
			read := run(func() string { return "SELECT count(*) FROM " + table })
			l := &readOnlyLoad{t: t, p: p, delegate: delegate, setState: stateSetter(t, newAdmin(t, g.Addr())), write: write, read: read}
			l.run(workers)
			for _, c := range conns {
				pgAlive(t, c)
			}
		})
	}
}

// stateSetter returns a function that sets the state of the tenant
// "payments" as the operator a does.
func stateSetter(t *testing.T, a *admin) func(string) {
	tenant := a.node("payments")
	return func(state string) {
		t.Helper()
		if _, err := a.c.Raw().SetTenantState(context.Background(), &governorpb.SetTenantStateRequest{NodeId: tenant.GetId(), State: state, Reason: "test " + state}); err != nil {
			t.Fatal(err)
		}
	}
}

// A metered LLM call is a POST, so a write: a read-only tenant's is
// refused (403 read-only) before it reaches the provider, both ways, once
// the change is in force in the sidecar (delegation on: once it has acted
// on the recall the change sent; a call in between may still be granted
// from what was delegated before, as readOnlyLoad says), and nothing of
// its estimate stays held; resuming lets it through.
func TestReadOnlyMeteredCall(t *testing.T) {
	for _, delegation := range []string{"", "delegation: {enabled: false}"} {
		t.Run(fmt.Sprintf("delegation=%v", delegation == ""), func(t *testing.T) {
			fake := &fakellm.Provider{}
			e := startLLM(t, 1_000_000, fake, delegation)
			setState := stateSetter(t, e.adm)
			call := func() (int, string) {
				resp := e.post("/openai/chat/completions", "", `{"model":"m","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`)
				readAll(t, resp)
				return resp.StatusCode, resp.Header.Get(httpproxy.HeaderDenied)
			}
			if code, denied := call(); code != 200 {
				t.Fatalf("a call before: %d %q", code, denied)
			}
			recalls := e.p.metric(recallsActedOn)
			setState("read_only")
			if delegation == "" { // in force once the sidecar has acted on the recall the change sent
				eventually(t, "the sidecar acting on the recall", func() bool { return e.p.metric(recallsActedOn) > recalls })
			}
			if code, denied := call(); code != 403 || denied != "read-only" {
				t.Fatalf("a call while read-only: %d %q, want 403 read-only", code, denied)
			}
			if _, n := fake.Reported(); n != 1 {
				t.Errorf("the provider saw %d calls, want only the one before", n)
			}
			setState("active")
			eventually(t, "a call admitted after resuming", func() bool { code, _ := call(); return code == 200 })
			if delegation != "" { // each call's estimate is held exactly, and settled in the background
				eventually(t, "no tokens held", func() bool { return e.adm.node("payments", "pod-7").GetReserved()["tokens"] == 0 })
			}
		})
	}
}
