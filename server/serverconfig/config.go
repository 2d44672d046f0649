package serverconfig

import (
	"crypto/sha256"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/governor-project/governor/governor/engine"
	"github.com/governor-project/governor/internal/apikey"
	"github.com/governor-project/governor/internal/configfile"
)

// Defaults for everything the configuration may leave out.
const (
	DefaultListen        = "127.0.0.1:7600"
	DefaultMetricsListen = "127.0.0.1:7601"
	DefaultSessionTTL    = 10 * time.Second
	DefaultStoreDriver   = "sqlite"
	DefaultStoreDSN      = "governor.db"
	DefaultSnapshotEvery = 100_000
	DefaultReapInterval  = 100 * time.Millisecond
	MinSessionTTL        = 100 * time.Millisecond
	MaxSessionTTL        = time.Hour
	// DefaultMaxSessionTTL is the longest TTL a client may ask for when
	// max_session_ttl is not set; a longer ask gets this.
	DefaultMaxSessionTTL = 5 * time.Minute
	// DefaultNodeRetention is how long an ended node is kept (answering as
	// ended) before it is reclaimed; MinNodeRetention keeps it at least as
	// long as a lease's tombstone, so a tombstone never outlives its node.
	DefaultNodeRetention = engine.DefaultRetention
	MinNodeRetention     = engine.TombstoneTTL
	MaxNodeRetention     = 24 * time.Hour
)

// DefaultBounds are each tenant's bounds when tenant_bounds leaves them out.
var DefaultBounds = engine.Bounds{Sessions: 1000, Nodes: 100_000, Waiters: 10_000, Resources: 1000, Classes: 1000}

// Config is governord's validated runtime configuration.
type Config struct {
	Listen        string
	MetricsListen string // empty: no metrics server
	// PProf serves Go's profiles (net/http/pprof) under /debug/pprof/ on
	// the metrics listener (debug.pprof); off by default.
	PProf          bool
	SessionTTL     time.Duration // the default TTL of a session
	AllowPlaintext bool
	TLS            TLSConfig
	AdminKey       string // empty: no operator sessions
	// AdminKeySHA256 stands for AdminKey by its SHA-256, so that the file
	// holds no secret; zero: none. At most one of the two is set.
	AdminKeySHA256 [sha256.Size]byte
	Store          StoreConfig
	Root           Caps
	// Location is the time zone of calendar periods (time_zone; UTC by
	// default).
	Location *time.Location
	Adaptive []engine.Adaptive
	Tenants  []TenantConfig
	// MaxSessionTTL is the longest TTL a client may ask for; a longer ask
	// gets this. Zero means DefaultMaxSessionTTL.
	MaxSessionTTL time.Duration
	// NodeRetention is how long an ended node is kept before it is
	// reclaimed. Zero means DefaultNodeRetention.
	NodeRetention time.Duration
	// Bounds are what each tenant may hold, unless its TenantConfig says
	// otherwise. All zero means DefaultBounds.
	Bounds engine.Bounds
	// Near are the near-limit thresholds in percent of a cap, ascending
	// (server/policy.go); empty means engine.DefaultNear (80 and 90).
	Near []int

	// ReapInterval is how often expired sessions, deadlines and tombstones
	// are reaped and adaptive limits decide. Zero means DefaultReapInterval.
	ReapInterval time.Duration
	// TLSReloadInterval is how often the TLS files are polled for a new
	// pair. Zero means tlsreload.DefaultInterval.
	TLSReloadInterval time.Duration
	// Admission is how calls are let into the engine, per tenant
	// (server/admission.go). Zero fields take their defaults.
	Admission AdmissionConfig
	// HA runs this governord as one of several over one PostgreSQL store:
	// a fenced leader or a hot standby (server/ha.go). Off by default.
	HA HAConfig
	// HATestHooks plant faults in a governord with ha on, for tests; nil
	// in production.
	HATestHooks *HATestHooks
	// Clock tells the engine, and the usage records, the time; nil is the
	// wall clock. Tests move it on to pass a retention without waiting.
	Clock engine.Clock
}

// TLSConfig names the server's certificate. Both empty means plaintext.
type TLSConfig struct {
	CertFile string
	KeyFile  string
}

// StoreConfig chooses the durable store.
type StoreConfig struct {
	Driver        string // sqlite | postgres | memory
	DSN           string
	SnapshotEvery int // events between snapshots; zero means DefaultSnapshotEvery
	// UsageRetention is how long usage records are kept (governor usage);
	// zero means server.DefaultUsageRetention.
	UsageRetention time.Duration
	// How long the hourly, daily and monthly rollups of usage are kept;
	// zero means server.DefaultRollupRetention's.
	UsageHourlyRetention  time.Duration
	UsageDailyRetention   time.Duration
	UsageMonthlyRetention time.Duration
}

// Caps are quotas and limits, by resource and class, and how those not
// hard are enforced (server/policy.go).
type Caps struct {
	Quotas     map[string]int64
	Limits     map[string]int64
	QuotaModes map[string]engine.CapMode
	LimitModes map[string]engine.CapMode
	// Rates are token buckets by resource (server/rates.go).
	Rates map[string]engine.Rate
	// QuotaPeriods are when quotas reset, by resource (server/periods.go).
	QuotaPeriods map[string]engine.Period
}

// TenantConfig is one tenant as the operator configures it.
type TenantConfig struct {
	Name   string
	APIKey string
	// APIKeySHA256 stands for APIKey by its SHA-256, so that the file
	// holds no secret; zero: none. At most one of the two is set.
	APIKeySHA256 [sha256.Size]byte
	Weight       int64
	Quotas       map[string]int64
	Limits       map[string]int64
	// QuotaModes and LimitModes are how the tenant's caps that are not
	// hard are enforced (server/policy.go).
	QuotaModes map[string]engine.CapMode
	LimitModes map[string]engine.CapMode
	// Minimums are the tenant's reserved minimums by lease class
	// (server/policy.go); their sum per class is within root.limits.
	Minimums map[string]engine.Minimum
	// Rates are the tenant's token buckets by resource (server/rates.go).
	Rates map[string]engine.Rate
	// QuotaPeriods are when the tenant's quotas reset (server/periods.go).
	QuotaPeriods map[string]engine.Period
	Defaults     Caps // what each new task of the tenant starts with (no modes)
	// Bounds are what the tenant may hold. All zero means Config.Bounds.
	Bounds engine.Bounds
	// MaxInFlight caps the tenant's calls holding a place in admission;
	// zero means Admission.TenantMaxInFlight. MaxQueued caps its calls
	// waiting for one; nil means Admission.TenantMaxQueued.
	MaxInFlight int
	MaxQueued   *int
	// APIRate is the tenant's api_rate on governord's API; nil: none.
	APIRate *APIRate
}

// KeyHash is the SHA-256 of the tenant's key, whichever way it was given.
func (t TenantConfig) KeyHash() ([sha256.Size]byte, bool) { return hashOf(t.APIKey, t.APIKeySHA256) }

// AdminKeyHash is the SHA-256 of the operator's key, whichever way it was
// given.
func (c Config) AdminKeyHash() ([sha256.Size]byte, bool) { return hashOf(c.AdminKey, c.AdminKeySHA256) }

func hashOf(key string, sum [sha256.Size]byte) ([sha256.Size]byte, bool) {
	if key != "" {
		return sha256.Sum256([]byte(key)), true
	}
	return sum, sum != [sha256.Size]byte{}
}

// ShortKeys names the keys given in the clear that are shorter than
// apikey.MinLen, for a warning at start.
func (c Config) ShortKeys() []string {
	var short []string
	if c.AdminKey != "" && len(c.AdminKey) < apikey.MinLen {
		short = append(short, "admin_key")
	}
	for i, t := range c.Tenants {
		if t.APIKey != "" && len(t.APIKey) < apikey.MinLen {
			short = append(short, fmt.Sprintf("tenants[%d].api_key", i))
		}
	}
	return short
}

// ConfigError names the configuration key that is wrong and why; it is
// the one config error of all Governor's files (package configfile). A
// daemon that gets one exits with status 2.
type ConfigError = configfile.Error

func keyErr(key, format string, args ...any) error { return configfile.Errorf(key, format, args...) }

// The file's shape. Kept apart from Config so that what YAML allows and what
// the daemon runs with can differ (durations as text, absent vs zero).
type fileConfig struct {
	Listen         string         `mapstructure:"listen"`
	MetricsListen  *string        `mapstructure:"metrics_listen"`
	SessionTTL     time.Duration  `mapstructure:"session_ttl"`
	MaxSessionTTL  time.Duration  `mapstructure:"max_session_ttl"`
	NodeRetention  time.Duration  `mapstructure:"node_retention"`
	TenantBounds   fileBounds     `mapstructure:"tenant_bounds"`
	AllowPlaintext bool           `mapstructure:"allow_plaintext"`
	TLS            fileTLS        `mapstructure:"tls"`
	AdminKey       string         `mapstructure:"admin_key"`
	AdminKeySHA256 string         `mapstructure:"admin_key_sha256"`
	Store          fileStore      `mapstructure:"store"`
	Root           fileCaps       `mapstructure:"root"`
	Adaptive       []fileAdaptive `mapstructure:"adaptive"`
	Tenants        []fileTenant   `mapstructure:"tenants"`
	ReapInterval   time.Duration  `mapstructure:"reap_interval"`
	HA             fileHA         `mapstructure:"ha"`
	Admission      fileAdmission  `mapstructure:"admission"`
	NearThresholds []int          `mapstructure:"near_thresholds"`
	TimeZone       string         `mapstructure:"time_zone"`
	Debug          fileDebug      `mapstructure:"debug"`
}

// fileDebug is what governord serves only to diagnose it.
type fileDebug struct {
	PProf bool `mapstructure:"pprof"`
}

type fileTLS struct {
	CertFile string `mapstructure:"cert_file"`
	KeyFile  string `mapstructure:"key_file"`
}

type fileStore struct {
	Driver        string `mapstructure:"driver"`
	DSN           string `mapstructure:"dsn"`
	SnapshotEvery int    `mapstructure:"snapshot_every"`

	UsageRetention time.Duration `mapstructure:"usage_retention"` // see StoreConfig

	UsageHourlyRetention  time.Duration `mapstructure:"usage_hourly_retention"`
	UsageDailyRetention   time.Duration `mapstructure:"usage_daily_retention"`
	UsageMonthlyRetention time.Duration `mapstructure:"usage_monthly_retention"`
}

type fileCaps struct {
	Quotas fileCapMap  `mapstructure:"quotas"`
	Limits fileCapMap  `mapstructure:"limits"`
	Rates  fileRateMap `mapstructure:"rates"`
}

// caps reads the caps at key; modes false refuses modes (defaults).
func (f fileCaps) caps(key string, modes bool) (Caps, error) {
	var c Caps
	var err error
	if c.Quotas, c.QuotaModes, err = f.Quotas.parse(key+".quotas", modes); err != nil {
		return c, err
	}
	if c.Limits, c.LimitModes, err = f.Limits.parse(key+".limits", modes); err != nil {
		return c, err
	}
	if c.QuotaPeriods, err = f.Quotas.periods(key+".quotas", true); err != nil {
		return c, err
	}
	if _, err = f.Limits.periods(key+".limits", false); err != nil {
		return c, err
	}
	c.Rates, err = f.Rates.parse(key + ".rates")
	return c, err
}

type fileAdaptive struct {
	Class       string        `mapstructure:"class"`
	TargetP95   time.Duration `mapstructure:"target_p95"`
	MaxOverload float64       `mapstructure:"max_overload"`
	MinLimit    int64         `mapstructure:"min_limit"`
	MaxLimit    int64         `mapstructure:"max_limit"`
	Interval    time.Duration `mapstructure:"interval"`
	MinSamples  int           `mapstructure:"min_samples"`
}

type fileTenant struct {
	Name     string      `mapstructure:"name"`
	APIKey   string      `mapstructure:"api_key"`
	KeyHash  string      `mapstructure:"api_key_sha256"`
	Weight   int64       `mapstructure:"weight"`
	Quotas   fileCapMap  `mapstructure:"quotas"`
	Limits   fileCapMap  `mapstructure:"limits"`
	Rates    fileRateMap `mapstructure:"rates"`
	Defaults fileCaps    `mapstructure:"defaults"`
	Bounds   fileBounds  `mapstructure:"bounds"`
	Minimums fileCapMap  `mapstructure:"minimums"`

	fileTenantAdmission `mapstructure:",squash"`
}

// fileBounds are bounds as written: a key left out takes the default.
type fileBounds struct {
	MaxSessions  *int `mapstructure:"max_sessions"`
	MaxNodes     *int `mapstructure:"max_nodes"`
	MaxWaiters   *int `mapstructure:"max_waiters"`
	MaxResources *int `mapstructure:"max_resources"`
	MaxClasses   *int `mapstructure:"max_classes"`
}

// over returns base with the keys f sets, each checked to be at least 1.
func (f fileBounds) over(key string, base engine.Bounds) (engine.Bounds, error) {
	for _, b := range []struct {
		name string
		v    *int
		dst  *int
	}{{engine.BoundSessions, f.MaxSessions, &base.Sessions}, {engine.BoundNodes, f.MaxNodes, &base.Nodes},
		{engine.BoundWaiters, f.MaxWaiters, &base.Waiters}, {engine.BoundResources, f.MaxResources, &base.Resources},
		{engine.BoundClasses, f.MaxClasses, &base.Classes}} {
		if b.v == nil {
			continue
		}
		if *b.v < 1 {
			return base, keyErr(key+"."+b.name, "%d is below 1", *b.v)
		}
		*b.dst = *b.v
	}
	return base, nil
}

// LoadConfig reads, expands and validates a governord configuration file.
// Every problem with the file is a *ConfigError naming the key.
func LoadConfig(path string) (Config, error) {
	text, err := os.ReadFile(path)
	if err != nil {
		return Config{}, &ConfigError{Key: "-config", Problem: err.Error()}
	}
	return ParseConfig(text)
}

// ParseConfig is LoadConfig for text already read.
func ParseConfig(text []byte) (Config, error) {
	doc, err := configfile.Parse(text)
	if err != nil {
		return Config{}, err
	}
	var raw fileConfig
	if err := doc.Decode(&raw); err != nil {
		return Config{}, err
	}
	cfg, err := raw.validate()
	// A value that came from ${VAR} is shown as its reference, never as
	// what it expanded to, which may be a secret.
	return cfg, doc.Redact(err)
}

func (f fileConfig) validate() (Config, error) {
	c := Config{Listen: f.Listen, MetricsListen: DefaultMetricsListen, SessionTTL: f.SessionTTL,
		AllowPlaintext: f.AllowPlaintext, TLS: TLSConfig(f.TLS), AdminKey: f.AdminKey,
		Store: StoreConfig(f.Store), ReapInterval: f.ReapInterval, Near: f.NearThresholds}
	root, err := f.Root.caps("root", true)
	if err != nil {
		return Config{}, err
	}
	c.Root = root
	if c.Location, err = parseTimeZone(f.TimeZone); err != nil {
		return Config{}, err
	}
	if err := checkNear(c.Near); err != nil {
		return Config{}, err
	}
	for _, check := range []func(*Config) error{
		f.listeners, f.sessions, f.limits, checkTLS, checkStore, f.HA.validate,
		func(c *Config) (err error) { c.Admission, err = f.Admission.parse(); return err },
		func(c *Config) error { return checkCaps("root", c.Root.Quotas, c.Root.Limits) },
		f.adaptive, f.tenants, checkMinimums,
	} {
		if err := check(&c); err != nil {
			return Config{}, err
		}
	}
	return c, nil
}

// listeners validates the gRPC and metrics addresses, with their defaults.
func (f fileConfig) listeners(c *Config) error {
	if f.MetricsListen != nil {
		c.MetricsListen = *f.MetricsListen
	}
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return keyErr("listen", "%q is not host:port", c.Listen)
	}
	if c.MetricsListen != "" {
		if _, _, err := net.SplitHostPort(c.MetricsListen); err != nil {
			return keyErr("metrics_listen", "%q is not host:port", c.MetricsListen)
		}
	}
	c.PProf = f.Debug.PProf
	if c.PProf && c.MetricsListen == "" {
		return keyErr("debug.pprof", "is served on metrics_listen, which is off")
	}
	return nil
}

// sessions validates the sessions' default TTL and the reaper's interval.
func (f fileConfig) sessions(c *Config) error {
	switch {
	case c.SessionTTL == 0:
		c.SessionTTL = DefaultSessionTTL
	case c.SessionTTL < MinSessionTTL || c.SessionTTL > MaxSessionTTL:
		return keyErr("session_ttl", "%v is outside [%v, %v]", c.SessionTTL, MinSessionTTL, MaxSessionTTL)
	}
	if c.ReapInterval < 0 {
		return keyErr("reap_interval", "%v is negative", c.ReapInterval)
	}
	return nil
}

// checkTLS refuses half a certificate, and plaintext off loopback unless
// allowed.
func checkTLS(c *Config) error {
	if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
		return keyErr("tls", "cert_file and key_file go together; one is empty")
	}
	if c.TLS.CertFile == "" && !c.AllowPlaintext && !isLoopback(c.Listen) {
		return keyErr("allow_plaintext", "listen %q is not a loopback address and tls has no certificate; configure tls or set allow_plaintext: true", c.Listen)
	}
	return nil
}

// checkStore validates the store block, with its defaults.
func checkStore(c *Config) error {
	if c.Store.Driver == "" {
		c.Store.Driver = DefaultStoreDriver
	}
	switch c.Store.Driver {
	case "sqlite", "postgres", "memory":
	default:
		return keyErr("store.driver", "%q is not sqlite, postgres or memory", c.Store.Driver)
	}
	if c.Store.DSN == "" && c.Store.Driver == "sqlite" {
		c.Store.DSN = DefaultStoreDSN
	}
	if c.Store.DSN == "" && c.Store.Driver == "postgres" {
		return keyErr("store.dsn", "postgres needs a dsn")
	}
	if c.Store.SnapshotEvery < 0 {
		return keyErr("store.snapshot_every", "%d is negative", c.Store.SnapshotEvery)
	}
	for _, r := range []struct {
		key string
		d   time.Duration
	}{{"usage_retention", c.Store.UsageRetention}, {"usage_hourly_retention", c.Store.UsageHourlyRetention},
		{"usage_daily_retention", c.Store.UsageDailyRetention}, {"usage_monthly_retention", c.Store.UsageMonthlyRetention}} {
		if r.d < 0 {
			return keyErr("store."+r.key, "%v is negative", r.d)
		}
	}
	return nil
}

// adaptive validates the adaptive limits as the engine would take them,
// one per class.
func (f fileConfig) adaptive(c *Config) error {
	for i, a := range f.Adaptive {
		key := fmt.Sprintf("adaptive[%d]", i)
		ad := engine.Adaptive{Class: a.Class, TargetP95: a.TargetP95, MaxOverload: a.MaxOverload,
			MinLimit: a.MinLimit, MaxLimit: a.MaxLimit, Interval: a.Interval, MinSamples: a.MinSamples}
		if _, err := engine.New(engine.Config{Adaptive: []engine.Adaptive{ad}}); err != nil {
			return keyErr(key, "%s", strings.TrimPrefix(err.Error(), "invalid argument: "))
		}
		for _, prev := range c.Adaptive {
			if prev.Class == a.Class {
				return keyErr(key+".class", "%q is configured twice", a.Class)
			}
		}
		c.Adaptive = append(c.Adaptive, ad)
	}
	return nil
}

// tenants validates the admin key and the tenants: names and keys unique,
// each tenant's own keys valid.
func (f fileConfig) tenants(c *Config) error {
	names, keys := map[string]bool{}, map[[sha256.Size]byte]string{}
	if err := parseKeyHash("admin_key", f.AdminKey, f.AdminKeySHA256, &c.AdminKeySHA256); err != nil {
		return err
	}
	if h, ok := c.AdminKeyHash(); ok {
		keys[h] = "admin_key"
	}
	for i, t := range f.Tenants {
		key := fmt.Sprintf("tenants[%d]", i)
		if t.Name == "" {
			return keyErr(key+".name", "is empty")
		}
		if len(t.Name) > engine.MaxNameLen {
			return keyErr(key+".name", "is longer than %d bytes", engine.MaxNameLen)
		}
		if names[t.Name] {
			return keyErr(key+".name", "%q is used by another tenant", t.Name)
		}
		names[t.Name] = true
		tc := TenantConfig{Name: t.Name, APIKey: t.APIKey}
		if err := parseKeyHash(key+".api_key", t.APIKey, t.KeyHash, &tc.APIKeySHA256); err != nil {
			return err
		}
		if h, ok := tc.KeyHash(); ok {
			if other, dup := keys[h]; dup {
				return keyErr(key+".api_key", "is the same key as %s", other)
			}
			keys[h] = key + ".api_key"
		}
		if err := t.validate(key, c.Bounds, &tc); err != nil {
			return err
		}
		c.Tenants = append(c.Tenants, tc)
	}
	return nil
}

// validate reads the tenant at key's weight, caps, minimums, bounds (over
// base) and admission keys into tc.
func (t fileTenant) validate(key string, base engine.Bounds, tc *TenantConfig) error {
	switch {
	case t.Weight == 0:
		t.Weight = 1
	case t.Weight < 0:
		return keyErr(key+".weight", "%d is below 1", t.Weight)
	}
	own, err := fileCaps{Quotas: t.Quotas, Limits: t.Limits, Rates: t.Rates}.caps(key, true)
	if err != nil {
		return err
	}
	if err := checkCaps(key, own.Quotas, own.Limits); err != nil {
		return err
	}
	defaults, err := t.Defaults.caps(key+".defaults", false)
	if err != nil {
		return err
	}
	if err := checkCaps(key+".defaults", defaults.Quotas, defaults.Limits); err != nil {
		return err
	}
	tc.Weight, tc.Quotas, tc.Limits, tc.Defaults = t.Weight, own.Quotas, own.Limits, defaults
	tc.QuotaModes, tc.LimitModes, tc.Rates, tc.QuotaPeriods = own.QuotaModes, own.LimitModes, own.Rates, own.QuotaPeriods
	if tc.Minimums, err = t.Minimums.parseMinimums(key + ".minimums"); err != nil {
		return err
	}
	if tc.Bounds, err = t.Bounds.over(key+".bounds", base); err != nil {
		return err
	}
	return t.fileTenantAdmission.parse(key, tc)
}

// parseKeyHash reads KEY_sha256, the hex SHA-256 that stands for KEY, into
// sum; giving both is an error.
func parseKeyHash(key, clear, hexSum string, sum *[sha256.Size]byte) error {
	if hexSum == "" {
		return nil
	}
	if clear != "" {
		return keyErr(key+"_sha256", "and %s are both set; give one", key)
	}
	h, err := apikey.ParseHash(hexSum)
	if err != nil {
		return keyErr(key+"_sha256", "%v", err)
	}
	*sum = h
	return nil
}

func checkCaps(key string, quotas, limits map[string]int64) error {
	for what, m := range map[string]map[string]int64{"quotas": quotas, "limits": limits} {
		for name, v := range m {
			if name == "" {
				return keyErr(key+"."+what, "has an empty name")
			}
			if v < 0 {
				return keyErr(fmt.Sprintf("%s.%s.%s", key, what, name), "%d is negative", v)
			}
		}
	}
	return nil
}

// isLoopback reports whether host:port can only be reached from this machine.
func isLoopback(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// IsConfigError reports whether err is a configuration problem (exit 2).
func IsConfigError(err error) bool { return configfile.IsError(err) }

// FillLimits gives the limits a Config built in code left zero their
// defaults, as the file's validation does.
func (c *Config) FillLimits() {
	if c.MaxSessionTTL == 0 {
		c.MaxSessionTTL = max(DefaultMaxSessionTTL, c.SessionTTL)
	}
	if c.NodeRetention == 0 {
		c.NodeRetention = DefaultNodeRetention
	}
	if c.Bounds == (engine.Bounds{}) {
		c.Bounds = DefaultBounds
	}
	c.fillAdmission()
	c.Tenants = slices.Clone(c.Tenants) // the caller's stay as they were
	for i := range c.Tenants {
		if c.Tenants[i].Bounds == (engine.Bounds{}) {
			c.Tenants[i].Bounds = c.Bounds
		}
	}
}

// limits validates what bounds governord's memory: the longest session TTL
// a client may ask for, how long ended nodes are kept, and the tenants'
// default bounds.
func (f fileConfig) limits(c *Config) error {
	switch c.MaxSessionTTL = f.MaxSessionTTL; {
	case c.MaxSessionTTL == 0:
		c.MaxSessionTTL = max(DefaultMaxSessionTTL, c.SessionTTL)
	case c.MaxSessionTTL < MinSessionTTL || c.MaxSessionTTL > MaxSessionTTL:
		return keyErr("max_session_ttl", "%v is outside [%v, %v]", c.MaxSessionTTL, MinSessionTTL, MaxSessionTTL)
	case c.MaxSessionTTL < c.SessionTTL:
		return keyErr("max_session_ttl", "%v is shorter than session_ttl (%v), the TTL a session gets by default", c.MaxSessionTTL, c.SessionTTL)
	}
	switch c.NodeRetention = f.NodeRetention; {
	case c.NodeRetention == 0:
		c.NodeRetention = DefaultNodeRetention
	case c.NodeRetention < MinNodeRetention || c.NodeRetention > MaxNodeRetention:
		return keyErr("node_retention", "%v is outside [%v, %v]", c.NodeRetention, MinNodeRetention, MaxNodeRetention)
	}
	var err error
	c.Bounds, err = f.TenantBounds.over("tenant_bounds", DefaultBounds)
	return err
}
