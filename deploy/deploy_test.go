// Package deploy holds deployment examples; its test checks that the configs
// embedded in the Kubernetes manifests load with the real config parsers.
package deploy

import (
	"os"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/governor-project/governor/server"
	"github.com/governor-project/governor/sidecar"
)

// configMapFile returns data[key] of the ConfigMap named name in a manifest.
func configMapFile(t *testing.T, path, name, key string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	for {
		var doc struct {
			Kind     string
			Metadata struct{ Name string }
			Data     map[string]string
		}
		if err := dec.Decode(&doc); err != nil {
			t.Fatalf("%s: no ConfigMap %s with %s: %v", path, name, key, err)
		}
		if doc.Kind == "ConfigMap" && doc.Metadata.Name == name {
			return []byte(doc.Data[key])
		}
	}
}

func TestKubernetesConfigsLoad(t *testing.T) {
	t.Setenv("GOVERNOR_ADMIN_KEY", "a")
	t.Setenv("PAYMENTS_KEY", "p")
	t.Setenv("GOVERNOR_API_KEY", "p")
	t.Setenv("POD_NAME", "crawler-0")
	cfg, err := server.ParseConfig(configMapFile(t, "kubernetes/governord.yaml", "governord", "governor.yaml"))
	if err != nil {
		t.Fatalf("governord's config: %v", err)
	}
	if cfg.TLS.CertFile == "" || !strings.HasPrefix(cfg.Listen, "0.0.0.0") {
		t.Fatalf("governord's config: %+v", cfg)
	}
	pcfg, err := sidecar.ParseConfig(configMapFile(t, "kubernetes/worker-with-sidecar.yaml", "crawler-proxy", "proxy.yaml"))
	if err != nil {
		t.Fatalf("the sidecar's config: %v", err)
	}
	_ = pcfg
}
