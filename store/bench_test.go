package store_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/governor-project/governor/store"
)

// benchNote pads each event to about the size of a real one.
var benchNote = strings.Repeat("x", 80)

// BenchmarkLogCommit measures the write-before-reply path as the server uses
// it: parallel callers each make a change under the engine lock, Emit it,
// and WaitDurable before "replying". It reports committed records per
// second and the mean group-commit batch.
//
//	go test -run '^$' -bench LogCommit ./store/   (after `source scripts/testpg.sh` for postgres)
func BenchmarkLogCommit(b *testing.B) {
	for _, be := range backends() {
		b.Run(be.name, func(b *testing.B) {
			for _, par := range []int{1, 8, 64} {
				emitters := par * runtime.GOMAXPROCS(0)
				b.Run(fmt.Sprintf("emitters=%d", emitters), func(b *testing.B) {
					benchLogCommit(b, be, par)
				})
			}
		})
	}
}

func benchLogCommit(b *testing.B, be backend, parallelism int) {
	open := be.fresh(b)
	st := open()
	defer st.Close()
	var records, commits atomic.Int64
	observe := func(n int, _ time.Duration) {
		records.Add(int64(n))
		commits.Add(1)
	}
	e := &engine{}
	e.log = store.NewLog(st, func(ev event) (store.Record, error) {
		return store.Record{Seq: ev.seq, Data: fmt.Appendf(nil, "%d:%s", ev.seq, benchNote)}, nil
	}, store.LogOptions{Observe: observe})
	run := startRun(b, e.log)

	b.SetParallelism(parallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			if err := e.log.WaitDurable(ctx, e.apply()); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	if err := run.stop(); err != nil {
		b.Fatalf("Run: %v", err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
	if c := commits.Load(); c > 0 {
		b.ReportMetric(float64(records.Load())/float64(c), "records/commit")
	}
}

// BenchmarkStoreAppend measures one backend's Append alone, one transaction
// per batch, to tell the store's cost from the Log's.
func BenchmarkStoreAppend(b *testing.B) {
	for _, be := range backends() {
		b.Run(be.name, func(b *testing.B) {
			for _, batch := range []int{1, 64, 1024} {
				b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
					open := be.fresh(b)
					st := open()
					defer st.Close()
					ctx := context.Background()
					rs := make([]store.Record, batch)
					var seq uint64
					b.ResetTimer()
					for b.Loop() {
						for i := range rs {
							seq++
							rs[i] = store.Record{Seq: seq, Data: fmt.Appendf(nil, "%d:%s", seq, benchNote)}
						}
						if err := st.Append(ctx, rs); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(float64(seq)/b.Elapsed().Seconds(), "records/s")
				})
			}
		})
	}
}
