package deploy

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/governor-project/governor/internal/govtest"
	"github.com/governor-project/governor/internal/testcert"
	"github.com/governor-project/governor/proxy/intercept"
	"github.com/governor-project/governor/proxy/proxyconfig"
)

const interceptManifest = "kubernetes/worker-with-sidecar-intercept.yaml"

// podOf returns the pod template of the manifest's Deployment, and its
// ConfigMaps by name.
func podOf(t *testing.T, path string) (*corev1.PodSpec, map[string]*corev1.ConfigMap) {
	t.Helper()
	var spec *corev1.PodSpec
	configMaps := map[string]*corev1.ConfigMap{}
	for _, doc := range documents(t, path) {
		obj, err := decodeManifest(doc)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		switch o := obj.(type) {
		case *appsv1.Deployment:
			spec = &o.Spec.Template.Spec
		case *corev1.ConfigMap:
			configMaps[o.Name] = o
		}
	}
	if spec == nil {
		t.Fatalf("%s: no Deployment", path)
	}
	return spec, configMaps
}

// mounted maps a path a container sees to the volume its mounts give it
// from and the path inside that volume ("" for the volume's root).
func mounted(c corev1.Container, p string) (volume, inside string, ok bool) {
	best := -1
	for _, m := range c.VolumeMounts {
		root := strings.TrimSuffix(m.MountPath, "/")
		if p != root && !strings.HasPrefix(p, root+"/") || len(root) <= best {
			continue
		}
		best = len(root)
		volume, inside, ok = m.Name, path.Join(m.SubPath, strings.TrimPrefix(p, root)), true
		inside = strings.TrimPrefix(inside, "/")
	}
	return volume, inside, ok
}

func container(t *testing.T, cs []corev1.Container, name string) corev1.Container {
	t.Helper()
	for _, c := range cs {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %s", name)
	return corev1.Container{}
}

func flagValue(args []string, name string) string {
	for i, a := range args {
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

func envValue(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

// pemCerts are the certificates of a PEM file, in order.
func pemCerts(t *testing.T, file string) []*x509.Certificate {
	t.Helper()
	text, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []*x509.Certificate
	for rest := text; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			return out
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
}

// TestKubernetesInterceptCA plays the interception manifest's pod on this
// machine, each volume a directory: the init container's own command (the
// real governor CLI, with its arguments as written) makes the CA into its
// volume; the sidecar's config, read from the ConfigMap its -config names,
// finds the CA where the sidecar's mounts put it, and the CA's name
// constraints permit every intercepted host and nothing else; the worker's
// SSL_CERT_FILE, REQUESTS_CA_BUNDLE and NODE_EXTRA_CA_CERTS name files its
// mounts give it, the bundles holding the public roots and the CA; and no
// mount of the worker reaches the key.
func TestKubernetesInterceptCA(t *testing.T) {
	setManifestEnv(t)
	spec, configMaps := podOf(t, interceptManifest)
	volumes := t.TempDir()
	onHost := func(volume, inside string) string { return filepath.Join(volumes, volume, filepath.FromSlash(inside)) }

	// The init container that makes the CA, run as written but for the
	// image's roots file, which this machine may not have.
	var initC corev1.Container
	for _, c := range spec.InitContainers {
		if len(c.Args) >= 2 && c.Args[0] == "ca" && c.Args[1] == "create" {
			initC = c
		}
	}
	if initC.Name == "" || !slices.Equal(initC.Command, []string{"/usr/local/bin/governor"}) {
		t.Fatalf("no init container runs governor ca create: %+v", spec.InitContainers)
	}
	out := flagValue(initC.Args, "-out")
	caVolume, caDir, ok := mounted(initC, out)
	if !ok {
		t.Fatalf("the init container writes to %s, which none of its mounts holds", out)
	}
	for _, v := range spec.Volumes {
		if v.Name == caVolume && (v.EmptyDir == nil || v.EmptyDir.Medium != corev1.StorageMediumMemory) {
			t.Errorf("the CA's volume %s is not an emptyDir in memory: the key would leave the pod, or reach the node's disk", caVolume)
		}
	}
	if err := os.MkdirAll(onHost(caVolume, caDir), 0o755); err != nil {
		t.Fatal(err)
	}
	roots := testcert.New(t, "127.0.0.1")
	args := slices.Clone(initC.Args)
	for i := range args {
		switch {
		case i > 0 && args[i-1] == "-out":
			args[i] = onHost(caVolume, caDir)
		case i > 0 && args[i-1] == "-bundle-roots":
			args[i] = roots.CertFile
		}
	}
	cmd := exec.Command(buildGovernorCLI(t), args...)
	if text, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("governor %s: %v\n%s", strings.Join(initC.Args, " "), err, text)
	}

	// The sidecar's config, from the ConfigMap its -config is in.
	sidecar := container(t, spec.InitContainers, "governor-proxy")
	cfgVolume, cfgKey, ok := mounted(sidecar, flagValue(sidecar.Args, "-config"))
	if !ok {
		t.Fatalf("the sidecar's -config is in none of its mounts")
	}
	var cm *corev1.ConfigMap
	for _, v := range spec.Volumes {
		if v.Name == cfgVolume && v.ConfigMap != nil {
			cm = configMaps[v.ConfigMap.Name]
		}
	}
	if cm == nil || cm.Data[cfgKey] == "" {
		t.Fatalf("the sidecar's -config is not a key of a ConfigMap of the manifest")
	}
	cfg, err := proxyconfig.ParseConfig([]byte(cm.Data[cfgKey]))
	if err != nil {
		t.Fatal(err)
	}
	ic := cfg.HTTP.Intercept
	if !ic.On() {
		t.Fatal("the sidecar's config intercepts nothing")
	}
	sidecarFile := func(key, p string) string {
		t.Helper()
		v, inside, ok := mounted(sidecar, p)
		if !ok || v != caVolume {
			t.Fatalf("http.intercept.%s %s is not in the sidecar's mount of the CA's volume", key, p)
		}
		return onHost(v, inside)
	}
	ca, err := intercept.LoadCA(sidecarFile("ca_cert", ic.CACert), sidecarFile("ca_key", ic.CAKey), time.Now())
	if err != nil {
		t.Fatalf("the sidecar cannot load the CA the init container made: %v", err)
	}
	if d := time.Until(ca.Cert.NotAfter); d < 89*24*time.Hour {
		t.Errorf("the CA is valid for %v", d)
	}
	// Every host intercepted is one the CA may sign for, and no other.
	if ca.Cert.PermittedDNSDomains == nil && ca.Cert.PermittedIPRanges == nil {
		t.Error("the CA has no name constraints")
	}
	for _, h := range append(ic.Hosts.Patterns(), "example.com") {
		host := strings.Replace(h, "*", "a", 1)
		leaf, err := intercept.NewMinter(ca).Leaf(host)
		if err != nil {
			t.Fatal(err)
		}
		roots := x509.NewCertPool()
		roots.AddCert(ca.Cert)
		_, err = leaf.Leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: host})
		if listed := ic.Hosts.Match(host); (err == nil) != listed {
			t.Errorf("%s: intercepted %v, and its leaf verifies: %v", host, listed, err)
		}
	}

	// The worker: proxied through the sidecar, trusting the CA, never
	// seeing its key.
	worker := container(t, spec.Containers, "worker")
	for _, v := range []string{"HTTP_PROXY", "HTTPS_PROXY"} {
		if !strings.Contains(envValue(worker, v), cfg.HTTP.Listen) {
			t.Errorf("the worker's %s %q is not the sidecar's %s", v, envValue(worker, v), cfg.HTTP.Listen)
		}
	}
	for _, tc := range []struct {
		env       string
		withRoots bool // a file that replaces the roots must hold them too
	}{{"SSL_CERT_FILE", true}, {"REQUESTS_CA_BUNDLE", true}, {"NODE_EXTRA_CA_CERTS", false}} {
		p := envValue(worker, tc.env)
		v, inside, ok := mounted(worker, p)
		if !ok {
			t.Errorf("the worker's %s %q is in none of its mounts", tc.env, p)
			continue
		}
		certs := pemCerts(t, onHost(v, inside))
		hasCA := slices.ContainsFunc(certs, func(c *x509.Certificate) bool { return bytes.Equal(c.Raw, ca.Cert.Raw) })
		hasRoots := slices.ContainsFunc(certs, func(c *x509.Certificate) bool { return c.Subject.CommonName == "governor test" })
		if !hasCA || hasRoots != tc.withRoots {
			t.Errorf("the worker's %s (%s) holds the CA: %v, the public roots: %v; want true, %v", tc.env, p, hasCA, hasRoots, tc.withRoots)
		}
	}
	_, keyInside, _ := mounted(sidecar, ic.CAKey)
	for _, m := range worker.VolumeMounts {
		if m.Name == caVolume && (m.SubPath == "" || keyInside == m.SubPath || strings.HasPrefix(keyInside, m.SubPath+"/")) {
			t.Errorf("the worker's mount %s of %s reaches the CA's key", m.MountPath, m.Name)
		}
	}
}

// buildGovernorCLI builds the governor command, as the image holds it.
func buildGovernorCLI(t *testing.T) string { return govtest.Binary(t, "cmd/governor") }

func TestMain(m *testing.M) {
	code := m.Run()
	govtest.RemoveBinaries()
	os.Exit(code)
}
