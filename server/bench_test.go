package server

// Benchmarks of governord as a client sees it: real gRPC over loopback to a
// Server started in process. They run only with -bench:
//
//	go test ./server -run '^$' -bench . -benchtime 3s
//	(source scripts/testpg.sh first for the postgres cases)
//
// docs/governord-performance.md holds the figures and what they mean.

import (
	"context"
	"crypto/sha256"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor/engine"
	"github.com/governor-project/governor/internal/pgtest"
	"github.com/governor-project/governor/server/serverconfig"
)

var benchCallers = []int{1, 16, 64}

// benchShape is how the callers reach the server: over how many
// connections, and whether those are dialed with fixed flow-control
// windows, as the SDK dials. The plain "callers=N" cases give every caller
// a connection of its own with gRPC's default dial options; the variants
// below come after them, with names that say how they differ.
type benchShape struct {
	callers     int
	conns       int  // connections the callers share; caller i uses conn i%conns
	fixedWindow bool // grpc.WithStatic{Stream,Conn}WindowSize, as the SDK sets them
}

func (s benchShape) String() string {
	name := fmt.Sprintf("callers=%d", s.callers)
	if s.conns != s.callers {
		name += fmt.Sprintf(",conns=%d", s.conns)
	}
	if s.fixedWindow {
		name += ",window=fixed"
	}
	return name
}

// benchShapes lists the cases: one caller per connection for each of
// benchCallers, then 64 callers with SDK-like windows, sharing 4
// connections (as a sidecar multiplexes its tasks' calls), and both.
func benchShapes() []benchShape {
	var out []benchShape
	for _, n := range benchCallers {
		out = append(out, benchShape{callers: n, conns: n})
	}
	return append(out,
		benchShape{callers: 64, conns: 64, fixedWindow: true},
		benchShape{callers: 64, conns: 4},
		benchShape{callers: 64, conns: 4, fixedWindow: true})
}

// benchWindow mirrors the SDK's fixed flow-control window (governor/client.go).
const benchWindow = 1 << 20

// BenchmarkConsume measures consumes per second through gRPC, each caller
// with its own session (and, in the plain callers=N cases, its own
// connection; see benchShapes), every call with a request id (as
// the SDK and the proxies send them), on each store. Every consume is
// committed before it is answered, so the durable stores measure group
// commit as well.
func BenchmarkConsume(b *testing.B) {
	for _, driver := range []string{"memory", "sqlite", "postgres"} {
		b.Run(driver, func(b *testing.B) {
			for _, shape := range benchShapes() {
				b.Run(shape.String(), func(b *testing.B) {
					srv := benchServer(b, benchStoreConfig(b, driver))
					callers := benchSessions(b, srv.Addr(), shape)
					commits, events := benchCommits(b, srv)
					benchRun(b, callers, "consumes/s", func(c *benchCaller, i int64) error {
						_, err := c.gov.Consume(c.ctx, &governorpb.ConsumeRequest{
							RequestId: strconv.FormatInt(i, 10), NodeId: c.scope, Resource: "tokens", Amount: 1})
						return err
					})
					// Group commit: how many events each store transaction carried.
					if c, e := benchCommits(b, srv); c > commits {
						b.ReportMetric((e-events)/float64(c-commits), "events/commit")
					}
				})
			}
		})
	}
}

// BenchmarkNoopCall is the ceiling BenchmarkConsume is measured against:
// the standard gRPC health check, which does nothing, on the same server,
// connections and callers.
func BenchmarkNoopCall(b *testing.B) {
	for _, shape := range benchShapes() {
		b.Run(shape.String(), func(b *testing.B) {
			srv := benchServer(b, serverconfig.StoreConfig{Driver: "memory"})
			callers := benchSessions(b, srv.Addr(), shape)
			benchRun(b, callers, "calls/s", func(c *benchCaller, _ int64) error {
				_, err := c.health.Check(c.ctx, &healthpb.HealthCheckRequest{})
				return err
			})
		})
	}
}

// benchCaller is one client: its own session, on a connection of its own
// or shared (benchShape).
type benchCaller struct {
	gov    governorpb.GovernorClient
	health healthpb.HealthClient
	ctx    context.Context // carries the session token
	scope  int64
}

// benchCommits reads the commit-batch histogram: how many commits so far
// and how many events they carried.
func benchCommits(b *testing.B, srv *Server) (commits uint64, events float64) {
	b.Helper()
	mfs, err := srv.metrics.reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "governor_commit_batch_size" && len(mf.GetMetric()) == 1 {
			h := mf.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum()
		}
	}
	return 0, 0
}

func benchServer(b *testing.B, st serverconfig.StoreConfig) *Server {
	b.Helper()
	// No snapshots, no metrics listener: only the call path is measured.
	st.SnapshotEvery = 1 << 40
	cfg := serverconfig.Config{Listen: "127.0.0.1:0", SessionTTL: time.Hour, Store: st,
		Tenants: []serverconfig.TenantConfig{{Name: "bench", APIKey: "bench-key", Weight: 1}}}
	srv, err := Start(context.Background(), cfg, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { srv.Close() })
	return srv
}

func benchSessions(b *testing.B, addr string, shape benchShape) []*benchCaller {
	b.Helper()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if shape.fixedWindow {
		opts = append(opts, grpc.WithStaticStreamWindowSize(benchWindow), grpc.WithStaticConnWindowSize(benchWindow))
	}
	conns := make([]*grpc.ClientConn, shape.conns)
	for i := range conns {
		conn, err := grpc.NewClient(addr, opts...)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { conn.Close() })
		conns[i] = conn
	}
	out := make([]*benchCaller, shape.callers)
	for i := range out {
		conn := conns[i%len(conns)]
		gov := governorpb.NewGovernorClient(conn)
		resp, err := gov.OpenSession(context.Background(), &governorpb.OpenSessionRequest{ApiKey: "bench-key"})
		if err != nil {
			b.Fatal(err)
		}
		out[i] = &benchCaller{gov: gov, health: healthpb.NewHealthClient(conn), scope: resp.GetScopeNodeId(),
			ctx: metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+resp.GetSessionToken())}
	}
	return out
}

// benchRun shares b.N calls among the callers, each calling in a loop, and
// reports the rate as unit.
func benchRun(b *testing.B, callers []*benchCaller, unit string, call func(c *benchCaller, i int64) error) {
	b.Helper()
	// Warm up every connection and the server's paths before timing
	// (negative request ids, apart from the timed ones).
	for i, c := range callers {
		if err := call(c, -1-int64(i)); err != nil {
			b.Fatal(err)
		}
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	cpu := benchCPU(b)
	b.ResetTimer()
	for _, c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				if err := call(c, i); err != nil {
					failed.CompareAndSwap(nil, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	cpu = benchCPU(b) - cpu
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), unit)
	// CPU time per call, client and server together (both are this
	// process): unlike the rate, it hardly moves when other processes
	// compete for the machine.
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/op")
}

// benchCPU is the CPU time this process has used, user and system.
func benchCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchStoreConfig returns a fresh, empty store of driver for one round.
func benchStoreConfig(b *testing.B, driver string) serverconfig.StoreConfig {
	b.Helper()
	switch driver {
	case "sqlite":
		return serverconfig.StoreConfig{Driver: "sqlite", DSN: filepath.Join(b.TempDir(), "governor.db")}
	case "postgres":
		dsn, _ := pgtest.Database(b, "governor_bench_")
		return serverconfig.StoreConfig{Driver: "postgres", DSN: dsn.String()}
	}
	return serverconfig.StoreConfig{Driver: "memory"}
}

// restartEvents is how many events BenchmarkRestart puts on record.
const restartEvents = 1_000_000

// BenchmarkRestart measures Start on a SQLite store holding restartEvents
// events: replaying all of them ("events=1000000"), or restoring a
// snapshot that covers them all ("snapshot"). It reports seconds per
// restart (Start until ready; Close is not timed). The store is built once
// per case, before the timer, by a server driven directly through its
// engine: 100 sessions doing consumes and acquire/release pairs, each with
// a request id.
func BenchmarkRestart(b *testing.B) {
	for _, snap := range []bool{false, true} {
		name := fmt.Sprintf("events=%d", restartEvents)
		if snap {
			name = "snapshot"
		}
		// Built once and kept across the rounds of the case (each round
		// runs the function below again); removed with the parent's TempDir.
		path := filepath.Join(b.TempDir(), "governor.db")
		built := false
		b.Run(name, func(b *testing.B) {
			cfg := restartConfig(path)
			if !built {
				benchBuildLog(b, cfg, snap)
				built = true
			}
			ctx := context.Background()
			b.ResetTimer()
			for range b.N {
				b.StartTimer()
				srv, err := Start(ctx, cfg, nil)
				b.StopTimer()
				if err != nil {
					b.Fatal(err)
				}
				if got := srv.eng.Seq(); got < restartEvents {
					b.Fatalf("recovered seq %d, want >= %d", got, restartEvents)
				}
				if err := srv.Close(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s/restart")
			b.ReportMetric(0, "ns/op") // s/restart says it
		})
	}
}

func restartConfig(path string) serverconfig.Config {
	return serverconfig.Config{Listen: "127.0.0.1:0", SessionTTL: time.Hour,
		Store:   serverconfig.StoreConfig{Driver: "sqlite", DSN: path, SnapshotEvery: 1 << 40},
		Tenants: []serverconfig.TenantConfig{{Name: "bench", APIKey: "bench-key", Weight: 1}}}
}

// benchBuildLog fills the store of cfg with restartEvents events (and a
// snapshot of them all, if snap) through a running server, so that the
// records are exactly what governord writes.
func benchBuildLog(b *testing.B, cfg serverconfig.Config, snap bool) {
	b.Helper()
	began := time.Now()
	ctx := context.Background()
	srv, err := Start(ctx, cfg, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	eng := srv.eng
	tenant := srv.keys[sha256.Sum256([]byte("bench-key"))]
	const sessions = 100
	sids := make([]engine.SessionID, sessions)
	for i := range sids {
		if sids[i], err = eng.OpenSession(tenant, fmt.Sprintf("%064x", i+1), time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	for i := 0; eng.Seq() < restartEvents; i++ {
		sid, rid := sids[i%sessions], "r"+strconv.Itoa(i)
		if i%2 == 0 {
			err = eng.Consume(sid, tenant, "tokens", 1, rid)
		} else {
			var g engine.Grant
			if g, _, err = eng.Acquire(sid, engine.AcquireRequest{Node: tenant, Class: "db", RequestID: rid}); err == nil {
				err = eng.Release(sid, g.Lease, time.Millisecond, false, rid+"r")
			}
		}
		if err != nil {
			b.Fatal(err)
		}
		// Keep the backlog bounded: wait for the log now and then.
		if i%8192 == 0 {
			if err := srv.events.WaitDurable(ctx, eng.Seq()); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := srv.events.WaitDurable(ctx, eng.Seq()); err != nil {
		b.Fatal(err)
	}
	if snap {
		if err := srv.snapshot(ctx); err != nil {
			b.Fatal(err)
		}
	}
	size := 0
	if snap {
		data, err := encodeSnapshot(eng.Snapshot(), 0, nil)
		if err != nil {
			b.Fatal(err)
		}
		size = len(data)
	}
	b.Logf("built a store of %d events in %v (snapshot: %v, %d bytes)", eng.Seq(), time.Since(began).Round(time.Millisecond), snap, size)
}
