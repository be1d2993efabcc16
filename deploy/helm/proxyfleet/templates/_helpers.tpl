{{/* The chart's name, or nameOverride. */}}
{{- define "proxyfleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's objects are named after it; the name alone when the release is called that; fullnameOverride wins. */}}
{{- define "proxyfleet.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "proxyfleet.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The ServiceAccount the operator runs as: the chart's, or one you made. */}}
{{- define "proxyfleet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "proxyfleet.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.create is false: name the ServiceAccount to run as in serviceAccount.name" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "proxyfleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "proxyfleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "proxyfleet.labels" -}}
{{ include "proxyfleet.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
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

{{- /* The `helm test` pods: the release's, but selected by nothing of the chart. */}}
{{- define "proxyfleet.testLabels" -}}
app.kubernetes.io/part-of: {{ include "proxyfleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: helm-test
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}
