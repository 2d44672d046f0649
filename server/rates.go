package server

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor/engine"
)

// Rates (token buckets, engine/rate.go) at governord's edges: in the
// config ("rates: {requests: 100/s, tokens: {rate: 40000/min, burst:
// 80000}}"), in SetCaps and NodeSpec, in GetCapStatus, and a refusal for
// rate on the wire as RESOURCE_EXHAUSTED with a RateLimited detail and a
// google.rpc.RetryInfo.

// checkRate refuses a rate outside the edge's bounds, naming field.
func checkRate(field string, r engine.Rate) error {
	if r.Units == engine.NoCap {
		if r.Per != 0 || r.Burst != 0 {
			return fmt.Errorf("%s: units -1 removes the rate; per and burst must be unset with it", field)
		}
		return nil
	}
	switch {
	case r.Units < 1 || r.Units > governorpb.MaxAmount:
		return fmt.Errorf("%s.units is %d; it must be from 1 to %d (or -1 to remove the rate)", field, r.Units, governorpb.MaxAmount)
	case r.Per < int64(governorpb.MinRatePeriod) || r.Per > int64(governorpb.MaxRatePeriod):
		return fmt.Errorf("%s.per is %v; it must be from %v to %v", field, time.Duration(r.Per), governorpb.MinRatePeriod, governorpb.MaxRatePeriod)
	case r.Burst < 0 || r.Burst > governorpb.MaxAmount:
		return fmt.Errorf("%s.burst is %d; it must be from 0 (one period's worth) to %d", field, r.Burst, governorpb.MaxAmount)
	}
	return nil
}

// ratesFromPB reads the rates of a request, refusing hostile ones.
func ratesFromPB(field string, in map[string]*governorpb.Rate) (map[string]engine.Rate, error) {
	if len(in) == 0 {
		return nil, nil
	}
	out := make(map[string]engine.Rate, len(in))
	for _, k := range slices.Sorted(maps.Keys(in)) {
		p, f := in[k], field+"["+k+"]"
		if p == nil {
			return nil, status.Errorf(codes.InvalidArgument, "%s is empty", f)
		}
		r := engine.Rate{Units: p.GetUnits(), Burst: p.GetBurst()}
		if d := p.GetPer(); d != nil {
			if err := d.CheckValid(); err != nil {
				return nil, status.Errorf(codes.InvalidArgument, "%s.per: %v", f, err)
			}
			r.Per = int64(d.AsDuration()) // saturates; checkRate refuses it
		}
		if err := checkRate(f, r); err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		out[k] = r
	}
	return out, nil
}

func toRate(r engine.Rate) *governorpb.Rate {
	return &governorpb.Rate{Units: r.Units, Per: durationpb.New(time.Duration(r.Per)), Burst: r.Burst}
}

func toRates(in map[string]engine.Rate) map[string]*governorpb.Rate {
	if len(in) == 0 {
		return nil
	}
	out := make(map[string]*governorpb.Rate, len(in))
	for k, r := range in {
		out[k] = toRate(r)
	}
	return out
}

func bucketRates(in map[string]engine.BucketView) map[string]*governorpb.Rate {
	if len(in) == 0 {
		return nil
	}
	out := make(map[string]*governorpb.Rate, len(in))
	for k, b := range in {
		out[k] = toRate(b.Rate)
	}
	return out
}

func toRateStatus(st []engine.RateStatus) []*governorpb.RateStatus {
	var out []*governorpb.RateStatus
	for _, r := range st {
		ps := &governorpb.RateStatus{NodeId: int64(r.Node), NodeName: r.NodeName, Name: r.Name, Rate: toRate(r.Rate),
			Size: r.Size, Level: r.Level, Slices: int32(min(r.Slices, math.MaxInt32)), Lent: r.Lent, LentUnits: r.LentUnits}
		if r.Full > 0 {
			ps.FullIn = durationpb.New(r.Full)
		}
		out = append(out, ps)
	}
	return out
}

// rateStatus is a refusal for rate as the API carries it: retryable
// RESOURCE_EXHAUSTED with a RateLimited and a RetryInfo of the same wait.
func rateStatus(re *engine.RateError) error {
	wait := durationpb.New(re.RetryAfter)
	st, err := status.New(codes.ResourceExhausted, re.Error()).WithDetails(
		&governorpb.RateLimited{Resource: re.Resource, NodeId: int64(re.Node), NodeName: re.NodeName, Rate: toRate(re.Rate),
			Level: re.Level, Amount: re.Amount, RetryAfter: wait},
		&errdetails.RetryInfo{RetryDelay: wait})
	if err != nil {
		return status.Error(codes.ResourceExhausted, re.Error())
	}
	return st.Err()
}

// ratesEdit adds to edit what makes v's rates and default rates the
// configured ones (the default rates only withDefaults: the root has none
// in the configuration), and reports whether it changed anything.
func ratesEdit(edit *engine.CapsEdit, v engine.NodeView, rates, defaults map[string]engine.Rate, withDefaults bool) bool {
	have := make(map[string]engine.Rate, len(v.Rates))
	for k, b := range v.Rates {
		have[k] = b.Rate
	}
	edit.Rates = rateDiff(have, rates)
	if withDefaults {
		edit.DefaultRates = rateDiff(v.DefaultRates, defaults)
	}
	return edit.Rates != nil || edit.DefaultRates != nil
}

func rateDiff(have, want map[string]engine.Rate) map[string]engine.Rate {
	out := map[string]engine.Rate{}
	for k, w := range want {
		if h, ok := have[k]; !ok || h != w {
			out[k] = w
		}
	}
	for k := range have {
		if _, ok := want[k]; !ok {
			out[k] = engine.Rate{Units: engine.NoCap}
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}
