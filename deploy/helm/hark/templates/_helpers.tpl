{{/* The chart's name, and the release's full name that every object is named after. */}}
{{- define "hark.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "hark.fullname" -}}
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

{{/* Labels on every object. */}}
{{- define "hark.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "hark.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels of one component (worker, redis, vllm): call with (list . "worker"). */}}
{{- define "hark.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "hark.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "hark.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "hark.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "hark.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The Secret holding HARK_API_KEYS, and its key. */}}
{{- define "hark.apiKeysSecret" -}}
{{- default (printf "%s-api-keys" (include "hark.fullname" .)) .Values.apiKeys.existingSecret }}
{{- end }}

{{- define "hark.apiKeysSecretKey" -}}
{{- if .Values.apiKeys.existingSecret }}{{ .Values.apiKeys.existingSecretKey }}{{ else }}api-keys{{ end }}
{{- end }}

{{/* The Secret the chart makes for the fleet: the fleet secret and Redis's password
(each unless an existing Secret is named for it). */}}
{{- define "hark.fleetSecretName" -}}
{{- printf "%s-fleet" (include "hark.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The Secret and key holding HARK_FLEET_SECRET. */}}
{{- define "hark.fleetSecret" -}}
{{- default (include "hark.fleetSecretName" .) .Values.fleetSecret.existingSecret }}
{{- end }}

{{- define "hark.fleetSecretKey" -}}
{{- if .Values.fleetSecret.existingSecret }}{{ .Values.fleetSecret.existingSecretKey }}{{ else }}fleet-secret{{ end }}
{{- end }}

{{/* The Secret and key holding the chart's Redis's password. */}}
{{- define "hark.redisPasswordSecret" -}}
{{- default (include "hark.fleetSecretName" .) .Values.redis.auth.existingSecret }}
{{- end }}

{{- define "hark.redisPasswordKey" -}}
{{- if .Values.redis.auth.existingSecret }}{{ .Values.redis.auth.existingSecretKey }}{{ else }}redis-password{{ end }}
{{- end }}

{{- define "hark.redisName" -}}
{{- printf "%s-redis" (include "hark.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "hark.vllmName" -}}
{{- printf "%s-vllm" (include "hark.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The model name the workers send to the LLM endpoints. */}}
{{- define "hark.llmModel" -}}
{{- if .Values.vllm.enabled }}
{{- default .Values.vllm.model .Values.vllm.servedModelName }}
{{- else }}
{{- .Values.llm.model }}
{{- end }}
{{- end }}

{{/* HARK_LLM_URL: the chart's vLLM first, then llm.urls; empty for the embedded model. */}}
{{- define "hark.llmUrls" -}}
{{- $urls := list }}
{{- if .Values.vllm.enabled }}
{{- $urls = append $urls (printf "http://%s:%d/v1" (include "hark.vllmName" .) (int .Values.vllm.port)) }}
{{- end }}
{{- range .Values.llm.urls }}
{{- $urls = append $urls . }}
{{- end }}
{{- join "," $urls }}
{{- end }}

{{/* Seconds Kubernetes waits after the preStop hook starts before it kills a worker: the
sleep, the whole drain, then up to 15 s of shutdown (closing sessions, the store). */}}
{{- define "hark.terminationGracePeriod" -}}
{{- add (int .Values.hark.preStopSleepSeconds) (int (ceil .Values.hark.drainTimeoutSeconds)) 15 }}
{{- end }}

{{/* Refuse values that cannot work, at render time rather than in a crash-looping pod. */}}
{{- define "hark.validate" -}}
{{- if and (not .Values.redis.enabled) (not .Values.redis.url) (not .Values.redis.urlSecret) }}
{{- fail "redis.enabled is false: set redis.url or redis.urlSecret (workers of a fleet must share one store)" }}
{{- end }}
{{- if and .Values.redis.enabled .Values.redis.tls.enabled (not .Values.redis.tls.secret) }}
{{- fail "redis.tls.enabled: name the Secret with tls.crt, tls.key and ca.crt in redis.tls.secret" }}
{{- end }}
{{- if and (include "hark.llmUrls" .) (not (include "hark.llmModel" .)) }}
{{- fail "llm.urls is set: llm.model must name the remote model" }}
{{- end }}
{{- if lt (int .Values.hark.workers) 1 }}
{{- fail "hark.workers must be at least 1" }}
{{- end }}
{{- if not (has .Values.hark.engines (list "embedded" "fake")) }}
{{- fail "hark.engines must be embedded or fake" }}
{{- end }}
{{- end }}
