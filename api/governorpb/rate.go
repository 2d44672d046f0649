package governorpb

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The bounds of a rate (Rate) governord takes: units and burst from 1 (0
// for a burst: one period's worth) to MaxAmount, a period from
// MinRatePeriod to MaxRatePeriod. Past them it answers INVALID_ARGUMENT.
const (
	MinRatePeriod = time.Millisecond
	MaxRatePeriod = 24 * time.Hour
)

// ratePeriods are the periods a rate's text may name after its slash.
var ratePeriods = map[string]time.Duration{
	"ms": time.Millisecond, "s": time.Second, "sec": time.Second, "second": time.Second,
	"min": time.Minute, "minute": time.Minute, "h": time.Hour, "hour": time.Hour, "day": 24 * time.Hour,
}

// ParseRate reads a rate as governord's configuration and governor caps
// write it, "N/PERIOD" (100/s, 40000/min, 5/10s): N a whole number from 1
// to MaxAmount, PERIOD ms, s, min, h, day or a duration from MinRatePeriod
// to MaxRatePeriod.
func ParseRate(text string) (units int64, per time.Duration, err error) {
	num, p, ok := strings.Cut(strings.TrimSpace(text), "/")
	if !ok {
		return 0, 0, fmt.Errorf("%q is not a rate such as 100/s or 40000/min", text)
	}
	units, err = strconv.ParseInt(strings.TrimSpace(num), 10, 64)
	if err != nil || units < 1 || units > MaxAmount {
		return 0, 0, fmt.Errorf("%q: the count must be a whole number from 1 to %d", text, MaxAmount)
	}
	p = strings.TrimSpace(p)
	per, named := ratePeriods[p]
	if !named {
		if per, err = time.ParseDuration(p); err != nil {
			return 0, 0, fmt.Errorf("%q: the period must be ms, s, min, h, day or a duration such as 10s", text)
		}
	}
	if per < MinRatePeriod || per > MaxRatePeriod {
		return 0, 0, fmt.Errorf("%q: the period must be from %v to %v", text, MinRatePeriod, MaxRatePeriod)
	}
	return units, per, nil
}

// FormatRate writes units per per as ParseRate reads it.
func FormatRate(units int64, per time.Duration) string {
	for _, p := range []struct {
		name string
		d    time.Duration
	}{{"day", 24 * time.Hour}, {"h", time.Hour}, {"min", time.Minute}, {"s", time.Second}, {"ms", time.Millisecond}} {
		if per == p.d {
			return fmt.Sprintf("%d/%s", units, p.name)
		}
	}
	return fmt.Sprintf("%d/%v", units, per)
}
