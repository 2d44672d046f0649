package engine

import (
	"testing"
	"time"
)

// DueIn tells a server when to reap next: never after a session expires or a
// deadline passes, so that a dead worker's slots are handed on when its TTL
// is up and not up to a reap interval later.
func TestDueInNeverLate(t *testing.T) {
	clock := newFakeClock()
	e, err := New(Config{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := e.DueIn(); ok {
		t.Fatal("a fresh engine says something is due")
	}
	tenant, err := e.CreateNode(System, RootID, NodeSpec{Name: "a"}, "")
	if err != nil {
		t.Fatal(err)
	}
	wantDue := func(what string, want time.Duration) {
		t.Helper()
		if got, ok := e.DueIn(); !ok || got != want {
			t.Fatalf("%s: DueIn = %v, %v; want %v", what, got, ok, want)
		}
	}

	long, err := e.OpenSession(tenant.ID, "long", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	e.Reap()
	wantDue("a session of TTL 1s", time.Second)

	// A heartbeat moves the expiry on; DueIn may then come early, and a
	// reap at that moment ends nothing and learns the new expiry.
	clock.Advance(400 * time.Millisecond)
	if _, err := e.Heartbeat(long); err != nil {
		t.Fatal(err)
	}
	clock.Advance(600 * time.Millisecond)
	if sessions, _ := e.Reap(); sessions != 0 {
		t.Fatalf("a reap ended %d sessions that heartbeated", sessions)
	}
	wantDue("after the heartbeat", 400*time.Millisecond)

	// A session opened between reaps, expiring sooner, is due at once.
	if _, err := e.OpenSession(tenant.ID, "short", 150*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	wantDue("a shorter session opened since the last reap", 150*time.Millisecond)
	clock.Advance(150 * time.Millisecond)
	wantDue("when it expires", 0)
	if sessions, _ := e.Reap(); sessions != 1 {
		t.Fatalf("the reap at the short session's expiry ended %d sessions, want 1", sessions)
	}
	wantDue("after it is reaped", 250*time.Millisecond)

	// A node deadline sooner than any session is due first.
	deadline := clock.Now().Add(100 * time.Millisecond).UnixNano()
	if _, err := e.CreateNode(System, tenant.ID, NodeSpec{Name: "t", Deadline: deadline}, ""); err != nil {
		t.Fatal(err)
	}
	wantDue("a task with a deadline in 100ms", 100*time.Millisecond)

	// A restored engine has not worked out its expiries yet: it is due at
	// once, and its first reap finds them.
	r, err := New(Config{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Restore(e.Snapshot()); err != nil {
		t.Fatal(err)
	}
	if got, ok := r.DueIn(); !ok || got != 0 {
		t.Fatalf("a restored engine: DueIn = %v, %v; want 0, true", got, ok)
	}
}
