{{- define "tritonship.fullname" -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tritonship.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "tritonship.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "tritonship.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "tritonship.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Triton's form of an S3 location: s3://bucket/path on AWS, s3://http://host:port/bucket/path elsewhere. */}}
{{- define "tritonship.tritonUri" -}}
{{- $path := printf "%s/%s" (trimSuffix "/" (trimPrefix "s3://" .root.Values.repository.uri)) .prefix -}}
{{- if .root.Values.repository.endpoint -}}
{{- printf "s3://%s/%s" (trimSuffix "/" .root.Values.repository.endpoint) $path -}}
{{- else -}}
{{- printf "s3://%s" $path -}}
{{- end -}}
{{- end -}}
