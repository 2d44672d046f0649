package admission

import (
	"context"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor"
)

// The sidecar's causes are governor.proto's: every cause there has a row
// in the table or is marked as governord's alone, and converts to the
// sidecar's cause of the same name, or to none.
func TestCausesAreTheProtosCauses(t *testing.T) {
	for _, c := range governor.Causes() {
		sc, ok := causeFrom(c)
		switch {
		case governordOnly[Cause(c)] && (ok || sc.hasRow()):
			t.Errorf("%v is marked governord's alone but has a row", c)
		case !governordOnly[Cause(c)] && !ok:
			t.Errorf("%v has no row in the table of causes and is not marked governord's alone", c)
		case ok && sc.String() != c.String():
			t.Errorf("%v converts to %v", c, sc)
		}
	}
	for sc := range governordOnly {
		if !slices.Contains(governor.Causes(), governor.Cause(sc)) {
			t.Errorf("%v is marked governord's alone but governor.proto has no such cause", sc)
		}
	}
	for _, c := range []governor.Cause{governor.CauseNone, -1, 1 << 20} {
		if sc, ok := causeFrom(c); ok {
			t.Errorf("%d converts to %v", c, sc)
		}
		if w := Cause(c).Wire(); w.Status != 400 || w.Header != "" {
			t.Errorf("%d renders as %+v", c, w)
		}
	}
}

// Deny answers with the cause governord named: the same cause for one the
// sidecar answers with, with the detail that names it, and unavailable
// (governord refused the sidecar's call) for one that is governord's alone.
func TestDenyTakesGovernordsCause(t *testing.T) {
	refused := func(code codes.Code, detail protoadapt.MessageV1) error {
		st, err := status.New(code, "refused").WithDetails(detail)
		if err != nil {
			t.Fatal(err)
		}
		return governor.RawError("Acquire", st.Err())
	}
	ctx := context.Background()
	for _, c := range []struct {
		err    error
		want   Cause
		detail func(*Denial) bool
	}{
		{refused(codes.ResourceExhausted, &governorpb.RateLimited{Resource: "calls", Cause: governorpb.Cause_CAUSE_RATE}), CauseRate,
			func(d *Denial) bool { return d.Rate != nil && d.Rate.Resource == "calls" }},
		{refused(codes.ResourceExhausted, &governorpb.Denial{Resource: "tokens", Cause: governorpb.Cause_CAUSE_QUOTA}), CauseQuota,
			func(d *Denial) bool { return d.Quota != nil && d.Quota.Resource == "tokens" }},
		{refused(codes.FailedPrecondition, &governorpb.TenantRefusal{State: "closing", Cause: governorpb.Cause_CAUSE_TASK_ENDED}), CauseTaskEnded,
			func(d *Denial) bool { return d.Tenant != nil && d.Tenant.State == "closing" }},
		{refused(codes.FailedPrecondition, &governorpb.TenantRefusal{State: "read_only", Cause: governorpb.Cause_CAUSE_READ_ONLY}), CauseReadOnly,
			func(d *Denial) bool { return d.Tenant != nil }},
		{refused(codes.ResourceExhausted, &governorpb.BoundReached{Bound: "max_waiters", Cause: governorpb.Cause_CAUSE_BOUND}), CauseUnavailable,
			func(d *Denial) bool { return d.Quota == nil && d.Rate == nil }},
		{refused(codes.ResourceExhausted, &governorpb.BoundReached{Bound: "max_waiters", Cause: 1 << 20}), CauseUnavailable,
			func(d *Denial) bool { return true }},
	} {
		d := Deny(ctx, c.err, "db", time.Second)
		if d.Cause != c.want || !c.detail(d) {
			t.Errorf("%v: %v %+v, want %v", c.err, d.Cause, d, c.want)
		}
	}
}
