package kubeinject

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MaxReviewBytes bounds an AdmissionReview's body. The API server stores
// objects of up to 1.5 MiB; a review carries the object and may carry the
// old one too.
const MaxReviewBytes = 8 << 20

// Webhook is the mutating admission webhook, an http.Handler for the
// path the MutatingWebhookConfiguration names. It answers every review of a
// pod's creation: with the patch that injects it, with no patch when the pod
// does not ask or has the sidecar already, and with a denial naming the
// annotation when the pod asks for something it cannot do. Whether the API
// server admits a pod when the webhook cannot be reached at all is the
// configuration's failurePolicy, not the webhook's.
type Webhook struct {
	Config Config
	// Log gets one line per review (the pod, its namespace and the outcome).
	// Nil: slog.Default().
	Log *slog.Logger
}

func (w *Webhook) log() *slog.Logger {
	if w.Log == nil {
		return slog.Default()
	}
	return w.Log
}

func (w *Webhook) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(rw, "POST an AdmissionReview", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(rw, r.Body, MaxReviewBytes))
	if err != nil {
		w.log().Warn("review unreadable", "err", err)
		http.Error(rw, fmt.Sprintf("reading the review: %v", err), http.StatusBadRequest)
		return
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil || review.Request == nil {
		if err == nil {
			err = errors.New("it has no request")
		}
		w.log().Warn("review malformed", "err", err)
		http.Error(rw, fmt.Sprintf("not an AdmissionReview: %v", err), http.StatusBadRequest)
		return
	}
	out := admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: w.Review(review.Request)}
	if out.APIVersion == "" {
		out.APIVersion, out.Kind = admissionv1.SchemeGroupVersion.String(), "AdmissionReview"
	}
	rw.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(rw).Encode(out); err != nil {
		w.log().Warn("writing the response", "uid", review.Request.UID, "err", err)
	}
}

var podResource = metav1.GroupVersionResource{Version: "v1", Resource: "pods"}

// Review answers one admission request.
func (w *Webhook) Review(req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	if req.Resource != podResource || req.SubResource != "" || req.Operation != admissionv1.Create {
		return resp // not ours to change: admitted as it is
	}
	var pod corev1.Pod
	if err := json.Unmarshal(req.Object.Raw, &pod); err != nil {
		return deny(resp, http.StatusBadRequest, fmt.Sprintf("governor inject: the object is not a Pod: %v", err))
	}
	name := pod.Name
	if name == "" {
		name = pod.GenerateName + "*"
	}
	outcome, patch, err := PatchPod(&pod, w.Config)
	if err != nil {
		w.log().Info("refused", "namespace", req.Namespace, "pod", name, "err", err)
		return deny(resp, http.StatusUnprocessableEntity, "governor inject: "+err.Error())
	}
	w.log().Info(string(outcome), "namespace", req.Namespace, "pod", name)
	if len(patch) > 0 {
		pt := admissionv1.PatchTypeJSONPatch
		resp.Patch, resp.PatchType = patch, &pt
	}
	return resp
}

func deny(resp *admissionv1.AdmissionResponse, code int32, message string) *admissionv1.AdmissionResponse {
	resp.Allowed = false
	resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: code, Message: message, Reason: metav1.StatusReasonInvalid}
	return resp
}

// PatchPod injects a copy of pod and returns the JSON patch from pod to it
// (nil when nothing changes).
func PatchPod(pod *corev1.Pod, cfg Config) (Outcome, []byte, error) {
	injected := pod.DeepCopy()
	outcome, err := Inject(injected, cfg)
	if err != nil || outcome != Injected {
		return outcome, nil, err
	}
	ops, err := diffObjects(pod, injected)
	if err != nil {
		return "", nil, err
	}
	patch, err := json.Marshal(ops)
	if err != nil {
		return "", nil, fmt.Errorf("encoding the patch: %w", err)
	}
	return outcome, patch, nil
}

func diffObjects(before, after any) ([]Operation, error) {
	a, err := json.Marshal(before)
	if err != nil {
		return nil, fmt.Errorf("encoding the pod: %w", err)
	}
	b, err := json.Marshal(after)
	if err != nil {
		return nil, fmt.Errorf("encoding the injected pod: %w", err)
	}
	return Diff(a, b)
}
