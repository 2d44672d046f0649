package store_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/governor-project/governor/internal/pgtest"
	"github.com/governor-project/governor/store"
)

// candidate is one governord's view of a shared PostgreSQL store: its own
// handle and its own Elector.
type candidate struct {
	st *store.Postgres
	el *store.Elector
}

func newCandidate(t *testing.T, dsn, name string, lease, drift time.Duration) candidate {
	t.Helper()
	ctx := context.Background()
	st, err := store.OpenPostgres(ctx, dsn)
	if err != nil {
		t.Fatalf("OpenPostgres: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	el, err := st.NewElector(ctx, name, name+":7600", lease, drift)
	if err != nil {
		t.Fatalf("NewElector: %v", err)
	}
	t.Cleanup(el.Close)
	return candidate{st: st, el: el}
}

func record(seq uint64) store.Record {
	return store.Record{Seq: seq, Data: []byte(fmt.Sprintf(`{"seq":%d}`, seq))}
}

// winWhenDue campaigns until c wins, re-reading the row in between: the
// wait is for the lease to end by the database's clock, which is what is
// being tested, not for readiness.
func winWhenDue(t *testing.T, c candidate) store.Term {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		term, won, err := c.el.Campaign(ctx)
		if err != nil {
			t.Fatalf("Campaign: %v", err)
		}
		if won {
			return term
		}
		info, err := c.el.Leader(ctx)
		if err != nil {
			t.Fatalf("Leader: %v", err)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("never won; the leader is %+v", info)
		case <-time.After(min(info.Left, 20*time.Millisecond) + time.Millisecond):
		}
	}
}

func TestElectionOneWinnerOfARace(t *testing.T) {
	dsn := pgtest.Schema(t, "governor_ha_")
	const n = 4
	cands := make([]candidate, n)
	for i := range cands {
		cands[i] = newCandidate(t, dsn, fmt.Sprintf("c%d", i), time.Minute, time.Second)
	}
	var wg sync.WaitGroup
	won := make([]bool, n)
	terms := make([]store.Term, n)
	start := make(chan struct{})
	for i, c := range cands {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			var err error
			terms[i], won[i], err = c.el.Campaign(context.Background())
			if err != nil {
				t.Errorf("Campaign %d: %v", i, err)
			}
		}()
	}
	close(start)
	wg.Wait()
	winners := 0
	for i := range won {
		if won[i] {
			winners++
			if terms[i].Epoch != 1 {
				t.Errorf("the winner's epoch is %d, want 1", terms[i].Epoch)
			}
		}
	}
	if winners != 1 {
		t.Fatalf("%d of %d candidates won one race, want 1", winners, n)
	}
	info, err := cands[0].el.Leader(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !info.Live || info.Epoch != 1 || info.Addr == "" {
		t.Fatalf("the leadership row after the race: %+v", info)
	}
}

func TestDeposedLeaderCannotAppendOrRenew(t *testing.T) {
	dsn := pgtest.Schema(t, "governor_ha_")
	const lease = 300 * time.Millisecond
	a := newCandidate(t, dsn, "a", lease, 50*time.Millisecond)
	b := newCandidate(t, dsn, "b", lease, 50*time.Millisecond)
	ctx := context.Background()

	ta := winWhenDue(t, a)
	a.st.Fence(ta.Epoch)
	if err := a.st.Append(ctx, []store.Record{record(1), record(2)}); err != nil {
		t.Fatalf("the leader's append: %v", err)
	}
	// a stops renewing (a pause); b wins once the lease has ended.
	tb := winWhenDue(t, b)
	if tb.Epoch <= ta.Epoch {
		t.Fatalf("the new epoch %d is not above the old %d", tb.Epoch, ta.Epoch)
	}
	if err := a.st.Append(ctx, []store.Record{record(3)}); !errors.Is(err, store.ErrDeposed) {
		t.Fatalf("the deposed leader's append: %v, want ErrDeposed", err)
	}
	if _, err := a.el.Renew(ctx, ta.Epoch); !errors.Is(err, store.ErrDeposed) {
		t.Fatalf("the deposed leader's renewal: %v, want ErrDeposed", err)
	}
	// The new leader continues the log the old one left, and a snapshot by
	// the old one is refused too.
	b.st.Fence(tb.Epoch)
	if err := b.st.Append(ctx, []store.Record{record(3)}); err != nil {
		t.Fatalf("the new leader's append: %v", err)
	}
	if err := a.st.WriteSnapshotPart(ctx, 3, 0, []byte("x")); !errors.Is(err, store.ErrDeposed) {
		t.Fatalf("the deposed leader's snapshot part: %v, want ErrDeposed", err)
	}
	if err := a.st.SaveSnapshot(ctx, 3, []byte("x")); !errors.Is(err, store.ErrDeposed) {
		t.Fatalf("the deposed leader's whole snapshot: %v, want ErrDeposed", err)
	}
	var seqs []uint64
	if err := b.st.Load(ctx, store.LoadFuncs{Record: func(r store.Record) error {
		seqs = append(seqs, r.Seq)
		return nil
	}}); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(seqs) != "[1 2 3]" {
		t.Fatalf("the log holds %v, want [1 2 3]", seqs)
	}
}

// TestAppendInFlightAtTakeover races the old leader's appends with the
// takeover: each append either commits before the new epoch (and the new
// leader's read of the log sees it) or fails with ErrDeposed.
func TestAppendInFlightAtTakeover(t *testing.T) {
	dsn := pgtest.Schema(t, "governor_ha_")
	const lease = 200 * time.Millisecond
	a := newCandidate(t, dsn, "a", lease, 20*time.Millisecond)
	b := newCandidate(t, dsn, "b", lease, 20*time.Millisecond)
	ctx := context.Background()
	ta := winWhenDue(t, a)
	a.st.Fence(ta.Epoch)
	var acked uint64
	done := make(chan error, 1)
	go func() {
		for seq := uint64(1); ; seq++ {
			if err := a.st.Append(ctx, []store.Record{record(seq)}); err != nil {
				done <- err
				return
			}
			acked = seq
		}
	}()
	tb := winWhenDue(t, b)
	var err error
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		t.Fatal("the old leader still appends a minute after the new one won")
	}
	if !errors.Is(err, store.ErrDeposed) {
		t.Fatalf("the old leader's append stopped with %v, want ErrDeposed", err)
	}
	tail, rerr := b.st.ReadTail(ctx, 0, 0, 1_000_000)
	if rerr != nil {
		t.Fatal(rerr)
	}
	if tail.LastSeq != acked || uint64(len(tail.Records)) != acked {
		t.Fatalf("the old leader acknowledged %d appends; the new one reads %d records, last seq %d", acked, len(tail.Records), tail.LastSeq)
	}
	b.st.Fence(tb.Epoch)
	if err := b.st.Append(ctx, []store.Record{record(acked + 1)}); err != nil {
		t.Fatalf("the new leader's first append: %v", err)
	}
}

// TestNewLeaderWaitsOutTheOldLease: a candidate cannot win while the lease
// runs, so it wins no earlier than a lease after the old leader's last
// renewal was sent; and by then the old leader's term (lease less drift,
// from the same moment) has ended.
func TestNewLeaderWaitsOutTheOldLease(t *testing.T) {
	dsn := pgtest.Schema(t, "governor_ha_")
	const lease, drift = 500 * time.Millisecond, 100 * time.Millisecond
	a := newCandidate(t, dsn, "a", lease, drift)
	b := newCandidate(t, dsn, "b", lease, drift)
	ctx := context.Background()
	winWhenDue(t, a)
	sent := time.Now()
	ta, err := a.el.Renew(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, won, err := b.el.Campaign(ctx); err != nil || won {
		t.Fatalf("a campaign during the lease: won %v, %v", won, err)
	}
	winWhenDue(t, b)
	wonAt := time.Now()
	if got := wonAt.Sub(sent); got < lease {
		t.Fatalf("the new leader won %v after the old leader's renewal was sent, before the %v lease ended", got, lease)
	}
	if ta.Valid(wonAt) {
		t.Fatalf("the old leader's term (until %v) is still valid when the new leader wins", ta.Until)
	}
}

func TestResignLetsAStandbyWinAtOnce(t *testing.T) {
	dsn := pgtest.Schema(t, "governor_ha_")
	a := newCandidate(t, dsn, "a", time.Hour, time.Second)
	b := newCandidate(t, dsn, "b", time.Hour, time.Second)
	ctx := context.Background()
	if info, err := a.el.Leader(ctx); err != nil || info.Live || info.Epoch != 0 {
		t.Fatalf("the leadership of a fresh store: %+v, %v", info, err)
	}
	ta := winWhenDue(t, a)
	if _, won, _ := b.el.Campaign(ctx); won {
		t.Fatal("won during an hour's lease")
	}
	if err := a.el.Resign(ctx, ta.Epoch); err != nil {
		t.Fatal(err)
	}
	if info, err := b.el.Leader(ctx); err != nil || info.Live || info.Epoch != ta.Epoch {
		t.Fatalf("the leadership after a resignation: %+v, %v", info, err)
	}
	if _, won, err := b.el.Campaign(ctx); err != nil || !won {
		t.Fatalf("a campaign after the leader resigned: won %v, %v", won, err)
	}
}

// TestFollowerReadsTheTailAndIsNotified: a fenced append notifies a
// listener, and ReadTail returns the records and new sessions after a point.
func TestFollowerReadsTheTailAndIsNotified(t *testing.T) {
	dsn := pgtest.Schema(t, "governor_ha_")
	a := newCandidate(t, dsn, "a", time.Minute, time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := a.st.Listen(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ta := winWhenDue(t, a)
	a.st.Fence(ta.Epoch)
	r1 := record(1)
	r1.Opens = &store.Session{ID: 7, TokenHash: "h7"}
	if err := a.st.Append(ctx, []store.Record{r1, record(2)}); err != nil {
		t.Fatal(err)
	}
	if err := l.Wait(ctx); err != nil {
		t.Fatalf("no notification of the append: %v", err)
	}
	tail, err := a.st.ReadTail(ctx, 1, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(tail.Records) != 1 || tail.Records[0].Seq != 2 || tail.LastSeq != 2 {
		t.Fatalf("tail after 1: %+v", tail)
	}
	if len(tail.Sessions) != 1 || tail.Sessions[0] != (store.Session{ID: 7, TokenHash: "h7"}) {
		t.Fatalf("sessions after 0: %+v", tail.Sessions)
	}
	if tail, err = a.st.ReadTail(ctx, 2, 7, 10); err != nil || len(tail.Records)+len(tail.Sessions) != 0 {
		t.Fatalf("tail after 2 and session 7: %+v, %v", tail, err)
	}
}
