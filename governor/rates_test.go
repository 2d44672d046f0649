package governor_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor"
)

// A refusal for rate reaches the SDK as ErrRateLimited carrying the wait,
// and Retry waits that long rather than spending its budget on attempts
// the bucket cannot hold (a real governord).
func TestRateLimitedCarriesTheWaitAndRetryHonoursIt(t *testing.T) {
	c := dialReal(t)
	ctx, task := newTask(t, t.Context(), c, governor.Spec{Quotas: map[string]int64{"retry": 3}})
	// One call per 300ms, one at a time.
	if _, err := c.Raw().SetCaps(ctx, &governorpb.SetCapsRequest{NodeId: task.ID(), Rates: map[string]*governorpb.Rate{
		"calls": {Units: 1, Per: durationpb.New(300 * time.Millisecond)}}}); err != nil {
		t.Fatal(err)
	}
	if err := task.Consume(ctx, "calls", 1); err != nil {
		t.Fatal(err)
	}
	err := task.Consume(ctx, "calls", 1)
	var rl *governor.RateLimitedError
	if !errors.Is(err, governor.ErrRateLimited) || errors.Is(err, governor.ErrQuotaExhausted) || !errors.As(err, &rl) {
		t.Fatalf("a second call within the period: %v; want ErrRateLimited only", err)
	}
	if rl.NodeID != task.ID() || rl.Resource != "calls" || rl.Units != 1 || rl.Per != 300*time.Millisecond ||
		rl.RetryAfter <= 0 || rl.RetryAfter > 300*time.Millisecond || governor.RetryAfter(err) != rl.RetryAfter {
		t.Fatalf("the refusal: %+v", rl)
	}

	// Retry's own backoff (1ms) would spend the three retries before the
	// bucket refills; honouring the wait, the second attempt fits.
	attempts := 0
	start := time.Now()
	err = governor.Retry(ctx, func(ctx context.Context) error {
		attempts++
		return task.Consume(ctx, "calls", 1)
	}, governor.WithBackoff(time.Millisecond, time.Millisecond))
	if err != nil || attempts != 2 {
		t.Fatalf("Retry = %v after %d attempts; want success on the second", err, attempts)
	}
	if waited := time.Since(start); waited < 100*time.Millisecond {
		t.Fatalf("Retry waited %v; the bucket needed most of 300ms", waited)
	}
}

// What the SDK's errors say of a refusal, said once: a refusal for rate
// reads as its detail (with the burst), and an invalid charge names
// "invalid argument" once, not once from the SDK and again from governord.
func TestRefusalsSayTheirWordsOnce(t *testing.T) {
	c := dialReal(t)
	ctx, task := newTask(t, t.Context(), c, governor.Spec{})
	if _, err := c.Raw().SetCaps(ctx, &governorpb.SetCapsRequest{NodeId: task.ID(), Rates: map[string]*governorpb.Rate{
		"calls": {Units: 2, Per: durationpb.New(time.Hour), Burst: 3}}}); err != nil {
		t.Fatal(err)
	}
	if err := task.Consume(ctx, "calls", 3); err != nil {
		t.Fatal(err)
	}
	rate := task.Consume(ctx, "calls", 1).Error()
	if strings.Count(rate, "rate limited") != 1 || !strings.Contains(rate, "is 2 per 1h0m0s, burst 3: 0 left, asked 1") {
		t.Errorf("a refusal for rate reads %q", rate)
	}
	invalid := task.Consume(ctx, "calls", 4).Error()
	if strings.Count(invalid, "invalid argument") != 1 || !strings.Contains(invalid, "can never fit the rate") {
		t.Errorf("a charge larger than the burst reads %q", invalid)
	}
}

// TestAReservationCannotPassARate: whatever the sidecars do, they may never
// take more than rate × window + burst in any window. Units reserved are
// taken from the buckets when reserved but spent whenever their holder
// likes: under 20 calls per 200ms (burst 20), 20 reserved at t=0 and spent
// once the bucket is full again, while another charge takes those 20, make
// 40 in an instant. So governord reserves units of a rated resource only
// with a slice of the rate (Rated, Slice): the holder spends them no
// faster than its slice's bucket allows, at most its burst at once, and
// that burst and the slice's refill are carved out of the shared bucket
// while it lives, so at once the holder's burst and what the shared
// bucket gives stay within the rate's (a real governord).
func TestAReservationCannotPassARate(t *testing.T) {
	c := dialReal(t)
	ctx, task := newTask(t, t.Context(), c, governor.Spec{})
	if _, err := c.Raw().SetCaps(ctx, &governorpb.SetCapsRequest{NodeId: task.ID(), Rates: map[string]*governorpb.Rate{
		"calls": {Units: 20, Per: durationpb.New(200 * time.Millisecond)}}}); err != nil {
		t.Fatal(err)
	}
	res, err := task.Reserve(ctx, "calls", 0, 0, 20)
	if err != nil {
		t.Fatal(err)
	}
	// What the holder may spend at once: its slice's burst, no more than
	// it holds; without a slice, nothing.
	atOnce := int64(0)
	if res.Slice != nil {
		atOnce = min(res.Granted, res.Slice.Burst)
	} else if res.Granted > 0 {
		t.Fatalf("%d units of a rated resource reserved without a slice", res.Granted)
	}
	// The bucket's period passes: it is full again (governord's own clock).
	time.Sleep(250 * time.Millisecond)
	taken := int64(0)
	for range 20 {
		if task.Consume(ctx, "calls", 1) == nil {
			taken++
		}
	}
	if atOnce+taken > 20 {
		t.Fatalf("%d units spendable at once from a slice and %d charged after a refill: %d at once, past the burst of 20",
			atOnce, taken, atOnce+taken)
	}
	if res.Slice == nil {
		t.Errorf("a quiet rate gave no slice: %+v", res)
	}
	if !res.Rated {
		t.Errorf("the reservation of a rated resource: %+v; want Rated", res)
	}
}

// TestSliceOfARate: a top-up of a quiet rated resource carries a slice of
// the rate (20 per 200ms: 5 per 200ms, burst 5, for 4s); the same top-up
// while it lives renews it (the same id); given back with end_slice it is
// gone, and the next top-up gets a new one. end_slice with want, or with
// hostile amounts, is refused naming what is wrong (a real governord).
func TestSliceOfARate(t *testing.T) {
	c := dialReal(t)
	ctx, task := newTask(t, t.Context(), c, governor.Spec{})
	if _, err := c.Raw().SetCaps(ctx, &governorpb.SetCapsRequest{NodeId: task.ID(), Rates: map[string]*governorpb.Rate{
		"calls": {Units: 20, Per: durationpb.New(200 * time.Millisecond)}}}); err != nil {
		t.Fatal(err)
	}
	res, err := task.Reserve(ctx, "calls", 0, 0, 2)
	if err != nil {
		t.Fatal(err)
	}
	if res.Slice == nil {
		t.Fatalf("top-up of a quiet rate: %+v; want a slice", res)
	}
	want := governor.RateSlice{ID: res.Slice.ID, Units: 5, Per: 200 * time.Millisecond, Burst: 5, Term: 4 * time.Second}
	if !res.Rated || res.Granted != 2 || *res.Slice != want {
		t.Fatalf("top-up of a quiet rate: %+v slice %+v; want 2 granted with a slice %+v", res, res.Slice, want)
	}
	again, err := task.Reserve(ctx, "calls", 0, 0, 1)
	if err != nil || again.Slice == nil || again.Slice.ID != want.ID || again.Slice.Term != 4*time.Second {
		t.Fatalf("renewal: %+v %v; want the same slice for 4s more", again, err)
	}
	gone, err := task.EndSlice(ctx, "calls", 0, 3)
	if err != nil || gone.Slice != nil || gone.Reserved != 0 {
		t.Fatalf("give back: %+v %v; want no slice, nothing reserved", gone, err)
	}
	fresh, err := task.Reserve(ctx, "calls", 0, 0, 1)
	if err != nil || fresh.Slice == nil || fresh.Slice.ID == want.ID {
		t.Fatalf("after the give-back: %+v %v; want a new slice", fresh, err)
	}
	for _, req := range []*governorpb.ReserveRequest{
		{NodeId: task.ID(), Resource: "calls", Want: 5, EndSlice: true},
		{NodeId: task.ID(), Resource: "calls", Want: 1 << 31, EndSlice: true},
		{NodeId: task.ID(), Resource: "calls", Spent: -1, EndSlice: true},
		{NodeId: task.ID(), Resource: "calls", Return: 1 << 53, EndSlice: true},
		{NodeId: task.ID(), Resource: "calls", Return: math.MaxInt64, EndSlice: true},
		{NodeId: task.ID(), Resource: "calls", Want: 1, Exact: true, EndSlice: true},
	} {
		_, err := c.Raw().Reserve(ctx, req)
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("Reserve %+v: %v; want INVALID_ARGUMENT", req, err)
		}
	}
}

// WaitForRate: a charge a rate refuses waits for it at governord, and is
// granted when its token is there; without it the same charge is a
// *RateLimitedError at once; a wait that ctx's deadline cuts short fails
// with ctx's error and charges nothing.
func TestChargeWaitForRate(t *testing.T) {
	c := dialReal(t)
	ctx, task := newTask(t, t.Context(), c, governor.Spec{})
	if _, err := c.Raw().SetCaps(ctx, &governorpb.SetCapsRequest{NodeId: task.ID(), Rates: map[string]*governorpb.Rate{
		"calls": {Units: 1, Per: durationpb.New(200 * time.Millisecond)}}}); err != nil {
		t.Fatal(err)
	}
	one := map[string]int64{"calls": 1}
	if _, err := task.ChargeAndAcquire(ctx, "", one); err != nil {
		t.Fatal(err)
	}
	if _, err := task.ChargeAndAcquire(ctx, "", one); !errors.Is(err, governor.ErrRateLimited) {
		t.Fatalf("a charge over the rate without WaitForRate: %v; want ErrRateLimited", err)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	_, err := task.ChargeAndAcquire(short, "", one, governor.WaitForRate())
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a wait cut short by its deadline: %v; want context.DeadlineExceeded", err)
	}
	start := time.Now()
	if _, err := task.ChargeAndAcquire(ctx, "", one, governor.WaitForRate()); err != nil {
		t.Fatalf("a charge waiting for the rate: %v", err)
	}
	if waited := time.Since(start); waited < 100*time.Millisecond {
		t.Fatalf("granted after %v; the bucket needed most of 200ms", waited)
	}
	// The wait cut short took nothing: the next token is 200ms away, not 400ms.
	start = time.Now()
	if _, err := task.ChargeAndAcquire(ctx, "", one, governor.WaitForRate()); err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(start); waited > 350*time.Millisecond {
		t.Fatalf("the next charge waited %v; a wait cut short took a token", waited)
	}
}
