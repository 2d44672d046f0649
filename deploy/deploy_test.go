// Package deploy holds deployment examples: the Helm chart (helm/governor),
// the plain Kubernetes manifests generated from it, a Grafana dashboard and
// Prometheus alerting rules. Its tests hold them to the code: the manifests
// and the chart, rendered with Helm's library (helm_test.go), decode
// strictly with Kubernetes' own types and their embedded configs load with
// the real config parsers, and every query of the dashboard and the rules
// parses and names only metrics and labels that governord's or the
// sidecar's registry describes.
package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/governor-project/governor/proxy/proxyconfig"
	"github.com/governor-project/governor/server/serverconfig"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/promql/parser"
	"gopkg.in/yaml.v3"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	sigsyaml "sigs.k8s.io/yaml"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"

	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/proxy"
)

const (
	dashboardFile = "grafana/governor.json"
	alertsFile    = "prometheus/alerts.yaml"
)

// manifests are every Kubernetes manifest in kubernetes/, so that a new one
// is held to the same checks without being listed.
func manifests(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("kubernetes/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"kubernetes/governord.yaml", "kubernetes/governord-ha.yaml",
		"kubernetes/worker-with-sidecar.yaml", "kubernetes/worker-with-sidecar-intercept.yaml"} {
		if !slices.Contains(files, want) {
			t.Errorf("no %s among %v", want, files)
		}
	}
	return files
}

// series are the metric families a registry describes, by name, with their
// label names.
type series map[string][]string

// descName reads a Desc's name and variable labels from its String(), the
// only way client_golang shows them.
var descName = regexp.MustCompile(`^Desc\{fqName: "([^"]+)", .*variableLabels: \{([^}]*)\}\}$`)

func describe(t *testing.T, c prometheus.Collector, into series) {
	t.Helper()
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		m := descName.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read the name of %s", d)
		}
		var labels []string
		for l := range strings.SplitSeq(m[2], ",") {
			if l = strings.TrimSuffix(strings.TrimPrefix(l, "c("), ")"); l != "" {
				labels = append(labels, l)
			}
		}
		into[m[1]] = labels
	}
}

// served returns the families of a real governord and a real sidecar (with
// a pgwire listener, so that its series are registered too), read from
// their registries.
func served(t *testing.T) series {
	t.Helper()
	g := govtest.Start(t, nil)
	cfg, err := proxyconfig.ParseConfig([]byte(fmt.Sprintf(`
governor: {addr: %q, api_key: %s}
task: {name: deploy-test}
http: {listen: 127.0.0.1:0}
metrics_listen: 127.0.0.1:0
pgwire:
  - {listen: 127.0.0.1:0, upstream: 127.0.0.1:1}
rules:
  - {name: any, class: db}
`, g.Addr(), govtest.TenantKey)))
	if err != nil {
		t.Fatal(err)
	}
	p, err := proxy.Start(context.Background(), cfg, proxy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	all := series{}
	describe(t, g.MetricsCollector(), all)
	describe(t, p.MetricsCollector(), all)
	return all
}

// family is the family a sample name belongs to: a histogram's _bucket,
// _sum and _count are its own name's.
func (s series) family(name string) (string, bool) {
	if _, ok := s[name]; ok {
		return name, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			if _, ok := s[base]; ok {
				return base, true
			}
		}
	}
	return "", false
}

// Labels every series has once Prometheus scrapes it, and the histogram's.
var scrapeLabels = []string{"__name__", "instance", "job", "le"}

// checkQuery parses q and checks that every metric it selects is served,
// and that every label it names (in a selector, or in by/on/ignoring) is
// one of the served series'. It returns the metrics it selects.
func (s series) checkQuery(q string) ([]string, error) {
	expr, err := parser.NewParser(parser.Options{}).ParseExpr(q)
	if err != nil {
		return nil, err
	}
	var names []string
	labelsOf := map[string]bool{}
	for _, l := range scrapeLabels {
		labelsOf[l] = true
	}
	var errs []error
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		fam, ok := s.family(vs.Name)
		if !ok {
			errs = append(errs, fmt.Errorf("no metric %q is served", vs.Name))
			return nil
		}
		names = append(names, vs.Name)
		for _, l := range s[fam] {
			labelsOf[l] = true
		}
		for _, m := range vs.LabelMatchers {
			if !slices.Contains(s[fam], m.Name) && !slices.Contains(scrapeLabels, m.Name) {
				errs = append(errs, fmt.Errorf("%s has no label %q", vs.Name, m.Name))
			}
		}
		return nil
	})
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		var grouping []string
		switch n := n.(type) {
		case *parser.AggregateExpr:
			grouping = n.Grouping
		case *parser.BinaryExpr:
			if n.VectorMatching != nil {
				grouping = append(n.VectorMatching.MatchingLabels, n.VectorMatching.Include...)
			}
		}
		for _, l := range grouping {
			if !labelsOf[l] {
				errs = append(errs, fmt.Errorf("no metric of the query has the label %q", l))
			}
		}
		return nil
	})
	if len(names) == 0 {
		errs = append(errs, errors.New("selects no metric"))
	}
	return names, errors.Join(errs...)
}

// dashboard is the part of Grafana's dashboard model the test reads.
type dashboard struct {
	Title      string
	Templating struct {
		List []struct {
			Name  string
			Type  string
			Query json.RawMessage
		}
	}
	Panels []struct {
		ID         int
		Type       string
		Title      string
		Datasource struct{ Type, UID string }
		Targets    []struct {
			RefID string
			Expr  string
		}
	}
}

// grafanaVars stands in for what Grafana substitutes before a query reaches
// Prometheus: the dashboard's own variables and its built-in interval.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$tenant", ".*")

var unknownVar = regexp.MustCompile(`\$[A-Za-z_]\w*`)

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	text, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(text, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

func TestDashboardQueriesNameServedMetrics(t *testing.T) {
	s := served(t)
	d := loadDashboard(t)
	if d.Title == "" || len(d.Panels) == 0 {
		t.Fatalf("%s: no title or no panels", dashboardFile)
	}
	used := map[string]bool{}
	check := func(where, q string) {
		t.Helper()
		q = grafanaVars.Replace(q)
		if v := unknownVar.FindString(q); v != "" {
			t.Errorf("%s: %q uses %s, which the test does not know how Grafana fills", where, q, v)
			return
		}
		names, err := s.checkQuery(q)
		if err != nil {
			t.Errorf("%s: %q: %v", where, q, err)
		}
		for _, n := range names {
			fam, _ := s.family(n)
			used[fam] = true
		}
	}
	ids := map[int]bool{}
	for _, p := range d.Panels {
		where := fmt.Sprintf("panel %d %q", p.ID, p.Title)
		if p.Title == "" || ids[p.ID] || p.Datasource.Type != "prometheus" || len(p.Targets) == 0 {
			t.Errorf("%s: needs a title, a unique id, the prometheus datasource and a query", where)
		}
		ids[p.ID] = true
		for _, tg := range p.Targets {
			check(where+" "+tg.RefID, tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct{ Query string }
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Fatalf("variable %s: %v", v.Name, err)
		}
		// label_values(metric, label) is Grafana's, not PromQL: check the
		// metric and the label.
		m := regexp.MustCompile(`^label_values\((\w+), *(\w+)\)$`).FindStringSubmatch(q.Query)
		if m == nil {
			t.Errorf("variable %s: %q is not label_values(metric, label)", v.Name, q.Query)
			continue
		}
		check("variable "+v.Name, fmt.Sprintf("count by (%s) (%s)", m[2], m[1]))
	}
	// The panels the issue asks for, each found by the series it reads.
	for _, want := range []string{
		"governor_proxy_requests_total", "governor_proxy_admission_denials_total", // admissions, denials by cause
		"governor_proxy_lease_wait_seconds", "governor_acquire_wait_seconds", // lease wait
		"governor_pool_held", "governor_pool_limit", // pool use against limit
		"governor_spend_total", "governor_quota", // quota burn
		"governor_commit_seconds", "governor_queue_depth", // commit latency, queue depth
		"governor_proxy_slot_grants_total", "governor_delegated_slots", // delegated against remote grants
	} {
		if !used[want] {
			t.Errorf("no panel reads %s", want)
		}
	}
}

// alertRules is Prometheus' rule file format, decoded strictly.
type alertRules struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func TestAlertRulesNameServedMetrics(t *testing.T) {
	s := served(t)
	f, err := os.Open(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	dec.KnownFields(true)
	var rules alertRules
	if err := dec.Decode(&rules); err != nil {
		t.Fatalf("%s: %v", alertsFile, err)
	}
	alerts := map[string]bool{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" || r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("%s: rule %q needs a name, a severity and a summary", alertsFile, r.Alert)
			}
			alerts[r.Alert] = true
			if _, err := s.checkQuery(r.Expr); err != nil {
				t.Errorf("%s: %s: %v", alertsFile, r.Alert, err)
			}
		}
	}
	// What the issue asks the rules to watch.
	for _, want := range []string{"GovernorQuotaNearExhaustion", "GovernorPoolSaturated", "GovernordUnreachableFromSidecar",
		"GovernorCommitLatencyHigh", "GovernorSessionsReaped", "GovernorReaperBehind"} {
		if !alerts[want] {
			t.Errorf("%s: no alert %s", alertsFile, want)
		}
	}
}

// TestAlertRulesPromtool runs Prometheus' own check, and its unit tests of
// the rules (prometheus/alerts_test.yaml). scripts/compat.sh installs
// promtool (Debian's prometheus package) for ./test.sh; without it the test
// skips, unless GOVERNOR_COMPAT says the matrix's tools must be there.
func TestAlertRulesPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("GOVERNOR_COMPAT") != "" {
			t.Fatal("promtool is not installed (scripts/compat.sh installs it)")
		}
		t.Skip("promtool is not installed (scripts/compat.sh installs it)")
	}
	for _, args := range [][]string{{"check", "rules", alertsFile}, {"test", "rules", "prometheus/alerts_test.yaml"}} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// designLabels are the label names the contract gives metrics (docs/metric-labels.md).
var designLabels = []string{"tenant", "class", "resource", "rule", "status"}

// otherLabels are the labels the code uses beyond the contract's, each on
// configuration-bound values (never a task, a lease or a URL). They are
// listed so that a new one fails this test and gets decided on purpose.
var otherLabels = map[string]string{
	"method":    "gRPC method (governor_calls_total)",
	"code":      "gRPC status code (governor_calls_total)",
	"kind":      "event, notice, top-up or failure kind",
	"why":       "why a grant was given back; why admission refused a call (busy, api_rate)",
	"lane":      "admission's lane of a call: work or control (governor_call_seconds)",
	"outcome":   "outcome of a request, reload or charge",
	"cause":     "the Governor-Denied cause",
	"state":     "in_use/idle slots, unspent/unsettled units, event seq, a tenant's overage state",
	"mode":      "a cap's enforcement mode: soft or warn_only (governor_cap_warnings_total)",
	"how":       "block or lease grant",
	"reason":    "why an intercepted TLS handshake ended as it did (a fixed set: ok, client_refused_certificate, ...)",
	"direction": "which way a bytes rule's bytes went: request or response (governor_proxy_bytes_total)",
}

// Labels that would make the number of series follow the work.
var forbiddenLabels = []string{"task", "subtask", "lease", "session", "node", "url", "path", "host", "user", "application_name"}

func TestMetricLabels(t *testing.T) {
	s := served(t)
	byLabel := map[string][]string{}
	for name, labels := range s {
		if strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") {
			continue // the Go and process collectors'
		}
		for _, l := range labels {
			byLabel[l] = append(byLabel[l], name)
		}
	}
	var found []string
	for l, names := range byLabel {
		sort.Strings(names)
		found = append(found, l)
		switch {
		case slices.Contains(forbiddenLabels, l):
			t.Errorf("label %q (on %v) names work, not configuration", l, names)
		case slices.Contains(designLabels, l):
		case otherLabels[l] != "":
		default:
			t.Errorf("label %q (on %v) is neither the contract's (%v) nor one decided on (otherLabels)", l, names, designLabels)
		}
	}
	sort.Strings(found)
	t.Logf("labels in use: %v", found)
}

// documents splits a multi-document YAML file, each document re-encoded on
// its own.
func documents(t *testing.T, path string) [][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	var docs [][]byte
	for {
		var n yaml.Node
		if err := dec.Decode(&n); errors.Is(err, io.EOF) {
			return docs
		} else if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		b, err := yaml.Marshal(&n)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, b)
	}
}

// decodeManifest decodes one document into Kubernetes' type for its kind,
// rejecting any field the type does not have.
func decodeManifest(doc []byte) (any, error) {
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := sigsyaml.Unmarshal(doc, &head); err != nil {
		return nil, err
	}
	var obj any
	switch head.APIVersion + " " + head.Kind {
	case "v1 Secret":
		obj = &corev1.Secret{}
	case "v1 ConfigMap":
		obj = &corev1.ConfigMap{}
	case "v1 Service":
		obj = &corev1.Service{}
	case "apps/v1 StatefulSet":
		obj = &appsv1.StatefulSet{}
	case "apps/v1 Deployment":
		obj = &appsv1.Deployment{}
	case "policy/v1 PodDisruptionBudget":
		obj = &policyv1.PodDisruptionBudget{}
	case "networking.k8s.io/v1 NetworkPolicy":
		obj = &networkingv1.NetworkPolicy{}
	case "admissionregistration.k8s.io/v1 MutatingWebhookConfiguration":
		obj = &admissionregistrationv1.MutatingWebhookConfiguration{}
	case "monitoring.coreos.com/v1 ServiceMonitor":
		obj = &monitoringv1.ServiceMonitor{}
	case "monitoring.coreos.com/v1 PodMonitor":
		obj = &monitoringv1.PodMonitor{}
	case "monitoring.coreos.com/v1 PrometheusRule":
		obj = &monitoringv1.PrometheusRule{}
	// cert-manager's module is too large to depend on for two kinds: these
	// hold the fields the chart writes (helm_test.go).
	case "cert-manager.io/v1 Certificate":
		obj = &certManagerCertificate{}
	case "cert-manager.io/v1 Issuer":
		obj = &certManagerIssuer{}
	default:
		return nil, fmt.Errorf("%s %s: a kind this test does not know", head.APIVersion, head.Kind)
	}
	if err := sigsyaml.UnmarshalStrict(doc, obj); err != nil {
		return nil, fmt.Errorf("%s: %w", head.Kind, err)
	}
	return obj, nil
}

func TestKubernetesManifestsDecodeStrictly(t *testing.T) {
	for _, path := range manifests(t) {
		for i, doc := range documents(t, path) {
			obj, err := decodeManifest(doc)
			if err != nil {
				t.Errorf("%s, document %d: %v", path, i+1, err)
				continue
			}
			// Every container's probes and volume mounts name what exists.
			var spec *corev1.PodSpec
			switch o := obj.(type) {
			case *appsv1.StatefulSet:
				spec = &o.Spec.Template.Spec
			case *appsv1.Deployment:
				spec = &o.Spec.Template.Spec
			}
			if spec != nil {
				checkPodSpec(t, path, spec)
			}
		}
	}
}

// checkPodSpec checks references a strict decoding cannot: volume mounts
// name a volume, probes name a port.
func checkPodSpec(t *testing.T, path string, spec *corev1.PodSpec) {
	t.Helper()
	volumes := map[string]bool{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = true
	}
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		ports := map[string]bool{}
		for _, p := range c.Ports {
			ports[p.Name] = true
		}
		for _, m := range c.VolumeMounts {
			if !volumes[m.Name] && m.Name != "state" { // state: the StatefulSet's volumeClaimTemplates
				t.Errorf("%s: container %s mounts %q, which is no volume", path, c.Name, m.Name)
			}
		}
		for _, p := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe} {
			if p != nil && p.HTTPGet != nil && p.HTTPGet.Port.StrVal != "" && !ports[p.HTTPGet.Port.StrVal] {
				t.Errorf("%s: container %s probes port %q, which it does not name", path, c.Name, p.HTTPGet.Port.StrVal)
			}
		}
	}
}

// A typo in a field must fail, which is the point of decoding strictly.
func TestKubernetesManifestTypoFails(t *testing.T) {
	for _, tc := range []struct{ path, field, typo string }{
		{"kubernetes/worker-with-sidecar.yaml", "readinessProbe:", "readinesProbe:"},
		{interceptManifest, "subPath:", "subPaht:"},
		{interceptManifest, "emptyDir:", "emptyDirectory:"},
	} {
		found := false
		for i, doc := range documents(t, tc.path) {
			if !bytes.Contains(doc, []byte(tc.field)) {
				continue
			}
			found = true
			bad := bytes.Replace(doc, []byte(tc.field), []byte(tc.typo), 1)
			if _, err := decodeManifest(bad); err == nil || !strings.Contains(err.Error(), strings.TrimSuffix(tc.typo, ":")) {
				t.Errorf("%s, document %d with %s: %v, want an unknown field error", tc.path, i+1, tc.typo, err)
			}
			break
		}
		if !found {
			t.Errorf("%s: no document with %s", tc.path, tc.field)
		}
	}
}

// configMapFile returns data[key] of the ConfigMap named name in a manifest.
func configMapFile(t *testing.T, path, name, key string) []byte {
	t.Helper()
	for _, doc := range documents(t, path) {
		obj, err := decodeManifest(doc)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if cm, ok := obj.(*corev1.ConfigMap); ok && cm.Name == name {
			if v, ok := cm.Data[key]; ok {
				return []byte(v)
			}
		}
	}
	t.Fatalf("%s: no ConfigMap %s with %s", path, name, key)
	return nil
}

func setManifestEnv(t *testing.T) {
	t.Setenv("GOVERNOR_ADMIN_KEY", "a")
	t.Setenv("PAYMENTS_KEY", "p")
	t.Setenv("GOVERNOR_API_KEY", "p")
	t.Setenv("POD_NAME", "crawler-0")
	t.Setenv("GOVERNOR_TASK", "crawler-0") // the injected sidecar's
}

func TestKubernetesConfigsLoad(t *testing.T) {
	setManifestEnv(t)
	cfg, err := serverconfig.ParseConfig(configMapFile(t, "kubernetes/governord.yaml", "governord", "governor.yaml"))
	if err != nil {
		t.Fatalf("governord's config: %v", err)
	}
	if cfg.TLS.CertFile == "" || !strings.HasPrefix(cfg.Listen, "0.0.0.0") {
		t.Fatalf("governord's config: %+v", cfg)
	}
	t.Setenv("GOVERNOR_PG_DSN", "postgres://governor@postgres/governor")
	ha, err := serverconfig.ParseConfig(configMapFile(t, "kubernetes/governord-ha.yaml", "governord", "governor.yaml"))
	if err != nil {
		t.Fatalf("governord's config with standbys: %v", err)
	}
	if !ha.HA.Enabled || ha.Store.Driver != "postgres" || ha.HA.AdvertiseAddr != "crawler-0.governord-peers.default.svc:7600" {
		t.Fatalf("governord's config with standbys: %+v", ha)
	}
	pcfg, err := proxyconfig.ParseConfig(configMapFile(t, "kubernetes/worker-with-sidecar.yaml", "crawler-proxy", "proxy.yaml"))
	if err != nil {
		t.Fatalf("the sidecar's config: %v", err)
	}
	if pcfg.HTTP.WaitTimeout != 30*time.Second || pcfg.Rules == nil {
		t.Fatalf("the sidecar's config: %+v", pcfg)
	}
	icfg, err := proxyconfig.ParseConfig(configMapFile(t, interceptManifest, "crawler-proxy-intercept", "proxy.yaml"))
	if err != nil {
		t.Fatalf("the intercepting sidecar's config: %v", err)
	}
	if ic := icfg.HTTP.Intercept; !ic.On() || ic.CACert == "" || ic.CAKey == "" || icfg.Rules == nil {
		t.Fatalf("the intercepting sidecar's config: %+v", icfg)
	}
}

// The embedded configs are read by parsers that reject unknown keys, so a
// key renamed in the code and not in the manifests fails
// TestKubernetesConfigsLoad; this shows the parsers do reject one.
func TestKubernetesConfigTypoFails(t *testing.T) {
	setManifestEnv(t)
	gtext := configMapFile(t, "kubernetes/governord.yaml", "governord", "governor.yaml")
	if _, err := serverconfig.ParseConfig(bytes.Replace(gtext, []byte("metrics_listen:"), []byte("metric_listen:"), 1)); err == nil {
		t.Error("governord's config with metric_listen: loaded")
	}
	ptext := configMapFile(t, "kubernetes/worker-with-sidecar.yaml", "crawler-proxy", "proxy.yaml")
	if _, err := proxyconfig.ParseConfig(bytes.Replace(ptext, []byte("wait_timeout:"), []byte("wait_timout:"), 1)); err == nil {
		t.Error("the sidecar's config with wait_timout: loaded")
	}
	itext := configMapFile(t, interceptManifest, "crawler-proxy-intercept", "proxy.yaml")
	if _, err := proxyconfig.ParseConfig(bytes.Replace(itext, []byte("ca_key:"), []byte("ca_keyfile:"), 1)); err == nil {
		t.Error("the intercepting sidecar's config with ca_keyfile: loaded")
	}
}
