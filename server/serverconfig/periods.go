package serverconfig

import (
	"maps"
	"slices"
	"time"
	_ "time/tzdata" // every governord computes the same calendar boundaries, whatever the machine's zone files

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor/engine"
)

// Periods of quotas in the config: "quotas: {tokens: {cap: 50000, period:
// month}}" and "time_zone:" (server/periods.go has them at the API).

// ParsePeriod reads a period's text (governorpb.ParsePeriod); "none" is
// the zero Period, which removes one.
func ParsePeriod(text string) (engine.Period, error) {
	every, unit, err := governorpb.ParsePeriod(text)
	if err != nil {
		return engine.Period{}, err
	}
	return engine.Period{Every: int64(every), Unit: unit}, nil
}

// periods reads the periods of a config's quotas, given as mappings
// {cap: N, period: P}; limits take none.
func (m fileCapMap) periods(key string, quotas bool) (map[string]engine.Period, error) {
	var out map[string]engine.Period
	for _, name := range slices.Sorted(maps.Keys(m)) {
		spec, isMap := m[name].(map[string]any)
		raw, ok := spec["period"]
		if !isMap || !ok {
			continue
		}
		k := key + "." + name + ".period"
		if !quotas {
			return nil, keyErr(k, "a limit has no period; quotas do")
		}
		text, isStr := raw.(string)
		if !isStr {
			return nil, keyErr(k, "%v is not a period: hour, day, week, month or a duration such as 10s", raw)
		}
		p, err := ParsePeriod(text)
		if err != nil || p.IsZero() {
			return nil, keyErr(k, "%q is not a period: hour, day, week, month or a duration from %v to %v",
				text, governorpb.MinPeriod, governorpb.MaxPeriod)
		}
		if out == nil {
			out = make(map[string]engine.Period)
		}
		out[name] = p
	}
	return out, nil
}

// parseTimeZone reads time_zone (an IANA name such as Europe/Paris;
// empty is UTC) from the zone data embedded in governord.
func parseTimeZone(name string) (*time.Location, error) {
	if name == "" {
		return time.UTC, nil
	}
	loc, err := time.LoadLocation(name)
	if err != nil || name == "Local" {
		return nil, keyErr("time_zone", "%q is not a time zone such as UTC or America/New_York", name)
	}
	return loc, nil
}
