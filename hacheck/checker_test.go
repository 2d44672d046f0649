package hacheck

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/internal/hacluster"
)

// failoversEnv sets how many failovers TestFailoversAreLinearizable
// causes; the default is a short run for CI.
const failoversEnv = "GOVERNOR_HA_FAILOVERS"

func TestMain(m *testing.M) {
	code := m.Run()
	govtest.RemoveBinaries()
	os.Exit(code)
}

// The faults, injected in turn, each on the governord that leads.
type fault int

const (
	faultKill      fault = iota // kill -9
	faultPause                  // SIGSTOP until the other leads, then SIGCONT
	faultBlackhole              // its PostgreSQL connections go into a blackhole
	faultPGRestart              // PostgreSQL restarts under both
	numFaults
)

func (f fault) String() string {
	return [...]string{"kill -9", "SIGSTOP past the lease", "blackhole to PostgreSQL", "PostgreSQL restart"}[f]
}

// recorder keeps the history of every client's calls.
type recorder struct {
	base time.Time
	mu   sync.Mutex
	ops  []porcupine.Operation
	// acked counts consumes the clients were told of; lastOK is when a
	// call last succeeded (for the time a failover took).
	acked  int64
	lastOK time.Time
}

func (r *recorder) now() int64 { return int64(time.Since(r.base)) }

// add records one call. A call without a definite answer may take effect
// at any later time: its return is the end of the history.
func (r *recorder) add(client int, in input, call int64, out output) {
	ret := r.now()
	if out.unknown {
		ret = math.MaxInt64
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = append(r.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret})
	if !out.unknown {
		r.lastOK = time.Now()
		if in.kind == opConsume {
			r.acked++
		}
	}
}

// definite says whether err is governord's answer rather than a call that
// went unanswered.
func definite(err error) bool {
	return !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) &&
		!errors.Is(err, governor.ErrUnavailable)
}

// callTimeout bounds each call: a governord that is paused answers
// nothing, and the client moves on (its outcome is then unknown).
const callTimeout = 2 * time.Second

// client is one worker: a session through the SDK given both addresses,
// making random calls until stop closes.
func client(t *testing.T, id int, addrs string, rec *recorder, down *downstream, stop <-chan struct{}) {
	c, err := governor.Dial(context.Background(), governor.WithAddr(addrs), governor.WithAPIKey(tenantKey),
		governor.WithTTL(sessionTTL))
	if err != nil {
		t.Errorf("client %d: dial: %v", id, err)
		return
	}
	defer c.Close()
	ctx, task, _, err := c.FindOrCreateTask(context.Background(), governor.Spec{Name: "checked", Quotas: map[string]int64{"calls": math.MaxInt32}})
	if err != nil {
		t.Errorf("client %d: task: %v", id, err)
		return
	}
	rng := rand.New(rand.NewPCG(uint64(id), 14))
	for {
		select {
		case <-stop:
			return
		default:
		}
		if c.Err() != nil {
			t.Errorf("client %d lost its session: %v", id, c.Err())
			return
		}
		switch r := rng.IntN(10); {
		case r < 5:
			consume(ctx, id, task, rec)
		case r < 7:
			read(ctx, id, c, task.ID(), rec)
		default:
			lockCycle(ctx, id, task, rec, down)
		}
	}
}

func consume(ctx context.Context, id int, task *governor.Task, rec *recorder) {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	call := rec.now()
	err := task.Consume(cctx, "calls", 1)
	rec.add(id, input{kind: opConsume}, call, output{unknown: err != nil})
}

func read(ctx context.Context, id int, c *governor.Client, node int64, rec *recorder) {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	call := rec.now()
	n, err := c.Raw().GetNode(cctx, &governorpb.GetNodeRequest{NodeId: node})
	if err != nil {
		return // a read without an answer says nothing
	}
	rec.add(id, input{kind: opRead}, call, output{value: n.GetUsed()["calls"]})
}

// lockCycle takes the limit-1 class, uses the downstream with its fencing
// token, validates and releases.
func lockCycle(ctx context.Context, id int, task *governor.Task, rec *recorder, down *downstream) {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	call := rec.now()
	l, err := task.Acquire(cctx, lockClass)
	cancel()
	if err != nil {
		// The SDK gave back whatever an unanswered acquire was granted.
		rec.add(id, input{kind: opAcquire}, call, output{unknown: true})
		return
	}
	rec.add(id, input{kind: opAcquire}, call, output{value: l.ID()})
	if down.enter(l.ID()) {
		down.leave(l.ID())
	}
	cctx, cancel = context.WithTimeout(ctx, callTimeout)
	call = rec.now()
	err = l.Validate(cctx)
	cancel()
	switch {
	case err == nil:
		rec.add(id, input{kind: opValidate, lease: l.ID()}, call, output{ok: true})
	case definite(err):
		rec.add(id, input{kind: opValidate, lease: l.ID()}, call, output{ok: false})
	}
	cctx, cancel = context.WithTimeout(ctx, callTimeout)
	defer cancel()
	call = rec.now()
	err = l.Release(cctx, 0, false)
	rec.add(id, input{kind: opRelease, lease: l.ID()}, call, output{ok: err == nil, unknown: err != nil && !definite(err)})
}

func failovers(t *testing.T, def int) int {
	if v := os.Getenv(failoversEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number", failoversEnv, v)
		}
		return n
	}
	return def
}

// run starts two governords over a PostgreSQL of the test's own, runs
// clients while it causes n failovers, and returns what was recorded.
type runResult struct {
	rec        *recorder
	down       *downstream
	finalUsed  int64
	failovers  []time.Duration // from each fault to the next successful call
	faultKinds []fault
}

func runCluster(t *testing.T, n int, faults []fault, env []string, probe bool) runResult {
	bin, err := buildGovernord()
	if err != nil {
		t.Fatal(err)
	}
	pg := startPG(t)
	nodes := []*node{newNode(t, bin, "a", pg.dsn, env), newNode(t, bin, "b", pg.dsn, env)}
	leader := waitLeader(t, nodes)
	rec := &recorder{base: time.Now()}
	down := &downstream{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	addrs := nodes[0].Addr + "," + nodes[1].Addr
	for i := range 4 {
		wg.Add(1)
		go func() { defer wg.Done(); client(t, i, addrs, rec, down, stop) }()
	}
	res := runResult{rec: rec, down: down}
	var probes map[*node]*prober
	if probe {
		probes = map[*node]*prober{nodes[0]: newProber(t, nodes[0].Addr), nodes[1]: newProber(t, nodes[1].Addr)}
	}
	for i := range n {
		waitProgress(t, rec, 50)
		f := faults[i%len(faults)]
		began := time.Now()
		t.Logf("failover %d: %s of %s", i+1, f, leader.Name)
		switch f {
		case faultKill:
			leader.Signal(syscall.SIGKILL)
			leader.Wait()
		case faultPause:
			leader.Signal(syscall.SIGSTOP)
			waitLeader(t, others(nodes, leader))
			var asked chan struct{}
			if p := probes[leader]; p != nil {
				// Reads sent to the paused leader after the new one has
				// acknowledged a consume: once it wakes it must not answer
				// them from its old state.
				waitAckAfter(t, rec, time.Now())
				asked = p.readAll(rec)
			}
			leader.Signal(syscall.SIGCONT)
			if asked != nil {
				<-asked
			}
			leader.Wait() // deposed: its next renewal or commit fails
		case faultBlackhole:
			leader.proxy.Blackhole(true)
			waitLeader(t, others(nodes, leader))
			leader.Wait()
			leader.proxy.Blackhole(false)
		case faultPGRestart:
			pg.restart(t)
		}
		for _, nd := range nodes {
			if !nd.Running() {
				if err := nd.Start(); err != nil {
					t.Fatal(err)
				}
			}
		}
		leader = waitLeader(t, nodes)
		res.failovers = append(res.failovers, waitSuccessAfter(t, rec, began))
		res.faultKinds = append(res.faultKinds, f)
	}
	waitProgress(t, rec, 50)
	close(stop)
	wg.Wait()
	res.finalUsed = finalRead(t, addrs, rec)
	return res
}

// prober reads the counter from one governord only, on a session opened
// while it led.
type prober struct {
	c    *governor.Client
	task int64
}

func newProber(t *testing.T, addr string) *prober {
	t.Helper()
	c, err := governor.Dial(context.Background(), governor.WithAddr(addr), governor.WithAPIKey(tenantKey), governor.WithTTL(sessionTTL))
	if err != nil {
		return nil // a standby: this probe stays unused
	}
	t.Cleanup(func() { c.Close() })
	_, task, _, err := c.FindOrCreateTask(context.Background(), governor.Spec{Name: "checked"})
	if err != nil {
		t.Fatal(err)
	}
	return &prober{c: c, task: task.ID()}
}

// readAll sends several reads at once and records those answered; the
// channel closes when all have returned.
func (p *prober) readAll(rec *recorder) chan struct{} {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			call := rec.now()
			n, err := p.c.Raw().GetNode(ctx, &governorpb.GetNodeRequest{NodeId: p.task})
			if err == nil {
				rec.add(100+i, input{kind: opRead}, call, output{value: n.GetUsed()["calls"]})
			}
		}()
	}
	go func() { wg.Wait(); close(done) }()
	return done
}

// waitAckAfter waits until a consume is acknowledged after since.
func waitAckAfter(t *testing.T, rec *recorder, since time.Time) {
	t.Helper()
	rec.mu.Lock()
	want := rec.acked + 1
	rec.mu.Unlock()
	deadline := time.Now().Add(time.Minute)
	for {
		rec.mu.Lock()
		acked := rec.acked
		rec.mu.Unlock()
		if acked >= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no consume was acknowledged within a minute of the takeover")
		}
		time.Sleep(5 * time.Millisecond) // polling a count
	}
}

func others(nodes []*node, not *node) []*node {
	return slices.DeleteFunc(slices.Clone(nodes), func(n *node) bool { return n == not })
}

// waitLeader waits until one of nodes leads, and returns it.
func waitLeader(t *testing.T, nodes []*node) *node {
	t.Helper()
	members := make([]*hacluster.Member, len(nodes))
	for i, n := range nodes {
		members[i] = n.Member
	}
	m, err := hacluster.Leader(members, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.Member == m {
			return n
		}
	}
	return nil
}

// waitProgress waits until k more calls have succeeded.
func waitProgress(t *testing.T, rec *recorder, k int) {
	t.Helper()
	count := func() int {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return len(rec.ops)
	}
	want := count() + k
	deadline := time.Now().Add(2 * time.Minute)
	for count() < want {
		if time.Now().After(deadline) {
			t.Fatalf("the clients made no progress in two minutes")
		}
		time.Sleep(10 * time.Millisecond) // polling a count
	}
}

// waitSuccessAfter waits for a call that succeeded after began and returns
// how long after.
func waitSuccessAfter(t *testing.T, rec *recorder, began time.Time) time.Duration {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		rec.mu.Lock()
		last := rec.lastOK
		rec.mu.Unlock()
		if last.After(began) {
			return last.Sub(began)
		}
		if time.Now().After(deadline) {
			t.Fatal("no call succeeded within two minutes of the fault")
		}
		time.Sleep(5 * time.Millisecond) // polling a time
	}
}

// finalRead reads the counter once all clients have stopped, into the
// history too.
func finalRead(t *testing.T, addrs string, rec *recorder) int64 {
	t.Helper()
	c, err := governor.Dial(context.Background(), governor.WithAddr(addrs), governor.WithAPIKey(tenantKey))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, task, _, err := c.FindOrCreateTask(context.Background(), governor.Spec{Name: "checked"})
	if err != nil {
		t.Fatal(err)
	}
	call := rec.now()
	n, err := c.Raw().GetNode(context.Background(), &governorpb.GetNodeRequest{NodeId: task.ID()})
	if err != nil {
		t.Fatal(err)
	}
	used := n.GetUsed()["calls"]
	rec.add(99, input{kind: opRead}, call, output{value: used})
	return used
}

func summarize(res runResult) (median, worst time.Duration) {
	d := slices.Clone(res.failovers)
	slices.Sort(d)
	return d[len(d)/2], d[len(d)-1]
}

// TestFailoversAreLinearizable causes failovers of every kind under load and
// checks the history, the count of consumes and the downstream.
func TestFailoversAreLinearizable(t *testing.T) {
	n := failovers(t, int(numFaults))
	faults := []fault{faultKill, faultPause, faultBlackhole, faultPGRestart}
	res := runCluster(t, n, faults, nil, true)
	median, worst := summarize(res)
	t.Logf("%d failovers; %d calls recorded; %d consumes acknowledged, %d counted; fault to the next successful call: median %v, max %v",
		n, len(res.rec.ops), res.rec.acked, res.finalUsed, median, worst)
	if res.finalUsed < res.rec.acked {
		t.Errorf("%d acknowledged consumes were lost (%d acknowledged, %d counted)", res.rec.acked-res.finalUsed, res.rec.acked, res.finalUsed)
	}
	if res.down.doubleHeld != 0 {
		t.Errorf("the downstream saw two holders of the limit-1 class at once %d times", res.down.doubleHeld)
	}
	if err := check(res.rec.ops); err != nil {
		t.Error(err)
	}
	fmt.Fprintf(os.Stderr, "ha: %d failovers, fault to next success: median %v, max %v\n", n, median, worst)
}

// pausedLeaderReads runs the paused-leader case step by step: a consume at
// the leader, the leader paused past its lease, a consume acknowledged by
// the new leader, then reads sent to the old one, which is woken. It
// returns the history.
func pausedLeaderReads(t *testing.T, env []string) []porcupine.Operation {
	bin, err := buildGovernord()
	if err != nil {
		t.Fatal(err)
	}
	pg := startPG(t)
	nodes := []*node{newNode(t, bin, "a", pg.dsn, env), newNode(t, bin, "b", pg.dsn, env)}
	old := waitLeader(t, nodes)
	rec := &recorder{base: time.Now()}
	p := newProber(t, old.Addr)
	consumeAt := func(addr string) {
		c, err := governor.Dial(context.Background(), governor.WithAddr(addr), governor.WithAPIKey(tenantKey))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ctx, task, _, err := c.FindOrCreateTask(context.Background(), governor.Spec{Name: "checked"})
		if err != nil {
			t.Fatal(err)
		}
		call := rec.now()
		if err := task.Consume(ctx, "calls", 1); err != nil {
			t.Fatal(err)
		}
		rec.add(0, input{kind: opConsume}, call, output{})
	}
	consumeAt(old.Addr)
	<-p.readAll(rec) // answered by the leader, with the count 1
	old.Signal(syscall.SIGSTOP)
	next := waitLeader(t, others(nodes, old))
	consumeAt(next.Addr)
	asked := p.readAll(rec)
	old.Signal(syscall.SIGCONT)
	<-asked
	old.Wait()
	return rec.ops
}

// TestCheckerCatchesALeaderServingPastItsLease plants the bug the term
// guards against: a leader that answers whether or not its lease is valid,
// until a renewal tells it it was deposed. Paused past its lease and woken,
// it answers reads sent after the new leader acknowledged a consume from
// its old state, and the checker must say the history is not linearizable.
// The same steps without the bug must pass.
func TestCheckerCatchesALeaderServingPastItsLease(t *testing.T) {
	t.Run("planted", func(t *testing.T) {
		ops := pausedLeaderReads(t, []string{"GOVERNOR_TEST_HA_IGNORE_LEASE=1"})
		err := check(ops)
		if err == nil {
			t.Fatalf("the checker passed a history with a leader serving past its lease (%d calls)", len(ops))
		}
		t.Logf("caught: %v", err)
	})
	t.Run("correct", func(t *testing.T) {
		if err := check(pausedLeaderReads(t, nil)); err != nil {
			t.Fatal(err)
		}
	})
}
