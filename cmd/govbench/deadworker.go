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

// deadWorkerOnce runs the scenario once on a governord of its own: A takes
// the pool and dies, B waits for it, then A's late calls.
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

	a, err := takeThePoolAndDie(ctx, raw)
	if err != nil {
		return nil, err
	}
	r := &deadRun{LateReleases: len(a.leases), OpenSessionMs: float64(a.opened.Microseconds()) / 1000}
	bLeases, err := waitForThePool(ctx, bTask, a.began, r)
	if err != nil {
		return nil, err
	}
	if err := callLate(ctx, raw, a, bLeases, r); err != nil {
		return nil, err
	}
	fmt.Fprintf(e.log, "govbench: B had the pool after %v; %d of %d late releases refused %v\n",
		r.poolAfter.Round(time.Millisecond), r.Refused, r.LateReleases, r.RefusedWith)
	return r, nil
}

// deadSession is A's: a session of one TTL that took every slot, then
// went silent.
type deadSession struct {
	ctx    context.Context // carries the session's token
	leases []int64
	began  time.Time     // just before its OpenSession was sent
	opened time.Duration // how long that OpenSession took
}

// takeThePoolAndDie is A: a session of one TTL, every slot, then nothing.
func takeThePoolAndDie(ctx context.Context, raw governorpb.GovernorClient) (*deadSession, error) {
	began := time.Now()
	a, err := raw.OpenSession(ctx, &governorpb.OpenSessionRequest{ApiKey: "bench-a-key", Ttl: durationpb.New(deadTTL)})
	if err != nil {
		return nil, err
	}
	s := &deadSession{began: began, opened: time.Since(began)}
	s.ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+a.GetSessionToken())
	for range deadSlots {
		l, err := raw.Acquire(s.ctx, &governorpb.AcquireRequest{NodeId: a.GetScopeNodeId(), Class: "db"})
		if err != nil {
			return nil, fmt.Errorf("A's acquire: %w", err)
		}
		s.leases = append(s.leases, l.GetId())
	}
	return s, nil
}

// waitForThePool is B asking for every slot at once; it returns B's leases
// and sets r's poolAfter: since began, when B had them all. A slot granted
// before A's TTL is over is an error.
func waitForThePool(ctx context.Context, bTask *governor.Task, began time.Time, r *deadRun) ([]*governor.Lease, error) {
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
	return bLeases, nil
}

// callLate is A back from the dead: its releases and a heartbeat on its
// old token, whose outcomes go into r, and then whether B's leases still
// hold and what the root holds.
func callLate(ctx context.Context, raw governorpb.GovernorClient, a *deadSession, bLeases []*governor.Lease, r *deadRun) error {
	for _, id := range a.leases {
		_, err := raw.Release(a.ctx, &governorpb.ReleaseRequest{LeaseId: id})
		if err != nil {
			r.Refused++
			r.RefusedWith = append(r.RefusedWith, status.Code(err).String())
		}
	}
	_, err := raw.Heartbeat(a.ctx, &governorpb.HeartbeatRequest{})
	r.LateHeartbeat = status.Code(err).String()
	for _, l := range bLeases {
		if l.Validate(ctx) == nil {
			r.BLeasesValid++
		}
	}
	admin, err := raw.OpenSession(ctx, &governorpb.OpenSessionRequest{ApiKey: "bench-admin-key"})
	if err != nil {
		return err
	}
	root, err := raw.GetNode(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+admin.GetSessionToken()),
		&governorpb.GetNodeRequest{NodeId: 1})
	if err != nil {
		return err
	}
	r.RootHolds = int(root.GetHeld()["db"])
	return nil
}
