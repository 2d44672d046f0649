package serverconfig

import (
	"fmt"

	"github.com/governor-project/governor/api/governorpb"
)

// APIRate is a tenant's api_rate: how many calls a second its sessions may
// make to governord's API, beyond which a call is refused with a RetryInfo
// (server/admission.go). It is a rate on governord itself, not on the tenant's
// work: the rates a tenant sets on its work are caps in the engine.
type APIRate struct {
	PerSecond float64 // the refill
	Burst     int     // the bucket's size: calls that may come at once
}

// Bounds of api_rate and api_burst: past them a value is a mistake, not a
// rate (governord answers some tens of thousands of calls a second).
const (
	MaxAPIRatePerSecond = 1_000_000
	MaxAPIBurst         = 1_000_000
)

// ParseAPIRate reads a rate as the rates of work are written
// (governorpb.ParseRate: "N/s", "N/min", "N/h" ...), at most
// MaxAPIRatePerSecond calls a second, and returns calls a second.
func ParseAPIRate(text string) (float64, error) {
	n, per, err := governorpb.ParseRate(text)
	if err != nil {
		return 0, err
	}
	perSecond := float64(n) / per.Seconds()
	if perSecond > MaxAPIRatePerSecond {
		return 0, fmt.Errorf("%q is over %d calls a second", text, MaxAPIRatePerSecond)
	}
	return perSecond, nil
}
