package server

import (
	"context"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/server/serverconfig"
)

// The flood, short and in process (issue 27's property test): tenant
// flood keeps every place of admission busy with 24 callers consuming on
// SQLite, while tenant quiet makes one call at a time. Every call of quiet
// that has to wait is let in by the round robin before more than one of
// flood's (their weights are equal), and every group commit carries at
// most the events of the calls holding a place, so that no call of quiet
// waits behind more than the one batch in flight, never flood's backlog.
func TestFloodServesQuietInRoundRobinOrder(t *testing.T) {
	cfg := testConfig()
	cfg.Store = serverconfig.StoreConfig{Driver: "sqlite", DSN: filepath.Join(t.TempDir(), "governor.db")}
	cfg.Root = serverconfig.Caps{}
	cfg.Tenants = []serverconfig.TenantConfig{{Name: "flood", APIKey: "flood-key", Weight: 1}, {Name: "quiet", APIKey: "quiet-key", Weight: 1}}
	cfg.Admission = serverconfig.AdmissionConfig{MaxInFlight: 8, TenantMaxInFlight: 8, TenantMaxQueued: 64}
	srv := start(t, cfg)

	commits := func() uint64 { // batches committed so far
		var m dto.Metric
		srv.metrics.batch.Write(&m)
		return m.GetHistogram().GetSampleCount()
	}
	type quietCall struct {
		floodBefore   int    // flood's calls let in while it waited
		queued        bool   // it had to wait
		commitsAtTurn uint64 // batches committed when it was let in
		batches       uint64 // batches committed between its turn and its answer
	}
	var (
		mu         sync.Mutex
		floodIn    int
		waiting    = map[*ticket]*quietCall{}
		quietCalls []*quietCall
	)
	srv.adm.mu.Lock()
	srv.adm.trace = func(what string, tk *ticket) {
		mu.Lock()
		defer mu.Unlock()
		if tk.l.name == "flood" {
			if what == traceAdmitted {
				floodIn++
				for _, q := range waiting {
					q.floodBefore++
				}
			}
			return
		}
		switch what {
		case traceQueued:
			q := &quietCall{queued: true}
			waiting[tk] = q
		case traceAdmitted:
			q := waiting[tk]
			if q == nil {
				q = &quietCall{}
			}
			delete(waiting, tk)
			q.commitsAtTurn = commits()
			quietCalls = append(quietCalls, q) // quiet has one call at a time
		case traceFinished:
			for i := len(quietCalls) - 1; i >= 0; i-- {
				if quietCalls[i].batches == 0 {
					quietCalls[i].batches = commits() - quietCalls[i].commitsAtTurn
					break
				}
			}
		}
	}
	srv.adm.mu.Unlock()

	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var floodDone atomic.Int64
	for i := range 24 {
		c := session(t, srv.Addr(), "flood-key", 0)
		task := c.task(t, "flood-"+string(rune('a'+i)), nil)
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithCancel(c.ctx)
			defer cancel()
			go func() { <-ctx.Done(); cancel() }()
			for ctx.Err() == nil {
				if _, err := c.Consume(cctx, &governorpb.ConsumeRequest{NodeId: task.Id, Resource: "calls", Amount: 1}); err == nil {
					floodDone.Add(1)
				}
			}
		}()
	}
	quiet := session(t, srv.Addr(), "quiet-key", 0)
	task := quiet.task(t, "quiet", nil)
	// Wait until the flood fills every place: a signal, not a sleep.
	for deadline := time.Now().Add(10 * time.Second); ; {
		if st := srv.adm.stats(); st[1].inFlight == cfg.Admission.MaxInFlight && st[1].queued > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the flood never filled admission: %+v", srv.adm.stats())
		}
		time.Sleep(time.Millisecond)
	}
	mu.Lock()
	quietCalls = nil // the task's creation, before the flood was full
	mu.Unlock()
	const calls = 150
	for range calls {
		if _, err := quiet.Consume(quiet.ctx, &governorpb.ConsumeRequest{NodeId: task.Id, Resource: "calls", Amount: 1}); err != nil {
			t.Fatal(err)
		}
	}
	stop()
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	if len(quietCalls) != calls {
		t.Fatalf("%d of quiet's calls were traced, want %d", len(quietCalls), calls)
	}
	waited, worstBatches := 0, uint64(0)
	for i, q := range quietCalls {
		if q.queued {
			waited++
			if q.floodBefore > 1 {
				t.Errorf("quiet's call %d waited while %d of flood's were let in; the round robin allows 1", i, q.floodBefore)
			}
		}
		worstBatches = max(worstBatches, q.batches)
	}
	// A batch takes every event pending, and what is pending comes from
	// the calls holding a place: so a batch is bounded by the places, and
	// a call's event waits behind at most the batch in flight. (The
	// batches counted from a call's turn to its answer, logged below, also
	// count those committed while its goroutine waited to run after its
	// turn, so they are not a bound.)
	// A batch carries the events of the calls holding a place (a consume
	// emits one), never flood's backlog: at most max_in_flight here.
	var m dto.Metric
	srv.metrics.batch.Write(&m)
	for _, b := range m.GetHistogram().GetBucket() {
		if b.GetUpperBound() == float64(cfg.Admission.MaxInFlight) && b.GetCumulativeCount() != m.GetHistogram().GetSampleCount() {
			t.Errorf("%d of %d batches carried more than %d events, the places of admission", m.GetHistogram().GetSampleCount()-b.GetCumulativeCount(),
				m.GetHistogram().GetSampleCount(), cfg.Admission.MaxInFlight)
		}
	}
	if waited < calls/2 {
		t.Fatalf("only %d of quiet's %d calls had to wait: the flood did not fill admission, so nothing was tested", waited, calls)
	}
	t.Logf("quiet: %d calls, %d waited for their turn, each behind at most 1 of flood's; worst %d batches from turn to answer; flood: %d calls",
		calls, waited, worstBatches, floodDone.Load())
}

// counter reads a counter of the registry, 0 when it has no such series.
func refusals(t *testing.T, srv *Server, tenant, why string) float64 {
	t.Helper()
	var m dto.Metric
	if err := srv.metrics.refusals.WithLabelValues(tenant, why).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// api_rate on a tenant: its calls beyond the rate are refused with a
// RetryInfo, the SDK waits what it says and sends them again (so every call
// succeeds, at the rate, each refused about once), and another tenant is
// never refused.
func TestAPIRateRefusalHonouredBySDK(t *testing.T) {
	cfg := testConfig()
	cfg.Root = serverconfig.Caps{}
	cfg.Tenants = []serverconfig.TenantConfig{{Name: "rated", APIKey: "rated-key", Weight: 1, APIRate: &serverconfig.APIRate{PerSecond: 20, Burst: 1}},
		{Name: "free", APIKey: "free-key", Weight: 1}}
	srv := start(t, cfg)
	dial := func(key string) *governor.Task {
		c, err := governor.Dial(context.Background(), governor.WithAddr(srv.Addr()), governor.WithAPIKey(key))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_, task, err := c.NewTask(context.Background(), governor.Spec{Name: key})
		if err != nil {
			t.Fatal(err)
		}
		return task
	}
	rated, free := dial("rated-key"), dial("free-key")
	before := refusals(t, srv, "rated", refusedRate)

	const calls = 20
	var wg sync.WaitGroup
	wg.Add(1)
	var freeErr error
	freeDone := make(chan struct{})
	go func() {
		defer wg.Done()
		for {
			select {
			case <-freeDone:
				return
			default:
			}
			if err := free.Consume(context.Background(), "calls", 1); err != nil {
				freeErr = err
				return
			}
		}
	}()
	began := time.Now()
	for i := range calls {
		if err := rated.Consume(context.Background(), "calls", 1); err != nil {
			t.Fatalf("rated call %d: %v; the SDK should wait out the RetryInfo and succeed", i, err)
		}
	}
	took := time.Since(began)
	close(freeDone)
	wg.Wait()
	if freeErr != nil {
		t.Fatalf("the other tenant: %v", freeErr)
	}
	refused := refusals(t, srv, "rated", refusedRate) - before
	// 20 calls at 20/s with a burst of 1: about 0.95 s; the SDK's jitter
	// adds at most a quarter of each wait.
	if took < 850*time.Millisecond {
		t.Errorf("%d calls at 20/s took %v: faster than the rate", calls, took)
	}
	// Honouring the RetryInfo, a call is refused about once; retrying on
	// its own backoff (25 ms, doubling) it would be refused again and again.
	if refused < calls/2 || refused > 1.5*calls {
		t.Errorf("%v refusals for %d calls; want about one each", refused, calls)
	}
	if n := refusals(t, srv, "free", refusedRate) + refusals(t, srv, "free", refusedBusy); n != 0 {
		t.Errorf("the other tenant was refused %v times", n)
	}
	t.Logf("rated: %d calls in %v, %v refusals", calls, took, refused)
}
