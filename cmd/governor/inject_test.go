package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/governor-project/governor/internal/testcert"
)

// The webhook's golden reviews, their answers and the config they are
// made with (package kubeinject's TestWebhookGolden).
const (
	goldenDir    = "../../kubeinject/testdata"
	goldenConfig = goldenDir + "/inject.yaml"
)

type goldenCase struct {
	name   string
	review []byte
	pod    []byte // the review's object
	want   struct {
		Allowed bool            `json:"allowed"`
		Patch   json.RawMessage `json:"patch"`
		Message string          `json:"message"`
	}
}

func goldenCases(t *testing.T) []goldenCase {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(goldenDir, "*.review.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden reviews in %s: %v", goldenDir, err)
	}
	var cases []goldenCase
	for _, f := range files {
		c := goldenCase{name: strings.TrimSuffix(filepath.Base(f), ".review.json")}
		var err error
		if c.review, err = os.ReadFile(f); err != nil {
			t.Fatal(err)
		}
		var r admissionv1.AdmissionReview
		if err := json.Unmarshal(c.review, &r); err != nil {
			t.Fatal(err)
		}
		c.pod = r.Request.Object.Raw
		want, err := os.ReadFile(strings.TrimSuffix(f, ".review.json") + ".want.json")
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(want, &c.want); err != nil {
			t.Fatal(err)
		}
		cases = append(cases, c)
	}
	return cases
}

// webhooksPod is the golden pod with the golden patch applied, as the API
// server applies it.
func (c goldenCase) webhooksPod(t *testing.T) corev1.Pod {
	t.Helper()
	podJSON := c.pod
	if len(c.want.Patch) > 0 {
		p, err := jsonpatch.DecodePatch(c.want.Patch)
		if err != nil {
			t.Fatal(err)
		}
		if podJSON, err = p.Apply(podJSON); err != nil {
			t.Fatal(err)
		}
	}
	var pod corev1.Pod
	if err := json.Unmarshal(podJSON, &pod); err != nil {
		t.Fatal(err)
	}
	return pod
}

// TestInjectCommandGivesTheWebhooksPods runs the webhook's golden inputs
// through `governor inject -f`, each as a Pod and as a Deployment's
// template, and holds the pods it prints to the ones the webhook's golden
// patches make; the input the webhook refuses, it refuses with the same
// words.
func TestInjectCommandGivesTheWebhooksPods(t *testing.T) {
	for _, c := range goldenCases(t) {
		t.Run(c.name, func(t *testing.T) {
			podYAML, err := sigsyaml.JSONToYAML(c.pod)
			if err != nil {
				t.Fatal(err)
			}
			var pod corev1.Pod
			if err := json.Unmarshal(c.pod, &pod); err != nil {
				t.Fatal(err)
			}
			deployment := appsv1.Deployment{TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
				ObjectMeta: metav1.ObjectMeta{Name: "crawler"},
				Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: pod.Labels},
					Template: corev1.PodTemplateSpec{ObjectMeta: pod.ObjectMeta, Spec: pod.Spec}}}
			deploymentYAML, err := sigsyaml.Marshal(deployment)
			if err != nil {
				t.Fatal(err)
			}
			file := filepath.Join(t.TempDir(), "manifests.yaml")
			if err := os.WriteFile(file, []byte(string(podYAML)+"---\n"+string(deploymentYAML)), 0o644); err != nil {
				t.Fatal(err)
			}
			var out, errOut bytes.Buffer
			code := run([]string{"inject", "-config", goldenConfig, "-f", file}, nil, &out, &errOut)
			if !c.want.Allowed {
				if code != 1 || !strings.Contains(errOut.String(), strings.TrimPrefix(c.want.Message, "governor inject: ")) || out.Len() != 0 {
					t.Errorf("exit %d, stderr %q; the webhook says %q", code, errOut.String(), c.want.Message)
				}
				return
			}
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut.String())
			}
			docs := strings.Split(out.String(), "\n---\n")
			if len(docs) != 2 {
				t.Fatalf("%d documents out", len(docs))
			}
			var gotPod corev1.Pod
			if err := sigsyaml.UnmarshalStrict([]byte(docs[0]), &gotPod); err != nil {
				t.Fatal(err)
			}
			var gotDeployment appsv1.Deployment
			if err := sigsyaml.UnmarshalStrict([]byte(docs[1]), &gotDeployment); err != nil {
				t.Fatal(err)
			}
			want := c.webhooksPod(t)
			samePod(t, "the Pod", gotPod, want)
			fromTemplate := corev1.Pod{TypeMeta: want.TypeMeta, ObjectMeta: gotDeployment.Spec.Template.ObjectMeta, Spec: gotDeployment.Spec.Template.Spec}
			samePod(t, "the Deployment's template", fromTemplate, want)
		})
	}
}

func samePod(t *testing.T, what string, got, want corev1.Pod) {
	t.Helper()
	g, err := json.MarshalIndent(got, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	w, err := json.MarshalIndent(want, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(g, w) {
		t.Errorf("%s from governor inject:\n%s\nthe webhook's:\n%s", what, g, w)
	}
}

// TestInjectServeOverHTTPS starts `governor inject serve` as a process with
// a TLS certificate and has curl POST each golden AdmissionReview to it
// over HTTPS, as the API server does. Each answer is decoded strictly with
// Kubernetes' types and must be the golden one.
func TestInjectServeOverHTTPS(t *testing.T) {
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Skip("no curl")
	}
	bin := buildCLI(t)
	cert := testcert.New(t, "127.0.0.1")
	cmd := exec.Command(bin, "inject", "serve", "-config", goldenConfig, "-listen", "127.0.0.1:0",
		"-tls-cert", cert.CertFile, "-tls-key", cert.KeyFile)
	// An io.Pipe rather than StderrPipe: Wait then returns only once every
	// line has been copied, so the last ones are not lost.
	stderr, stderrW := io.Pipe()
	cmd.Stderr = stderrW
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	logs := make(chan string, 100)
	addr := make(chan string, 1)
	go func() {
		defer close(logs)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var line struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "serving" {
				addr <- line.Addr
			}
			select {
			case logs <- sc.Text():
			default:
			}
		}
	}()
	go func() { err := cmd.Wait(); stderrW.Close(); exited <- err }()
	t.Cleanup(func() { cmd.Process.Kill() })
	var base string
	select {
	case a := <-addr:
		base = "https://" + a
	case err := <-exited:
		t.Fatalf("governor inject serve exited: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("governor inject serve did not say it was serving")
	}

	post := func(body []byte) []byte {
		t.Helper()
		c := exec.Command(curl, "-sS", "--fail-with-body", "--cacert", cert.CertFile, "-H", "Content-Type: application/json",
			"--data-binary", "@-", base+"/mutate")
		c.Stdin = bytes.NewReader(body)
		out, err := c.Output()
		if err != nil {
			t.Fatalf("curl: %v\n%s", err, out)
		}
		return out
	}
	for _, c := range goldenCases(t) {
		var review admissionv1.AdmissionReview
		dec := json.NewDecoder(bytes.NewReader(post(c.review)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&review); err != nil {
			t.Errorf("%s: the answer does not decode strictly: %v", c.name, err)
			continue
		}
		var sent admissionv1.AdmissionReview
		if err := json.Unmarshal(c.review, &sent); err != nil {
			t.Fatal(err)
		}
		resp := review.Response
		switch {
		case review.APIVersion != "admission.k8s.io/v1" || review.Kind != "AdmissionReview" || review.Request != nil:
			t.Errorf("%s: answered %s %s with a request %v", c.name, review.APIVersion, review.Kind, review.Request != nil)
		case resp == nil || resp.UID != sent.Request.UID:
			t.Errorf("%s: the response %+v does not answer uid %s", c.name, resp, sent.Request.UID)
		case resp.Allowed != c.want.Allowed:
			t.Errorf("%s: allowed %v, want %v", c.name, resp.Allowed, c.want.Allowed)
		case !c.want.Allowed && (resp.Result == nil || resp.Result.Message != c.want.Message):
			t.Errorf("%s: refused with %+v, want %q", c.name, resp.Result, c.want.Message)
		case !sameJSON(t, resp.Patch, c.want.Patch):
			t.Errorf("%s: patch %s, want %s", c.name, resp.Patch, c.want.Patch)
		}
	}
	health, err := exec.Command(curl, "-sS", "--fail", "--cacert", cert.CertFile, base+"/healthz").CombinedOutput()
	if err != nil || string(health) != "ok\n" {
		t.Errorf("/healthz: %v %q", err, health)
	}
	// Not an AdmissionReview: a 400 the API server logs, not a crash.
	if out, err := exec.Command(curl, "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--cacert", cert.CertFile,
		"--data-binary", "{}", base+"/mutate").Output(); err != nil || string(out) != "400" {
		t.Errorf("an empty review: %v %s", err, out)
	}

	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("after SIGTERM: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("governor inject serve did not stop on SIGTERM")
	}
	var lines []string
	for l := range logs {
		lines = append(lines, l)
	}
	if log := strings.Join(lines, "\n"); !strings.Contains(log, `"msg":"injected"`) || !strings.Contains(log, `"msg":"refused"`) {
		t.Errorf("the log does not say what was injected and refused:\n%s", log)
	}
}

func sameJSON(t *testing.T, a, b []byte) bool {
	t.Helper()
	if len(a) == 0 || len(b) == 0 {
		return len(a) == len(b)
	}
	var ca, cb bytes.Buffer
	if err := json.Compact(&ca, a); err != nil {
		t.Fatal(err)
	}
	if err := json.Compact(&cb, b); err != nil {
		t.Fatal(err)
	}
	return bytes.Equal(ca.Bytes(), cb.Bytes())
}
