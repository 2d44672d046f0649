package serverconfig

import (
	"strconv"
	"strings"
)

// Admission's configuration (server/admission.go): the top-level admission block
// and each tenant's max_in_flight, max_queued, api_rate and api_burst.

// Defaults and bounds of admission's keys.
const (
	// DefaultMaxInFlight is admission.max_in_flight: calls that hold a
	// place across all tenants.
	DefaultMaxInFlight = 128
	// DefaultTenantMaxInFlight is one tenant's max_in_flight unless it says
	// otherwise: half the places, so that one tenant alone never holds them
	// all and another's call finds one at once.
	DefaultTenantMaxInFlight = 64
	// DefaultTenantMaxQueued is one tenant's max_queued: calls waiting for
	// a place beyond which its calls are refused with a RetryInfo.
	DefaultTenantMaxQueued = 512
	// DefaultAdminWeight is admission.admin_weight, the admin key's share.
	DefaultAdminWeight = 1

	MaxAdmissionInFlight = 100_000
	MaxAdmissionQueued   = 1_000_000
	MaxAdmissionWeight   = 1_000_000
)

// AdmissionConfig is the admission block: the places across all tenants,
// each tenant's defaults, and the admin key's share.
type AdmissionConfig struct {
	MaxInFlight       int
	TenantMaxInFlight int
	TenantMaxQueued   int
	AdminWeight       int
}

// The numbers are read as they were written (any), not through the
// decoder's conversions, which would take 1.5 for 1 and true for 1.
type fileAdmission struct {
	MaxInFlight       any `mapstructure:"max_in_flight"`
	TenantMaxInFlight any `mapstructure:"tenant_max_in_flight"`
	TenantMaxQueued   any `mapstructure:"tenant_max_queued"`
	AdminWeight       any `mapstructure:"admin_weight"`
}

// intIn reads an optional whole number that must lie in [lo, hi]; absent,
// it is def. Anything but a whole number written as one is refused.
func intIn(key string, v any, def, lo, hi int) (int, error) {
	var n int64
	switch v := v.(type) {
	case nil:
		return def, nil
	case int:
		n = int64(v)
	case int64:
		n = v
	case uint64:
		return 0, keyErr(key, "%d is outside [%d, %d]", v, lo, hi)
	case float64:
		if v != float64(int64(v)) || v > 1<<62 || v < -(1<<62) {
			return 0, keyErr(key, "%v is not a whole number in [%d, %d]", v, lo, hi)
		}
		n = int64(v)
	case string:
		// A ${VAR} comes as text.
		p, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return 0, keyErr(key, "%q is not a whole number", v)
		}
		n = p
	default:
		return 0, keyErr(key, "%v is not a whole number", v)
	}
	if n < int64(lo) || n > int64(hi) {
		return 0, keyErr(key, "%d is outside [%d, %d]", n, lo, hi)
	}
	return int(n), nil
}

func (f fileAdmission) parse() (AdmissionConfig, error) {
	var c AdmissionConfig
	var err error
	if c.MaxInFlight, err = intIn("admission.max_in_flight", f.MaxInFlight, DefaultMaxInFlight, 1, MaxAdmissionInFlight); err != nil {
		return c, err
	}
	if c.TenantMaxInFlight, err = intIn("admission.tenant_max_in_flight", f.TenantMaxInFlight,
		min(DefaultTenantMaxInFlight, c.MaxInFlight), 1, MaxAdmissionInFlight); err != nil {
		return c, err
	}
	if c.TenantMaxQueued, err = intIn("admission.tenant_max_queued", f.TenantMaxQueued, DefaultTenantMaxQueued, 0, MaxAdmissionQueued); err != nil {
		return c, err
	}
	c.AdminWeight, err = intIn("admission.admin_weight", f.AdminWeight, DefaultAdminWeight, 1, MaxAdmissionWeight)
	return c, err
}

// fileTenantAdmission is a tenant's own admission keys.
type fileTenantAdmission struct {
	MaxInFlight any    `mapstructure:"max_in_flight"`
	MaxQueued   any    `mapstructure:"max_queued"`
	APIRate     string `mapstructure:"api_rate"`
	APIBurst    any    `mapstructure:"api_burst"`
}

// parse reads key's admission keys into tc.
func (f fileTenantAdmission) parse(key string, tc *TenantConfig) error {
	var err error
	if tc.MaxInFlight, err = intIn(key+".max_in_flight", f.MaxInFlight, 0, 1, MaxAdmissionInFlight); err != nil {
		return err
	}
	if f.MaxQueued != nil {
		q, err := intIn(key+".max_queued", f.MaxQueued, 0, 0, MaxAdmissionQueued)
		if err != nil {
			return err
		}
		tc.MaxQueued = &q
	}
	if f.APIRate == "" {
		if f.APIBurst != nil {
			return keyErr(key+".api_burst", "is set without api_rate")
		}
		return nil
	}
	perSecond, err := ParseAPIRate(f.APIRate)
	if err != nil {
		return keyErr(key+".api_rate", "%v", err)
	}
	// The burst defaults to a second's calls, at least one.
	burst, err := intIn(key+".api_burst", f.APIBurst, max(1, int(min(perSecond, MaxAPIBurst))), 1, MaxAPIBurst)
	if err != nil {
		return err
	}
	tc.APIRate = &APIRate{PerSecond: perSecond, Burst: burst}
	return nil
}

// fillAdmission gives a Config built in code admission's defaults.
func (c *Config) fillAdmission() {
	a := &c.Admission
	if a.MaxInFlight == 0 {
		a.MaxInFlight = DefaultMaxInFlight
	}
	if a.TenantMaxInFlight == 0 {
		a.TenantMaxInFlight = min(DefaultTenantMaxInFlight, a.MaxInFlight)
	}
	if a.TenantMaxQueued == 0 {
		a.TenantMaxQueued = DefaultTenantMaxQueued
	}
	if a.AdminWeight == 0 {
		a.AdminWeight = DefaultAdminWeight
	}
}
