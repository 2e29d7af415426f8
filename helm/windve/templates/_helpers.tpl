{{/* Names */}}
{{- define "windve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "windve.fullname" -}}
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

{{- /* PromQL label matchers for this release's server pods. A Deployment's pod is named
<fullname>-<hash>-<id>, cut to 58 characters before the 5-character <id> (so a long fullname
loses the hash, or the dash before the id); hash and id are written in Kubernetes' alphabet of
consonants and digits (k8s.io/apimachinery's rand), which no "-redis" or "-calibrate" matches.
PromQL anchors the regex: Redis's pods, the Job's and other releases' stay out. A fullname over
55 characters leaves too little of "-redis" to tell the server's pods from Redis's
(windve.validate refuses it where a query needs it). */}}
{{- define "windve.serverPodMatchers" -}}
{{- $name := include "windve.fullname" . }}
{{- $safe := "[bcdfghjklmnpqrstvwxz2456789]" }}
{{- $pods := printf "%s-%s+(-%s+)?" (regexQuoteMeta $name) $safe $safe }}
{{- printf "namespace=%q,pod=~%q" .Release.Namespace $pods }}
{{- end }}

{{- define "windve.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "windve.redisName" -}}
{{- printf "%s-redis" (include "windve.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "windve.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "windve.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Labels. The component is part of the selector so that the server's Service and PDB
never select the chart's Redis or calibration pods. Call with (dict "ctx" $ "component" "server"). */}}
{{- define "windve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "windve.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "windve.labels" -}}
helm.sh/chart: {{ include "windve.chart" .ctx }}
{{ include "windve.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: windve
{{- end }}

{{- /* Without a tag, a GPU release takes the CUDA build (Dockerfile VARIANT=cuda, tagged
<version>-cuda): the CPU build's torch finds no GPU, and the pod would hold one and serve on
its CPUs. */}}
{{- define "windve.image" -}}
{{- $tag := .Chart.AppVersion }}
{{- if eq .Values.accelerator.type "gpu" }}{{ $tag = printf "%s-cuda" .Chart.AppVersion }}{{ end }}
{{- printf "%s:%s" .Values.image.repository (default $tag .Values.image.tag) }}
{{- end }}

{{/* Redis: the URL source, or "" when the release has no Redis. Fails on ambiguity. */}}
{{- define "windve.redisMode" -}}
{{- $external := or .Values.redis.externalUrl .Values.redis.externalUrlSecret.name }}
{{- if and .Values.redis.enabled $external }}
{{- fail "redis.enabled=true runs the chart's own Redis: leave redis.externalUrl and redis.externalUrlSecret.name empty, or set redis.enabled=false to use the external one" }}
{{- end }}
{{- if .Values.redis.enabled }}internal
{{- else if .Values.redis.externalUrlSecret.name }}secret
{{- else if .Values.redis.externalUrl }}url
{{- end }}
{{- end }}

{{/* The calibration Job runs before the release's objects exist (pre-install), so it
publishes only to a Redis that is already there: an external one. _validate.tpl refuses
calibration.enabled with any other Redis, so this is true exactly when it is enabled. */}}
{{- define "windve.calibrationEnabled" -}}
{{- if and .Values.calibration.enabled (has (include "windve.redisMode" .) (list "url" "secret")) }}true{{ end }}
{{- end }}

{{- define "windve.calibrationConfigName" -}}
{{- printf "%s-calibration" (include "windve.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The settings file (WINDVE_CONFIG), shared by the server's ConfigMap and the Job's. */}}
{{- define "windve.configFile" -}}
config.yaml: |
  {{- toYaml .Values.config | nindent 2 }}
{{- end }}

{{/* Pod annotation that rolls the pods reading the Redis password when a given one changes
(a generated one never does: upgrades keep it). Empty otherwise, and with
redis.auth.existingSecret: the chart never sees that password, so a change to it needs a
`kubectl rollout restart` of Redis and the servers (docs/deploy.md). */}}
{{- /* Roll the pods when the chart's API key changes: a revoked key had kept working, and the
new one been refused, until someone restarted them. */}}
{{- define "windve.apiKeyChecksum" -}}
{{- if and .Values.apiKey.value (not .Values.apiKey.existingSecret) }}
checksum/api-key: {{ .Values.apiKey.value | sha256sum }}
{{- end }}
{{- end }}

{{- define "windve.redisAuthChecksum" -}}
{{- if and .Values.redis.enabled .Values.redis.auth.password }}
checksum/redis-auth: {{ .Values.redis.auth.password | sha256sum }}
{{- end }}
{{- end }}

{{/* The chart's Redis password: the one given, else the one already in the release's
Secret (lookup, so upgrades keep it; empty offline, as in `helm template`), else new. */}}
{{- define "windve.redisPassword" -}}
{{- if .Values.redis.auth.password }}
{{- .Values.redis.auth.password }}
{{- else }}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "windve.redisName" .) }}
{{- $kept := dig "data" "redis-password" "" $existing }}
{{- if $kept }}{{ b64dec $kept }}{{ else }}{{ randAlphaNum 32 }}{{ end }}
{{- end }}
{{- end }}

{{- define "windve.apiKeySecret" -}}
{{- if .Values.apiKey.existingSecret }}{{ .Values.apiKey.existingSecret }}
{{- else if .Values.apiKey.value }}{{ include "windve.fullname" . }}-api-key
{{- end }}
{{- end }}

{{- define "windve.acceleratorResource" -}}
{{- if .Values.accelerator.resourceName }}{{ .Values.accelerator.resourceName }}
{{- else if eq .Values.accelerator.type "gpu" }}nvidia.com/gpu
{{- else if eq .Values.accelerator.type "npu" }}huawei.com/Ascend910
{{- end }}
{{- end }}

{{/* Container resources with the accelerator added to limits (extended resources are
requested through limits). Call with (dict "ctx" $ "resources" $someResources). */}}
{{- define "windve.resources" -}}
{{- $resources := deepCopy (default (dict) .resources) }}
{{- if ne .ctx.Values.accelerator.type "none" }}
{{- $limits := deepCopy (default (dict) (get $resources "limits")) }}
{{- $_ := set $limits (include "windve.acceleratorResource" .ctx) (int .ctx.Values.accelerator.count) }}
{{- $_ := set $resources "limits" $limits }}
{{- end }}
{{- toYaml $resources }}
{{- end }}

{{/* Environment shared by the serving container and the calibration Job: the settings
the chart owns. Everything else comes from the ConfigMap file (WINDVE_CONFIG). */}}
{{- define "windve.env" -}}
- name: WINDVE_CONFIG
  value: /etc/windve/config.yaml
- name: WINDVE_HOST
  value: {{ .Values.service.listenAddress | quote }}
- name: WINDVE_PORT
  value: "8080"
- name: WINDVE_ONNX_CACHE_DIR
  value: /var/cache/windve/onnx
- name: XDG_CACHE_HOME
  value: /var/cache/windve
- name: HF_HOME
  value: /var/cache/windve/huggingface
- name: HF_HUB_OFFLINE
  value: "1"
- name: MPLCONFIGDIR
  value: /tmp/matplotlib
{{- if eq .Values.model.source "volume" }}
- name: WINDVE_MODEL
  value: {{ printf "%s/%s" (trimSuffix "/" .Values.model.mountPath) (trimPrefix "/" .Values.model.path) | quote }}
{{- end }}
{{- with .Values.model.revision }}
- name: WINDVE_REVISION
  value: {{ . | quote }}
{{- end }}
- name: WINDVE_TRUST_REMOTE_CODE
  value: {{ .Values.model.trustRemoteCode | quote }}
{{- $redis := include "windve.redisMode" . }}
{{- if and (eq $redis "internal") .Values.redis.auth.existingSecret }}
# The password is the operator's, in their Secret (which has no URL): the kubelet expands
# $(WINDVE_REDIS_PASSWORD) into the URL (it must come first), so the password is in no pod spec.
- name: WINDVE_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .Values.redis.auth.existingSecret }}
      key: {{ .Values.redis.auth.existingSecretPasswordKey | quote }}
- name: WINDVE_REDIS_URL
  value: {{ printf "redis://:$(WINDVE_REDIS_PASSWORD)@%s:6379/0" (include "windve.redisName" .) | quote }}
{{- else if eq $redis "internal" }}
# The URL holds the password: it comes from the chart's Redis Secret, never the pod spec.
- name: WINDVE_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "windve.redisName" . }}
      key: redis-url
{{- else if eq $redis "secret" }}
- name: WINDVE_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.redis.externalUrlSecret.name }}
      key: {{ .Values.redis.externalUrlSecret.key }}
{{- else if eq $redis "url" }}
- name: WINDVE_REDIS_URL
  value: {{ .Values.redis.externalUrl | quote }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "windve.volumeMounts" -}}
- name: config
  mountPath: /etc/windve
  readOnly: true
- name: cache
  mountPath: /var/cache/windve
- name: tmp
  mountPath: /tmp
- name: shm
  mountPath: /dev/shm
{{- if eq .Values.model.source "volume" }}
- name: model
  mountPath: {{ .Values.model.mountPath }}
  readOnly: true
{{- end }}
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Call with (dict "ctx" $ "configMap" name): the Job mounts its own copy of the settings. */}}
{{- define "windve.volumes" -}}
{{- with .ctx }}
- name: config
  configMap:
    name: {{ $.configMap }}
- name: cache
  emptyDir:
    sizeLimit: {{ .Values.cache.sizeLimit }}
- name: tmp
  emptyDir:
    sizeLimit: {{ .Values.cache.sizeLimit }}
- name: shm
  emptyDir:
    medium: Memory
    sizeLimit: {{ .Values.shm.sizeLimit }}
{{- if eq .Values.model.source "volume" }}
- name: model
  {{- toYaml .Values.model.volume | nindent 2 }}
{{- end }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end }}
{{- end }}

{{/* Placement shared by serving pods and the calibration Job: same node type. */}}
{{- define "windve.placement" -}}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.runtimeClassName }}
runtimeClassName: {{ . }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* A fixed name: before-hook-creation deletes the previous run's Job by this name. */}}
{{- define "windve.calibrationJobName" -}}
{{- printf "%s-calibrate" (include "windve.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
