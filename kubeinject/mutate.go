package kubeinject

import (
	"fmt"
	"net"
	"path"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The names and places of what Inject adds. The ConfigMap's proxy.yaml is
// written against them: its http.listen must be ProxyListen, its
// metrics_listen must reach MetricsPort from the kubelet (0.0.0.0:7701),
// and with interception its ca_cert and ca_key are the files in
// InterceptCADir.
const (
	// ProxyContainer is the sidecar's name; a pod that has a container of
	// that name is left as it is, which makes injection idempotent.
	ProxyContainer = "governor-proxy"
	// CAContainer makes the pod's interception CA before the sidecar starts.
	CAContainer = "governor-ca"
	// ConfigKey is the key of the ConfigMap that holds the sidecar's config.
	ConfigKey = "proxy.yaml"
	// ConfigDir is where the ConfigMap is mounted, whole, so that an edit
	// reaches the sidecar, which reloads its rules (a subPath mount never
	// sees an edit).
	ConfigDir = "/etc/governor-proxy"
	// ProxyListen is the sidecar's HTTP proxy, the app's HTTP(S)_PROXY.
	ProxyListen = "127.0.0.1:7700"
	// MetricsPort serves /metrics, /healthz and /readyz, which the probes
	// read.
	MetricsPort = 7701
	// DefaultPGWireListen is the listener a governor.dev/pgwire variable
	// that names none is pointed at.
	DefaultPGWireListen = "127.0.0.1:6432"
	// InterceptCADir is where the CA step writes ca.pem, ca-key.pem and
	// bundle.pem, and where the sidecar reads them.
	InterceptCADir = "/governor-ca"
	// AppCADir is where the app containers see ca.pem and bundle.pem, and
	// never the key.
	AppCADir = "/etc/governor-ca"
	// GovernordCADir holds governord's CA in the sidecar.
	GovernordCADir = "/etc/governor/tls"
	// InjectedLabel marks an injected pod, for selectors (a PodMonitor
	// scraping the sidecars, kubectl get pods -l).
	InjectedLabel = "governor.dev/injected"

	configVolume      = "governor-proxy-config"
	governordCAVolume = "governord-ca"
	interceptCAVolume = "governor-ca"
	metricsPortName   = "gov-metrics" // a port's name is at most 15 characters
	// nonRootUID is the governor image's user (distroless nonroot). It is
	// given by number: the image names it, and the kubelet cannot check
	// runAsNonRoot against a name.
	nonRootUID = 65532
)

// The variables the app containers get.
var proxyVariables = []string{"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"}

const noProxyVariable = "NO_PROXY"

// loopback is always in NO_PROXY: the sidecar refuses the pod's own
// loopback as a target, and the app's own ports must stay reachable.
var loopback = []string{"localhost", "127.0.0.1", "::1"}

// Outcome is what Inject did with a pod.
type Outcome string

const (
	Injected        Outcome = "injected"
	NotAsked        Outcome = "not-asked" // no governor.dev/inject
	OptedOut        Outcome = "opted-out" // governor.dev/inject: "false"
	AlreadyInjected Outcome = "already-injected"
)

// Inject adds the sidecar to pod in place, if its annotations ask for it
// and it has none yet. On an error pod may be half changed: inject a copy.
func Inject(pod *corev1.Pod, cfg Config) (Outcome, error) {
	switch v, ok := pod.Annotations[AnnotationInject]; {
	case !ok:
		return NotAsked, nil
	case v == "false":
		return OptedOut, nil
	case hasContainer(pod.Spec, ProxyContainer):
		// Whatever its annotations say: it is left as it is.
		return AlreadyInjected, nil
	}
	inject, req, err := readAnnotations(pod.Annotations)
	if err != nil {
		return "", err
	}
	if !inject {
		return NotAsked, nil
	}
	if err := checkFree(pod.Spec, req); err != nil {
		return "", err
	}
	for i := range pod.Spec.Containers {
		if err := governApp(&pod.Spec.Containers[i], cfg, req); err != nil {
			return "", err
		}
	}
	for _, t := range req.pgwire {
		if !slices.ContainsFunc(pod.Spec.Containers, func(c corev1.Container) bool { return envIndex(c, t.env) >= 0 }) {
			return "", &AnnotationError{AnnotationPGWire, fmt.Sprintf("no container sets %s", t.env)}
		}
	}
	ours := []corev1.Container{proxyContainer(cfg, req)}
	if req.intercept != nil {
		ours = append([]corev1.Container{caStep(cfg, req)}, ours...)
	}
	// First, so that the sidecar runs before every other init container
	// and may govern them too.
	pod.Spec.InitContainers = append(ours, pod.Spec.InitContainers...)
	pod.Spec.Volumes = append(pod.Spec.Volumes, volumes(cfg, req)...)
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	pod.Labels[InjectedLabel] = "true"
	return Injected, nil
}

func hasContainer(spec corev1.PodSpec, name string) bool {
	return slices.ContainsFunc(append(slices.Clone(spec.InitContainers), spec.Containers...),
		func(c corev1.Container) bool { return c.Name == name })
}

// checkFree refuses a pod that already uses a name Inject would add.
func checkFree(spec corev1.PodSpec, req podRequest) error {
	if req.intercept != nil && hasContainer(spec, CAContainer) {
		return fmt.Errorf("the pod already has a container named %s", CAContainer)
	}
	for _, v := range spec.Volumes {
		if v.Name == configVolume || v.Name == governordCAVolume || v.Name == interceptCAVolume {
			return fmt.Errorf("the pod already has a volume named %s", v.Name)
		}
	}
	return nil
}

// proxyContainer is the native sidecar: an init container that restarts always,
// so that it starts before the app and stops after it.
func proxyContainer(cfg Config, req podRequest) corev1.Container {
	always := corev1.ContainerRestartPolicyAlways
	task := corev1.EnvVar{Name: "GOVERNOR_TASK", ValueFrom: podName()}
	if req.task != "" {
		task = corev1.EnvVar{Name: "GOVERNOR_TASK", Value: req.task}
	}
	apiKey := cfg.APIKeySecret
	if req.apiKeySecret != "" {
		apiKey.Name = req.apiKeySecret
	}
	env := []corev1.EnvVar{
		{Name: "POD_NAME", ValueFrom: podName()},
		task,
		{Name: "GOVERNOR_ADDR", Value: cfg.GovernorAddr},
		{Name: "GOVERNOR_API_KEY", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: apiKey.Name}, Key: apiKey.Key}}},
	}
	mounts := []corev1.VolumeMount{{Name: configVolume, MountPath: ConfigDir, ReadOnly: true}}
	if cfg.GovernorTLS || cfg.GovernordCA.Name != "" {
		env = append(env, corev1.EnvVar{Name: "GOVERNOR_TLS", Value: "true"})
	}
	if cfg.GovernordCA.Name != "" {
		env = append(env, corev1.EnvVar{Name: "GOVERNOR_CA_FILE", Value: path.Join(GovernordCADir, cfg.GovernordCA.Key)})
		mounts = append(mounts, corev1.VolumeMount{Name: governordCAVolume, MountPath: GovernordCADir, ReadOnly: true})
	}
	if req.intercept != nil {
		mounts = append(mounts, corev1.VolumeMount{Name: interceptCAVolume, MountPath: InterceptCADir, ReadOnly: true})
	}
	probe := func(path string) *corev1.Probe {
		return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
			Path: path, Port: intstr.FromString(metricsPortName)}}}
	}
	// The app starts once the sidecar's listeners are up: a native
	// sidecar's startup probe holds the containers after it until it
	// passes.
	startup := probe("/healthz")
	startup.PeriodSeconds, startup.FailureThreshold = 1, 60
	return corev1.Container{
		Name:            ProxyContainer,
		Image:           cfg.Image,
		ImagePullPolicy: cfg.ImagePullPolicy,
		Command:         []string{"/usr/local/bin/governor-proxy"},
		Args:            []string{"-config", path.Join(ConfigDir, ConfigKey)},
		RestartPolicy:   &always,
		Env:             env,
		Ports:           []corev1.ContainerPort{{Name: metricsPortName, ContainerPort: MetricsPort, Protocol: corev1.ProtocolTCP}},
		StartupProbe:    startup,
		ReadinessProbe:  probe("/readyz"),
		LivenessProbe:   probe("/healthz"),
		Resources:       cfg.Resources,
		SecurityContext: restricted(),
		VolumeMounts:    mounts,
	}
}

// caStep makes the pod's interception CA into the in-memory volume, as
// governor ca create: the key never leaves the pod. -force: a restarted pod
// runs its init containers again over the files they wrote.
func caStep(cfg Config, req podRequest) corev1.Container {
	return corev1.Container{
		Name:            CAContainer,
		Image:           cfg.Image,
		ImagePullPolicy: cfg.ImagePullPolicy,
		Command:         []string{"/usr/local/bin/governor"},
		Args: []string{"ca", "create", "-out", InterceptCADir, "-hosts", strings.Join(req.intercept, ","),
			"-validity", cfg.CAValidity, "-bundle-roots", cfg.RootsFile, "-force"},
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("16Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")},
		},
		SecurityContext: restricted(),
		VolumeMounts:    []corev1.VolumeMount{{Name: interceptCAVolume, MountPath: InterceptCADir}},
	}
}

// restricted is what Kubernetes' restricted Pod Security Standard asks of
// a container; the governor image needs nothing more.
func restricted() *corev1.SecurityContext {
	yes, no, uid := true, false, int64(nonRootUID)
	return &corev1.SecurityContext{
		RunAsNonRoot:             &yes,
		RunAsUser:                &uid,
		AllowPrivilegeEscalation: &no,
		ReadOnlyRootFilesystem:   &yes,
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

func podName() *corev1.EnvVarSource {
	return &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}
}

func volumes(cfg Config, req podRequest) []corev1.Volume {
	vs := []corev1.Volume{{Name: configVolume, VolumeSource: corev1.VolumeSource{
		ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: req.config}}}}}
	if ca := cfg.GovernordCA; ca.Name != "" {
		vs = append(vs, corev1.Volume{Name: governordCAVolume, VolumeSource: corev1.VolumeSource{
			ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: ca.Name},
				Items: []corev1.KeyToPath{{Key: ca.Key, Path: ca.Key}}}}})
	}
	if req.intercept != nil {
		// In memory: the CA's key never reaches the node's disk.
		size := resource.MustParse("1Mi")
		vs = append(vs, corev1.Volume{Name: interceptCAVolume, VolumeSource: corev1.VolumeSource{
			EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: &size}}})
	}
	return vs
}

// governApp points an app container at the sidecar: its HTTP traffic, its
// DSNs, and with interception its trust in the pod's CA.
func governApp(c *corev1.Container, cfg Config, req podRequest) error {
	for _, v := range proxyVariables {
		setEnv(c, v, "http://"+ProxyListen)
	}
	noProxy, err := mergeNoProxy(*c, cfg)
	if err != nil {
		return err
	}
	setEnv(c, noProxyVariable, noProxy)
	setEnv(c, strings.ToLower(noProxyVariable), noProxy)
	for _, t := range req.pgwire {
		i := envIndex(*c, t.env)
		if i < 0 {
			continue
		}
		e := c.Env[i]
		if e.ValueFrom != nil {
			return &AnnotationError{AnnotationPGWire, fmt.Sprintf("container %s takes %s from a %s, which the injector cannot read: "+
				"set it as a value, with the secret parts as $(VAR) references to variables taken from the Secret", c.Name, t.env, sourceKind(e.ValueFrom))}
		}
		dsn, err := pointDSN(e.Value, t.listen)
		if err != nil {
			return &AnnotationError{AnnotationPGWire, fmt.Sprintf("container %s's %s: %v", c.Name, t.env, err)}
		}
		c.Env[i].Value = dsn
	}
	if req.intercept != nil {
		bundle, ca := path.Join(AppCADir, "bundle.pem"), path.Join(AppCADir, "ca.pem")
		// SSL_CERT_FILE and REQUESTS_CA_BUNDLE replace the roots a client
		// trusts: the bundle holds the public roots and the CA, so that
		// hosts that are not intercepted still verify.
		// NODE_EXTRA_CA_CERTS adds to Node's roots: the CA alone.
		setEnv(c, "SSL_CERT_FILE", bundle)
		setEnv(c, "REQUESTS_CA_BUNDLE", bundle)
		setEnv(c, "NODE_EXTRA_CA_CERTS", ca)
		// One file each (subPath), never the directory: the key is there.
		c.VolumeMounts = append(c.VolumeMounts,
			corev1.VolumeMount{Name: interceptCAVolume, MountPath: ca, SubPath: "ca.pem", ReadOnly: true},
			corev1.VolumeMount{Name: interceptCAVolume, MountPath: bundle, SubPath: "bundle.pem", ReadOnly: true})
	}
	return nil
}

func sourceKind(s *corev1.EnvVarSource) string {
	switch {
	case s.SecretKeyRef != nil:
		return "Secret"
	case s.ConfigMapKeyRef != nil:
		return "ConfigMap"
	}
	return "field or resource"
}

// mergeNoProxy is the loopback, governord's host, the config's names and
// then the container's own NO_PROXY entries, each once.
func mergeNoProxy(c corev1.Container, cfg Config) (string, error) {
	host, _, _ := net.SplitHostPort(cfg.GovernorAddr)
	entries := append(append(slices.Clone(loopback), host), cfg.NoProxy...)
	for _, name := range []string{noProxyVariable, strings.ToLower(noProxyVariable)} {
		i := envIndex(c, name)
		if i < 0 {
			continue
		}
		if c.Env[i].ValueFrom != nil {
			return "", fmt.Errorf("container %s takes %s from a %s: the injector must set it to keep the pod's own traffic off the proxy",
				c.Name, name, sourceKind(c.Env[i].ValueFrom))
		}
		for e := range strings.SplitSeq(c.Env[i].Value, ",") {
			if e = strings.TrimSpace(e); e != "" {
				entries = append(entries, e)
			}
		}
	}
	var out []string
	for _, e := range entries {
		if !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	return strings.Join(out, ","), nil
}

func envIndex(c corev1.Container, name string) int {
	return slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == name })
}

// setEnv sets a variable, in place if the container sets it already (the
// value the injector gives wins), else at the end.
func setEnv(c *corev1.Container, name, value string) {
	if i := envIndex(*c, name); i >= 0 {
		c.Env[i] = corev1.EnvVar{Name: name, Value: value}
		return
	}
	c.Env = append(c.Env, corev1.EnvVar{Name: name, Value: value})
}
