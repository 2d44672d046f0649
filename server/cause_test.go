package server

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor/engine"
)

// engineKinds is every sentinel error of the engine, by its name in
// governor/engine/errors.go, with the cause governord names it by: a
// refusal's cause, or UNSPECIFIED for an error that refuses no work.
var engineKinds = map[string]struct {
	err   error
	cause governorpb.Cause
}{
	"ErrInvalid":         {engine.ErrInvalid, governorpb.Cause_CAUSE_UNSPECIFIED},
	"ErrNotFound":        {engine.ErrNotFound, governorpb.Cause_CAUSE_UNSPECIFIED},
	"ErrPermission":      {engine.ErrPermission, governorpb.Cause_CAUSE_UNSPECIFIED},
	"ErrUnauthenticated": {engine.ErrUnauthenticated, governorpb.Cause_CAUSE_UNSPECIFIED},
	"ErrSessionExpired":  {engine.ErrSessionExpired, governorpb.Cause_CAUSE_UNSPECIFIED},
	"ErrTaskEnded":       {&engine.EndedError{Node: 7, Name: "job", Kind: engine.KindTask, State: engine.Closed}, governorpb.Cause_CAUSE_TASK_ENDED},
	"ErrQuotaExhausted":  {&engine.Denial{Resource: "tokens", Node: 3, NodeName: "payments", Used: 9, Limit: 10, Amount: 2}, governorpb.Cause_CAUSE_QUOTA},
	"ErrLeaseExpired":    {&engine.LeaseEndedError{Lease: 4, Reason: engine.EndExpired}, governorpb.Cause_CAUSE_UNSPECIFIED},
	"ErrLeaseRevoked":    {&engine.LeaseEndedError{Lease: 4, Reason: engine.EndRevoked}, governorpb.Cause_CAUSE_UNSPECIFIED},
	"ErrLeaseReleased":   {&engine.LeaseEndedError{Lease: 4, Reason: engine.EndReleased}, governorpb.Cause_CAUSE_UNSPECIFIED},
	"ErrRequestIDReused": {engine.ErrRequestIDReused, governorpb.Cause_CAUSE_UNSPECIFIED},
	"ErrExists":          {engine.ErrExists, governorpb.Cause_CAUSE_UNSPECIFIED},
	"ErrRecalling":       {engine.ErrRecalling, governorpb.Cause_CAUSE_UNSPECIFIED},
	"ErrCorrupt":         {engine.ErrCorrupt, governorpb.Cause_CAUSE_UNSPECIFIED},
	"ErrBound":           {&engine.BoundError{Tenant: "payments", Bound: engine.BoundNodes, Limit: 100}, governorpb.Cause_CAUSE_BOUND},
	"ErrTenantState":     {&engine.TenantStateError{Tenant: "payments", State: engine.Suspended, What: "new work"}, governorpb.Cause_CAUSE_SUSPENDED},
	"ErrRateLimited":     {&engine.RateError{Resource: "calls", Node: 3, NodeName: "payments", Amount: 1}, governorpb.Cause_CAUSE_RATE},
}

// engineSentinels reads the names of the engine's sentinel errors from
// its source, so that a kind added there and not here fails this test.
func engineSentinels(t *testing.T) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "../governor/engine/errors.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.VAR {
			continue
		}
		for _, spec := range g.Specs {
			for _, n := range spec.(*ast.ValueSpec).Names {
				if strings.HasPrefix(n.Name, "Err") {
					names = append(names, n.Name)
				}
			}
		}
	}
	if len(names) < 10 {
		t.Fatalf("found only %v in the engine's errors.go", names)
	}
	return names
}

// causes are the causes the details of a status carry, in order: those
// of the details that have a cause field.
func causes(st *status.Status) []governorpb.Cause {
	var out []governorpb.Cause
	for _, d := range st.Details() {
		if c, ok := d.(interface{ GetCause() governorpb.Cause }); ok {
			out = append(out, c.GetCause())
		}
	}
	return out
}

// Every kind of engine error maps to one cause, and the status governord
// answers a refusal with says it in its detail.
func TestEveryEngineKindHasACause(t *testing.T) {
	for _, name := range engineSentinels(t) {
		k, ok := engineKinds[name]
		if !ok {
			t.Errorf("engine.%s has no row in engineKinds: say which cause it is (UNSPECIFIED if it refuses no work)", name)
			continue
		}
		wrapped := fmt.Errorf("call: %w", k.err)
		if got := causeOf(wrapped); got != k.cause {
			t.Errorf("causeOf(%s) = %v, want %v", name, got, k.cause)
		}
		st := status.Convert(toStatus(wrapped))
		got := causes(st)
		switch {
		case k.cause == governorpb.Cause_CAUSE_UNSPECIFIED:
			for _, c := range got {
				if c != governorpb.Cause_CAUSE_UNSPECIFIED {
					t.Errorf("%s: status %v says cause %v", name, st.Code(), c)
				}
			}
		case len(got) != 1 || got[0] != k.cause:
			t.Errorf("%s: status %v details %v: causes %v, want one %v", name, st.Code(), st.Details(), got, k.cause)
		}
	}
	for name := range engineKinds {
		if !strings.HasPrefix(name, "Err") {
			t.Errorf("row %q names no sentinel", name)
		}
	}
}

// The causes that depend on more than the sentinel: the tenant's state,
// and a caller that gave up.
func TestCauseOfTenantStatesAndWaits(t *testing.T) {
	for _, c := range []struct {
		err  error
		want governorpb.Cause
	}{
		{&engine.TenantStateError{State: engine.Suspended}, governorpb.Cause_CAUSE_SUSPENDED},
		{&engine.TenantStateError{State: engine.ReadOnly}, governorpb.Cause_CAUSE_READ_ONLY},
		{&engine.TenantStateError{State: engine.Closing}, governorpb.Cause_CAUSE_TASK_ENDED},
		{context.Canceled, governorpb.Cause_CAUSE_WAIT_ABANDONED},
		{context.DeadlineExceeded, governorpb.Cause_CAUSE_WAIT_ABANDONED},
		{nil, governorpb.Cause_CAUSE_UNSPECIFIED},
		{errors.New("disk full"), governorpb.Cause_CAUSE_UNSPECIFIED},
	} {
		if got := causeOf(c.err); got != c.want {
			t.Errorf("causeOf(%v) = %v, want %v", c.err, got, c.want)
		}
	}
	// A caller that gave up gets its own status, with no Denial.
	if ds := status.Convert(toStatus(context.Canceled)).Details(); len(ds) != 0 {
		t.Errorf("a cancelled wait carries %v", ds)
	}
}

// The details a client from before causes reads are those it read: the
// detail of the kind first (RateLimited before RetryInfo), and no Denial
// but for a spent quota; a bound has a BoundReached naming it.
func TestCauseKeepsTheDetails(t *testing.T) {
	st := status.Convert(toStatus(&engine.RateError{Resource: "calls", Amount: 1}))
	ds := st.Details()
	if len(ds) != 2 || st.Code() != codes.ResourceExhausted {
		t.Fatalf("rate: %v %v", st.Code(), ds)
	}
	if rl, ok := ds[0].(*governorpb.RateLimited); !ok || rl.GetResource() != "calls" {
		t.Errorf("rate: first detail %v", ds[0])
	}
	st = status.Convert(toStatus(&engine.BoundError{Tenant: "payments", Bound: engine.BoundResources, Limit: 100, Name: "gpu"}))
	b, _ := st.Details()[0].(*governorpb.BoundReached)
	if st.Code() != codes.ResourceExhausted || len(st.Details()) != 1 || b.GetBound() != engine.BoundResources ||
		b.GetTenant() != "payments" || b.GetLimit() != 100 || b.GetName() != "gpu" {
		t.Errorf("bound: %v %v", st.Code(), st.Details())
	}
	denial := &engine.Denial{Resource: "tokens", Limit: 10}
	st = status.Convert(toStatus(denial))
	if ds := st.Details(); len(ds) != 1 || ds[0].(*governorpb.Denial).GetResource() != "tokens" || st.Message() != denial.Error() {
		t.Errorf("quota: %q %v", st.Message(), ds)
	}
	// A status that is one already passes as it is.
	already := status.Error(codes.ResourceExhausted, "throttled")
	if got := toStatus(already); got != already {
		t.Errorf("a status became %v", got)
	}
}
