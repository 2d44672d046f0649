package governorpb

import (
	"slices"
	"strconv"
	"strings"
)

// causeWireNames is the one table of the causes' names on the wire,
// derived from the enumeration so that a cause added to governor.proto is
// named with no more code.
var causeWireNames = wireNames()

func wireNames() map[Cause]string {
	names := make(map[Cause]string, len(Cause_name))
	for v, n := range Cause_name {
		if c := Cause(v); c != Cause_CAUSE_UNSPECIFIED {
			names[c] = strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(n, "CAUSE_")), "_", "-")
		}
	}
	return names
}

// WireName is c's name on the wire: the Governor-Denied header's value,
// the "cause" label of metrics and the cause of usage records ("quota",
// "wait-timeout"). A value the enumeration does not hold (UNSPECIFIED
// included) reads "cause(N)".
func (c Cause) WireName() string {
	if n, ok := causeWireNames[c]; ok {
		return n
	}
	return "cause(" + strconv.Itoa(int(c)) + ")"
}

// Causes lists every cause but UNSPECIFIED, in order.
func Causes() []Cause {
	out := make([]Cause, 0, len(causeWireNames))
	for v := range Cause_name {
		if c := Cause(v); c != Cause_CAUSE_UNSPECIFIED {
			out = append(out, c)
		}
	}
	slices.Sort(out)
	return out
}

// UsageName is the cause a usage record counts a refusal under: its
// WireName, or for a spent quota whose resource is known,
// "quota:RESOURCE".
func (c Cause) UsageName(resource string) string {
	if c == Cause_CAUSE_QUOTA && resource != "" {
		return c.WireName() + ":" + resource
	}
	return c.WireName()
}
