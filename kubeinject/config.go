package kubeinject

import (
	"fmt"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	sigsyaml "sigs.k8s.io/yaml"
)

// Defaults for every key the injector's config file may leave out.
const (
	DefaultImage           = "governor:dev"
	DefaultGovernorAddr    = "governord:7600"
	DefaultAPIKeySecret    = "governor-api-key"
	DefaultAPIKeySecretKey = "api-key"
	DefaultCAValidity      = "90d"
	// DefaultRootsFile is where the governor image (distroless) keeps the
	// public roots that the interception bundle starts with.
	DefaultRootsFile = "/etc/ssl/certs/ca-certificates.crt"
)

// DefaultResources are the sidecar's requests and limits unless the config
// says otherwise: small, since it only relays, with a memory limit so that
// a leak stops the sidecar rather than the node.
func DefaultResources() corev1.ResourceRequirements {
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
	}
}

// Config is what every injected sidecar gets. The pod's annotations add
// what is the pod's own (its ConfigMap, task, DSNs and intercepted hosts).
type Config struct {
	// Image holds governor-proxy and the governor CLI, as deploy/Dockerfile
	// builds it.
	Image           string
	ImagePullPolicy corev1.PullPolicy // "": Kubernetes' default
	// GovernorAddr is governord's address (GOVERNOR_ADDR), a Service name
	// the pods resolve. Its host is added to NO_PROXY.
	GovernorAddr string
	// GovernorTLS sets GOVERNOR_TLS=true: governord serves TLS with a
	// certificate the system roots trust. GovernordCA turns TLS on too.
	GovernorTLS bool
	// GovernordCA is the ConfigMap, in the pod's namespace, whose key holds
	// the CA governord's certificate chains to (GOVERNOR_CA_FILE). A Secret
	// could not do: the pod cannot mount one from governord's namespace,
	// and a CA certificate is no secret. Zero: none.
	GovernordCA ConfigMapKey
	// APIKeySecret is the Secret, in the pod's namespace, whose key is the
	// tenant's API key (GOVERNOR_API_KEY); governor.dev/api-key-secret
	// names another Secret.
	APIKeySecret SecretKey
	// NoProxy is added to the app containers' NO_PROXY after the pod's own
	// loopback and governord's host: the cluster's own names, whose traffic
	// stays ungoverned.
	NoProxy   []string
	Resources corev1.ResourceRequirements
	// CAValidity is the interception CA's -validity (governor ca create).
	CAValidity string
	// RootsFile is the image's public roots, the start of the bundle that
	// SSL_CERT_FILE and REQUESTS_CA_BUNDLE point at.
	RootsFile string
}

// ConfigMapKey names one key of a ConfigMap.
type ConfigMapKey struct{ Name, Key string }

// SecretKey names one key of a Secret.
type SecretKey struct{ Name, Key string }

// DefaultNoProxy are the cluster's own names: Services by their short and
// full names.
var DefaultNoProxy = []string{".svc", ".cluster.local"}

// DefaultConfig is the config of an empty file.
func DefaultConfig() Config {
	return Config{
		Image:        DefaultImage,
		GovernorAddr: DefaultGovernorAddr,
		GovernorTLS:  true,
		APIKeySecret: SecretKey{Name: DefaultAPIKeySecret, Key: DefaultAPIKeySecretKey},
		NoProxy:      append([]string(nil), DefaultNoProxy...),
		Resources:    DefaultResources(),
		CAValidity:   DefaultCAValidity,
		RootsFile:    DefaultRootsFile,
	}
}

// fileConfig is the YAML file as written. It is decoded with Kubernetes'
// JSON tags (sigs.k8s.io/yaml) because resources: is Kubernetes' own type.
type fileConfig struct {
	Image           *string                      `json:"image"`
	ImagePullPolicy *string                      `json:"image_pull_policy"`
	GovernorAddr    *string                      `json:"governor_addr"`
	GovernorTLS     *bool                        `json:"governor_tls"`
	GovernordCA     *fileKey                     `json:"governord_ca"`
	APIKeySecret    *fileKey                     `json:"api_key_secret"`
	NoProxy         *[]string                    `json:"no_proxy"`
	Resources       *corev1.ResourceRequirements `json:"resources"`
	Intercept       *struct {
		Validity  *string `json:"validity"`
		RootsFile *string `json:"roots_file"`
	} `json:"intercept"`
}

type fileKey struct {
	Name      string `json:"name"`
	ConfigMap string `json:"config_map"`
	Key       string `json:"key"`
}

// ConfigError is a config file that does not load: Key names the key.
type ConfigError struct {
	Key, Problem string
}

func (e *ConfigError) Error() string {
	if e.Key == "" {
		return e.Problem
	}
	return e.Key + ": " + e.Problem
}

// LoadConfig reads and checks the injector's config file.
func LoadConfig(path string) (Config, error) {
	text, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("injector config: %w", err)
	}
	cfg, err := ParseConfig(text)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

// ParseConfig reads the injector's config from YAML, rejecting unknown
// keys, and fills in the defaults.
func ParseConfig(text []byte) (Config, error) {
	var f fileConfig
	if err := sigsyaml.UnmarshalStrict(text, &f); err != nil {
		return Config{}, &ConfigError{Problem: err.Error()}
	}
	cfg := DefaultConfig()
	set(&cfg.Image, f.Image)
	if f.ImagePullPolicy != nil {
		cfg.ImagePullPolicy = corev1.PullPolicy(*f.ImagePullPolicy)
	}
	set(&cfg.GovernorAddr, f.GovernorAddr)
	set(&cfg.GovernorTLS, f.GovernorTLS)
	if k := f.GovernordCA; k != nil {
		cfg.GovernordCA = ConfigMapKey{Name: k.ConfigMap, Key: k.Key}
		if k.Name != "" {
			return Config{}, &ConfigError{"governord_ca.name", "a ConfigMap is named by config_map"}
		}
	}
	if k := f.APIKeySecret; k != nil {
		cfg.APIKeySecret = SecretKey{Name: k.Name, Key: k.Key}
		if k.ConfigMap != "" {
			return Config{}, &ConfigError{"api_key_secret.config_map", "an API key lives in a Secret, named by name"}
		}
	}
	set(&cfg.NoProxy, f.NoProxy)
	set(&cfg.Resources, f.Resources)
	if f.Intercept != nil {
		set(&cfg.CAValidity, f.Intercept.Validity)
		set(&cfg.RootsFile, f.Intercept.RootsFile)
	}
	return cfg, cfg.Validate()
}

func set[T any](dst *T, src *T) {
	if src != nil {
		*dst = *src
	}
}

// dnsLabel is a Kubernetes object name as ConfigMaps and Secrets take it
// (RFC 1123 subdomain).
var dnsSubdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// secretKeyName is what a ConfigMap's or a Secret's key may be.
var secretKeyName = regexp.MustCompile(`^[-._a-zA-Z0-9]+$`)

// Validate checks a Config, naming the key of the file that is wrong.
func (c Config) Validate() error {
	if c.Image == "" {
		return &ConfigError{"image", "required"}
	}
	switch c.ImagePullPolicy {
	case "", corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
	default:
		return &ConfigError{"image_pull_policy", fmt.Sprintf("%q is not Always, IfNotPresent or Never", c.ImagePullPolicy)}
	}
	if host, port, err := net.SplitHostPort(c.GovernorAddr); err != nil || host == "" || port == "" {
		return &ConfigError{"governor_addr", fmt.Sprintf("%q is not host:port", c.GovernorAddr)}
	}
	if ca := c.GovernordCA; ca != (ConfigMapKey{}) {
		if !dnsSubdomain.MatchString(ca.Name) {
			return &ConfigError{"governord_ca.config_map", fmt.Sprintf("%q is not a ConfigMap's name", ca.Name)}
		}
		if !secretKeyName.MatchString(ca.Key) {
			return &ConfigError{"governord_ca.key", fmt.Sprintf("%q is not a ConfigMap's key", ca.Key)}
		}
	}
	if !dnsSubdomain.MatchString(c.APIKeySecret.Name) {
		return &ConfigError{"api_key_secret.name", fmt.Sprintf("%q is not a Secret's name", c.APIKeySecret.Name)}
	}
	if !secretKeyName.MatchString(c.APIKeySecret.Key) {
		return &ConfigError{"api_key_secret.key", fmt.Sprintf("%q is not a Secret's key", c.APIKeySecret.Key)}
	}
	for _, h := range c.NoProxy {
		if h == "" || strings.ContainsAny(h, ", \t") {
			return &ConfigError{"no_proxy", fmt.Sprintf("%q is not one host, domain or CIDR", h)}
		}
	}
	if _, err := parseValidity(c.CAValidity); err != nil {
		return &ConfigError{"intercept.validity", err.Error()}
	}
	if !strings.HasPrefix(c.RootsFile, "/") {
		return &ConfigError{"intercept.roots_file", fmt.Sprintf("%q is not an absolute path in the image", c.RootsFile)}
	}
	return nil
}

// maxValidity is governor ca create's bound on -validity.
const maxValidity = 3650 * 24 * time.Hour

// parseValidity reads a validity as governor ca create's -validity does: a
// whole number of days (90d) or a Go duration, positive and at most 3650
// days; the CA step would fail on anything else, and only when a pod
// starts.
func parseValidity(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if days, ok := strings.CutSuffix(s, "d"); ok {
		var n int
		n, err = strconv.Atoi(days)
		d = time.Duration(n) * 24 * time.Hour
	}
	if err != nil || d <= 0 || d > maxValidity {
		return 0, fmt.Errorf("%q is not days (90d) or a duration (2160h) between 1s and 3650d", s)
	}
	return d, nil
}
