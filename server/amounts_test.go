package server

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/governor-project/governor/api/governorpb"
)

// hostile are the amounts every number crossing the API is tried at.
var hostile = []int64{0, -1, math.MinInt64, 1 << 31, 1 << 53, 1<<53 + 1, 1 << 62, math.MaxInt64 - 1, math.MaxInt64}

// Every amount a call charges, reserves, settles or returns is refused
// with INVALID_ARGUMENT when it is negative or over MaxAmount (and 0 where
// it asks for nothing), whatever else the call says; amounts in range are
// decided by the caps. No sequence of them takes a hard cap past its limit,
// on the task, the tenant or the root, and the counters stay sane.
func TestHostileAmountsAreRefusedAtTheEdge(t *testing.T) {
	srv := start(t, testConfig())
	pay := session(t, srv.Addr(), "pay-key", 10*time.Second)
	task := pay.task(t, "hostile", map[string]int64{"tokens": 500})
	// Some units reserved and spent first, so that settlements have
	// something to settle, and a hostile one something to corrupt.
	res, err := pay.Reserve(pay.ctx, &governorpb.ReserveRequest{NodeId: task.Id, Resource: "tokens", Want: 40})
	if err != nil || res.GetGranted() == 0 {
		t.Fatalf("reserve: %v %v", res, err)
	}
	if _, err := pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: task.Id, Resource: "tokens", Amount: 10}); err != nil {
		t.Fatal(err)
	}
	type attempt struct {
		what string
		call func(v int64) error
		// least is the smallest amount the call takes.
		least int64
	}
	attempts := []attempt{
		{"Consume.amount", func(v int64) error {
			_, err := pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: task.Id, Resource: "tokens", Amount: v})
			return err
		}, 1},
		{"Consume.amount (uncapped)", func(v int64) error {
			_, err := pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: task.Id, Resource: "free", Amount: v})
			return err
		}, 1},
		{"ChargeAndAcquire.charges", func(v int64) error {
			_, err := pay.ChargeAndAcquire(pay.ctx, &governorpb.ChargeAndAcquireRequest{NodeId: task.Id,
				Charges: map[string]int64{"tokens": v}})
			return err
		}, 1},
		{"ChargeAndAcquire.charges (two resources)", func(v int64) error {
			_, err := pay.ChargeAndAcquire(pay.ctx, &governorpb.ChargeAndAcquireRequest{NodeId: task.Id,
				Charges: map[string]int64{"tokens": 1, "free": v}})
			return err
		}, 1},
		{"DryRun.charges", func(v int64) error {
			_, err := pay.DryRun(pay.ctx, &governorpb.DryRunRequest{NodeId: task.Id, Charges: map[string]int64{"tokens": v}})
			return err
		}, 1},
		{"DryRun.charges (recorded)", func(v int64) error {
			_, err := pay.DryRun(pay.ctx, &governorpb.DryRunRequest{NodeId: task.Id, Charges: map[string]int64{"tokens": v}, Record: true})
			return err
		}, 1},
		{"Reserve.want", func(v int64) error {
			_, err := pay.Reserve(pay.ctx, &governorpb.ReserveRequest{NodeId: task.Id, Resource: "tokens", Want: v})
			return err
		}, 0},
		{"Reserve.want (exact)", func(v int64) error {
			_, err := pay.Reserve(pay.ctx, &governorpb.ReserveRequest{NodeId: task.Id, Resource: "tokens", Want: v, Exact: true})
			return err
		}, 0},
		{"Reserve.spent", func(v int64) error {
			_, err := pay.Reserve(pay.ctx, &governorpb.ReserveRequest{NodeId: task.Id, Resource: "tokens", Spent: v})
			return err
		}, 0},
		{"Reserve.return", func(v int64) error {
			_, err := pay.Reserve(pay.ctx, &governorpb.ReserveRequest{NodeId: task.Id, Resource: "tokens", Return: v})
			return err
		}, 0},
		{"Reserve.spent and want", func(v int64) error {
			_, err := pay.Reserve(pay.ctx, &governorpb.ReserveRequest{NodeId: task.Id, Resource: "tokens", Spent: 1, Want: v})
			return err
		}, 0},
		{"ResizeBlock.want", func(v int64) error {
			_, err := pay.ResizeBlock(pay.ctx, &governorpb.ResizeBlockRequest{NodeId: task.Id, Class: "db", Want: v})
			return err
		}, 0},
		{"ResizeBlock.return", func(v int64) error {
			_, err := pay.ResizeBlock(pay.ctx, &governorpb.ResizeBlockRequest{NodeId: task.Id, Class: "db", Return: v})
			return err
		}, 0},
	}
	for _, a := range attempts {
		for _, v := range hostile {
			err := a.call(v)
			code := status.Code(err)
			outside := v < a.least || v > governorpb.MaxAmount
			switch {
			case outside && code != codes.InvalidArgument:
				t.Errorf("%s = %d: %v, want INVALID_ARGUMENT", a.what, v, err)
			case !outside && code != codes.OK && code != codes.ResourceExhausted && code != codes.InvalidArgument:
				t.Errorf("%s = %d: %v", a.what, v, err)
			}
			if msg := status.Convert(err).Message(); outside && !strings.Contains(msg, fmt.Sprint(v)) {
				t.Errorf("%s = %d: %q does not say what was sent", a.what, v, msg)
			}
		}
	}
	// The caps held at every level, counting what is reserved.
	adm := session(t, srv.Addr(), "admin-key", 10*time.Second)
	for _, id := range []int64{task.Id, pay.scope, 1} {
		n := adm.node(t, id)
		for res, limit := range n.GetQuotas() {
			used, reserved := n.GetUsed()[res], n.GetReserved()[res]
			if used < 0 || reserved < 0 || used+reserved > limit {
				t.Errorf("node %d (%s): %s used %d + reserved %d, cap %d", id, n.GetName(), res, used, reserved, limit)
			}
		}
		for res, used := range n.GetUsed() {
			if used < 0 || used > governorpb.MaxAmount*int64(len(attempts)*len(hostile)) {
				t.Errorf("node %d (%s): %s used is %d", id, n.GetName(), res, used)
			}
		}
	}
}

// One tenant that charges all an int64 can hold of something nobody caps
// refuses nothing of another tenant's: the root, which both count on,
// saturates instead of refusing the other tenant's units as an overflow.
// At most MaxAmount crosses the API per call, so it takes the hostile
// tenant 1,024 calls.
func TestATenantCannotOverflowTheRootForAnother(t *testing.T) {
	srv := start(t, testConfig())
	pay := session(t, srv.Addr(), "pay-key", 10*time.Second)
	recon := session(t, srv.Addr(), "recon-key", 10*time.Second)
	for left := int64(math.MaxInt64); left > 0; left -= min(left, governorpb.MaxAmount) {
		if _, err := pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: pay.scope, Resource: "free",
			Amount: min(left, governorpb.MaxAmount)}); err != nil {
			t.Fatalf("payments' consume with %d left: %v", left, err)
		}
	}
	_, err := pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: pay.scope, Resource: "free", Amount: 1})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("payments' own next unit: %v, want INVALID_ARGUMENT (its own counter is full)", err)
	}
	if _, err := recon.Consume(recon.ctx, &governorpb.ConsumeRequest{NodeId: recon.scope, Resource: "free", Amount: 3}); err != nil {
		t.Errorf("reconciliation's consume after payments filled the root: %v", err)
	}
	adm := session(t, srv.Addr(), "admin-key", 10*time.Second)
	if got := adm.node(t, 1).GetUsed()["free"]; got != math.MaxInt64 {
		t.Errorf("the root counts %d free units, want MaxInt64 (saturated)", got)
	}
	if got := adm.node(t, recon.scope).GetUsed()["free"]; got != 3 {
		t.Errorf("reconciliation counts %d free units, want 3", got)
	}
}
