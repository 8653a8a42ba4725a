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

{{/* The Secret the chart writes from secrets given inline in the values. */}}
{{- define "hark.secretName" -}}
{{- printf "%s-inline" (include "hark.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Where one secret comes from, as "secret/key" (empty when nowhere): its own
existingSecret, else the chart's Secret when given inline, else the release-wide
existingSecret. Call with (list $ section inlineValue chartKey). */}}
{{- define "hark.secretSource" -}}
{{- $root := index . 0 }}
{{- $own := index . 1 }}
{{- if $own.existingSecret }}
{{- printf "%s/%s" $own.existingSecret $own.existingSecretKey }}
{{- else if index . 2 }}
{{- printf "%s/%s" (include "hark.secretName" $root) (index . 3) }}
{{- else if $root.Values.existingSecret }}
{{- printf "%s/%s" $root.Values.existingSecret $own.existingSecretKey }}
{{- end }}
{{- end }}

{{/* A valueFrom's secretKeyRef from "secret/key". */}}
{{- define "hark.secretKeyRef" -}}
{{- $ref := splitList "/" . -}}
secretKeyRef:
  name: {{ index $ref 0 }}
  key: {{ index $ref 1 }}
{{- end }}

{{- define "hark.apiKeysRef" -}}
{{- include "hark.secretSource" (list . .Values.apiKeys (join "," .Values.apiKeys.keys) "api-keys") }}
{{- end }}

{{- define "hark.fleetSecretRef" -}}
{{- include "hark.secretSource" (list . .Values.fleetSecret .Values.fleetSecret.value "fleet-secret") }}
{{- end }}

{{- define "hark.redisPasswordRef" -}}
{{- include "hark.secretSource" (list . .Values.redis.auth .Values.redis.auth.password "redis-password") }}
{{- end }}

{{- define "hark.sipTrunksRef" -}}
{{- include "hark.secretSource" (list . .Values.sip.trunks "" "") }}
{{- end }}

{{- define "hark.sipWebhookSecretRef" -}}
{{- include "hark.secretSource" (list . .Values.sip.webhook "" "") }}
{{- end }}

{{- define "hark.metricsKeyRef" -}}
{{- $own := dict "existingSecret" .Values.metrics.podMonitor.keySecret "existingSecretKey" .Values.metrics.podMonitor.keySecretKey }}
{{- include "hark.secretSource" (list . $own "" "") }}
{{- end }}

{{- define "hark.redisName" -}}
{{- printf "%s-redis" (include "hark.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "hark.relayName" -}}
{{- printf "%s-relay" (include "hark.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "hark.sipName" -}}
{{- printf "%s-sip" (include "hark.fullname" .) | trunc 63 | trimSuffix "-" }}
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

{{/* The least grace period that lets a worker drain: Kubernetes counts it from the
preStop hook's start, so the sleep, the whole drain, then up to 15 s of shutdown (closing
sessions, the store). */}}
{{- define "hark.minimumGracePeriod" -}}
{{- add (int .Values.hark.preStopSleepSeconds) (int (ceil .Values.hark.drainTimeoutSeconds)) 15 }}
{{- end }}

{{/* Seconds Kubernetes waits after the preStop hook starts before it kills a worker. */}}
{{- define "hark.terminationGracePeriod" -}}
{{- if kindIs "invalid" .Values.hark.terminationGracePeriodSeconds }}
{{- include "hark.minimumGracePeriod" . }}
{{- else }}
{{- int .Values.hark.terminationGracePeriodSeconds }}
{{- end }}
{{- end }}

{{/* A CPU quantity ("2", 2, "1500m") in millicores. */}}
{{- define "hark.millicores" -}}
{{- $cpu := toString . }}
{{- if hasSuffix "m" $cpu }}
{{- trimSuffix "m" $cpu | int }}
{{- else }}
{{- mulf (float64 $cpu) 1000 | floor | int }}
{{- end }}
{{- end }}

{{/* Which engines the workers run, for sizing: "embedded" (the LLM in the pod),
"remote-llm" (the LLM elsewhere, speech in the pod) or "remote" (LLM and speech elsewhere,
or the fake engines). */}}
{{- define "hark.engineProfile" -}}
{{- if eq .Values.hark.engines "fake" }}remote
{{- else if not (include "hark.llmUrls" .) }}embedded
{{- else if and .Values.speech.asrUrl .Values.speech.ttsUrl }}remote
{{- else }}remote-llm
{{- end }}
{{- end }}

{{/* The HPA's sessions per pod: the value given, else 75 % of what a pod carries by the
figures of docs/deployment.md (Autoscaling): per requested core, 1.5 sessions with the
embedded models (measured) and 3 with the LLM elsewhere (estimate); per process (one event
loop each, up to the cores requested), 30 with everything elsewhere (measured floor of the
protocol and WebRTC). At least 1. */}}
{{- define "hark.sessionsPerPod" -}}
{{- if .Values.autoscaling.sessions.averagePerPod }}
{{- .Values.autoscaling.sessions.averagePerPod }}
{{- else }}
{{- $milli := include "hark.millicores" (.Values.resources.requests.cpu | default 1) | int }}
{{- $profile := include "hark.engineProfile" . }}
{{- $sessions := 1 }}
{{- if eq $profile "embedded" }}
{{- $sessions = div (mul $milli 15) 10000 }}
{{- else if eq $profile "remote-llm" }}
{{- $sessions = div (mul $milli 3) 1000 }}
{{- else }}
{{- $processes := min (int .Values.hark.workers) (max 1 (div $milli 1000)) }}
{{- $sessions = mul $processes 30 }}
{{- end }}
{{- max 1 $sessions }}
{{- end }}
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
{{- if not (include "hark.apiKeysRef" .) }}
{{- fail "no API keys: set existingSecret (a Secret you made, key api-keys), apiKeys.existingSecret or apiKeys.keys; the chart generates no secret (docs/deployment.md)" }}
{{- end }}
{{- if not (include "hark.fleetSecretRef" .) }}
{{- fail "no fleet secret: set existingSecret (a Secret you made, key fleet-secret), fleetSecret.existingSecret or fleetSecret.value; the chart generates no secret (docs/deployment.md)" }}
{{- end }}
{{- if and .Values.fleetSecret.value (lt (len .Values.fleetSecret.value) 16) }}
{{- fail "fleetSecret.value must be at least 16 bytes long" }}
{{- end }}
{{- if and (or .Values.redis.enabled .Values.redis.auth.external) (not (include "hark.redisPasswordRef" .)) }}
{{- fail "no Redis password: set existingSecret (a Secret you made, key redis-password), redis.auth.existingSecret or redis.auth.password; the chart generates no secret (docs/deployment.md)" }}
{{- end }}
{{- if lt (int (include "hark.terminationGracePeriod" .)) (int (include "hark.minimumGracePeriod" .)) }}
{{- fail (printf "hark.terminationGracePeriodSeconds must be at least %s: the preStop sleep, the drain and 15 s of shutdown" (include "hark.minimumGracePeriod" .)) }}
{{- end }}
{{- if not (has .Values.media.advertise (list "hostIP" "externalIP")) }}
{{- fail "media.advertise must be hostIP or externalIP" }}
{{- end }}
{{- if .Values.relay.enabled }}
{{- if not .Values.media.enabled }}
{{- fail "relay.enabled needs media.enabled (the relay carries the workers' WebRTC media)" }}
{{- end }}
{{- if not (regexMatch "^[0-9]+\\.[0-9]+\\.[0-9]+\\.[0-9]+$" .Values.relay.publicIP) }}
{{- fail "relay.enabled: relay.publicIP must be the IPv4 address the relay's load balancer has (reserve one first; docs/deployment.md)" }}
{{- end }}
{{- end }}
{{- if .Values.sip.enabled }}
{{- if and (not .Values.sip.trunks.enabled) (not .Values.sip.webhook.url) }}
{{- fail "sip.enabled: say who may call, with sip.trunks.enabled (trunks in a Secret) or sip.webhook.url" }}
{{- end }}
{{- if and .Values.sip.trunks.enabled (not (include "hark.sipTrunksRef" .)) }}
{{- fail "sip.trunks.enabled: name the Secret holding the trunks (sip.trunks.existingSecret or existingSecret, key sip-trunks)" }}
{{- end }}
{{- if and .Values.networkPolicy.enabled (not .Values.networkPolicy.nodePeers) }}
{{- fail "sip.enabled with networkPolicy.enabled: give the nodes' addresses in networkPolicy.nodePeers (the SIP pods on hostNetwork reach Redis and the workers from them)" }}
{{- end }}
{{- if and .Values.sip.webhook.url (not (include "hark.sipWebhookSecretRef" .)) }}
{{- fail "sip.webhook.url: name the Secret holding its signing secret (sip.webhook.existingSecret or existingSecret, key sip-webhook-secret)" }}
{{- end }}
{{- end }}
{{- if and .Values.metrics.podMonitor.enabled (not (include "hark.metricsKeyRef" .)) }}
{{- fail "metrics.podMonitor.enabled: name the Secret holding Prometheus's key (metrics.podMonitor.keySecret or existingSecret, key metrics-key)" }}
{{- end }}
{{- end }}

{{/* The workers' and relays' Redis, as env entries: HARK_REDIS_URL, and the password
apart from it (HARK_REDIS_PASSWORD, which both read), so that it need not be URL-safe. */}}
{{- define "hark.redisEnv" -}}
{{- if or .Values.redis.enabled .Values.redis.auth.external }}
- name: HARK_REDIS_PASSWORD
  valueFrom:
    {{- include "hark.secretKeyRef" (include "hark.redisPasswordRef" .) | nindent 4 }}
{{- end }}
{{- if .Values.redis.enabled }}
{{- $user := "" }}
{{- with .Values.redis.auth.username }}{{ $user = printf "%s@" . }}{{ end }}
{{- if .Values.redis.tls.enabled }}
- name: HARK_REDIS_URL
  value: "rediss://{{ $user }}{{ include "hark.redisName" . }}:{{ .Values.redis.port }}/0?ssl_ca_certs=/etc/hark/redis-tls/ca.crt"
{{- else }}
- name: HARK_REDIS_URL
  value: "redis://{{ $user }}{{ include "hark.redisName" . }}:{{ .Values.redis.port }}/0"
{{- end }}
{{- else if .Values.redis.urlSecret }}
- name: HARK_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.redis.urlSecret }}
      key: {{ .Values.redis.urlSecretKey }}
{{- else }}
- name: HARK_REDIS_URL
  value: {{ .Values.redis.url | quote }}
{{- end }}
- name: HARK_FLEET_SECRET
  valueFrom:
    {{- include "hark.secretKeyRef" (include "hark.fleetSecretRef" .) | nindent 4 }}
{{- end }}

{{/* The Redis CA's volume and mount, for pods that talk TLS to the chart's Redis. */}}
{{- define "hark.redisTlsMount" -}}
{{- if and .Values.redis.enabled .Values.redis.tls.enabled }}
- name: redis-tls
  mountPath: /etc/hark/redis-tls
  readOnly: true
{{- end }}
{{- end }}

{{- define "hark.redisTlsVolume" -}}
{{- if and .Values.redis.enabled .Values.redis.tls.enabled }}
# Only the CA: clients check Redis's certificate, they present none.
- name: redis-tls
  secret:
    secretName: {{ .Values.redis.tls.secret }}
    items:
      - key: ca.crt
        path: ca.crt
{{- end }}
{{- end }}

{{/* media.advertise externalIP: an init container that reads the node's ExternalIP from
the Kubernetes API and writes it into a TOML file that hark reads through HARK_CONFIG, for
the options named (list $ "rtc_advertise_ip" ...). Only this container gets a token; hark
itself never talks to the API. */}}
{{- define "hark.nodeAddressInit" -}}
{{- $root := index . 0 }}
- name: node-address
  image: {{ include "hark.image" $root | quote }}
  imagePullPolicy: {{ $root.Values.image.pullPolicy }}
  command:
    - python
    - -c
    - |
      import ipaddress, json, os, ssl, urllib.request
      account = os.environ["HARK_NODE_ACCOUNT_DIR"]
      node = os.environ["NODE_NAME"]
      host = os.environ["KUBERNETES_SERVICE_HOST"]
      host = f"[{host}]" if ":" in host else host
      url = f"https://{host}:{os.environ['KUBERNETES_SERVICE_PORT']}/api/v1/nodes/{node}"
      with open(os.path.join(account, "token")) as f:
          token = f.read().strip()
      tls = ssl.create_default_context(cafile=os.path.join(account, "ca.crt"))
      request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
      with urllib.request.urlopen(request, context=tls, timeout=10) as answer:
          addresses = json.load(answer).get("status", {}).get("addresses", [])
      found = [
          a["address"]
          for a in addresses
          if a.get("type") == "ExternalIP" and ipaddress.ip_address(a["address"]).version == 4
      ]
      if not found:
          raise SystemExit(
              f"node {node} has no IPv4 ExternalIP: use the relay (relay.enabled) or "
              "media.advertise=hostIP"
          )
      lines = [f'{option} = "{found[0]}"' for option in os.environ["HARK_NODE_OPTIONS"].split(",")]
      with open(os.environ["HARK_NODE_CONFIG"], "w") as f:
          f.write("\n".join(lines) + "\n")
      print(f"node {node}: advertising {found[0]}")
  env:
    - name: NODE_NAME
      valueFrom:
        fieldRef:
          fieldPath: spec.nodeName
    - name: HARK_NODE_ACCOUNT_DIR
      value: /var/run/secrets/hark-node
    - name: HARK_NODE_CONFIG
      value: /run/hark/node/node.toml
    - name: HARK_NODE_OPTIONS
      value: {{ join "," (rest .) | quote }}
  securityContext:
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop: ["ALL"]
  resources:
    requests: {cpu: 10m, memory: 32Mi}
    limits: {memory: 128Mi}
  volumeMounts:
    - name: node-address
      mountPath: /run/hark/node
    - name: node-account
      mountPath: /var/run/secrets/hark-node
      readOnly: true
{{- end }}

{{- define "hark.nodeAddressVolumes" -}}
- name: node-address
  emptyDir:
    sizeLimit: 1Mi
# A short-lived token and the cluster's CA, for the init container only.
- name: node-account
  projected:
    sources:
      - serviceAccountToken:
          path: token
          expirationSeconds: 600
      - configMap:
          name: kube-root-ca.crt
          items:
            - key: ca.crt
              path: ca.crt
{{- end }}

{{/* Speech engines elsewhere (values.yaml, speech), as env entries. */}}
{{- define "hark.speechEnv" -}}
{{- with .Values.speech.asrUrl }}
- name: HARK_ASR_URL
  value: {{ . | quote }}
{{- end }}
{{- with .Values.speech.asrModel }}
- name: HARK_ASR_MODEL
  value: {{ . | quote }}
{{- end }}
{{- with .Values.speech.ttsUrl }}
- name: HARK_TTS_URL
  value: {{ . | quote }}
{{- end }}
{{- with .Values.speech.ttsModel }}
- name: HARK_TTS_MODEL
  value: {{ . | quote }}
{{- end }}
{{- if .Values.speech.apiKeySecret }}
{{- range $name := list "HARK_ASR_API_KEY" "HARK_TTS_API_KEY" }}
- name: {{ $name }}
  valueFrom:
    secretKeyRef:
      name: {{ $.Values.speech.apiKeySecret }}
      key: {{ $.Values.speech.apiKeySecretKey }}
{{- end }}
{{- end }}
{{- end }}

{{/* What every `hark serve` pod of the chart (workers, SIP pods) starts with besides its
own ports and addresses: hops, zone, drain, engines, keys, the store, the LLM and speech,
limits, traces and extraEnv. */}}
{{- define "hark.sharedEnv" -}}
{{- if .Values.hopTls.enabled }}
# Hops come to a TLS listener and go out over TLS only (values.yaml, hopTls).
- name: HARK_HOP_TLS_CERT
  value: /etc/hark/hop-tls/tls.crt
- name: HARK_HOP_TLS_KEY
  value: /etc/hark/hop-tls/tls.key
- name: HARK_HOP_TLS_CA
  value: /etc/hark/hop-tls/ca.crt
- name: HARK_HOP_PORT
  value: {{ .Values.hopTls.port | quote }}
{{- end }}
{{- with .Values.hark.zone }}
- name: HARK_ZONE
  value: {{ . | quote }}
{{- end }}
- name: HARK_DRAIN_TIMEOUT
  value: {{ .Values.hark.drainTimeoutSeconds | quote }}
- name: HARK_ENGINES
  value: {{ .Values.hark.engines | quote }}
- name: HARK_LOG_LEVEL
  value: {{ .Values.hark.logLevel | quote }}
- name: HARK_API_KEYS
  valueFrom:
    {{- include "hark.secretKeyRef" (include "hark.apiKeysRef" .) | nindent 4 }}
{{- include "hark.redisEnv" . | nindent 0 }}
{{- $llmUrls := include "hark.llmUrls" . }}
{{- if $llmUrls }}
- name: HARK_LLM_URL
  value: {{ $llmUrls | quote }}
- name: HARK_LLM_MODEL
  value: {{ include "hark.llmModel" . | quote }}
{{- end }}
{{- if .Values.llm.apiKeySecret }}
- name: HARK_LLM_API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .Values.llm.apiKeySecret }}
      key: {{ .Values.llm.apiKeySecretKey }}
{{- end }}
{{- include "hark.speechEnv" . | nindent 0 }}
{{- with .Values.hark.otelEndpoint }}
- name: HARK_OTEL_ENDPOINT
  value: {{ . | quote }}
{{- end }}
{{- with .Values.hark.keyMaxSessions }}
- name: HARK_KEY_MAX_SESSIONS
  value: {{ . | quote }}
{{- end }}
{{- with .Values.hark.keyRequestsPerMinute }}
- name: HARK_KEY_REQUESTS_PER_MINUTE
  value: {{ . | quote }}
{{- end }}
{{- with .Values.hark.keyTokensPerMinute }}
- name: HARK_KEY_TOKENS_PER_MINUTE
  value: {{ . | quote }}
{{- end }}
{{- with .Values.hark.extraEnv }}
{{- toYaml . | nindent 0 }}
{{- end }}
{{- end }}
