package server

import "github.com/governor-project/governor/server/serverconfig"

// governord's configuration lives in package serverconfig, a leaf that a
// reader of the file links without the daemon. These names keep the
// server's API as it was.
type (
	Config          = serverconfig.Config
	TLSConfig       = serverconfig.TLSConfig
	StoreConfig     = serverconfig.StoreConfig
	Caps            = serverconfig.Caps
	TenantConfig    = serverconfig.TenantConfig
	AdmissionConfig = serverconfig.AdmissionConfig
	APIRate         = serverconfig.APIRate
	HAConfig        = serverconfig.HAConfig
	HATestHooks     = serverconfig.HATestHooks
	ConfigError     = serverconfig.ConfigError
)

// Defaults and bounds of the configuration (package serverconfig).
const (
	DefaultMaxInFlight       = serverconfig.DefaultMaxInFlight
	DefaultTenantMaxInFlight = serverconfig.DefaultTenantMaxInFlight
	DefaultTenantMaxQueued   = serverconfig.DefaultTenantMaxQueued
	DefaultAdminWeight       = serverconfig.DefaultAdminWeight
	MaxAdmissionInFlight     = serverconfig.MaxAdmissionInFlight
	MaxAdmissionQueued       = serverconfig.MaxAdmissionQueued
	MaxAdmissionWeight       = serverconfig.MaxAdmissionWeight
	MaxAPIRatePerSecond      = serverconfig.MaxAPIRatePerSecond
	MaxAPIBurst              = serverconfig.MaxAPIBurst
	DefaultListen            = serverconfig.DefaultListen
	DefaultMetricsListen     = serverconfig.DefaultMetricsListen
	DefaultSessionTTL        = serverconfig.DefaultSessionTTL
	DefaultStoreDriver       = serverconfig.DefaultStoreDriver
	DefaultStoreDSN          = serverconfig.DefaultStoreDSN
	DefaultSnapshotEvery     = serverconfig.DefaultSnapshotEvery
	DefaultReapInterval      = serverconfig.DefaultReapInterval
	MinSessionTTL            = serverconfig.MinSessionTTL
	MaxSessionTTL            = serverconfig.MaxSessionTTL
	DefaultMaxSessionTTL     = serverconfig.DefaultMaxSessionTTL
	DefaultNodeRetention     = serverconfig.DefaultNodeRetention
	MinNodeRetention         = serverconfig.MinNodeRetention
	MaxNodeRetention         = serverconfig.MaxNodeRetention
	DefaultHALease           = serverconfig.DefaultHALease
	DefaultHADriftAllowance  = serverconfig.DefaultHADriftAllowance
	MinHALease               = serverconfig.MinHALease
	MaxHALease               = serverconfig.MaxHALease
)

// DefaultBounds are each tenant's bounds when tenant_bounds leaves them out.
var DefaultBounds = serverconfig.DefaultBounds

// LoadConfig reads, expands and validates a governord configuration file
// (serverconfig.LoadConfig).
func LoadConfig(path string) (Config, error) { return serverconfig.LoadConfig(path) }

// ParseConfig is LoadConfig for text already read.
func ParseConfig(text []byte) (Config, error) { return serverconfig.ParseConfig(text) }

// ParseAPIRate reads an api_rate (serverconfig.ParseAPIRate).
func ParseAPIRate(text string) (float64, error) { return serverconfig.ParseAPIRate(text) }

// IsConfigError reports whether err is a configuration problem (exit 2).
func IsConfigError(err error) bool { return serverconfig.IsConfigError(err) }
