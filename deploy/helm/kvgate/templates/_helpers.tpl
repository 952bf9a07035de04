{{/* The chart's name, or nameOverride. */}}
{{- define "kvgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name: release-chart, or fullnameOverride. */}}
{{- define "kvgate.fullname" -}}
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

{{- define "kvgate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "kvgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "kvgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: gateway
{{- end }}

{{- define "kvgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kvgate.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "kvgate.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The Redis URL of the shared budget: the given one, or the chart's own Redis. */}}
{{- define "kvgate.redisURL" -}}
{{- if .Values.sharedBudget.redisURL }}
{{- .Values.sharedBudget.redisURL }}
{{- else if .Values.redis.enabled }}
{{- printf "redis://%s-redis:6379/0" (include "kvgate.fullname" .) }}
{{- else }}
{{- fail "sharedBudget.enabled needs a Redis: set sharedBudget.redisURL, or redis.enabled for the chart's own" }}
{{- end }}
{{- end }}

{{/* Refuse values that would overflow the GPU. */}}
{{- define "kvgate.validate" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.sharedBudget.enabled) }}
{{- fail (printf "replicaCount %d needs sharedBudget.enabled: without a shared budget every replica admits against the whole GPU budget" (int .Values.replicaCount)) }}
{{- end }}
{{- if hasKey .Values.config "listen" }}
{{- fail "config.listen is set from containerPort; remove it" }}
{{- end }}
{{- if and .Values.sharedBudget.enabled (hasKey .Values.config "shared_budget") }}
{{- fail "config.shared_budget is rendered from sharedBudget; set sharedBudget.config instead" }}
{{- end }}
{{- $server := get (.Values.config | default dict) "server" | default dict }}
{{- range $key, $value := dict "drain_delay" "drainDelaySeconds" "shutdown_timeout" "shutdownTimeoutSeconds" }}
{{- if hasKey $server $key }}
{{- fail (printf "config.server.%s is rendered from %s; set that instead" $key $value) }}
{{- end }}
{{- end }}
{{- $stop := add (int .Values.preStopSleepSeconds) (int .Values.drainDelaySeconds) (int .Values.shutdownTimeoutSeconds) }}
{{- if lt (int .Values.terminationGracePeriodSeconds) (add $stop 5) }}
{{- fail (printf "terminationGracePeriodSeconds %d is too short: preStopSleepSeconds + drainDelaySeconds + shutdownTimeoutSeconds is %ds, and the kubelet would kill the pod before its streams end; give it at least %d" (int .Values.terminationGracePeriodSeconds) (int $stop) (int (add $stop 5))) }}
{{- end }}
{{- end }}

{{/* The gateway's config, with the shutdown timings rendered from the values. */}}
{{- define "kvgate.config" -}}
{{- $config := deepCopy (.Values.config | default dict) }}
{{- $server := deepCopy (get $config "server" | default dict) }}
{{- $_ := set $server "drain_delay" (printf "%ds" (int .Values.drainDelaySeconds)) }}
{{- $_ = set $server "shutdown_timeout" (printf "%ds" (int .Values.shutdownTimeoutSeconds)) }}
{{- $_ = set $config "server" $server }}
{{- toYaml $config }}
{{- end }}
