package deploy

import (
	"bytes"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"flag"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/chart/common"
	chartutil "helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/lint"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sigsyaml "sigs.k8s.io/yaml"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"

	"github.com/governor-project/governor/kubeinject"
	"github.com/governor-project/governor/server/serverconfig"
)

var rewrite = flag.Bool("rewrite", false, "write the chart's copies of the alerts and the dashboard (and kubernetes/'s generated manifests)")

const (
	chartDir = "helm/governor"
	// The release the tests render, and kubernetes/'s manifests are
	// rendered as.
	releaseName      = "governor"
	releaseNamespace = "default"
)

// renderedObject is one document the chart rendered, decoded strictly.
type renderedObject struct {
	template string // the template's file
	doc      []byte
	obj      any
}

// renderChart renders the chart with Helm's own library, as helm template
// does, and decodes every object strictly into its Kubernetes type.
func renderChart(t *testing.T, values map[string]any) ([]renderedObject, error) {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("loading the chart: %v", err)
	}
	vals, err := chartutil.ToRenderValues(ch, values, common.ReleaseOptions{Name: releaseName, Namespace: releaseNamespace, IsInstall: true}, nil)
	if err != nil {
		return nil, err
	}
	files, err := engine.Render(ch, vals)
	if err != nil {
		return nil, err
	}
	var out []renderedObject
	for _, name := range slices.Sorted(maps.Keys(files)) {
		if !strings.HasSuffix(name, ".yaml") {
			continue // NOTES.txt, helpers
		}
		for _, doc := range strings.Split(files[name], "\n---") {
			if strings.TrimSpace(stripComments(doc)) == "" {
				continue
			}
			obj, err := decodeManifest([]byte(doc))
			if err != nil {
				t.Fatalf("%s: %v\n%s", name, err, doc)
			}
			out = append(out, renderedObject{template: name, doc: []byte(doc), obj: obj})
		}
	}
	return out, nil
}

func stripComments(doc string) string {
	var b strings.Builder
	for l := range strings.SplitSeq(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// find returns the rendered object of type T named name, or nil.
func find[T any](objs []renderedObject, name string) *T {
	for _, o := range objs {
		if v, ok := o.obj.(*T); ok && objectName(o.obj) == name {
			return v
		}
	}
	return nil
}

func objectName(obj any) string {
	b, _ := json.Marshal(obj)
	var m struct {
		Metadata struct{ Name, Namespace string }
	}
	json.Unmarshal(b, &m)
	return m.Metadata.Name
}

// chartValues are the value sets the chart is rendered with: each a way
// the README says it may be installed.
var chartValues = map[string]string{
	"defaults": `governordCA: {namespaces: [crawlers, agents]}`,
	"ha": `
governord:
  replicas: 3
  ha: {enabled: true}
governordCA: {namespaces: [crawlers]}`,
	"cert-manager": `
tls: {mode: certManager}
governord: {replicas: 3, ha: {enabled: true}}`,
	"cert-manager-issuer": `
tls: {mode: certManager, certManager: {issuerRef: {name: corp-ca, kind: ClusterIssuer, group: cert-manager.io}}}`,
	"monitoring-fail-open": `
image: {repository: registry.example.com/governor, tag: v1.2.3}
injector:
  failurePolicy: Ignore
  replicas: 1
  namespaceSelector:
    matchExpressions: [{key: team, operator: In, values: [crawl, agents]}]
metrics:
  serviceMonitor: {enabled: true}
  podMonitor: {enabled: true}
  prometheusRule: {enabled: true, labels: {release: prometheus}}
  grafanaDashboard: {enabled: true}`,
	"existing-tls": `
tls: {mode: existing, existing: {caBundle: Q0E=}}
governord: {networkPolicy: {enabled: false}}`,
	"no-injector": `
injector: {enabled: false}`,
}

func parseValues(t *testing.T, text string) map[string]any {
	t.Helper()
	var v map[string]any
	if err := sigsyaml.Unmarshal([]byte(text), &v); err != nil {
		t.Fatal(err)
	}
	if v == nil {
		v = map[string]any{}
	}
	return v
}

// TestChartRenders renders the chart for each value set and holds what it
// renders to the code: every object decodes strictly; governord's config
// loads with governord's parser; the injector's config with the injector's,
// and injecting a pod with it gives a native sidecar that reaches the
// governord the chart runs; the webhook reaches the injector; the
// certificates verify for the names they are used by.
func TestChartRenders(t *testing.T) {
	setManifestEnv(t)
	t.Setenv("GOVERNOR_PG_DSN", "postgres://governor@postgres/governor")
	for _, name := range slices.Sorted(maps.Keys(chartValues)) {
		t.Run(name, func(t *testing.T) {
			values := parseValues(t, chartValues[name])
			objs, err := renderChart(t, values)
			if err != nil {
				t.Fatal(err)
			}
			checkRendered(t, objs, values)
		})
	}
}

// The values the chart must refuse, and the key each refusal names.
func TestChartRefusesBadValues(t *testing.T) {
	for _, tc := range []struct{ values, says string }{
		{`governord: {replicas: 3}`, "governord.replicas"},
		{`governord: {ha: {enabled: true}}`, "governord.replicas"},
		{`tls: {mode: letsencrypt}`, "tls.mode"},
		{`injector: {failurePolicy: Retry}`, "injector.failurePolicy"},
		{`tls: {mode: existing}`, "tls.existing.caBundle"},
	} {
		_, err := renderChart(t, parseValues(t, tc.values))
		if err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v, want an error naming %s", tc.values, err, tc.says)
		}
	}
}

// TestChartLints runs Helm's own lint over the chart.
func TestChartLints(t *testing.T) {
	linter := lint.RunAll(chartDir, nil, releaseNamespace)
	for _, m := range linter.Messages {
		if m.Severity > 1 { // warnings and errors; INFO (an icon) is not
			t.Errorf("helm lint: %s", m)
		}
	}
}

func checkRendered(t *testing.T, objs []renderedObject, values map[string]any) {
	t.Helper()
	seen := map[string]string{}
	for _, o := range objs {
		var head struct {
			Kind     string
			Metadata struct{ Name, Namespace string }
		}
		sigsyaml.Unmarshal(o.doc, &head)
		key := head.Kind + " " + head.Metadata.Namespace + "/" + head.Metadata.Name
		if prev, ok := seen[key]; ok {
			t.Errorf("%s twice: in %s and %s", key, prev, o.template)
		}
		seen[key] = o.template
		switch obj := o.obj.(type) {
		case *appsv1.StatefulSet:
			checkPodSpec(t, o.template, &obj.Spec.Template.Spec)
		case *appsv1.Deployment:
			checkPodSpec(t, o.template, &obj.Spec.Template.Spec)
		}
	}
	ha := dig(values, "governord", "ha", "enabled") == true
	// governord.
	cm := find[corev1.ConfigMap](objs, "governord")
	if cm == nil {
		t.Fatal("no ConfigMap governord")
	}
	cfg, err := serverconfig.ParseConfig([]byte(cm.Data["governor.yaml"]))
	if err != nil {
		t.Fatalf("governord's config does not load: %v\n%s", err, cm.Data["governor.yaml"])
	}
	sts := find[appsv1.StatefulSet](objs, "governord")
	if sts == nil || cfg.HA.Enabled != ha || (cfg.Store.Driver == "postgres") != ha || (*sts.Spec.Replicas > 1) != ha {
		t.Errorf("with ha %v: governord's store %s, ha %v, the StatefulSet %v", ha, cfg.Store.Driver, cfg.HA.Enabled, sts)
	}
	for _, svc := range []string{"governord", sts.Spec.ServiceName} {
		if find[corev1.Service](objs, svc) == nil {
			t.Errorf("no Service %s", svc)
		}
	}
	if peers := find[corev1.Service](objs, sts.Spec.ServiceName); peers != nil && (peers.Spec.ClusterIP != "None" || !peers.Spec.PublishNotReadyAddresses) {
		t.Errorf("the StatefulSet's Service %s is not headless with not-ready addresses", peers.Name)
	}
	if pdb := find[policyv1.PodDisruptionBudget](objs, "governord"); (pdb != nil) != ha {
		t.Errorf("with ha %v, a PodDisruptionBudget for governord: %v", ha, pdb != nil)
	}
	if ha && !strings.HasSuffix(cfg.HA.AdvertiseAddr, ".governord-peers."+releaseNamespace+".svc:7600") {
		t.Errorf("governord advertises %s, not a name of the headless Service", cfg.HA.AdvertiseAddr)
	}

	mode, _ := dig(values, "tls", "mode").(string)
	injector := dig(values, "injector", "enabled") != false
	if injector {
		checkInjector(t, objs, values)
	} else if find[admissionregistrationv1.MutatingWebhookConfiguration](objs, "governor-injector") != nil || find[appsv1.Deployment](objs, "governor-injector") != nil {
		t.Error("the injector is off, and rendered")
	}
	switch mode {
	case "", "selfSigned":
		checkSelfSigned(t, objs, injector, ha)
	case "certManager":
		checkCertManager(t, objs, injector)
	}
	checkMonitoring(t, objs, values)
}

// dig reads a nested value of a values map.
func dig(m map[string]any, keys ...string) any {
	var v any = m
	for _, k := range keys {
		mm, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = mm[k]
	}
	return v
}

func checkInjector(t *testing.T, objs []renderedObject, values map[string]any) {
	t.Helper()
	cm := find[corev1.ConfigMap](objs, "governor-injector")
	if cm == nil {
		t.Fatal("no ConfigMap governor-injector")
	}
	cfg, err := kubeinject.ParseConfig([]byte(cm.Data["inject.yaml"]))
	if err != nil {
		t.Fatalf("the injector's config does not load: %v\n%s", err, cm.Data["inject.yaml"])
	}
	if want := "governord." + releaseNamespace + ".svc:7600"; cfg.GovernorAddr != want {
		t.Errorf("the sidecars reach governord at %s, not its Service %s", cfg.GovernorAddr, want)
	}
	if repo, _ := dig(values, "image", "repository").(string); repo != "" && !strings.HasPrefix(cfg.Image, repo+":") {
		t.Errorf("the sidecars run %s, not %s", cfg.Image, repo)
	}

	// The webhook: the injector's Service, its path, and the policy asked.
	wh := find[admissionregistrationv1.MutatingWebhookConfiguration](objs, "governor-injector")
	dep := find[appsv1.Deployment](objs, "governor-injector")
	svc := find[corev1.Service](objs, "governor-injector")
	if wh == nil || dep == nil || svc == nil || len(wh.Webhooks) != 1 {
		t.Fatalf("the injector lacks its webhook configuration, Deployment or Service")
	}
	hook := wh.Webhooks[0]
	ref := hook.ClientConfig.Service
	if ref == nil || ref.Name != svc.Name || ref.Namespace != releaseNamespace || ref.Path == nil || *ref.Path != "/mutate" || ref.Port == nil {
		t.Fatalf("the webhook calls %+v, not the injector's Service's /mutate", ref)
	}
	port := slices.IndexFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Port == *ref.Port })
	if port < 0 {
		t.Fatalf("the injector's Service has no port %d", *ref.Port)
	}
	c := dep.Spec.Template.Spec.Containers[0]
	if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == svc.Spec.Ports[port].TargetPort.StrVal }) ||
		!slices.Contains(c.Command, "serve") || !slices.Contains(c.Command, "/etc/governor-inject/inject.yaml") {
		t.Errorf("the injector's container %v does not serve the webhook on the Service's target port", c.Command)
	}
	want := "Fail"
	if p, ok := dig(values, "injector", "failurePolicy").(string); ok {
		want = p
	}
	if hook.FailurePolicy == nil || string(*hook.FailurePolicy) != want || hook.SideEffects == nil || *hook.SideEffects != admissionregistrationv1.SideEffectClassNone {
		t.Errorf("failurePolicy %v, sideEffects %v; want %s, None", hook.FailurePolicy, hook.SideEffects, want)
	}
	if !slices.ContainsFunc(hook.NamespaceSelector.MatchExpressions, func(e metav1.LabelSelectorRequirement) bool {
		return e.Key == "kubernetes.io/metadata.name" && string(e.Operator) == "NotIn" && slices.Contains(e.Values, releaseNamespace)
	}) {
		t.Errorf("the webhook sees its own namespace: %+v", hook.NamespaceSelector)
	}
	if len(hook.Rules) != 1 || !slices.Equal(hook.Rules[0].Resources, []string{"pods"}) || !slices.Equal(hook.Rules[0].Operations, []admissionregistrationv1.OperationType{"CREATE"}) {
		t.Errorf("the webhook's rules: %+v", hook.Rules)
	}

	// A Deployment injected with this config: the sidecar is native and
	// reaches the governord this chart runs.
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "worker", Image: "example.com/crawler:1"}}}}
	pod.Annotations = map[string]string{kubeinject.AnnotationInject: "true", kubeinject.AnnotationConfig: "crawler-proxy"}
	if outcome, err := kubeinject.Inject(pod, cfg); err != nil || outcome != kubeinject.Injected {
		t.Fatalf("injecting a worker: %s, %v", outcome, err)
	}
	checkNativeSidecar(t, pod.Spec)
	proxy := pod.Spec.InitContainers[0]
	if addr := envValue(proxy, "GOVERNOR_ADDR"); !strings.HasPrefix(addr, "governord.") || find[corev1.Service](objs, strings.Split(addr, ".")[0]) == nil {
		t.Errorf("the sidecar's GOVERNOR_ADDR %s is not a Service of the chart", addr)
	}
}

// checkNativeSidecar: governor-proxy is an init container that restarts
// always, so it starts before the app and stops after it.
func checkNativeSidecar(t *testing.T, spec corev1.PodSpec) {
	t.Helper()
	if len(spec.InitContainers) == 0 || spec.InitContainers[0].Name != kubeinject.ProxyContainer {
		t.Fatalf("the first init container is not %s: %+v", kubeinject.ProxyContainer, spec.InitContainers)
	}
	p := spec.InitContainers[0]
	if p.RestartPolicy == nil || *p.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Errorf("%s is not a native sidecar: restartPolicy %s", p.Name, restartPolicyOf(p))
	}
	if slices.ContainsFunc(spec.Containers, func(c corev1.Container) bool { return c.Name == kubeinject.ProxyContainer }) {
		t.Errorf("%s is among the app containers too", kubeinject.ProxyContainer)
	}
}

func restartPolicyOf(c corev1.Container) string {
	if c.RestartPolicy == nil {
		return "unset"
	}
	return string(*c.RestartPolicy)
}

func secretCert(t *testing.T, objs []renderedObject, name, key string) *x509.Certificate {
	t.Helper()
	s := find[corev1.Secret](objs, name)
	if s == nil {
		t.Fatalf("no Secret %s", name)
	}
	return parsePEMCert(t, s.Data[key], name+" "+key)
}

func parsePEMCert(t *testing.T, text []byte, what string) *x509.Certificate {
	t.Helper()
	b, _ := pem.Decode(text)
	if b == nil {
		t.Fatalf("%s is not PEM", what)
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return c
}

// checkSelfSigned: the chart's CA signs governord's certificate for the
// names the sidecars and standbys dial, and the webhook's for the name the
// API server dials, and the webhook's caBundle and governord-ca are it.
func checkSelfSigned(t *testing.T, objs []renderedObject, injector, ha bool) {
	t.Helper()
	ca := secretCert(t, objs, "governor-ca", "tls.crt")
	if !ca.IsCA {
		t.Error("governor-ca is not a CA")
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	verify := func(c *x509.Certificate, host string) {
		t.Helper()
		if _, err := c.Verify(x509.VerifyOptions{Roots: roots, DNSName: host}); err != nil {
			t.Errorf("the certificate of %s: %v", host, err)
		}
	}
	verify(secretCert(t, objs, "governord-tls", "tls.crt"), "governord."+releaseNamespace+".svc")
	if ha {
		verify(secretCert(t, objs, "governord-tls", "tls.crt"), "governord-2.governord-peers."+releaseNamespace+".svc")
	}
	for _, o := range objs {
		if cm, ok := o.obj.(*corev1.ConfigMap); ok && cm.Name == "governord-ca" {
			if cm.Namespace == "" || !ca.Equal(parsePEMCert(t, []byte(cm.Data["ca.crt"]), "governord-ca in "+cm.Namespace)) {
				t.Errorf("governord-ca in %q is not the CA", cm.Namespace)
			}
		}
	}
	if !injector {
		return
	}
	verify(secretCert(t, objs, "governor-injector-tls", "tls.crt"), "governor-injector."+releaseNamespace+".svc")
	wh := find[admissionregistrationv1.MutatingWebhookConfiguration](objs, "governor-injector")
	if !ca.Equal(parsePEMCert(t, wh.Webhooks[0].ClientConfig.CABundle, "the webhook's caBundle")) {
		t.Error("the webhook's caBundle is not the CA that signed the injector's certificate")
	}
}

// certManagerCertificate is the part of cert-manager.io/v1 Certificate the
// chart writes; decodeManifest holds the documents to these fields.
type certManagerCertificate struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       certManagerCertSp `json:"spec"`
}

type certManagerCertSp struct {
	IsCA        bool     `json:"isCA,omitempty"`
	CommonName  string   `json:"commonName,omitempty"`
	SecretName  string   `json:"secretName"`
	Duration    string   `json:"duration,omitempty"`
	RenewBefore string   `json:"renewBefore,omitempty"`
	DNSNames    []string `json:"dnsNames,omitempty"`
	PrivateKey  *struct {
		Algorithm string `json:"algorithm"`
		Size      int    `json:"size"`
	} `json:"privateKey,omitempty"`
	IssuerRef struct {
		Name  string `json:"name"`
		Kind  string `json:"kind,omitempty"`
		Group string `json:"group,omitempty"`
	} `json:"issuerRef"`
}

type certManagerIssuer struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       struct {
		SelfSigned *struct{} `json:"selfSigned,omitempty"`
		CA         *struct {
			SecretName string `json:"secretName"`
		} `json:"ca,omitempty"`
	} `json:"spec"`
}

func checkCertManager(t *testing.T, objs []renderedObject, injector bool) {
	t.Helper()
	certs := map[string]*certManagerCertificate{}
	issuers := map[string]*certManagerIssuer{}
	for _, o := range objs {
		switch v := o.obj.(type) {
		case *certManagerCertificate:
			certs[v.Metadata.Name] = v
		case *certManagerIssuer:
			issuers[v.Metadata.Name] = v
		}
	}
	check := func(secret, host string) {
		t.Helper()
		c := certs[secret]
		if c == nil || c.Spec.SecretName != secret || !slices.Contains(c.Spec.DNSNames, host) {
			t.Errorf("no Certificate for Secret %s naming %s: %+v", secret, host, c)
			return
		}
		if ref := c.Spec.IssuerRef; ref.Kind == "Issuer" && issuers[ref.Name] == nil {
			t.Errorf("Certificate %s's Issuer %s is not rendered", secret, ref.Name)
		}
	}
	check("governord-tls", "governord."+releaseNamespace+".svc")
	if injector {
		check("governor-injector-tls", "governor-injector."+releaseNamespace+".svc")
		wh := find[admissionregistrationv1.MutatingWebhookConfiguration](objs, "governor-injector")
		if wh.Annotations["cert-manager.io/inject-ca-from"] != releaseNamespace+"/governor-injector-tls" || len(wh.Webhooks[0].ClientConfig.CABundle) != 0 {
			t.Errorf("the webhook's caBundle is not left to cert-manager's cainjector: %v", wh.Annotations)
		}
	}
}

func checkMonitoring(t *testing.T, objs []renderedObject, values map[string]any) {
	t.Helper()
	on := func(what string) bool { return dig(values, "metrics", what, "enabled") == true }
	sm := find[monitoringv1.ServiceMonitor](objs, "governord")
	if (sm != nil) != on("serviceMonitor") {
		t.Errorf("ServiceMonitor rendered %v", sm != nil)
	}
	if sm != nil {
		svc := find[corev1.Service](objs, "governord")
		if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == sm.Spec.Endpoints[0].Port }) ||
			!maps.Equal(sm.Spec.Selector.MatchLabels, svc.Spec.Selector) {
			t.Errorf("the ServiceMonitor does not select governord's metrics port")
		}
	}
	if pm := find[monitoringv1.PodMonitor](objs, "governor-proxy"); (pm != nil) != on("podMonitor") {
		t.Errorf("PodMonitor rendered %v", pm != nil)
	} else if pm != nil && (pm.Spec.Selector.MatchLabels[kubeinject.InjectedLabel] != "true" || pm.Spec.PodMetricsEndpoints[0].Port == nil) {
		t.Errorf("the PodMonitor does not select the injected pods: %+v", pm.Spec)
	}
	rule := find[monitoringv1.PrometheusRule](objs, "governor")
	if (rule != nil) != on("prometheusRule") {
		t.Errorf("PrometheusRule rendered %v", rule != nil)
	}
	if rule != nil {
		checkRulePromtool(t, rule)
	}
	dash := find[corev1.ConfigMap](objs, "governor-dashboard")
	if (dash != nil) != on("grafanaDashboard") {
		t.Errorf("the dashboard's ConfigMap rendered %v", dash != nil)
	}
	if dash != nil {
		want, err := os.ReadFile(dashboardFile)
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(dash.Data["governor.json"]) != strings.TrimSpace(string(want)) || dash.Labels["grafana_dashboard"] != "1" {
			t.Errorf("the dashboard's ConfigMap is not %s, labelled for Grafana", dashboardFile)
		}
	}
}

// checkRulePromtool puts the PrometheusRule's groups through promtool, as
// TestAlertRulesPromtool puts prometheus/alerts.yaml: check rules, and the
// unit tests of prometheus/alerts_test.yaml run against them.
func checkRulePromtool(t *testing.T, rule *monitoringv1.PrometheusRule) {
	t.Helper()
	promtool := lookPromtool(t)
	if promtool == "" {
		return
	}
	dir := t.TempDir()
	groups, err := sigsyaml.Marshal(map[string]any{"groups": rule.Spec.Groups})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts.yaml"), groups, 0o644); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile("prometheus/alerts_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts_test.yaml"), tests, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"check", "rules", "alerts.yaml"}, {"test", "rules", "alerts_test.yaml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s on the PrometheusRule: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// TestChartCopiesAreCurrent: a chart cannot read files outside its folder,
// so it holds copies of prometheus/alerts.yaml and grafana/governor.json,
// which stay their source. -rewrite copies them again.
func TestChartCopiesAreCurrent(t *testing.T) {
	for src, dst := range map[string]string{alertsFile: chartDir + "/files/alerts.yaml", dashboardFile: chartDir + "/files/governor.json"} {
		want, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if *rewrite {
			if err := os.WriteFile(dst, want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(dst)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s is not a copy of %s (go test ./deploy -run TestChartCopiesAreCurrent -rewrite): %v", dst, src, err)
		}
	}
}

// lookPromtool finds promtool, which scripts/compat.sh installs for
// ./test.sh. Without it the rule is not checked, unless GOVERNOR_COMPAT
// says the matrix's tools must be there.
func lookPromtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err == nil {
		return p
	}
	if os.Getenv("GOVERNOR_COMPAT") != "" {
		t.Fatal("promtool is not installed (scripts/compat.sh installs it)")
	}
	t.Log("promtool is not installed (scripts/compat.sh installs it): the PrometheusRule is not put through it")
	return ""
}

// TestChartREADMEDocumentsEveryValue: every value of values.yaml is named
// in the README's table (a map value may be named whole, as
// governord.config is).
func TestChartREADMEDocumentsEveryValue(t *testing.T) {
	text, err := os.ReadFile(chartDir + "/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(chartDir + "/README.md")
	if err != nil {
		t.Fatal(err)
	}
	named := func(path string) bool { return bytes.Contains(readme, []byte("`"+path+"`")) }
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		if prefix != "" && named(prefix) {
			return
		}
		m, ok := v.(map[string]any)
		if !ok || len(m) == 0 {
			t.Errorf("%s/README.md does not name the value `%s`", chartDir, prefix)
			return
		}
		for _, k := range slices.Sorted(maps.Keys(m)) {
			p := k
			if prefix != "" {
				p = prefix + "." + k
			}
			walk(p, m[k])
		}
	}
	walk("", parseValues(t, string(text)))
}
