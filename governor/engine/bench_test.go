package engine

import (
	"encoding/json"
	"fmt"
	"math"
	"testing"
	"time"
)

// chain builds root -> tenant -> task -> subtask, with a quota on every
// level, and returns a tenant session and the subtask.
func chain(b *testing.B) (*Engine, SessionID, NodeID) {
	return chainWith(b, newFakeClock(), nil)
}

// chainWith is chain on clock, with rates (nil for none) on every level.
func chainWith(b *testing.B, clock Clock, rates map[string]Rate) (*Engine, SessionID, NodeID) {
	b.Helper()
	e, err := New(Config{Clock: clock})
	if err != nil {
		b.Fatal(err)
	}
	big := map[string]int64{"tokens": math.MaxInt64 / 2}
	if _, err := e.SetCaps(System, RootID, CapsEdit{Quotas: big, Limits: map[string]int64{"db": 1 << 30}, Rates: rates}, ""); err != nil {
		b.Fatal(err)
	}
	ten, err := e.CreateNode(System, RootID, NodeSpec{Name: "tenant", Quotas: big, Rates: rates}, "")
	if err != nil {
		b.Fatal(err)
	}
	sid, err := e.OpenSession(ten.ID, "token", time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	task, err := e.CreateNode(sid, ten.ID, NodeSpec{Name: "task", Quotas: big, Rates: rates}, "")
	if err != nil {
		b.Fatal(err)
	}
	sub, err := e.CreateNode(sid, task.ID, NodeSpec{Name: "subtask", Quotas: big, Rates: rates}, "")
	if err != nil {
		b.Fatal(err)
	}
	return e, sid, sub.ID
}

// BenchmarkConsumeChain charges through a four-level chain from every
// goroutine at once; run it with -cpu 1,2 to see the lock under contention.
func BenchmarkConsumeChain(b *testing.B) {
	e, sid, sub := chain(b)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := e.Consume(sid, sub, "tokens", 1, ""); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// tickingClock moves one nanosecond each time it is read, so that every
// consume refills the buckets it meets (a clock that stands still would
// skip the refill's arithmetic).
type tickingClock struct{ fakeClock }

func (c *tickingClock) Now() time.Time { return time.Unix(0, c.ns.Add(1)) }

// BenchmarkConsumeChainRates is the goal of the rates work: a consume with
// a rate on each of the four levels (never binding), beside the same
// consume without rates on the same clock. Run it with -cpu 2.
func BenchmarkConsumeChainRates(b *testing.B) {
	for _, bc := range []struct {
		name  string
		rates map[string]Rate
	}{
		{"none", nil},
		{"4-levels", map[string]Rate{"tokens": {Units: 1 << 40, Per: int64(time.Second), Burst: 1 << 62}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c := &tickingClock{}
			c.ns.Store(newFakeClock().ns.Load())
			e, sid, sub := chainWith(b, c, bc.rates)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := e.Consume(sid, sub, "tokens", 1, ""); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkAcquireRelease takes and gives back a lease from every goroutine.
func BenchmarkAcquireRelease(b *testing.B) {
	e, sid, sub := chain(b)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			g, w, err := e.Acquire(sid, AcquireRequest{Node: sub, Class: "db"})
			if err != nil || w != nil {
				b.Errorf("acquire: %v (queued %v)", err, w != nil)
				return
			}
			if err := e.Release(sid, g.Lease, time.Millisecond, false, ""); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkDispatch measures one release that hands its slot to the next of
// 10,000 waiters spread over 100 tenants.
func BenchmarkDispatch(b *testing.B) {
	weights := make([]int64, 100)
	for i := range weights {
		weights[i] = 1 + int64(i%4)
	}
	p := newPool(b, 1, weights...)
	p.fill(0)
	waits := make([][]*Wait, len(weights))
	refill := func() {
		for i := range weights {
			waits[i] = append(waits[i], p.queue(i, 100-len(waits[i]))...)
		}
	}
	refill()
	lease, owner := p.held[0], 0
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := p.e.Release(p.sess[owner], lease, 0, false, ""); err != nil {
			b.Fatal(err)
		}
		found := false
		for t := range waits {
			if len(waits[t]) > 0 {
				select {
				case o := <-waits[t][0].C:
					lease, owner, found = o.Grant.Lease, t, true
					waits[t] = waits[t][1:]
				default:
				}
			}
			if found {
				break
			}
		}
		if !found {
			b.Fatal("no waiter was granted the freed slot")
		}
		if i%5000 == 4999 {
			b.StopTimer()
			refill()
			b.StartTimer()
		}
	}
}

func Example() {
	e, _ := New(Config{})
	tenant, _ := e.CreateNode(System, RootID, NodeSpec{Name: "payments", Quotas: map[string]int64{"retry": 2}}, "")
	sid, _ := e.OpenSession(tenant.ID, "token-hash", 10*time.Second)
	task, _ := e.CreateNode(sid, tenant.ID, NodeSpec{Name: "checkout-42"}, "")
	for i := range 3 {
		err := e.Consume(sid, task.ID, "retry", 1, "")
		fmt.Printf("retry %d: %v\n", i+1, err)
	}
	// Output:
	// retry 1: <nil>
	// retry 2: <nil>
	// retry 3: quota exhausted: retry on "payments" (node 2) is 2 of 2, asked 1 more; largest consumer "checkout-42" used 2
}

// BenchmarkSnapshot takes a snapshot of a tenant holding kept nodes: ended
// tasks within their retention, each with one charge, as a tenant that
// churns tasks keeps about rate x retention of them. It reports the
// encoded size, and the time the capture holds the engine's lock.
func BenchmarkSnapshot(b *testing.B) {
	for _, kept := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("kept=%d", kept), func(b *testing.B) {
			e, sid, _ := chain(b)
			ten := e.nodes[e.sessions[sid].scope.id]
			for i := range kept {
				v, err := e.CreateNode(sid, ten.id, NodeSpec{Name: fmt.Sprintf("task-%012d", i)}, "")
				if err != nil {
					b.Fatal(err)
				}
				if err := e.Consume(sid, v.ID, "calls", 1, ""); err != nil {
					b.Fatal(err)
				}
				if _, err := e.EndNode(sid, v.ID, Closed, ""); err != nil {
					b.Fatal(err)
				}
			}
			var size int
			b.ResetTimer()
			for range b.N {
				snap := e.Snapshot()
				raw, err := json.Marshal(snap)
				if err != nil {
					b.Fatal(err)
				}
				size = len(raw)
			}
			b.StopTimer()
			began := time.Now()
			e.Snapshot()
			b.ReportMetric(float64(time.Since(began).Microseconds())/1000, "capture-ms")
			b.ReportMetric(float64(size)/float64(kept), "bytes/kept")
			b.ReportMetric(float64(size)/1e6, "MB")
		})
	}
}
