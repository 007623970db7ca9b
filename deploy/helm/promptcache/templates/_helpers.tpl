{{/* Names and labels shared by every template. */}}

{{- define "promptcache.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's resource name: the release name, with the chart name appended unless it is in it. */}}
{{- define "promptcache.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "promptcache.redisName" -}}
{{- printf "%s-redis" (include "promptcache.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "promptcache.secretName" -}}
{{- default (include "promptcache.fullname" .) .Values.existingSecret -}}
{{- end -}}

{{- define "promptcache.commonLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/part-of: promptcache
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/* Labels of the proxy's objects (and of the release's other objects). */}}
{{- define "promptcache.labels" -}}
{{ include "promptcache.commonLabels" . }}
{{ include "promptcache.selectorLabels" . }}
{{- end -}}

{{/* Labels of the Redis objects. */}}
{{- define "promptcache.redisLabels" -}}
{{ include "promptcache.commonLabels" . }}
{{ include "promptcache.redisSelectorLabels" . }}
{{- end -}}

{{/* Pods of the proxy. */}}
{{- define "promptcache.selectorLabels" -}}
app.kubernetes.io/name: {{ include "promptcache.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: proxy
{{- end -}}

{{/* Pods of the release's Redis. */}}
{{- define "promptcache.redisSelectorLabels" -}}
app.kubernetes.io/name: redis
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: session-store
{{- end -}}

{{/* Where the image's packaged rules are (a wheel's data files under the python image's /usr/local). */}}
{{- define "promptcache.rulesDir" -}}
/usr/local/share/promptcache/rules
{{- end -}}

{{- define "promptcache.redisHost" -}}
{{- if .Values.redis.enabled -}}
{{- include "promptcache.redisName" . -}}
{{- else -}}
{{- required "externalRedis.host is required when redis.enabled is false" .Values.externalRedis.host -}}
{{- end -}}
{{- end -}}

{{/* The store URL; $(REDIS_PASSWORD) is expanded by Kubernetes from the container's env. */}}
{{- define "promptcache.storeUrl" -}}
{{- if .Values.redis.enabled -}}
{{- printf "redis://:$(REDIS_PASSWORD)@%s:6379/0" (include "promptcache.redisName" .) -}}
{{- else -}}
{{- printf "redis://:$(REDIS_PASSWORD)@%s:%v/%v" (include "promptcache.redisHost" .) .Values.externalRedis.port .Values.externalRedis.db -}}
{{- end -}}
{{- end -}}
