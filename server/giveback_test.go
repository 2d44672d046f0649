package server

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor/engine"
	"github.com/governor-project/governor/store"
)

// Grants whose callers never learn of them are given back: by the server
// when the caller's context ends before the grant is committed, and on the
// caller's word when it abandons the request id (see the API's "Grants
// whose answer never arrived").

// holdingStore is a memory store whose commits can be held: after hold,
// the next Append signals entered and waits until let is called.
type holdingStore struct {
	*store.Memory
	mu      sync.Mutex
	holding bool
	entered chan struct{}
	release chan struct{}
}

func newHoldingStore() *holdingStore { return &holdingStore{Memory: store.NewMemory()} }

func (h *holdingStore) hold() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.holding, h.entered, h.release = true, make(chan struct{}), make(chan struct{})
}

func (h *holdingStore) let() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.holding {
		h.holding = false
		close(h.release)
	}
}

func (h *holdingStore) Append(ctx context.Context, recs []store.Record) error {
	h.mu.Lock()
	holding, entered, release := h.holding, h.entered, h.release
	if holding {
		h.entered = nil // only the first Append held signals
	}
	h.mu.Unlock()
	if holding {
		if entered != nil {
			close(entered)
		}
		<-release
	}
	return h.Memory.Append(ctx, recs)
}

// events reads back every event the store holds.
func (h *holdingStore) events(t *testing.T) []engine.Event {
	t.Helper()
	var evs []engine.Event
	err := h.Reopen().Load(context.Background(), store.LoadFuncs{Record: func(r store.Record) error {
		ev, err := decodeEvent(r, nil)
		evs = append(evs, ev)
		return err
	}})
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// grantCase is one call that grants, and how to see that what it granted
// is held no more.
type grantCase struct {
	name string
	// call makes the call with id as its request id, and abandon set when
	// abandon is true.
	call func(ctx context.Context, c *client, task int64, id string, abandon bool) error
	// left is what the call left held on the task: leases and slots of db,
	// reserved and used tokens. Zero when nothing was left.
	left func(n *governorpb.Node) int64
}

func grantCases() []grantCase {
	return []grantCase{
		{name: "Acquire", call: func(ctx context.Context, c *client, task int64, id string, abandon bool) error {
			_, err := c.Acquire(ctx, &governorpb.AcquireRequest{RequestId: id, NodeId: task, Class: "db", Abandon: abandon})
			return err
		}, left: func(n *governorpb.Node) int64 { return n.Held["db"] }},
		{name: "ChargeAndAcquire", call: func(ctx context.Context, c *client, task int64, id string, abandon bool) error {
			_, err := c.ChargeAndAcquire(ctx, &governorpb.ChargeAndAcquireRequest{RequestId: id, NodeId: task, Class: "db",
				Charges: map[string]int64{"tokens": 5}, Abandon: abandon})
			return err
		}, left: func(n *governorpb.Node) int64 { return n.Held["db"] + n.Used["tokens"] }},
		{name: "a charge without a lease", call: func(ctx context.Context, c *client, task int64, id string, abandon bool) error {
			_, err := c.ChargeAndAcquire(ctx, &governorpb.ChargeAndAcquireRequest{RequestId: id, NodeId: task,
				Charges: map[string]int64{"tokens": 5}, Abandon: abandon})
			return err
		}, left: func(n *governorpb.Node) int64 { return n.Used["tokens"] }},
		{name: "ResizeBlock", call: func(ctx context.Context, c *client, task int64, id string, abandon bool) error {
			_, err := c.ResizeBlock(ctx, &governorpb.ResizeBlockRequest{RequestId: id, NodeId: task, Class: "db", Want: 3, Abandon: abandon})
			return err
		}, left: func(n *governorpb.Node) int64 { return n.Held["db"] }},
		{name: "Reserve", call: func(ctx context.Context, c *client, task int64, id string, abandon bool) error {
			_, err := c.Reserve(ctx, &governorpb.ReserveRequest{RequestId: id, NodeId: task, Resource: "tokens", Want: 40, Abandon: abandon})
			return err
		}, left: func(n *governorpb.Node) int64 { return n.Reserved["tokens"] + n.Used["tokens"] }},
	}
}

func (c *client) node(t *testing.T, id int64) *governorpb.Node {
	t.Helper()
	n, err := c.GetNode(c.ctx, &governorpb.GetNodeRequest{NodeId: id})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// A caller that goes away while its grant waits for its commit is never
// told of it, so the grant is given back, durably: nothing is held after,
// and the record says so.
func TestGrantCommittedAfterItsCallerLeftIsGivenBack(t *testing.T) {
	for _, tc := range grantCases() {
		t.Run(tc.name, func(t *testing.T) {
			hs := newHoldingStore()
			cfg := testConfig()
			srv := start(t, cfg, WithStore(func(context.Context) (store.Store, error) { return hs, nil }))
			t.Cleanup(hs.let) // before the server's Close, so a failure cannot hang it
			// A long TTL: no expiry moves Seq while the test watches it.
			pay := session(t, srv.Addr(), "pay-key", time.Minute)
			task := pay.task(t, "t", nil)

			hs.hold()
			ctx, cancel := context.WithCancel(pay.ctx)
			defer cancel()
			answer := make(chan error, 1)
			go func() { answer <- tc.call(ctx, pay, task.Id, "r-1", false) }()
			<-hs.entered // granted, and being committed
			granted := srv.eng.Seq()
			cancel() // the caller goes away before the answer
			deadline := time.Now().Add(10 * time.Second)
			for srv.eng.Seq() == granted { // the server sees it and gives the grant back
				if time.Now().After(deadline) {
					t.Fatal("the grant was not given back when its caller went away")
				}
				time.Sleep(time.Millisecond)
			}
			hs.let()
			if err := <-answer; status.Code(err) != codes.Canceled {
				t.Fatalf("the call answered %v, want CANCELLED", err)
			}
			if left := tc.left(pay.node(t, task.Id)); left != 0 {
				t.Errorf("%d left held on the task after its caller went away", left)
			}
			evs := hs.events(t)
			if last := evs[len(evs)-1]; last.Seq != granted+1 || last.Kind == engine.EvSessionEnded {
				t.Errorf("the give-back is not on record: the last event is %+v", last)
			}
			// The request id now grants nothing twice: a retry is decided
			// afresh (a lease) or adds nothing (a block, a reservation).
			if err := tc.call(pay.ctx, pay, task.Id, "r-1", true); err != nil {
				t.Fatalf("abandoning it after: %v", err)
			}
			if left := tc.left(pay.node(t, task.Id)); left != 0 {
				t.Errorf("%d left held after the abandon", left)
			}
		})
	}
}

// A caller whose answer was lost after the commit sends the request again
// with abandon set, and what the first call granted is given back: the
// lease with its charges, the slots, the units. Twice is harmless.
func TestAbandonGivesBackWhatTheRequestGot(t *testing.T) {
	for _, tc := range grantCases() {
		t.Run(tc.name, func(t *testing.T) {
			srv := start(t, testConfig())
			pay := session(t, srv.Addr(), "pay-key", 0)
			task := pay.task(t, "t", nil)
			if err := tc.call(pay.ctx, pay, task.Id, "r-1", false); err != nil {
				t.Fatal(err)
			}
			if left := tc.left(pay.node(t, task.Id)); left == 0 {
				t.Fatal("the call granted nothing; the test needs a grant")
			}
			// The same id with other arguments is refused, as a reuse.
			_, err := pay.Acquire(pay.ctx, &governorpb.AcquireRequest{RequestId: "r-1", NodeId: task.Id, Class: "other", Abandon: true})
			wantCode(t, "abandon with other arguments", err, codes.InvalidArgument)
			for i := range 2 {
				if err := tc.call(pay.ctx, pay, task.Id, "r-1", true); err != nil {
					t.Fatalf("abandon %d: %v", i+1, err)
				}
				if left := tc.left(pay.node(t, task.Id)); left != 0 {
					t.Errorf("abandon %d left %d held", i+1, left)
				}
			}
		})
	}
}

// A copy of an abandoned request that arrives after the abandon (it was
// slower on its way than the abandon) grants nothing that stays.
func TestAbandonedRequestArrivingLateGrantsNothing(t *testing.T) {
	for _, tc := range grantCases() {
		t.Run(tc.name, func(t *testing.T) {
			srv := start(t, testConfig())
			pay := session(t, srv.Addr(), "pay-key", 0)
			task := pay.task(t, "t", nil)
			if err := tc.call(pay.ctx, pay, task.Id, "late", true); err != nil {
				t.Fatalf("abandon of a request not seen yet: %v", err)
			}
			err := tc.call(pay.ctx, pay, task.Id, "late", false)
			wantCode(t, "the late copy", err, codes.Canceled)
			if left := tc.left(pay.node(t, task.Id)); left != 0 {
				t.Errorf("the late copy left %d held", left)
			}
		})
	}
}

// Abandon concerns the session's own request ids only: another session's
// abandon of the same id gives back nothing of this one's.
func TestAbandonIsPerSession(t *testing.T) {
	srv := start(t, testConfig())
	pay, pay2 := session(t, srv.Addr(), "pay-key", 0), session(t, srv.Addr(), "pay-key", 0)
	task := pay.task(t, "t", nil)
	l, err := pay.Acquire(pay.ctx, &governorpb.AcquireRequest{RequestId: "mine", NodeId: task.Id, Class: "db"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := pay2.Acquire(pay2.ctx, &governorpb.AcquireRequest{RequestId: "mine", NodeId: task.Id, Class: "db", Abandon: true})
	if err != nil || got.Id != 0 {
		t.Fatalf("another session's abandon: %v, %v", got, err)
	}
	if _, err := pay.Validate(pay.ctx, &governorpb.ValidateRequest{LeaseId: l.Id}); err != nil {
		t.Fatalf("the lease after another session's abandon: %v", err)
	}
	_, err = pay.Acquire(pay.ctx, &governorpb.AcquireRequest{NodeId: task.Id, Class: "db", Abandon: true})
	wantCode(t, "abandon without a request id", err, codes.InvalidArgument)
}
