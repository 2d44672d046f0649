package engine

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// Tests that close gaps scripts/engine-mutation.sh found (docs/engine-mutation.md).

// An interval with more releases than the sample window holds decides on
// the newest 4,096: slow calls pushed out by fast ones no longer count.
func TestAdaptiveWindowKeepsTheNewestSamples(t *testing.T) {
	f := observeLLM(t, 4096+4096+7, func(i int) time.Duration {
		if i < 4096 {
			return time.Second
		}
		return time.Millisecond
	})
	f.clock.Advance(time.Second)
	f.e.Reap()
	if got, _ := f.e.AdaptiveLimit("llm"); got != 10 {
		t.Errorf("limit %d after an interval whose newest 4,096 calls were fast; want it kept at its max, 10", got)
	}
}

// observeLLM reports n calls of the adaptive class llm (target 10 ms,
// limit 1-10, starting at 10), the i-th taking latency(i), in one batch,
// so that no early cut sees a part of them alone.
func observeLLM(t *testing.T, n int, latency func(i int) time.Duration) *fixture {
	t.Helper()
	f := newBareFixture(t, Adaptive{Class: "llm", TargetP95: 10 * time.Millisecond, MinLimit: 1, MaxLimit: 10, MinSamples: 1})
	s := f.open(RootID, longTTL)
	calls := make([]Sample, n)
	for i := range calls {
		calls[i] = Sample{Latency: latency(i)}
	}
	if err := f.e.Observe(s, "llm", calls); err != nil {
		t.Fatal(err)
	}
	return f
}

// A call that took no measurable time is a sample like any other.
func TestObserveAcceptsAZeroLatency(t *testing.T) {
	f := newBareFixture(t, Adaptive{Class: "llm", TargetP95: 10 * time.Millisecond, MinLimit: 1, MaxLimit: 10})
	s := f.open(RootID, longTTL)
	if err := f.e.Observe(s, "llm", []Sample{{Latency: 0}}); err != nil {
		t.Errorf("a sample of 0 s: %v", err)
	}
}

// A bound's message names the name that would be one more, and only then.
func TestBoundErrorNamesTheNameItRefused(t *testing.T) {
	named := (&BoundError{Tenant: "acme", Bound: BoundClasses, Limit: 1, Name: "http"}).Error()
	if !strings.Contains(named, `"http" would be one more`) {
		t.Errorf("%q does not name the class it refused", named)
	}
	unnamed := (&BoundError{Tenant: "acme", Bound: BoundNodes, Limit: 3}).Error()
	if strings.Contains(unnamed, "would be one more") {
		t.Errorf("%q names a name where there is none", unnamed)
	}
}

// A block request with a negative want or return is refused, whichever is
// negative.
func TestBlockRefusesANegativeWantOrReturn(t *testing.T) {
	f := newFixture(t)
	f.setCaps(RootID, CapsEdit{Limits: map[string]int64{"db": 3}})
	for _, r := range []BlockRequest{{Node: f.job, Class: "db", Want: -1}, {Node: f.job, Class: "db", Return: -1}} {
		if _, err := f.e.Block(f.sA, r); !errors.Is(err, ErrInvalid) {
			t.Errorf("Block(want %d, return %d): %v, want ErrInvalid", r.Want, r.Return, err)
		}
	}
}

// A block's answer says whether its class is adaptive, when it grows, when
// it shrinks, and when a retry finds the first answer.
func TestBlockGrantSaysWhetherTheClassIsAdaptive(t *testing.T) {
	f := newFixture(t, psp)
	f.setCaps(RootID, CapsEdit{Limits: map[string]int64{"db": 3}})
	for _, tt := range []struct {
		class    string
		adaptive bool
	}{{"psp", true}, {"db", false}} {
		grow := BlockRequest{Node: f.job, Class: tt.class, Want: 2, RequestID: "grow-" + tt.class}
		for _, what := range []string{"grows", "is retried"} {
			g, err := f.e.Block(f.sA, grow)
			if err != nil || g.Adaptive != tt.adaptive {
				t.Errorf("a block of %s %s: Adaptive %v, %v; want %v", tt.class, what, g.Adaptive, err, tt.adaptive)
			}
		}
		if g := f.block(f.sA, f.job, tt.class, 0, 1); g.Adaptive != tt.adaptive {
			t.Errorf("a block of %s shrinks: Adaptive %v, want %v", tt.class, g.Adaptive, tt.adaptive)
		}
		if g := f.block(f.sA, f.job, tt.class, 1, 0); g.Adaptive != tt.adaptive {
			t.Errorf("a block of %s grows again: Adaptive %v, want %v", tt.class, g.Adaptive, tt.adaptive)
		}
	}
}

// A request id that grew a block cannot be used again to shrink it by as
// much: they are different requests.
func TestBlockRequestIDReusedTheOtherWay(t *testing.T) {
	f := newFixture(t)
	f.setCaps(RootID, CapsEdit{Limits: map[string]int64{"db": 3}})
	if _, err := f.e.Block(f.sA, BlockRequest{Node: f.job, Class: "db", Want: 2, RequestID: "r"}); err != nil {
		t.Fatal(err)
	}
	_, err := f.e.Block(f.sA, BlockRequest{Node: f.job, Class: "db", Return: 2, RequestID: "r"})
	wantErr(t, err, ErrRequestIDReused)
}

// A denial on a cap nothing has used yet names no consumer, and in
// particular not another tenant.
func TestDenialOfAnUnusedCapNamesNoConsumer(t *testing.T) {
	d := &Denial{Resource: "tokens", NodeName: "job", Node: 3, Limit: 0, Amount: 1}
	if msg := d.Error(); strings.Contains(msg, OtherTenant) || strings.Contains(msg, `""`) {
		t.Errorf("%q", msg)
	}
	d.Largest = Consumer{Name: OtherTenant}
	if msg := d.Error(); !strings.HasSuffix(msg, "; largest consumer: "+OtherTenant) {
		t.Errorf("%q does not say another tenant", msg)
	}
}

// Event kinds print their names, and a kind without one prints its number.
func TestEventKindNames(t *testing.T) {
	for k, want := range map[EventKind]string{EvSessionOpened: "session_opened", EvNodesReclaimed: "nodes_reclaimed",
		0: "kind(0)", EventKind(len(kindNames)): fmt.Sprintf("kind(%d)", len(kindNames)), 255: "kind(255)"} {
		if got := k.String(); got != want {
			t.Errorf("EventKind(%d) = %q, want %q", uint8(k), got, want)
		}
	}
}

// The sample window holds exactly the newest 4,096 calls: an interval of
// 4,097 whose oldest call is slow decides on the 4,096 after it, 204 of
// them slow (the p95 is just within target), and does not cut; counting
// the 4,097th would put the p95 over.
func TestAdaptiveWindowHoldsExactly4096(t *testing.T) {
	f := observeLLM(t, 1+4096, func(i int) time.Duration {
		if i == 0 || i > 4096-204 {
			return time.Second
		}
		return time.Millisecond
	})
	f.clock.Advance(time.Second)
	f.e.Reap()
	if got, _ := f.e.AdaptiveLimit("llm"); got != 10 {
		t.Errorf("limit %d; want 10: 204 slow calls in the newest 4,096 keep the p95 within target", got)
	}
}

// A call of exactly the target latency is not slow, neither when it comes
// in nor when it leaves the window: 4,096 of them pushed out by 205 slow
// ones leave 205 slow calls in 4,096, a p95 over target.
func TestAdaptiveWindowForgetsCallsAtTheTarget(t *testing.T) {
	f := observeLLM(t, 4096+205, func(i int) time.Duration {
		if i >= 4096 {
			return time.Second
		}
		return 10 * time.Millisecond
	})
	if got, _ := f.e.AdaptiveLimit("llm"); got != 7 {
		t.Errorf("limit %d; want 7, cut at once: 205 slow calls in the window of 4,096", got)
	}
}

// A decision that does not lower the limit (here the first one for a class
// whose root limit was removed, which sets it to its maximum) is not a cut:
// calls granted before it still count.
func TestAdaptiveOnlyACutForgetsEarlierCalls(t *testing.T) {
	f := adaptiveFixture(t, 10)
	var held []LeaseID
	for range 10 {
		held = append(held, f.acquire(f.sA, f.job, "psp"))
	}
	f.clock.Advance(time.Millisecond)
	f.setCaps(RootID, CapsEdit{Limits: map[string]int64{"psp": NoCap}})
	f.tick()
	if got := f.adaptiveLimit(); got != 20 {
		t.Fatalf("limit %d after the decision without a root limit, want its maximum, 20", got)
	}
	for _, l := range held {
		if err := f.e.Release(f.sA, l, 0, true, ""); err != nil {
			t.Fatal(err)
		}
	}
	if got := f.adaptiveLimit(); got != 14 {
		t.Errorf("limit %d after 10 overloaded calls granted before a decision that was no cut, want 14", got)
	}
}

// Inspect lists the acquires queued inside the node, and neither those
// outside it nor those that are over.
func TestInspectListsOnlyLiveWaitersInside(t *testing.T) {
	f := newFixture(t)
	f.setCaps(RootID, CapsEdit{Limits: map[string]int64{"db": 1}})
	f.acquire(f.sA, f.job, "db")
	f.enqueue(f.sA, f.job, "db")
	f.enqueue(f.sB, f.otherJob, "db")
	gone := f.enqueue(f.sA, f.job2, "db")
	f.e.CancelWait(gone)
	got, err := f.e.Inspect(System, f.job, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Waiters) != 1 || got.Waiters[0].Node != f.job || got.Waiters[0].Session != f.sA {
		t.Errorf("waiters of job: %+v; want only the one queued on it", got.Waiters)
	}
}

// Inspect lists sessions by their last heartbeat, the stalest first, not
// by when they expire: a long TTL heartbeaten long ago comes before a short
// one heartbeaten since.
func TestInspectListsSessionsByLastHeartbeat(t *testing.T) {
	f := newFixture(t)
	old := f.open(f.job, time.Hour)
	f.clock.Advance(time.Minute)
	recent := f.open(f.job, 10*time.Second)
	// The sessions are kept in a map: ask many times, so that the order
	// they are found in varies and the sort must do the ordering.
	for range 100 {
		got, err := f.e.Inspect(System, f.job, 0)
		if err != nil {
			t.Fatal(err)
		}
		var order []SessionID
		for _, s := range got.Sessions {
			order = append(order, s.ID)
		}
		if len(order) != 2 || order[0] != old || order[1] != recent {
			t.Fatalf("sessions %v; want %d (heartbeat a minute ago) before %d", order, old, recent)
		}
	}
}

// An edit's reason may be MaxReason bytes long, and no longer.
func TestAuditReasonUpToMaxReason(t *testing.T) {
	f := newFixture(t)
	edit := CapsEdit{Quotas: map[string]int64{"tokens": 5}}
	if _, err := f.e.SetCapsAudited(System, f.job, edit, Audit{Reason: strings.Repeat("r", MaxReason)}, ""); err != nil {
		t.Errorf("a reason of MaxReason bytes: %v", err)
	}
	_, err := f.e.SetCapsAudited(System, f.job, edit, Audit{Reason: strings.Repeat("r", MaxReason+1)}, "")
	wantErr(t, err, ErrInvalid)
}

// A permanent edit (For 0) may set any cap; a temporary override sets only
// quotas and limits, and each of the others, beside a quota, refuses it.
func TestOverrideSetsOnlyQuotasAndLimits(t *testing.T) {
	f := newFixture(t)
	weight, priority, deadline := int64(3), int64(2), f.now()+int64(time.Hour)
	if _, err := f.e.SetCapsAudited(System, f.job, CapsEdit{Weight: &weight}, Audit{Reason: "permanent"}, ""); err != nil {
		t.Errorf("a permanent weight edit: %v", err)
	}
	quota := map[string]int64{"tokens": 5}
	for name, edit := range map[string]CapsEdit{
		"weight": {Quotas: quota, Weight: &weight}, "priority": {Quotas: quota, Priority: &priority},
		"deadline":       {Quotas: quota, Deadline: &deadline},
		"default quotas": {Quotas: quota, DefaultQuotas: map[string]int64{"tokens": 1}},
		"default limits": {Quotas: quota, DefaultLimits: map[string]int64{"db": 1}},
		"quota modes":    {Quotas: quota, QuotaModes: map[string]CapMode{"tokens": {Mode: ModeWarnOnly}}},
		"limit modes":    {Limits: map[string]int64{"db": 1}, LimitModes: map[string]CapMode{"db": {Mode: ModeWarnOnly}}},
		"minimums":       {Quotas: quota, Minimums: map[string]Minimum{"db": {Min: 1}}},
	} {
		_, err := f.e.SetCapsAudited(System, f.job, edit, Audit{Reason: "for an hour", For: time.Hour}, "")
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "only quotas and limits") {
			t.Errorf("an override of a quota and %s: %v, want ErrInvalid: only quotas and limits", name, err)
		}
	}
	if _, err := f.e.SetCapsAudited(System, f.job, CapsEdit{Quotas: quota}, Audit{Reason: "for an hour", For: time.Hour}, ""); err != nil {
		t.Errorf("an override of a quota alone: %v", err)
	}
}

// A replayed block resize or grant that cannot have happened is refused as
// corrupt: a resize of no lease, of a lease that is no block, below zero
// slots or by none; a grant of negative slots or of a second block.
func TestApplyCorruptBlockRecordIsRefused(t *testing.T) {
	f := newFixture(t)
	f.setCaps(RootID, CapsEdit{Limits: map[string]int64{"db": 5}})
	blk := f.block(f.sA, f.job, "db", 2, 0)
	plain := f.acquire(f.sA, f.job2, "db")
	for name, ev := range map[string]Event{
		"of no lease":           {Lease: noSuch, Amount: 1},
		"of a lease, not block": {Lease: plain, Amount: 1},
		"below zero slots":      {Lease: blk.Lease, Amount: -3},
		"by no slots":           {Lease: blk.Lease, Amount: 0},
	} {
		t.Run(name, func(t *testing.T) {
			e := f.rebuild(t, wayReplay)
			ev.Seq, ev.At, ev.Kind, ev.Session, ev.Node, ev.Resource = e.Seq()+1, f.now(), EvBlockResized, f.sA, f.job, "db"
			wantErr(t, unchanged(t, e, func() error { return e.Apply(ev) }), ErrCorrupt)
		})
	}
	// A replayed block grant of negative slots, or of a second block of the
	// same class on the same node to the same session, is corrupt too.
	for name, ev := range map[string]Event{
		"a block of negative slots": {Node: f.job2, Amount: -1},
		"a second block":            {Node: f.job, Amount: 1},
	} {
		t.Run(name, func(t *testing.T) {
			e := f.rebuild(t, wayReplay)
			ev.Seq, ev.At, ev.Kind, ev.Session, ev.Lease, ev.Resource, ev.Block = e.Seq()+1, f.now(), EvLeaseGranted, f.sA, e.Snapshot().NextLease, "db", true
			wantErr(t, unchanged(t, e, func() error { return e.Apply(ev) }), ErrCorrupt)
		})
	}
	// A block may shrink to no slots at all: that one applies.
	e := f.rebuild(t, wayReplay)
	empty := Event{Seq: e.Seq() + 1, At: f.now(), Kind: EvBlockResized, Session: f.sA, Node: f.job, Lease: blk.Lease, Resource: "db", Amount: -2}
	if err := e.Apply(empty); err != nil {
		t.Errorf("a resize to no slots: %v", err)
	}
}

// Giving back the growth of a block the session does not hold takes back
// nothing and says so; the block a give-back leaves says whether its class
// is adaptive.
func TestGiveBackBlockOfNoBlockAndAdaptive(t *testing.T) {
	f := newFixture(t, psp)
	g, k, err := f.e.GiveBackBlock(f.sA, BlockRequest{Node: f.job, Class: "psp", Want: 2}, 2)
	if err != nil || k != 0 || g.Lease != 0 {
		t.Fatalf("giving back a block that is not there: %+v, %d, %v; want nothing taken back", g, k, err)
	}
	grow := BlockRequest{Node: f.job, Class: "psp", Want: 3, RequestID: "grow"}
	if _, err := f.e.Block(f.sA, grow); err != nil {
		t.Fatal(err)
	}
	g, k, err = f.e.GiveBackBlock(f.sA, grow, 0)
	if err != nil || k != 3 || !g.Adaptive {
		t.Errorf("giving back an adaptive block's growth: %+v, %d, %v; want 3 taken back and Adaptive", g, k, err)
	}
}

// Notice kinds print their names, and a kind without one its number.
func TestNoticeKindNames(t *testing.T) {
	for k, want := range map[NoticeKind]string{NoticeContended: "contended", NoticeEnded: "ended",
		0: "notice(0)", NoticeKind(len(noticeNames)): fmt.Sprintf("notice(%d)", len(noticeNames)), 255: "notice(255)"} {
		if got := k.String(); got != want {
			t.Errorf("NoticeKind(%d) = %q, want %q", uint8(k), got, want)
		}
	}
}

// An engine with no notifier tells nobody, and does not fail for it, when
// a class becomes contended or a limit falls under a block.
func TestNoNotifierTellsNobody(t *testing.T) {
	f := newFixture(t)
	f.setCaps(RootID, CapsEdit{Limits: map[string]int64{"db": 3}})
	f.block(f.sA, f.job, "db", 3, 0)
	f.enqueue(f.sB, f.otherJob, "db")                                  // contended
	f.setCaps(f.acme, CapsEdit{Limits: map[string]int64{"db": 1}})     // a recall
	f.setCaps(RootID, CapsEdit{Limits: map[string]int64{"db": NoCap}}) // uncontended
}

// A replay tells nobody: its notices were told when the events happened.
func TestReplayTellsNobody(t *testing.T) {
	f, log := delegationFixture(t)
	f.setCaps(RootID, CapsEdit{Limits: map[string]int64{"db": 3}})
	f.block(f.sA, f.job, "db", 3, 0)
	f.enqueue(f.sB, f.otherJob, "db")
	f.setCaps(f.acme, CapsEdit{Limits: map[string]int64{"db": 1}})
	if len(log.take()) == 0 {
		t.Fatal("the live engine told nobody")
	}
	replay, err := New(Config{Clock: f.clock, Notifier: log})
	if err != nil {
		t.Fatal(err)
	}
	if err := replay.Apply(f.rec.events...); err != nil {
		t.Fatal(err)
	}
	if got := log.take(); len(got) != 0 {
		t.Errorf("the replay told %v", got)
	}
}

// A recall of a class under a node tells the holders of blocks with slots
// inside it, and neither an empty block nor a block outside.
func TestRecallTellsOnlyBusyBlocksInside(t *testing.T) {
	f, log := delegationFixture(t)
	f.setCaps(RootID, CapsEdit{Limits: map[string]int64{"db": 10}})
	s3 := f.open(f.acme, longTTL)
	f.block(f.sA, f.job, "db", 2, 0)
	f.block(f.sB, f.otherJob, "db", 2, 0)
	f.block(s3, f.job2, "db", 1, 0)
	f.block(s3, f.job2, "db", 0, 1) // empty now
	log.take()
	f.setCaps(f.acme, CapsEdit{Limits: map[string]int64{"db": 1}}) // recalls every class under acme
	want := []Notice{{Session: f.sA, Kind: NoticeRecall, Node: f.acme}}
	if got := log.take(); !reflect.DeepEqual(got, want) {
		t.Errorf("told %v, want %v", got, want)
	}
}

// Contention answers for each of the session's blocks; a session that is
// not open gets an error.
func TestContentionOfEachBlock(t *testing.T) {
	f, _ := delegationFixture(t)
	f.setCaps(RootID, CapsEdit{Limits: map[string]int64{"db": 1}})
	f.block(f.sA, f.job, "db", 1, 0)
	f.enqueue(f.sB, f.otherJob, "db")
	got, err := f.e.Contention(f.sA)
	want := []Notice{{Session: f.sA, Kind: NoticeContended, Node: f.job, Class: "db"}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("Contention = %v, %v; want %v", got, err, want)
	}
	if _, err := f.e.Contention(noSuch); err == nil {
		t.Error("Contention of no session: no error")
	}
}

// Alive is true of an open session within its TTL only.
func TestAliveOnlyWithinTTL(t *testing.T) {
	f := newFixture(t)
	s := f.open(f.job, time.Second)
	if !f.e.Alive(s) || f.e.Alive(noSuch) {
		t.Errorf("Alive(open) %v, Alive(no such) %v; want true, false", f.e.Alive(s), f.e.Alive(noSuch))
	}
	f.clock.Advance(time.Second)
	if f.e.Alive(s) {
		t.Error("Alive after its TTL")
	}
}

// A reminder of contention goes to blocks with slots, not to empty ones.
func TestRemindContentionSkipsEmptyBlocks(t *testing.T) {
	f, log := delegationFixture(t)
	f.setCaps(RootID, CapsEdit{Limits: map[string]int64{"db": 1}})
	s3 := f.open(f.acme, longTTL)
	f.block(s3, f.job2, "db", 1, 0)
	f.block(s3, f.job2, "db", 0, 1) // empty
	f.block(f.sA, f.job, "db", 1, 0)
	f.enqueue(f.sB, f.otherJob, "db")
	log.take()
	f.e.RemindContention()
	want := []Notice{{Session: f.sA, Kind: NoticeContended, Node: f.job, Class: "db"}}
	if got := log.take(); !reflect.DeepEqual(got, want) {
		t.Errorf("reminded %v, want %v", got, want)
	}
}

// Usage may reach exactly the largest int64, and not go past it.
func TestConsumeUpToMaxInt64(t *testing.T) {
	f := newFixture(t)
	f.consume(f.sA, f.job, "tokens", math.MaxInt64-1)
	f.consume(f.sA, f.job, "tokens", 1)
	err := f.e.Consume(f.sA, f.job, "tokens", 1, "")
	wantErr(t, err, ErrInvalid)
}

// A recall of one resource's reservations tells their holders, and not
// those holding reservations of another resource only.
func TestRecallOfOneResourceTellsItsHoldersOnly(t *testing.T) {
	f, log := delegationFixture(t)
	f.setCaps(f.acme, CapsEdit{Quotas: map[string]int64{"calls": 8, "tokens": 100}})
	s3 := f.open(f.acme, longTTL)
	f.reserve(f.sA, ReserveRequest{Node: f.step, Resource: "calls", Want: 8})
	f.reserve(s3, ReserveRequest{Node: f.job2, Resource: "tokens", Want: 10})
	f.consume(f.sA, f.job, "calls", 6)
	log.take()
	err := unchanged(t, f.e, func() error { return f.e.Consume(f.sA, f.job2, "calls", 1, "") })
	wantErr(t, err, ErrRecalling)
	want := []Notice{{Session: f.sA, Kind: NoticeRecall, Node: f.acme, Resource: "calls"}}
	if got := log.take(); !reflect.DeepEqual(got, want) {
		t.Errorf("recall notices %+v, want %+v", got, want)
	}
}

// A top-up denied because what it settles fills a cap counts the settled
// units where they were spent: in the denial's use, and in the child they
// were spent under, so that the cap's own direct use is what is left.
func TestReserveDenialCountsWhatItSettles(t *testing.T) {
	f, _ := delegationFixture(t)
	f.setCaps(f.acme, CapsEdit{Quotas: map[string]int64{"calls": 12}})
	f.consume(f.sA, f.job2, "calls", 2)
	f.consume(f.sA, f.job, "calls", 1)
	if r := f.reserve(f.sA, ReserveRequest{Node: f.step, Resource: "calls", Want: 8}); r.Reserved != 2 {
		t.Fatalf("reserved %d, want 2 (a quarter of the headroom of 9)", r.Reserved)
	}
	f.consume(f.sA, f.acme, "calls", 7)
	_, err := f.e.Reserve(f.sA, ReserveRequest{Node: f.step, Resource: "calls", Spent: 2, Want: 1})
	var d *Denial
	if !errors.As(err, &d) {
		t.Fatalf("a top-up that settles the last 2 units: %v, want a denial", err)
	}
	want := Consumer{Node: f.acme, Name: "acme", Used: 7}
	if d.Node != f.acme || d.Used != 12 || d.Limit != 12 || d.Largest != want {
		t.Errorf("denial on node %d at %d of %d, largest %+v; want acme at 12 of 12, largest %+v", d.Node, d.Used, d.Limit, d.Largest, want)
	}
}

// On a tie the largest consumer is the first child (by creation), and a
// child before the capped node's own direct use.
func TestDenialLargestConsumerOnATie(t *testing.T) {
	f := newFixture(t)
	f.setCaps(f.acme, CapsEdit{Quotas: map[string]int64{"calls": 6}})
	f.consume(f.sA, f.job, "calls", 2)
	f.consume(f.sA, f.job2, "calls", 2)
	f.consume(f.sA, f.acme, "calls", 2)
	err := f.e.Consume(f.sA, f.job2, "calls", 1, "")
	var d *Denial
	if !errors.As(err, &d) || d.Largest != (Consumer{Node: f.job, Name: "job", Used: 2}) {
		t.Errorf("%v: largest %+v; want job, the first of three at 2", err, d)
	}
}

// A cap of 0 that nothing used names no largest consumer, not a child that
// used nothing.
func TestDenialOfACapOfZeroNamesNoConsumer(t *testing.T) {
	f := newFixture(t)
	f.setCaps(f.acme, CapsEdit{Quotas: map[string]int64{"calls": 0}})
	err := f.e.Consume(f.sA, f.job, "calls", 1, "")
	var d *Denial
	if !errors.As(err, &d) || d.Largest != (Consumer{}) {
		t.Errorf("%v: largest %+v; want none", err, d)
	}
}

// A replayed reclamation that cannot have happened is refused as corrupt:
// of no node, of a node that is not there, of the root, of an open node,
// of a node listed twice, of a node after its ancestor.
func TestApplyCorruptReclaimIsRefused(t *testing.T) {
	f := newRetentionFixture(t, nil)
	task := f.create(f.sA, f.acme, NodeSpec{Name: "crawl"})
	sub := f.create(f.sA, task, NodeSpec{Name: "page"})
	if _, err := f.e.EndNode(f.sA, task, Closed, ""); err != nil {
		t.Fatal(err)
	}
	for name, nodes := range map[string][]NodeID{
		"no node": nil, "a node not there": {noSuch}, "the root": {RootID}, "an open node": {f.job},
		"a node twice": {task, task}, "a node after its ancestor": {task, sub},
	} {
		t.Run(name, func(t *testing.T) {
			e, err := New(Config{Clock: f.clock, Retention: testRetention})
			if err != nil {
				t.Fatal(err)
			}
			if err := e.Apply(f.rec.events...); err != nil {
				t.Fatal(err)
			}
			ev := Event{Seq: e.Seq() + 1, At: f.now(), Kind: EvNodesReclaimed, Nodes: nodes}
			wantErr(t, unchanged(t, e, func() error { return e.Apply(ev) }), ErrCorrupt)
		})
	}
}

// Compacting the deadlines (once moved deadlines outnumber the nodes)
// keeps each open node's live one: the node still expires on time.
func TestCompactedDeadlinesStillExpire(t *testing.T) {
	f := newFixture(t)
	var at int64
	for i := range 200 { // every move leaves the old deadline behind
		at = f.now() + int64(time.Hour) + int64(i)
		f.setCaps(f.job, CapsEdit{Deadline: &at})
	}
	f.e.Reap() // compacts
	f.clock.Advance(time.Duration(at - f.now()))
	f.e.Reap()
	if v := f.node(f.job); v.State != Expired {
		t.Errorf("job is %v at its deadline after the deadlines were compacted, want expired", v.State)
	}
}

// A node ended before a snapshot is reclaimed by the engine restored from
// it once its retention passes.
func TestRestoredEndedNodeIsReclaimed(t *testing.T) {
	f := newRetentionFixture(t, nil)
	task := f.create(f.sA, f.acme, NodeSpec{Name: "crawl"})
	f.create(f.sA, task, NodeSpec{Name: "page"})
	if _, err := f.e.EndNode(f.sA, task, Closed, ""); err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	e, err := New(Config{Clock: f.clock, Sink: rec, Retention: testRetention})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Restore(cloneSnapshot(t, f.e.Snapshot())); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(testRetention)
	e.Reap()
	var got []NodeID
	for _, ev := range rec.events {
		if ev.Kind == EvNodesReclaimed {
			got = append(got, ev.Nodes...)
		}
	}
	if !slices.Equal(got, []NodeID{task}) {
		t.Errorf("the restored engine reclaimed %v, want the task %d (with its subtask)", got, task)
	}
}

// One Reap reclaims at most maxReclaimPerReap subtrees; the next takes the
// rest.
func TestReapReclaimsAtMostItsBound(t *testing.T) {
	f := newRetentionFixture(t, nil)
	for i := range maxReclaimPerReap + 1 {
		id := f.create(f.sA, f.acme, NodeSpec{Name: fmt.Sprintf("t%d", i)})
		if _, err := f.e.EndNode(f.sA, id, Closed, ""); err != nil {
			t.Fatal(err)
		}
	}
	f.clock.Advance(testRetention)
	for _, want := range []int{maxReclaimPerReap, maxReclaimPerReap + 1} {
		f.e.Reap()
		if got := len(f.reclaimed()); got != want {
			t.Fatalf("%d reclaimed, want %d", got, want)
		}
	}
}

// A reservation request with any negative count is refused, whichever it is.
func TestReserveRefusesANegativeCount(t *testing.T) {
	f, _ := delegationFixture(t)
	for _, r := range []ReserveRequest{{Spent: -1, Want: 1}, {Return: -1, Want: 1}, {Want: -1, Spent: 1}} {
		r.Node, r.Resource = f.job, "calls"
		_, err := f.e.Reserve(f.sA, r)
		wantErr(t, err, ErrInvalid)
	}
}

// Units a top-up gives back are room for what it wants: at the cap, giving
// back 2 and wanting 2 is granted.
func TestReserveReturnedUnitsAreRoom(t *testing.T) {
	f, _ := delegationFixture(t)
	f.setCaps(f.acme, CapsEdit{Quotas: map[string]int64{"calls": 8}})
	f.consume(f.sA, f.job2, "calls", 6)
	if r := f.reserve(f.sA, ReserveRequest{Node: f.job, Resource: "calls", Want: 8}); r.Reserved != 1 {
		t.Fatalf("reserved %d, want 1", r.Reserved)
	}
	if r := f.reserve(f.sA, ReserveRequest{Node: f.job, Resource: "calls", Want: 8}); r.Reserved != 2 {
		t.Fatalf("reserved %d, want 2: the cap is full", r.Reserved)
	}
	r, err := f.e.Reserve(f.sA, ReserveRequest{Node: f.job, Resource: "calls", Return: 2, Want: 2})
	if err != nil || r.Reserved != 1 {
		t.Errorf("returning 2 and wanting 2 at the cap: %+v, %v; want 1 reserved (a quarter of the 2 freed, at least one)", r, err)
	}
}

// A replayed reservation that cannot have happened is refused as corrupt.
func TestApplyCorruptReservationIsRefused(t *testing.T) {
	f, _ := delegationFixture(t)
	for name, ev := range map[string]Event{
		"of no session":               {Session: noSuch, Node: f.job, Resource: "calls", Amount: 1},
		"on no node":                  {Session: f.sA, Node: noSuch, Resource: "calls", Amount: 1},
		"of no resource":              {Session: f.sA, Node: f.job, Amount: 1},
		"spending less than nothing":  {Session: f.sA, Node: f.job, Resource: "calls", Spent: -1},
		"returning less than nothing": {Session: f.sA, Node: f.job, Resource: "calls", Returned: -1},
		"reserving less than nothing": {Session: f.sA, Node: f.job, Resource: "calls", Amount: -1},
	} {
		t.Run(name, func(t *testing.T) {
			e := f.rebuild(t, wayReplay)
			ev.Seq, ev.At, ev.Kind = e.Seq()+1, f.now(), EvReserved
			wantErr(t, unchanged(t, e, func() error { return e.Apply(ev) }), ErrCorrupt)
		})
	}
}

// Restore refuses more corrupt snapshots than TestSnapshotCorruptIsRefused
// lists (mutation run gaps in its checks), each alone.
func TestRestoreRefusesEachCorruption(t *testing.T) {
	f, _ := delegationFixture(t)
	f.setCaps(f.acme, CapsEdit{Quotas: map[string]int64{"calls": 100}})
	f.setCaps(RootID, CapsEdit{Limits: map[string]int64{"db": 10}})
	f.reserve(f.sA, ReserveRequest{Node: f.job, Resource: "calls", Want: 8})
	f.block(f.sA, f.job, "db", 2, 0)
	f.acquire(f.sB, f.otherJob, "db")
	good := f.e.Snapshot()
	lastSession := func(s *Snapshot) *SessionSnapshot { return &s.Sessions[len(s.Sessions)-1] }
	holder := func(s *Snapshot) *SessionSnapshot {
		for i := range s.Sessions {
			if len(s.Sessions[i].Reservations) > 0 {
				return &s.Sessions[i]
			}
		}
		t.Fatal("no session holds a reservation")
		return nil
	}
	for name, mutate := range map[string]func(s *Snapshot){
		"a node id twice": func(s *Snapshot) {
			dup := s.Nodes[len(s.Nodes)-1]
			dup.Name = "another"
			s.Nodes = append(s.Nodes, dup)
		},
		"two open siblings with one name": func(s *Snapshot) {
			dup := *nodeNamed(t, s, "job2")
			dup.ID = s.NextNode
			s.NextNode++
			s.Nodes = append(s.Nodes, dup)
		},
		"NextSession 0": func(s *Snapshot) { s.NextSession, s.Sessions, s.Leases, s.Tombstones = 0, nil, nil, nil },
		"NextLease 0":   func(s *Snapshot) { s.NextLease, s.Leases, s.Tombstones = 0, nil, nil },
		"a second block of one class on one node": func(s *Snapshot) {
			for _, l := range s.Leases {
				if l.Block {
					l.ID = s.NextLease
					s.NextLease++
					s.Leases = append(s.Leases, l)
					return
				}
			}
			t.Fatal("no block in the snapshot")
		},
		"NextNode at the root": func(s *Snapshot) {
			s.Nodes, s.Sessions, s.Leases, s.Tombstones, s.NextNode = s.Nodes[:1], nil, nil, nil, RootID
		},
		"a session id at NextSession":  func(s *Snapshot) { s.NextSession = lastSession(s).ID },
		"session id 0":                 func(s *Snapshot) { s.Sessions[0].ID = 0 },
		"a session id twice":           func(s *Snapshot) { s.Sessions = append(s.Sessions, s.Sessions[0]) },
		"a reservation on no node":     func(s *Snapshot) { holder(s).Reservations[0].Node = noSuch },
		"a reservation of nothing":     func(s *Snapshot) { holder(s).Reservations[0].Amount = 0 },
		"a reservation of no resource": func(s *Snapshot) { holder(s).Reservations[0].Resource = "" },
		"a reservation twice":          func(s *Snapshot) { h := holder(s); h.Reservations = append(h.Reservations, h.Reservations[0]) },
		"lease id 0":                   func(s *Snapshot) { s.Leases[0].ID = 0 },
		"a lease id twice":             func(s *Snapshot) { s.Leases = append(s.Leases, s.Leases[0]) },
		"a lease of negative slots":    func(s *Snapshot) { s.Leases[0].Count = -1 },
		"a lease id at NextLease":      func(s *Snapshot) { s.NextLease = s.Leases[len(s.Leases)-1].ID },
		"a lease that charged nothing": func(s *Snapshot) { s.Leases[0].Charges = []Charge{{Resource: "calls", Amount: 0}} },
		"a lease that charged a negative amount": func(s *Snapshot) {
			s.Leases[0].Charges = []Charge{{Resource: "calls", Amount: math.MinInt64}}
		},
		"a lease that charged no resource": func(s *Snapshot) { s.Leases[0].Charges = []Charge{{Amount: 1}} },
	} {
		t.Run(name, func(t *testing.T) {
			snap := cloneSnapshot(t, good)
			mutate(&snap)
			f.restoreRefused(t, snap)
		})
	}
}

// A node deeper than MaxDepth in a snapshot is refused; one at the deepest
// a live engine allows restores.
func TestRestoreDepthBound(t *testing.T) {
	f := newBareFixture(t)
	parent := RootID
	for i := range MaxDepth - 1 {
		parent = f.create(System, parent, NodeSpec{Name: fmt.Sprintf("d%d", i)})
	}
	snap := f.e.Snapshot()
	e, _ := New(Config{Clock: f.clock})
	if err := e.Restore(cloneSnapshot(t, snap)); err != nil {
		t.Fatalf("the deepest chain a live engine makes: %v", err)
	}
	deeper := cloneSnapshot(t, snap)
	last := deeper.Nodes[len(deeper.Nodes)-1]
	last.ID, last.Parent, last.Name = deeper.NextNode, last.ID, "deeper"
	deeper.Nodes, deeper.NextNode = append(deeper.Nodes, last), deeper.NextNode+1
	e, _ = New(Config{Clock: f.clock})
	wantErr(t, e.Restore(deeper), ErrCorrupt)
}

// Restore goes into an engine that has recorded nothing: one with a single
// event behind it (a consume on the root) is refused too; a fresh engine's
// snapshot restores.
func TestRestoreOnlyIntoAFreshEngine(t *testing.T) {
	f := newBareFixture(t)
	fresh := f.e.Snapshot()
	e, _ := New(Config{Clock: f.clock})
	if err := e.Restore(cloneSnapshot(t, fresh)); err != nil {
		t.Errorf("a fresh engine's snapshot: %v", err)
	}
	used, _ := New(Config{Clock: f.clock})
	if err := used.Consume(System, RootID, "tokens", 1, ""); err != nil {
		t.Fatal(err)
	}
	wantErr(t, used.Restore(cloneSnapshot(t, fresh)), ErrCorrupt)
}

// An open node's deadline survives a restore: it still expires on time.
func TestRestoredDeadlineExpires(t *testing.T) {
	f := newFixture(t)
	at := f.now() + int64(time.Hour)
	f.setCaps(f.job, CapsEdit{Deadline: &at})
	e, _ := New(Config{Clock: f.clock})
	if err := e.Restore(cloneSnapshot(t, f.e.Snapshot())); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(time.Hour)
	e.Reap()
	if v, err := e.Get(System, f.job); err != nil || v.State != Expired {
		t.Errorf("job after its deadline in the restored engine: %+v, %v; want expired", v, err)
	}
	if v, err := e.Get(System, f.job2); err != nil || v.State != Open {
		t.Errorf("job2, which has no deadline, in the restored engine: %+v, %v; want open", v, err)
	}
}

func nodeNamed(t *testing.T, s *Snapshot, name string) *NodeView {
	for i := range s.Nodes {
		if s.Nodes[i].Name == name {
			return &s.Nodes[i]
		}
	}
	t.Fatalf("no node %q in the snapshot", name)
	return nil
}

// SessionTokens lists every open session's token, and not the system's.
func TestSessionTokensLeaveOutTheSystem(t *testing.T) {
	f := newFixture(t)
	got := f.e.SessionTokens()
	if _, ok := got[System]; ok || len(got) != 2 || got[f.sA] == "" || got[f.sB] == "" {
		t.Errorf("SessionTokens = %v; want the two open sessions' tokens only", got)
	}
}

// A node three levels down (root, tenant, task, subtask) is a subtask.
func TestNodeKindByDepth(t *testing.T) {
	f := newFixture(t) // acme is a tenant, job a task, step a subtask
	for id, want := range map[NodeID]Kind{f.acme: KindTenant, f.job: KindTask, f.step: KindSubtask} {
		if got := f.node(id).Kind; got != want {
			t.Errorf("node %d is a %v, want %v", id, got, want)
		}
	}
}

// A name may be MaxNameLen bytes long, and no longer.
func TestNameUpToMaxNameLen(t *testing.T) {
	f := newFixture(t)
	if _, err := f.e.CreateNode(f.sA, f.job, NodeSpec{Name: strings.Repeat("n", MaxNameLen)}, ""); err != nil {
		t.Errorf("a name of MaxNameLen bytes: %v", err)
	}
	_, err := f.e.CreateNode(f.sA, f.job, NodeSpec{Name: strings.Repeat("m", MaxNameLen+1)}, "")
	wantErr(t, err, ErrInvalid)
}

// An override may set a quota and a limit together.
func TestOverrideOfAQuotaAndALimit(t *testing.T) {
	f := newFixture(t)
	edit := CapsEdit{Quotas: map[string]int64{"tokens": 5}, Limits: map[string]int64{"db": 2}}
	if _, err := f.e.SetCapsAudited(System, f.job, edit, Audit{Reason: "for an hour", For: time.Hour}, ""); err != nil {
		t.Errorf("an override of a quota and a limit: %v", err)
	}
}

// A node keeps exactly its last AuditKeep cap changes.
func TestAuditTrailKeepsAuditKeep(t *testing.T) {
	f := newFixture(t)
	for i := range AuditKeep + 1 {
		edit := CapsEdit{Quotas: map[string]int64{"tokens": int64(i + 1)}}
		if _, err := f.e.SetCapsAudited(System, f.job, edit, Audit{Reason: fmt.Sprint(i)}, ""); err != nil {
			t.Fatal(err)
		}
	}
	trail, _, err := f.e.CapsHistory(System, f.job)
	if err != nil || len(trail) != AuditKeep || trail[0].Reason != "1" {
		t.Errorf("%d changes kept, %v; want the last %d, from reason \"1\"", len(trail), err, AuditKeep)
	}
}

// A replayed revert of caps on no node, or with no caps, is refused as
// corrupt.
func TestApplyCorruptRevertIsRefused(t *testing.T) {
	f := newFixture(t)
	for name, ev := range map[string]Event{
		"on no node":   {Node: noSuch, Caps: &CapsEdit{Quotas: map[string]int64{"tokens": 1}}},
		"with no caps": {Node: f.job},
	} {
		t.Run(name, func(t *testing.T) {
			e := f.rebuild(t, wayReplay)
			ev.Seq, ev.At, ev.Kind = e.Seq()+1, f.now(), EvCapsReverted
			wantErr(t, unchanged(t, e, func() error { return e.Apply(ev) }), ErrCorrupt)
		})
	}
}

// A node's audit trail, with no override pending, survives a snapshot and
// a restore.
func TestAuditTrailSurvivesRestore(t *testing.T) {
	f := newFixture(t)
	if _, err := f.e.SetCapsAudited(System, f.job, CapsEdit{Quotas: map[string]int64{"tokens": 5}}, Audit{Reason: "kept"}, ""); err != nil {
		t.Fatal(err)
	}
	want, _, err := f.e.CapsHistory(System, f.job)
	if err != nil || len(want) != 1 {
		t.Fatalf("history %v, %v", want, err)
	}
	e := f.rebuild(t, wayRestore)
	if got, _, err := e.CapsHistory(System, f.job); err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("history after a restore: %+v, %v; want %+v", got, err, want)
	}
}

// Gaps issue 25's run of the mutation tool found in reclaim.go,
// override.go, minimum.go, bounds.go and dryrun.go (docs/engine-mutation.md).

// A minimum's window is half open: it applies from exactly From, and no
// longer at exactly Until.
func TestMinimumWindowIsHalfOpen(t *testing.T) {
	for _, tc := range []struct {
		name  string
		at    time.Duration // after the window was set
		acmes bool          // the minimum applies: acme's waiter goes first
	}{
		{"a nanosecond before it starts", time.Second - 1, false},
		{"at its start", time.Second, true},
		{"a nanosecond before its end", 2*time.Second - 1, true},
		{"at its end", 2 * time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.setCaps(RootID, CapsEdit{Limits: map[string]int64{"db": 1}})
			from := f.now() + int64(time.Second)
			f.setCaps(f.acme, CapsEdit{Minimums: map[string]Minimum{"db": {Min: 1, From: from, Until: from + int64(time.Second)}}})
			held := f.acquire(f.sB, f.otherJob, "db")
			other := f.enqueue(f.sB, f.otherJob, "db") // first in the ring: its turn without a minimum
			acme := f.enqueue(f.sA, f.job, "db")
			f.clock.Advance(tc.at)
			f.release(f.sB, held)
			first, second := other, acme
			if tc.acmes {
				first, second = acme, other
			}
			granted(t, first, "the waiter served first")
			noOutcome(t, second, "the waiter served second")
		})
	}
}

// A minimum's window must not be empty.
func TestMinimumWindowMustNotBeEmpty(t *testing.T) {
	f := newFixture(t)
	at := f.now() + int64(time.Hour)
	err := unchanged(t, f.e, func() error {
		_, err := f.e.SetCaps(System, f.acme, CapsEdit{Minimums: map[string]Minimum{"db": {Min: 1, From: at, Until: at}}}, "")
		return err
	})
	wantErr(t, err, ErrInvalid)
	f.setCaps(f.acme, CapsEdit{Minimums: map[string]Minimum{"db": {Min: 1, From: at, Until: at + 1}}})
}

// After an adaptive cut takes the root's limit below the minimums' sum, an
// edit of the limit that adds nothing to the excess (a raise, or the same
// value) is taken; only a lower one is refused.
func TestRootLimitEditAfterACutBelowTheMinimums(t *testing.T) {
	f := newFixture(t, Adaptive{Class: "db", TargetP95: 10 * time.Millisecond, MaxOverload: 0.1, MinLimit: 1, MaxLimit: 6, MinSamples: 2})
	f.setCaps(f.acme, CapsEdit{Minimums: map[string]Minimum{"db": {Min: 3}}})
	f.setCaps(f.other, CapsEdit{Minimums: map[string]Minimum{"db": {Min: 3}}})
	if err := f.e.Observe(f.sA, "db", []Sample{{Latency: time.Millisecond, Overloaded: true}, {Latency: time.Millisecond, Overloaded: true}}); err != nil {
		t.Fatal(err)
	}
	if got, _ := f.e.AdaptiveLimit("db"); got != 4 {
		t.Fatalf("the cut left the limit at %d, want 4", got)
	}
	f.setCaps(RootID, CapsEdit{Limits: map[string]int64{"db": 5}}) // a raise, still under the sum of 6
	f.setCaps(RootID, CapsEdit{Limits: map[string]int64{"db": 5}}) // the same again
	err := unchanged(t, f.e, func() error {
		_, err := f.e.SetCaps(System, RootID, CapsEdit{Limits: map[string]int64{"db": 4}}, "")
		return err
	})
	wantErr(t, err, ErrInvalid)
}

// The audit trail shows the modes an edit set and those it replaced, an
// empty map of modes reads as none, and a restart shows the same trail.
func TestAuditTrailShowsModes(t *testing.T) {
	f := newFixture(t)
	f.setCaps(f.job, CapsEdit{Quotas: map[string]int64{"tokens": 10}, Limits: map[string]int64{"db": 3},
		QuotaModes: map[string]CapMode{"tokens": {Mode: ModeSoft, Burst: 2}}, LimitModes: map[string]CapMode{"db": {Mode: ModeWarnOnly}}})
	f.setCaps(f.job, CapsEdit{Quotas: map[string]int64{"tokens": 11}, QuotaModes: map[string]CapMode{}})
	trail, _, err := f.e.CapsHistory(System, f.job)
	if err != nil || len(trail) != 2 {
		t.Fatalf("trail %+v, %v; want two changes", trail, err)
	}
	set, none := trail[0], trail[1]
	if want := map[string]CapMode{"tokens": {Mode: ModeSoft, Burst: 2}}; !reflect.DeepEqual(set.New.QuotaModes, want) {
		t.Errorf("the trail shows new quota modes %v, want %v", set.New.QuotaModes, want)
	}
	if want := map[string]CapMode{"db": {Mode: ModeWarnOnly}}; !reflect.DeepEqual(set.New.LimitModes, want) {
		t.Errorf("the trail shows new limit modes %v, want %v", set.New.LimitModes, want)
	}
	if want := map[string]CapMode{"tokens": {}}; !reflect.DeepEqual(set.Old.QuotaModes, want) {
		t.Errorf("the trail shows old quota modes %v, want %v (hard)", set.Old.QuotaModes, want)
	}
	if none.New.QuotaModes != nil || none.Old.QuotaModes != nil {
		t.Errorf("an empty map of modes shows as %v, replacing %v; want none", none.New.QuotaModes, none.Old.QuotaModes)
	}
	restarted, _, err := f.rebuild(t, wayRestore).CapsHistory(System, f.job)
	if err != nil || !reflect.DeepEqual(restarted, trail) {
		t.Errorf("after a restart the trail is\n%+v, %v\nwant\n%+v", restarted, err, trail)
	}
}

// A snapshot's audit trails and pending overrides are checked whole: an
// audit of no node, two of one node, more changes than AuditKeep, an
// override named twice or not at all are refused as corrupt.
func TestRestoreRefusesACorruptAudit(t *testing.T) {
	f := newFixture(t)
	f.setCaps(f.acme, CapsEdit{Quotas: map[string]int64{"tokens": 100}})
	if _, err := f.e.SetCapsAudited(System, f.job, CapsEdit{Quotas: map[string]int64{"tokens": 5}, Limits: map[string]int64{"db": 2}},
		Audit{For: time.Hour}, ""); err != nil {
		t.Fatal(err)
	}
	good := f.e.Snapshot()
	job := func(s *Snapshot) int {
		for i, na := range s.Audit {
			if na.Node == f.job {
				return i
			}
		}
		t.Fatal("no audit of the job")
		return -1
	}
	for name, mutate := range map[string]func(s *Snapshot){
		"an audit of no node":  func(s *Snapshot) { s.Audit[0].Node = noSuch },
		"two audits of a node": func(s *Snapshot) { s.Audit = append(s.Audit, s.Audit[job(s)]) },
		"two audits of a node, the first of its overrides alone": func(s *Snapshot) {
			i := job(s)
			s.Audit = append(s.Audit, NodeAudit{Node: f.job, Changes: s.Audit[i].Changes})
			s.Audit[i].Changes = nil
		},
		"more changes than AuditKeep": func(s *Snapshot) {
			i := job(s)
			for len(s.Audit[i].Changes) <= AuditKeep {
				s.Audit[i].Changes = append(s.Audit[i].Changes, s.Audit[i].Changes[0])
			}
		},
		"an override named twice": func(s *Snapshot) {
			i := job(s)
			s.Audit[i].Overrides = append(s.Audit[i].Overrides, s.Audit[i].Overrides[0])
		},
		"an override of no name": func(s *Snapshot) { s.Audit[job(s)].Overrides[0].Name = "" },
	} {
		t.Run(name, func(t *testing.T) {
			snap := cloneSnapshot(t, good)
			mutate(&snap)
			f.restoreRefused(t, snap)
		})
	}
	e, _ := New(Config{Clock: f.clock})
	if err := e.Restore(cloneSnapshot(t, good)); err != nil {
		t.Fatalf("the snapshot as it was: %v", err)
	}
}

// An engine rebuilt by replay holds queue entries of ended nodes the
// events reclaimed since; its first Reap skips them and reclaims nothing.
func TestReapAfterAReplayThatReclaimed(t *testing.T) {
	f := newFixture(t)
	if _, err := f.e.EndNode(System, f.job2, Closed, ""); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(DefaultRetention)
	f.e.Reap()
	if _, err := f.e.Get(System, f.job2); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the ended node after its retention: %v, want it reclaimed", err)
	}
	e := f.rebuild(t, wayReplay)
	seq := e.Seq()
	e.Reap()
	if e.Seq() != seq {
		t.Errorf("the first Reap after the replay emitted events %d..%d", seq+1, e.Seq())
	}
}

// Tidy keeps the ended nodes still waiting for reclamation: an engine
// tidied, then reaped, reclaims them when their retention passes (Tidy
// dropped exactly those, keeping only entries of nodes reclaimed already,
// and no test saw it, as the server tidies only its mirror).
func TestTidyKeepsWhatWaitsForReclamation(t *testing.T) {
	f := newRetentionFixture(t, nil)
	task := f.create(f.sA, f.acme, NodeSpec{Name: "crawl"})
	if _, err := f.e.EndNode(f.sA, task, Closed, ""); err != nil {
		t.Fatal(err)
	}
	f.e.Tidy()
	f.clock.Advance(testRetention)
	f.e.Reap()
	if got := f.reclaimed(); !slices.Contains(got, task) {
		t.Fatalf("reclaimed %v after a Tidy and the retention; want the task %d", got, task)
	}
}

// Gaps the run of December 5 over period.go found (docs/engine-mutation.md):
// a period's name in messages, and a new node's default periods checked
// against the default quotas it will have.

func TestPeriodNames(t *testing.T) {
	for p, want := range map[Period]string{
		{Unit: PeriodMonth}:              "month",
		{Unit: PeriodDay}:                "day",
		{Every: int64(10 * time.Second)}: "10s",
		{Every: int64(90 * time.Minute)}: "1h30m0s",
	} {
		if got := p.String(); got != want {
			t.Errorf("%#v is %q, want %q", p, got, want)
		}
	}
}

// A new node's default periods may name the default quotas its own spec
// sets, or, when it sets none, those it inherits; a default period with
// no default quota under it is refused.
func TestNewNodesDefaultPeriodsFollowItsDefaultQuotas(t *testing.T) {
	f := newFixture(t)
	hour := map[string]Period{"tokens": {Unit: PeriodHour}}
	if _, err := f.e.CreateNode(System, f.acme, NodeSpec{Name: "own",
		DefaultQuotas: map[string]int64{"tokens": 5}, DefaultQuotaPeriods: hour}, ""); err != nil {
		t.Errorf("default period over the node's own default quota: %v", err)
	}
	f.setCaps(f.other, CapsEdit{DefaultQuotas: map[string]int64{"tokens": 7}})
	if _, err := f.e.CreateNode(System, f.other, NodeSpec{Name: "inherits", DefaultQuotaPeriods: hour}, ""); err != nil {
		t.Errorf("default period over an inherited default quota: %v", err)
	}
	if _, err := f.e.CreateNode(System, f.acme, NodeSpec{Name: "bare", DefaultQuotaPeriods: hour}, ""); !errors.Is(err, ErrInvalid) {
		t.Errorf("default period with no default quota: %v, want invalid", err)
	}
}

// A gap the run of December 5 over slice.go found: mulDiv's quotient at
// exactly 2^64 (the high word of x·y equal to d) is past MaxInt64 and must
// saturate, not reach bits.Div64, which panics there.
func TestMulDivSaturatesAtTheQuotientsEnd(t *testing.T) {
	for _, c := range []struct {
		x, y, d int64
		ceil    bool
		want    int64
	}{
		{1 << 62, 8, 2, false, math.MaxInt64}, // x·y = 2^65, hi = 2 = d
		{1 << 62, 8, 2, true, math.MaxInt64},
		{1 << 62, 8, 3, false, math.MaxInt64}, // hi = 2 < d, quotient still past MaxInt64
		{1 << 62, 2, 1 << 62, false, 2},
		{7, 3, 2, false, 10},
		{7, 3, 2, true, 11},
	} {
		if got := mulDiv(c.x, c.y, c.d, c.ceil); got != c.want {
			t.Errorf("mulDiv(%d, %d, %d, %v) = %d, want %d", c.x, c.y, c.d, c.ceil, got, c.want)
		}
	}
}

// Gaps the run of December 5 over period.go's last 50 mutants found.

// A replayed period reset that does not match the state (no such node, a
// resource with no quota or no period, no window, an amount other than
// what the window spent) is corrupt, refused without a panic or a change.
func TestApplyCorruptPeriodResetIsRefused(t *testing.T) {
	f := newPeriodFixture(t, nil, time.Date(2026, 1, 1, 0, 0, 30, 0, time.UTC))
	f.sA = f.open(f.acme, longTTL)
	f.setCaps(f.acme, CapsEdit{Quotas: map[string]int64{"q": 10, "plain": 10}, QuotaPeriods: map[string]Period{"q": {Every: int64(time.Minute)}}})
	f.consume(f.sA, f.job, "q", 3)
	next := Window{Start: time.Date(2026, 1, 1, 0, 1, 0, 0, time.UTC).UnixNano(), End: time.Date(2026, 1, 1, 0, 2, 0, 0, time.UTC).UnixNano()}
	good := Event{Kind: EvPeriodReset, Node: f.acme, Resource: "q", Amount: 3, Windows: map[string]Window{"q": next}}
	for name, edit := range map[string]func(*Event){
		"on no node":                func(ev *Event) { ev.Node = noSuch },
		"of a resource no quota":    func(ev *Event) { ev.Resource, ev.Windows = "none", map[string]Window{"none": next} },
		"of a quota with no period": func(ev *Event) { ev.Resource, ev.Windows = "plain", map[string]Window{"plain": next} },
		"with no window":            func(ev *Event) { ev.Windows = nil },
		"of another amount":         func(ev *Event) { ev.Amount = 2 },
	} {
		t.Run(name, func(t *testing.T) {
			e := f.rebuild(t, wayReplay)
			ev := good
			edit(&ev)
			ev.Seq, ev.At = e.Seq()+1, next.Start
			wantErr(t, unchanged(t, e, func() error { return e.Apply(ev) }), ErrCorrupt)
		})
	}
	e := f.rebuild(t, wayReplay)
	good.Seq, good.At = e.Seq()+1, next.Start
	if err := e.Apply(good); err != nil {
		t.Errorf("the reset as it is due: %v", err)
	}
}

// A grant made at the very instant its window opens (the reset is logged
// first) and given back in that window refunds that window: it was spent
// there, not in the window before.
func TestGrantAtItsWindowsStartGivenBackRefundsThatWindow(t *testing.T) {
	f := newPeriodFixture(t, nil, time.Date(2026, 1, 1, 0, 0, 30, 0, time.UTC))
	f.sA = f.open(f.acme, longTTL)
	f.setCaps(f.acme, CapsEdit{Quotas: map[string]int64{"q": 10}, QuotaPeriods: map[string]Period{"q": {Every: int64(time.Minute)}}})
	f.consume(f.sA, f.job, "q", 5) // the window before: the new one's base
	f.setClock(time.Date(2026, 1, 1, 0, 1, 0, 0, time.UTC))
	req := AcquireRequest{Node: f.job, Charges: map[string]int64{"q": 4}, Class: "c", RequestID: "r1"}
	if _, _, err := f.e.Acquire(f.sA, req); err != nil {
		t.Fatal(err)
	}
	if st := f.periods(f.acme); st[0].Start != f.now() || st[0].Spent != 4 {
		t.Fatalf("the window %+v; want it opened now with the grant's 4 spent", st[0])
	}
	f.clock.Advance(time.Second)
	if id, err := f.e.GiveBack(f.sA, req, 0); err != nil || id == 0 {
		t.Fatalf("give-back: %d %v", id, err)
	}
	if st := f.periods(f.acme); st[0].Spent != 0 {
		t.Fatalf("the window spent %d after its grant was given back; want 0", st[0].Spent)
	}
}

// A snapshot whose quota windows do not match its caps and usage is
// corrupt: refused, never restored.
func TestRestoreRefusesCorruptPeriods(t *testing.T) {
	f := newPeriodFixture(t, nil, time.Date(2026, 1, 1, 0, 0, 30, 0, time.UTC))
	f.sA = f.open(f.acme, longTTL)
	f.setCaps(f.acme, CapsEdit{Quotas: map[string]int64{"q": 10}, QuotaPeriods: map[string]Period{"q": {Every: int64(time.Minute)}}})
	f.consume(f.sA, f.job, "q", 3)
	f.consume(f.sA, f.job, "u", 1) // used, never capped
	snap := f.e.Snapshot()
	i := slices.IndexFunc(snap.Nodes, func(v NodeView) bool { return v.ID == f.acme })
	qw := snap.Nodes[i].Periods["q"]
	for name, edit := range map[string]func(map[string]QuotaWindow){
		"on no quota":         func(m map[string]QuotaWindow) { m["none"] = qw },
		"on an uncapped one":  func(m map[string]QuotaWindow) { m["u"] = qw },
		"of a bad period":     func(m map[string]QuotaWindow) { w := qw; w.Period.Every = -1; m["q"] = w },
		"of a negative base":  func(m map[string]QuotaWindow) { w := qw; w.Base = -1; m["q"] = w },
		"of a base past used": func(m map[string]QuotaWindow) { w := qw; w.Base = 4; m["q"] = w },
		"of an empty window":  func(m map[string]QuotaWindow) { w := qw; w.End = w.Start; m["q"] = w },
		"ending as it starts": func(m map[string]QuotaWindow) { w := qw; w.End = w.Start - 1; m["q"] = w },
	} {
		t.Run(name, func(t *testing.T) {
			bad := cloneSnapshot(t, snap)
			edit(bad.Nodes[i].Periods)
			f.restoreRefused(t, bad)
		})
	}
}

// A request id reused with other periods is refused as a reuse, for a node
// made and for a cap edit: the periods are in the request's fingerprint.
func TestRequestIDReusedWithOtherPeriods(t *testing.T) {
	f := newFixture(t)
	spec := NodeSpec{Name: "n", Quotas: map[string]int64{"q": 10}, QuotaPeriods: map[string]Period{"q": {Every: int64(time.Minute)}}}
	if _, err := f.e.CreateNode(f.sA, f.acme, spec, "n1"); err != nil {
		t.Fatal(err)
	}
	spec.QuotaPeriods = map[string]Period{"q": {Every: int64(time.Hour)}}
	_, err := f.e.CreateNode(f.sA, f.acme, spec, "n1")
	wantErr(t, err, ErrRequestIDReused)
	edit := CapsEdit{Quotas: map[string]int64{"q": 10}, QuotaPeriods: map[string]Period{"q": {Unit: PeriodDay}}}
	if _, err := f.e.SetCaps(f.sA, f.job, edit, "c1"); err != nil {
		t.Fatal(err)
	}
	edit.QuotaPeriods = map[string]Period{"q": {Unit: PeriodMonth}}
	_, err = f.e.SetCaps(f.sA, f.job, edit, "c1")
	wantErr(t, err, ErrRequestIDReused)
}

// Fingerprints are stored with the events and snapshots that remember a
// request id, so they must not change from one build to the next: a retry
// after an upgrade would be refused as a reuse. These are the values of
// December 2026.
func TestFingerprintsAreStable(t *testing.T) {
	day, minute := Period{Unit: PeriodDay}, Period{Every: int64(time.Minute)}
	spec := NodeSpec{Name: "n", Quotas: map[string]int64{"q": 10}, Limits: map[string]int64{"db": 2}, Weight: 3, Priority: 1,
		Rates: map[string]Rate{"calls": {Units: 5, Per: int64(time.Second), Burst: 2}}, DefaultRates: map[string]Rate{"calls": {Units: 1, Per: int64(time.Second)}},
		QuotaPeriods: map[string]Period{"q": day}, DefaultQuotaPeriods: map[string]Period{"q": minute}}
	w := int64(2)
	edit := CapsEdit{Quotas: map[string]int64{"q": 10}, Weight: &w, QuotaModes: map[string]CapMode{"q": {Mode: ModeSoft, Burst: 1}},
		Minimums: map[string]Minimum{"db": {Min: 1}}, Rates: spec.Rates, DefaultRates: spec.DefaultRates,
		QuotaPeriods: spec.QuotaPeriods, DefaultQuotaPeriods: spec.DefaultQuotaPeriods}
	for _, c := range []struct {
		what      string
		got, want uint64
	}{
		{"a plain spec", fingerprintSpec(opCreate, 7, &NodeSpec{Name: "n", Quotas: map[string]int64{"q": 10}}), 0xe66c88269df3d704},
		{"a spec with rates and periods", fingerprintSpec(opCreate, 7, &spec), 0x6e1489e96ca7c7da},
		{"a plain edit", fingerprintCaps(7, &CapsEdit{Quotas: map[string]int64{"q": 10}}), 0xaee7638bec89ab45},
		{"an edit with every part", fingerprintCaps(7, &edit), 0x9d54a57f54528ae9},
	} {
		if c.got != c.want {
			t.Errorf("the fingerprint of %s is %#x, was %#x", c.what, c.got, c.want)
		}
	}
}

// Gaps the run of December 5 over ratewait.go found.

// A rate waiter whose quota was spent while it waited (here: lowered to
// what is used) fails with the denial, as a tenant's session sees it:
// the largest consumer of a shared node above its scope, another
// tenant's, is named only as another tenant.
func TestRateWaiterDeniedAtItsTurnSeesOnlyItsScope(t *testing.T) {
	f := newFixture(t)
	f.setCaps(RootID, CapsEdit{Rates: map[string]Rate{"calls": perSecond(10, 3)}, Quotas: map[string]int64{"calls": 100}})
	f.consume(f.sB, f.otherJob, "calls", 2)
	f.consume(f.sA, f.job, "calls", 1) // the bucket is empty
	w := f.waitCall(f.job, "")
	if w == nil {
		t.Fatal("the charge did not wait")
	}
	f.setCaps(RootID, CapsEdit{Quotas: map[string]int64{"calls": 3}}) // spent while it waits
	o := f.turnAfter(t, w, 100*time.Millisecond)
	var d *Denial
	if !errors.As(o.Err, &d) || d.Node != RootID {
		t.Fatalf("the waiter got %+v; want the root's denial", o)
	}
	if d.Largest != (Consumer{Name: OtherTenant}) {
		t.Fatalf("the denial names %+v as its largest consumer to a session scoped to acme; want %q only", d.Largest, OtherTenant)
	}
}

// A rate waiter whose resource is new to its tenant, when the tenant's
// bound on resource names filled up while it waited, fails with the bound
// at its turn rather than take a name past it.
func TestRateWaiterMeetsABoundFilledWhileItWaits(t *testing.T) {
	f := newRetentionFixture(t, func(c *Config) { c.TenantBounds = map[string]Bounds{"acme": {Resources: 2}} })
	f.setCaps(RootID, CapsEdit{Rates: map[string]Rate{"calls": perSecond(10, 1)}})
	f.consume(f.sA, f.job, "a", 1)
	other := f.open(RootID, longTTL)
	otherTenant := f.create(System, RootID, NodeSpec{Name: "other"})
	f.consume(other, otherTenant, "calls", 1) // the bucket is empty
	_, w, err := f.e.Acquire(f.sA, AcquireRequest{Node: f.job, Charges: map[string]int64{"calls": 1}, WaitRate: true})
	if err != nil || w == nil {
		t.Fatalf("a waiting charge of a second name: %v, %v", w, err)
	}
	f.consume(f.sA, f.job, "b", 1) // the second name, while it waits
	o := f.turnAfter(t, w, 100*time.Millisecond)
	var be *BoundError
	if !errors.As(o.Err, &be) || be.Bound != BoundResources {
		t.Fatalf("the waiter got %+v; want max_resources", o)
	}
	if v := f.node(f.acme); len(v.Used) != 2 {
		t.Fatalf("acme uses %v: more names than its bound", v.Used)
	}
}

// A rate waiter held up only by a slot, in one rate's queue, is granted in
// the same dispatch in which a waiter of another rate's queue, found with
// its session expired, ends that session and so frees the slot: the
// dispatch goes round again rather than wait for the next reap.
func TestRateDispatchGoesRoundAgainWhenASessionEndsInIt(t *testing.T) {
	f := newFixture(t)
	f.setCaps(RootID, CapsEdit{Rates: map[string]Rate{"a": perSecond(10, 1), "b": perSecond(10, 1)}})
	f.setCaps(f.job, CapsEdit{Limits: map[string]int64{"db": 1}})
	short := f.open(f.acme, time.Second)
	if _, _, err := f.e.Acquire(short, AcquireRequest{Node: f.job, Class: "db"}); err != nil {
		t.Fatal(err) // the slot, held by the session that will expire
	}
	f.consume(f.sA, f.job, "a", 1)
	f.consume(f.sA, f.job, "b", 1)
	_, x, err := f.e.Acquire(f.sA, AcquireRequest{Node: f.job, Class: "db", Charges: map[string]int64{"a": 1}, WaitRate: true})
	if err != nil || x == nil {
		t.Fatalf("the waiter for a and the slot: %v, %v", x, err)
	}
	_, y, err := f.e.Acquire(short, AcquireRequest{Node: f.job2, Charges: map[string]int64{"b": 1}, WaitRate: true})
	if err != nil || y == nil {
		t.Fatalf("the waiter for b: %v, %v", y, err)
	}
	f.clock.Advance(2 * time.Second)                   // the short session has expired, unreaped
	if _, err := f.e.Get(System, f.acme); err != nil { // its tick dispatches the rate queues
		t.Fatal(err)
	}
	if o := <-y.C; !errors.Is(o.Err, ErrSessionExpired) && !errors.Is(o.Err, ErrUnauthenticated) {
		t.Fatalf("the expired session's waiter got %+v", o)
	}
	select {
	case o := <-x.C:
		if o.Err != nil || o.Grant.Lease == 0 {
			t.Fatalf("the waiter for a and the slot got %+v", o)
		}
	default:
		t.Fatal("the waiter for a and the slot was not granted when the expired session's end freed the slot")
	}
}

// The rate queues are dispatched after the outermost dispatch of leases,
// not inside a nested one: a slot freed on the way (a waiter's session
// found expired, its leases ended) goes to the lease queue's waiter, as
// it would with no rate waiter, and a rate waiter held up only by that
// slot waits for the next.
func TestRateQueuesAfterTheOutermostLeaseDispatch(t *testing.T) {
	f := newFixture(t)
	f.setCaps(RootID, CapsEdit{Rates: map[string]Rate{"a": perSecond(10, 1)}})
	f.setCaps(f.job, CapsEdit{Limits: map[string]int64{"db": 1, "http": 1}})
	db := f.acquire(f.sA, f.job, "db")
	short := f.open(f.acme, time.Second)
	f.acquire(short, f.job, "http")
	expiring := f.enqueue(short, f.job, "db") // found expired at its turn
	f.consume(f.sA, f.job, "a", 1)
	_, rated, err := f.e.Acquire(f.sA, AcquireRequest{Node: f.job, Class: "http", Charges: map[string]int64{"a": 1}, WaitRate: true})
	if err != nil || rated == nil {
		t.Fatalf("the rate waiter: %v, %v", rated, err)
	}
	leased := f.enqueue(f.sA, f.job, "http")
	f.clock.Advance(2 * time.Second) // the short session has expired; a's token is there
	f.release(f.sA, db)
	if o := <-expiring.C; o.Err == nil {
		t.Fatalf("the expired session's waiter got %+v", o)
	}
	select {
	case o := <-leased.C:
		if o.Err != nil {
			t.Fatalf("the lease waiter got %+v", o)
		}
	default:
		t.Fatal("the lease waiter did not get the slot the expired session freed")
	}
	select {
	case o := <-rated.C:
		t.Fatalf("the rate waiter got %+v, inside the lease dispatch", o)
	default:
	}
}

// Gaps the run of December 5 over slice.go found.

// A slice renews while its buckets are carved at most half: at exactly
// half of the refill and of the size (a rate lowered under a live slice
// can bring them there), it is renewed.
func TestSliceRenewsCarvedAtExactlyHalf(t *testing.T) {
	f := newFixture(t)
	f.setCaps(f.acme, CapsEdit{Rates: map[string]Rate{"calls": perSecond(40, 0)}})
	res := f.reserve(f.sA, ReserveRequest{Node: f.job, Resource: "calls", Want: 5})
	if res.Slice == nil || res.Slice.Rate.Units != 10 || res.Slice.Rate.Burst != 10 {
		t.Fatalf("the slice %+v; want 10/s, burst 10", res.Slice)
	}
	f.setCaps(f.acme, CapsEdit{Rates: map[string]Rate{"calls": perSecond(20, 0)}}) // carved 10 of 20, 10 of 20
	f.clock.Advance(time.Second)
	res = f.reserve(f.sA, ReserveRequest{Node: f.job, Resource: "calls", Want: 5})
	if res.Slice == nil || res.Slice.Left != SliceTerm {
		t.Fatalf("a top-up with the buckets carved at exactly half: %+v slice %+v; want the slice renewed", res, res.Slice)
	}
}

// A replayed slice with a bad rate (one that does not validate, a removed
// one, no burst) is corrupt, refused without a change.
func TestApplyCorruptSliceIsRefused(t *testing.T) {
	f := newFixture(t)
	f.setCaps(f.acme, CapsEdit{Rates: map[string]Rate{"calls": perSecond(40, 0)}})
	f.setCaps(f.other, CapsEdit{Rates: map[string]Rate{"calls": perSecond(40, 0)}}) // a bucket off the chain
	sA2 := f.open(f.acme, longTTL)
	f.reserve(f.sA, ReserveRequest{Node: f.job, Resource: "calls", Want: 5})
	last := len(f.rec.events) - 1
	ev := f.rec.events[last]
	if ev.Kind != EvReserved || ev.Slice == nil {
		t.Fatalf("the last event %+v is no slice's", ev)
	}
	for name, r := range map[string]Rate{
		"of no units":    {Units: 0, Per: int64(time.Second), Burst: 1},
		"a removed rate": {Units: NoCap},
		"with no burst":  {Units: 10, Per: int64(time.Second)},
		"with no period": {Units: 10, Burst: 10},
	} {
		t.Run(name, func(t *testing.T) {
			e := f.replayedUpTo(t, last)
			bad := ev
			g := *ev.Slice
			g.Rate = r
			bad.Slice = &g
			wantErr(t, unchanged(t, e, func() error { return e.Apply(bad) }), ErrCorrupt)
		})
	}
	// A carve of no node, of a node off the chain or with no bucket, of
	// nothing, of one bucket twice, or a burst past what the bucket holds.
	acme := ev.Slice.Carves[0]
	for name, g := range map[string]SliceGrant{
		"a carve of no node":     {Carves: []SliceCarve{{Node: noSuch, Units: 1}}},
		"a carve off the chain":  {Carves: []SliceCarve{{Node: f.other, Units: 1}}},
		"a carve of no bucket":   {Carves: []SliceCarve{{Node: f.job, Units: 1}}},
		"a carve of nothing":     {Carves: []SliceCarve{{Node: acme.Node, Units: 0}}},
		"a bucket carved twice":  {Carves: []SliceCarve{acme, acme}},
		"a burst past the level": {Rate: Rate{Units: 10, Per: int64(time.Second), Burst: 41}, Carves: []SliceCarve{acme}},
	} {
		t.Run(name, func(t *testing.T) {
			e := f.replayedUpTo(t, last)
			if g.Rate == (Rate{}) {
				g.Rate = ev.Slice.Rate
			}
			g.Until = ev.Slice.Until
			bad := ev
			bad.Slice = &g
			wantErr(t, unchanged(t, e, func() error { return e.Apply(bad) }), ErrCorrupt)
		})
	}
	// A second session's slice whose carve would take the bucket's carved
	// refill past MaxInt64.
	t.Run("carves past MaxInt64", func(t *testing.T) {
		e := f.rebuild(t, wayReplay)
		g := SliceGrant{Rate: Rate{Units: 1, Per: int64(time.Second), Burst: 1}, Until: ev.Slice.Until,
			Carves: []SliceCarve{{Node: acme.Node, Units: math.MaxInt64}}}
		over := Event{Seq: e.Seq() + 1, Kind: EvReserved, At: ev.At, Session: sA2, Node: f.job2, Resource: "calls", Amount: 1, Slice: &g}
		wantErr(t, unchanged(t, e, func() error { return e.Apply(over) }), ErrCorrupt)
		g.Carves[0].Units = math.MaxInt64 - ev.Slice.Carves[0].Units // to exactly MaxInt64: it fits
		if err := e.Apply(over); err != nil {
			t.Errorf("a carve to exactly MaxInt64: %v", err)
		}
	})
	// A second slice where the session holds one, and a slice whose burst
	// is all the bucket holds (that one applies).
	t.Run("a second slice", func(t *testing.T) {
		e := f.rebuild(t, wayReplay)
		again := ev
		again.Seq = e.Seq() + 1
		wantErr(t, unchanged(t, e, func() error { return e.Apply(again) }), ErrCorrupt)
	})
	t.Run("a burst of all the level", func(t *testing.T) {
		e := f.replayedUpTo(t, last)
		g := *ev.Slice
		g.Rate.Burst = 40 // what acme's bucket holds
		all := ev
		all.Slice = &g
		if err := e.Apply(all); err != nil {
			t.Errorf("a slice whose burst is the bucket's level: %v", err)
		}
	})
	// The end of a slice not held, by a session not open.
	for name, end := range map[string]Event{
		"the end of a slice not held": {Session: sA2, Node: f.job2, Resource: "calls"},
		"the end by no session":       {Session: noSuch, Node: f.job, Resource: "calls"},
	} {
		t.Run(name, func(t *testing.T) {
			e := f.rebuild(t, wayReplay)
			end.Seq, end.At, end.Kind = e.Seq()+1, ev.At, EvSliceEnded
			wantErr(t, unchanged(t, e, func() error { return e.Apply(end) }), ErrCorrupt)
		})
	}
	// A renewal of a slice the session does not hold, of another, or one
	// that carves again, is corrupt too.
	id := ev.Seq
	for name, g := range map[string]SliceGrant{
		"a renewal of a slice not held": {ID: id, Rate: ev.Slice.Rate, Until: ev.Slice.Until},
		"a renewal of another slice":    {ID: id + 1, Rate: ev.Slice.Rate, Until: ev.Slice.Until},
		"a renewal that carves":         {ID: id, Rate: ev.Slice.Rate, Until: ev.Slice.Until, Carves: ev.Slice.Carves},
	} {
		t.Run(name, func(t *testing.T) {
			upTo := last + 1 // with the slice
			if name == "a renewal of a slice not held" {
				upTo = last
			}
			e := f.replayedUpTo(t, upTo)
			renew := Event{Seq: e.Seq() + 1, Kind: EvReserved, At: ev.At, Session: ev.Session, Node: ev.Node, Resource: ev.Resource, Amount: 1, Slice: &g}
			wantErr(t, unchanged(t, e, func() error { return e.Apply(renew) }), ErrCorrupt)
		})
	}
}

// A snapshot's slices are restored only when each is sound: on a node,
// with an id of an event the snapshot holds (the last one's included),
// one slice per id and per session, node and resource, and a good rate.
func TestRestoreRefusesCorruptSlices(t *testing.T) {
	f := newFixture(t)
	f.setCaps(f.acme, CapsEdit{Rates: map[string]Rate{"calls": perSecond(40, 0)}})
	f.reserve(f.sA, ReserveRequest{Node: f.job, Resource: "calls", Want: 5})
	snap := f.e.Snapshot()
	i := slices.IndexFunc(snap.Sessions, func(ss SessionSnapshot) bool { return len(ss.Slices) > 0 })
	if i < 0 || snap.Sessions[i].Slices[0].ID != snap.Seq {
		t.Fatalf("the snapshot's slices %+v at seq %d; want one granted by its last event", snap.Sessions, snap.Seq)
	}
	if e, _ := New(Config{Clock: f.clock}); e.Restore(cloneSnapshot(t, snap)) != nil {
		t.Fatal("a snapshot taken at a slice's grant does not restore")
	}
	// renumber gives the slice, and the buckets' carves of it, another id:
	// only the slice's own checks can then find it wrong.
	renumber := func(to uint64) func(*Snapshot, *SliceSnapshot, *SessionSnapshot) {
		return func(sn *Snapshot, v *SliceSnapshot, _ *SessionSnapshot) {
			for j := range sn.Nodes {
				if b, ok := sn.Nodes[j].Rates["calls"]; ok {
					for k := range b.Carves {
						if b.Carves[k].Slice == v.ID {
							b.Carves[k].Slice = to
						}
					}
				}
			}
			v.ID = to
		}
	}
	for name, spoil := range map[string]func(*Snapshot, *SliceSnapshot, *SessionSnapshot){
		"on no node":    func(_ *Snapshot, v *SliceSnapshot, _ *SessionSnapshot) { v.Node = noSuch },
		"of id 0":       renumber(0),
		"of a later id": renumber(snap.Seq + 1),
		"twice":         func(_ *Snapshot, v *SliceSnapshot, ss *SessionSnapshot) { ss.Slices = append(ss.Slices, *v) },
		"twice on one key": func(_ *Snapshot, v *SliceSnapshot, ss *SessionSnapshot) {
			w := *v
			w.ID--
			ss.Slices = append(ss.Slices, w)
		},
		"of a bad rate":     func(_ *Snapshot, v *SliceSnapshot, _ *SessionSnapshot) { v.Rate.Per = 0 },
		"of a removed rate": func(_ *Snapshot, v *SliceSnapshot, _ *SessionSnapshot) { v.Rate = Rate{Units: NoCap} },
		"of no burst":       func(_ *Snapshot, v *SliceSnapshot, _ *SessionSnapshot) { v.Rate.Burst = 0 },
	} {
		t.Run(name, func(t *testing.T) {
			bad := cloneSnapshot(t, snap)
			ss := &bad.Sessions[i]
			spoil(&bad, &ss.Slices[0], ss)
			f.restoreRefused(t, bad)
		})
	}
}

// A slice of the smallest burst, 1, restores; a bucket's carve by a live
// slice of another resource, or by one not below the bucket's node, is
// corrupt.
func TestRestoreSliceCarvesAndBursts(t *testing.T) {
	f := newFixture(t)
	f.setCaps(f.acme, CapsEdit{Rates: map[string]Rate{"calls": perSecond(4, 0), "x": perSecond(4, 0)}})
	f.setCaps(f.other, CapsEdit{Rates: map[string]Rate{"calls": perSecond(4, 0)}})
	res := f.reserve(f.sA, ReserveRequest{Node: f.job, Resource: "calls", Want: 1})
	if res.Slice == nil || res.Slice.Rate.Burst != 1 {
		t.Fatalf("the slice %+v; want a burst of 1", res.Slice)
	}
	snap := f.e.Snapshot()
	if e, _ := New(Config{Clock: f.clock}); e.Restore(cloneSnapshot(t, snap)) != nil {
		t.Fatal("a snapshot with a slice of burst 1 does not restore")
	}
	carve := BucketCarve{Slice: res.Slice.ID, Units: 1, Burst: 1}
	for name, at := range map[string]struct {
		node NodeID
		res  string
	}{
		"a carve of another resource":        {f.acme, "x"},
		"a carve not above the slice's node": {f.other, "calls"},
	} {
		t.Run(name, func(t *testing.T) {
			bad := cloneSnapshot(t, snap)
			j := slices.IndexFunc(bad.Nodes, func(v NodeView) bool { return v.ID == at.node })
			b := bad.Nodes[j].Rates[at.res]
			b.Carves = append(b.Carves, carve)
			b.Level = min(b.Level, 3) // what the carve leaves: only the carve is wrong
			bad.Nodes[j].Rates[at.res] = b
			f.restoreRefused(t, bad)
		})
	}
}

// Gaps the run of December 5 over rate.go found.

// A bucket's refill past 2^64 unit-nanoseconds is full: at exactly 2^64
// (the high word equal to a period of 1 ns) too, where bits.Div64 would
// panic.
func TestBucketFullAtExactly2To64UnitNanoseconds(t *testing.T) {
	b := bucket{Rate: Rate{Units: 1 << 62, Per: 1, Burst: 1 << 62}}
	if lv, acc := b.at(4); lv != 1<<62 || acc != 0 { // 4 ns × 2^62 units/ns = 2^64
		t.Fatalf("at 2^64 unit-ns the bucket holds %d (+%d); want full", lv, acc)
	}
}

// A charge of exactly what a carved bucket may hold waits for the carved
// refill to bring it there, not for the carve's term.
func TestWaitForExactlyTheCarvedRoom(t *testing.T) {
	const now = int64(1_000_000_000)
	b := bucket{Rate: perSecond(10, 100), stamp: now}
	b.addCarve(1, carve{units: 5, burst: 50, until: now + int64(20*time.Second)})
	if w := b.waitFor(50, now, 0, 0); w != int64(10*time.Second) {
		t.Fatalf("a charge of the room, 50, at the carved 5/s: wait %v; want 10s", time.Duration(w))
	}
}

// A give-back that fills a bucket exactly leaves no credit in it (a full
// bucket keeps none).
func TestGiveBackToExactlyFullKeepsNoCredit(t *testing.T) {
	b := bucket{Rate: perSecond(10, 20), level: 10, acc: int64(time.Second) / 2}
	b.take(-10, 0)
	if v := b.view(); v.Level != 20 || v.Acc != 0 {
		t.Fatalf("after a give-back to full: %+v; want 20 and no credit", v)
	}
}

// Charges of several resources refused for rate with the same wait name
// the first resource by name.
func TestRateRefusalOnATieNamesTheFirstResource(t *testing.T) {
	f := newFixture(t)
	f.setCaps(f.job, CapsEdit{Rates: map[string]Rate{"a": perSecond(10, 1), "b": perSecond(10, 1)}})
	f.consume(f.sA, f.job, "a", 1)
	f.consume(f.sA, f.job, "b", 1)
	_, _, err := f.e.Acquire(f.sA, AcquireRequest{Node: f.job, Charges: map[string]int64{"b": 1, "a": 1}})
	if re := rateErr(t, err, f.job, 100*time.Millisecond); re.Resource != "a" {
		t.Fatalf("a tie of a and b names %s; want a", re.Resource)
	}
}

// A snapshot's buckets restore only when sound: a rate that validates, not
// a removed one, a level within [0, size], credit within [0, Per), carves
// of at least a unit and a unit of burst, not past MaxInt64 in sum, each
// slice's once; the edges (empty, full, the last nanosecond of credit)
// restore.
func TestRestoreRefusesCorruptBuckets(t *testing.T) {
	f := newFixture(t)
	f.setCaps(f.acme, CapsEdit{Rates: map[string]Rate{"calls": perSecond(40, 0)}})
	res := f.reserve(f.sA, ReserveRequest{Node: f.job, Resource: "calls", Want: 5})
	res2 := f.reserve(f.open(f.acme, longTTL), ReserveRequest{Node: f.job2, Resource: "calls", Want: 5})
	if res.Slice == nil || res2.Slice == nil {
		t.Fatal("no two slices to carve the bucket")
	}
	snap := f.e.Snapshot()
	i := slices.IndexFunc(snap.Nodes, func(v NodeView) bool { return v.ID == f.acme })
	if v := snap.Nodes[i].Rates["calls"]; len(v.Carves) != 2 || v.Level != 40-v.Carves[0].Burst-v.Carves[1].Burst {
		t.Fatalf("the bucket %+v; want two carves, full to its room", v)
	}
	restore := func(spoil func(*BucketView)) error {
		bad := cloneSnapshot(t, snap)
		b := bad.Nodes[i].Rates["calls"]
		spoil(&b)
		bad.Nodes[i].Rates["calls"] = b
		e, err := New(Config{Clock: f.clock})
		if err != nil {
			t.Fatal(err)
		}
		return e.Restore(bad)
	}
	for name, spoil := range map[string]func(*BucketView){
		"a bad rate":            func(b *BucketView) { b.Burst = -1 },
		"a removed rate":        func(b *BucketView) { b.Rate = Rate{Units: NoCap} },
		"a level below 0":       func(b *BucketView) { b.Level = -1 },
		"a level past the size": func(b *BucketView) { b.Level = 41 },
		"credit below 0":        func(b *BucketView) { b.Acc = -1 },
		"a unit of credit":      func(b *BucketView) { b.Acc = b.Per },
		"a carve of no units":   func(b *BucketView) { b.Carves[0].Units = 0 },
		"a carve of no burst":   func(b *BucketView) { b.Carves[0].Burst = 0 },
		"carves past MaxInt64":  func(b *BucketView) { b.Carves[1].Units = math.MaxInt64 },
		"bursts past MaxInt64":  func(b *BucketView) { b.Carves[1].Burst = math.MaxInt64 },
		"bursts past MaxInt64 on an empty bucket": func(b *BucketView) {
			b.Carves[1].Burst, b.Level = math.MaxInt64, 0 // what the carves leave, were the sum to wrap
		},
		"a slice's carve twice": func(b *BucketView) { b.Carves = append(b.Carves, b.Carves[0]) },
		"a level past its room": func(b *BucketView) { b.Level = 40 },
	} {
		t.Run(name, func(t *testing.T) { wantErr(t, restore(spoil), ErrCorrupt) })
	}
	for name, edge := range map[string]func(*BucketView){
		"as taken, full to its room": func(*BucketView) {},
		"carved to exactly MaxInt64": func(b *BucketView) { b.Carves[1].Units = math.MaxInt64 - b.Carves[0].Units },
		"bursts to exactly MaxInt64": func(b *BucketView) {
			b.Carves[1].Burst, b.Level = math.MaxInt64-b.Carves[0].Burst, 0
		},
		"empty":                         func(b *BucketView) { b.Level = 0 },
		"the last nanosecond of credit": func(b *BucketView) { b.Level, b.Acc = 0, b.Per-1 },
	} {
		if err := restore(edge); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// restoreRefused fails t unless a fresh engine refuses snap as corrupt.
func (f *fixture) restoreRefused(t *testing.T, snap Snapshot) {
	t.Helper()
	e, err := New(Config{Clock: f.clock})
	if err != nil {
		t.Fatal(err)
	}
	wantErr(t, e.Restore(snap), ErrCorrupt)
}

// replayedUpTo is a fresh engine with the first n events recorded applied.
func (f *fixture) replayedUpTo(t *testing.T, n int) *Engine {
	t.Helper()
	e, err := New(Config{Clock: f.clock})
	if err != nil {
		t.Fatal(err)
	}
	var events []Event
	jsonCopy(t, f.rec.events[:n], &events)
	if err := e.Apply(events...); err != nil {
		t.Fatal(err)
	}
	return e
}

// turnAfter advances the clock by d and reaps, and returns the outcome w
// must have by then, at its turn.
func (f *fixture) turnAfter(t *testing.T, w *Wait, d time.Duration) Outcome {
	t.Helper()
	f.clock.Advance(d)
	f.e.Reap()
	select {
	case o := <-w.C:
		return o
	default:
		t.Fatal("the waiter was neither granted nor failed at its turn")
		return Outcome{}
	}
}
