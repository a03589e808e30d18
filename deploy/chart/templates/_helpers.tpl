{{/* The name of flowsched's objects; the second scheduler's add "-scheduler". */}}
{{- define "flowsched.fullname" -}}
{{- default "flowsched" .Values.fullnameOverride | trunc 53 | trimSuffix "-" -}}
{{- end -}}

{{- define "flowsched.schedulerName" -}}
{{- printf "%s-scheduler" (include "flowsched.fullname" .) -}}
{{- end -}}

{{/* Labels as deploy/ sets them, so the chart and the manifests select the same pods. */}}
{{- define "flowsched.labels" -}}
app.kubernetes.io/name: {{ include "flowsched.fullname" . }}
app.kubernetes.io/part-of: flowsched
{{- end -}}

{{- define "flowsched.schedulerLabels" -}}
app.kubernetes.io/name: {{ include "flowsched.schedulerName" . }}
app.kubernetes.io/part-of: flowsched
{{- end -}}

{{/* The in-cluster URL kube-scheduler calls the extender verbs on. */}}
{{- define "flowsched.url" -}}
{{- printf "http://%s.%s.svc:%v" (include "flowsched.fullname" .) .Release.Namespace .Values.flowsched.port -}}
{{- end -}}
