package governor_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/governor/engine"
	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/server"
	"github.com/governor-project/governor/server/serverconfig"
)

// dialTo opens a session with srv as its one tenant.
func dialTo(t *testing.T, srv *server.Server) *governor.Client {
	t.Helper()
	c, err := governor.Dial(t.Context(), governor.WithAddr(srv.Addr()), governor.WithAPIKey(govtest.TenantKey))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestFindOrCreateTaskFindsTheOpenTask(t *testing.T) {
	srv := govtest.Start(t, nil)
	c1, c2 := dialTo(t, srv), dialTo(t, srv)
	_, t1, created, err := c1.FindOrCreateTask(t.Context(), governor.Spec{Name: "pod-7", Quotas: map[string]int64{"x": 5}})
	if err != nil || !created {
		t.Fatalf("first FindOrCreateTask: created %v, %v", created, err)
	}
	ctx2, t2, created, err := c2.FindOrCreateTask(t.Context(), governor.Spec{Name: "pod-7"})
	if err != nil || created || t2.ID() != t1.ID() {
		t.Fatalf("second: task %v created %v, %v; want the first one (%d)", t2, created, err, t1.ID())
	}
	_, sub, created, err := c2.FindOrCreateTask(ctx2, governor.Spec{Name: "crawl-42"})
	if err != nil || !created {
		t.Fatalf("subtask: created %v, %v", created, err)
	}
	if err := t1.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := sub.ResizeBlock(t.Context(), "db", 1, 0); !errors.Is(err, governor.ErrTaskEnded) {
		t.Errorf("a block on a subtask of a closed task: %v, want ErrTaskEnded", err)
	}
	if _, _, _, err := c1.FindOrCreateTask(t.Context(), governor.Spec{}); !errors.Is(err, governor.ErrInvalidArgument) {
		t.Errorf("no name: %v", err)
	}
}

func TestBlocksAndReservationsThroughTheSDK(t *testing.T) {
	srv := govtest.Start(t, func(c *serverconfig.Config) {
		c.Root.Limits = map[string]int64{"db": 4}
		c.Tenants[0].Quotas = map[string]int64{"calls": 20}
	})
	a, b := dialTo(t, srv), dialTo(t, srv)
	_, ta, _, err := a.FindOrCreateTask(t.Context(), governor.Spec{Name: "a"})
	if err != nil {
		t.Fatal(err)
	}
	_, tb, _, err := b.FindOrCreateTask(t.Context(), governor.Spec{Name: "b"})
	if err != nil {
		t.Fatal(err)
	}

	notices := make(chan governor.Notice, 16)
	wctx, stop := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); a.Watch(wctx, func(n governor.Notice) { notices <- n }) }()
	defer func() { stop(); wg.Wait() }()

	blk, err := ta.ResizeBlock(t.Context(), "db", 4, 0)
	if err != nil || blk.Count != 4 || blk.Contended {
		t.Fatalf("block %+v, %v; want 4 slots", blk, err)
	}
	// b cannot get a slot while a's block holds them all; its acquire
	// queues, and a is told to give idle slots back.
	got := make(chan error, 1)
	go func() {
		l, err := tb.Acquire(t.Context(), "db")
		if err == nil {
			err = l.Release(t.Context(), 0, false)
		}
		got <- err
	}()
	if n := waitNotice(t, notices, governor.NoticeContended); n.NodeID != ta.ID() || n.Class != "db" {
		t.Errorf("contended notice %+v", n)
	}
	if _, err := ta.ResizeBlock(t.Context(), "db", 0, 4); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("b's acquire: %v", err)
	}
	waitNotice(t, notices, governor.NoticeUncontended)

	// Reservations: a reserves, b's consume that needs a's units waits
	// while a is told to give back, then goes through.
	res, err := ta.Reserve(t.Context(), "calls", 0, 0, 100)
	if err != nil || res.Granted != 5 {
		t.Fatalf("reservation %+v, %v; want a quarter of 20", res, err)
	}
	if err := tb.Consume(t.Context(), "calls", 15); err != nil {
		t.Fatal(err)
	}
	consumed := make(chan error, 1)
	go func() { consumed <- tb.Consume(t.Context(), "calls", 2) }()
	if n := waitNotice(t, notices, governor.NoticeRecall); n.Resource != "calls" {
		t.Errorf("recall notice %+v", n)
	}
	if _, err := ta.Reserve(t.Context(), "calls", 3, 2, 0); err != nil { // spent 3, gives 2 back
		t.Fatal(err)
	}
	if err := <-consumed; err != nil {
		t.Fatalf("b's consume after the recall: %v", err)
	}
	var d *governor.Denial
	if err := tb.Consume(t.Context(), "calls", 1); !errors.As(err, &d) || d.Used != 20 {
		t.Errorf("with 20 of 20 spent: %v", err)
	}
	if err := a.ReportSamples(t.Context(), "db", []governor.Sample{{Latency: time.Millisecond}, {Overloaded: true}}); err != nil {
		t.Errorf("ReportSamples: %v", err)
	}
}

func waitNotice(t *testing.T, ch <-chan governor.Notice, kind governor.NoticeKind) governor.Notice {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case n := <-ch:
			if n.Kind == kind {
				return n
			}
		case <-deadline:
			t.Fatalf("no %v notice", kind)
		}
	}
}

// Samples that call for a cut cut the adaptive limit at once, and the cut
// is recorded before ReportSamples replies: governord restarted on the same
// file has it.
func TestReportSamplesCutIsDurable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "governor.db")
	edit := func(c *serverconfig.Config) {
		c.Store = serverconfig.StoreConfig{Driver: "sqlite", DSN: path}
		// No interval ends during the test: only the early cut can move it.
		c.Adaptive = []engine.Adaptive{{Class: "psp", TargetP95: time.Second, MaxOverload: 0.02,
			MinLimit: 1, MaxLimit: 20, Interval: time.Hour}}
	}
	const limit = `governor_pool_limit{class="psp",tenant=""}`
	srv := govtest.Start(t, edit)
	c := dialTo(t, srv)
	calls := make([]governor.Sample, 10)
	for i := range calls {
		calls[i] = governor.Sample{Latency: time.Millisecond, Overloaded: true}
	}
	if err := c.ReportSamples(t.Context(), "psp", calls); err != nil {
		t.Fatal(err)
	}
	if got := govtest.Metric(t, srv, limit); got != 14 {
		t.Fatalf("limit %v after ten overloaded calls, want 14 (20 cut to 70%%) at once", got)
	}
	c.Close()
	srv.Close()
	again := govtest.Start(t, edit)
	if got := govtest.Metric(t, again, limit); got != 14 {
		t.Errorf("limit %v after a restart, want the cut's 14", got)
	}
}
