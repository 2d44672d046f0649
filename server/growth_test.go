package server

import (
	"context"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor/engine"
	"github.com/governor-project/governor/server/serverconfig"
)

// What bounds governord's memory: the session TTL a client may ask for,
// how long ended nodes are kept, and each tenant's bounds.

func TestConfigOfGrowthKeys(t *testing.T) {
	cfg, err := serverconfig.ParseConfig([]byte(`
session_ttl: 20s
max_session_ttl: 2m
node_retention: 90s
tenant_bounds: {max_sessions: 7, max_waiters: 9}
tenants:
  - {name: a, bounds: {max_nodes: 3, max_classes: 4}}
  - {name: b}
`))
	if err != nil {
		t.Fatal(err)
	}
	want := engine.Bounds{Sessions: 7, Nodes: serverconfig.DefaultBounds.Nodes, Waiters: 9, Resources: serverconfig.DefaultBounds.Resources, Classes: serverconfig.DefaultBounds.Classes}
	if cfg.MaxSessionTTL != 2*time.Minute || cfg.NodeRetention != 90*time.Second || cfg.Bounds != want {
		t.Errorf("config: max_session_ttl %v, node_retention %v, bounds %+v; want 2m, 1m30s, %+v", cfg.MaxSessionTTL, cfg.NodeRetention, cfg.Bounds, want)
	}
	wantA := want
	wantA.Nodes, wantA.Classes = 3, 4
	if cfg.Tenants[0].Bounds != wantA || cfg.Tenants[1].Bounds != want {
		t.Errorf("tenants' bounds %+v and %+v; want %+v and %+v", cfg.Tenants[0].Bounds, cfg.Tenants[1].Bounds, wantA, want)
	}

	def, err := serverconfig.ParseConfig([]byte("tenants: [{name: a}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if def.MaxSessionTTL != serverconfig.DefaultMaxSessionTTL || def.NodeRetention != serverconfig.DefaultNodeRetention || def.Bounds != serverconfig.DefaultBounds ||
		def.Tenants[0].Bounds != serverconfig.DefaultBounds {
		t.Errorf("defaults: %v, %v, %+v, %+v", def.MaxSessionTTL, def.NodeRetention, def.Bounds, def.Tenants[0].Bounds)
	}

	for _, tc := range []struct{ config, key string }{
		{"max_session_ttl: 2h\n", "max_session_ttl"},
		{"max_session_ttl: 10ms\n", "max_session_ttl"},
		{"session_ttl: 30s\nmax_session_ttl: 20s\n", "max_session_ttl"},
		{"node_retention: 10s\n", "node_retention"},
		{"node_retention: 48h\n", "node_retention"},
		{"node_retention: soon\n", "node_retention"},
		{"tenant_bounds: {max_nodes: 0}\n", "tenant_bounds.max_nodes"},
		{"tenant_bounds: {max_sessions: -3}\n", "tenant_bounds.max_sessions"},
		{"tenant_bounds: {max_tasks: 3}\n", "tenant_bounds.max_tasks"},
		{"tenants: [{name: a, bounds: {max_waiters: 0}}]\n", "tenants[0].bounds.max_waiters"},
		{"tenants: [{name: a, bounds: {max_resources: many}}]\n", "max_resources"},
	} {
		_, err := serverconfig.ParseConfig([]byte(tc.config))
		if !serverconfig.IsConfigError(err) || !strings.Contains(err.Error(), tc.key) {
			t.Errorf("%q: %v; want a config error naming %s", tc.config, err, tc.key)
		}
	}
}

func TestSessionTTLIsCappedByConfig(t *testing.T) {
	cfg := testConfig()
	cfg.MaxSessionTTL = 2 * time.Second
	srv := start(t, cfg)
	c, _ := dial(t, srv.Addr())
	for _, ask := range []time.Duration{time.Hour, 3 * time.Second} {
		resp, err := c.OpenSession(context.Background(), &governorpb.OpenSessionRequest{ApiKey: "pay-key", Ttl: durationpb.New(ask)})
		if err != nil {
			t.Fatal(err)
		}
		if got := resp.GetTtl().AsDuration(); got != 2*time.Second || resp.GetHeartbeatInterval().AsDuration() != got/3 {
			t.Errorf("asked %v: granted %v, heartbeat every %v; want the cap, 2s, and a third of it", ask, got, resp.GetHeartbeatInterval().AsDuration())
		}
	}
	resp, err := c.OpenSession(context.Background(), &governorpb.OpenSessionRequest{ApiKey: "pay-key", Ttl: durationpb.New(time.Second)})
	if err != nil || resp.GetTtl().AsDuration() != time.Second {
		t.Errorf("asked 1s under the cap: %v, %v", resp.GetTtl().AsDuration(), err)
	}
}

func TestTenantBoundsAnswerResourceExhausted(t *testing.T) {
	cfg := testConfig()
	cfg.Tenants[0].Bounds = engine.Bounds{Sessions: 2, Nodes: 2, Waiters: 100, Resources: 100, Classes: 100}
	srv := start(t, cfg)
	pay := session(t, srv.Addr(), "pay-key", 0)
	session(t, srv.Addr(), "pay-key", 0)
	_, err := pay.OpenSession(context.Background(), &governorpb.OpenSessionRequest{ApiKey: "pay-key"})
	wantBound(t, err, "max_sessions")
	session(t, srv.Addr(), "recon-key", 0) // another tenant's bounds are its own

	a := pay.task(t, "a", nil)
	pay.task(t, "b", nil)
	_, err = pay.CreateNode(pay.ctx, &governorpb.CreateNodeRequest{ParentId: pay.scope, Spec: &governorpb.NodeSpec{Name: "c"}})
	wantBound(t, err, "max_nodes")
	if _, err := pay.CloseNode(pay.ctx, &governorpb.CloseNodeRequest{NodeId: a.Id}); err != nil {
		t.Fatal(err)
	}
	pay.task(t, "c", nil) // the closed one no longer counts
}

func wantBound(t *testing.T, err error, bound string) {
	t.Helper()
	wantCode(t, bound, err, codes.ResourceExhausted)
	if msg := status.Convert(err).Message(); !strings.Contains(msg, bound) || !strings.Contains(msg, "payments") ||
		!strings.Contains(msg, "raise") {
		t.Errorf("message %q should name the tenant, the bound %s and how to raise it", msg, bound)
	}
}

// Ended tasks are reclaimed after the retention and stay reclaimed across a
// restart; a task still within its retention answers as ended after one.
func TestEndedTasksAreReclaimedAcrossRestarts(t *testing.T) {
	cfg := testConfig()
	cfg.Store = serverconfig.StoreConfig{Driver: "sqlite", DSN: filepath.Join(t.TempDir(), "g.db"), SnapshotEvery: 50}
	cfg.NodeRetention = 300 * time.Millisecond // below what the file allows, to keep the test short
	srv, err := Start(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	pay := session(t, srv.Addr(), "pay-key", 0)
	var old []int64
	for i := range 40 {
		n := pay.task(t, "t", map[string]int64{"calls": 5})
		if _, err := pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: n.Id, Resource: "calls", Amount: 1}); err != nil {
			t.Fatal(err)
		}
		if _, err := pay.CloseNode(pay.ctx, &governorpb.CloseNodeRequest{NodeId: n.Id, RequestId: "close-" + string(rune('a'+i))}); err != nil {
			t.Fatal(err)
		}
		old = append(old, n.Id)
	}
	for _, id := range old {
		waitNotFound(t, pay, id)
	}
	_, err = pay.GetNode(pay.ctx, &governorpb.GetNodeRequest{NodeId: old[0]})
	if msg := status.Convert(err).Message(); !strings.Contains(msg, "reclaimed") {
		t.Errorf("NOT_FOUND of a reclaimed task says %q; want it to say ended tasks are reclaimed", msg)
	}
	// A retry of the close that names a reclaimed task: not found.
	_, err = pay.CloseNode(pay.ctx, &governorpb.CloseNodeRequest{NodeId: old[0], RequestId: "close-a"})
	wantCode(t, "retried close of a reclaimed task", err, codes.NotFound)
	tenant, err := pay.GetNode(pay.ctx, &governorpb.GetNodeRequest{NodeId: pay.scope})
	if err != nil || tenant.Used["calls"] != 40 {
		t.Fatalf("the tenant's usage after the reclaim: %v, %v; want 40", tenant.GetUsed(), err)
	}
	kids, err := pay.ListChildren(pay.ctx, &governorpb.ListChildrenRequest{NodeId: pay.scope})
	if err != nil || len(kids.Nodes) != 0 {
		t.Fatalf("the tenant lists %d children after the reclaim, %v", len(kids.GetNodes()), err)
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}

	// After a restart with a long retention: what was reclaimed stays so,
	// and a task ended just now answers as ended.
	cfg.NodeRetention = time.Hour
	srv = start(t, cfg)
	pay = session(t, srv.Addr(), "pay-key", 0)
	_, err = pay.GetNode(pay.ctx, &governorpb.GetNodeRequest{NodeId: old[len(old)-1]})
	wantCode(t, "a reclaimed task after a restart", err, codes.NotFound)
	n := pay.task(t, "t", nil)
	if _, err := pay.CloseNode(pay.ctx, &governorpb.CloseNodeRequest{NodeId: n.Id}); err != nil {
		t.Fatal(err)
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	srv = start(t, cfg)
	pay = session(t, srv.Addr(), "pay-key", 0)
	_, err = pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: n.Id, Resource: "calls", Amount: 1})
	wantCode(t, "a task within its retention after a restart", err, codes.FailedPrecondition)
}

// waitNotFound polls until node id answers NOT_FOUND: the reaper reclaims
// it on its own schedule.
func waitNotFound(t *testing.T, c *client, id int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := c.GetNode(c.ctx, &governorpb.GetNodeRequest{NodeId: id})
		if status.Code(err) == codes.NotFound {
			return
		}
		if err != nil || time.Now().After(deadline) {
			t.Fatalf("node %d: %v; want it reclaimed (NOT_FOUND) within 10s", id, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Snapshots come from the mirror, which equals the live engine; a mirror
// that went its own way (here, fed an event out of order) is rebuilt from
// the engine rather than left to fail every snapshot.
func TestSnapshotsComeFromAMirrorOfTheEngine(t *testing.T) {
	srv := start(t, testConfig())
	pay := session(t, srv.Addr(), "pay-key", 0)
	for i := range 20 {
		n := pay.task(t, fmt.Sprint("t", i), nil)
		if _, err := pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: n.Id, Resource: "retry", Amount: 1}); err != nil {
			t.Fatal(err)
		}
	}
	snap, err := srv.mirror.snapshot(srv.eng)
	if err != nil {
		t.Fatal(err)
	}
	if want := srv.eng.Snapshot(); !reflect.DeepEqual(snap, want) {
		t.Fatalf("the mirror's snapshot differs from the engine's")
	}
	srv.mirror.add(engine.Event{Seq: srv.eng.Seq() + 5, Kind: engine.EvConsumed})
	if err := srv.mirror.catchUp(srv.eng); err == nil || !strings.Contains(err.Error(), "rebuilt") {
		t.Fatalf("catching up past a gap: %v; want it rebuilt", err)
	}
	pay.task(t, "after", nil)
	snap, err = srv.mirror.snapshot(srv.eng)
	if err != nil {
		t.Fatal(err)
	}
	if want := srv.eng.Snapshot(); !reflect.DeepEqual(snap, want) {
		t.Fatalf("the rebuilt mirror's snapshot differs from the engine's")
	}
}
