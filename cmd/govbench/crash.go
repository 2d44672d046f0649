package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/governor-project/governor/api/governorpb"
)

// Scenario 6: callers consume one token at a time, each call with a request
// id, while governord is killed with SIGKILL; then it is started again on
// the same store. Every consume that was acknowledged must be on record:
// sent again with its request id after the restart, it must find its
// original result and charge nothing. The calls on record that were never
// acknowledged (in flight at the kill) are counted too: allowed, the other
// way round is not.

const crashConfig = `admin_key: bench-admin-key
session_ttl: 60s
tenants:
  - {name: jobs, api_key: bench-jobs-key}
`

// crashIDsPerSession stays under the 1,024 request ids a session
// remembers, so that every acknowledged id can be checked after the restart.
const crashIDsPerSession = 1000

type crashRun struct {
	Store        string  `json:"store"`
	Callers      int     `json:"callers"`
	KilledAfterS float64 `json:"killed_after_s"`
	Acked        int     `json:"acknowledged"`
	OnRecord     int64   `json:"on_record"`
	Lost         int64   `json:"acknowledged_lost"` // acknowledged consumes that charged again when retried
	Unacked      int64   `json:"on_record_unacknowledged"`
	RestartMs    float64 `json:"restart_ms"` // from SIGKILL to the restarted governord ready
}

type ackedConsume struct {
	token, rid string
	node       int64
}

func runCrash(ctx context.Context, e *env) (*result, error) {
	callers, before := 16, 2*time.Second
	if e.short {
		callers, before = 8, 700*time.Millisecond
	}
	r, err := crashOnce(ctx, e, callers, before)
	if err != nil {
		return nil, err
	}
	res := &result{Header: []string{"store", "callers", "acknowledged", "on record after restart", "acknowledged lost", "on record, never acknowledged", "restart"},
		Raw: r}
	res.Rows = [][]string{{r.Store, strconv.Itoa(r.Callers), strconv.Itoa(r.Acked), strconv.FormatInt(r.OnRecord, 10),
		strconv.FormatInt(r.Lost, 10), strconv.FormatInt(r.Unacked, 10), fmt.Sprintf("%.0f ms", r.RestartMs)}}
	res.Notes = []string{fmt.Sprintf("governord killed with SIGKILL %.1f s into the run. Each acknowledged consume was sent again with its request id after the restart; a lost one would have charged again.", r.KilledAfterS)}
	return res, nil
}

// crashOnce runs load against governord, kills it with SIGKILL, starts it
// again on the same store and checks the acknowledged consumes against what
// is on record.
func crashOnce(ctx context.Context, e *env, callers int, before time.Duration) (*crashRun, error) {
	store := e.store
	if store == "memory" {
		// The memory store keeps nothing across a kill, by design.
		store = "sqlite"
	}
	gov, err := e.startGovernordOn(ctx, store, crashConfig)
	if err != nil {
		return nil, err
	}
	// A closure, so that it stops the governord running at the end: the
	// restart replaces the process.
	defer func() { gov.stop() }()
	acked, began, killed, err := killUnderLoad(ctx, gov, callers, before)
	if err != nil {
		return nil, err
	}
	r := &crashRun{Store: store, Callers: callers, KilledAfterS: killed.Sub(began).Seconds(), Acked: len(acked)}

	if err := gov.start(e); err != nil {
		return nil, fmt.Errorf("restart: %w", err)
	}
	r.RestartMs = float64(time.Since(killed).Microseconds()) / 1000
	if err := checkAcknowledged(ctx, gov.addr, acked, r); err != nil {
		return nil, err
	}
	fmt.Fprintf(e.log, "govbench: %d consumes acknowledged before the kill, %d on record after the restart, %d lost\n", r.Acked, r.OnRecord, r.Lost)
	return r, nil
}

// killUnderLoad runs callers against gov for before, then kills it with
// SIGKILL and waits for the callers to see it gone. It returns the consumes
// acknowledged by then, when the load began and when governord was killed.
func killUnderLoad(ctx context.Context, gov *governord, callers int, before time.Duration) (acked []ackedConsume, began, killed time.Time, err error) {
	conn, err := grpc.NewClient(gov.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, began, killed, err
	}
	defer conn.Close()
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	load := startCrashLoad(loadCtx, governorpb.NewGovernorClient(conn), callers)
	began = time.Now()
	select {
	case err := <-load.startErr:
		return nil, began, killed, fmt.Errorf("load: %w", err)
	case <-time.After(before):
	case <-ctx.Done():
		return nil, began, killed, ctx.Err()
	}
	killed = time.Now()
	if err := gov.cmd.Process.Kill(); err != nil {
		return nil, began, killed, fmt.Errorf("kill -9 governord: %w", err)
	}
	<-gov.done
	load.wg.Wait()
	return load.acked, began, killed, nil
}

// crashLoad is the scenario's callers: each consumes one token at a time,
// each call with a request id of its own, and records the acknowledged ones.
type crashLoad struct {
	wg       sync.WaitGroup
	startErr chan error // a caller's first session refused: the load never started

	mu    sync.Mutex
	acked []ackedConsume
}

func startCrashLoad(ctx context.Context, cli governorpb.GovernorClient, callers int) *crashLoad {
	l := &crashLoad{startErr: make(chan error, callers)}
	for w := range callers {
		l.wg.Add(1)
		go l.caller(ctx, cli, w)
	}
	return l
}

// caller w consumes until governord is gone, on a new session every
// crashIDsPerSession request ids.
func (l *crashLoad) caller(ctx context.Context, cli governorpb.GovernorClient, w int) {
	defer l.wg.Done()
	for n := 0; ctx.Err() == nil; {
		s, err := cli.OpenSession(ctx, &governorpb.OpenSessionRequest{ApiKey: "bench-jobs-key"})
		if err != nil {
			if n == 0 {
				l.startErr <- err
			}
			return // governord is gone
		}
		sctx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+s.GetSessionToken())
		for range crashIDsPerSession {
			n++
			rid := fmt.Sprintf("c%d-%d", w, n)
			_, err := cli.Consume(sctx, &governorpb.ConsumeRequest{RequestId: rid, NodeId: s.GetScopeNodeId(),
				Resource: "tokens", Amount: 1})
			if err != nil {
				return // governord is gone
			}
			l.mu.Lock()
			l.acked = append(l.acked, ackedConsume{s.GetSessionToken(), rid, s.GetScopeNodeId()})
			l.mu.Unlock()
		}
	}
}

// checkAcknowledged reads what the restarted governord at addr has on
// record, sends every acknowledged consume again with its request id, and
// fills in r's OnRecord, Lost and Unacked: a consume that charges again was
// lost.
func checkAcknowledged(ctx context.Context, addr string, acked []ackedConsume, r *crashRun) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	cli := governorpb.NewGovernorClient(conn)
	if r.OnRecord, err = tokensUsed(ctx, cli); err != nil {
		return err
	}
	for _, a := range acked {
		actx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+a.token)
		if _, err := cli.Consume(actx, &governorpb.ConsumeRequest{RequestId: a.rid, NodeId: a.node, Resource: "tokens", Amount: 1}); err != nil {
			return fmt.Errorf("acknowledged consume %s sent again after the restart: %w", a.rid, err)
		}
	}
	after, err := tokensUsed(ctx, cli)
	if err != nil {
		return err
	}
	r.Lost = after - r.OnRecord
	r.Unacked = r.OnRecord - int64(r.Acked) + r.Lost
	return nil
}

// tokensUsed is the tokens the root has on record as used, read on an
// admin session of its own.
func tokensUsed(ctx context.Context, cli governorpb.GovernorClient) (int64, error) {
	admin, err := cli.OpenSession(ctx, &governorpb.OpenSessionRequest{ApiKey: "bench-admin-key"})
	if err != nil {
		return 0, err
	}
	actx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+admin.GetSessionToken())
	defer cli.CloseSession(actx, &governorpb.CloseSessionRequest{})
	root, err := cli.GetNode(actx, &governorpb.GetNodeRequest{NodeId: 1})
	if err != nil {
		return 0, err
	}
	return root.GetUsed()["tokens"], nil
}
