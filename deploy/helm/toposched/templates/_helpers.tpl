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

{{/*
Fails on auth values the chart no longer reads: it signs every part in as
its own NATS identity (an nkey seed per role, toposched roles issue), and
the password users of old shared one agent password among every node.
*/}}
{{- define "toposched.checkAuth" -}}
{{- if .Values.auth.enabled }}
{{- if ne (toString .Values.auth.mode) "nkeys" }}
{{- fail (printf "auth.mode %q: the chart signs in with nkeys only (one seed per role, toposched roles issue)" (toString .Values.auth.mode)) }}
{{- end }}
{{- if or .Values.auth.existingSecret .Values.auth.operatorUser }}
{{- fail "auth.existingSecret, auth.operatorUser: the password users are gone (every agent shared one password); give auth.servicesSecret and each node its agent seed (deploy/README.md, Kubernetes)" }}
{{- end }}
{{- if not .Values.auth.servicesSecret }}
{{- fail "auth.servicesSecret: the Secret holding analysis.nk, placement.nk, optimizer.nk, discovery.nk (and kube.nk with kube.enabled) is required with auth.enabled" }}
{{- end }}
{{- if not .Values.auth.agentCredentialsHostPath }}
{{- fail "auth.agentCredentialsHostPath: the directory on each GPU node holding its agent's seed is required with auth.enabled" }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Where a service's own seed is mounted, and the agent's data dir. */}}
{{- define "toposched.seedDir" -}}/etc/toposched/nkey{{- end -}}
{{- define "toposched.agentDataDir" -}}/var/lib/toposched{{- end -}}
