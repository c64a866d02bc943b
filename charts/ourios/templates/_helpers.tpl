{{/*
Names, labels and the pieces several templates share.
*/}}

{{- define "ourios.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The fullname is also the StatefulSet's name, so pods are <fullname>-<ordinal> and that
pod name is the node id (OURIOS_SERVER_NODE_ID). Kept to 52 characters so the pod name
and the controller-revision-hash label stay within 63.
*/}}
{{- define "ourios.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "ourios.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "ourios.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ourios.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "ourios.labels" -}}
helm.sh/chart: {{ include "ourios.chart" . }}
{{ include "ourios.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: ourios
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "ourios.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ourios.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "ourios.headlessServiceName" -}}
{{- printf "%s-headless" (include "ourios.fullname" .) }}
{{- end }}

{{- define "ourios.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- $repository := include "ourios.imageRepository" . }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repository $tag }}
{{- end }}
{{- end }}

{{/*
image.repository, its registry replaced by global.imageRegistry when that is set. The first
path part is a registry when it has a "." or ":" or is localhost, as Docker reads it.
*/}}
{{- define "ourios.imageRepository" -}}
{{- $registry := trimSuffix "/" (toString (default "" (.Values.global | default dict).imageRegistry)) }}
{{- $parts := splitList "/" .Values.image.repository }}
{{- $first := first $parts }}
{{- if not $registry }}
{{- .Values.image.repository }}
{{- else if and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq "localhost" $first)) }}
{{- printf "%s/%s" $registry (rest $parts | join "/") }}
{{- else }}
{{- printf "%s/%s" $registry .Values.image.repository }}
{{- end }}
{{- end }}

{{/* Where the data volume is mounted; the same path as the image's OURIOS_SERVER_DATA_DIR. */}}
{{- define "ourios.dataDir" -}}/var/lib/ourios{{- end }}
{{- define "ourios.authDir" -}}/etc/ourios/auth{{- end }}
{{- define "ourios.tokensFile" -}}{{ include "ourios.authDir" . }}/tokens.yaml{{- end }}
{{- define "ourios.tlsDir" -}}/etc/ourios/tls{{- end }}
{{- define "ourios.clientCaDir" -}}/etc/ourios/tls-client-ca{{- end }}
{{/* The port /healthz, /readyz and /metrics are served on: metrics when set, else http. */}}
{{- define "ourios.opsPort" -}}{{ ternary "metrics" "http" (gt (int64 .Values.server.metricsPort) 0) }}{{- end }}
{{/* Their scheme: https only on the http port of a TLS node. */}}
{{- define "ourios.opsScheme" -}}{{ ternary "HTTPS" "HTTP" (and (ne .Values.tls.existingSecret "") (eq (int64 .Values.server.metricsPort) 0)) }}{{- end }}

{{/* The Secret holding the S3 keys, or "" for the pod's own AWS identity. */}}
{{- define "ourios.storeSecretName" -}}
{{- if .Values.store.existingSecret }}
{{- .Values.store.existingSecret }}
{{- else if .Values.store.accessKeyId }}
{{- printf "%s-store" (include "ourios.fullname" .) }}
{{- end }}
{{- end }}

{{- define "ourios.storeSecretKeys" -}}
{{- if .Values.store.existingSecret }}
{{- toJson (dict "accessKeyId" .Values.store.existingSecretKeys.accessKeyId "secretAccessKey" .Values.store.existingSecretKeys.secretAccessKey) }}
{{- else }}
{{- toJson (dict "accessKeyId" "AWS_ACCESS_KEY_ID" "secretAccessKey" "AWS_SECRET_ACCESS_KEY") }}
{{- end }}
{{- end }}

{{/* The Secret holding the tokens file, or "" in open mode. */}}
{{- define "ourios.authSecretName" -}}
{{- if .Values.auth.existingSecret }}
{{- .Values.auth.existingSecret }}
{{- else if .Values.auth.tokens }}
{{- printf "%s-auth" (include "ourios.fullname" .) }}
{{- end }}
{{- end }}

{{- define "ourios.authSecretKey" -}}
{{- if .Values.auth.existingSecret }}{{ .Values.auth.existingSecretKey }}{{ else }}tokens.yaml{{ end }}
{{- end }}

{{/*
terminationGracePeriodSeconds: the preStop sleep, then SIGTERM handling's listener drain
(server.shutdownGraceSecs), then the final cut (shutdown.finalCutSecs).
*/}}
{{- define "ourios.terminationGrace" -}}
{{- $drain := add (int64 .Values.shutdown.preStopSleepSecs) (int64 .Values.server.shutdownGraceSecs) }}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds }}
{{- add $drain (int64 .Values.shutdown.finalCutSecs) }}
{{- else }}
{{- int64 .Values.terminationGracePeriodSeconds }}
{{- end }}
{{- end }}

{{/*
server.final_cut_secs for the node: shutdown.finalCutSecs, or less when an explicit
terminationGracePeriodSeconds leaves less after the preStop sleep and the drain, so the
node's own bound (SIGTERM to exit: the drain, then the final cut) always ends inside the
pod's grace and Kubernetes never SIGKILLs a stop in progress.
*/}}
{{- define "ourios.finalCutSecs" -}}
{{- $cut := int64 .Values.shutdown.finalCutSecs }}
{{- if not (kindIs "invalid" .Values.terminationGracePeriodSeconds) }}
{{- $drain := add (int64 .Values.shutdown.preStopSleepSecs) (int64 .Values.server.shutdownGraceSecs) }}
{{- $cut = min $cut (sub (int64 .Values.terminationGracePeriodSeconds) $drain) }}
{{- end }}
{{- $cut }}
{{- end }}

{{/*
The settings of `ourios serve` the chart renders, as JSON {OURIOS_NAME: "text"}: every
settings value, mapped <section>.<camelCaseName> -> OURIOS_<SECTION>_<NAME> (tests check
the mapping against app/base/config.py). Integers in decimal (Helm holds numbers as float64,
which would print 6.7108864e+07), booleans as true/false, strings as they are. A removed
(null) value or an empty optional string is left out, so the app's default applies.
*/}}
{{- define "ourios.settingsEnv" -}}
{{- $out := dict "OURIOS_SERVER_DATA_DIR" (include "ourios.dataDir" .) }}
{{- $v := .Values }}
{{- $pairs := list
  (list "OURIOS_SERVER_HOST" $v.server.host)
  (list "OURIOS_SERVER_HTTP_PORT" $v.server.httpPort)
  (list "OURIOS_SERVER_GRPC_PORT" $v.server.grpcPort)
  (list "OURIOS_SERVER_METRICS_PORT" $v.server.metricsPort)
  (list "OURIOS_SERVER_LOG_LEVEL" $v.server.logLevel)
  (list "OURIOS_SERVER_LOG_FORMAT" $v.server.logFormat)
  (list "OURIOS_SERVER_SHUTDOWN_GRACE_SECS" $v.server.shutdownGraceSecs)
  (list "OURIOS_SERVER_FINAL_CUT_SECS" (include "ourios.finalCutSecs" .))
  (list "OURIOS_SERVER_WORKERS" $v.server.workers)
  (list "OURIOS_SERVER_ENCODE_CONCURRENCY" $v.server.encodeConcurrency)
  (list "OURIOS_SERVER_ENCODE_DUTY_PERCENT" $v.server.encodeDutyPercent)
  (list "OURIOS_SERVER_DECODER" $v.server.decoder)
  (list "OURIOS_SERVER_THREAD_RESTARTS" $v.server.threadRestarts)
  (list "OURIOS_SERVER_MAX_REQUEST_RECORDS" $v.server.maxRequestRecords)
  (list "OURIOS_SERVER_MAX_ATTRIBUTES_PER_RECORD" $v.server.maxAttributesPerRecord)
  (list "OURIOS_SERVER_MAX_ATTRIBUTES_PER_REQUEST" $v.server.maxAttributesPerRequest)
  (list "OURIOS_SERVER_MAX_ATTRIBUTE_KEY_BYTES" $v.server.maxAttributeKeyBytes)
  (list "OURIOS_SERVER_MAX_ATTRIBUTE_VALUE_BYTES" $v.server.maxAttributeValueBytes)
  (list "OURIOS_SERVER_MAX_EXPANDED_BYTES" $v.server.maxExpandedBytes)
  (list "OURIOS_SERVER_MAX_INFLIGHT_REQUESTS" $v.server.maxInflightRequests)
  (list "OURIOS_SERVER_MAX_INFLIGHT_BYTES" $v.server.maxInflightBytes)
  (list "OURIOS_SERVER_MAX_CONCURRENT_DECODES" $v.server.maxConcurrentDecodes)
  (list "OURIOS_SERVER_BODY_READ_TIMEOUT_SECS" $v.server.bodyReadTimeoutSecs)
  (list "OURIOS_SERVER_OPEN_NEW_TENANTS_PER_MINUTE" $v.server.openNewTenantsPerMinute)
  (list "OURIOS_SERVER_GRPC_MAX_CONCURRENT_RPCS" $v.server.grpcMaxConcurrentRpcs)
  (list "OURIOS_WAL_SEGMENT_MAX_BYTES" $v.wal.segmentMaxBytes)
  (list "OURIOS_WAL_SEGMENT_AGE_SECS" $v.wal.segmentAgeSecs)
  (list "OURIOS_WAL_BARRIER_SECS" $v.wal.barrierSecs)
  (list "OURIOS_WAL_HOUSEKEEPING_SECS" $v.wal.housekeepingSecs)
  (list "OURIOS_WAL_MAX_UNLINKS_PER_PASS" $v.wal.maxUnlinksPerPass)
  (list "OURIOS_WAL_ROTATION_RETRY_ATTEMPTS" $v.wal.rotationRetryAttempts)
  (list "OURIOS_WAL_MAX_TENANTS" $v.wal.maxTenants)
  (list "OURIOS_WAL_MAX_FRAME_BYTES" $v.wal.maxFrameBytes)
  (list "OURIOS_WAL_UNRECLAIMED_BYTES_LIMIT" $v.wal.unreclaimedBytesLimit)
  (list "OURIOS_WAL_HIGH_WATER_BYTES" $v.wal.highWaterBytes)
  (list "OURIOS_WAL_ARCHIVE" $v.wal.archive)
  (list "OURIOS_WAL_FRAME_MINING_ATTEMPTS" $v.wal.frameMiningAttempts)
  (list "OURIOS_WAL_FRAME_DECODE_ATTEMPTS" $v.wal.frameDecodeAttempts)
  (list "OURIOS_WAL_TURN_BACKLOG_BYTES" $v.wal.turnBacklogBytes)
  (list "OURIOS_SINK_FLUSH_BYTES" $v.sink.flushBytes)
  (list "OURIOS_SINK_FLUSH_AGE_SECS" $v.sink.flushAgeSecs)
  (list "OURIOS_SINK_CEILING_BYTES" $v.sink.ceilingBytes)
  (list "OURIOS_SINK_MAX_OBJECT_BYTES" $v.sink.maxObjectBytes)
  (list "OURIOS_SINK_DEAD_LETTER_ATTEMPTS" $v.sink.deadLetterAttempts)
  (list "OURIOS_SINK_PUBLISHER_QUEUE_DEPTH" $v.sink.publisherQueueDepth)
  (list "OURIOS_SINK_PARQUET_COMPRESSION" $v.sink.parquetCompression)
  (list "OURIOS_STORE_URL" $v.store.url)
  (list "OURIOS_STORE_ENDPOINT_URL" $v.store.endpointUrl)
  (list "OURIOS_STORE_REGION" $v.store.region)
  (list "OURIOS_STORE_PROBE_SECS" $v.store.probeSecs)
  (list "OURIOS_DISK_LOW_WATER_BYTES" $v.disk.lowWaterBytes)
  (list "OURIOS_DISK_STOP_WATER_BYTES" $v.disk.stopWaterBytes)
  (list "OURIOS_DISK_RESERVE_BYTES" $v.disk.reserveBytes)
  (list "OURIOS_MINER_MAX_TEMPLATES" $v.miner.maxTemplates)
  (list "OURIOS_MINER_MAX_LEAF_TEMPLATES" $v.miner.maxLeafTemplates)
  (list "OURIOS_MINER_MINED_BODY_CHARS" $v.miner.minedBodyChars)
  (list "OURIOS_MINER_MINED_BODY_TOKENS" $v.miner.minedBodyTokens)
  (list "OURIOS_MINER_TENANT_TURN_PERCENT" $v.miner.tenantTurnPercent)
  (list "OURIOS_MINER_TENANT_TURN_BURST_SECS" $v.miner.tenantTurnBurstSecs)
  (list "OURIOS_MINER_TENANT_BACKLOG_BYTES" $v.miner.tenantBacklogBytes)
}}
{{- range $pairs }}
{{- $name := index . 0 }}
{{- $value := index . 1 }}
{{- if kindIs "invalid" $value }}
{{- else if kindIs "bool" $value }}
{{- $_ := set $out $name (ternary "true" "false" $value) }}
{{- else if or (kindIs "float64" $value) (kindIs "int64" $value) (kindIs "int" $value) }}
{{- $_ := set $out $name (int64 $value | toString) }}
{{- else if ne (toString $value) "" }}
{{- $_ := set $out $name (toString $value) }}
{{- end }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/*
The object store's ports for the NetworkPolicy's egress, as a JSON list:
networkPolicy.egress.storePorts, else store.endpointUrl's port (80 or 443 by its scheme
when it names none), else 443 (AWS S3).
*/}}
{{- define "ourios.storePorts" -}}
{{- $ports := .Values.networkPolicy.egress.storePorts }}
{{- $endpoint := toString (default "" .Values.store.endpointUrl) }}
{{- if $ports }}
{{- toJson $ports }}
{{- else if $endpoint }}
{{- $parsed := urlParse $endpoint }}
{{- $host := $parsed.host }}
{{- if and (contains ":" $host) (not (hasSuffix "]" $host)) }}
{{- toJson (list (last (splitList ":" $host) | int64)) }}
{{- else }}
{{- toJson (list (ternary 80 443 (eq $parsed.scheme "http"))) }}
{{- end }}
{{- else }}
{{- toJson (list 443) }}
{{- end }}
{{- end }}
