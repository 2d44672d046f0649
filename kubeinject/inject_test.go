package kubeinject

import (
	"bytes"
	"encoding/json"
	"errors"
	"net"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/governor-project/governor/proxy/proxyconfig"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
	sigsyaml "sigs.k8s.io/yaml"
)

func TestPointDSN(t *testing.T) {
	for _, tc := range []struct{ dsn, listen, want string }{
		{"postgres://app:pw@db.prod:5432/app", "127.0.0.1:6432", "postgres://app:pw@127.0.0.1:6432/app?sslmode=disable"},
		{"postgresql://db/app?sslmode=verify-full&connect_timeout=5", "127.0.0.1:6432", "postgresql://127.0.0.1:6432/app?connect_timeout=5&sslmode=disable"},
		// A password from a Secret, expanded by Kubernetes at start: kept
		// as written, parentheses unescaped.
		{"postgres://agent:$(DB_PASSWORD)@a:5432,b:5433/x?host=c&application_name=y#f", "127.0.0.1:6433",
			"postgres://agent:$(DB_PASSWORD)@127.0.0.1:6433/x?application_name=y&sslmode=disable#f"},
		{"postgres://u@[::1]:5432", "127.0.0.1:6432", "postgres://u@127.0.0.1:6432?sslmode=disable"},
		{"jdbc:postgresql://db:5432/app?user=a", "127.0.0.1:6432", "jdbc:postgresql://127.0.0.1:6432/app?user=a&sslmode=disable"},
		{"host=db port=5432 dbname=app user=a password='x y \\' z' sslmode=require", "127.0.0.1:6432",
			"dbname=app user=a password='x y \\' z' host=127.0.0.1 port=6432 sslmode=disable"},
		{"  hostaddr = 10.0.0.1  dbname=app", "127.0.0.1:6432", "dbname=app host=127.0.0.1 port=6432 sslmode=disable"},
	} {
		got, err := pointDSN(tc.dsn, tc.listen)
		if err != nil || got != tc.want {
			t.Errorf("pointDSN(%q) = %q, %v; want %q", tc.dsn, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "  ", "mysql:/x", "host=db password='open", "host"} {
		if got, err := pointDSN(bad, "127.0.0.1:6432"); err == nil {
			t.Errorf("pointDSN(%q) = %q, want an error", bad, got)
		}
	}
}

// podWith is a pod asking for the sidecar, with more annotations and one
// container setting env.
func podWith(annotations map[string]string, env ...corev1.EnvVar) *corev1.Pod {
	a := map[string]string{AnnotationInject: "true", AnnotationConfig: "proxy"}
	for k, v := range annotations {
		a[k] = v
	}
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Env: env}}}}
	pod.Annotations = a
	return pod
}

// Every annotation the injector cannot honour is refused, naming it.
func TestAnnotationErrors(t *testing.T) {
	secretDSN := corev1.EnvVar{Name: "DB", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{Key: "url"}}}
	for _, tc := range []struct {
		pod        *corev1.Pod
		annotation string
		says       string
	}{
		{podWith(map[string]string{AnnotationInject: "yes"}), AnnotationInject, `"yes" is neither`},
		{podWith(map[string]string{AnnotationConfig: ""}), AnnotationConfig, "required"},
		{podWith(map[string]string{AnnotationConfig: "Proxy_Config"}), AnnotationConfig, "not a ConfigMap's name"},
		{podWith(map[string]string{"governor.dev/pgwrie": "DB"}), "governor.dev/pgwrie", "not one of"},
		{podWith(map[string]string{AnnotationTask: " "}), AnnotationTask, "empty"},
		{podWith(map[string]string{AnnotationAPIKeySecret: "a/b"}), AnnotationAPIKeySecret, "not a Secret's name"},
		{podWith(map[string]string{AnnotationPGWire: "DB=db:5432x"}, corev1.EnvVar{Name: "DB", Value: "host=x"}), AnnotationPGWire, "not host:port"},
		{podWith(map[string]string{AnnotationPGWire: "DB,DB"}, corev1.EnvVar{Name: "DB", Value: "host=x"}), AnnotationPGWire, "named twice"},
		{podWith(map[string]string{AnnotationPGWire: "1DB"}), AnnotationPGWire, "not an environment variable's name"},
		{podWith(map[string]string{AnnotationPGWire: "NOWHERE"}), AnnotationPGWire, "no container sets NOWHERE"},
		{podWith(map[string]string{AnnotationPGWire: "DB"}, secretDSN), AnnotationPGWire, "from a Secret"},
		{podWith(map[string]string{AnnotationPGWire: "DB"}, corev1.EnvVar{Name: "DB", Value: "mysql://x"}), AnnotationPGWire, "neither a postgres:// URI"},
		{podWith(map[string]string{AnnotationIntercept: "a.com b.com"}), AnnotationIntercept, "separated by commas"},
	} {
		_, err := Inject(tc.pod, DefaultConfig())
		var ae *AnnotationError
		if !errors.As(err, &ae) || ae.Annotation != tc.annotation || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%v: %v; want an error of %s saying %q", tc.pod.Annotations, err, tc.annotation, tc.says)
		}
	}
	// A pod that has the sidecar is left as it is, whatever it asks.
	has := podWith(map[string]string{AnnotationConfig: "", "governor.dev/typo": "x"})
	has.Spec.InitContainers = []corev1.Container{{Name: ProxyContainer}}
	if outcome, err := Inject(has, DefaultConfig()); outcome != AlreadyInjected || err != nil {
		t.Errorf("a pod with its sidecar and bad annotations: %s, %v", outcome, err)
	}
	// Names the injector would add, already taken.
	taken := podWith(nil)
	taken.Spec.Volumes = []corev1.Volume{{Name: configVolume}}
	if _, err := Inject(taken, DefaultConfig()); err == nil || !strings.Contains(err.Error(), configVolume) {
		t.Errorf("a pod with a volume %s: %v", configVolume, err)
	}
}

// Diff's patch, applied by the library the API server uses, turns each
// document into the other, both ways.
func TestDiffAppliesBack(t *testing.T) {
	docs := []string{
		`{}`,
		`{"a": 1, "b": [1, 2, 3], "c": {"d/e": "x", "f~g": null}}`,
		`{"a": 1, "b": [0, 1, 2, 3], "c": {"d/e": "y"}}`,
		`{"a": "1", "b": [1, 2, 3, 4, 5], "c": []}`,
		`{"a": [ {"n": 1}, {"n": 2} ], "b": [3]}`,
		`{"a": [ {"n": 0}, {"n": 1, "m": true}, {"n": 2} ], "b": [4, 3]}`,
		`{"a": [ {"n": 2} ], "b": {"x": [1]}}`,
		`{"spec": {"initContainers": [{"name": "x"}], "containers": [{"name": "app", "env": [{"name": "A", "value": "1"}]}]}}`,
		`{"spec": {"initContainers": [{"name": "ca"}, {"name": "p"}, {"name": "x"}], "containers": [{"name": "app", "env": [{"name": "A", "value": "2"}, {"name": "B"}]}]}}`,
	}
	for _, a := range docs {
		for _, b := range docs {
			ops, err := Diff([]byte(a), []byte(b))
			if err != nil {
				t.Fatal(err)
			}
			patch, err := json.Marshal(ops)
			if err != nil {
				t.Fatal(err)
			}
			p, err := jsonpatch.DecodePatch(patch)
			if err != nil {
				t.Fatalf("%s: %v", patch, err)
			}
			got, err := p.Apply([]byte(a))
			if err != nil {
				t.Fatalf("%s to %s: %s does not apply: %v", a, b, patch, err)
			}
			if !jsonEqual(t, got, []byte(b)) {
				t.Errorf("%s to %s: %s gives %s", a, b, patch, got)
			}
			if a == b && len(ops) != 0 {
				t.Errorf("%s to itself: %s", a, patch)
			}
		}
	}
}

func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatal(err)
	}
	return reflect.DeepEqual(x, y)
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct{ text, key string }{
		{"image: ''", "image"},
		{"image_pull_policy: Sometimes", "image_pull_policy"},
		{"governor_addr: governord", "governor_addr"},
		{"governord_ca: {config_map: Bad_Name, key: ca.crt}", "governord_ca.config_map"},
		{"governord_ca: {name: x, key: ca.crt}", "governord_ca.name"},
		{"api_key_secret: {name: keys, key: 'a b'}", "api_key_secret.key"},
		{"no_proxy: ['a,b']", "no_proxy"},
		{"intercept: {validity: 9000d}", "intercept.validity"},
		{"intercept: {roots_file: certs.pem}", "intercept.roots_file"},
	} {
		_, err := ParseConfig([]byte(tc.text))
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Key != tc.key {
			t.Errorf("%s: %v, want an error of %s", tc.text, err, tc.key)
		}
	}
	if _, err := ParseConfig([]byte("imag: governor:1")); err == nil || !strings.Contains(err.Error(), "imag") {
		t.Errorf("an unknown key: %v", err)
	}
	cfg, err := ParseConfig([]byte("resources: {requests: {cpu: 100m}}"))
	if err != nil || cfg.Resources.Requests.Cpu().MilliValue() != 100 || cfg.Image != DefaultImage {
		t.Errorf("resources: %+v, %v", cfg, err)
	}
}

// The places the injector assumes are the sidecar's defaults, so that a
// ConfigMap that leaves http.listen out works.
func TestPlacesAreTheSidecarsDefaults(t *testing.T) {
	if ProxyListen != proxyconfig.DefaultListen {
		t.Errorf("ProxyListen %s, the sidecar's default %s", ProxyListen, proxyconfig.DefaultListen)
	}
	_, port, _ := net.SplitHostPort(proxyconfig.DefaultMetricsListen)
	if strconv.Itoa(MetricsPort) != port {
		t.Errorf("MetricsPort %d, the sidecar's default %s", MetricsPort, proxyconfig.DefaultMetricsListen)
	}
	if len(metricsPortName) > 15 {
		t.Errorf("the port name %s is over 15 characters", metricsPortName)
	}
}

const manifests = `# The worker.
apiVersion: v1
kind: ConfigMap
metadata: {name: crawler-proxy}
data:
  proxy.yaml: |
    rules: []
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: crawler}
spec:
  replicas: 3
  selector: {matchLabels: {app: crawler}}
  template:
    metadata:
      labels: {app: crawler}
      annotations:
        governor.dev/inject: "true"   # the sidecar, please
        governor.dev/config: crawler-proxy
    spec:
      containers:
        - name: worker
          image: example.com/crawler:latest
          futureField: kept          # unknown to this k8s.io/api: kept as written
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: nightly}
spec:
  schedule: "0 3 * * *"
  jobTemplate:
    spec:
      template:
        metadata:
          annotations: {governor.dev/inject: "true", governor.dev/config: nightly-proxy}
        spec:
          restartPolicy: OnFailure
          containers: [{name: job, image: example.com/nightly:1}]
---
apiVersion: v1
kind: Pod
metadata:
  name: untouched
  annotations: {governor.dev/inject: "false"}
spec:
  containers: [{name: x, image: x}]
`

// governor inject -f's library: the templates that ask are injected with
// the webhook's patch; comments, fields it does not know and the
// documents it does not touch are kept.
func TestInjectManifests(t *testing.T) {
	var out bytes.Buffer
	results, err := InjectManifests(strings.NewReader(manifests), &out, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	want := []ManifestResult{{2, "Deployment", "crawler", Injected}, {3, "CronJob", "nightly", Injected}, {4, "Pod", "untouched", OptedOut}}
	if !reflect.DeepEqual(results, want) {
		t.Errorf("results %+v, want %+v", results, want)
	}
	text := out.String()
	for _, keep := range []string{"# The worker.", "# the sidecar, please", "futureField: kept", "# unknown to this k8s.io/api", `schedule: "0 3 * * *"`,
		"proxy.yaml: |\n    rules: []", "name: untouched"} {
		if !strings.Contains(text, keep) {
			t.Errorf("the output lost %q:\n%s", keep, text)
		}
	}
	docs := strings.Split(text, "\n---\n")
	if len(docs) != 4 {
		t.Fatalf("%d documents out:\n%s", len(docs), text)
	}
	var d struct {
		Spec struct {
			Template corev1.PodTemplateSpec `json:"template"`
		} `json:"spec"`
	}
	if err := sigsyaml.Unmarshal([]byte(docs[1]), &d); err != nil {
		t.Fatal(err)
	}
	spec := d.Spec.Template.Spec
	if len(spec.InitContainers) != 1 || spec.InitContainers[0].Name != ProxyContainer || envOf(spec.Containers[0], "HTTP_PROXY") == "" {
		t.Errorf("the Deployment is not injected:\n%s", docs[1])
	}
	if !strings.Contains(docs[2], "name: nightly-proxy") || strings.Contains(docs[3], ProxyContainer) {
		t.Errorf("the CronJob is not injected, or the opted-out Pod is:\n%s", text)
	}
	// Once more: nothing changes.
	var again bytes.Buffer
	if _, err := InjectManifests(strings.NewReader(text), &again, DefaultConfig()); err != nil || again.String() != text {
		t.Errorf("injecting the output again changed it (%v):\n%s", err, again.String())
	}
}

func TestInjectManifestsRefuses(t *testing.T) {
	bad := strings.Replace(manifests, "governor.dev/config: crawler-proxy", "governor.dev/confg: crawler-proxy", 1)
	var out bytes.Buffer
	_, err := InjectManifests(strings.NewReader(bad), &out, DefaultConfig())
	if err == nil || !strings.Contains(err.Error(), "document 2 (Deployment crawler)") || out.Len() != 0 {
		t.Errorf("a typo in an annotation: %v, wrote %d bytes", err, out.Len())
	}
}
