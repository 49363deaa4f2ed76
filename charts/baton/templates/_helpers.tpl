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
