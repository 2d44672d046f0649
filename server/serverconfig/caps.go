package serverconfig

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/governor-project/governor/api/governorpb"
	"github.com/governor-project/governor/governor/engine"
)

// Caps, minimums and rates as the file writes them (root, tenants and their
// defaults), read into the engine's types; the server applies them
// (server/policy.go, server/rates.go).

// fileCapMap is caps as written in the file: each a number, or a mapping
// {cap: N, mode: hard|soft|warn_only, burst: N}.
type fileCapMap map[string]any

// parse splits the caps into their values and their modes (nil when none
// is set). modes false refuses the mapping form's mode and burst: defaults
// carry caps to children, never modes.
func (m fileCapMap) parse(key string, modes bool) (map[string]int64, map[string]engine.CapMode, error) {
	if m == nil {
		return nil, nil, nil
	}
	caps := make(map[string]int64, len(m))
	var out map[string]engine.CapMode
	for name, raw := range m {
		k := key + "." + name
		if name == "" {
			return nil, nil, keyErr(key, "has an empty name")
		}
		spec, isMap := raw.(map[string]any)
		if !isMap {
			v, err := capNumber(k, raw)
			if err != nil {
				return nil, nil, err
			}
			caps[name] = v
			continue
		}
		v, cm, err := parseCapMapping(k, spec)
		if err != nil {
			return nil, nil, err
		}
		caps[name] = v
		if cm == (engine.CapMode{}) {
			continue
		}
		if !modes {
			return nil, nil, keyErr(k, "a default takes no mode or burst; set them on the node")
		}
		if out == nil {
			out = make(map[string]engine.CapMode)
		}
		out[name] = cm
	}
	return caps, out, nil
}

func parseCapMapping(k string, spec map[string]any) (int64, engine.CapMode, error) {
	var cm engine.CapMode
	for f := range spec {
		if f != "cap" && f != "mode" && f != "burst" {
			return 0, cm, keyErr(k+"."+f, "is not a key of a cap (cap, mode, burst)")
		}
	}
	raw, ok := spec["cap"]
	if !ok {
		return 0, cm, keyErr(k+".cap", "is missing")
	}
	v, err := capNumber(k+".cap", raw)
	if err != nil {
		return 0, cm, err
	}
	if m, ok := spec["mode"]; ok {
		name, isStr := m.(string)
		if !isStr {
			return 0, cm, keyErr(k+".mode", "%v is not one of hard, soft, warn_only", m)
		}
		if cm.Mode, err = engine.ParseMode(name); err != nil {
			return 0, cm, keyErr(k+".mode", "%q is not one of hard, soft, warn_only", name)
		}
	}
	if b, ok := spec["burst"]; ok {
		if cm.Burst, err = capNumber(k+".burst", b); err != nil {
			return 0, cm, err
		}
		if cm.Burst > 0 && cm.Mode != engine.ModeSoft {
			return 0, cm, keyErr(k+".burst", "applies only with mode: soft")
		}
	}
	return v, cm, nil
}

// capNumber reads a non-negative whole number, as YAML gives it or as a
// ${VAR} expansion (a string) does.
func capNumber(k string, raw any) (int64, error) {
	var v int64
	switch x := raw.(type) {
	case int:
		v = int64(x)
	case int64:
		v = x
	case uint64:
		if x > 1<<62 {
			return 0, keyErr(k, "%d is too large", x)
		}
		v = int64(x)
	case float64:
		if x != float64(int64(x)) {
			return 0, keyErr(k, "%v is not a whole number", x)
		}
		v = int64(x)
	case string:
		n, err := strconv.ParseInt(x, 10, 64)
		if err != nil {
			return 0, keyErr(k, "%q is not a whole number", x)
		}
		v = n
	default:
		return 0, keyErr(k, "%v is not a number or a mapping {cap, mode, burst}", raw)
	}
	if v < 0 {
		return 0, keyErr(k, "%d is negative", v)
	}
	return v, nil
}

// checkNear validates near_thresholds: ascending percentages in 1..100.
func checkNear(near []int) error {
	for i, t := range near {
		if t < 1 || t > 100 {
			return keyErr(fmt.Sprintf("near_thresholds[%d]", i), "%d is not a percentage between 1 and 100", t)
		}
		if i > 0 && t <= near[i-1] {
			return keyErr(fmt.Sprintf("near_thresholds[%d]", i), "%d does not come after %d; list them ascending", t, near[i-1])
		}
	}
	return nil
}

// parseMinimums reads a tenant's minimums: each a number, or a mapping
// {min: N, valid_from: TIME, valid_until: TIME} with RFC 3339 times.
func (m fileCapMap) parseMinimums(key string) (map[string]engine.Minimum, error) {
	if m == nil {
		return nil, nil
	}
	out := make(map[string]engine.Minimum, len(m))
	for class, raw := range m {
		k := key + "." + class
		if class == "" {
			return nil, keyErr(key, "has an empty class name")
		}
		spec, isMap := raw.(map[string]any)
		if !isMap {
			v, err := capNumber(k, raw)
			if err != nil {
				return nil, err
			}
			out[class] = engine.Minimum{Min: v}
			continue
		}
		var mn engine.Minimum
		for f, v := range spec {
			var err error
			switch f {
			case "min":
				mn.Min, err = capNumber(k+".min", v)
			case "valid_from", "valid_until":
				var at int64
				at, err = parseTime(k+"."+f, v)
				if f == "valid_from" {
					mn.From = at
				} else {
					mn.Until = at
				}
			default:
				err = keyErr(k+"."+f, "is not a key of a minimum (min, valid_from, valid_until)")
			}
			if err != nil {
				return nil, err
			}
		}
		if mn.Until != 0 && mn.Until <= mn.From {
			return nil, keyErr(k+".valid_until", "is not after valid_from")
		}
		out[class] = mn
	}
	return out, nil
}

func parseTime(k string, raw any) (int64, error) {
	switch x := raw.(type) {
	case time.Time:
		return x.UnixNano(), nil
	case string:
		t, err := time.Parse(time.RFC3339, x)
		if err != nil {
			return 0, keyErr(k, "%q is not an RFC 3339 time (2026-12-01T22:00:00Z)", x)
		}
		return t.UnixNano(), nil
	}
	return 0, keyErr(k, "%v is not an RFC 3339 time (2026-12-01T22:00:00Z)", raw)
}

// checkMinimums refuses tenants' minimums that sum, for a class, over the
// root's limit of it.
func checkMinimums(c *Config) error {
	sums := map[string]int64{}
	for i, t := range c.Tenants {
		for _, class := range slices.Sorted(maps.Keys(t.Minimums)) {
			sums[class] += t.Minimums[class].Min
			if limit, ok := c.Root.Limits[class]; ok && sums[class] > limit {
				return keyErr(fmt.Sprintf("tenants[%d].minimums.%s", i, class), "the tenants' minimums of %s sum to %d, over root.limits.%s (%d)",
					class, sums[class], class, limit)
			}
		}
	}
	return nil
}

// fileRateMap is a config's rates: by resource, "N/PERIOD" (100/s,
// 40000/min) or a mapping {rate: N/PERIOD, burst: B}.
type fileRateMap map[string]any

func (m fileRateMap) parse(key string) (map[string]engine.Rate, error) {
	if m == nil {
		return nil, nil
	}
	out := make(map[string]engine.Rate, len(m))
	for _, name := range slices.Sorted(maps.Keys(m)) {
		k := key + "." + name
		if name == "" {
			return nil, keyErr(key, "has an empty name")
		}
		raw := m[name]
		var r engine.Rate
		var err error
		if spec, isMap := raw.(map[string]any); isMap {
			r, err = parseRateMapping(k, spec)
		} else {
			r, err = parseRate(k, raw)
		}
		if err != nil {
			return nil, err
		}
		if err := engine.ValidName("resource", name); err != nil {
			return nil, keyErr(k, "%v", err)
		}
		out[name] = r
	}
	return out, nil
}

func parseRateMapping(k string, spec map[string]any) (engine.Rate, error) {
	for f := range spec {
		if f != "rate" && f != "burst" {
			return engine.Rate{}, keyErr(k+"."+f, "is not a key of a rate (rate, burst)")
		}
	}
	raw, ok := spec["rate"]
	if !ok {
		return engine.Rate{}, keyErr(k+".rate", "is missing")
	}
	r, err := parseRate(k+".rate", raw)
	if err != nil {
		return r, err
	}
	if b, ok := spec["burst"]; ok {
		if r.Burst, err = capNumber(k+".burst", b); err != nil {
			return r, err
		}
		if r.Burst < 1 || r.Burst > governorpb.MaxAmount {
			return r, keyErr(k+".burst", "%d is not from 1 to %d", r.Burst, governorpb.MaxAmount)
		}
	}
	return r, nil
}

// parseRate reads "N/PERIOD" (governorpb.ParseRate).
func parseRate(k string, raw any) (engine.Rate, error) {
	text, ok := raw.(string)
	if !ok {
		return engine.Rate{}, keyErr(k, "%v is not a rate such as 100/s or 40000/min", raw)
	}
	units, per, err := governorpb.ParseRate(text)
	if err != nil {
		return engine.Rate{}, keyErr(k, "%v", err)
	}
	return engine.Rate{Units: units, Per: int64(per)}, nil
}
