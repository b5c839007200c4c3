{{/*
Names follow the Go medik8s operator's install (namespace
node-maintenance-operator-system, ServiceAccount
node-maintenance-operator-controller-manager, pods labelled
control-plane=controller-manager), not the release name, so the
troubleshooting guide's commands work whatever the release is called.
*/}}
{{- define "nmo.fullname" -}}
{{- default "node-maintenance-operator" .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "nmo.serviceAccountName" -}}
{{- printf "%s-controller-manager" (include "nmo.fullname" .) -}}
{{- end -}}

{{- define "nmo.webhookServiceName" -}}
{{- printf "%s-webhook-service" (include "nmo.fullname" .) -}}
{{- end -}}

{{- define "nmo.certificateName" -}}
{{- printf "%s-serving-cert" (include "nmo.fullname" .) -}}
{{- end -}}

{{- define "nmo.certSecretName" -}}
{{- printf "%s-webhook-server-cert" (include "nmo.fullname" .) -}}
{{- end -}}

{{- define "nmo.metricsServiceName" -}}
{{- printf "%s-controller-manager-metrics-service" (include "nmo.fullname" .) -}}
{{- end -}}

{{- define "nmo.metricsCertSecretName" -}}
{{- printf "%s-metrics-server-cert" (include "nmo.fullname" .) -}}
{{- end -}}

{{- /* cert-manager issues a metrics certificate that Prometheus verifies:
the ServiceMonitor is on, verification is not switched off, and the chart
manages certificates with cert-manager (not the out-of-cluster webhook). */ -}}
{{- define "nmo.metricsCert" -}}
{{- $sm := .Values.metrics.serviceMonitor -}}
{{- if and .Values.deployment.enabled $sm.enabled (not $sm.tls.insecureSkipVerify) .Values.webhook.certManager.enabled (not (include "nmo.webhookExternal" .)) -}}
true
{{- end -}}
{{- end -}}

{{- define "nmo.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: node-maintenance-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: node-maintenance-operator
{{- end -}}

{{- define "nmo.selectorLabels" -}}
control-plane: controller-manager
app.kubernetes.io/name: node-maintenance-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "nmo.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* Out-of-cluster webhook: the API server calls webhook.url. */}}
{{- define "nmo.webhookExternal" -}}
{{- if .Values.webhook.url }}true{{ end -}}
{{- end -}}

{{/* Whether to grant the OpenShift etcd quorum guard lookups. */}}
{{- define "nmo.openshift" -}}
{{- $mode := toString .Values.openshift.etcdQuorumGuard -}}
{{- if or (eq $mode "true") (and (eq $mode "auto") (.Capabilities.APIVersions.Has "config.openshift.io/v1")) }}true{{ end -}}
{{- end -}}

{{/*
Whether OpenShift's SCC chooses the pod's user: restricted-v2 gives each pod
a UID and an fsGroup from its namespace's range and refuses any other, so the
chart then fixes neither (the Go NMO's manifests set only runAsNonRoot).
*/}}
{{- define "nmo.sccAssignsUser" -}}
{{- $mode := toString .Values.openshift.restrictedSCC -}}
{{- if or (eq $mode "true") (and (eq $mode "auto") (.Capabilities.APIVersions.Has "security.openshift.io/v1")) }}true{{ end -}}
{{- end -}}

{{- define "nmo.defaultAffinity" -}}
nodeAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      preference:
        matchExpressions:
          - key: node-role.kubernetes.io/control-plane
            operator: Exists
    - weight: 100
      preference:
        matchExpressions:
          - key: node-role.kubernetes.io/master
            operator: Exists
    - weight: 50
      preference:
        matchExpressions:
          - key: node-role.kubernetes.io/infra
            operator: Exists
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "nmo.selectorLabels" . | nindent 12 }}
{{- end -}}

{{/* A Prometheus duration ("30m", "1h30m", "2d") as whole seconds. */}}
{{- define "nmo.durationSeconds" -}}
{{- $unit := dict "s" 1 "m" 60 "h" 3600 "d" 86400 -}}
{{- $total := 0 -}}
{{- range regexFindAll "[0-9]+[smhd]" (toString .) -1 -}}
{{- $u := trimAll "0123456789" . -}}
{{- $total = add $total (mul (trimSuffix $u . | int64) (get $unit $u)) -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{/*
Whether the webhook carries matchConditions (admissionregistration.k8s.io/v1:
beta and on by default in Kubernetes 1.28, GA in 1.30). auto: by the
server's version (helm template: --kube-version, or set true/false).
*/}}
{{- define "nmo.matchConditions" -}}
{{- $mode := toString .Values.webhook.matchConditions -}}
{{- if or (eq $mode "true") (and (eq $mode "auto") (semverCompare ">=1.28.0-0" .Capabilities.KubeVersion.Version)) }}true{{ end -}}
{{- end -}}

{{/* The webhook's clientConfig; (dict "ctx" $ "caBundle" <base64 PEM or "">). */}}
{{- define "nmo.webhookClientConfig" -}}
{{- $ := .ctx -}}
clientConfig:
  {{- if include "nmo.webhookExternal" $ }}
  url: {{ $.Values.webhook.url | quote }}
  {{- else }}
  service:
    name: {{ include "nmo.webhookServiceName" $ }}
    namespace: {{ $.Release.Namespace }}
    path: /validate-nodemaintenance-medik8s-io-v1beta1-nodemaintenance
    port: 443
  {{- end }}
  {{- if .caBundle }}
  caBundle: {{ .caBundle }}
  {{- end }}
{{- end -}}

{{/* The webhook's rules for a list of operations. */}}
{{- define "nmo.webhookRules" -}}
- apiGroups: ["nodemaintenance.medik8s.io"]
  apiVersions: ["v1beta1"]
  operations: {{ toJson . }}
  resources: ["nodemaintenances"]
  scope: "*"
{{- end -}}

{{/* nmo's leader election Lease (nmo.api.constants.LEADER_ELECTION_ID, the Go NMO's). */}}
{{- define "nmo.leaderElectionID" -}}
135b1886.medik8s.io
{{- end -}}

{{/*
Whether nmo itself may create the lease namespace (ClusterRole namespaces
create): only when the chart does not (leases.createNamespace=false) and it
is not the release namespace.
*/}}
{{- define "nmo.operatorCreatesLeaseNamespace" -}}
{{- if and (not .Values.leases.createNamespace) (ne .Values.leases.namespace .Release.Namespace) }}true{{ end -}}
{{- end -}}

{{/*
The kube-apiserver for the NetworkPolicy, as JSON {source, from, to, ports}:
from: CIDRs its webhook calls come from; to: CIDRs nmo connects to; ports:
the ports nmo connects to. source: "values" (networkPolicy.apiServer.cidrs),
"lookup" (EndpointSlice and Service default/kubernetes, read at install or
upgrade: the apiserver publishes its own addresses there) or "" (offline
rendering: nothing known, from/to empty).
*/}}
{{- define "nmo.apiServerAddresses" -}}
{{- $conf := .Values.networkPolicy.apiServer -}}
{{- $from := list -}}{{- $to := list -}}{{- $ports := list -}}{{- $source := "" -}}
{{- if $conf.cidrs -}}
{{- $from = $conf.cidrs -}}{{- $to = $conf.cidrs -}}{{- $source = "values" -}}
{{- else -}}
{{- $slice := lookup "discovery.k8s.io/v1" "EndpointSlice" "default" "kubernetes" | default dict -}}
{{- range ($slice.endpoints | default list) -}}
{{- range (.addresses | default list) -}}
{{- $from = append $from (printf "%s/%s" . (ternary "128" "32" (contains ":" .))) -}}
{{- end -}}
{{- end -}}
{{- if $from -}}
{{- $source = "lookup" -}}
{{- $to = $from -}}
{{- range ($slice.ports | default list) -}}
{{- $ports = append $ports (int .port) -}}
{{- end -}}
{{- $svc := lookup "v1" "Service" "default" "kubernetes" | default dict -}}
{{- range (dig "spec" "clusterIPs" list $svc) -}}
{{- $to = append $to (printf "%s/%s" . (ternary "128" "32" (contains ":" .))) -}}
{{- end -}}
{{- range (dig "spec" "ports" list $svc) -}}
{{- $ports = append $ports (int .port) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if $conf.ports -}}
{{- $ports = $conf.ports -}}
{{- else if not $ports -}}
{{- $ports = list 443 6443 -}}
{{- end -}}
{{- dict "source" $source "from" (uniq $from) "to" (uniq $to) "ports" (uniq $ports) | toJson -}}
{{- end -}}

{{/*
Whether one of the chart's ValidatingAdmissionPolicies is rendered:
(dict "ctx" $ "value" <its enabled value> "name" "<its value's name>").
auto: when the cluster serves admissionregistration.k8s.io/v1
ValidatingAdmissionPolicy (Kubernetes 1.30+; helm install and upgrade ask
the server, helm template knows only its --api-versions). true: always, and
a cluster older than 1.30 is refused. false: never.
*/}}
{{- define "nmo.admissionPolicy" -}}
{{- $ := .ctx -}}
{{- $mode := toString .value -}}
{{- if eq $mode "true" -}}
{{- if not (semverCompare ">=1.30.0-0" $.Capabilities.KubeVersion.Version) -}}
{{- fail (printf "%s=true needs admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy, Kubernetes 1.30 or newer; the server is %s (helm template: pass --kube-version)" .name $.Capabilities.KubeVersion.Version) -}}
{{- end -}}
true
{{- else if and (eq $mode "auto") ($.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy") -}}
true
{{- end -}}
{{- end -}}
