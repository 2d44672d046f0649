// Package kubeinject adds governor-proxy to Kubernetes pods as a native
// sidecar: an init container with restartPolicy: Always, which starts
// before the pod's own containers and stops after them.
//
// A pod opts in with the annotation governor.dev/inject: "true", and
// governor.dev/config names the ConfigMap that holds the sidecar's
// proxy.yaml. The same mutation serves two callers:
//
//   - Webhook (webhook.go) is a mutating admission webhook: it answers an
//     AdmissionReview with the JSON patch that turns the pod it was shown
//     into the injected one.
//   - InjectManifests (manifest.go) injects the pod templates of a
//     multi-document YAML stream (Pods, Deployments, StatefulSets, ...), for
//     `governor inject -f`, keeping every other byte's meaning and the
//     file's comments.
//
// The files:
//   - config.go: Config, what every injected sidecar gets (image, governord's
//     address and CA, the API key's Secret, NO_PROXY, resources), and its
//     YAML file.
//   - annotations.go: the annotations a pod is read by.
//   - mutate.go: Inject, the mutation itself, on a typed Pod.
//   - dsn.go: pointing a PostgreSQL DSN at a pgwire listener.
//   - patch.go: the RFC 6902 JSON patch between two JSON documents.
//
// Inject reads only the pod and Config: it never calls the Kubernetes API,
// so the webhook needs no RBAC and the command needs no cluster.
//
// It may import the standard library, k8s.io/api, k8s.io/apimachinery,
// sigs.k8s.io/yaml and gopkg.in/yaml.v3; never Helm, client-go or the rest
// of Governor, so that the governor CLI stays small. (Its tests import the
// sidecar, to hold the places it assumes to the sidecar's defaults.)
package kubeinject
