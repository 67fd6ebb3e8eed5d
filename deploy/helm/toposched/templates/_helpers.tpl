{{- define "toposched.fullname" -}}
{{- printf "%s-toposched" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "toposched.labels" -}}
app.kubernetes.io/name: toposched
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "toposched.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* Flags every toposched process shares: NATS, stream replicas, metrics. */}}
{{- define "toposched.commonArgs" -}}
- --nats-url={{ tpl .Values.natsURL . }}
- --replicas={{ .Values.streamReplicas }}
- --log-format=json
{{- if .Values.tls.enabled }}
- --nats-tls-ca=/etc/toposched/tls/ca.crt
- --nats-tls-cert=/etc/toposched/tls/tls.crt
- --nats-tls-key=/etc/toposched/tls/tls.key
{{- end }}
{{- end -}}
