package governor_test

import (
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor"
)

// The causes of refusals from a real governord reach the caller as
// governord named them, and each error still matches its sentinel.
func TestCauseFromGovernord(t *testing.T) {
	c := dialReal(t)
	ctx, task := newTask(t, t.Context(), c, governor.Spec{Quotas: map[string]int64{"tokens": 1}})
	if _, err := c.Raw().SetCaps(ctx, &governorpb.SetCapsRequest{NodeId: task.ID(), Rates: map[string]*governorpb.Rate{
		"calls": {Units: 1, Per: durationpb.New(3600e9)}}}); err != nil {
		t.Fatal(err)
	}
	if err := task.Consume(ctx, "calls", 1); err != nil {
		t.Fatal(err)
	}
	quota := task.Consume(ctx, "tokens", 2)
	rate := task.Consume(ctx, "calls", 1)
	invalid := task.Consume(ctx, "tokens", -1)
	task.Close()
	ended := task.Consume(ctx, "tokens", 1)
	for _, tt := range []struct {
		name     string
		err      error
		cause    governor.Cause
		sentinel error
	}{
		{"quota", quota, governor.CauseQuota, governor.ErrQuotaExhausted},
		{"rate", rate, governor.CauseRate, governor.ErrRateLimited},
		{"ended", ended, governor.CauseTaskEnded, governor.ErrTaskEnded},
		{"invalid", invalid, governor.CauseNone, governor.ErrInvalidArgument},
	} {
		if got := governor.CauseOf(tt.err); got != tt.cause {
			t.Errorf("%s: CauseOf(%v) = %v, want %v", tt.name, tt.err, got, tt.cause)
		}
		if !errors.Is(tt.err, tt.sentinel) {
			t.Errorf("%s: %v is not %v", tt.name, tt.err, tt.sentinel)
		}
		var se *governor.StatusError
		if errors.As(tt.err, &se) && se.Cause() != tt.cause {
			t.Errorf("%s: StatusError.Cause() = %v", tt.name, se.Cause())
		}
	}
	if got := governor.CauseQuota.String(); got != "quota" {
		t.Errorf("CauseQuota reads %q", got)
	}
}

// refusalWith is a status as governord sends it, through RawError.
func refusalWith(t *testing.T, code codes.Code, details ...protoadapt.MessageV1) error {
	t.Helper()
	st := status.New(code, "refused")
	for _, d := range details {
		var err error
		if st, err = st.WithDetails(d); err != nil {
			t.Fatal(err)
		}
	}
	return governor.RawError("Consume", st.Err())
}

// Every cause with a sentinel is matched by an error whose detail says
// the cause: the sentinels come from the causes (a detail of a kind the
// SDK makes a typed error of matches that error's sentinel, which is the
// same). A bound reads as a spent quota, as it did before causes.
func TestSentinelsComeFromTheCause(t *testing.T) {
	for _, tt := range []struct {
		detail   protoadapt.MessageV1
		code     codes.Code
		cause    governor.Cause
		sentinel error
	}{
		{&governorpb.BoundReached{Cause: governorpb.Cause_CAUSE_BOUND, Bound: "max_nodes"}, codes.ResourceExhausted, governor.CauseBound, governor.ErrQuotaExhausted},
		{&governorpb.RateLimited{Cause: governorpb.Cause_CAUSE_RATE}, codes.ResourceExhausted, governor.CauseRate, governor.ErrRateLimited},
		{&governorpb.Denial{Cause: governorpb.Cause_CAUSE_QUOTA}, codes.ResourceExhausted, governor.CauseQuota, governor.ErrQuotaExhausted},
		{&governorpb.NodeEnded{Cause: governorpb.Cause_CAUSE_TASK_ENDED}, codes.FailedPrecondition, governor.CauseTaskEnded, governor.ErrTaskEnded},
		{&governorpb.TenantRefusal{Cause: governorpb.Cause_CAUSE_SUSPENDED, State: "suspended"}, codes.FailedPrecondition, governor.CauseSuspended, governor.ErrTenantState},
		{&governorpb.TenantRefusal{Cause: governorpb.Cause_CAUSE_READ_ONLY, State: "read_only"}, codes.FailedPrecondition, governor.CauseReadOnly, governor.ErrTenantState},
		{&governorpb.TenantRefusal{Cause: governorpb.Cause_CAUSE_TASK_ENDED, State: "closing"}, codes.FailedPrecondition, governor.CauseTaskEnded, governor.ErrTenantState},
	} {
		err := refusalWith(t, tt.code, tt.detail)
		if got := governor.CauseOf(err); got != tt.cause {
			t.Errorf("%v: CauseOf = %v, want %v", tt.detail, got, tt.cause)
		}
		if !errors.Is(err, tt.sentinel) {
			t.Errorf("%v: %v is not %v", tt.detail, err, tt.sentinel)
		}
	}
	for c, sentinel := range map[governor.Cause]error{governor.CauseQuota: governor.ErrQuotaExhausted, governor.CauseBound: governor.ErrQuotaExhausted,
		governor.CauseRate: governor.ErrRateLimited, governor.CauseTaskEnded: governor.ErrTaskEnded, governor.CauseSuspended: governor.ErrTenantState,
		governor.CauseReadOnly: governor.ErrTenantState, governor.CauseUnavailable: governor.ErrUnavailable, governor.CauseWaitTimeout: nil} {
		if c.Err() != sentinel {
			t.Errorf("%v.Err() = %v, want %v", c, c.Err(), sentinel)
		}
	}
	// A governord from before causes: the detail's kind is the cause, and
	// a status with no detail has none.
	old := refusalWith(t, codes.ResourceExhausted, &governorpb.Denial{Resource: "tokens", Limit: 1})
	var d *governor.Denial
	if governor.CauseOf(old) != governor.CauseQuota || !errors.As(old, &d) || d.Resource != "tokens" {
		t.Errorf("a Denial with no cause: %v (%v)", old, governor.CauseOf(old))
	}
	if old := refusalWith(t, codes.FailedPrecondition, &governorpb.TenantRefusal{State: "read_only"}); governor.CauseOf(old) != governor.CauseReadOnly {
		t.Errorf("a TenantRefusal with no cause: %v", governor.CauseOf(old))
	}
	if bare := refusalWith(t, codes.ResourceExhausted); governor.CauseOf(bare) != governor.CauseNone ||
		!errors.Is(bare, governor.ErrQuotaExhausted) {
		t.Errorf("RESOURCE_EXHAUSTED with no detail: %v (%v)", bare, governor.CauseOf(bare))
	}
	if got := governor.Cause(999).String(); got != "cause(999)" {
		t.Errorf("an unknown cause reads %q", got)
	}
}
