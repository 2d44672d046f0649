package governorpb

import (
	"fmt"
	"strings"
	"time"
)

// The bounds of a quota's period given as a duration; past them
// governord answers INVALID_ARGUMENT (or refuses its configuration).
const (
	MinPeriod = time.Second
	MaxPeriod = 366 * 24 * time.Hour
)

// PeriodUnits are the calendar periods a quota may reset on, in
// governord's time_zone; weeks start on Monday.
var PeriodUnits = []string{"hour", "day", "week", "month"}

// NoPeriod, as a period, removes one.
const NoPeriod = "none"

// ParsePeriod reads a quota's period as governord's configuration, the
// API and governor caps write it: a calendar unit (PeriodUnits), or a
// duration from MinPeriod to MaxPeriod such as 10s or 1h30m. It answers
// the duration, or the unit; "none" is neither.
func ParsePeriod(text string) (every time.Duration, unit string, err error) {
	t := strings.TrimSpace(text)
	if t == NoPeriod {
		return 0, "", nil
	}
	for _, u := range PeriodUnits {
		if t == u {
			return 0, u, nil
		}
	}
	d, err := time.ParseDuration(t)
	if err != nil {
		return 0, "", fmt.Errorf("%q is not a period: hour, day, week, month, none or a duration such as 10s", text)
	}
	if d < MinPeriod || d > MaxPeriod {
		return 0, "", fmt.Errorf("%q: a period must be from %v to %v", text, MinPeriod, MaxPeriod)
	}
	return d, "", nil
}

// FormatPeriod writes a period as ParsePeriod reads it; "none" for
// neither.
func FormatPeriod(every time.Duration, unit string) string {
	switch {
	case unit != "":
		return unit
	case every > 0:
		return every.String()
	}
	return NoPeriod
}
