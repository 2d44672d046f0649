package governor

import (
	"context"
	"errors"
	"io"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/internal/retry"
)

// Delegated budgets are for a process that grants work to many callers of
// its own, as governor-proxy does for the worker behind it: governord hands
// its session a block of slots of a class and a reservation of quota units,
// both charged against every cap above at once, and the process grants from
// them locally, without a call per unit of work. It reports what it spent,
// gives back what it does not need, and acts on the notices Watch streams.
// Most programs want Task.Acquire and Task.Consume instead.

// Block is a session's block of slots of a class on a task.
type Block struct {
	LeaseID int64 // the block's lease id; its slots share it
	Count   int64 // slots the block holds now
	Granted int64 // slots the request added
	// Contended says acquires of the class are queued at governord: take
	// single leases with Task.Acquire, through the fair queue, instead of
	// growing the block, and give idle slots back.
	Contended bool
	// Adaptive says the class has an adaptive limit: report how the slots'
	// calls went with ReportSamples.
	Adaptive bool
	// ReadOnly, set while the task's tenant is read_only, is the refusal
	// work classified as a write gets: grant no write from the block. It
	// is the state when governord answered; a change of it recalls the
	// block (NoticeRecall), and the next answer says the new one.
	ReadOnly *TenantStateError
}

// ResizeBlock grows the session's block of class on the task by up to want
// slots (as many as fit now, none while acquires of the class queue), or
// gives ret idle slots back. It never waits for a slot. A growth that fails
// adds nothing: slots granted as ctx ended are given back, as Acquire
// gives back a lease. A shrink that fails may have been done.
func (t *Task) ResizeBlock(ctx context.Context, class string, want, ret int64) (Block, error) {
	if err := t.alive(); err != nil {
		return Block{}, err
	}
	req := &governorpb.ResizeBlockRequest{NodeId: t.id, Class: class, Want: want, Return: ret}
	var resp *governorpb.Block
	var abandon func(ctx context.Context, id string) error
	if want > 0 {
		abandon = func(ctx context.Context, id string) error {
			_, err := t.c.rpc.ResizeBlock(ctx, &governorpb.ResizeBlockRequest{RequestId: id, NodeId: t.id, Class: class,
				Want: want, Return: ret, Abandon: true})
			return err
		}
	}
	send := func(ctx context.Context, id string) error {
		req.RequestId = id
		var err error
		resp, err = t.c.rpc.ResizeBlock(ctx, req)
		return err
	}
	var err error
	if want > 0 {
		err = t.c.grant(ctx, "ResizeBlock", send, abandon)
	} else {
		err = t.c.giveBack(ctx, "ResizeBlock", send)
	}
	if err != nil {
		t.observe(err)
		return Block{}, err
	}
	return Block{LeaseID: resp.GetLeaseId(), Count: resp.GetCount(), Granted: resp.GetGranted(), Contended: resp.GetContended(),
		Adaptive: resp.GetAdaptive(), ReadOnly: tenantRefusal(resp.GetReadOnly())}, nil
}

// Reservation is a session's reservation of a resource on a task.
type Reservation struct {
	Reserved int64 // unspent units the session holds now
	Granted  int64 // units the request added
	// ReadOnly, set while the task's tenant is read_only, is the refusal
	// work classified as a write gets: spend none of the units on a write
	// (as Block.ReadOnly).
	ReadOnly *TenantStateError
	// Rated says that a rate binds the resource on the task's chain, so
	// nothing was reserved: units spent later without asking would escape
	// the rate. Charge it per unit of work (ChargeAndAcquire, Consume)
	// instead, and ask again later, as the rate may be removed.
	Rated bool
	// Slice, while nobody contends for the rate, is a share of it
	// delegated to the session with the units reserved: see RateSlice.
	Slice *RateSlice
}

// RateSlice is a slice of a rate delegated to the session (governord's
// Reservation.slice_id): work charging the resource on the task may be
// admitted without asking at up to Units per Per, from a bucket of Burst
// units that starts full, spending the reserved units, until Term has
// passed since before the Reserve was sent. A top-up while it lives renews
// it when nobody contends for the rate (the same ID: keep the bucket);
// give it back with EndSlice.
type RateSlice struct {
	ID    uint64
	Units int64
	Per   time.Duration
	Burst int64
	Term  time.Duration
}

// Reserve settles and tops up the session's reservation of resource on the
// task in one step: spent units are charged for good, ret unspent units go
// back, and up to want more are reserved (at most a quarter of what is left
// under the caps, at least one). A quota with no room left is a *Denial.
// When other sessions hold what is needed unspent, governord recalls it and
// the call waits. With want 0 it only settles, which is accepted on a task
// that has ended (an ended task is otherwise a *TaskEndedError). A top-up
// that fails adds nothing: units reserved as ctx ended are given back, as
// Acquire gives back a lease. What a failed call settled may have been
// settled: settle with a context that does not end early, as a sidecar
// does, when that matters.
func (t *Task) Reserve(ctx context.Context, resource string, spent, ret, want int64) (Reservation, error) {
	return t.reserve(ctx, &governorpb.ReserveRequest{NodeId: t.id, Resource: resource, Spent: spent, Return: ret, Want: want})
}

// EndSlice gives back the session's slice of resource's rate on the task,
// if it holds one, settling spent and ret as Reserve does.
func (t *Task) EndSlice(ctx context.Context, resource string, spent, ret int64) (Reservation, error) {
	return t.reserve(ctx, &governorpb.ReserveRequest{NodeId: t.id, Resource: resource, Spent: spent, Return: ret, EndSlice: true})
}

// ReserveExactly reserves all of amount units of resource on the task for
// the session, or nothing: it is checked as Consume(amount) would be, and
// refused the same way (a *Denial when the quota has no room for all of
// it). It holds one call's estimate, which a sidecar settles to what the
// call used, with Reserve(ctx, resource, used, amount-used, 0), when the
// call ends: what the call did not use goes back.
func (t *Task) ReserveExactly(ctx context.Context, resource string, amount int64) (Reservation, error) {
	return t.reserve(ctx, &governorpb.ReserveRequest{NodeId: t.id, Resource: resource, Want: amount, Exact: true})
}

func (t *Task) reserve(ctx context.Context, req *governorpb.ReserveRequest) (Reservation, error) {
	want := req.GetWant()
	if want > 0 {
		if err := t.alive(); err != nil {
			return Reservation{}, err
		}
	}
	var resp *governorpb.Reservation
	var abandon func(ctx context.Context, id string) error
	if want > 0 {
		abandon = func(ctx context.Context, id string) error {
			_, err := t.c.rpc.Reserve(ctx, &governorpb.ReserveRequest{RequestId: id, NodeId: req.NodeId, Resource: req.Resource,
				Spent: req.Spent, Return: req.Return, Want: want, Exact: req.Exact, Abandon: true})
			return err
		}
	}
	send := func(ctx context.Context, id string) error {
		req.RequestId = id
		var err error
		resp, err = t.c.rpc.Reserve(ctx, req)
		return err
	}
	var err error
	if want > 0 {
		err = t.c.grant(ctx, "Reserve", send, abandon)
	} else {
		err = t.c.giveBack(ctx, "Reserve", send) // a settlement: what was spent, and what goes back
	}
	if err != nil {
		if want > 0 {
			t.observe(err)
		}
		return Reservation{}, err
	}
	res := Reservation{Reserved: resp.GetReserved(), Granted: resp.GetGranted(), ReadOnly: tenantRefusal(resp.GetReadOnly()),
		Rated: resp.GetRated()}
	if id := resp.GetSliceId(); id != 0 && resp.GetSliceUnits() > 0 && resp.GetSlicePerNs() > 0 && resp.GetSliceBurst() > 0 {
		res.Slice = &RateSlice{ID: id, Units: resp.GetSliceUnits(), Per: time.Duration(resp.GetSlicePerNs()),
			Burst: resp.GetSliceBurst(), Term: time.Duration(max(0, resp.GetSliceTermNs()))}
	}
	return res, nil
}

// Sample is how one call made in a slot of a block went, for adaptive
// limits: what Lease.Release reports for one lease.
type Sample struct {
	Latency    time.Duration
	Overloaded bool
}

// ReportSamples reports calls made in slots of the session's blocks of
// class, in one batch.
func (c *Client) ReportSamples(ctx context.Context, class string, samples []Sample) error {
	req := &governorpb.ReportSamplesRequest{Class: class, LatenciesNs: make([]int64, len(samples))}
	for i, s := range samples {
		req.LatenciesNs[i] = int64(max(s.Latency, 0))
		if s.Overloaded {
			req.Overloaded++
		}
	}
	return c.call(ctx, "ReportSamples", func(ctx context.Context, _ string) error {
		_, err := c.rpc.ReportSamples(ctx, req)
		return err
	})
}

// DenialCount is how many requests for work on a node a sidecar refused by
// itself for one cause (ReportDenials).
type DenialCount struct {
	Node  int64
	Cause string // as on the wire ("wait-timeout", "task-ended", "unavailable") or "quota:RESOURCE"
	Count int64
}

// ReportDenials tells governord of refusals the caller decided by itself,
// from what its session holds, for governord's usage records. Refusals of
// governord's own calls are counted there already: report only the
// others. A report whose answer was lost may be counted twice if sent
// again; usage figures are for reports, never authority.
func (c *Client) ReportDenials(ctx context.Context, denials []DenialCount) error {
	req := &governorpb.ReportDenialsRequest{Denials: make([]*governorpb.DenialCount, len(denials))}
	for i, d := range denials {
		req.Denials[i] = &governorpb.DenialCount{NodeId: d.Node, Cause: d.Cause, Count: d.Count}
	}
	return c.call(ctx, "ReportDenials", func(ctx context.Context, _ string) error {
		_, err := c.rpc.ReportDenials(ctx, req)
		return err
	})
}

// BlockUse is how many slots of the session's block of Class on Node hold
// work, and how long the oldest of that work has held its slot
// (ReportBlockUse).
type BlockUse struct {
	Node   int64
	Class  string
	InUse  int64
	Oldest time.Duration
}

// ReportBlockUse tells governord how the session's blocks are used: the
// blocks with slots holding work (a block left out has none). Each report
// replaces the last; governord keeps them for Inspect only, and forgets
// them when it restarts, so report again now and then.
func (c *Client) ReportBlockUse(ctx context.Context, use []BlockUse) error {
	req := &governorpb.ReportBlockUseRequest{Blocks: make([]*governorpb.BlockUse, len(use))}
	for i, u := range use {
		req.Blocks[i] = &governorpb.BlockUse{NodeId: u.Node, Class: u.Class, InUse: u.InUse, Oldest: durationpb.New(max(u.Oldest, 0))}
	}
	return c.call(ctx, "ReportBlockUse", func(ctx context.Context, _ string) error {
		_, err := c.rpc.ReportBlockUse(ctx, req)
		return err
	})
}

// NoticeKind says what a holder of delegated budgets must do.
type NoticeKind int

// The kinds of notice.
const (
	// NoticeContended: acquires of Class queue at governord. Give idle slots
	// of the block on NodeID back, and take single leases until
	// NoticeUncontended.
	NoticeContended NoticeKind = NoticeKind(governorpb.Notice_KIND_CONTENDED)
	// NoticeUncontended: nothing queues for Class any more.
	NoticeUncontended NoticeKind = NoticeKind(governorpb.Notice_KIND_UNCONTENDED)
	// NoticeRecall: give back idle slots and unspent units held on NodeID
	// or below it: of Class only, of Resource only, or (neither set) all.
	NoticeRecall NoticeKind = NoticeKind(governorpb.Notice_KIND_RECALL)
	// NoticeEnded: NodeID has ended. Its block of Class is revoked, or its
	// reservation of Resource must be settled; grant nothing more there.
	NoticeEnded NoticeKind = NoticeKind(governorpb.Notice_KIND_ENDED)
)

func (k NoticeKind) String() string {
	switch k {
	case NoticeContended:
		return "contended"
	case NoticeUncontended:
		return "uncontended"
	case NoticeRecall:
		return "recall"
	case NoticeEnded:
		return "ended"
	}
	return "unknown"
}

// Notice is one message of Watch.
type Notice struct {
	Kind     NoticeKind
	NodeID   int64
	Class    string
	Resource string
}

// Watch streams the session's notices to fn, one at a time, until ctx ends
// or the session does; it returns why. When the stream breaks (governord
// restarts, a network blip) it opens a new one, with backoff; each new
// stream starts by saying which of the session's blocks are contended.
// Notices sent while no stream was open are lost, which weakens no cap: a
// recall is repeated for as long as someone waits for it.
func (c *Client) Watch(ctx context.Context, fn func(Notice)) error {
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	defer context.AfterFunc(c.life, func() { stop(context.Cause(c.life)) })()
	for try := 0; ; try++ {
		stream, err := c.rpc.Watch(ctx, &governorpb.WatchRequest{})
		if err == nil {
			var n *governorpb.Notice
			for n, err = stream.Recv(); err == nil; n, err = stream.Recv() {
				try = 0
				fn(Notice{Kind: NoticeKind(n.GetKind()), NodeID: n.GetNodeId(), Class: n.GetClass(), Resource: n.GetResource()})
			}
		}
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		switch status.Code(err) {
		case codes.Unauthenticated:
			c.giveUp(forgotten(err))
			return fromStatus("Watch", err)
		case codes.Unavailable, codes.Canceled, codes.DeadlineExceeded, codes.Internal, codes.Unknown:
		default:
			if !errors.Is(err, io.EOF) {
				return fromStatus("Watch", err)
			}
		}
		t := time.NewTimer(retry.Backoff(retryBaseDelay, retryMaxDelay, try))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return context.Cause(ctx)
		}
	}
}
