package kubeinject

import (
	"fmt"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// The annotations a pod (a pod template's metadata) is read by.
const (
	// AnnotationInject: "true" injects the sidecar, "false" opts out (the
	// pod is never touched); no annotation leaves the pod alone too.
	AnnotationInject = "governor.dev/inject"
	// AnnotationConfig names the ConfigMap, in the pod's namespace, whose
	// key proxy.yaml is the sidecar's config. Required with inject.
	AnnotationConfig = "governor.dev/config"
	// AnnotationTask names the sidecar's task (GOVERNOR_TASK); without it
	// the task is the pod's name.
	AnnotationTask = "governor.dev/task"
	// AnnotationPGWire lists the app containers' environment variables that
	// hold a PostgreSQL DSN, each pointed at a pgwire listener:
	// "DATABASE_URL" (the listener 127.0.0.1:6432), or
	// "DATABASE_URL=127.0.0.1:6433,REPORTS_DSN=6434".
	AnnotationPGWire = "governor.dev/pgwire"
	// AnnotationIntercept turns HTTPS interception on: the hosts the pod's
	// CA may sign for (governor ca create -hosts), which must be the hosts
	// of the ConfigMap's http.intercept.
	AnnotationIntercept = "governor.dev/intercept"
	// AnnotationAPIKeySecret names the Secret, in the pod's namespace,
	// holding the tenant's API key, instead of the injector's default.
	AnnotationAPIKeySecret = "governor.dev/api-key-secret"
)

// annotationPrefix is every annotation of ours: one it does not know is a
// typo, refused rather than ignored.
const annotationPrefix = "governor.dev/"

var knownAnnotations = []string{AnnotationInject, AnnotationConfig, AnnotationTask, AnnotationPGWire,
	AnnotationIntercept, AnnotationAPIKeySecret}

// podRequest is what a pod's annotations ask for.
type podRequest struct {
	config       string      // the ConfigMap's name
	task         string      // "": the pod's name
	pgwire       []dsnTarget // in the annotation's order
	intercept    []string    // hosts; nil: no interception
	apiKeySecret string      // "": the injector's default
}

// dsnTarget is one variable of governor.dev/pgwire and the listener its
// DSN is pointed at.
type dsnTarget struct {
	env    string
	listen string // host:port
}

// AnnotationError is an annotation the injector cannot honour.
type AnnotationError struct {
	Annotation, Problem string
}

func (e *AnnotationError) Error() string {
	return fmt.Sprintf("annotation %s: %s", e.Annotation, e.Problem)
}

// envName is what a container's environment variable may be called (as
// Kubernetes validates it).
var envName = regexp.MustCompile(`^[-._a-zA-Z][-._a-zA-Z0-9]*$`)

// interceptHost is one entry of http.intercept.hosts: a name, a glob or an
// IP literal. governor ca create checks it fully; this catches a list
// written with spaces or another separator.
var interceptHost = regexp.MustCompile(`^[-*.a-zA-Z0-9:\[\]]+$`)

// readAnnotations says whether a pod asks for the sidecar and, if so, what
// its annotations ask for.
func readAnnotations(annotations map[string]string) (inject bool, req podRequest, err error) {
	v, ok := annotations[AnnotationInject]
	if !ok || v == "false" {
		return false, req, nil
	}
	if v != "true" {
		return false, req, &AnnotationError{AnnotationInject, fmt.Sprintf("%q is neither \"true\" nor \"false\"", v)}
	}
	for k := range annotations {
		if strings.HasPrefix(k, annotationPrefix) && !slices.Contains(knownAnnotations, k) {
			return false, req, &AnnotationError{k, fmt.Sprintf("not one of %s", strings.Join(knownAnnotations, ", "))}
		}
	}
	req.config = annotations[AnnotationConfig]
	if req.config == "" {
		return false, req, &AnnotationError{AnnotationConfig, "required with " + AnnotationInject + `: "true": the ConfigMap holding the sidecar's proxy.yaml`}
	}
	if !dnsSubdomain.MatchString(req.config) {
		return false, req, &AnnotationError{AnnotationConfig, fmt.Sprintf("%q is not a ConfigMap's name", req.config)}
	}
	if t, ok := annotations[AnnotationTask]; ok {
		if strings.TrimSpace(t) == "" {
			return false, req, &AnnotationError{AnnotationTask, "empty"}
		}
		req.task = t
	}
	if s, ok := annotations[AnnotationAPIKeySecret]; ok {
		if !dnsSubdomain.MatchString(s) {
			return false, req, &AnnotationError{AnnotationAPIKeySecret, fmt.Sprintf("%q is not a Secret's name", s)}
		}
		req.apiKeySecret = s
	}
	if p, ok := annotations[AnnotationPGWire]; ok {
		if req.pgwire, err = parsePGWire(p); err != nil {
			return false, req, &AnnotationError{AnnotationPGWire, err.Error()}
		}
	}
	if h, ok := annotations[AnnotationIntercept]; ok {
		if req.intercept, err = parseHosts(h); err != nil {
			return false, req, &AnnotationError{AnnotationIntercept, err.Error()}
		}
	}
	return true, req, nil
}

// parsePGWire reads "VAR[=[host:]port],...".
func parsePGWire(s string) ([]dsnTarget, error) {
	var out []dsnTarget
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		name, listen, hasListen := strings.Cut(item, "=")
		name = strings.TrimSpace(name)
		if !envName.MatchString(name) {
			return nil, fmt.Errorf("%q is not an environment variable's name", name)
		}
		target := dsnTarget{env: name, listen: DefaultPGWireListen}
		if hasListen {
			listen = strings.TrimSpace(listen)
			if _, err := strconv.ParseUint(listen, 10, 16); err == nil {
				listen = net.JoinHostPort("127.0.0.1", listen)
			}
			host, port, err := net.SplitHostPort(listen)
			if p, perr := strconv.ParseUint(port, 10, 16); err != nil || host == "" || perr != nil || p == 0 {
				return nil, fmt.Errorf("%s=%s: the listener is not host:port or a port", name, listen)
			}
			target.listen = listen
		}
		if slices.ContainsFunc(out, func(t dsnTarget) bool { return t.env == name }) {
			return nil, fmt.Errorf("%s is named twice", name)
		}
		out = append(out, target)
	}
	return out, nil
}

// parseHosts reads a comma-separated list of hosts, as governor ca create's
// -hosts takes it.
func parseHosts(s string) ([]string, error) {
	var out []string
	for h := range strings.SplitSeq(s, ",") {
		h = strings.TrimSpace(h)
		if !interceptHost.MatchString(h) {
			return nil, fmt.Errorf("%q is not a host, a glob or an IP address (list them separated by commas)", h)
		}
		out = append(out, h)
	}
	return out, nil
}
