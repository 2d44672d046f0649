package proxyconfig

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/governor-project/governor/classify"
	"github.com/governor-project/governor/governor"
	"github.com/governor-project/governor/internal/configfile"
	"github.com/governor-project/governor/proxy/budget"
	"github.com/governor-project/governor/proxy/httpproxy"
	"github.com/governor-project/governor/proxy/intercept"
)

// Defaults for every key the config file may leave out.
const (
	DefaultListen                = "127.0.0.1:7700"
	DefaultMetricsListen         = "127.0.0.1:7701"
	DefaultWaitTimeout           = 30 * time.Second
	DefaultTunnelIdleTimeout     = 5 * time.Minute
	DefaultBodyIdleTimeout       = 5 * time.Minute
	DefaultShutdownTimeout       = 30 * time.Second
	DefaultReadHeaderTimeout     = 10 * time.Second
	DefaultIdleTimeout           = 2 * time.Minute
	DefaultDialTimeout           = 10 * time.Second
	DefaultMaxHeaderBytes        = 64 << 10
	DefaultResponseHeaderTimeout = 0 // none: a model may think for minutes before its headers
)

// DefaultDelegation is the delegation: key's default: on.
var DefaultDelegation = DelegationConfig{Enabled: true, Linger: budget.DefaultLinger, MaxBlock: budget.DefaultMaxBlock,
	MaxReservation: budget.DefaultMaxReservation, SettleEvery: budget.DefaultSettleEvery}

// What to do with HTTP traffic that no rule matches (http.unmatched).
const (
	UnmatchedForward = "forward" // forward it ungoverned, counted under rule "(unmatched)"
	UnmatchedDeny    = "deny"    // refuse it: 403, Governor-Denied: unmatched
)

// Config is governor-proxy's validated runtime configuration. LoadConfig and
// ParseConfig build it from the YAML file; tests may build one directly.
type Config struct {
	// Path is the file the configuration came from. Its rules: key is
	// watched and reloaded when the file changes; "" means the rules are
	// fixed (Rules).
	Path          string
	Governor      GovernorConfig
	Task          TaskConfig
	HTTP          HTTPConfig
	PGWire        []PGWireConfig
	MetricsListen string // "" turns the metrics and health server off
	Routes        []Route
	Delegation    DelegationConfig
	// Rules are the rules in force at start. With a Path, the file's rules
	// are loaded again when the proxy starts and then watched.
	Rules *classify.Rules
}

// GovernorConfig says how to reach governord. Empty fields fall back to the
// environment (GOVERNOR_ADDR, GOVERNOR_API_KEY; GOVERNOR_TLS and
// GOVERNOR_CA_FILE are always read from the environment).
type GovernorConfig struct {
	Addr   string
	APIKey string
}

// TaskConfig is the worker's task node, found or created under the tenant.
type TaskConfig struct {
	Name   string
	Quotas map[string]int64
	Limits map[string]int64
	// Deadline ends the task when it passes; zero means none. It is fixed
	// when the configuration is loaded (a relative deadline counts from
	// then), so a task created again after a lost session keeps it.
	Deadline time.Time
	// SubtaskIdle is how long a subtask (a username's, an
	// application_name's) may hold and run nothing before it is closed;
	// its next use creates it again. Zero: budget.DefaultSubtaskIdle.
	SubtaskIdle time.Duration
}

// HTTPConfig is the HTTP proxy's listener and its bounds.
type HTTPConfig struct {
	Listen            string
	WaitTimeout       time.Duration // the longest wait for a lease; then 503 wait-timeout
	Unmatched         string        // UnmatchedForward or UnmatchedDeny
	TunnelIdleTimeout time.Duration // a CONNECT tunnel idle this long in both directions is closed
	// BodyIdleTimeout ends a plain HTTP exchange whose client neither sends
	// a byte of its request body nor takes a byte of the response for this
	// long, so a stalled client cannot hold a lease forever. 0 turns it off.
	BodyIdleTimeout       time.Duration
	ShutdownTimeout       time.Duration // how long in-flight requests may finish on SIGTERM
	AllowLinkLocal        bool          // allow 169.254.0.0/16, fe80::/10 and fd00:ec2::254
	ReadHeaderTimeout     time.Duration // a client must send its request headers within this
	MaxHeaderBytes        int           // the largest request header block accepted
	IdleTimeout           time.Duration // an idle keep-alive client connection is closed after this
	DialTimeout           time.Duration // connecting to an upstream; over it is 504
	ResponseHeaderTimeout time.Duration // waiting for an upstream's headers; 0 = no limit; over it is 504
	// RateLimitHeaders adds the IETF RateLimit headers and Governor-Warning
	// to governed responses, read from governord (one call per response).
	RateLimitHeaders bool
	// Shadow puts every rule in dry run: the file's top-level mode: shadow
	// (docs/policy.md).
	Shadow bool

	// AllowRemoteClients lets Listen be an address other hosts reach; then
	// Password is required, or anyone who can reach the port could spend
	// the tenant's budgets and reach what the sidecar reaches.
	AllowRemoteClients bool
	// Password, when not "", must be the password of every request's
	// Proxy-Authorization (407 otherwise).
	Password string
	// AllowTargets lifts the refusal of loopback and link-local targets
	// they cover, and of governord's for an entry naming its port.
	AllowTargets []httpproxy.Target
	// ConnectPorts are the ports a CONNECT may reach. Nil: 443 only.
	ConnectPorts []httpproxy.PortRange
	// Intercept turns interception on for the hosts it lists.
	Intercept InterceptConfig
}

// InterceptConfig is http.intercept: the hosts whose CONNECT tunnels the
// sidecar terminates, with a certificate from its CA, so that every
// request inside is governed as plain HTTP is. Off while Hosts is empty.
type InterceptConfig struct {
	Hosts *intercept.Hosts
	// CACert and CAKey are the CA's PEM files, watched and reloaded.
	CACert, CAKey string
	// UpstreamCAFile, when set, holds more roots to verify upstreams with
	// (PEM); the system's roots are always trusted too.
	UpstreamCAFile string
	// MaxLeaves bounds the leaf certificates kept. Zero:
	// intercept.DefaultMaxLeaves.
	MaxLeaves int
}

// On reports whether any host is intercepted.
func (c InterceptConfig) On() bool { return c.Hosts != nil && c.Hosts.Len() > 0 }

// PGWireConfig is one PostgreSQL wire listener, served by package pgwire
// (proxy/pgwire.go) under the same rules, session and task as the HTTP side.
type PGWireConfig struct {
	Listen   string
	Upstream string
	// TaskFrom names where a connection's subtask comes from: "" charges the
	// worker's task itself; "application_name" charges a subtask named after
	// the client's application_name, as Proxy-Authorization's username does
	// for HTTP.
	TaskFrom string
	// WaitTimeout is the longest a transaction waits for its lease; then
	// SQLSTATE 55P03. Zero: http.wait_timeout.
	WaitTimeout time.Duration
	// TLS terminates a client's SSLRequest with this certificate. Both
	// empty: SSLRequest is answered 'N' (plain text on the client leg).
	TLS TLSFiles
	// UpstreamTLS makes the leg to the server TLS.
	UpstreamTLS UpstreamTLS
	// MaxMessageBytes caps one protocol message after login, either way (a
	// statement, a row, a COPY chunk); a larger one ends the connection
	// with FATAL 08P01. Before login a password or SASL message is held to
	// PostgreSQL's own 65,535 bytes whatever this says.
	MaxMessageBytes int
	// CapNotices sends a NOTICE the first time a transaction runs near or
	// over a cap over it, read from governord (one call per governed
	// statement).
	CapNotices bool
}

// The range pgwire[i].max_message_bytes may take: PostgreSQL sends and takes
// no message over 1 GiB, and below 64 KiB ordinary statements and rows stop
// fitting.
const (
	MinPGWireMaxMessageBytes = 64 << 10
	MaxPGWireMaxMessageBytes = 1 << 30
	// DefaultPGWireMaxMessageBytes is pgwire.DefaultMaxMessageSize, written
	// out so that a reader of the file does not link the wire proxy (a
	// test in package proxy holds the two equal).
	DefaultPGWireMaxMessageBytes = 256 << 20
)

// TLSFiles are a PEM certificate (chain) and its key, read at start.
type TLSFiles struct {
	CertFile string
	KeyFile  string
}

// UpstreamTLS is the TLS of a pgwire listener's leg to its server.
type UpstreamTLS struct {
	Enabled bool
	// CAFile, when set, is the only CA trusted (PEM); "" trusts the system
	// roots.
	CAFile string
	// ServerName is the name the server's certificate must show; "" is
	// the upstream's host.
	ServerName string
}

// Route is a base-URL route (httpproxy.Route).
type Route = httpproxy.Route

// DelegationConfig says how the sidecar holds budgets governord delegates
// to it (see package budget).
type DelegationConfig struct {
	// Enabled grants from blocks of slots and reservations of quota held
	// locally. Off: one governord call per request or transaction.
	Enabled bool
	// Linger is how long idle slots and unspent units are kept without
	// demand before they go back.
	Linger time.Duration
	// MaxBlock is the most slots of one class one node's block holds.
	MaxBlock int64
	// MaxReservation is the most units of one resource one node reserves.
	MaxReservation int64
	// SettleEvery is how often spent units are reported to governord.
	SettleEvery time.Duration
}

// ProxyConfig is what the HTTP side runs with; governord are governord's
// addresses, refused as targets.
func (h HTTPConfig) ProxyConfig(governord []string) httpproxy.Config {
	return httpproxy.Config{WaitTimeout: h.WaitTimeout, DenyUnmatched: h.Unmatched == UnmatchedDeny,
		TunnelIdleTimeout: h.TunnelIdleTimeout, BodyIdleTimeout: h.BodyIdleTimeout, AllowLinkLocal: h.AllowLinkLocal,
		ReadHeaderTimeout: h.ReadHeaderTimeout, MaxHeaderBytes: h.MaxHeaderBytes, IdleTimeout: h.IdleTimeout,
		DialTimeout: h.DialTimeout, ResponseHeaderTimeout: h.ResponseHeaderTimeout,
		AllowTargets: h.AllowTargets, ConnectPorts: h.ConnectPorts, Password: h.Password, Governord: governord,
		RateLimitHeaders: h.RateLimitHeaders, Shadow: h.Shadow}
}

// ConfigError names the configuration key that is wrong and why; it is
// the one config error of all Governor's files (package configfile). The
// sidecar exits with status 2 on one.
type ConfigError = configfile.Error

// IsConfigError reports whether err is a configuration problem (exit 2).
func IsConfigError(err error) bool { return configfile.IsError(err) }

func keyErr(key, format string, args ...any) error { return configfile.Errorf(key, format, args...) }

// The file's shape, kept apart from Config: what YAML allows (absent vs
// zero, a deadline as a duration or a time) differs from what the proxy runs
// with. Keys are strict: package configfile refuses any key not listed here.
type fileConfig struct {
	Governor      *fileGovernor   `yaml:"governor"`
	Task          *fileTask       `yaml:"task"`
	HTTP          *fileHTTP       `yaml:"http"`
	PGWire        []filePGWire    `yaml:"pgwire"`
	MetricsListen *string         `yaml:"metrics_listen"`
	Routes        []fileRoute     `yaml:"routes"`
	Delegation    *fileDelegation `yaml:"delegation"`
	Rules         skipped         `yaml:"rules"` // parsed by classify
	Mode          *string         `yaml:"mode"`
}

type fileGovernor struct {
	Addr   *string `yaml:"addr"`
	APIKey *string `yaml:"api_key"`
}

type fileTask struct {
	Name     *string          `yaml:"name"`
	Quotas   map[string]int64 `yaml:"quotas"`
	Limits   map[string]int64 `yaml:"limits"`
	Deadline *deadline        `yaml:"deadline"`
	// SubtaskIdle: see TaskConfig.
	SubtaskIdle *time.Duration `yaml:"subtask_idle"`
}

type fileHTTP struct {
	Listen                *string        `yaml:"listen"`
	WaitTimeout           *time.Duration `yaml:"wait_timeout"`
	Unmatched             *string        `yaml:"unmatched"`
	TunnelIdleTimeout     *time.Duration `yaml:"tunnel_idle_timeout"`
	BodyIdleTimeout       *time.Duration `yaml:"body_idle_timeout"`
	ShutdownTimeout       *time.Duration `yaml:"shutdown_timeout"`
	AllowLinkLocal        *bool          `yaml:"allow_link_local"`
	ReadHeaderTimeout     *time.Duration `yaml:"read_header_timeout"`
	MaxHeaderBytes        *int           `yaml:"max_header_bytes"`
	IdleTimeout           *time.Duration `yaml:"idle_timeout"`
	DialTimeout           *time.Duration `yaml:"dial_timeout"`
	ResponseHeaderTimeout *time.Duration `yaml:"response_header_timeout"`
	RateLimitHeaders      *bool          `yaml:"ratelimit_headers"`
	AllowRemoteClients    *bool          `yaml:"allow_remote_clients"`
	Password              *string        `yaml:"password"`
	AllowTargets          []string       `yaml:"allow_targets"`
	ConnectPorts          *[]string      `yaml:"connect_ports"`
	Intercept             *fileIntercept `yaml:"intercept"`
}

type fileIntercept struct {
	Hosts          []string `yaml:"hosts"`
	CACert         *string  `yaml:"ca_cert"`
	CAKey          *string  `yaml:"ca_key"`
	UpstreamCAFile *string  `yaml:"upstream_ca_file"`
	MaxLeaves      *int     `yaml:"max_leaves"`
}

type filePGWire struct {
	Listen      *string          `yaml:"listen"`
	Upstream    *string          `yaml:"upstream"`
	TaskFrom    *string          `yaml:"task_from"`
	WaitTimeout *time.Duration   `yaml:"wait_timeout"`
	TLS         *fileTLS         `yaml:"tls"`
	UpstreamTLS *fileUpstreamTLS `yaml:"upstream_tls"`
	MaxMessage  *int             `yaml:"max_message_bytes"`
	CapNotices  *bool            `yaml:"cap_notices"`
}

type fileTLS struct {
	CertFile *string `yaml:"cert_file"`
	KeyFile  *string `yaml:"key_file"`
}

type fileUpstreamTLS struct {
	Enabled    *bool   `yaml:"enabled"`
	CAFile     *string `yaml:"ca_file"`
	ServerName *string `yaml:"server_name"`
}

type fileDelegation struct {
	Enabled        *bool          `yaml:"enabled"`
	Linger         *time.Duration `yaml:"linger"`
	MaxBlock       *int64         `yaml:"max_block"`
	MaxReservation *int64         `yaml:"max_reservation"`
	SettleEvery    *time.Duration `yaml:"settle_every"`
}

type fileRoute struct {
	Prefix   *string `yaml:"prefix"`
	Upstream *string `yaml:"upstream"`
}

// skipped accepts any value: the key is read by another parser.
type skipped struct{}

func (*skipped) UnmarshalYAML(*yaml.Node) error { return nil }

// deadline is a duration from when the config is loaded ("2h") or an RFC
// 3339 time ("2030-01-02T15:04:05Z").
type deadline struct {
	after time.Duration
	at    time.Time
}

func (d *deadline) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return errors.New("want a duration (2h) or an RFC 3339 time")
	}
	if v, err := time.ParseDuration(n.Value); err == nil {
		if v <= 0 {
			return fmt.Errorf("%q is not a positive duration", n.Value)
		}
		d.after = v
		return nil
	}
	t, err := time.Parse(time.RFC3339, n.Value)
	if err != nil {
		return fmt.Errorf("%q is neither a duration (2h) nor an RFC 3339 time", n.Value)
	}
	d.at = t
	return nil
}

// LoadConfig reads, expands (${VAR}) and validates a governor-proxy
// configuration file, rules included. Every problem is a *ConfigError naming
// the key, e.g. "http.wait_timeout" or "rules[2].match.method".
func LoadConfig(path string) (Config, error) { return loadConfig(path, true) }

// ParseConfig is LoadConfig for text already read. The result has no Path,
// so its rules are not reloaded.
func ParseConfig(text []byte) (Config, error) { return parseConfig(text, true) }

// LoadClassification reads a configuration file for `governor explain`: all
// of it is parsed and every key's shape checked, but what only a running
// sidecar needs (the API key, the task's name) may be missing, so that it
// works without the worker's environment.
func LoadClassification(path string) (Config, error) { return loadConfig(path, false) }

func loadConfig(path string, complete bool) (Config, error) {
	text, err := os.ReadFile(path)
	if err != nil {
		return Config{}, &ConfigError{Key: "-config", Problem: err.Error()}
	}
	cfg, err := parseConfig(text, complete)
	if err != nil {
		return Config{}, err
	}
	cfg.Path = path
	return cfg, nil
}

func parseConfig(text []byte, complete bool) (Config, error) {
	doc, err := configfile.Parse(text)
	if err != nil {
		return Config{}, err
	}
	if doc.Empty() {
		return Config{}, keyErr(configfile.FileKey, "the document is empty")
	}
	var raw fileConfig
	if err := doc.Decode(&raw); err != nil {
		return Config{}, err
	}
	rules, err := classify.Parse(text)
	if err != nil {
		return Config{}, err
	}
	cfg, err := raw.validate(time.Now(), complete)
	if err != nil {
		// A value that came from ${VAR} is shown as its reference, never
		// as what it expanded to, which may be a secret.
		return Config{}, doc.Redact(err)
	}
	cfg.Rules = rules
	return cfg, nil
}

func (f *fileConfig) validate(now time.Time, complete bool) (Config, error) {
	c := Config{MetricsListen: DefaultMetricsListen, HTTP: HTTPConfig{
		Listen: DefaultListen, WaitTimeout: DefaultWaitTimeout, Unmatched: UnmatchedForward,
		TunnelIdleTimeout: DefaultTunnelIdleTimeout, BodyIdleTimeout: DefaultBodyIdleTimeout, ShutdownTimeout: DefaultShutdownTimeout,
		ReadHeaderTimeout: DefaultReadHeaderTimeout, MaxHeaderBytes: DefaultMaxHeaderBytes,
		IdleTimeout: DefaultIdleTimeout, DialTimeout: DefaultDialTimeout,
		ResponseHeaderTimeout: DefaultResponseHeaderTimeout,
	}}
	if g := f.Governor; g != nil {
		c.Governor.Addr = deref(g.Addr)
		c.Governor.APIKey = deref(g.APIKey)
	}
	var err error
	if c.Task, err = f.task(now); err != nil {
		return Config{}, err
	}
	if m := f.Mode; m != nil {
		switch *m {
		case "enforce":
		case "shadow":
			c.HTTP.Shadow = true
		default:
			return Config{}, keyErr("mode", "%q is not enforce or shadow", *m)
		}
	}
	if err := f.http(&c.HTTP); err != nil {
		return Config{}, err
	}
	set(&c.MetricsListen, f.MetricsListen)
	c.Delegation = DefaultDelegation
	if d := f.Delegation; d != nil {
		set(&c.Delegation.Enabled, d.Enabled)
		set(&c.Delegation.Linger, d.Linger)
		set(&c.Delegation.MaxBlock, d.MaxBlock)
		set(&c.Delegation.MaxReservation, d.MaxReservation)
		set(&c.Delegation.SettleEvery, d.SettleEvery)
	}
	if c.PGWire, err = f.pgwire(c.HTTP.WaitTimeout); err != nil {
		return Config{}, err
	}
	if c.Routes, err = f.routes(); err != nil {
		return Config{}, err
	}
	if err := c.validate(complete); err != nil {
		return Config{}, err
	}
	return c, nil
}

// task is the task: section, with a deadline given as a duration counted
// from now.
func (f *fileConfig) task(now time.Time) (TaskConfig, error) {
	t := f.Task
	if t == nil {
		return TaskConfig{}, nil
	}
	c := TaskConfig{Name: deref(t.Name), Quotas: t.Quotas, Limits: t.Limits, SubtaskIdle: deref(t.SubtaskIdle)}
	if t.SubtaskIdle != nil && *t.SubtaskIdle < time.Second {
		return TaskConfig{}, keyErr("task.subtask_idle", "%v is under 1s", *t.SubtaskIdle)
	}
	if d := t.Deadline; d != nil {
		c.Deadline = d.at
		if d.after > 0 {
			c.Deadline = now.Add(d.after)
		}
	}
	return c, nil
}

// http sets what the http: section gives over c's defaults.
func (f *fileConfig) http(c *HTTPConfig) error {
	h := f.HTTP
	if h == nil {
		return nil
	}
	set(&c.Listen, h.Listen)
	set(&c.WaitTimeout, h.WaitTimeout)
	set(&c.Unmatched, h.Unmatched)
	set(&c.TunnelIdleTimeout, h.TunnelIdleTimeout)
	set(&c.BodyIdleTimeout, h.BodyIdleTimeout)
	set(&c.ShutdownTimeout, h.ShutdownTimeout)
	set(&c.AllowLinkLocal, h.AllowLinkLocal)
	set(&c.RateLimitHeaders, h.RateLimitHeaders)
	set(&c.ReadHeaderTimeout, h.ReadHeaderTimeout)
	set(&c.MaxHeaderBytes, h.MaxHeaderBytes)
	set(&c.IdleTimeout, h.IdleTimeout)
	set(&c.DialTimeout, h.DialTimeout)
	set(&c.ResponseHeaderTimeout, h.ResponseHeaderTimeout)
	set(&c.AllowRemoteClients, h.AllowRemoteClients)
	set(&c.Password, h.Password)
	if err := c.parseTargets(h.AllowTargets, h.ConnectPorts); err != nil {
		return err
	}
	return c.Intercept.parse(h.Intercept)
}

// pgwire is the pgwire: listeners, each waiting wait unless it says
// otherwise.
func (f *fileConfig) pgwire(wait time.Duration) ([]PGWireConfig, error) {
	var out []PGWireConfig
	for i, p := range f.PGWire {
		key := fmt.Sprintf("pgwire[%d]", i)
		c := PGWireConfig{Listen: deref(p.Listen), Upstream: deref(p.Upstream), TaskFrom: deref(p.TaskFrom),
			WaitTimeout: wait, MaxMessageBytes: DefaultPGWireMaxMessageBytes}
		set(&c.WaitTimeout, p.WaitTimeout)
		set(&c.MaxMessageBytes, p.MaxMessage)
		set(&c.CapNotices, p.CapNotices)
		if t := p.TLS; t != nil {
			c.TLS = TLSFiles{CertFile: deref(t.CertFile), KeyFile: deref(t.KeyFile)}
		}
		if u := p.UpstreamTLS; u != nil {
			c.UpstreamTLS = UpstreamTLS{Enabled: deref(u.Enabled), CAFile: deref(u.CAFile), ServerName: deref(u.ServerName)}
		}
		if c.TaskFrom != "" && c.TaskFrom != "application_name" {
			return nil, keyErr(key+".task_from", "%q is not \"application_name\" (or empty, for the task itself)", c.TaskFrom)
		}
		if p.Listen == nil {
			return nil, keyErr(key+".listen", "is missing")
		}
		if p.Upstream == nil {
			return nil, keyErr(key+".upstream", "is missing")
		}
		out = append(out, c)
	}
	return out, nil
}

// routes is the routes: section, each route's prefix and base URL checked.
func (f *fileConfig) routes() ([]Route, error) {
	var out []Route
	for i, r := range f.Routes {
		key := fmt.Sprintf("routes[%d]", i)
		if r.Prefix == nil {
			return nil, keyErr(key+".prefix", "is missing")
		}
		if r.Upstream == nil {
			return nil, keyErr(key+".upstream", "is missing")
		}
		route, err := parseRoute(key, *r.Prefix, *r.Upstream)
		if err != nil {
			return nil, err
		}
		out = append(out, route)
	}
	return out, nil
}

func parseRoute(key, prefix, upstream string) (Route, error) {
	if !strings.HasPrefix(prefix, "/") || strings.ContainsAny(prefix, "?# ") {
		return Route{}, keyErr(key+".prefix", "%q is not a path prefix like /openai/", prefix)
	}
	if !strings.HasSuffix(prefix, "/") {
		prefix += "/" // "/openai" must not catch "/openaix"
	}
	u, err := url.Parse(upstream)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
		u.RawQuery != "" || u.Fragment != "" {
		return Route{}, keyErr(key+".upstream", "%q is not an http:// or https:// base URL with a host (and no user, query or fragment)", upstream)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	u.RawPath = ""
	return Route{Prefix: prefix, Upstream: u}, nil
}

// Validate checks a Config built in code as ParseConfig checks a file.
func (c *Config) Validate() error { return c.validate(true) }

func (c *Config) validate(complete bool) error {
	for _, check := range []func() error{
		func() error { return c.Task.validate(complete) },
		func() error { return c.validateGovernor(complete) },
		c.HTTP.validate,
		func() error {
			if c.MetricsListen == "" {
				return nil
			}
			return checkHostPort("metrics_listen", c.MetricsListen)
		},
		c.validatePGWire,
		c.Delegation.validate,
		c.validateRoutes,
	} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

func (t *TaskConfig) validate(complete bool) error {
	if t.Name == "" && complete {
		return keyErr("task.name", "is empty; name the worker's task, usually ${POD_NAME}")
	}
	if len(t.Name) > 255 {
		return keyErr("task.name", "is longer than 255 bytes")
	}
	for what, m := range map[string]map[string]int64{"task.quotas": t.Quotas, "task.limits": t.Limits} {
		for k, v := range m {
			if k == "" {
				return keyErr(what, "has an empty name")
			}
			if v < 0 {
				return keyErr(what+"."+k, "%d is negative", v)
			}
		}
	}
	return nil
}

// validateGovernor checks how governord is reached: the key, and the
// environment the SDK reads.
func (c *Config) validateGovernor(complete bool) error {
	if c.Governor.APIKey == "" && os.Getenv(governor.EnvAPIKey) == "" && complete {
		return keyErr("governor.api_key", "is empty and %s is not set", governor.EnvAPIKey)
	}
	if v, ok := os.LookupEnv(governor.EnvTLS); ok && v != "" && v != "true" && v != "false" && v != "1" && v != "0" {
		return keyErr(governor.EnvTLS, "%q: want true, false, 1 or 0", v)
	}
	if f := os.Getenv(governor.EnvCAFile); f != "" {
		if _, err := os.Stat(f); err != nil {
			return keyErr(governor.EnvCAFile, "%v", err)
		}
	}
	return nil
}

func (h *HTTPConfig) validate() error {
	if err := checkHostPort("http.listen", h.Listen); err != nil {
		return err
	}
	if err := h.checkExposure(); err != nil {
		return err
	}
	if h.Unmatched != UnmatchedForward && h.Unmatched != UnmatchedDeny {
		return keyErr("http.unmatched", "%q is not %s or %s", h.Unmatched, UnmatchedForward, UnmatchedDeny)
	}
	for _, d := range []struct {
		key      string
		v        time.Duration
		zeroOkay bool
	}{
		{"http.wait_timeout", h.WaitTimeout, false},
		{"http.tunnel_idle_timeout", h.TunnelIdleTimeout, false},
		{"http.body_idle_timeout", h.BodyIdleTimeout, true},
		{"http.shutdown_timeout", h.ShutdownTimeout, true},
		{"http.read_header_timeout", h.ReadHeaderTimeout, false},
		{"http.idle_timeout", h.IdleTimeout, false},
		{"http.dial_timeout", h.DialTimeout, false},
		{"http.response_header_timeout", h.ResponseHeaderTimeout, true},
	} {
		if d.v < 0 || (d.v == 0 && !d.zeroOkay) {
			return keyErr(d.key, "%v is not a positive duration", d.v)
		}
	}
	if h.MaxHeaderBytes < 1024 || h.MaxHeaderBytes > 16<<20 {
		return keyErr("http.max_header_bytes", "%d is outside [1024, %d]", h.MaxHeaderBytes, 16<<20)
	}
	return nil
}

func (c *Config) validatePGWire() error {
	for i, p := range c.PGWire {
		key := fmt.Sprintf("pgwire[%d]", i)
		if err := checkHostPort(key+".listen", p.Listen); err != nil {
			return err
		}
		if err := checkHostPort(key+".upstream", p.Upstream); err != nil {
			return err
		}
		if p.WaitTimeout < 0 {
			return keyErr(key+".wait_timeout", "%v is not a positive duration", p.WaitTimeout)
		}
		if p.MaxMessageBytes < MinPGWireMaxMessageBytes || p.MaxMessageBytes > MaxPGWireMaxMessageBytes {
			return keyErr(key+".max_message_bytes", "%d is outside [%d, %d]", p.MaxMessageBytes,
				MinPGWireMaxMessageBytes, MaxPGWireMaxMessageBytes)
		}
		if (p.TLS.CertFile == "") != (p.TLS.KeyFile == "") {
			return keyErr(key+".tls", "cert_file and key_file go together: give both, or neither for no TLS on the client leg")
		}
		if u := p.UpstreamTLS; !u.Enabled && (u.CAFile != "" || u.ServerName != "") {
			return keyErr(key+".upstream_tls.enabled", "is false, but ca_file or server_name is set; set enabled: true for TLS to the server")
		}
	}
	return nil
}

func (d *DelegationConfig) validate() error {
	if !d.Enabled {
		return nil
	}
	for _, v := range []struct {
		key string
		bad bool
	}{
		{"delegation.linger", d.Linger <= 0},
		{"delegation.settle_every", d.SettleEvery <= 0},
		{"delegation.max_block", d.MaxBlock < 1},
		{"delegation.max_reservation", d.MaxReservation < 1},
	} {
		if v.bad {
			return keyErr(v.key, "must be positive while delegation is enabled")
		}
	}
	return nil
}

func (c *Config) validateRoutes() error {
	seen := map[string]int{}
	for i, r := range c.Routes {
		if j, dup := seen[r.Prefix]; dup {
			return keyErr(fmt.Sprintf("routes[%d].prefix", i), "%q is the prefix of routes[%d] too", r.Prefix, j)
		}
		seen[r.Prefix] = i
		if r.Upstream == nil {
			return keyErr(fmt.Sprintf("routes[%d].upstream", i), "is missing")
		}
	}
	return nil
}

// GovernordAddrs are the host:port pairs governord is reached at, as the
// SDK will dial them (governor.addr, else GOVERNOR_ADDR, else the default;
// a comma-separated list with standbys; a gRPC scheme such as dns:/// is
// dropped). The HTTP side refuses them as targets.
func (c *Config) GovernordAddrs() []string {
	addr := c.Governor.Addr
	if addr == "" {
		addr = os.Getenv(governor.EnvAddr)
	}
	if addr == "" {
		addr = governor.DefaultAddr
	}
	var out []string
	for _, a := range strings.Split(addr, ",") {
		a = strings.TrimSpace(a)
		if i := strings.Index(a, ":///"); i >= 0 {
			a = a[i+len(":///"):]
		}
		if _, _, err := net.SplitHostPort(a); err == nil {
			out = append(out, a)
		}
	}
	return out
}

// parseTargets reads http.allow_targets and http.connect_ports.
func (h *HTTPConfig) parseTargets(allow []string, ports *[]string) error {
	for i, a := range allow {
		t, err := httpproxy.ParseTarget(a)
		if err != nil {
			return keyErr(fmt.Sprintf("http.allow_targets[%d]", i), "%v", err)
		}
		h.AllowTargets = append(h.AllowTargets, t...)
	}
	if ports != nil {
		h.ConnectPorts = []httpproxy.PortRange{} // given, even if empty: no CONNECT at all
		for i, s := range *ports {
			r, err := httpproxy.ParsePortRange(s)
			if err != nil {
				return keyErr(fmt.Sprintf("http.connect_ports[%d]", i), "%v", err)
			}
			h.ConnectPorts = append(h.ConnectPorts, r)
		}
	}
	return nil
}

// parse reads http.intercept. The CA itself is loaded and checked when
// the sidecar starts (loadInterception).
func (c *InterceptConfig) parse(f *fileIntercept) error {
	if f == nil {
		return nil
	}
	hosts, err := intercept.ParseHosts(f.Hosts)
	if err != nil {
		return keyErr("http.intercept.hosts", "%v", err)
	}
	c.Hosts = hosts
	c.CACert, c.CAKey, c.UpstreamCAFile = deref(f.CACert), deref(f.CAKey), deref(f.UpstreamCAFile)
	if f.MaxLeaves != nil {
		if *f.MaxLeaves < 1 || *f.MaxLeaves > maxInterceptLeaves {
			return keyErr("http.intercept.max_leaves", "%d is outside [1, %d]", *f.MaxLeaves, maxInterceptLeaves)
		}
		c.MaxLeaves = *f.MaxLeaves
	}
	if !c.On() {
		return nil
	}
	if c.CACert == "" {
		return keyErr("http.intercept.ca_cert", "is empty: interception needs a CA (governor ca create -out DIR writes one)")
	}
	if c.CAKey == "" {
		return keyErr("http.intercept.ca_key", "is empty: interception needs the CA's key")
	}
	return nil
}

// maxInterceptLeaves bounds http.intercept.max_leaves: a leaf and its key
// hold a few KiB.
const maxInterceptLeaves = 1 << 20

// checkExposure refuses an open proxy: a listen address other hosts reach
// needs http.allow_remote_clients, and that needs a password.
func (h *HTTPConfig) checkExposure() error {
	if !h.AllowRemoteClients && !isLoopbackListen(h.Listen) {
		return keyErr("http.listen", "%q is not a loopback address: other hosts could use the proxy, spend the tenant's budgets and reach "+
			"whatever the sidecar reaches; listen on 127.0.0.1, or set http.allow_remote_clients: true with an http.password", h.Listen)
	}
	if h.AllowRemoteClients && h.Password == "" {
		return keyErr("http.password", "is empty, and http.allow_remote_clients is true: remote clients must send a password "+
			"in Proxy-Authorization (http://subtask:PASSWORD@host:port); name one, e.g. password: ${GOVERNOR_PROXY_PASSWORD}")
	}
	return nil
}

// isLoopbackListen reports whether a listen address is reached only from
// this host: a loopback address or localhost (an empty host, 0.0.0.0 or ::
// listen on every address).
func isLoopbackListen(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	if strings.EqualFold(strings.TrimSuffix(host, "."), "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

func checkHostPort(key, v string) error {
	if _, _, err := net.SplitHostPort(v); err != nil {
		return keyErr(key, "%q is not host:port", v)
	}
	return nil
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

func set[T any](dst *T, p *T) {
	if p != nil {
		*dst = *p
	}
}
