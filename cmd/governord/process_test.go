package main

// These tests run the real governord binary, as an operator would: they
// write a config file, start the process, talk to it over gRPC, and kill it
// with SIGKILL. TestMain builds the binary once.
//
// Ports: the daemon does not print the port it chose, and a crash test must
// restart it on the same address, so each test picks a free port (listen on
// :0, close) and retries with another if the daemon cannot bind it.
// Readiness is the standard gRPC health check answering SERVING, waited for
// with WaitForReady under a bounded deadline; no test sleeps to wait for it.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/internal/pgtest"
)

const (
	// crashCyclesEnv raises the number of kill -9 cycles of the crash tests.
	crashCyclesEnv = "GOVERNOR_CRASH_CYCLES"

	// readyTimeout bounds how long a start may take to answer SERVING.
	readyTimeout = 30 * time.Second
	// exitTimeout bounds how long a process that must exit may take.
	exitTimeout = 20 * time.Second
)

// governordBin is the binary TestMain built; set once, before any test.
var governordBin string

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	defer govtest.RemoveBinaries()
	var err error
	if governordBin, err = govtest.Build("cmd/governord"); err != nil {
		fmt.Fprintln(os.Stderr, "process_test:", err)
		return 1
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "process_test: leaked goroutines:", err)
			return 1
		}
	}
	return code
}

// ---- Bad config and bad flags ----

func TestBadConfigExits2(t *testing.T) {
	base := "listen: 127.0.0.1:0\nmetrics_listen: \"\"\nstore: {driver: memory}\n"
	tests := []struct {
		name   string
		config string // "" means no config file
		args   []string
		want   []string // substrings of stderr
	}{
		{name: "unknown key", config: base + "colour: blue\n", want: []string{"colour", "unknown key"}},
		{name: "unknown key in a tenant", config: base + "tenants:\n  - {name: a, colour: blue}\n",
			want: []string{"tenants[0].colour", "unknown key"}},
		{name: "bad duration", config: base + "session_ttl: 10 parsecs\n", want: []string{"session_ttl"}},
		{name: "ttl out of range", config: base + "session_ttl: 1ms\n", want: []string{"session_ttl", "outside"}},
		{name: "negative weight", config: base + "tenants:\n  - {name: a, api_key: k, weight: -2}\n",
			want: []string{"tenants[0].weight", "-2"}},
		{name: "negative limit", config: base + "root: {limits: {db: -1}}\n", want: []string{"root.limits.db", "negative"}},
		{name: "admission places out of range", config: base + "admission: {max_in_flight: 9223372036854775807}\n",
			want: []string{"admission.max_in_flight", "outside"}},
		{name: "api_rate not a rate", config: base + "tenants:\n  - {name: a, api_key: k, api_rate: 0/s}\n",
			want: []string{"tenants[0].api_rate", "0/s"}},
		{name: "quota period not a period", config: base + "tenants:\n  - {name: a, api_key: k, quotas: {t: {cap: 1, period: fortnight}}}\n",
			want: []string{"tenants[0].quotas.t.period", "fortnight"}},
		{name: "unknown time zone", config: base + "time_zone: Mars/Olympus_Mons\n", want: []string{"time_zone", "Mars/Olympus_Mons"}},
		{name: "unknown driver", config: "listen: 127.0.0.1:0\nstore: {driver: mysql}\n", want: []string{"store.driver", "mysql"}},
		{name: "non-loopback listen without tls", config: "listen: 0.0.0.0:7600\nmetrics_listen: \"\"\nstore: {driver: memory}\n",
			want: []string{"allow_plaintext", "0.0.0.0:7600"}},
		{name: "not yaml", config: "listen: [\n", want: []string{"YAML"}},
		{name: "missing -config", args: []string{}, want: []string{"usage"}},
		{name: "extra argument", config: base, args: []string{"-config", "CONFIG", "extra"}, want: []string{"usage"}},
		{name: "unknown flag", args: []string{"-verbose"}, want: []string{"-verbose"}},
		{name: "config file missing", args: []string{"-config", "no-such-file.yaml"}, want: []string{"-config", "no-such-file.yaml"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := tt.args
			path := ""
			if tt.config != "" {
				path = writeConfig(t, tt.config)
			}
			if args == nil {
				args = []string{"-config", path}
			}
			for i, a := range args {
				if a == "CONFIG" {
					args[i] = path
				}
			}
			code, stderr := runToExit(t, args...)
			if code != 2 {
				t.Fatalf("exit status %d, want 2; stderr:\n%s", code, stderr)
			}
			for _, w := range tt.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr does not name %q:\n%s", w, stderr)
				}
			}
		})
	}
}

func TestUnreachableStoreExits1(t *testing.T) {
	// Port 1 on loopback refuses at once; connect_timeout bounds it anyway.
	cfg := "listen: 127.0.0.1:0\nmetrics_listen: \"\"\n" +
		"store: {driver: postgres, dsn: \"postgres://governor:secret@127.0.0.1:1/governor?sslmode=disable&connect_timeout=2\"}\n"
	code, stderr := runToExit(t, "-config", writeConfig(t, cfg))
	if code != 1 {
		t.Fatalf("exit status %d, want 1; stderr:\n%s", code, stderr)
	}
	if !strings.Contains(stderr, "postgres") {
		t.Errorf("stderr does not say which store failed:\n%s", stderr)
	}
	if strings.Contains(stderr, "secret") {
		t.Errorf("stderr shows the dsn's password:\n%s", stderr)
	}
}

// runToExit runs governord with args and returns its exit status and stderr.
func runToExit(t *testing.T, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), exitTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, governordBin, args...)
	cmd.Dir = t.TempDir()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("governord %v did not exit within %v; stderr:\n%s", args, exitTimeout, stderr.String())
	}
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, stderr.String()
	case errors.As(err, &exit):
		return exit.ExitCode(), stderr.String()
	}
	t.Fatalf("run governord: %v", err)
	return 0, ""
}

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "governor.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// ---- A governord process ----

// daemon is one governord process at a time on a fixed config file and
// address; restart starts the next one on the same store and port.
type daemon struct {
	t      *testing.T
	config string
	addr   string
	health healthpb.HealthClient
	conn   *grpc.ClientConn

	// startedAt is when the newest process was started (unix ns): a restart
	// gives every session a fresh TTL from some instant after it.
	startedAt atomic.Int64

	mu      sync.Mutex
	cmd     *exec.Cmd
	stderr  *govtest.LogBuffer
	exited  chan struct{} // closed when cmd has exited
	starts  int
	earlier string // stderr of the processes before the current one
}

// startDaemon writes the config that render returns for a free port and
// starts governord on it, trying other ports if the chosen one was taken in
// the meantime. The process is killed when t ends.
func startDaemon(t *testing.T, render func(port int) string) *daemon {
	t.Helper()
	path := filepath.Join(t.TempDir(), "governor.yaml")
	for attempt := 0; ; attempt++ {
		port := freePort(t)
		if err := os.WriteFile(path, []byte(render(port)), 0o600); err != nil {
			t.Fatal(err)
		}
		d := &daemon{t: t, config: path, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
		d.conn = dial(t, d.addr)
		d.health = healthpb.NewHealthClient(d.conn)
		t.Cleanup(d.stop)
		err := d.start()
		if err == nil {
			return d
		}
		d.stop()
		if attempt < 4 && strings.Contains(err.Error(), "address already in use") {
			t.Logf("port %d was taken; trying another", port)
			continue
		}
		t.Fatal(err)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	_, port, _ := net.SplitHostPort(govtest.FreeAddr(t))
	n, _ := strconv.Atoi(port)
	return n
}

// dial opens a client connection that reconnects quickly, so that calls
// made with WaitForReady resume soon after a restart.
func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 5 * time.Millisecond, Multiplier: 1.5, Jitter: 0.2, MaxDelay: 100 * time.Millisecond},
			MinConnectTimeout: 2 * time.Second,
		}),
		grpc.WithDefaultCallOptions(grpc.WaitForReady(true)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// start starts a process and returns once it answers SERVING, or with an
// error carrying its stderr if it exits or does not get ready in time.
func (d *daemon) start() error {
	cmd := exec.Command(governordBin, "-config", d.config)
	cmd.Dir = filepath.Dir(d.config)
	stderr := &govtest.LogBuffer{}
	cmd.Stderr = stderr
	d.startedAt.Store(time.Now().UnixNano())
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start governord: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	d.mu.Lock()
	if d.stderr != nil {
		d.earlier += d.stderr.String() + "----- (killed or exited; next start)\n"
	}
	d.cmd, d.stderr, d.exited = cmd, stderr, exited
	d.starts++
	d.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	go func() {
		select {
		case <-exited:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		resp, err := d.health.Check(ctx, &healthpb.HealthCheckRequest{})
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("governord exited with status %d before it was ready; stderr:\n%s", cmd.ProcessState.ExitCode(), stderr.String())
		default:
		}
		if ctx.Err() != nil {
			return fmt.Errorf("governord was not ready within %v (last: %v); stderr:\n%s", readyTimeout, err, stderr.String())
		}
		// NOT_SERVING or a transient error: the next Check waits for the
		// connection again (WaitForReady), so this loop does not spin.
	}
}

// kill sends SIGKILL and waits for the process to be gone.
func (d *daemon) kill() {
	d.mu.Lock()
	cmd, exited := d.cmd, d.exited
	d.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGKILL)
	<-exited
}

// restart starts the next process on the same config, store and port.
func (d *daemon) restart() {
	d.t.Helper()
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		if err = d.start(); err == nil {
			return
		}
		if !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	d.t.Fatalf("restart: %v", err)
}

// waitExit waits for the current process to exit by itself and returns its
// status.
func (d *daemon) waitExit(timeout time.Duration) (int, bool) {
	d.mu.Lock()
	cmd, exited := d.cmd, d.exited
	d.mu.Unlock()
	select {
	case <-exited:
		return cmd.ProcessState.ExitCode(), true
	case <-time.After(timeout):
		return 0, false
	}
}

func (d *daemon) exitedCh() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.exited
}

func (d *daemon) stderrText() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stderr == nil {
		return ""
	}
	return d.stderr.String()
}

// stop kills the process if it still runs, and logs its stderr if the test
// failed.
func (d *daemon) stop() {
	d.kill()
	if d.t.Failed() {
		if s := d.stderrText(); s != "" {
			d.t.Logf("governord stderr (%d starts; the last 80 lines):\n%s", d.starts, tail(d.earlier+s, 80))
		}
	}
}

func tail(s string, lines int) string {
	parts := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(parts) > lines {
		parts = parts[len(parts)-lines:]
	}
	return strings.Join(parts, "\n")
}

// ---- Stores ----

type storeSpec struct {
	driver, dsn string
	database    string // postgres: the fresh database's name
}

func sqliteStore(t *testing.T) storeSpec {
	return storeSpec{driver: "sqlite", dsn: filepath.Join(t.TempDir(), "governor.db")}
}

// postgresStore creates a database of its own in the test PostgreSQL,
// dropped when t ends, so that runs never see each other's log. It skips t
// when no server is configured. appName goes into the DSN as
// application_name.
func postgresStore(t *testing.T, appName string) storeSpec {
	t.Helper()
	u, name := pgtest.Database(t, "governord_test_")
	q := u.Query()
	q.Set("application_name", appName)
	u.RawQuery = q.Encode()
	return storeSpec{driver: "postgres", dsn: u.String(), database: name}
}

// ---- Clients ----

func bearer(ctx context.Context, token string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

// errUnknown: the call got no definite answer (the daemon went away and
// the retries ran out), so it may or may not have happened.
var errUnknown = errors.New("outcome unknown")

// retryCall runs one logical call until it gets a definite answer: OK, or
// an error that is the server's decision. A transport error or a timeout
// leaves the outcome unknown, so the same request (same request id) is sent
// again; with WaitForReady the next attempt waits for the daemon to be back.
// It returns errUnknown (wrapping the last error) once ctx ends or budget
// is spent.
func retryCall(ctx context.Context, budget, perAttempt time.Duration, f func(ctx context.Context) error) error {
	deadline := time.Now().Add(budget)
	pause := time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, perAttempt)
		began := time.Now()
		err := f(actx)
		cancel()
		switch status.Code(err) {
		case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		default:
			return err
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("%w: %v", errUnknown, err)
		}
		// A dying daemon answers UNAVAILABLE at once; don't spin on it.
		if time.Since(began) < pause {
			select {
			case <-time.After(pause):
			case <-ctx.Done():
			}
			pause = min(2*pause, 100*time.Millisecond)
		}
	}
}

// openSession opens a session with key, retrying while the daemon is away.
func openSession(ctx context.Context, cli governorpb.GovernorClient, key string, ttl time.Duration) (*governorpb.OpenSessionResponse, error) {
	var resp *governorpb.OpenSessionResponse
	err := retryCall(ctx, time.Minute, 5*time.Second, func(ctx context.Context) error {
		var err error
		resp, err = cli.OpenSession(ctx, &governorpb.OpenSessionRequest{ApiKey: key, Ttl: durationpb.New(ttl)})
		return err
	})
	return resp, err
}

func getNode(t *testing.T, cli governorpb.GovernorClient, token string, id int64) *governorpb.Node {
	t.Helper()
	var n *governorpb.Node
	err := retryCall(context.Background(), 30*time.Second, 5*time.Second, func(ctx context.Context) error {
		var err error
		n, err = cli.GetNode(bearer(ctx, token), &governorpb.GetNodeRequest{NodeId: id})
		return err
	})
	if err != nil {
		t.Fatalf("GetNode %d: %v", id, err)
	}
	return n
}

// ---- The crash test ----

// crashTTL is the session TTL of the crash tests: short, so that the leases
// of sessions that died with a crash come back soon after the restart.
const crashTTL = time.Second

const (
	crashDurableClients = 8
	crashLimit          = 3 // the root's db limit: most leases held at once
	// crashQuotaPerCycle sets the tenant's tokens quota: about three
	// quarters of what the load would spend, so that it runs out during the
	// test and later cycles crash among denials too.
	crashQuotaPerCycle = 35
	crashAdminKey      = "crash-admin-key"
	crashTenantKey     = "crash-tenant-key"
	// crashIDsPerSession stays under the engine's memory of 1,024 request
	// ids per session, so every acknowledged id can be retried at the end.
	crashIDsPerSession = 1000
)

func crashCycles(t *testing.T, def int) int {
	if v := os.Getenv(crashCyclesEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q is not a positive number", crashCyclesEnv, v)
		}
		return max(n, def)
	}
	return def
}

func crashConfig(st storeSpec, quota int64) func(port int) string {
	return func(port int) string {
		return fmt.Sprintf(`listen: 127.0.0.1:%d
metrics_listen: ""
session_ttl: %v
admin_key: %s
store: {driver: %s, dsn: %q}
root:
  limits: {db: %d}
tenants:
  - name: crashers
    api_key: %s
    quotas: {tokens: %d}
reap_interval: 50ms
`, port, crashTTL, crashAdminKey, st.driver, st.dsn, crashLimit, crashTenantKey, quota)
	}
}

// TestCrashSQLite and TestCrashPostgres kill -9 governord again and again
// under concurrent load, restarting it on the same store each time, and
// then check what the clients were told against what the daemon has:
//
//   - (a) no acknowledged consume is missing: the tenant's used is at least
//     the sum of the acknowledged amounts, and retrying every acknowledged
//     request id (on the session that sent it) returns OK and charges
//     nothing: used is unchanged afterwards. Acknowledged acquires retried
//     return the same lease; acknowledged releases retried return OK.
//   - (b) no lease id was handed to two callers: across every cycle, each
//     acknowledged grant's id belongs to exactly one (session, request id).
//   - (c) no cap was exceeded: used <= quota at every restart and at the end;
//     and at a fence (an in-test counter standing in for the database the
//     leases protect) no more than the limit of clients ever worked at
//     once. A client enters the fence only with an acknowledged lease and
//     only before its local deadline (80% of the TTL after the send time of
//     its last successful heartbeat; the daemon's expiry is never earlier,
//     and a restart gives every session a fresh TTL, which is later still),
//     and leaves it before that deadline and before it releases. So every
//     client inside the fence holds a lease the daemon counts, and more than
//     `limit` inside means the daemon granted a slot it had already granted
//     (say, a grant lost in a crash). Leases whose session died with a crash
//     (the ephemeral client abandons its session at every kill) are not in
//     the fence; they hold their slot on the daemon until their session
//     expires, at most one TTL after the restart, which only lowers how many
//     may enter.
//   - Sessions survive restarts: right after every restart every session
//     not abandoned heartbeats successfully with its old token. And at any
//     time, an UNAUTHENTICATED for a session before its TTL could have run
//     out (one TTL after its newest successful heartbeat was sent, or after
//     the newest process started) fails the test; one after that is the
//     daemon's right on a loaded machine, and is only logged.
//   - Nothing leaks: once the load has stopped and every client released
//     what it held, the root's held count of db drops to 0 within a few
//     TTLs (the abandoned sessions' leases expire with them).
func TestCrashSQLite(t *testing.T) {
	runCrash(t, sqliteStore(t), crashCycles(t, 10))
}

func TestCrashPostgres(t *testing.T) {
	runCrash(t, postgresStore(t, "governord-crash-test"), crashCycles(t, 5))
}

// crashSession is one session a crash client opened, kept alive by its
// own heartbeat loop until the test ends or the session is abandoned.
type crashSession struct {
	token string
	base  time.Time    // the origin of deadline
	ids   int          // distinct request ids sent on it; its client only
	dl    atomic.Int64 // local deadline, as nanoseconds since base
	ok    atomic.Int64 // send time (unix ns) of the newest successful heartbeat or open
	lost  atomic.Bool  // the daemon said UNAUTHENTICATED
	done  chan struct{}
	once  sync.Once
}

func (s *crashSession) deadline() time.Time { return s.base.Add(time.Duration(s.dl.Load())) }

// extend moves the local deadline to 80% of the TTL after sent.
func (s *crashSession) extend(sent time.Time) {
	for {
		old := s.ok.Load()
		if sent.UnixNano() <= old || s.ok.CompareAndSwap(old, sent.UnixNano()) {
			break
		}
	}
	d := int64(sent.Sub(s.base) + crashTTL*8/10)
	for {
		old := s.dl.Load()
		if d <= old || s.dl.CompareAndSwap(old, d) {
			return
		}
	}
}

func (s *crashSession) abandon() { s.once.Do(func() { close(s.done) }) }

type ackedConsume struct {
	sess     *crashSession
	rid      string
	resource string
	amount   int64
}

type ackedLease struct {
	sess  *crashSession
	rid   string
	lease int64
}

// crashLedger is what the clients were told: only acknowledged calls.
type crashLedger struct {
	t      *testing.T
	tenant int64

	mu       sync.Mutex
	consumes []ackedConsume
	acquires []ackedLease
	releases []ackedLease
	owners   map[int64]string // lease id -> the (session, request id) it was granted to
	acks     int64
	changed  chan struct{}
	lost     int // sessions the daemon expired during the load
}

func newLedger(t *testing.T) *crashLedger {
	return &crashLedger{t: t, owners: map[int64]string{}, changed: make(chan struct{})}
}

func (l *crashLedger) ack() {
	l.acks++
	close(l.changed)
	l.changed = make(chan struct{})
}

func (l *crashLedger) consumed(c ackedConsume) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.consumes = append(l.consumes, c)
	l.ack()
}

func (l *crashLedger) granted(g ackedLease) {
	l.mu.Lock()
	defer l.mu.Unlock()
	owner := g.sess.token[:8] + "/" + g.rid
	if prev, ok := l.owners[g.lease]; ok && prev != owner {
		l.t.Errorf("lease %d was handed to two callers: %s and %s", g.lease, prev, owner)
	}
	l.owners[g.lease] = owner
	l.acquires = append(l.acquires, g)
	l.ack()
}

func (l *crashLedger) released(g ackedLease) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.releases = append(l.releases, g)
	l.ack()
}

func (l *crashLedger) count() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.acks
}

// waitAcks waits until n calls in all have been acknowledged.
func (l *crashLedger) waitAcks(n int64, timeout time.Duration) bool {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		l.mu.Lock()
		acks, ch := l.acks, l.changed
		l.mu.Unlock()
		if acks >= n {
			return true
		}
		select {
		case <-ch:
		case <-timer.C:
			return false
		}
	}
}

// leaseFence counts the clients working under a lease right now.
type leaseFence struct {
	t       *testing.T
	limit   int
	mu      sync.Mutex
	holders map[int64]int // lease id -> client
	most    int
	entries int
}

func (f *leaseFence) enter(lease int64, client int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if other, dup := f.holders[lease]; dup {
		f.t.Errorf("fence: lease %d used by clients %d and %d at once", lease, other, client)
	}
	f.holders[lease] = client
	f.entries++
	f.most = max(f.most, len(f.holders))
	if len(f.holders) > f.limit {
		f.t.Errorf("fence: %d clients work under leases at once (%v), the limit is %d", len(f.holders), f.holders, f.limit)
	}
}

func (f *leaseFence) leave(lease int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.holders, lease)
}

// crashClient is one worker of the load. A durable client keeps its
// sessions across crashes; an ephemeral one "dies" with every crash: it
// abandons its session (no release, no heartbeat) and opens a new one.
type crashClient struct {
	id        int
	ephemeral bool
	cli       governorpb.GovernorClient
	ledger    *crashLedger
	fence     *leaseFence
	rng       *mrand.Rand
	started   *atomic.Int64 // the daemon's startedAt

	mu       sync.Mutex
	sessions []*crashSession // every session it opened, the current last
	wg       *sync.WaitGroup // heartbeat loops
	seq      int
}

func (c *crashClient) current() *crashSession {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.sessions) == 0 {
		return nil
	}
	return c.sessions[len(c.sessions)-1]
}

// live returns the sessions that should still be alive.
func (c *crashClient) live() []*crashSession {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*crashSession
	for _, s := range c.sessions {
		select {
		case <-s.done:
		default:
			out = append(out, s)
		}
	}
	return out
}

// newSession opens a session and starts heartbeating it every 100ms, well
// inside the TTL/3 the API asks for, so that a session outlives the short
// outage of a restart.
func (c *crashClient) newSession(ctx context.Context) (*crashSession, error) {
	sent := time.Now()
	resp, err := openSession(ctx, c.cli, crashTenantKey, crashTTL)
	if err != nil {
		return nil, err
	}
	s := &crashSession{token: resp.GetSessionToken(), base: sent, done: make(chan struct{})}
	s.extend(sent)
	c.ledger.mu.Lock()
	c.ledger.tenant = resp.GetScopeNodeId()
	c.ledger.mu.Unlock()
	c.mu.Lock()
	c.sessions = append(c.sessions, s)
	c.mu.Unlock()
	c.wg.Add(1)
	go c.heartbeat(s)
	return s, nil
}

func (c *crashClient) heartbeat(s *crashSession) {
	defer c.wg.Done()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
		sent, start := time.Now(), c.started.Load()
		_, err := c.cli.Heartbeat(bearer(ctx, s.token), &governorpb.HeartbeatRequest{})
		cancel()
		switch status.Code(err) {
		case codes.OK:
			s.extend(sent)
		case codes.Unauthenticated:
			c.gone(s, start, "heartbeat")
			return
		}
	}
}

// gone records that the daemon called s unknown or expired, in a reply
// that has just arrived to a call sent while the newest process was the one
// started at start (unix ns). That is the daemon's right only once s's TTL
// has run out: at the earliest one TTL after the send time of its newest
// successful heartbeat, or after the start of the process (a restart gives
// a fresh TTL). An answer before both is a session lost by the daemon.
func (c *crashClient) gone(s *crashSession, start int64, what string) {
	got := time.Now()
	earliest := time.Unix(0, max(s.ok.Load(), start)).Add(crashTTL)
	if got.Before(earliest) {
		c.ledger.t.Errorf("client %d: %s: the daemon lost a live session: UNAUTHENTICATED %v before its TTL could have run out",
			c.id, what, earliest.Sub(got).Round(time.Millisecond))
	}
	if !s.lost.Swap(true) {
		c.ledger.mu.Lock()
		c.ledger.lost++
		c.ledger.mu.Unlock()
	}
}

func (c *crashClient) rid(kind string) string {
	c.seq++
	return fmt.Sprintf("%s-%d-%d", kind, c.id, c.seq)
}

// run works until stopping is set (finishing the current step first) or
// ctx ends (abruptly).
func (c *crashClient) run(ctx context.Context, stopping *atomic.Bool, t *testing.T) {
	const budget, attempt = time.Minute, 10 * time.Second
	for !stopping.Load() && ctx.Err() == nil {
		s := c.current()
		if s == nil || s.lost.Load() || (c.ephemeral && isDone(s)) || s.ids >= crashIDsPerSession {
			var err error
			if s, err = c.newSession(ctx); err != nil {
				if ctx.Err() == nil {
					t.Errorf("client %d: open session: %v", c.id, err)
				}
				return
			}
		}
		if c.rng.IntN(2) == 0 {
			c.consume(ctx, s, budget, attempt)
		} else {
			c.acquireWorkRelease(ctx, s, budget, attempt)
		}
	}
}

func isDone(s *crashSession) bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

func (c *crashClient) consume(ctx context.Context, s *crashSession, budget, attempt time.Duration) {
	req := &governorpb.ConsumeRequest{RequestId: c.rid("consume"), NodeId: c.ledger.tenantID(),
		Resource: "calls", Amount: 1 + c.rng.Int64N(3)}
	if c.rng.IntN(2) == 0 {
		req.Resource, req.Amount = "tokens", 1+c.rng.Int64N(5)
	}
	s.ids++
	var start int64
	err := retryCall(ctx, budget, attempt, func(ctx context.Context) error {
		start = c.started.Load()
		_, err := c.cli.Consume(bearer(ctx, s.token), req)
		return err
	})
	switch status.Code(err) {
	case codes.OK:
		c.ledger.consumed(ackedConsume{sess: s, rid: req.RequestId, resource: req.Resource, amount: req.Amount})
	case codes.ResourceExhausted:
		if req.Resource != "tokens" {
			c.ledger.t.Errorf("client %d: consume of %s denied: %v", c.id, req.Resource, err)
		}
	default:
		c.unexpected(ctx, s, start, "consume", err)
	}
}

func (c *crashClient) acquireWorkRelease(ctx context.Context, s *crashSession, budget, attempt time.Duration) {
	acq := &governorpb.AcquireRequest{RequestId: c.rid("acquire"), NodeId: c.ledger.tenantID(), Class: "db"}
	s.ids++
	var lease *governorpb.Lease
	var start int64
	err := retryCall(ctx, budget, attempt, func(ctx context.Context) error {
		var err error
		start = c.started.Load()
		lease, err = c.cli.Acquire(bearer(ctx, s.token), acq)
		return err
	})
	if err != nil {
		c.unexpected(ctx, s, start, "acquire", err)
		return
	}
	id := lease.GetId()
	c.ledger.granted(ackedLease{sess: s, rid: acq.RequestId, lease: id})

	// Work under the lease, but only while it is surely held.
	if left := time.Until(s.deadline()); left > 5*time.Millisecond {
		c.fence.enter(id, c.id)
		work := min(time.Duration(c.rng.Int64N(int64(3*time.Millisecond))), left-5*time.Millisecond)
		time.Sleep(work) // the work itself, not a wait for a condition
		c.fence.leave(id)
	}
	if c.ephemeral && isDone(s) {
		return // it died with the daemon: no release
	}
	rel := &governorpb.ReleaseRequest{RequestId: c.rid("release"), LeaseId: id}
	s.ids++
	err = retryCall(ctx, budget, attempt, func(ctx context.Context) error {
		start = c.started.Load()
		_, err := c.cli.Release(bearer(ctx, s.token), rel)
		return err
	})
	if err != nil {
		c.unexpected(ctx, s, start, "release", err)
		return
	}
	c.ledger.released(ackedLease{sess: s, rid: rel.RequestId, lease: id})
}

// unexpected reports an error a client should not get, unless it is the
// load being cut off, an ephemeral client's abandoned session, or a session
// the daemon expired (which gone checks). start is the daemon's startedAt
// when the call's last attempt was sent.
func (c *crashClient) unexpected(ctx context.Context, s *crashSession, start int64, what string, err error) {
	switch {
	case ctx.Err() != nil && errors.Is(err, errUnknown):
		return
	case status.Code(err) == codes.Unauthenticated && c.ephemeral && isDone(s):
		return
	case status.Code(err) == codes.Unauthenticated:
		c.gone(s, start, what)
		return
	}
	c.ledger.t.Errorf("client %d: %s: %v", c.id, what, err)
}

func (l *crashLedger) tenantID() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.tenant
}

func runCrash(t *testing.T, st storeSpec, cycles int) {
	crashQuota := int64(crashQuotaPerCycle * cycles)
	d := startDaemon(t, crashConfig(st, crashQuota))
	cli := governorpb.NewGovernorClient(d.conn)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	ledger := newLedger(t)
	fence := &leaseFence{t: t, limit: crashLimit, holders: map[int64]int{}}
	admin, err := openSession(ctx, cli, crashAdminKey, time.Hour)
	if err != nil {
		t.Fatalf("admin session: %v", err)
	}
	var hbWG sync.WaitGroup
	defer hbWG.Wait()
	var clients []*crashClient
	for i := range crashDurableClients + 1 {
		c := &crashClient{id: i, ephemeral: i == crashDurableClients, cli: cli, ledger: ledger, fence: fence,
			rng: mrand.New(mrand.NewPCG(uint64(time.Now().UnixNano()), uint64(i))), wg: &hbWG, started: &d.startedAt}
		if _, err := c.newSession(ctx); err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
		clients = append(clients, c)
	}
	defer func() {
		for _, c := range clients {
			for _, s := range c.live() {
				s.abandon()
			}
		}
	}()
	tenant := ledger.tenantID()

	var stopping atomic.Bool
	var load sync.WaitGroup
	for _, c := range clients {
		load.Add(1)
		go func() {
			defer load.Done()
			c.run(ctx, &stopping, t)
		}()
	}
	// If the test fails half-way, cut the load off before the cleanups.
	defer func() { cancel(); load.Wait() }()

	began := time.Now()
	var downtime time.Duration
	rng := mrand.New(mrand.NewPCG(uint64(began.UnixNano()), 7))
	for cycle := range cycles {
		// Kill at a random point of the load, after some progress.
		want := ledger.count() + 10 + rng.Int64N(100)
		if !ledger.waitAcks(want, time.Minute) {
			t.Fatalf("cycle %d: the load made no progress for a minute (%d acknowledged calls)", cycle, ledger.count())
		}
		for _, c := range clients {
			if c.ephemeral {
				if s := c.current(); s != nil {
					s.abandon() // it dies with the daemon
				}
			}
		}
		killed := time.Now()
		d.kill()
		d.restart()
		downtime += time.Since(killed)

		// Every session not abandoned survived, with its old token.
		for _, c := range clients {
			for _, s := range c.live() {
				if s.lost.Load() {
					continue // expired during the load; counted below
				}
				start := d.startedAt.Load()
				_, err := cli.Heartbeat(bearer(ctx, s.token), &governorpb.HeartbeatRequest{})
				switch status.Code(err) {
				case codes.OK:
				case codes.Unauthenticated:
					// An error unless a whole TTL passed since the start
					// (a stalled machine); gone tells which.
					c.gone(s, start, fmt.Sprintf("cycle %d: heartbeat right after the restart", cycle))
				default:
					t.Errorf("cycle %d: client %d's session after the restart: %v", cycle, c.id, err)
				}
			}
		}
		if _, err := cli.Heartbeat(bearer(ctx, admin.GetSessionToken()), &governorpb.HeartbeatRequest{}); err != nil {
			t.Errorf("cycle %d: the admin session did not survive the restart: %v", cycle, err)
		}
		if used := getNode(t, cli, admin.GetSessionToken(), tenant).GetUsed()["tokens"]; used > crashQuota {
			t.Errorf("cycle %d: tokens used %d > quota %d", cycle, used, crashQuota)
		}
	}
	// Some load on the last incarnation too, then stop: every client
	// finishes its step, so nothing is left in flight.
	if !ledger.waitAcks(ledger.count()+20, time.Minute) {
		t.Fatalf("after the last restart the load made no progress")
	}
	stopping.Store(true)
	load.Wait()

	ledger.mu.Lock()
	consumes, acquires, releases, lost := ledger.consumes, ledger.acquires, ledger.releases, ledger.lost
	ledger.mu.Unlock()
	if lost > 0 {
		// A session is lost only if no heartbeat got through for a whole
		// TTL while the daemon was up; on a loaded machine that can happen,
		// and it is the daemon keeping its contract, not breaking it.
		t.Logf("%d sessions expired during the load (no heartbeat got through in %v)", lost, crashTTL)
	}

	// Nothing leaks: the abandoned sessions' leases expire within a TTL of
	// the last restart; everyone else released.
	held := int64(-1)
	for wait := time.Now().Add(5 * crashTTL); time.Now().Before(wait); {
		if held = getNode(t, cli, admin.GetSessionToken(), 1).GetHeld()["db"]; held == 0 {
			break
		}
		time.Sleep(50 * time.Millisecond) // poll: expiry is the reaper's, on its own clock
	}
	if held != 0 {
		t.Errorf("root holds %d db leases after the load stopped and %v passed; want 0", held, 5*crashTTL)
	}

	// (a) and (c): what was acknowledged is on record, and no more than the
	// quota was spent.
	sum := map[string]int64{}
	for _, c := range consumes {
		sum[c.resource] += c.amount
	}
	before := getNode(t, cli, admin.GetSessionToken(), tenant).GetUsed()
	for _, r := range []string{"tokens", "calls"} {
		if before[r] < sum[r] {
			t.Errorf("%s used %d < %d acknowledged: an acknowledged consume was lost", r, before[r], sum[r])
		}
	}
	if before["tokens"] > crashQuota {
		t.Errorf("tokens used %d > quota %d", before["tokens"], crashQuota)
	}

	// Retry every acknowledged request on the session that sent it.
	var retried, skipped int
	for _, c := range consumes {
		if c.sess.lost.Load() || isDone(c.sess) {
			skipped++
			continue
		}
		_, err := cli.Consume(bearer(ctx, c.sess.token), &governorpb.ConsumeRequest{RequestId: c.rid,
			NodeId: tenant, Resource: c.resource, Amount: c.amount})
		if err != nil {
			t.Errorf("retry of acknowledged consume %s (%d %s): %v", c.rid, c.amount, c.resource, err)
		}
		retried++
	}
	for _, a := range acquires {
		if a.sess.lost.Load() || isDone(a.sess) {
			skipped++
			continue
		}
		l, err := cli.Acquire(bearer(ctx, a.sess.token), &governorpb.AcquireRequest{RequestId: a.rid, NodeId: tenant, Class: "db"})
		switch {
		case err != nil:
			t.Errorf("retry of acknowledged acquire %s: %v", a.rid, err)
		case l.GetId() != a.lease:
			t.Errorf("retry of acknowledged acquire %s returned lease %d, first %d", a.rid, l.GetId(), a.lease)
		}
		retried++
	}
	for _, r := range releases {
		if r.sess.lost.Load() || isDone(r.sess) {
			skipped++
			continue
		}
		if _, err := cli.Release(bearer(ctx, r.sess.token), &governorpb.ReleaseRequest{RequestId: r.rid, LeaseId: r.lease}); err != nil {
			t.Errorf("retry of acknowledged release %s of lease %d: %v", r.rid, r.lease, err)
		}
		retried++
	}
	root := getNode(t, cli, admin.GetSessionToken(), 1)
	after := getNode(t, cli, admin.GetSessionToken(), tenant).GetUsed()
	for _, r := range []string{"tokens", "calls"} {
		if after[r] != before[r] {
			t.Errorf("retrying acknowledged consumes changed %s used from %d to %d", r, before[r], after[r])
		}
	}
	if h := root.GetHeld()["db"]; h != 0 {
		t.Errorf("retrying acknowledged acquires left %d db leases held", h)
	}

	t.Logf("%d kill -9 cycles in %v (mean downtime %v); acknowledged: %d consumes (tokens: %d acknowledged, quota %d, used %d; calls: %d acknowledged, used %d), "+
		"%d grants, %d releases; fence: %d entries, at most %d at once (limit %d); %d retries checked, %d on dead sessions skipped",
		cycles, time.Since(began).Round(time.Millisecond), (downtime / time.Duration(cycles)).Round(time.Millisecond),
		len(consumes), sum["tokens"], crashQuota, before["tokens"], sum["calls"], before["calls"],
		len(acquires), len(releases), fence.entries, fence.most, crashLimit, retried, skipped)
}

// ---- Commit failure ----

// TestCommitFailureExits1 cuts governord's connections to PostgreSQL under
// load. The next commit fails, so the process must exit 1 promptly; after
// a restart every consume that was acknowledged is on record (the ones that
// got an error may or may not be), and no quota is overspent.
func TestCommitFailureExits1(t *testing.T) {
	const appName = "governord-crash"
	st := postgresStore(t, appName)
	const quota = 1500
	d := startDaemon(t, crashConfig(st, quota))
	cli := governorpb.NewGovernorClient(d.conn)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	type acked struct {
		token, rid, resource string
		amount               int64
	}
	var (
		mu     sync.Mutex
		ackedC []acked
		errs   int
		count  atomic.Int64
		load   sync.WaitGroup
		tenant int64
		warm   = make(chan struct{}) // closed at the 100th acknowledged consume
	)
	admin, err := openSession(ctx, cli, crashAdminKey, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	const workers = 4
	tokens := make([]string, workers)
	for i := range workers {
		// A long TTL: these sessions need no heartbeat for this test.
		s, err := openSession(ctx, cli, crashTenantKey, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		tokens[i], tenant = s.GetSessionToken(), s.GetScopeNodeId()
	}
	for i := range workers {
		load.Add(1)
		go func() {
			defer load.Done()
			for n := 0; ctx.Err() == nil; n++ {
				req := &governorpb.ConsumeRequest{RequestId: fmt.Sprintf("c-%d-%d", i, n), NodeId: tenant,
					Resource: "tokens", Amount: 1 + int64(n%3)}
				// One attempt each: after the cut the daemon must stop, and
				// the test restarts it itself.
				cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
				_, err := cli.Consume(bearer(cctx, tokens[i]), req, grpc.WaitForReady(false))
				ccancel()
				mu.Lock()
				switch status.Code(err) {
				case codes.OK:
					ackedC = append(ackedC, acked{tokens[i], req.RequestId, req.Resource, req.Amount})
					if count.Add(1) == 100 {
						close(warm)
					}
				case codes.ResourceExhausted:
				default:
					errs++
				}
				mu.Unlock()
				if err != nil && status.Code(err) != codes.ResourceExhausted {
					// The daemon is going or gone; don't spin on it.
					select {
					case <-ctx.Done():
					case <-time.After(10 * time.Millisecond):
					}
				}
			}
		}()
	}
	defer func() { cancel(); load.Wait() }()

	// Some load, then cut the daemon's connections while it goes on.
	select {
	case <-warm:
	case <-d.exitedCh():
		t.Fatalf("governord exited before its connections were cut; stderr:\n%s", tail(d.stderrText(), 20))
	case <-time.After(time.Minute):
		t.Fatalf("no progress: %d consumes acknowledged in a minute", count.Load())
	}
	terminate := fmt.Sprintf("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '%s' AND datname = '%s'",
		appName, st.database)
	cut := time.Now()
	if n := pgtest.Exec(t, pgtest.Base(t).String(), terminate); n == 0 {
		t.Fatalf("no backend of governord was found to terminate")
	}
	code, gone := d.waitExit(exitTimeout)
	if !gone {
		t.Fatalf("governord still runs %v after its database connections were cut", exitTimeout)
	}
	took := time.Since(cut)
	if code != 1 {
		t.Errorf("governord exited with status %d after a failed commit, want 1", code)
	}
	if !strings.Contains(d.stderrText(), "commit") {
		t.Errorf("governord's stderr does not say a commit failed:\n%s", tail(d.stderrText(), 20))
	}
	cancel()
	load.Wait()
	t.Logf("governord exited %d, %v after the cut", code, took.Round(time.Millisecond))

	d.restart()
	mu.Lock()
	defer mu.Unlock()
	var sum int64
	for _, a := range ackedC {
		sum += a.amount
	}
	before := getNode(t, cli, admin.GetSessionToken(), tenant).GetUsed()["tokens"]
	if before < sum {
		t.Errorf("tokens used %d after the restart < %d acknowledged: an acknowledged consume was lost", before, sum)
	}
	if before > quota {
		t.Errorf("tokens used %d > quota %d", before, quota)
	}
	for _, a := range ackedC {
		if _, err := cli.Consume(bearer(context.Background(), a.token), &governorpb.ConsumeRequest{RequestId: a.rid,
			NodeId: tenant, Resource: a.resource, Amount: a.amount}); err != nil {
			t.Errorf("retry of acknowledged consume %s: %v", a.rid, err)
		}
	}
	if after := getNode(t, cli, admin.GetSessionToken(), tenant).GetUsed()["tokens"]; after != before {
		t.Errorf("retrying acknowledged consumes changed used from %d to %d", before, after)
	}
	t.Logf("%d consumes acknowledged (%d tokens), %d errors; %d tokens on record after the restart", len(ackedC), sum, errs, before)
}

// ---- Dead worker ----

// TestDeadWorker is the original design's benchmark scenario: tenant A's
// worker takes every slot of the root's db limit on a session with a 1s TTL
// and dies (stops calling). Tenant B's acquires wait, and get the pool once
// A's session expires, about one TTL later. A's late releases, with its old
// token, are refused, and the leases stay with B.
func TestDeadWorker(t *testing.T) {
	const slots = 4
	st := sqliteStore(t)
	d := startDaemon(t, func(port int) string {
		return fmt.Sprintf(`listen: 127.0.0.1:%d
metrics_listen: ""
admin_key: dead-admin
store: {driver: %s, dsn: %q}
root:
  limits: {db: %d}
tenants:
  - {name: a, api_key: key-a}
  - {name: b, api_key: key-b}
`, port, st.driver, st.dsn, slots)
	})
	cli := governorpb.NewGovernorClient(d.conn)
	ctx := context.Background()

	admin, err := openSession(ctx, cli, "dead-admin", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	b, err := openSession(ctx, cli, "key-b", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	// A's session lives one TTL from when the daemon got OpenSession, which
	// is after this instant.
	began := time.Now()
	a, err := cli.OpenSession(ctx, &governorpb.OpenSessionRequest{ApiKey: "key-a", Ttl: durationpb.New(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	var aLeases []int64
	for range slots {
		l, err := cli.Acquire(bearer(ctx, a.GetSessionToken()), &governorpb.AcquireRequest{NodeId: a.GetScopeNodeId(), Class: "db"})
		if err != nil {
			t.Fatalf("A acquire: %v", err)
		}
		aLeases = append(aLeases, l.GetId())
	}
	// A dies here: no heartbeat, no release.

	type got struct {
		lease int64
		at    time.Duration
		err   error
	}
	results := make(chan got, slots)
	for range slots {
		go func() {
			actx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			l, err := cli.Acquire(bearer(actx, b.GetSessionToken()), &governorpb.AcquireRequest{NodeId: b.GetScopeNodeId(), Class: "db"})
			results <- got{l.GetId(), time.Since(began), err}
		}()
	}
	if h := getNode(t, cli, admin.GetSessionToken(), 1).GetHeld()["db"]; h != slots {
		t.Errorf("while A is dying the root holds %d db leases, want %d", h, slots)
	}
	var bLeases []int64
	var last time.Duration
	for range slots {
		r := <-results
		if r.err != nil {
			t.Fatalf("B acquire: %v", r.err)
		}
		bLeases = append(bLeases, r.lease)
		last = max(last, r.at)
		if r.at < 800*time.Millisecond {
			t.Errorf("B got a lease %v after A's session opened: it did not wait for A's to expire", r.at)
		}
	}
	t.Logf("B got the whole pool (%d slots) %v after A's session opened (TTL 1s)", slots, last.Round(time.Millisecond))
	if last < 800*time.Millisecond || last > 2500*time.Millisecond {
		t.Errorf("B got the pool after %v, want between 0.8s and 2.5s", last)
	}

	for _, id := range aLeases {
		_, err := cli.Release(bearer(ctx, a.GetSessionToken()), &governorpb.ReleaseRequest{LeaseId: id})
		if status.Code(err) != codes.Unauthenticated {
			t.Errorf("A's late release of lease %d: %v, want UNAUTHENTICATED", id, err)
		}
	}
	if _, err := cli.Heartbeat(bearer(ctx, a.GetSessionToken()), &governorpb.HeartbeatRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("A's late heartbeat: %v, want UNAUTHENTICATED", err)
	}
	for _, id := range bLeases {
		if _, err := cli.Validate(bearer(ctx, b.GetSessionToken()), &governorpb.ValidateRequest{LeaseId: id}); err != nil {
			t.Errorf("B's lease %d after A's late releases: %v", id, err)
		}
	}
	if h := getNode(t, cli, b.GetSessionToken(), b.GetScopeNodeId()).GetHeld()["db"]; h != slots {
		t.Errorf("B holds %d db leases after A's late releases, want %d", h, slots)
	}
	if h := getNode(t, cli, admin.GetSessionToken(), 1).GetHeld()["db"]; h != slots {
		t.Errorf("the root holds %d db leases, want %d (all B's)", h, slots)
	}
}
