{{/* Names, labels and the few values every template derives. */}}

{{- define "recall.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* RELEASE-recall, or RELEASE when it already contains the chart name; cut to 45
characters so that "<fullname>-worker" stays within the 52 a StatefulSet name may have
(its pods get a 63-character controller-revision-hash label). */}}
{{- define "recall.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 45 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 45 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 45 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "recall.coordinator.fullname" -}}{{ include "recall.fullname" . }}-coordinator{{- end -}}
{{- define "recall.worker.fullname" -}}{{ include "recall.fullname" . }}-worker{{- end -}}
{{- define "recall.redis.fullname" -}}{{ include "recall.fullname" . }}-redis{{- end -}}

{{/* Labels of every object; call with (dict "ctx" $ "component" "worker"). */}}
{{- define "recall.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "recall.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: recall
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "recall.selectorLabels" -}}
app.kubernetes.io/name: {{ include "recall.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "recall.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "recall.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "recall.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion | toString) -}}
{{- end -}}

{{/* The session store URL: the chart's Redis, an external one, or "" (SQLite). */}}
{{- define "recall.storeUrl" -}}
{{- if .Values.redis.enabled -}}
{{- printf "redis://%s:%d" (include "recall.redis.fullname" .) (int .Values.redis.port) -}}
{{- else if .Values.redis.externalUrl -}}
{{- .Values.redis.externalUrl -}}
{{- end -}}
{{- end -}}

{{/* Stable DNS names of the worker pods (StatefulSet + headless Service), comma separated,
for the coordinator's --workers. */}}
{{- define "recall.workerAddresses" -}}
{{- $name := include "recall.worker.fullname" . -}}
{{- $addrs := list -}}
{{- range $i := until (int .Values.worker.replicas) -}}
{{- $addrs = append $addrs (printf "%s-%d.%s.%s.svc.%s:%d" $name $i $name $.Release.Namespace $.Values.clusterDomain (int $.Values.worker.ports.grpc)) -}}
{{- end -}}
{{- join "," $addrs -}}
{{- end -}}

{{/* A scalar as a flag value. Helm reads numbers in values files as float64, which Go
prints as 1e+06; integral numbers are printed as integers. */}}
{{- define "recall.scalar" -}}
{{- if and (kindIs "float64" .) (eq (float64 (int64 .)) .) -}}
{{- int64 . -}}
{{- else -}}
{{- . -}}
{{- end -}}
{{- end -}}

{{/* The ConfigMap key (and environment variable) of a setting: ("WORKER" "kv-cache-bytes")
gives RECALL_WORKER_KV_CACHE_BYTES. */}}
{{- define "recall.settingVar" -}}
{{- printf "RECALL_%s_%s" (index . 0) (index . 1 | upper | replace "-" "_") -}}
{{- end -}}

{{/* Fails when the values cannot work (values.schema.json rejects the same under Helm). */}}
{{- define "recall.validate" -}}
{{- if and (or (gt (int .Values.coordinator.replicas) 1) .Values.coordinator.autoscaling.enabled) (not (include "recall.storeUrl" .)) -}}
{{- fail "coordinator.replicas > 1 (or autoscaling) needs a shared session store: set redis.enabled=true or redis.externalUrl=redis://HOST:PORT" -}}
{{- end -}}
{{- if not (hasPrefix (printf "%s/" (trimSuffix "/" .Values.worker.model.mountPath)) .Values.worker.model.path) -}}
{{- fail (printf "worker.model.path %s must lie under worker.model.mountPath %s" .Values.worker.model.path .Values.worker.model.mountPath) -}}
{{- end -}}
{{- if and .Values.coordinator.persistence.existingClaim (or (gt (int .Values.coordinator.replicas) 1) .Values.coordinator.autoscaling.enabled (include "recall.storeUrl" .)) -}}
{{- fail "coordinator.persistence.existingClaim holds one coordinator's SQLite store: it needs coordinator.replicas 1, no autoscaling and no Redis" -}}
{{- end -}}
{{- if and .Values.redis.enabled (not .Values.networkPolicy.enabled) -}}
{{- fail "redis.enabled needs networkPolicy.enabled: the chart's Redis has no password, only its NetworkPolicy keeps other pods from every tenant's sessions" -}}
{{- end -}}
{{- if and .Values.redis.enabled .Values.redis.externalUrl -}}
{{- fail "set redis.enabled or redis.externalUrl, not both" -}}
{{- end -}}
{{- if and .Values.coordinator.tls.enabled (not .Values.coordinator.tls.secretName) -}}
{{- fail "coordinator.tls.enabled needs coordinator.tls.secretName" -}}
{{- end -}}
{{- if and .Values.coordinator.apiKeys.enabled (not .Values.coordinator.apiKeys.existingSecret) (not .Values.coordinator.apiKeys.keys) -}}
{{- fail "coordinator.apiKeys.enabled needs coordinator.apiKeys.existingSecret or coordinator.apiKeys.keys" -}}
{{- end -}}
{{- /* recall-worker's own rules between its settings (its defaults: 256, 64, 64). */ -}}
{{- $w := .Values.worker.settings -}}
{{- $batch := int (index $w "max-batch-tokens" | default 256) -}}
{{- $chunk := int (index $w "prefill-chunk" | default 64) -}}
{{- $active := int (index $w "max-active" | default 64) -}}
{{- if gt $chunk $batch -}}
{{- fail (printf "worker.settings.prefill-chunk %d is more than max-batch-tokens %d" $chunk $batch) -}}
{{- end -}}
{{- if gt $active $batch -}}
{{- fail (printf "worker.settings.max-active %d is more than max-batch-tokens %d (running turns decode a token each per step)" $active $batch) -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding the cluster token (key "token"). */}}
{{- define "recall.clusterTokenSecret" -}}
{{- .Values.clusterToken.existingSecret | default (printf "%s-cluster-token" (include "recall.fullname" .)) -}}
{{- end -}}
