package proxy

import "github.com/governor-project/governor/proxy/proxyconfig"

// The sidecar's configuration lives in package proxyconfig, a leaf that a
// reader of the file links without the sidecar. These names keep the
// sidecar's API as it was.
type (
	Config           = proxyconfig.Config
	GovernorConfig   = proxyconfig.GovernorConfig
	TaskConfig       = proxyconfig.TaskConfig
	HTTPConfig       = proxyconfig.HTTPConfig
	InterceptConfig  = proxyconfig.InterceptConfig
	PGWireConfig     = proxyconfig.PGWireConfig
	TLSFiles         = proxyconfig.TLSFiles
	UpstreamTLS      = proxyconfig.UpstreamTLS
	Route            = proxyconfig.Route
	DelegationConfig = proxyconfig.DelegationConfig
	ConfigError      = proxyconfig.ConfigError
)

// Defaults and bounds of the configuration (package proxyconfig).
const (
	DefaultListen                = proxyconfig.DefaultListen
	DefaultMetricsListen         = proxyconfig.DefaultMetricsListen
	DefaultWaitTimeout           = proxyconfig.DefaultWaitTimeout
	DefaultTunnelIdleTimeout     = proxyconfig.DefaultTunnelIdleTimeout
	DefaultBodyIdleTimeout       = proxyconfig.DefaultBodyIdleTimeout
	DefaultShutdownTimeout       = proxyconfig.DefaultShutdownTimeout
	DefaultReadHeaderTimeout     = proxyconfig.DefaultReadHeaderTimeout
	DefaultIdleTimeout           = proxyconfig.DefaultIdleTimeout
	DefaultDialTimeout           = proxyconfig.DefaultDialTimeout
	DefaultMaxHeaderBytes        = proxyconfig.DefaultMaxHeaderBytes
	DefaultResponseHeaderTimeout = proxyconfig.DefaultResponseHeaderTimeout
	UnmatchedForward             = proxyconfig.UnmatchedForward
	UnmatchedDeny                = proxyconfig.UnmatchedDeny
	MinPGWireMaxMessageBytes     = proxyconfig.MinPGWireMaxMessageBytes
	MaxPGWireMaxMessageBytes     = proxyconfig.MaxPGWireMaxMessageBytes
	DefaultPGWireMaxMessageBytes = proxyconfig.DefaultPGWireMaxMessageBytes
)

// DefaultDelegation is the delegation: key's default (package proxyconfig).
var DefaultDelegation = proxyconfig.DefaultDelegation

// LoadConfig reads, expands and validates a governor-proxy configuration
// file (proxyconfig.LoadConfig).
func LoadConfig(path string) (Config, error) { return proxyconfig.LoadConfig(path) }

// ParseConfig is LoadConfig for text already read.
func ParseConfig(text []byte) (Config, error) { return proxyconfig.ParseConfig(text) }

// LoadClassification reads a configuration file for governor explain
// (proxyconfig.LoadClassification).
func LoadClassification(path string) (Config, error) { return proxyconfig.LoadClassification(path) }

// IsConfigError reports whether err is a configuration problem (exit 2).
func IsConfigError(err error) bool { return proxyconfig.IsConfigError(err) }
