{{/* Full name of the release's objects: <release>-corral, or <release> when the release name contains the chart name. */}}
{{- define "corral.fullname" -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "corral.labels" -}}
app.kubernetes.io/part-of: corral
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The operator pods' selector. app.kubernetes.io/name=corral-operator is what every sandbox NetworkPolicy admits. */}}
{{- define "corral.selectorLabels" -}}
app.kubernetes.io/name: corral-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "corral.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "corral.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "corral.secretName" -}}
{{- default (printf "%s-tokens" (include "corral.fullname" .)) .Values.secrets.existingSecret -}}
{{- end -}}

{{- define "corral.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "corral.execdImage" -}}
{{- if .Values.execdImage.repository -}}
{{- printf "%s:%s" .Values.execdImage.repository (default (default .Chart.AppVersion .Values.image.tag) .Values.execdImage.tag) -}}
{{- else -}}
{{- include "corral.image" . -}}
{{- end -}}
{{- end -}}
