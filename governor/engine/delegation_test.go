package engine

import (
	"errors"
	"reflect"
	"testing"
	"time"
)

// Delegated budgets: blocks of slots and reservations of quota, one
// behaviour at a time. The randomized checker covers them mixed with
// everything else; these pin down the contract.

// noticeLog collects notices.
type noticeLog struct{ got []Notice }

func (l *noticeLog) Notify(n Notice) { l.got = append(l.got, n) }

// take returns the notices so far and forgets them.
func (l *noticeLog) take() []Notice {
	out := l.got
	l.got = nil
	return out
}

// delegationFixture is newFixture with a notice log.
func delegationFixture(t *testing.T, adaptive ...Adaptive) (*fixture, *noticeLog) {
	t.Helper()
	log := &noticeLog{}
	f := &fixture{t: t, clock: newFakeClock(), rec: &recorder{}}
	f.cfg = Config{Clock: f.clock, Sink: f.rec, Notifier: log, Adaptive: adaptive}
	e, err := New(f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.e = e
	f.acme = f.create(System, RootID, NodeSpec{Name: "acme"})
	f.job = f.create(System, f.acme, NodeSpec{Name: "job"})
	f.step = f.create(System, f.job, NodeSpec{Name: "step"})
	f.job2 = f.create(System, f.acme, NodeSpec{Name: "job2"})
	f.other = f.create(System, RootID, NodeSpec{Name: "other"})
	f.otherJob = f.create(System, f.other, NodeSpec{Name: "otherJob"})
	f.sA = f.open(f.acme, longTTL)
	f.sB = f.open(f.other, longTTL)
	return f, log
}

func (f *fixture) block(sid SessionID, node NodeID, class string, want, ret int64) BlockGrant {
	f.t.Helper()
	g, err := f.e.Block(sid, BlockRequest{Node: node, Class: class, Want: want, Return: ret})
	if err != nil {
		f.t.Fatalf("Block(%d, %d, %s, want %d, return %d): %v", sid, node, class, want, ret, err)
	}
	return g
}

func (f *fixture) reserve(sid SessionID, r ReserveRequest) Reservation {
	f.t.Helper()
	res, err := f.e.Reserve(sid, r)
	if err != nil {
		f.t.Fatalf("Reserve(%d, %+v): %v", sid, r, err)
	}
	return res
}

func TestBlockGrowsByWhatFitsOnTheWholeChain(t *testing.T) {
	f, _ := delegationFixture(t)
	f.setCaps(RootID, CapsEdit{Limits: map[string]int64{"db": 10}})
	f.setCaps(f.acme, CapsEdit{Limits: map[string]int64{"db": 6}})
	f.acquire(f.sB, f.otherJob, "db") // another tenant holds one of the root's 10

	g := f.block(f.sA, f.job, "db", 4, 0)
	if g.Count != 4 || g.Granted != 4 || g.Lease == 0 || g.Contended {
		t.Fatalf("first block: %+v, want 4 slots", g)
	}
	g2 := f.block(f.sA, f.job, "db", 8, 0) // the tenant's 6 bounds it
	if g2.Lease != g.Lease || g2.Count != 6 || g2.Granted != 2 {
		t.Fatalf("grown block: %+v, want the same block at 6 slots", g2)
	}
	if held := f.node(RootID).Held["db"]; held != 7 {
		t.Errorf("root holds %d db, want 7 (6 in the block and a lease)", held)
	}
	if g3 := f.block(f.sA, f.job, "db", 1, 0); g3.Granted != 0 || g3.Count != 6 {
		t.Errorf("a full chain grants %+v, want nothing", g3)
	}
	// A block is charged like its slots: an ordinary lease on the tenant
	// does not fit either.
	if _, w, err := f.e.Acquire(f.sA, AcquireRequest{Node: f.job2, Class: "db"}); err != nil || w == nil {
		t.Fatalf("acquire with the tenant full of a block: queued %v, %v; want it queued", w != nil, err)
	}
}

func TestBlockGivesIdleSlotsBackToWaiters(t *testing.T) {
	f, _ := delegationFixture(t)
	f.setCaps(RootID, CapsEdit{Limits: map[string]int64{"db": 3}})
	g := f.block(f.sA, f.job, "db", 3, 0)
	w := f.enqueue(f.sB, f.otherJob, "db")
	g = f.block(f.sA, f.job, "db", 0, 2)
	if g.Count != 1 {
		t.Fatalf("after giving 2 back the block holds %d, want 1", g.Count)
	}
	granted(t, w, "after the block gave slots back")
	if _, err := f.e.Block(f.sA, BlockRequest{Node: f.job, Class: "db", Return: 2}); !errors.Is(err, ErrInvalid) {
		t.Errorf("giving back more than the block holds: %v, want ErrInvalid", err)
	}
	if _, err := f.e.Block(f.sA, BlockRequest{Node: f.job, Class: "db", Want: 1, Return: 1}); !errors.Is(err, ErrInvalid) {
		t.Errorf("growing and shrinking at once: %v, want ErrInvalid", err)
	}
	if _, err := f.e.Block(f.sA, BlockRequest{Node: f.job2, Class: "db", Return: 1}); !errors.Is(err, ErrNotFound) {
		t.Errorf("giving back slots of no block: %v, want ErrNotFound", err)
	}
}

func TestBlockDoesNotGrowWhileAcquiresQueue(t *testing.T) {
	f, log := delegationFixture(t)
	f.setCaps(RootID, CapsEdit{Limits: map[string]int64{"db": 2}})
	a := f.block(f.sA, f.job, "db", 1, 0)
	holder := f.acquire(f.sB, f.otherJob, "db")
	w := f.enqueue(f.sB, f.otherJob, "db")
	if got := log.take(); !reflect.DeepEqual(got, []Notice{{Session: f.sA, Kind: NoticeContended, Node: f.job, Class: "db"}}) {
		t.Fatalf("notices when an acquire queued: %+v", got)
	}
	f.release(f.sB, holder) // the waiter gets the slot, not the block
	granted(t, w, "after the release")
	if got := log.take(); !reflect.DeepEqual(got, []Notice{{Session: f.sA, Kind: NoticeUncontended, Node: f.job, Class: "db"}}) {
		t.Fatalf("notices when the queue drained: %+v", got)
	}
	// While something queues, a block is refused growth and says why,
	// even where the chain has room.
	f.setCaps(RootID, CapsEdit{Limits: map[string]int64{"db": 3}})
	f.setCaps(f.other, CapsEdit{Limits: map[string]int64{"db": 1}})
	w2 := f.enqueue(f.sB, f.otherJob, "db") // queues on its own tenant's cap
	if g := f.block(f.sA, f.job, "db", 5, 0); g.Granted != 0 || !g.Contended || g.Lease != a.Lease {
		t.Errorf("growth while an acquire queues: %+v, want none and contended", g)
	}
	f.e.CancelWait(w2)
	if g := f.block(f.sA, f.job, "db", 5, 0); g.Granted != 1 || g.Contended {
		t.Errorf("growth once the queue is empty: %+v, want the one free slot", g)
	}
}

func TestBlockIsRevokedWithItsNodeAndReleasedWithItsSession(t *testing.T) {
	f, log := delegationFixture(t)
	f.setCaps(RootID, CapsEdit{Limits: map[string]int64{"db": 10}})
	g := f.block(f.sA, f.step, "db", 4, 0)
	log.take()
	if _, err := f.e.EndNode(f.sA, f.job, Cancelled, ""); err != nil {
		t.Fatal(err)
	}
	if got := log.take(); !reflect.DeepEqual(got, []Notice{{Session: f.sA, Kind: NoticeEnded, Node: f.step, Class: "db"}}) {
		t.Errorf("notices when the block's node ended: %+v", got)
	}
	if held := f.node(RootID).Held["db"]; held != 0 {
		t.Errorf("root holds %d db after the block's node ended", held)
	}
	if _, err := f.e.Block(f.sA, BlockRequest{Node: f.step, Class: "db", Want: 1}); !errors.Is(err, ErrTaskEnded) {
		t.Errorf("growing a block on an ended node: %v, want ErrTaskEnded", err)
	}
	if _, err := f.e.Validate(f.sA, g.Lease); !errors.Is(err, ErrLeaseRevoked) {
		t.Errorf("Validate of the revoked block: %v", err)
	}
	s := f.open(f.acme, testTTL)
	f.block(s, f.job2, "db", 5, 0)
	if err := f.e.CloseSession(s); err != nil {
		t.Fatal(err)
	}
	if held := f.node(RootID).Held["db"]; held != 0 {
		t.Errorf("root holds %d db after the block's session closed", held)
	}
}

func TestAdaptiveLoweringRecallsIdleSlots(t *testing.T) {
	f, log := delegationFixture(t, psp)
	f.setCaps(RootID, CapsEdit{Limits: map[string]int64{"psp": 10}})
	f.block(f.sA, f.job, "psp", 8, 0)
	log.take()
	samples := make([]Sample, 20)
	for i := range samples {
		samples[i] = Sample{Latency: time.Second}
	}
	if err := f.e.Observe(f.sA, "psp", samples); err != nil {
		t.Fatal(err)
	}
	f.tick()
	if limit := f.adaptiveLimit(); limit != 7 {
		t.Fatalf("the limit after slow samples is %d, want 7", limit)
	}
	want := []Notice{{Session: f.sA, Kind: NoticeRecall, Node: RootID, Class: "psp"}}
	if got := log.take(); !reflect.DeepEqual(got, want) {
		t.Errorf("notices when the limit fell: %+v, want %+v", got, want)
	}
}

func TestCapsEditRecallsWhatIsDelegatedBelow(t *testing.T) {
	f, log := delegationFixture(t)
	f.block(f.sA, f.step, "db", 2, 0)
	f.reserve(f.sB, ReserveRequest{Node: f.otherJob, Resource: "tokens", Want: 5})
	log.take()
	f.setCaps(f.job, CapsEdit{Quotas: map[string]int64{"tokens": 5}})
	want := []Notice{{Session: f.sA, Kind: NoticeRecall, Node: f.job}}
	if got := log.take(); !reflect.DeepEqual(got, want) {
		t.Errorf("notices after a caps edit: %+v, want %+v", got, want)
	}
}

func TestReservationCountsAgainstEveryCapAndShrinksAtTheEdge(t *testing.T) {
	f, _ := delegationFixture(t)
	f.setCaps(f.acme, CapsEdit{Quotas: map[string]int64{"calls": 100}})
	res := f.reserve(f.sA, ReserveRequest{Node: f.job, Resource: "calls", Want: 60})
	if res.Granted != 100/ReserveShare || res.Reserved != res.Granted {
		t.Fatalf("first reservation %+v, want a quarter of the headroom", res)
	}
	if v := f.node(f.acme); v.Reserved["calls"] != 25 || v.Used["calls"] != 0 {
		t.Errorf("acme: used %v reserved %v", v.Used, v.Reserved)
	}
	// Reserved units are as good as spent for everyone else.
	f.consume(f.sA, f.job2, "calls", 75)
	if err := f.e.Consume(f.sA, f.job2, "calls", 1, ""); !errors.Is(err, ErrRecalling) {
		t.Fatalf("a consume that fits only without the reservation: %v, want ErrRecalling", err)
	}
	// Settling moves spent units to used.
	res = f.reserve(f.sA, ReserveRequest{Node: f.job, Resource: "calls", Spent: 24})
	if res.Granted != 0 || res.Reserved != 1 {
		t.Errorf("after spending 24 of 25: %+v", res)
	}
	v := f.node(f.acme)
	if v.Used["calls"] != 99 || v.Reserved["calls"] != 1 {
		t.Errorf("acme after settling: used %d reserved %d, want 99 and 1", v.Used["calls"], v.Reserved["calls"])
	}
	// One unit left, held by the session itself: a top-up must first get
	// it back, and then is denied for good once it is spent.
	_, err := f.e.Reserve(f.sA, ReserveRequest{Node: f.job, Resource: "calls", Want: 1})
	if !errors.Is(err, ErrRecalling) {
		t.Fatalf("a top-up with no room but the session's own unit: %v, want ErrRecalling", err)
	}
	f.reserve(f.sA, ReserveRequest{Node: f.job, Resource: "calls", Spent: 1})
	_, err = f.e.Reserve(f.sA, ReserveRequest{Node: f.job, Resource: "calls", Want: 1})
	var d *Denial
	if !errors.As(err, &d) || d.Node != f.acme || d.Used != 100 || d.Limit != 100 {
		t.Fatalf("a top-up with everything spent: %v, want a denial on acme at 100 of 100", err)
	}
}

func TestRecallTellsEveryHolderBelowTheBlockedNode(t *testing.T) {
	f, log := delegationFixture(t)
	f.setCaps(f.acme, CapsEdit{Quotas: map[string]int64{"calls": 8}})
	s2 := f.open(f.acme, longTTL)
	f.reserve(f.sA, ReserveRequest{Node: f.step, Resource: "calls", Want: 8}) // 2 of 8
	f.reserve(s2, ReserveRequest{Node: f.job2, Resource: "calls", Want: 8})   // 1 of 6
	f.consume(f.sA, f.job, "calls", 5)
	log.take()
	err := unchanged(t, f.e, func() error { return f.e.Consume(f.sA, f.job2, "calls", 1, "") })
	wantErr(t, err, ErrRecalling)
	want := []Notice{
		{Session: f.sA, Kind: NoticeRecall, Node: f.acme, Resource: "calls"},
		{Session: s2, Kind: NoticeRecall, Node: f.acme, Resource: "calls"},
	}
	if got := log.take(); !reflect.DeepEqual(got, want) {
		t.Fatalf("recall notices %+v, want %+v", got, want)
	}
	// The holders spend one and give back the rest: the consume fits, and
	// the next one is denied for good.
	f.reserve(f.sA, ReserveRequest{Node: f.step, Resource: "calls", Spent: 1, Return: 1})
	f.reserve(s2, ReserveRequest{Node: f.job2, Resource: "calls", Return: 1})
	f.consume(f.sA, f.job2, "calls", 1)
	f.consume(f.sA, f.job2, "calls", 1)
	err = f.e.Consume(f.sA, f.job2, "calls", 1, "")
	if !errors.Is(err, ErrQuotaExhausted) {
		t.Fatalf("with 8 of 8 spent: %v, want a denial", err)
	}
}

func TestAnEndedSessionsReservationCountsAsSpent(t *testing.T) {
	f, _ := delegationFixture(t)
	f.setCaps(f.acme, CapsEdit{Quotas: map[string]int64{"calls": 40}})
	s := f.open(f.acme, testTTL)
	f.reserve(s, ReserveRequest{Node: f.job, Resource: "calls", Want: 10})
	f.clock.Advance(testTTL) // the sidecar died with 10 units unspent
	f.e.Reap()
	v := f.node(f.acme)
	if v.Used["calls"] != 10 || v.Reserved["calls"] != 0 {
		t.Errorf("after the session expired: used %d reserved %d, want 10 and 0", v.Used["calls"], v.Reserved["calls"])
	}
}

func TestReservationOnAnEndedNodeIsSettledButNotToppedUp(t *testing.T) {
	f, log := delegationFixture(t)
	f.reserve(f.sA, ReserveRequest{Node: f.step, Resource: "calls", Want: 8})
	log.take()
	if _, err := f.e.EndNode(f.sA, f.job, Closed, ""); err != nil {
		t.Fatal(err)
	}
	if got := log.take(); !reflect.DeepEqual(got, []Notice{{Session: f.sA, Kind: NoticeEnded, Node: f.step, Resource: "calls"}}) {
		t.Errorf("notices when the node ended: %+v", got)
	}
	_, err := f.e.Reserve(f.sA, ReserveRequest{Node: f.step, Resource: "calls", Spent: 1, Want: 1})
	wantErr(t, err, ErrTaskEnded)
	f.reserve(f.sA, ReserveRequest{Node: f.step, Resource: "calls", Spent: 3, Return: 5})
	if v := f.node(f.acme); v.Used["calls"] != 3 || v.Reserved["calls"] != 0 {
		t.Errorf("after settling on the ended node: used %v reserved %v", v.Used, v.Reserved)
	}
}

func TestDelegationRetriesAndBadInput(t *testing.T) {
	f, _ := delegationFixture(t)
	f.setCaps(RootID, CapsEdit{Limits: map[string]int64{"db": 5}})
	g, err := f.e.Block(f.sA, BlockRequest{Node: f.job, Class: "db", Want: 3, RequestID: "b1"})
	if err != nil {
		t.Fatal(err)
	}
	var again BlockGrant
	unchanged(t, f.e, func() error {
		again, err = f.e.Block(f.sA, BlockRequest{Node: f.job, Class: "db", Want: 3, RequestID: "b1"})
		return err
	})
	if again.Granted != g.Granted || again.Lease != g.Lease {
		t.Errorf("retry %+v, original %+v", again, g)
	}
	_, err = f.e.Block(f.sA, BlockRequest{Node: f.job, Class: "db", Want: 2, RequestID: "b1"})
	wantErr(t, err, ErrRequestIDReused)

	res, err := f.e.Reserve(f.sA, ReserveRequest{Node: f.job, Resource: "calls", Want: 7, RequestID: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	var resAgain Reservation
	unchanged(t, f.e, func() error {
		resAgain, err = f.e.Reserve(f.sA, ReserveRequest{Node: f.job, Resource: "calls", Want: 7, RequestID: "r1"})
		return err
	})
	if resAgain.Granted != res.Granted {
		t.Errorf("retry %+v, original %+v", resAgain, res)
	}
	for _, bad := range []ReserveRequest{
		{Node: f.job, Resource: "calls"},
		{Node: f.job, Resource: "calls", Want: -1},
		{Node: f.job, Resource: "calls", Spent: 8},
		{Node: f.job, Resource: "calls", Spent: 4, Return: 4},
		{Node: f.job, Resource: "", Want: 1},
	} {
		wantErr(t, unchanged(t, f.e, func() error { _, err := f.e.Reserve(f.sA, bad); return err }), ErrInvalid)
	}
	wantErr(t, unchanged(t, f.e, func() error {
		_, err := f.e.Reserve(f.sA, ReserveRequest{Node: f.otherJob, Resource: "calls", Want: 1})
		return err
	}), ErrNotFound)
	wantErr(t, unchanged(t, f.e, func() error {
		_, err := f.e.Block(f.sA, BlockRequest{Node: f.otherJob, Class: "db", Want: 1})
		return err
	}), ErrNotFound)
	wantErr(t, unchanged(t, f.e, func() error {
		return f.e.Observe(f.sA, "psp", []Sample{{Latency: -time.Second}})
	}), ErrInvalid) // refused, though psp is not adaptive here and its samples are ignored
	wantErr(t, unchanged(t, f.e, func() error {
		return f.e.Observe(f.sA, "psp", []Sample{{Latency: time.Second}})
	}), nil)
}

func TestDelegationSurvivesSnapshotAndReplay(t *testing.T) {
	f, _ := delegationFixture(t)
	f.setCaps(RootID, CapsEdit{Limits: map[string]int64{"db": 5}, Quotas: map[string]int64{"calls": 50}})
	f.block(f.sA, f.job, "db", 3, 0)
	f.block(f.sA, f.job, "db", 0, 1)
	f.block(f.sB, f.otherJob, "db", 0, 0) // a block of no slots is kept
	f.reserve(f.sA, ReserveRequest{Node: f.step, Resource: "calls", Want: 40})
	f.reserve(f.sA, ReserveRequest{Node: f.step, Resource: "calls", Spent: 4, Return: 2})
	f.reserve(f.sB, ReserveRequest{Node: f.otherJob, Resource: "calls", Want: 8})
	live := f.e.Snapshot()
	for _, way := range []string{wayRestore, wayReplay} {
		got := f.rebuild(t, way).Snapshot()
		if !reflect.DeepEqual(got, live) {
			t.Errorf("%s differs:\n%s", way, diffSnapshots(live, got))
		}
	}
	// A snapshot whose reservations disagree with its nodes is refused.
	bad := cloneSnapshot(t, live)
	bad.Sessions[0].Reservations[0].Amount++
	e, _ := New(Config{Clock: f.clock})
	if err := e.Restore(bad); !errors.Is(err, ErrCorrupt) {
		t.Errorf("restore of a snapshot with a wrong reservation: %v, want ErrCorrupt", err)
	}
}

func TestReservationsAdmitExactlyTheQuota(t *testing.T) {
	f, log := delegationFixture(t)
	f.setCaps(f.acme, CapsEdit{Quotas: map[string]int64{"calls": 200}})
	// Three sidecars' sessions spend a tenant quota through reservations
	// only, answering recalls as a sidecar does.
	sessions := []SessionID{f.sA, f.open(f.acme, longTTL), f.open(f.acme, longTTL)}
	nodes := []NodeID{f.job, f.job2, f.step}
	spent := make([]int64, 3)   // spent and not settled
	unspent := make([]int64, 3) // reserved and not spent
	admitted, denied, last := 0, 0, int64(0)
	for i := 0; denied < 30; i++ {
		k := i % 3
		if unspent[k] == 0 {
			res, err := f.e.Reserve(sessions[k], ReserveRequest{Node: nodes[k], Resource: "calls", Spent: spent[k], Want: 64})
			switch {
			case errors.Is(err, ErrRecalling):
				for _, n := range log.take() {
					j := map[SessionID]int{sessions[0]: 0, sessions[1]: 1, sessions[2]: 2}[n.Session]
					if spent[j]+unspent[j] > 0 {
						f.reserve(n.Session, ReserveRequest{Node: nodes[j], Resource: "calls", Spent: spent[j], Return: unspent[j]})
						spent[j], unspent[j] = 0, 0
					}
				}
				continue
			case errors.Is(err, ErrQuotaExhausted):
				if spent[k] > 0 { // a refused request settles nothing: settle alone
					f.reserve(sessions[k], ReserveRequest{Node: nodes[k], Resource: "calls", Spent: spent[k]})
					spent[k] = 0
				}
				denied++
				continue
			case err != nil:
				t.Fatal(err)
			}
			spent[k], unspent[k], last = 0, res.Granted, res.Granted
		}
		unspent[k]--
		spent[k]++
		admitted++
	}
	if admitted != 200 {
		t.Errorf("admitted %d requests against a quota of 200", admitted)
	}
	if last != 1 {
		t.Errorf("the last reservation was %d units; at the edge they shrink to 1", last)
	}
}

func TestContentionIsRemindedWhileAcquiresQueue(t *testing.T) {
	f, log := delegationFixture(t, psp)
	f.setCaps(RootID, CapsEdit{Limits: map[string]int64{"db": 2, "psp": 2}})
	if g := f.block(f.sA, f.job, "db", 2, 0); g.Adaptive {
		t.Errorf("db is not adaptive, but its block says so")
	}
	if g := f.block(f.sA, f.job2, "psp", 1, 0); !g.Adaptive {
		t.Errorf("psp is adaptive, but its block does not say so")
	}
	f.e.RemindContention()
	if got := log.take(); len(got) != 0 {
		t.Fatalf("nothing queues, yet reminders %+v", got)
	}
	w := f.enqueue(f.sB, f.otherJob, "db")
	log.take()
	f.e.RemindContention() // the holder missed the first notice: it is told again
	want := []Notice{{Session: f.sA, Kind: NoticeContended, Node: f.job, Class: "db"}}
	if got := log.take(); !reflect.DeepEqual(got, want) {
		t.Errorf("reminders %+v, want %+v", got, want)
	}
	f.block(f.sA, f.job, "db", 0, 2)
	granted(t, w, "after the holder gave its slots back")
	log.take()
	f.e.RemindContention() // a block of no slots keeps nothing from anyone
	if got := log.take(); len(got) != 0 {
		t.Errorf("reminders %+v to an empty block", got)
	}
}
