package governor

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// The environment every Governor client reads (README, "Configuration and contract").
const (
	EnvAddr   = "GOVERNOR_ADDR"
	EnvAPIKey = "GOVERNOR_API_KEY"
	EnvTLS    = "GOVERNOR_TLS"
	EnvCAFile = "GOVERNOR_CA_FILE"
)

// DefaultAddr is where governord listens unless GOVERNOR_ADDR says otherwise.
const DefaultAddr = "127.0.0.1:7600"

// Conventional class and resource names used by the helpers.
const (
	// ClassHTTP is the lease class Transport holds for each request.
	ClassHTTP = "http"
	// ResourceHTTP is the quota Transport charges one unit of per request.
	ResourceHTTP = "http"
	// ResourceRetry is the quota Retry charges one unit of per retry.
	ResourceRetry = "retry"
	// ClassAgents is a conventional lease class for fanning out to
	// sub-agents with NewGroup.
	ClassAgents = "agents"
)

// An Option changes how Dial connects. Options override the environment.
type Option func(*config)

type config struct {
	addr     string
	apiKey   string
	tls      bool
	caFile   string
	ttl      time.Duration
	grpcOpts []grpc.DialOption
	logger   *slog.Logger
	// unavailableFor bounds how long one call keeps retrying UNAVAILABLE
	// unless a standby answers; zero: until its context or the session
	// ends.
	unavailableFor time.Duration
}

// WithAddr sets governord's address, overriding GOVERNOR_ADDR. Any target
// grpc.NewClient accepts works. A comma-separated list names governords
// that run as a leader and standbys: calls go to the leader, found by
// trying the addresses and following a standby's hint, and the session
// moves with it when another takes over.
func WithAddr(addr string) Option { return func(c *config) { c.addr = addr } }

// WithAPIKey sets the tenant's API key, overriding GOVERNOR_API_KEY.
func WithAPIKey(key string) Option { return func(c *config) { c.apiKey = key } }

// WithTLS turns TLS on or off, overriding GOVERNOR_TLS. With TLS on and no
// CA file the system roots are trusted. A CA file turns TLS on whatever this
// says: it is never dropped in favour of plaintext.
func WithTLS(on bool) Option { return func(c *config) { c.tls = on } }

// WithCAFile turns TLS on and trusts only the certificates in the PEM file,
// overriding GOVERNOR_CA_FILE.
func WithCAFile(path string) Option { return func(c *config) { c.caFile = path } }

// WithTTL asks for a session TTL. The server may clamp it; the client uses
// the TTL the server granted. Zero means the server's default.
func WithTTL(ttl time.Duration) Option { return func(c *config) { c.ttl = ttl } }

// WithGRPCOptions adds options to the gRPC connection, after the SDK's own
// (credentials and interceptors), so a later credentials option wins.
func WithGRPCOptions(opts ...grpc.DialOption) Option {
	return func(c *config) { c.grpcOpts = append(c.grpcOpts, opts...) }
}

// WithUnavailableRetry bounds how long one call keeps trying again while
// governord answers UNAVAILABLE (it retries, with backoff, under the same
// request id). By default a call keeps trying until its context ends or the
// session is given up. A proxy that would rather fail closed at once than
// hold a request for its whole wait sets a short bound. A standby's answer
// lifts the bound for the call: governord is failing over to it, not gone,
// and the call keeps trying, so that an Acquire waiting when the leader
// died queues again at the new one, until ctx ends or the session is given
// up, as without the bound (the standby refuses heartbeats too, so a
// failover that never ends costs the session at its local deadline). Calls
// that give back (Release, a Reserve or ResizeBlock that only settles or
// returns) are not bounded by it: failed fast, they would leave what they
// free held until the session ends.
func WithUnavailableRetry(d time.Duration) Option { return func(c *config) { c.unavailableFor = d } }

// WithLogger sets where the client logs failed heartbeats and a lost
// session. The default discards.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// loadConfig reads the environment, then applies the options over it.
func loadConfig(opts []Option) (*config, error) {
	c := &config{addr: DefaultAddr, apiKey: os.Getenv(EnvAPIKey), caFile: os.Getenv(EnvCAFile)}
	if v := os.Getenv(EnvAddr); v != "" {
		c.addr = v
	}
	if v, ok := os.LookupEnv(EnvTLS); ok && v != "" {
		switch v {
		case "true", "1":
			c.tls = true
		case "false", "0":
			c.tls = false
		default:
			return nil, fmt.Errorf("governor: %w: %s=%q: want true, false, 1 or 0", ErrInvalidArgument, EnvTLS, v)
		}
	}
	for _, o := range opts {
		o(c)
	}
	if c.addr == "" {
		return nil, fmt.Errorf("governor: %w: empty address (set %s)", ErrInvalidArgument, EnvAddr)
	}
	if c.apiKey == "" {
		return nil, fmt.Errorf("governor: %w: no API key (set %s)", ErrUnauthenticated, EnvAPIKey)
	}
	if c.ttl < 0 {
		return nil, fmt.Errorf("governor: %w: negative TTL %v", ErrInvalidArgument, c.ttl)
	}
	if c.logger == nil {
		c.logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// credentials picks the transport security. A CA file always means TLS: it
// is never silently ignored in favour of plaintext.
func (c *config) credentials() (credentials.TransportCredentials, error) {
	if c.caFile == "" && !c.tls {
		return insecure.NewCredentials(), nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.caFile != "" {
		pem, err := os.ReadFile(c.caFile)
		if err != nil {
			return nil, fmt.Errorf("governor: %s: %w", EnvCAFile, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("governor: %w: %s=%q holds no PEM certificate", ErrInvalidArgument, EnvCAFile, c.caFile)
		}
		tc.RootCAs = pool
	}
	return credentials.NewTLS(tc), nil
}
