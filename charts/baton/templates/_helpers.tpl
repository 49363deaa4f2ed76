{{/* The name of every object: the release name, or <release>-baton when it does not contain "baton". */}}
{{- define "baton.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "baton.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The pods' selector: the same as manifests/deployment.yaml, so a kustomize install can be taken over. */}}
{{- define "baton.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
{{- end -}}

{{/* The Secret with cloud-sa.json. */}}
{{- define "baton.secretName" -}}
{{- .Values.configSecret.name | default "cherry-cloud-config" -}}
{{- end -}}

{{/* The controller container's environment, shared by the Deployment and the standby DaemonSet:
     a dict with "root" (the chart's context), "admin" and "metrics" (its ports). */}}
{{- define "baton.controllerEnv" -}}
{{- $root := .root -}}
{{- $v := .root.Values -}}
- name: POD_NAME
  valueFrom: {fieldRef: {fieldPath: metadata.name}}
# Its Node: a leader on the FIP holder's node hands the Lease to a replica elsewhere.
- name: NODE_NAME
  valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
# Talk to this node's own API server, never through the FIP.
- name: KUBERNETES_SERVICE_HOST
  valueFrom: {fieldRef: {fieldPath: status.hostIP}}
- name: KUBERNETES_SERVICE_PORT
  value: "6443"
{{- if eq $v.cloud "hetzner" }}
- {name: BATON_CLOUD, value: hetzner}
{{- else if ne $v.cloud "cherry" }}
{{- fail (printf "cloud must be cherry or hetzner, got %q" $v.cloud) }}
{{- end }}
{{- if $v.sniRouter.enabled }}
# Probe the SNI router on every candidate: a holder whose router stops loses the FIP.
- {name: BATON_SNI_ROUTER_PORT, value: {{ (splitList ":" $v.sniRouter.listen) | last | quote }}}
{{- end }}
{{- if .metrics }}
- name: BATON_METRICS_LISTEN
  value: {{ printf "0.0.0.0:%d" .metrics | quote }}
{{- end }}
# Hetzner Cloud: the API token from hcloud-cloud-controller-manager's Secret (absent
# on Cherry Servers: optional, as in manifests/deployment.yaml).
- name: HCLOUD_TOKEN
  valueFrom: {secretKeyRef: {name: {{ $v.hcloudSecret | quote }}, key: token, optional: true}}
{{- if ne $v.prefix "baton" }}
- {name: BATON_PREFIX, value: {{ $v.prefix | quote }}}
{{- end }}
{{- if ne $root.Release.Namespace "kube-system" }}
# The Lease and the FIP table live in the release's namespace.
- {name: BATON_LEASE_NAMESPACE, value: {{ $root.Release.Namespace | quote }}}
{{- end }}
{{- if ne .admin 9590 }}
- {name: BATON_ADMIN_LISTEN, value: {{ printf "127.0.0.1:%d" .admin | quote }}}
{{- end }}
{{- with $v.controlPlaneNamespaces }}
- {name: BATON_CONTROL_PLANE_NAMESPACES, value: {{ join "," . | quote }}}
{{- end }}
{{- with $v.serviceAllocation.namespaces }}
- {name: BATON_SERVICE_ALLOCATION_NAMESPACES, value: {{ join "," . | quote }}}
{{- end }}
{{- with $v.serviceAllocation.namespaceSelector }}
- {name: BATON_SERVICE_ALLOCATION_NAMESPACE_SELECTOR, value: {{ include "baton.labelSelector" (dict "selector" . "name" "serviceAllocation.namespaceSelector") | quote }}}
{{- end }}
{{- with $v.lease.duration }}
- {name: BATON_LEASE_DURATION, value: {{ . | quote }}}
{{- end }}
{{- with $v.lease.renewDeadline }}
- {name: BATON_LEASE_RENEW_DEADLINE, value: {{ . | quote }}}
{{- end }}
{{- with $v.lease.renewInterval }}
- {name: BATON_LEASE_RENEW_INTERVAL, value: {{ . | quote }}}
{{- end }}
{{- with $v.healthCheck.path }}
- {name: BATON_HEALTH_CHECK_PATH, value: {{ . | quote }}}
{{- end }}
{{- with $v.healthCheck.interval }}
- {name: BATON_HEALTH_CHECK_INTERVAL, value: {{ . | quote }}}
{{- end }}
{{- with $v.healthCheck.timeout }}
- {name: BATON_HEALTH_CHECK_TIMEOUT, value: {{ . | quote }}}
{{- end }}
{{- with $v.healthCheck.rise }}
- {name: BATON_HEALTH_CHECK_RISE, value: {{ . | quote }}}
{{- end }}
{{- with $v.healthCheck.fall }}
- {name: BATON_HEALTH_CHECK_FALL, value: {{ . | quote }}}
{{- end }}
{{- with $v.env }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* A Kubernetes label selector (matchLabels, matchExpressions) in its string form, as kubectl -l
takes it and baton's selector settings read it: requirements joined by commas (AND). Anything
else fails the render, naming the value: a typo must not leave the selector out (which would
open what it was to restrict). Takes (dict "selector" <the selector> "name" <its values key>). */}}
{{- define "baton.labelSelector" -}}
{{- $name := .name -}}
{{- $parts := list -}}
{{- range $key, $_ := .selector -}}
{{- if not (has $key (list "matchLabels" "matchExpressions")) -}}
{{- fail (printf "%s: unknown key %q (a label selector has matchLabels and matchExpressions)" $name $key) -}}
{{- end -}}
{{- end -}}
{{- range $key, $value := (.selector.matchLabels | default dict) -}}
{{- $parts = append $parts (printf "%s=%s" $key $value) -}}
{{- end -}}
{{- range (.selector.matchExpressions | default list) -}}
{{- if eq .operator "In" -}}
{{- $parts = append $parts (printf "%s in (%s)" .key (join "," .values)) -}}
{{- else if eq .operator "NotIn" -}}
{{- $parts = append $parts (printf "%s notin (%s)" .key (join "," .values)) -}}
{{- else if eq .operator "Exists" -}}
{{- $parts = append $parts .key -}}
{{- else if eq .operator "DoesNotExist" -}}
{{- $parts = append $parts (printf "!%s" .key) -}}
{{- else -}}
{{- fail (printf "%s: matchExpressions operator %q is not In, NotIn, Exists or DoesNotExist" $name .operator) -}}
{{- end -}}
{{- end -}}
{{- if not $parts -}}
{{- fail (printf "%s: selects nothing (set matchLabels or matchExpressions, or leave it {})" $name) -}}
{{- end -}}
{{- join "," $parts -}}

{{- end -}}
