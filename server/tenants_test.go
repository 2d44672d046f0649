package server

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor/engine"
)

// denialOf returns err's Denial detail, failing unless err is a
// RESOURCE_EXHAUSTED that carries one.
func denialOf(t *testing.T, what string, err error) (*status.Status, *governorpb.Denial) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted {
		t.Fatalf("%s: %v, want RESOURCE_EXHAUSTED", what, err)
	}
	for _, d := range st.Details() {
		if d, ok := d.(*governorpb.Denial); ok {
			return st, d
		}
	}
	t.Fatalf("%s: %v carries no Denial detail", what, err)
	return nil, nil
}

// A denial on the root, which every tenant shares, tells a tenant the
// shared cap's used and limit but not which other tenant spent it, nor how
// much; the tenant that spent it and the operator see who it was.
func TestDenialOnTheRootNamesNoOtherTenant(t *testing.T) {
	cfg := testConfig()
	cfg.Root.Quotas = map[string]int64{"tokens": 10}
	srv := start(t, cfg)
	pay := session(t, srv.Addr(), "pay-key", 0)
	recon := session(t, srv.Addr(), "recon-key", 0)
	admin := session(t, srv.Addr(), "admin-key", 0)
	secret := recon.task(t, "recon-secret-batch", nil)
	if _, err := recon.Consume(recon.ctx, &governorpb.ConsumeRequest{NodeId: secret.Id, Resource: "tokens", Amount: 7}); err != nil {
		t.Fatal(err)
	}
	mine := pay.task(t, "pay-job", nil)
	if _, err := pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: mine.Id, Resource: "tokens", Amount: 2}); err != nil {
		t.Fatal(err)
	}

	// payments: the root's 9 of 10, and "another tenant".
	_, err := pay.Consume(pay.ctx, &governorpb.ConsumeRequest{NodeId: mine.Id, Resource: "tokens", Amount: 2})
	st, d := denialOf(t, "payments on the root", err)
	if d.NodeId != int64(engine.RootID) || d.Used != 9 || d.Limit != 10 || d.Amount != 2 ||
		d.LargestConsumerId != 0 || d.LargestConsumerName != engine.OtherTenant || d.LargestConsumerUsed != 0 {
		t.Errorf("payments' denial: %+v; want the root's 9 of 10 and %q with no id or usage", d, engine.OtherTenant)
	}
	for _, leak := range []string{"reconciliation", "recon-secret-batch", "used 7", fmt.Sprintf("node %d", recon.scope),
		fmt.Sprintf("node %d", secret.Id)} {
		if strings.Contains(st.Message(), leak) {
			t.Errorf("payments' denial %q names %q", st.Message(), leak)
		}
	}
	if !strings.Contains(st.Message(), "another tenant") {
		t.Errorf("payments' denial %q does not say the root was spent by another tenant", st.Message())
	}
	// The same through a charge that comes with a lease.
	_, err = pay.ChargeAndAcquire(pay.ctx, &governorpb.ChargeAndAcquireRequest{NodeId: mine.Id, Class: "db",
		Charges: map[string]int64{"tokens": 2}})
	if _, d := denialOf(t, "payments' charge on the root", err); d.LargestConsumerId != 0 || d.LargestConsumerName != engine.OtherTenant || d.LargestConsumerUsed != 0 {
		t.Errorf("payments' charge denial: %+v", d)
	}

	// reconciliation: its own tenant, with its usage.
	_, err = recon.Consume(recon.ctx, &governorpb.ConsumeRequest{NodeId: secret.Id, Resource: "tokens", Amount: 2})
	if _, d := denialOf(t, "reconciliation on the root", err); d.LargestConsumerId != recon.scope ||
		d.LargestConsumerName != "reconciliation" || d.LargestConsumerUsed != 7 {
		t.Errorf("reconciliation's denial: %+v; want its own tenant (node %d) with 7", d, recon.scope)
	}
	// The operator sees everything, whoever's node it charges.
	_, err = admin.Consume(admin.ctx, &governorpb.ConsumeRequest{NodeId: mine.Id, Resource: "tokens", Amount: 2})
	if _, d := denialOf(t, "the operator on the root", err); d.LargestConsumerId != recon.scope ||
		d.LargestConsumerName != "reconciliation" || d.LargestConsumerUsed != 7 {
		t.Errorf("the operator's denial: %+v; want reconciliation (node %d) with 7", d, recon.scope)
	}

}

// idNumber is a node or lease id in an error message.
var idNumber = regexp.MustCompile(`\b(node|lease) \d+`)

// answer is what a tenant can learn from a refusal: its code, its message
// with the id taken out, and its details.
func answerOf(err error) string {
	st := status.Convert(err)
	return fmt.Sprintf("%s | %s | %v", st.Code(), idNumber.ReplaceAllString(st.Message(), "$1 <id>"), st.Details())
}

// Every call that takes a node or lease id answers a tenant the same for
// another tenant's id as for an id that never existed: NOT_FOUND, in the
// same words, so ids cannot be probed across tenants.
func TestAnotherTenantsIdsReadAsNoSuchIds(t *testing.T) {
	srv := start(t, testConfig())
	pay := session(t, srv.Addr(), "pay-key", 0)
	recon := session(t, srv.Addr(), "recon-key", 0)
	theirs := recon.task(t, "theirs", nil)
	sub, err := recon.CreateNode(recon.ctx, &governorpb.CreateNodeRequest{ParentId: theirs.Id, Spec: &governorpb.NodeSpec{Name: "sub"}})
	if err != nil {
		t.Fatal(err)
	}
	live, err := recon.Acquire(recon.ctx, &governorpb.AcquireRequest{NodeId: theirs.Id, Class: "db"})
	if err != nil {
		t.Fatal(err)
	}
	ended, err := recon.Acquire(recon.ctx, &governorpb.AcquireRequest{NodeId: theirs.Id, Class: "db"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := recon.Release(recon.ctx, &governorpb.ReleaseRequest{LeaseId: ended.Id}); err != nil {
		t.Fatal(err) // its tombstone is remembered for a minute
	}
	// reconciliation remembers this request id; payments must not meet it.
	if _, err := recon.Consume(recon.ctx, &governorpb.ConsumeRequest{RequestId: "shared", NodeId: theirs.Id, Resource: "r", Amount: 1}); err != nil {
		t.Fatal(err)
	}
	const noSuch = 987654321
	ctx := pay.ctx
	byNode := map[string]func(id int64) error{
		"CreateNode": func(id int64) error {
			_, err := pay.CreateNode(ctx, &governorpb.CreateNodeRequest{ParentId: id, Spec: &governorpb.NodeSpec{Name: "x"}})
			return err
		},
		"GetNode": func(id int64) error { _, err := pay.GetNode(ctx, &governorpb.GetNodeRequest{NodeId: id}); return err },
		"FindOrCreateNode": func(id int64) error {
			_, err := pay.FindOrCreateNode(ctx, &governorpb.FindOrCreateNodeRequest{ParentId: id, Spec: &governorpb.NodeSpec{Name: "sub"}})
			return err
		},
		"ListChildren": func(id int64) error {
			_, err := pay.ListChildren(ctx, &governorpb.ListChildrenRequest{NodeId: id})
			return err
		},
		"CancelNode": func(id int64) error {
			_, err := pay.CancelNode(ctx, &governorpb.CancelNodeRequest{NodeId: id, RequestId: "c"})
			return err
		},
		"CloseNode": func(id int64) error {
			_, err := pay.CloseNode(ctx, &governorpb.CloseNodeRequest{NodeId: id})
			return err
		},
		"Consume": func(id int64) error {
			_, err := pay.Consume(ctx, &governorpb.ConsumeRequest{NodeId: id, Resource: "r", Amount: 1})
			return err
		},
		"Consume with their request id": func(id int64) error {
			_, err := pay.Consume(ctx, &governorpb.ConsumeRequest{RequestId: "shared", NodeId: id, Resource: "r", Amount: 1})
			return err
		},
		"Acquire": func(id int64) error {
			_, err := pay.Acquire(ctx, &governorpb.AcquireRequest{NodeId: id, Class: "db", RequestId: "a"})
			return err
		},
		"ChargeAndAcquire": func(id int64) error {
			_, err := pay.ChargeAndAcquire(ctx, &governorpb.ChargeAndAcquireRequest{NodeId: id, Class: "db", Charges: map[string]int64{"r": 1}})
			return err
		},
		"SetCaps": func(id int64) error {
			_, err := pay.SetCaps(ctx, &governorpb.SetCapsRequest{NodeId: id, Quotas: map[string]int64{"r": 1}})
			return err
		},
		"ResizeBlock": func(id int64) error {
			_, err := pay.ResizeBlock(ctx, &governorpb.ResizeBlockRequest{NodeId: id, Class: "db", Want: 1})
			return err
		},
		"ResizeBlock return": func(id int64) error {
			_, err := pay.ResizeBlock(ctx, &governorpb.ResizeBlockRequest{NodeId: id, Class: "db", Return: 1})
			return err
		},
		"Reserve": func(id int64) error {
			_, err := pay.Reserve(ctx, &governorpb.ReserveRequest{NodeId: id, Resource: "r", Want: 1})
			return err
		},
		"Acquire abandoned": func(id int64) error {
			_, err := pay.Acquire(ctx, &governorpb.AcquireRequest{NodeId: id, Class: "db", RequestId: "shared", Abandon: true})
			return err
		},
		"Reserve abandoned": func(id int64) error {
			_, err := pay.Reserve(ctx, &governorpb.ReserveRequest{NodeId: id, Resource: "r", Want: 1, RequestId: "shared", Abandon: true})
			return err
		},
		"ResizeBlock abandoned": func(id int64) error {
			_, err := pay.ResizeBlock(ctx, &governorpb.ResizeBlockRequest{NodeId: id, Class: "db", Want: 1, RequestId: "shared", Abandon: true})
			return err
		},
	}
	nodes := map[string]int64{"their tenant": recon.scope, "their task": theirs.Id, "their subtask": sub.Id, "the root": int64(engine.RootID)}
	for call, do := range byNode {
		want := answerOf(do(noSuch))
		for what, id := range nodes {
			if got := answerOf(do(id)); got != want {
				t.Errorf("%s on %s (node %d): %s\n  on node %d, which never existed: %s", call, what, id, got, noSuch, want)
			}
		}
		if !strings.HasPrefix(want, "OK") && !strings.HasPrefix(want, codes.NotFound.String()) {
			t.Errorf("%s on a node that never existed: %s, want NOT_FOUND (or nothing to give back)", call, want)
		}
	}
	byLease := map[string]func(id int64) error{
		"Release": func(id int64) error { _, err := pay.Release(ctx, &governorpb.ReleaseRequest{LeaseId: id}); return err },
		"Release with an id": func(id int64) error {
			_, err := pay.Release(ctx, &governorpb.ReleaseRequest{LeaseId: id, RequestId: "rel"})
			return err
		},
		"Validate": func(id int64) error {
			_, err := pay.Validate(ctx, &governorpb.ValidateRequest{LeaseId: id})
			return err
		},
	}
	leases := map[string]int64{"their lease": live.Id, "their released lease": ended.Id}
	for call, do := range byLease {
		want := answerOf(do(noSuch))
		if !strings.HasPrefix(want, codes.NotFound.String()) {
			t.Errorf("%s of a lease that never existed: %s, want NOT_FOUND", call, want)
		}
		for what, id := range leases {
			if got := answerOf(do(id)); got != want {
				t.Errorf("%s of %s (lease %d): %s\n  of lease %d, which never existed: %s", call, what, id, got, noSuch, want)
			}
		}
	}

	// Nothing of theirs changed, and their request id is still theirs.
	if _, err := recon.Validate(recon.ctx, &governorpb.ValidateRequest{LeaseId: live.Id}); err != nil {
		t.Fatalf("their lease after the attempts: %v", err)
	}
	if _, err := recon.Consume(recon.ctx, &governorpb.ConsumeRequest{RequestId: "shared", NodeId: theirs.Id, Resource: "r", Amount: 2}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("their request id sent again with other arguments: %v, want INVALID_ARGUMENT", err)
	}
	// payments' own use of the same request id is its own.
	mine := pay.task(t, "mine", nil)
	if _, err := pay.Consume(ctx, &governorpb.ConsumeRequest{RequestId: "shared", NodeId: mine.Id, Resource: "r", Amount: 5}); err != nil {
		t.Fatalf("payments' own request id %q: %v", "shared", err)
	}
}

// PERMISSION_DENIED stays for what a tenant can see but may not do: edit
// its own scope node, or release a lease another of its sessions holds.
func TestPermissionDeniedInsideTheTenant(t *testing.T) {
	srv := start(t, testConfig())
	pay := session(t, srv.Addr(), "pay-key", 0)
	pay2 := session(t, srv.Addr(), "pay-key", 0)
	task := pay.task(t, "t", nil)
	lease, err := pay.Acquire(pay.ctx, &governorpb.AcquireRequest{NodeId: task.Id, Class: "db"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = pay2.Release(pay2.ctx, &governorpb.ReleaseRequest{LeaseId: lease.Id})
	wantCode(t, "release another session's lease of the tenant", err, codes.PermissionDenied)
	_, err = pay.SetCaps(pay.ctx, &governorpb.SetCapsRequest{NodeId: pay.scope, Quotas: map[string]int64{"r": 1}})
	wantCode(t, "edit the own scope node", err, codes.PermissionDenied)
	_, err = pay.CloseNode(pay.ctx, &governorpb.CloseNodeRequest{NodeId: pay.scope})
	wantCode(t, "close the own scope node", err, codes.PermissionDenied)
	if _, err := pay2.Validate(pay2.ctx, &governorpb.ValidateRequest{LeaseId: lease.Id}); err != nil {
		t.Fatalf("a session may validate a lease of its tenant: %v", err)
	}
}
