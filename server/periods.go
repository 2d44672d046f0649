package server

import (
	"maps"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor/engine"
	"github.com/governor-project/governor/server/serverconfig"
)

// Periods of quotas (engine/period.go) at governord's edges: in the config
// ("quotas: {tokens: {cap: 50000, period: month}}", "time_zone:"), in
// SetCaps and NodeSpec ("month", "10s", "none"), in GetCapStatus and in a
// denial's reset_at.

func formatPeriod(p engine.Period) string {
	return governorpb.FormatPeriod(time.Duration(p.Every), p.Unit)
}

// periodsFromPB reads the periods of a request, refusing bad ones with
// INVALID_ARGUMENT naming the field.
func periodsFromPB(field string, in map[string]string) (map[string]engine.Period, error) {
	if len(in) == 0 {
		return nil, nil
	}
	out := make(map[string]engine.Period, len(in))
	for _, k := range slices.Sorted(maps.Keys(in)) {
		p, err := serverconfig.ParsePeriod(in[k])
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "%s[%s]: %v", field, k, err)
		}
		out[k] = p
	}
	return out, nil
}

func toPeriods(in map[string]engine.Period) map[string]string {
	if len(in) == 0 {
		return nil
	}
	out := make(map[string]string, len(in))
	for k, p := range in {
		out[k] = formatPeriod(p)
	}
	return out
}

// windowPeriods is the periods of a node's quotas, without those removed.
func windowPeriods(in map[string]engine.QuotaWindow) map[string]engine.Period {
	out := map[string]engine.Period{}
	for k, w := range in {
		if !w.Period.IsZero() {
			out[k] = w.Period
		}
	}
	return out
}

// periodsEdit adds to edit what makes v's periods and default periods the
// configured ones, and reports whether it changed anything. The same
// period again is no change, so its window stays.
func periodsEdit(edit *engine.CapsEdit, v engine.NodeView, periods, defaults map[string]engine.Period, withDefaults bool) bool {
	edit.QuotaPeriods = periodDiff(windowPeriods(v.Periods), periods)
	if withDefaults {
		edit.DefaultQuotaPeriods = periodDiff(v.DefaultQuotaPeriods, defaults)
	}
	return edit.QuotaPeriods != nil || edit.DefaultQuotaPeriods != nil
}

func periodDiff(have, want map[string]engine.Period) map[string]engine.Period {
	out := map[string]engine.Period{}
	for k, w := range want {
		if have[k] != w {
			out[k] = w
		}
	}
	for k := range have {
		if _, ok := want[k]; !ok {
			out[k] = engine.Period{}
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// withPeriods adds each periodic quota's period and next reset to a cap
// status report.
func withPeriods(out *governorpb.CapStatusReport, st []engine.PeriodStatus) {
	type key struct {
		node int64
		name string
	}
	by := make(map[key]engine.PeriodStatus, len(st))
	for _, p := range st {
		by[key{int64(p.Node), p.Name}] = p
	}
	for _, c := range out.Caps {
		if p, ok := by[key{c.NodeId, c.Name}]; ok && !c.Limit {
			c.Period = formatPeriod(p.Period)
			c.ResetAt = resetAt(p.End)
		}
	}
}

// resetAt is a window's end on the wire; unset for one that never ends.
func resetAt(end int64) *timestamppb.Timestamp {
	if end == 0 || end == 1<<63-1 {
		return nil
	}
	return timestamppb.New(time.Unix(0, end))
}
