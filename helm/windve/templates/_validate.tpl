{{/* Reject value combinations that would render a pod that cannot start. Included once
from the ConfigMap, which every release renders. */}}
{{- define "windve.validate" -}}
{{- if eq .Values.model.source "volume" }}
{{- if not .Values.model.volume }}
{{- fail "model.source=volume needs model.volume (e.g. persistentVolumeClaim: {claimName: models} or hostPath: {path: /data/models})" }}
{{- end }}
{{- if not .Values.model.path }}
{{- fail "model.source=volume needs model.path, the model folder inside the volume" }}
{{- end }}
{{- end }}
{{- if and (eq (toString .Values.config.cpu_layout) "explicit") (not .Values.config.plan) }}
{{- fail "config.cpu_layout=explicit needs a config.plan list" }}
{{- end }}
{{- if and .Values.redis.auth.password .Values.redis.auth.existingSecret }}
{{- fail "redis.auth.password and redis.auth.existingSecret are both set: the chart's Redis takes its password from one of them. Leave redis.auth.password empty to read it from the Secret (key redis.auth.existingSecretPasswordKey), or leave redis.auth.existingSecret empty to use the given password" }}
{{- end }}
{{- $redis := include "windve.redisMode" . }}
{{- if and .Values.calibration.enabled (not (has $redis (list "url" "secret"))) }}
{{- fail "calibration.enabled runs the calibration Job before the release's objects exist (pre-install, while the accelerator is still free), so it needs a Redis that already exists: set redis.enabled=false with redis.externalUrl or redis.externalUrlSecret, or leave calibration off and let each pod probe its depths at start (config.depth_control=adaptive)" }}
{{- end }}
{{- if and (gt (len (include "windve.fullname" .)) 55) (or .Values.metrics.prometheusRule.enabled (and .Values.autoscaling.enabled .Values.autoscaling.keda.enabled)) }}
{{- fail (printf "the release's full name %q is over 55 characters: its pods' names are cut so short that the alerts' and KEDA's queries could not tell the server's pods from Redis's. Use a shorter release name or fullnameOverride" (include "windve.fullname" .)) }}
{{- end }}
{{- if and .Values.config.default_prompt .Values.config.default_prompt_name }}
{{- fail "config.default_prompt and config.default_prompt_name are both set: the service takes one (a prompt's text, or the name of one of the model's prompts)" }}
{{- end }}
{{- if lt (int .Values.terminationGracePeriodSeconds) (add (int .Values.preStopSleepSeconds) 35 | int) }}
{{- fail (printf "terminationGracePeriodSeconds (%v) must cover preStopSleepSeconds (%v) and the service's drain (up to 30 s, then 5 s to exit): at least %d, or pods are killed mid-drain" .Values.terminationGracePeriodSeconds .Values.preStopSleepSeconds (add (int .Values.preStopSleepSeconds) 35)) }}
{{- end }}
{{- if and .Values.autoscaling.enabled (lt (int .Values.autoscaling.maxReplicas) (int .Values.autoscaling.minReplicas)) }}
{{- fail "autoscaling.maxReplicas is below autoscaling.minReplicas" }}
{{- end }}
{{- if and .Values.httpRoute.enabled (not .Values.httpRoute.parentRefs) }}
{{- fail "httpRoute.enabled needs httpRoute.parentRefs, the Gateway (and listener) the route attaches to" }}
{{- end }}
{{- if and .Values.autoscaling.enabled (eq (toString .Values.autoscaling.queueOccupancy.pool) "accelerator") (eq .Values.accelerator.type "none") (ne (toString .Values.config.cpu_layout) "explicit") }}
{{- fail "autoscaling.queueOccupancy.pool=accelerator, but accelerator.type=none gives the pods no accelerator pool: its occupancy would read as nothing and never scale. Leave pool empty (both pools) or use cpu" }}
{{- end }}
{{- if and .Values.autoscaling.enabled .Values.autoscaling.keda.enabled }}
{{- if not .Values.autoscaling.queueOccupancy.enabled }}
{{- fail "autoscaling.keda scales on queue occupancy: set autoscaling.queueOccupancy.enabled=true, or use the HPA's CPU fallback (autoscaling.keda.enabled=false)" }}
{{- end }}
{{- if not .Values.autoscaling.keda.serverAddress }}
{{- fail "autoscaling.keda.enabled needs autoscaling.keda.serverAddress, the URL of the Prometheus that scrapes windve" }}
{{- end }}
{{- end }}
{{- end }}
