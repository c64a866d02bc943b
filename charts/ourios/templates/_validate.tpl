{{/*
The rules between values that JSON Schema cannot say. values.schema.json has each value's
type and range (the app's); these are the app's rules between settings (docs/CONFIG.md,
"Rules between settings") and the chart's own, checked at render time so `helm install`
refuses what `ourios serve` would refuse at start-up. A rule whose value was removed
(null) is the app's to check.
*/}}
{{- define "ourios.validate" -}}
{{- $s := .Values.server }}
{{- $w := .Values.wal }}
{{- $k := .Values.sink }}
{{- $d := .Values.disk }}
{{- $st := .Values.store }}

{{- if and (not (kindIs "invalid" $d.stopWaterBytes)) (not (kindIs "invalid" $d.lowWaterBytes)) }}
{{- if ge (int64 $d.stopWaterBytes) (int64 $d.lowWaterBytes) }}
{{- fail (printf "disk.stopWaterBytes (%d) must be below disk.lowWaterBytes (%d) (OURIOS_DISK_STOP_WATER_BYTES < OURIOS_DISK_LOW_WATER_BYTES)" (int64 $d.stopWaterBytes) (int64 $d.lowWaterBytes)) }}
{{- end }}
{{- end }}

{{- if and (not (kindIs "invalid" $k.flushBytes)) (not (kindIs "invalid" $k.ceilingBytes)) }}
{{- if gt (int64 $k.flushBytes) (int64 $k.ceilingBytes) }}
{{- fail (printf "sink.flushBytes (%d) must be at most sink.ceilingBytes (%d) (OURIOS_SINK_FLUSH_BYTES <= OURIOS_SINK_CEILING_BYTES)" (int64 $k.flushBytes) (int64 $k.ceilingBytes)) }}
{{- end }}
{{- end }}

{{- if and (not (kindIs "invalid" $k.flushBytes)) (not (kindIs "invalid" $k.maxObjectBytes)) }}
{{- if gt (int64 $k.flushBytes) (int64 $k.maxObjectBytes) }}
{{- fail (printf "sink.flushBytes (%d) must be at most sink.maxObjectBytes (%d) (OURIOS_SINK_FLUSH_BYTES <= OURIOS_SINK_MAX_OBJECT_BYTES)" (int64 $k.flushBytes) (int64 $k.maxObjectBytes)) }}
{{- end }}
{{- end }}

{{- if and (not (kindIs "invalid" $s.maxInflightBytes)) (not (kindIs "invalid" $w.maxFrameBytes)) }}
{{- if lt (int64 $s.maxInflightBytes) (add (mul 3 (int64 $w.maxFrameBytes)) 2097152) }}
{{- fail (printf "server.maxInflightBytes (%d) must be at least three times wal.maxFrameBytes (%d) plus 2 MiB (OURIOS_SERVER_MAX_INFLIGHT_BYTES >= 3 x OURIOS_WAL_MAX_FRAME_BYTES + 2 MiB)" (int64 $s.maxInflightBytes) (int64 $w.maxFrameBytes)) }}
{{- end }}
{{- end }}

{{- if eq (int64 $s.httpPort) (int64 $s.grpcPort) }}
{{- fail (printf "server.httpPort and server.grpcPort must differ (both are %d)" (int64 $s.httpPort)) }}
{{- end }}

{{- $s3 := hasPrefix "s3://" (toString (default "" $st.url)) }}
{{- if and (toString (default "" $st.endpointUrl)) (not $s3) }}
{{- fail (printf "store.endpointUrl (%s) applies only to an s3:// store.url (got %q)" $st.endpointUrl (toString (default "" $st.url))) }}
{{- end }}
{{- if and (toString (default "" $st.region)) (not $s3) }}
{{- fail (printf "store.region (%s) applies only to an s3:// store.url (got %q)" $st.region (toString (default "" $st.url))) }}
{{- end }}

{{- $unlinks := $w.maxUnlinksPerPass }}
{{- $attempts := $w.rotationRetryAttempts }}
{{- $tenants := $w.maxTenants }}
{{- if and (not (kindIs "invalid" $unlinks)) (not (kindIs "invalid" $attempts)) }}
{{- if lt (int64 $unlinks) (int64 $attempts) }}
{{- fail (printf "wal.maxUnlinksPerPass (%d) must be at least wal.rotationRetryAttempts (%d)" (int64 $unlinks) (int64 $attempts)) }}
{{- end }}
{{- end }}
{{- if and (not (kindIs "invalid" $unlinks)) (not (kindIs "invalid" $tenants)) }}
{{- /* RFC 0052 §3.2: RECLAIM is 32 + 2 * (32 + 164t + 24u + 32tu) bytes, at most 1 GiB. */}}
{{- $t := int64 $tenants }}
{{- $u := int64 $unlinks }}
{{- $slot := add 32 (mul 164 $t) (mul 24 $u) (mul 32 $t $u) }}
{{- $size := add 32 (mul 2 $slot) }}
{{- if gt $size 1073741824 }}
{{- fail (printf "wal.maxTenants (%d) x wal.maxUnlinksPerPass (%d) would make the preallocated RECLAIM file %d bytes; it must stay under 1 GiB (lower either)" $t $u $size) }}
{{- end }}
{{- end }}

{{- $url := toString (default "" $st.url) }}
{{- if hasPrefix "file://" $url }}
{{- $path := trimPrefix "file://" $url }}
{{- $under := or (eq $path (include "ourios.dataDir" .)) (hasPrefix (printf "%s/" (include "ourios.dataDir" .)) $path) }}
{{- range .Values.extraVolumeMounts }}
{{- if or (eq $path .mountPath) (hasPrefix (printf "%s/" (trimSuffix "/" .mountPath)) $path) }}{{ $under = true }}{{ end }}
{{- end }}
{{- if not $under }}
{{- fail (printf "store.url %s is outside the data volume (%s) and every extraVolumeMounts path; the root filesystem is read-only" $url (include "ourios.dataDir" .)) }}
{{- end }}
{{- end }}

{{- if and $st.existingSecret (or $st.accessKeyId $st.secretAccessKey) }}
{{- fail "store: set either existingSecret or accessKeyId/secretAccessKey, not both" }}
{{- end }}
{{- if ne (empty $st.accessKeyId) (empty $st.secretAccessKey) }}
{{- fail "store: accessKeyId and secretAccessKey go together (set both or neither)" }}
{{- end }}
{{- if and (include "ourios.storeSecretName" .) (not $s3) }}
{{- fail "store: S3 credentials are set but store.url is not an s3:// URL" }}
{{- end }}

{{- /* The schema refuses these first; this says the same under --skip-schema-validation. */}}
{{- range $i, $env := .Values.extraEnv }}
{{- $name := toString $env.name }}
{{- if hasPrefix "OURIOS_" $name }}
{{- $key := splitn "_" 2 (lower (trimPrefix "OURIOS_" $name)) }}
{{- fail (printf "extraEnv[%d] %s: the ourios settings are values of this chart (%s is %s.%s; docs/CONFIG.md), which it renders itself into the settings ConfigMap, and a second definition would silently override it: set the value instead" $i $name $name $key._0 (camelcase (default "" $key._1) | untitle)) }}
{{- end }}
{{- end }}

{{- if and .Values.auth.existingSecret .Values.auth.tokens }}
{{- fail "auth: set either existingSecret or tokens, not both" }}
{{- end }}

{{- if not (kindIs "invalid" .Values.terminationGracePeriodSeconds) }}
{{- $drain := add (int64 .Values.shutdown.preStopSleepSecs) (int64 $s.shutdownGraceSecs) }}
{{- if le (int64 .Values.terminationGracePeriodSeconds) $drain }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must exceed shutdown.preStopSleepSecs + server.shutdownGraceSecs (%d), or the final cut is killed" (int64 .Values.terminationGracePeriodSeconds) $drain) }}
{{- end }}
{{- end }}

{{- end }}
