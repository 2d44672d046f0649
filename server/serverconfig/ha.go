package serverconfig

import (
	"net"
	"time"
)

// Defaults of the ha keys.
const (
	DefaultHALease          = 2 * time.Second
	DefaultHADriftAllowance = 250 * time.Millisecond
	MinHALease              = 100 * time.Millisecond
	MaxHALease              = time.Minute
)

// HAConfig is the `ha` section: several governords over one PostgreSQL
// store, one leader and hot standbys.
type HAConfig struct {
	Enabled bool
	// AdvertiseAddr is the address a standby names to clients when this
	// governord leads. Empty means Listen.
	AdvertiseAddr string
	// Lease is how long a won or renewed leadership lasts by the
	// database's clock; the leader renews it three times per lease.
	Lease time.Duration
	// DriftAllowance is how much earlier than the lease's end the leader
	// stops answering, by its own clock, and how long a new leader waits
	// after winning before it answers: room for the clocks' rates to differ.
	DriftAllowance time.Duration
}

type fileHA struct {
	Enabled        bool          `mapstructure:"enabled"`
	AdvertiseAddr  string        `mapstructure:"advertise_addr"`
	Lease          time.Duration `mapstructure:"lease"`
	DriftAllowance time.Duration `mapstructure:"drift_allowance"`
}

// validate fills c.HA from f, with defaults. The keys are checked even when
// ha is off, so that a mistake shows before it is turned on.
func (f fileHA) validate(c *Config) error {
	h := HAConfig(f)
	if h.Lease == 0 {
		h.Lease = DefaultHALease
	}
	if h.Lease < MinHALease || h.Lease > MaxHALease {
		return keyErr("ha.lease", "%v is outside [%v, %v]", h.Lease, MinHALease, MaxHALease)
	}
	if f.DriftAllowance == 0 {
		h.DriftAllowance = min(DefaultHADriftAllowance, h.Lease/4)
	}
	if h.DriftAllowance < 0 || h.DriftAllowance >= h.Lease/2 {
		return keyErr("ha.drift_allowance", "%v is outside [0, lease/2) (lease %v)", h.DriftAllowance, h.Lease)
	}
	if h.AdvertiseAddr != "" {
		if _, _, err := net.SplitHostPort(h.AdvertiseAddr); err != nil {
			return keyErr("ha.advertise_addr", "%q is not host:port", h.AdvertiseAddr)
		}
	}
	if h.Enabled {
		if c.Store.Driver != "postgres" {
			return keyErr("ha.enabled", "needs store.driver postgres (the store is %q): PostgreSQL orders and fences the leaders", c.Store.Driver)
		}
		if h.AdvertiseAddr == "" {
			host, _, _ := net.SplitHostPort(c.Listen)
			if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
				return keyErr("ha.advertise_addr", "is needed when listen (%q) names no single address: clients are sent to it", c.Listen)
			}
		}
	}
	c.HA = h
	return nil
}

// HATestHooks lets a test plant a fault in a governord with ha on. Nil
// fields do nothing.
type HATestHooks struct {
	// IgnoreLease makes the leader answer whether or not its term is
	// valid, and carry on until a renewal tells it it was deposed: the bug
	// the checker must catch (a leader serving past its lease).
	IgnoreLease bool
	// HoldRenewals, when not nil, holds the leader's renewals until it is
	// closed, as a renewing goroutine that is starved or stuck would.
	HoldRenewals <-chan struct{}
}
