package main

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor"
)

// Scenario 2: tenant A's worker takes all 4 slots of the pool on a session
// of 1 s and dies: no heartbeat, no release. Tenant B is waiting for the
// pool. The figure is how long after A's session opened B has the whole
// pool; the goal is the TTL plus at most 20 ms. Then A's late releases,
// with its old token, must all be refused, and B must keep its leases.

const (
	deadSlots = 4
	deadTTL   = time.Second
)

const deadConfig = `admin_key: bench-admin-key
session_ttl: 60s
root: {limits: {db: %d}}
tenants:
  - {name: a, api_key: bench-a-key}
  - {name: b, api_key: bench-b-key}
`

type deadRun struct {
	PoolAfterMs   float64  `json:"pool_after_ms"`   // from before A's OpenSession to B's last grant
	OpenSessionMs float64  `json:"open_session_ms"` // A's OpenSession call, commit included
	LateReleases  int      `json:"late_releases"`
	Refused       int      `json:"late_releases_refused"`
	RefusedWith   []string `json:"refused_with"`
	RootHolds     int      `json:"root_holds_after"` // db leases held after the late releases: B's
	BLeasesValid  int      `json:"b_leases_valid"`
	LateHeartbeat string   `json:"late_heartbeat"`
	poolAfter     time.Duration
}

func runDeadWorker(ctx context.Context, e *env) (*result, error) {
	runs := e.runs
	var all []deadRun
	var took, open []time.Duration
	for range runs {
		r, err := deadWorkerOnce(ctx, e)
		if err != nil {
			return nil, err
		}
		all = append(all, *r)
		took = append(took, r.poolAfter)
		open = append(open, time.Duration(r.OpenSessionMs*1e6))
	}
	med, lo, hi := spread(took)
	openMed, _, _ := spread(open)
	refused, late := 0, 0
	for _, r := range all {
		refused += r.Refused
		late += r.LateReleases
	}
	res := &result{Header: []string{"", "TTL", "B has the pool after (median, range)", "over the TTL", "A's OpenSession took", "late releases refused"},
		Raw: map[string]any{"ttl_ms": deadTTL.Milliseconds(), "slots": deadSlots, "runs": all}}
	res.Rows = append(res.Rows, []string{"Governor (" + e.store + ")", ms(deadTTL) + " ms",
		fmt.Sprintf("%s ms (%s-%s)", ms(med), ms(lo), ms(hi)), fmt.Sprintf("+%s ms", ms(med-deadTTL)),
		fmt.Sprintf("%.1f ms", float64(openMed.Microseconds())/1000), fmt.Sprintf("%d of %d", refused, late)})
	res.Notes = []string{fmt.Sprintf("%d runs; timed from just before A's OpenSession is sent, so the figure includes that call (its commit too, on a durable store): A's session began somewhere within it.", runs)}
	return res, nil
}

func deadWorkerOnce(ctx context.Context, e *env) (*deadRun, error) {
	gov, err := e.startGovernord(ctx, fmt.Sprintf(deadConfig, deadSlots))
	if err != nil {
		return nil, err
	}
	defer gov.stop()
	conn, err := grpc.NewClient(gov.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	raw := governorpb.NewGovernorClient(conn)
	b, err := governor.Dial(ctx, governor.WithAddr(gov.addr), governor.WithAPIKey("bench-b-key"))
	if err != nil {
		return nil, err
	}
	defer b.Close()
	_, bTask, err := b.NewTask(ctx, governor.Spec{Name: "waiter"})
	if err != nil {
		return nil, err
	}

	// A: a session of one TTL, every slot, then nothing.
	began := time.Now()
	a, err := raw.OpenSession(ctx, &governorpb.OpenSessionRequest{ApiKey: "bench-a-key", Ttl: durationpb.New(deadTTL)})
	if err != nil {
		return nil, err
	}
	opened := time.Since(began)
	actx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+a.GetSessionToken())
	var aLeases []int64
	for range deadSlots {
		l, err := raw.Acquire(actx, &governorpb.AcquireRequest{NodeId: a.GetScopeNodeId(), Class: "db"})
		if err != nil {
			return nil, fmt.Errorf("A's acquire: %w", err)
		}
		aLeases = append(aLeases, l.GetId())
	}

	type grant struct {
		lease *governor.Lease
		at    time.Duration
		err   error
	}
	grants := make(chan grant, deadSlots)
	wctx, cancel := context.WithTimeout(ctx, 10*deadTTL)
	defer cancel()
	for range deadSlots {
		go func() {
			l, err := bTask.Acquire(wctx, "db")
			grants <- grant{l, time.Since(began), err}
		}()
	}
	r := &deadRun{LateReleases: len(aLeases), OpenSessionMs: float64(opened.Microseconds()) / 1000}
	var bLeases []*governor.Lease
	for range deadSlots {
		g := <-grants
		if g.err != nil {
			return nil, fmt.Errorf("B's acquire: %w", g.err)
		}
		if g.at < deadTTL {
			return nil, fmt.Errorf("B got a slot %v after A's session opened, before its TTL of %v", g.at, deadTTL)
		}
		bLeases = append(bLeases, g.lease)
		r.poolAfter = max(r.poolAfter, g.at)
	}
	r.PoolAfterMs = float64(r.poolAfter) / 1e6

	for _, id := range aLeases {
		_, err := raw.Release(actx, &governorpb.ReleaseRequest{LeaseId: id})
		if err != nil {
			r.Refused++
			r.RefusedWith = append(r.RefusedWith, status.Code(err).String())
		}
	}
	_, err = raw.Heartbeat(actx, &governorpb.HeartbeatRequest{})
	r.LateHeartbeat = status.Code(err).String()
	for _, l := range bLeases {
		if l.Validate(ctx) == nil {
			r.BLeasesValid++
		}
	}
	admin, err := raw.OpenSession(ctx, &governorpb.OpenSessionRequest{ApiKey: "bench-admin-key"})
	if err != nil {
		return nil, err
	}
	root, err := raw.GetNode(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+admin.GetSessionToken()),
		&governorpb.GetNodeRequest{NodeId: 1})
	if err != nil {
		return nil, err
	}
	r.RootHolds = int(root.GetHeld()["db"])
	fmt.Fprintf(e.log, "govbench: B had the pool after %v; %d of %d late releases refused %v\n",
		r.poolAfter.Round(time.Millisecond), r.Refused, r.LateReleases, r.RefusedWith)
	return r, nil
}
