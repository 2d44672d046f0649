{{/*
Names are fixed rather than prefixed by the release: governord is the one
authority of its tree, the sidecars reach it by its Service's name, and the
webhook configuration is cluster-wide. Install one release per cluster.
*/}}

{{- define "governor.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "governor.labels" -}}
app.kubernetes.io/name: governor
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "governor.governordSelector" -}}
app.kubernetes.io/name: governor
app.kubernetes.io/component: governord
{{- end }}

{{- define "governor.injectorSelector" -}}
app.kubernetes.io/name: governor
app.kubernetes.io/component: injector
{{- end }}

{{/* governord's Service, as the sidecars in other namespaces name it. */}}
{{- define "governor.governordHost" -}}
governord.{{ .Release.Namespace }}.svc
{{- end }}

{{- define "governor.injectorHost" -}}
governor-injector.{{ .Release.Namespace }}.svc
{{- end }}

{{/* The names governord's certificate must hold: its Service, and each
replica's name in the headless Service, which a standby names. */}}
{{- define "governor.governordDNSNames" -}}
{{- $ns := .Release.Namespace -}}
- governord
- governord.{{ $ns }}
- governord.{{ $ns }}.svc
- governord.{{ $ns }}.svc.cluster.local
- "*.governord-peers.{{ $ns }}.svc"
- "*.governord-peers.{{ $ns }}.svc.cluster.local"
{{- end }}

{{- define "governor.injectorDNSNames" -}}
{{- $ns := .Release.Namespace -}}
- governor-injector
- governor-injector.{{ $ns }}
- governor-injector.{{ $ns }}.svc
{{- end }}

{{/* What Kubernetes' restricted Pod Security Standard asks of a
container. The user is the image's (distroless nonroot), by number: the
kubelet cannot check runAsNonRoot against a name. */}}
{{- define "governor.securityContext" -}}
runAsNonRoot: true
runAsUser: 65532
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities: {drop: [ALL]}
seccompProfile: {type: RuntimeDefault}
{{- end }}

{{- define "governor.validate" -}}
{{- if not (has .Values.tls.mode (list "selfSigned" "certManager" "existing")) }}
{{- fail (printf "tls.mode: %q is not selfSigned, certManager or existing" .Values.tls.mode) }}
{{- end }}
{{- if and .Values.governord.ha.enabled (lt (int .Values.governord.replicas) 2) }}
{{- fail "governord.replicas: with ha.enabled, at least 2 (a leader and a standby)" }}
{{- end }}
{{- if and (not .Values.governord.ha.enabled) (ne (int .Values.governord.replicas) 1) }}
{{- fail "governord.replicas: without ha.enabled, exactly 1 (governord is the single authority; ha.enabled runs standbys)" }}
{{- end }}
{{- if not (has .Values.injector.failurePolicy (list "Fail" "Ignore")) }}
{{- fail (printf "injector.failurePolicy: %q is not Fail or Ignore" .Values.injector.failurePolicy) }}
{{- end }}
{{- if and .Values.injector.enabled (eq .Values.tls.mode "existing") (not .Values.tls.existing.caBundle) }}
{{- fail "tls.existing.caBundle: required with tls.mode existing and the injector on" }}
{{- end }}
{{- end }}

{{/* The injector's MutatingWebhookConfiguration; the caller gives the
caBundle (base64 PEM), or cert-manager's cainjector fills it. */}}
{{- define "governor.webhook" -}}
{{- $root := .root -}}
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: governor-injector
  labels:
    {{- include "governor.labels" $root | nindent 4 }}
  {{- with .annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
webhooks:
  - name: inject.governor.dev
    admissionReviewVersions: [v1]
    sideEffects: None
    failurePolicy: {{ $root.Values.injector.failurePolicy }}
    timeoutSeconds: {{ $root.Values.injector.timeoutSeconds }}
    matchPolicy: Equivalent
    # A webhook that runs after this one and adds a container gets it
    # injected too; a second pass leaves a pod that has the sidecar alone.
    reinvocationPolicy: IfNeeded
    clientConfig:
      service:
        name: governor-injector
        namespace: {{ $root.Release.Namespace }}
        path: /mutate
        port: 443
      {{- with .caBundle }}
      caBundle: {{ . }}
      {{- end }}
    rules:
      - operations: [CREATE]
        apiGroups: [""]
        apiVersions: [v1]
        resources: [pods]
        scope: Namespaced
    namespaceSelector:
      {{- with $root.Values.injector.namespaceSelector.matchLabels }}
      matchLabels:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      matchExpressions:
        {{- with $root.Values.injector.namespaceSelector.matchExpressions }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
        - key: kubernetes.io/metadata.name
          operator: NotIn
          values: [{{ $root.Release.Namespace }}, kube-system]
{{- end }}
