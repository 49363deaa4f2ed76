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
