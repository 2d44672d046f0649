package server

import (
	"testing"
	"time"

	"github.com/governor-project/governor/api/governorpb"
)

// A dead worker's slots go to the next waiter when its session's TTL is up,
// not at the reaper's next tick: with a reap interval of an hour, the
// waiter still gets the pool one TTL after the dead worker's session opened.
func TestDeadSessionReapedWhenDue(t *testing.T) {
	cfg := testConfig()
	cfg.ReapInterval = time.Hour
	cfg.Root.Limits = map[string]int64{"db": 2}
	srv := start(t, cfg)
	recon := session(t, srv.Addr(), "recon-key", time.Minute)

	const ttl = 300 * time.Millisecond
	opened := time.Now()
	dead := session(t, srv.Addr(), "pay-key", ttl)
	for range 2 {
		if _, err := dead.Acquire(dead.ctx, &governorpb.AcquireRequest{NodeId: dead.scope, Class: "db"}); err != nil {
			t.Fatal(err)
		}
	}
	// The worker dies here: no heartbeat, no release.

	got := make(chan error, 1)
	go func() {
		_, err := recon.Acquire(recon.ctx, &governorpb.AcquireRequest{NodeId: recon.scope, Class: "db"})
		got <- err
	}()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter did not get the dead worker's slot within 10s: its session was not reaped when due")
	}
	took := time.Since(opened)
	if took < ttl {
		t.Fatalf("the waiter got a slot %v after the dead worker's session opened, before its TTL of %v", took, ttl)
	}
	t.Logf("the waiter got the slot %v after the dead session opened (TTL %v)", took.Round(time.Millisecond), ttl)
}
