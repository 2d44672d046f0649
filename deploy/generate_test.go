package deploy

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/governor-project/governor/kubeinject"
)

// generated are kubernetes/'s manifests and what each is made from: a
// values file the chart is rendered with, or an annotated manifest
// injected with the injector config the chart renders.
var generated = []struct{ file, from string }{
	{"kubernetes/governord.yaml", "kubernetes/source/governord.values.yaml"},
	{"kubernetes/governord-ha.yaml", "kubernetes/source/governord-ha.values.yaml"},
	{"kubernetes/worker-with-sidecar.yaml", "kubernetes/source/worker-with-sidecar.yaml"},
	{"kubernetes/worker-with-sidecar-intercept.yaml", "kubernetes/source/worker-with-sidecar-intercept.yaml"},
}

// TestKubernetesManifestsAreGenerated holds kubernetes/'s manifests to what
// the chart and the injector make of their sources, so that there is one
// source: the plain manifests are for those who apply YAML without Helm.
// -rewrite writes them.
func TestKubernetesManifestsAreGenerated(t *testing.T) {
	for _, g := range generated {
		want := generate(t, g.from)
		text := []byte(fmt.Sprintf("# Generated from %s by `go test ./deploy -run TestKubernetesManifestsAreGenerated -rewrite`:\n# edit that (or the chart, deploy/helm/governor), not this.\n%s",
			strings.TrimPrefix(g.from, "kubernetes/"), want))
		if *rewrite {
			if err := os.WriteFile(g.file, text, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(g.file)
		if err != nil || !bytes.Equal(got, text) {
			t.Errorf("%s is not what %s generates (go test ./deploy -run TestKubernetesManifestsAreGenerated -rewrite, then read the diff): %v", g.file, g.from, err)
		}
	}
}

func generate(t *testing.T, from string) []byte {
	t.Helper()
	if strings.HasSuffix(from, ".values.yaml") {
		text, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := renderChart(t, parseValues(t, string(text)))
		if err != nil {
			t.Fatal(err)
		}
		var docs []string
		for _, o := range objs {
			docs = append(docs, strings.Trim(string(o.doc), "\n"))
		}
		return []byte(strings.Join(docs, "\n---\n") + "\n")
	}
	// The injector's config as the chart renders it for this repository's
	// image, with cert-manager so that nothing random is rendered.
	objs, err := renderChart(t, map[string]any{"tls": map[string]any{"mode": "certManager"}})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := kubeinject.ParseConfig([]byte(find[corev1.ConfigMap](objs, "governor-injector").Data["inject.yaml"]))
	if err != nil {
		t.Fatal(err)
	}
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	var out bytes.Buffer
	if _, err := kubeinject.InjectManifests(in, &out, cfg); err != nil {
		t.Fatalf("%s: %v", from, err)
	}
	return out.Bytes()
}

// The injected manifests' sidecars are native.
func TestKubernetesWorkersHaveNativeSidecars(t *testing.T) {
	for _, f := range []string{"kubernetes/worker-with-sidecar.yaml", interceptManifest} {
		spec, _ := podOf(t, f)
		if f == interceptManifest {
			spec = &corev1.PodSpec{InitContainers: spec.InitContainers[1:], Containers: spec.Containers}
		}
		checkNativeSidecar(t, *spec)
	}
}
