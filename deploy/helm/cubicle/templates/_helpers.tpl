{{/* Names: <release>-cubicle unless the release is already called cubicle. */}}
{{- define "cubicle.fullname" -}}
{{- if contains "cubicle" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-cubicle" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "cubicle.labels" -}}
app.kubernetes.io/name: cubicle
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "cubicle.selector" -}}
app.kubernetes.io/name: cubicle
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "cubicle.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "cubicle.builtinsImage" -}}
{{- printf "%s:%s" .Values.builtins.image.repository (default .Chart.AppVersion .Values.builtins.image.tag) -}}
{{- end -}}

{{/* The Secret holding the store's dsn (and optional password). */}}
{{- define "cubicle.storeSecret" -}}
{{- if .Values.store.bundled.enabled -}}
{{- printf "%s-store" (include "cubicle.fullname" .) -}}
{{- else -}}
{{- .Values.store.existingSecret -}}
{{- end -}}
{{- end -}}

{{- define "cubicle.secretsKeySecret" -}}
{{- default (printf "%s-secrets-key" (include "cubicle.fullname" .)) .Values.secretsKey.existingSecret -}}
{{- end -}}

{{- define "cubicle.joinSecret" -}}
{{- default (printf "%s-join" (include "cubicle.fullname" .)) .Values.join.existingSecret -}}
{{- end -}}

{{- define "cubicle.controlPlaneURL" -}}
{{- if .Values.join.controlPlaneURL -}}
{{- .Values.join.controlPlaneURL -}}
{{- else -}}
{{- printf "https://%s.%s.svc:%d" (include "cubicle.fullname" .) .Release.Namespace (int .Values.controlPlane.service.port) -}}
{{- end -}}
{{- end -}}

{{- define "cubicle.postgresql" -}}
{{- printf "%s-postgresql" (include "cubicle.fullname" .) -}}
{{- end -}}
