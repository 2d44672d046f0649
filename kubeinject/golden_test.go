package kubeinject

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
)

var rewrite = flag.Bool("rewrite", false, "write testdata/*.want.json from what the webhook answers")

// goldenConfig is the injector's config the golden files are made with.
const goldenConfig = "testdata/inject.yaml"

// wantResponse is an AdmissionResponse as the golden files show it: the
// patch as JSON rather than base64.
type wantResponse struct {
	Allowed bool            `json:"allowed"`
	Patch   json.RawMessage `json:"patch,omitempty"`
	Code    int32           `json:"code,omitempty"`
	Message string          `json:"message,omitempty"`
}

// decodeStrictly decodes JSON, refusing a field the type does not have.
func decodeStrictly(t *testing.T, text []byte, into any) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(text))
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		t.Fatalf("decoding %T: %v", into, err)
	}
}

// TestWebhookGolden answers each AdmissionReview of testdata/*.review.json
// and holds the answer to its .want.json: a plain pod, a pod with an init
// container and a native sidecar of its own, one opted out, one with
// interception and DSNs, one with the sidecar already, and one the
// injector must refuse. Each patch is then applied as the API server
// applies it (evanphx/json-patch), and the pod it gives is checked on its
// own terms and reviewed again, which must change nothing.
func TestWebhookGolden(t *testing.T) {
	cfg, err := LoadConfig(goldenConfig)
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob("testdata/*.review.json")
	if err != nil || len(files) < 6 {
		t.Fatalf("testdata holds %d reviews (%v)", len(files), err)
	}
	for _, file := range files {
		name := strings.TrimSuffix(filepath.Base(file), ".review.json")
		t.Run(name, func(t *testing.T) {
			review := readReview(t, file)
			resp := (&Webhook{Config: cfg}).Review(review.Request)
			if resp.UID != review.Request.UID {
				t.Errorf("the response's uid %q is not the request's", resp.UID)
			}
			got := wantResponse{Allowed: resp.Allowed}
			if resp.Patch != nil {
				if resp.PatchType == nil || *resp.PatchType != admissionv1.PatchTypeJSONPatch {
					t.Errorf("patch type %v", resp.PatchType)
				}
				got.Patch = resp.Patch
			}
			if resp.Result != nil {
				got.Code, got.Message = resp.Result.Code, resp.Result.Message
			}
			compareGolden(t, strings.TrimSuffix(file, ".review.json")+".want.json", got)
			if resp.Patch == nil {
				return
			}
			pod := applyPatch(t, review.Request.Object.Raw, resp.Patch)
			checkInjected(t, pod)
			again, err := json.Marshal(pod)
			if err != nil {
				t.Fatal(err)
			}
			review.Request.Object.Raw = again
			if resp := (&Webhook{Config: cfg}).Review(review.Request); !resp.Allowed || resp.Patch != nil {
				t.Errorf("the injected pod reviewed again: allowed %v, patch %s", resp.Allowed, resp.Patch)
			}
		})
	}
}

func readReview(t *testing.T, file string) admissionv1.AdmissionReview {
	t.Helper()
	text, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var review admissionv1.AdmissionReview
	decodeStrictly(t, text, &review)
	var pod corev1.Pod
	decodeStrictly(t, review.Request.Object.Raw, &pod)
	return review
}

// applyPatch applies a JSON patch to a pod's JSON with the library the API
// server applies webhooks' patches with, and decodes the result strictly.
func applyPatch(t *testing.T, podJSON, patch []byte) *corev1.Pod {
	t.Helper()
	p, err := jsonpatch.DecodePatch(patch)
	if err != nil {
		t.Fatalf("the patch does not decode: %v", err)
	}
	out, err := p.Apply(podJSON)
	if err != nil {
		t.Fatalf("the patch does not apply: %v", err)
	}
	var pod corev1.Pod
	decodeStrictly(t, out, &pod)
	return &pod
}

func compareGolden(t *testing.T, file string, got wantResponse) {
	t.Helper()
	text, err := json.MarshalIndent(got, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	text = append(text, '\n')
	if *rewrite {
		if err := os.WriteFile(file, text, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("%v (go test -run TestWebhookGolden -rewrite writes it)", err)
	}
	if !bytes.Equal(want, text) {
		t.Errorf("%s differs from the answer (go test -run TestWebhookGolden -rewrite, then read the diff):\n%s", file, text)
	}
}

// checkInjected checks an injected pod without the golden files: the
// sidecar is native and first (after the CA step), each of its mounts and
// probes names what exists, and every app container goes through it.
func checkInjected(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	spec := pod.Spec
	i := slices.IndexFunc(spec.InitContainers, func(c corev1.Container) bool { return c.Name == ProxyContainer })
	if i < 0 {
		t.Fatalf("no init container %s", ProxyContainer)
	}
	proxy := spec.InitContainers[i]
	if proxy.RestartPolicy == nil || *proxy.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Errorf("%s is not a native sidecar: restartPolicy %q", ProxyContainer, ptrValue(proxy.RestartPolicy))
	}
	want := 0
	if pod.Annotations[AnnotationIntercept] != "" {
		want = 1
		if spec.InitContainers[0].Name != CAContainer {
			t.Errorf("the CA step is not the first init container")
		}
	}
	if i != want {
		t.Errorf("%s is init container %d, want %d: the pod's own init containers would run ungoverned before it", ProxyContainer, i, want)
	}
	if proxy.StartupProbe == nil || proxy.ReadinessProbe == nil || proxy.LivenessProbe == nil || proxy.Resources.Requests.Cpu().IsZero() {
		t.Errorf("%s lacks probes or requests", ProxyContainer)
	}
	volumes := map[string]bool{}
	for _, v := range spec.Volumes {
		if volumes[v.Name] {
			t.Errorf("volume %s twice", v.Name)
		}
		volumes[v.Name] = true
	}
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		for _, m := range c.VolumeMounts {
			if !volumes[m.Name] {
				t.Errorf("container %s mounts %s, which is no volume", c.Name, m.Name)
			}
		}
	}
	for _, c := range spec.Containers {
		for _, v := range []string{"HTTP_PROXY", "HTTPS_PROXY"} {
			if got := envOf(c, v); got != "http://"+ProxyListen {
				t.Errorf("container %s: %s=%q", c.Name, v, got)
			}
		}
		if !strings.Contains(envOf(c, "NO_PROXY"), "127.0.0.1") {
			t.Errorf("container %s: NO_PROXY=%q lacks the loopback", c.Name, envOf(c, "NO_PROXY"))
		}
	}
	if pod.Labels[InjectedLabel] != "true" {
		t.Errorf("no label %s", InjectedLabel)
	}
}

func envOf(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

func ptrValue[T any](p *T) any {
	if p == nil {
		return "unset"
	}
	return *p
}
