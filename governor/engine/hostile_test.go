package engine

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"
)

// Hostile amounts (I24): every operation that takes an amount or a count
// from a caller, tried at the values a broken or hostile sidecar sends,
// and at sums that overflow by one. A refused call must be ErrInvalid (or
// a quota denial where a cap refuses first) and change nothing; whatever
// is accepted leaves every counter in [0, MaxInt64].

// half is the smallest amount two of which overflow an int64 counter.
const half = math.MaxInt64/2 + 1

// hostileAmounts are the values each operation is tried at.
var hostileAmounts = []int64{0, -1, math.MinInt64, 1 << 31, 1 << 53, half - 1, half, math.MaxInt64}

// outcomes says how an operation answers each of hostileAmounts: ok for
// accepted, or the error it must match.
type outcomes map[int64]error

var ok error // accepted

// all gives every hostile amount the same answer, but for those listed.
func all(want error, but outcomes) outcomes {
	out := outcomes{}
	for _, a := range hostileAmounts {
		out[a] = want
	}
	for a, w := range but {
		out[a] = w
	}
	return out
}

// positive accepts every positive amount, and refuses the rest as invalid,
// but for those listed.
func positive(but outcomes) outcomes {
	out := outcomes{0: ErrInvalid, -1: ErrInvalid, math.MinInt64: ErrInvalid}
	for _, a := range hostileAmounts[3:] {
		out[a] = ok
	}
	for a, w := range but {
		out[a] = w
	}
	return out
}

func TestHostileAmounts(t *testing.T) {
	tokens := func(a int64) map[string]int64 { return map[string]int64{"tokens": a} }
	consume := func(f *fixture, a int64) error { return f.e.Consume(f.sA, f.job, "tokens", a, "") }
	charge := func(class string) func(*fixture, int64) error {
		return func(f *fixture, a int64) error {
			_, _, err := f.e.Acquire(f.sA, AcquireRequest{Node: f.job, Class: class, Charges: tokens(a)})
			return err
		}
	}
	reserve := func(r ReserveRequest) func(*fixture, int64) error {
		return func(f *fixture, a int64) error {
			req := r
			req.Node, req.Resource = f.job, "tokens"
			switch {
			case r.Spent < 0:
				req.Spent = a
			case r.Return < 0:
				req.Return = a
			default:
				req.Want = a
			}
			_, err := f.e.Reserve(f.sA, req)
			return err
		}
	}
	dryRun := func(shadow bool) func(*fixture, int64) error {
		return func(f *fixture, a int64) error {
			dr, err := f.e.DryRun(f.sA, AcquireRequest{Node: f.job, Charges: tokens(a)}, shadow)
			if err != nil {
				return err
			}
			return dr.Err
		}
	}
	shadow := func(f *fixture, a int64) error {
		dr, err := f.e.Shadow(f.sA, AcquireRequest{Node: f.job, Charges: tokens(a)}, "")
		if err != nil {
			return err
		}
		return dr.Err
	}
	caps := func(edit func(a int64) CapsEdit) func(*fixture, int64) error {
		return func(f *fixture, a int64) error {
			_, err := f.e.SetCaps(System, f.job, edit(a), "")
			return err
		}
	}
	spent := func(f *fixture, a int64) { f.consume(f.sA, f.job, "tokens", a) }
	capped := func(f *fixture) {
		f.setCaps(f.acme, CapsEdit{Quotas: tokens(1000)})
		spent(f, 5)
	}

	tests := []struct {
		name  string
		setup func(f *fixture)
		call  func(f *fixture, a int64) error
		want  outcomes
	}{
		{"consume", nil, consume, positive(nil)},
		{"consume after half", func(f *fixture) { spent(f, half) }, consume,
			positive(outcomes{half: ErrInvalid, math.MaxInt64: ErrInvalid})},
		{"consume on a capped chain", capped, consume,
			all(ErrQuotaExhausted, outcomes{0: ErrInvalid, -1: ErrInvalid, math.MinInt64: ErrInvalid, math.MaxInt64: ErrInvalid})},
		{"consume over an exact reservation of half", func(f *fixture) {
			f.reserve(f.sA, ReserveRequest{Node: f.step, Resource: "tokens", Want: half, Exact: true})
		}, consume, positive(outcomes{half: ErrInvalid, math.MaxInt64: ErrInvalid})},
		{"charge with a lease after half", func(f *fixture) { spent(f, half) }, charge("db"),
			positive(outcomes{half: ErrInvalid, math.MaxInt64: ErrInvalid})},
		{"charge alone after half", func(f *fixture) { spent(f, half) }, charge(""),
			positive(outcomes{half: ErrInvalid, math.MaxInt64: ErrInvalid})},
		{"charge on a capped chain", capped, charge("db"),
			all(ErrQuotaExhausted, outcomes{0: ErrInvalid, -1: ErrInvalid, math.MinInt64: ErrInvalid, math.MaxInt64: ErrInvalid})},
		{"exact reservation after half", func(f *fixture) { spent(f, half) }, reserve(ReserveRequest{Exact: true}),
			positive(outcomes{half: ErrInvalid, math.MaxInt64: ErrInvalid})},
		// A top-up takes a share of what is left, so no want overflows...
		{"reservation's want after half", func(f *fixture) { spent(f, half) }, reserve(ReserveRequest{}), positive(nil)},
		{"reservation's want after four top-ups of MaxInt64", func(f *fixture) {
			for range 4 {
				f.reserve(f.sA, ReserveRequest{Node: f.job, Resource: "tokens", Want: math.MaxInt64})
			}
		}, reserve(ReserveRequest{}), positive(nil)},
		// ...until a counter can hold no more at all.
		{"reservation's want on a full counter", func(f *fixture) { spent(f, math.MaxInt64) }, reserve(ReserveRequest{}),
			all(ErrInvalid, nil)},
		{"reservation's spent", func(f *fixture) {
			f.reserve(f.sA, ReserveRequest{Node: f.job, Resource: "tokens", Want: 8})
		}, reserve(ReserveRequest{Spent: -1}), all(ErrInvalid, nil)},
		{"reservation's return", func(f *fixture) {
			f.reserve(f.sA, ReserveRequest{Node: f.job, Resource: "tokens", Want: 8})
		}, reserve(ReserveRequest{Return: -1}), all(ErrInvalid, nil)},
		{"block's want", nil, func(f *fixture, a int64) error {
			_, err := f.e.Block(f.sA, BlockRequest{Node: f.job, Class: "db", Want: a})
			return err
		}, positive(outcomes{0: ok})},
		{"block's want over its tenant's block of half", func(f *fixture) {
			f.block(f.sA, f.job2, "db", half, 0)
		}, func(f *fixture, a int64) error {
			_, err := f.e.Block(f.sA, BlockRequest{Node: f.job, Class: "db", Want: a})
			return err
		}, positive(outcomes{0: ok, half: ErrInvalid, math.MaxInt64: ErrInvalid})},
		// The root's count saturates: another tenant's slots refuse nothing.
		{"block's want over another tenant's block of half", func(f *fixture) {
			f.block(f.sB, f.otherJob, "db", half, 0)
		}, func(f *fixture, a int64) error {
			_, err := f.e.Block(f.sA, BlockRequest{Node: f.job, Class: "db", Want: a})
			return err
		}, positive(outcomes{0: ok})},
		{"block's want under a limit", func(f *fixture) {
			f.setCaps(RootID, CapsEdit{Limits: map[string]int64{"db": 4}})
		}, func(f *fixture, a int64) error {
			_, err := f.e.Block(f.sA, BlockRequest{Node: f.job, Class: "db", Want: a})
			return err
		}, positive(outcomes{0: ok})},
		{"block's return", func(f *fixture) { f.block(f.sA, f.job, "db", 3, 0) }, func(f *fixture, a int64) error {
			_, err := f.e.Block(f.sA, BlockRequest{Node: f.job, Class: "db", Return: a})
			return err
		}, all(ErrInvalid, outcomes{0: ok})},
		{"dry run after half", func(f *fixture) { spent(f, half) }, dryRun(false),
			positive(outcomes{half: ErrInvalid, math.MaxInt64: ErrInvalid})},
		{"dry run on a capped chain", capped, dryRun(false),
			all(ErrQuotaExhausted, outcomes{0: ErrInvalid, -1: ErrInvalid, math.MinInt64: ErrInvalid, math.MaxInt64: ErrInvalid})},
		{"dry run counting a ledger of half", func(f *fixture) { recordShadow(f, half) }, dryRun(true),
			positive(outcomes{half: ErrInvalid, math.MaxInt64: ErrInvalid})},
		{"shadow over a ledger of half", func(f *fixture) { recordShadow(f, half) }, shadow,
			positive(outcomes{half: ErrInvalid, math.MaxInt64: ErrInvalid})},
		{"shadow over half spent", func(f *fixture) { spent(f, half) }, shadow,
			positive(outcomes{half: ErrInvalid, math.MaxInt64: ErrInvalid})},
		{"observe's latency", nil, func(f *fixture, a int64) error {
			return f.e.Observe(f.sA, "db", []Sample{{Latency: time.Duration(a)}})
		}, positive(outcomes{0: ok})},
		{"release's latency", func(f *fixture) { f.acquire(f.sA, f.job, "db") }, func(f *fixture, a int64) error {
			return f.e.Release(f.sA, leases(f.e)[0], time.Duration(a), false, "")
		}, positive(outcomes{0: ok})},
		{"quota", nil, caps(func(a int64) CapsEdit { return CapsEdit{Quotas: tokens(a)} }),
			positive(outcomes{0: ok, NoCap: ok})},
		{"limit", nil, caps(func(a int64) CapsEdit { return CapsEdit{Limits: map[string]int64{"db": a}} }),
			positive(outcomes{0: ok, NoCap: ok})},
		{"default quota", nil, caps(func(a int64) CapsEdit { return CapsEdit{DefaultQuotas: tokens(a)} }),
			positive(outcomes{0: ok, NoCap: ok})},
		{"burst", nil, caps(func(a int64) CapsEdit {
			return CapsEdit{Quotas: tokens(math.MaxInt64), QuotaModes: map[string]CapMode{"tokens": {Mode: ModeSoft, Burst: a}}}
		}), positive(outcomes{0: ok})},
		{"weight", nil, caps(func(a int64) CapsEdit { return CapsEdit{Weight: &a} }), positive(nil)},
		{"minimum", func(f *fixture) {
			f.setCaps(RootID, CapsEdit{Limits: map[string]int64{"db": math.MaxInt64}})
			f.setCaps(f.other, CapsEdit{Minimums: map[string]Minimum{"db": {Min: 1}}})
		}, func(f *fixture, a int64) error {
			_, err := f.e.SetCaps(System, f.acme, CapsEdit{Minimums: map[string]Minimum{"db": {Min: a}}}, "")
			return err
		}, positive(outcomes{0: ok, math.MaxInt64: ErrInvalid})},
		{"minimum's start", nil, func(f *fixture, a int64) error {
			_, err := f.e.SetCaps(System, f.acme, CapsEdit{Minimums: map[string]Minimum{"db": {Min: 1, From: a}}}, "")
			return err
		}, positive(outcomes{0: ok})},
		{"minimum's end", nil, func(f *fixture, a int64) error {
			_, err := f.e.SetCaps(System, f.acme, CapsEdit{Minimums: map[string]Minimum{"db": {Min: 1, Until: a}}}, "")
			return err
		}, positive(outcomes{0: ok})},
		{"override's duration", nil, func(f *fixture, a int64) error {
			_, err := f.e.SetCapsAudited(System, f.job, CapsEdit{Quotas: tokens(5)}, Audit{For: time.Duration(a)}, "")
			return err
		}, positive(outcomes{0: ok, math.MaxInt64: ErrInvalid})},
		{"session's TTL", nil, func(f *fixture, a int64) error {
			sid, err := f.e.OpenSession(f.acme, "hostile", time.Duration(a))
			if err == nil {
				_, err = f.e.Heartbeat(sid) // a TTL past the clock's end must not have expired it
			}
			return err
		}, positive(nil)},
	}
	for _, tc := range tests {
		for _, a := range hostileAmounts {
			want, listed := tc.want[a]
			if !listed {
				t.Fatalf("%s: no outcome for %d", tc.name, a)
			}
			t.Run(fmt.Sprintf("%s/%d", tc.name, a), func(t *testing.T) {
				f, _ := delegationFixture(t)
				if tc.setup != nil {
					tc.setup(f)
				}
				var err error
				if want == nil {
					err = tc.call(f, a)
				} else {
					err = unchanged(t, f.e, func() error { return tc.call(f, a) })
				}
				wantErr(t, err, want)
				if bad := counterErrors(f.e); len(bad) > 0 {
					t.Errorf("after %v: %v", err, bad)
				}
			})
		}
	}
}

// recordShadow puts amount of tokens in the shadow ledger of the fixture's
// job.
func recordShadow(f *fixture, amount int64) {
	f.t.Helper()
	dr, err := f.e.Shadow(f.sA, AcquireRequest{Node: f.job, Charges: map[string]int64{"tokens": amount}}, "")
	if err != nil || dr.Err != nil {
		f.t.Fatalf("Shadow(%d): %v %v", amount, err, dr.Err)
	}
}

// A queued acquire whose charge would overflow by the time it could be
// granted fails as invalid at its turn, and nothing is charged.
func TestQueuedChargeThatWouldOverflowFails(t *testing.T) {
	f, _ := delegationFixture(t)
	f.setCaps(f.job, CapsEdit{Limits: map[string]int64{"db": 1}})
	l := f.acquire(f.sA, f.job, "db")
	_, w, err := f.e.Acquire(f.sA, AcquireRequest{Node: f.job, Class: "db", Charges: map[string]int64{"tokens": half}})
	if err != nil || w == nil {
		t.Fatalf("acquire: %v, queued %v; want it queued", err, w != nil)
	}
	f.consume(f.sA, f.job2, "tokens", half) // the tenant's tokens can no longer take half more
	f.release(f.sA, l)
	o, arrived := outcome(w)
	if !arrived || !errors.Is(o.Err, ErrInvalid) {
		t.Fatalf("the queued acquire ended %+v (arrived %v), want ErrInvalid", o, arrived)
	}
	if used := f.node(f.acme).Used["tokens"]; used != half {
		t.Errorf("the tenant used %d tokens, want %d", used, int64(half))
	}
}

// A limit's count at MaxInt64 (a block past every limit) is full: an
// acquire waits, a block cannot grow, and nothing wraps.
func TestSlotsAtMaxInt64AreFull(t *testing.T) {
	f, _ := delegationFixture(t)
	f.block(f.sA, f.job2, "db", math.MaxInt64, 0)
	err := unchanged(t, f.e, func() error {
		_, err := f.e.Block(f.sA, BlockRequest{Node: f.job, Class: "db", Want: 1})
		return err
	})
	wantErr(t, err, ErrInvalid)
	_, w, err := f.e.Acquire(f.sA, AcquireRequest{Node: f.job, Class: "db"})
	if err != nil || w == nil {
		t.Fatalf("acquire beside a block of MaxInt64 slots: %v, queued %v; want it queued", err, w != nil)
	}
	noOutcome(t, w, "an acquire beside a block of MaxInt64 slots")
	f.block(f.sA, f.job2, "db", 0, 1) // one slot back: the acquire has it
	granted(t, w, "an acquire once a slot came back")
	if bad := counterErrors(f.e); len(bad) > 0 {
		t.Error(bad)
	}
}

// A root limit of MaxInt64 on an adaptive class is raised no further, and
// never wraps round to the controller's minimum.
func TestAdaptiveLimitAtMaxInt64StaysThere(t *testing.T) {
	f := newFixture(t, Adaptive{Class: "llm", TargetP95: time.Second, MaxOverload: 0.5, MinLimit: 1,
		MaxLimit: math.MaxInt64, MinSamples: 1, Interval: time.Second})
	f.setCaps(RootID, CapsEdit{Limits: map[string]int64{"llm": math.MaxInt64}})
	if err := f.e.Observe(f.sA, "llm", []Sample{{Latency: time.Millisecond}}); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(2 * time.Second)
	f.e.Reap()
	if got, _ := f.e.AdaptiveLimit("llm"); got != math.MaxInt64 {
		t.Fatalf("a healthy interval took the limit from MaxInt64 to %d", got)
	}
}

// counterErrors lists every counter outside [0, MaxInt64] (I24): used and
// reserved on each node, and their sum, which every check reads; slots
// held; the shadow ledger; blocks' and reservations' counts.
func counterErrors(e *Engine) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, id := range sortedKeys(e.nodes) {
		n := e.nodes[id]
		for r, g := range n.quota {
			if g.n < 0 || g.r < 0 || g.n > math.MaxInt64-g.r {
				out = append(out, fmt.Sprintf("node %d: %s used %d, reserved %d", id, r, g.n, g.r))
			}
		}
		for c, g := range n.limit {
			if g.n < 0 || g.r != 0 {
				out = append(out, fmt.Sprintf("node %d: %s holds %d slots (%d reserved)", id, c, g.n, g.r))
			}
		}
		for r, v := range n.shadow {
			if v < 0 {
				out = append(out, fmt.Sprintf("node %d: %s has a shadow ledger of %d", id, r, v))
			}
		}
		for r, v := range n.gone {
			if v < 0 {
				out = append(out, fmt.Sprintf("node %d: %s reclaimed %d", id, r, v))
			}
		}
	}
	for _, id := range sortedKeys(e.leases) {
		if l := e.leases[id]; l.count < 0 {
			out = append(out, fmt.Sprintf("lease %d holds %d slots", id, l.count))
		}
	}
	for r, byRes := range e.reserved {
		for res := range byRes {
			if res.amount <= 0 {
				out = append(out, fmt.Sprintf("session %d reserves %d of %s on node %d", res.session.id, res.amount, r, res.node.id))
			}
		}
	}
	return out
}

// A charge that would overflow is refused as invalid even beside another
// charge of the same request that a cap denies first.
func TestOverflowingChargeBesideADeniedOne(t *testing.T) {
	f, _ := delegationFixture(t)
	f.setCaps(f.acme, CapsEdit{Quotas: map[string]int64{"calls": 10}})
	f.consume(f.sA, f.job, "tokens", half)
	err := unchanged(t, f.e, func() error {
		_, _, err := f.e.Acquire(f.sA, AcquireRequest{Node: f.job, Class: "db",
			Charges: map[string]int64{"calls": 11, "tokens": half}}) // calls, denied, is checked first
		return err
	})
	wantErr(t, err, ErrInvalid)
}
