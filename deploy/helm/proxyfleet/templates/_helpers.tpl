{{/* The release's objects are named after it; "proxyfleet" alone when the release is called that. */}}
{{- define "proxyfleet.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "proxyfleet.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "proxyfleet.labels" -}}
{{ include "proxyfleet.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "proxyfleet.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "proxyfleet.tokensSecret" -}}
{{- default (printf "%s-api-tokens" (include "proxyfleet.fullname" .)) .Values.api.tokens.existingSecret -}}
{{- end -}}

{{- define "proxyfleet.hasTokens" -}}
{{- if or .Values.api.tokens.existingSecret .Values.api.tokens.values -}}true{{- end -}}
{{- end -}}
