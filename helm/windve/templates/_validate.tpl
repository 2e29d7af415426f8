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
{{- $_ := include "windve.redisMode" . }}
{{- end }}
