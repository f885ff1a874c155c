{{/* The chart's name, truncated to the 63 characters of a DNS label. */}}
{{- define "tollgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name: the prefix of every object the chart renders. */}}
{{- define "tollgate.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "tollgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tollgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "tollgate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "tollgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "tollgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "tollgate.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "tollgate.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
tollgate.check fails the render on combinations the schema cannot express, each with the value to change.
*/}}
{{- define "tollgate.check" -}}
{{- $r := .Values.store.redis }}
{{- if eq .Values.store.type "memory" }}
{{- if or (gt (int .Values.replicaCount) 1) .Values.autoscaling.enabled }}
{{- fail "store.type memory keeps counters in one process: set replicaCount 1 and autoscaling.enabled false, or use store.type redis" }}
{{- end }}
{{- if or $r.url $r.urlSecret.name }}
{{- fail "store.redis.url or store.redis.urlSecret.name is set but store.type is memory: set store.type redis" }}
{{- end }}
{{- else }}
{{- if eq (empty $r.url) (empty $r.urlSecret.name) }}
{{- fail "store.type redis needs exactly one of store.redis.url (with store.redis.passwordSecret) and store.redis.urlSecret.name (the whole URL in a Secret)" }}
{{- end }}
{{- if and $r.urlSecret.name (or $r.passwordSecret.name $r.username) }}
{{- fail "store.redis.passwordSecret and store.redis.username go with store.redis.url; with store.redis.urlSecret the URL in the Secret carries them" }}
{{- end }}
{{- if and $r.username (not $r.passwordSecret.name) }}
{{- fail "store.redis.username needs store.redis.passwordSecret.name" }}
{{- end }}
{{- end }}
{{- if and $r.tls.ca.secretName $r.tls.ca.configMapName }}
{{- fail "store.redis.tls.ca: set secretName or configMapName, not both" }}
{{- end }}
{{- $ca := .Values.grpcTLS.clientCA }}
{{- if and $ca.secretName $ca.configMapName }}
{{- fail "grpcTLS.clientCA: set secretName or configMapName, not both" }}
{{- end }}
{{- if and (or $ca.secretName $ca.configMapName) (not (and .Values.grpcTLS.secretName .Values.grpcTLS.requireClientCert)) }}
{{- fail "grpcTLS.clientCA is used only with grpcTLS.secretName and grpcTLS.requireClientCert: set both, or leave clientCA empty" }}
{{- end }}
{{- $c := .Values.callers }}
{{- if and $c.allow (eq $c.enforce "tollgate") (not (and .Values.grpcTLS.secretName .Values.grpcTLS.requireClientCert)) }}
{{- fail "callers.allow with callers.enforce tollgate needs grpcTLS.secretName and grpcTLS.requireClientCert: Tollgate tells callers apart by their client certificates (behind an Istio sidecar, set callers.enforce istio)" }}
{{- end }}
{{- if and $c.allow (eq $c.enforce "istio") }}
{{- range $api, $ids := $c.allow }}
{{- range $ids }}
{{- if not (hasPrefix "spiffe://" .) }}
{{- fail (printf "callers.allow.%s: %q is not a SPIFFE ID: callers.enforce istio matches the peer's principal, spiffe://TRUST-DOMAIN/ns/NAMESPACE/sa/ACCOUNT" $api .) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- if .Values.authz.enabled }}
{{- if hasKey .Values.authz.settings "keys_file" }}
{{- fail "authz.settings.keys_file: leave it out; the chart sets it from authz.keysSecret" }}
{{- end }}
{{- if and (ne (toString .Values.authz.settings.require_api_key) "false") (not .Values.authz.keysSecret.name) }}
{{- fail "authz.keysSecret.name is required while authz.settings.require_api_key is not false" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The settings file --authz-config reads, keys_file set to the mounted Secret. */}}
{{- define "tollgate.authzSettings" -}}
{{- $s := deepCopy .Values.authz.settings }}
{{- if .Values.authz.keysSecret.name }}
{{- $_ := set $s "keys_file" (printf "/etc/tollgate/keys/%s" .Values.authz.keysSecret.key) }}
{{- end }}
{{- toYaml $s }}
{{- end }}

{{/* The pod's placement: node selector, tolerations, affinity (or the podAntiAffinity shorthand), spread. */}}
{{- define "tollgate.scheduling" -}}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if .Values.affinity }}
affinity:
  {{- toYaml .Values.affinity | nindent 2 }}
{{- else if eq .Values.podAntiAffinity "soft" }}
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- include "tollgate.selectorLabels" . | nindent 14 }}
{{- else if eq .Values.podAntiAffinity "hard" }}
affinity:
  podAntiAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      - topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "tollgate.selectorLabels" . | nindent 12 }}
{{- end }}
{{- if .Values.topologySpread.enabled }}
topologySpreadConstraints:
  - maxSkew: {{ .Values.topologySpread.maxSkew }}
    topologyKey: {{ .Values.topologySpread.topologyKey }}
    whenUnsatisfiable: {{ .Values.topologySpread.whenUnsatisfiable }}
    labelSelector:
      matchLabels:
        {{- include "tollgate.selectorLabels" . | nindent 8 }}
{{- end }}
{{- end }}

{{/* The gRPC service of each API name callers.allow takes. */}}
{{- define "tollgate.grpcServices" -}}
accesslog: envoy.service.accesslog.v3.AccessLogService
ext_proc: envoy.service.ext_proc.v3.ExternalProcessor
ext_authz: envoy.service.auth.v3.Authorization
ratelimit: envoy.service.ratelimit.v3.RateLimitService
{{- end }}

{{/* The value of --allow-callers: API=SAN,SAN;API=SAN, APIs sorted. */}}
{{- define "tollgate.allowCallers" -}}
{{- $entries := list }}
{{- range $api, $ids := .Values.callers.allow }}
{{- $entries = append $entries (printf "%s=%s" $api (join "," $ids)) }}
{{- end }}
{{- join ";" $entries }}
{{- end }}
