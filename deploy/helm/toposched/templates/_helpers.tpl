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
{{- $identity := toString .Values.auth.agentIdentity }}
{{- if eq $identity "kubernetes" }}
{{- if not .Values.kube.enabled }}
{{- fail "auth.agentIdentity kubernetes: the agents' sign-ins are answered by the Kubernetes service, which kube.enabled false leaves out; set auth.agentIdentity hostPath (each node's seed provisioned on it) or kube.enabled true" }}
{{- end }}
{{- if not .Values.auth.authCalloutSecret }}
{{- fail "auth.authCalloutSecret: the Secret holding auth-callout.nk and auth-callout-issuer.seed (toposched roles issue --auth-callout) is required with auth.agentIdentity kubernetes" }}
{{- end }}
{{- if not .Values.auth.agentToken.audience }}
{{- fail "auth.agentToken.audience: empty would be the API server's audience, a token that signs in to Kubernetes too" }}
{{- end }}
{{- else if eq $identity "hostPath" }}
{{- if .Values.auth.issue }}
{{- fail "auth.issue with auth.agentIdentity hostPath: the chart's hook cannot put each node's seed on its node; set auth.issue false and issue the Secrets and the nodes' seeds by hand (deploy/README.md, Kubernetes), or use auth.agentIdentity kubernetes" }}
{{- end }}
{{- if not .Values.auth.agentCredentialsHostPath }}
{{- fail "auth.agentCredentialsHostPath: the directory on each GPU node holding its agent's seed is required with auth.agentIdentity hostPath" }}
{{- end }}
{{- else }}
{{- fail (printf "auth.agentIdentity %q: kubernetes (the pod's ServiceAccount token, answered by the Kubernetes service) or hostPath (each node's seed on the node)" $identity) }}
{{- end }}
{{- if .Values.auth.issue }}
{{- if or (not .Values.auth.adminSecret) (not .Values.auth.natsRolesSecret) (not .Values.auth.tenantSecretPrefix) }}
{{- fail "auth.issue: auth.adminSecret, auth.natsRolesSecret and auth.tenantSecretPrefix name the Secrets the hook writes, and are required" }}
{{- end }}
{{- range .Values.auth.tenants }}
{{- if or (not (kindIs "string" .)) (not .) }}
{{- fail (printf "auth.tenants: %v: a tenant is a non-empty name" .) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Whether the chart's hook issues the Secrets (auth.issue). */}}
{{- define "toposched.issue" -}}
{{- if and .Values.auth.enabled .Values.auth.issue }}true{{- end }}
{{- end -}}

{{/*
A tenant's Secret (toposched roles kube-secrets): the prefix, then the
tenant's name with each byte but a-z and 0-9 written -xx, lower-case hex,
so that no two tenants share one. Call with (dict "prefix" P "tenant" T).
*/}}
{{- define "toposched.tenantSecret" -}}
{{- $out := .prefix }}
{{- range $c := splitList "" .tenant }}
{{- if regexMatch "^[a-z0-9]$" $c }}
{{- $out = print $out $c }}
{{- else }}
{{- $out = print $out (regexReplaceAll "(..)" (printf "%x" $c) "-${1}") }}
{{- end }}
{{- end }}
{{- $out }}
{{- end -}}

{{/* The Secrets the hook writes, a JSON list: its Role's resourceNames. */}}
{{- define "toposched.issuedSecrets" -}}
{{- $out := list .Values.auth.servicesSecret }}
{{- if include "toposched.agentTokens" . }}
{{- $out = append $out .Values.auth.authCalloutSecret }}
{{- end }}
{{- $out = append $out .Values.auth.adminSecret }}
{{- $out = append $out .Values.auth.natsRolesSecret }}
{{- range .Values.auth.tenants }}
{{- $out = append $out (include "toposched.tenantSecret" (dict "prefix" $.Values.auth.tenantSecretPrefix "tenant" .)) }}
{{- end }}
{{- $out | uniq | toJson }}
{{- end -}}

{{/* Whether the agents sign in with their pods' ServiceAccount tokens. */}}
{{- define "toposched.agentTokens" -}}
{{- if and .Values.auth.enabled (eq (toString .Values.auth.agentIdentity) "kubernetes") }}true{{- end }}
{{- end -}}

{{/* The agents' ServiceAccount: their NATS identity, no API rights. */}}
{{- define "toposched.agentServiceAccount" -}}
{{- printf "%s-agent" (include "toposched.fullname" .) -}}
{{- end -}}

{{/* Where a service's own seed is mounted, and the agent's data dir. */}}
{{- define "toposched.seedDir" -}}/etc/toposched/nkey{{- end -}}
{{/* Where the kube pods see the auth callout's keys, the agents their token. */}}
{{- define "toposched.calloutDir" -}}/etc/toposched/auth-callout{{- end -}}
{{- define "toposched.agentTokenDir" -}}/var/run/secrets/toposched/nats{{- end -}}
{{- define "toposched.agentDataDir" -}}/var/lib/toposched{{- end -}}
