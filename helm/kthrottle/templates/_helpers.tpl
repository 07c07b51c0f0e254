{{/* Names and labels ----------------------------------------------------------------------- */}}
{{- define "kthrottle.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kthrottle.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kthrottle.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "kthrottle.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Labels beside the selector labels on pod templates (no duplicate keys). */}}
{{- define "kthrottle.versionLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "kthrottle.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kthrottle.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: gateway
{{- end -}}

{{/* The example Kafka StatefulSet's pods (sidecar mode). */}}
{{- define "kthrottle.kafkaName" -}}
{{- printf "%s-kafka" (include "kthrottle.fullname" .) | trunc 52 | trimSuffix "-" -}}
{{- end -}}

{{- define "kthrottle.kafkaSelectorLabels" -}}
app.kubernetes.io/name: {{ include "kthrottle.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: kafka-broker
{{- end -}}

{{/* The pods the metrics Service selects: the gateway's, or the broker pods with the sidecar. */}}
{{- define "kthrottle.proxyPodSelector" -}}
{{- if eq .Values.mode "gateway" -}}
{{ include "kthrottle.selectorLabels" . }}
{{- else if .Values.sidecar.podSelector -}}
{{ toYaml .Values.sidecar.podSelector }}
{{- else -}}
{{ include "kthrottle.kafkaSelectorLabels" . }}
{{- end -}}
{{- end -}}

{{- define "kthrottle.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kthrottle.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* repository@digest when image.digest is set, else repository:tag (default: appVersion). */}}
{{- define "kthrottle.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The gateway pod's grace period: the preStop pause, then SIGTERM and drain_seconds (the
     proxy's default 10 when the config leaves it out; rounded up), and 10 s to exit. */}}
{{- define "kthrottle.terminationGracePeriodSeconds" -}}
{{- $drain := 10.0 -}}
{{- if hasKey (.Values.config | default dict) "drain_seconds" -}}
{{- $drain = float64 .Values.config.drain_seconds -}}
{{- end -}}
{{- add (int .Values.gateway.preStopSleepSeconds) (int (ceil $drain)) 10 -}}
{{- end -}}

{{/* The gateway's topology spread: gateway.topologySpreadConstraints as given, else one soft
     constraint per gateway.topologySpread.topologyKeys entry; empty when disabled. */}}
{{- define "kthrottle.topologySpreadConstraints" -}}
{{- $ts := .Values.gateway.topologySpread -}}
{{- if .Values.gateway.topologySpreadConstraints -}}
{{ toYaml .Values.gateway.topologySpreadConstraints }}
{{- else if $ts.enabled -}}
{{- range $key := $ts.topologyKeys }}
- maxSkew: {{ $ts.maxSkew }}
  topologyKey: {{ $key }}
  whenUnsatisfiable: {{ $ts.whenUnsatisfiable }}
  labelSelector:
    matchLabels:
      {{- include "kthrottle.selectorLabels" $ | nindent 6 }}
  matchLabelKeys: [pod-template-hash]
{{- end }}
{{- end -}}
{{- end -}}

{{/* How many gateway replicas share the quotas: gateway.replicas, or with the autoscaler
     gateway.autoscaling.maxReplicas; 0 when they need no sharing (sidecar mode, or one replica
     without autoscaling). */}}
{{- define "kthrottle.sharedQuotaReplicas" -}}
{{- $gw := .Values.gateway -}}
{{- if ne .Values.mode "gateway" -}}
0
{{- else if $gw.autoscaling.enabled -}}
{{- int $gw.autoscaling.maxReplicas -}}
{{- else if gt (int $gw.replicas) 1 -}}
{{- int $gw.replicas -}}
{{- else -}}
0
{{- end -}}
{{- end -}}

{{/* Gateway broker ports: a list of {id, port}, one per configured broker node id. */}}
{{- define "kthrottle.brokerPorts" -}}
{{- $gw := .Values.gateway -}}
{{- $out := list -}}
{{- range $id := $gw.brokers.nodeIds -}}
{{- $explicit := index ($gw.brokers.ports | default dict) (toString (int $id)) -}}
{{- $port := $explicit | default (add (int $gw.brokers.portBase) (int $id)) -}}
{{- $out = append $out (dict "id" (int $id) "port" (int $port)) -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{- define "kthrottle.advertisedHost" -}}
{{- default (printf "%s.%s.svc" (include "kthrottle.fullname" .) .Release.Namespace) .Values.gateway.advertisedHost -}}
{{- end -}}

{{/* The proxy config (kthrottle.yaml) ------------------------------------------------------- */}}
{{- define "kthrottle.config" -}}
{{- $v := .Values -}}
{{- if hasKey ($v.config | default dict) "quotas" -}}
{{- fail "put quotas under .Values.quotas (rendered as quotas.yaml), not under .Values.config" -}}
{{- end -}}
{{- $c := deepCopy ($v.config | default dict) -}}
{{- /* The config format this chart's release writes (quota/config.py CONFIG_VERSION). */ -}}
{{- $_ := set $c "config_version" 1 -}}
{{- $_ := set $c "mode" $v.mode -}}
{{- $_ := set $c "bind_host" "0.0.0.0" -}}
{{- /* 0.0.0.0, not the proxy's default 127.0.0.1: kubelet probes and Prometheus come in on the pod IP. */ -}}
{{- /* Settings of config.admin the chart does not manage (allow_unauthenticated_changes) are kept. */ -}}
{{- $admin := merge (dict "host" "0.0.0.0" "port" (int $v.admin.port)) (get $c "admin" | default dict) -}}
{{- if $v.admin.token.enabled -}}
{{- $_ := set $admin "token_file" "/etc/kthrottle/admin/token" -}}
{{- end -}}
{{- $_ := set $c "admin" $admin -}}
{{- if eq $v.mode "gateway" -}}
{{- $gw := $v.gateway -}}
{{- $_ := set $c "advertised_host" (include "kthrottle.advertisedHost" .) -}}
{{- $ports := dict -}}
{{- range $k, $p := ($gw.brokers.ports | default dict) -}}
{{- $_ := set $ports (toString $k) (int $p) -}}
{{- end -}}
{{- if not $gw.upstreamBootstrap -}}
{{- fail "gateway.upstreamBootstrap is required: host:port of the brokers' client listener, e.g. --set 'gateway.upstreamBootstrap={kafka-0.kafka-headless.kafka.svc:9092}'" -}}
{{- end -}}
{{- /* With SNI routing clients are told the SNI names (gateway.sni), not advertised_host. */ -}}
{{- if and (eq $gw.service.type "LoadBalancer") (not $gw.advertisedHost) (not $gw.sni.enabled) -}}
{{- fail "gateway.service.type LoadBalancer needs gateway.advertisedHost: the name clients outside the cluster resolve to the load balancer (the proxy tells clients to connect there); without it they are told the in-cluster Service name, which they cannot reach" -}}
{{- end -}}
{{- $g := dict "bootstrap_port" (int $gw.bootstrapPort) "broker_port_base" (int $gw.brokers.portBase) "broker_ports" $ports "upstream_bootstrap" $gw.upstreamBootstrap -}}
{{- if $gw.sni.enabled -}}
{{- if not $v.tls.enabled -}}
{{- fail "gateway.sni.enabled needs tls.enabled (SNI is the TLS server name)" -}}
{{- end -}}
{{- $_ := set $g "sni" (dict "enabled" true "bootstrap_host" $gw.sni.bootstrapHost "broker_host_template" $gw.sni.brokerHostTemplate) -}}
{{- end -}}
{{- /* config.gateway's other settings (sni.advertised_port, ...) are kept: the chart's win. */ -}}
{{- $_ := set $c "gateway" (merge $g (get $c "gateway" | default dict)) -}}
{{- else if eq $v.mode "sidecar" -}}
{{- $s := $v.sidecar -}}
{{- $_ := set $c "sidecar" (dict "listen_port" (int $s.listenPort) "upstream" $s.upstream "advertised_host" $s.advertisedHost) -}}
{{- else -}}
{{- fail (printf "mode must be gateway or sidecar, not %v" $v.mode) -}}
{{- end -}}
{{- $_ := set $c "quotas_file" "quotas.yaml" -}}
{{- include "kthrottle.captureFits" (dict "c" $c "v" $v) -}}
{{- /* Gateway replicas share every quota (cluster_quotas); the user's config.cluster_quotas keys
       win, false included (sprig's merge would let the chart's true overwrite a false). */ -}}
{{- $shared := int (include "kthrottle.sharedQuotaReplicas" .) -}}
{{- if gt $shared 0 -}}
{{- $cq := dict "enabled" true "replicas" $shared -}}
{{- $own := get $c "cluster_quotas" | default dict -}}
{{- if not (kindIs "map" $own) -}}
{{- fail "config.cluster_quotas must be a mapping of settings" -}}
{{- end -}}
{{- range $k, $val := $own -}}
{{- $_ := set $cq $k $val -}}
{{- end -}}
{{- $_ := set $c "cluster_quotas" $cq -}}
{{- end -}}
{{- if $v.tls.enabled -}}
{{- $t := dict "enabled" true "certfile" "/etc/kthrottle/tls/server/tls.crt" "keyfile" "/etc/kthrottle/tls/server/tls.key" "client_auth" $v.tls.clientAuth -}}
{{- if ne $v.tls.clientAuth "none" -}}
{{- $_ := set $t "cafile" "/etc/kthrottle/tls/server/ca.crt" -}}
{{- end -}}
{{- if $v.tls.principalMappingRules -}}
{{- $_ := set $t "principal_mapping_rules" $v.tls.principalMappingRules -}}
{{- end -}}
{{- /* config.tls's other settings (min_version, key_password_file, ...) are kept. */ -}}
{{- $_ := set $c "tls" (merge $t (get $c "tls" | default dict)) -}}
{{- end -}}
{{- if $v.upstreamTls.enabled -}}
{{- $u := dict "enabled" true "cafile" "/etc/kthrottle/tls/upstream/ca.crt" "check_hostname" $v.upstreamTls.checkHostname -}}
{{- if $v.upstreamTls.clientCert -}}
{{- $_ := set $u "certfile" "/etc/kthrottle/tls/upstream/tls.crt" -}}
{{- $_ := set $u "keyfile" "/etc/kthrottle/tls/upstream/tls.key" -}}
{{- end -}}
{{- /* config.upstream_tls's other settings are kept. */ -}}
{{- $_ := set $c "upstream_tls" (merge $u (get $c "upstream_tls" | default dict)) -}}
{{- end -}}
{{- if $v.upstreamSasl.enabled -}}
{{- $_ := set $c "upstream_sasl" (dict "username" $v.upstreamSasl.username "password_file" "/etc/kthrottle/sasl/password") -}}
{{- end -}}
{{- if $v.quotaApi.enabled -}}
{{- /* config.quota_api's other settings (describers, topic, timeouts) are kept. */ -}}
{{- $_ := set $c "quota_api" (merge (dict "mode" $v.quotaApi.mode "admins" $v.quotaApi.admins) (get $c "quota_api" | default dict)) -}}
{{- end -}}
{{- toYaml $c -}}
{{- end -}}

{{/* Capture to files: the image must have pyarrow, and what is kept must fit the data volume.
     Unless set in config.capture, the files are 64 MiB and as many are kept as fill 80% of
     dataVolume.sizeLimit; set, they must fit in it. */}}
{{- define "kthrottle.captureFits" -}}
{{- $c := .c -}}
{{- $v := .v -}}
{{- $cap := get $c "capture" | default dict -}}
{{- if and (get $cap "enabled") (ne (get $cap "sink" | default "files") "kafka") -}}
{{- if not $v.image.captureExtra -}}
{{- fail "config.capture with the files sink writes Parquet, which the default image lacks: build it with --build-arg KTHROTTLE_EXTRAS=capture and set image.captureExtra=true, or use config.capture.sink: kafka" -}}
{{- end -}}
{{- $limit := include "kthrottle.bytes" $v.dataVolume.sizeLimit | int64 -}}
{{- $usable := div (mul $limit 8) 10 -}}
{{- $size := get $cap "max_file_bytes" | default 67108864 | int64 -}}
{{- $_ := set $cap "max_file_bytes" $size -}}
{{- if not (hasKey $cap "retention_files") -}}
{{- $_ := set $cap "retention_files" (max 1 (div $usable $size)) -}}
{{- end -}}
{{- if gt (mul (int64 (get $cap "retention_files")) $size) $usable -}}
{{- fail (printf "config.capture keeps %v files of %v bytes, more than 80%% of dataVolume.sizeLimit (%v): raise the limit, or lower retention_files or max_file_bytes" (get $cap "retention_files") $size $v.dataVolume.sizeLimit) -}}
{{- end -}}
{{- $_ := set $c "capture" $cap -}}
{{- end -}}
{{- end -}}

{{/* A Kubernetes quantity (512Mi, 1Gi, 2000000000) in bytes. */}}
{{- define "kthrottle.bytes" -}}
{{- $q := toString . -}}
{{- $units := dict "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 -}}
{{- $n := regexFind "^[0-9]+" $q -}}
{{- $unit := trimPrefix $n $q -}}
{{- if or (not $n) (and $unit (not (hasKey $units $unit))) -}}
{{- fail (printf "dataVolume.sizeLimit %q: give a quantity like 1Gi or 512Mi" $q) -}}
{{- end -}}
{{- mul (int64 $n) (int64 (get $units $unit | default 1)) -}}
{{- end -}}

{{- define "kthrottle.quotas" -}}
{{- toYaml (dict "config_version" 1 "quotas" (.Values.quotas | default dict)) -}}
{{- end -}}

{{/* Pod parts shared by the gateway Deployment and the sidecar ------------------------------ */}}

{{/* One projected volume puts the config, quotas and every Secret at the paths the config
     names, under /etc/kthrottle, without subPath mounts: the kubelet then swaps updated files
     in place (a symlink swap), which the proxy's 1-second polling picks up. */}}
{{- define "kthrottle.volumes" -}}
- name: kthrottle-config
  projected:
    defaultMode: 0440
    sources:
      - configMap:
          name: {{ include "kthrottle.fullname" . }}-config
          items:
            - {key: kthrottle.yaml, path: kthrottle.yaml}
            - {key: quotas.yaml, path: quotas.yaml}
      {{- if .Values.tls.enabled }}
      - secret:
          name: {{ required "tls.secretName is required with tls.enabled" .Values.tls.secretName }}
          items:
            - {key: tls.crt, path: tls/server/tls.crt}
            - {key: tls.key, path: tls/server/tls.key}
            {{- if ne .Values.tls.clientAuth "none" }}
            - {key: ca.crt, path: tls/server/ca.crt}
            {{- end }}
      {{- end }}
      {{- if .Values.upstreamTls.enabled }}
      - secret:
          name: {{ required "upstreamTls.secretName is required with upstreamTls.enabled" .Values.upstreamTls.secretName }}
          items:
            - {key: ca.crt, path: tls/upstream/ca.crt}
            {{- if .Values.upstreamTls.clientCert }}
            - {key: tls.crt, path: tls/upstream/tls.crt}
            - {key: tls.key, path: tls/upstream/tls.key}
            {{- end }}
      {{- end }}
      {{- if .Values.admin.token.enabled }}
      - secret:
          name: {{ required "admin.token.secretName is required with admin.token.enabled" .Values.admin.token.secretName }}
          items:
            - {key: {{ .Values.admin.token.key }}, path: admin/token}
      {{- end }}
      {{- if .Values.upstreamSasl.enabled }}
      - secret:
          name: {{ required "upstreamSasl.secretName is required with upstreamSasl.enabled" .Values.upstreamSasl.secretName }}
          items:
            - {key: {{ .Values.upstreamSasl.passwordKey }}, path: sasl/password}
      {{- end }}
- name: kthrottle-tmp
  emptyDir:
    sizeLimit: 64Mi
- name: kthrottle-data
  emptyDir:
    sizeLimit: {{ .Values.dataVolume.sizeLimit }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "kthrottle.probe" -}}
httpGet:
  path: {{ .path }}
  port: admin
initialDelaySeconds: {{ .p.initialDelaySeconds }}
periodSeconds: {{ .p.periodSeconds }}
timeoutSeconds: {{ .p.timeoutSeconds }}
failureThreshold: {{ .p.failureThreshold }}
{{- end -}}

{{/* The proxy container; the ports differ by mode. */}}
{{- define "kthrottle.container" -}}
name: kthrottle
image: {{ include "kthrottle.image" . }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
args: ["run", "--config", "/etc/kthrottle/kthrottle.yaml"]
env:
  - name: KTHROTTLE_ADMIN_PORT
    value: {{ .Values.admin.port | quote }}
  # The address the other proxies reach this one's admin port at (cluster_quotas.peer_host's
  # default): they probe it when its reports to the quota exchange stop.
  - name: KTHROTTLE_POD_IP
    valueFrom:
      fieldRef: {fieldPath: status.podIP}
  {{- with .Values.extraEnv }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
ports:
{{- if eq .Values.mode "gateway" }}
  - {name: kafka, containerPort: {{ .Values.gateway.bootstrapPort }}, protocol: TCP}
  {{- if not .Values.gateway.sni.enabled }}
  {{- range (include "kthrottle.brokerPorts" . | fromJsonArray) }}
  - {name: broker-{{ .id }}, containerPort: {{ .port }}, protocol: TCP}
  {{- end }}
  {{- end }}
{{- else }}
  - {name: kafka, containerPort: {{ .Values.sidecar.listenPort }}, protocol: TCP}
{{- end }}
  - {name: admin, containerPort: {{ .Values.admin.port }}, protocol: TCP}
{{- if .Values.probes.startup.enabled }}
startupProbe:
  {{- include "kthrottle.probe" (dict "path" .Values.probes.startup.path "p" .Values.probes.startup) | nindent 2 }}
{{- end }}
livenessProbe:
  {{- include "kthrottle.probe" (dict "path" "/healthz" "p" .Values.probes.liveness) | nindent 2 }}
readinessProbe:
  {{- include "kthrottle.probe" (dict "path" "/readyz" "p" .Values.probes.readiness) | nindent 2 }}
{{- /* Gateway only: a native sidecar is stopped after the broker container has exited, when
       no client is connected to it any more, so a pause would only delay the pod's end. */}}
{{- if and (eq .Values.mode "gateway") (gt (int .Values.gateway.preStopSleepSeconds) 0) }}
lifecycle:
  preStop:
    exec:
      # The image has no shell: its python sleeps while the endpoints stop routing to the pod.
      command: ["python", "-c", "import time; time.sleep({{ int .Values.gateway.preStopSleepSeconds }})"]
{{- end }}
resources:
  {{- toYaml .Values.resources | nindent 2 }}
securityContext:
  {{- toYaml .Values.securityContext | nindent 2 }}
volumeMounts:
  - {name: kthrottle-config, mountPath: /etc/kthrottle, readOnly: true}
  - {name: kthrottle-tmp, mountPath: /tmp}
  - {name: kthrottle-data, mountPath: /var/lib/kthrottle}
  {{- with .Values.extraVolumeMounts }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end -}}

{{/* The sidecar for a broker pod: put it under the StatefulSet's initContainers. With
     restartPolicy: Always it is a native sidecar (Kubernetes 1.29+): started before the broker,
     kept running beside it, stopped after it. From a parent chart:
       initContainers:
         {{- include "kthrottle.sidecarContainer" .Subcharts.kthrottle | nindent 8 }}
       volumes:
         {{- include "kthrottle.sidecarVolumes" .Subcharts.kthrottle | nindent 8 }}
*/}}
{{- define "kthrottle.sidecarContainer" -}}
- {{ include "kthrottle.container" . | nindent 2 | trim }}
  restartPolicy: Always
{{- end -}}

{{- define "kthrottle.sidecarVolumes" -}}
{{ include "kthrottle.volumes" . }}
{{- end -}}

{{- define "kthrottle.podAnnotations" -}}
{{- if .Values.metrics.podAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.admin.port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- with .Values.podAnnotations }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* What `helm test` checks: {bootstrap, readyz, serverName, reason}; reason, when not empty,
     says why the test Pod is not rendered. */}}
{{- define "kthrottle.helmTestTargets" -}}
{{- $t := .Values.helmTest -}}
{{- $ns := .Release.Namespace -}}
{{- $bootstrap := $t.bootstrapServer -}}
{{- if not $bootstrap -}}
{{- if eq .Values.mode "gateway" -}}
{{- $bootstrap = printf "%s.%s.svc:%d" (include "kthrottle.fullname" .) $ns (int .Values.gateway.bootstrapPort) -}}
{{- else if .Values.sidecar.exampleStatefulSet.enabled -}}
{{- $bootstrap = printf "%s.%s.svc:%d" (include "kthrottle.kafkaName" .) $ns (int .Values.sidecar.listenPort) -}}
{{- end -}}
{{- end -}}
{{- $readyz := $t.readyzUrl -}}
{{- if and (not $readyz) .Values.metrics.service.enabled -}}
{{- $readyz = printf "http://%s-metrics.%s.svc:%d/readyz" (include "kthrottle.fullname" .) $ns (int .Values.admin.port) -}}
{{- end -}}
{{- $serverName := $t.tls.serverName -}}
{{- if and (not $serverName) .Values.tls.enabled -}}
{{- if and (eq .Values.mode "gateway") .Values.gateway.sni.enabled -}}
{{- $serverName = .Values.gateway.sni.bootstrapHost -}}
{{- else if eq .Values.mode "gateway" -}}
{{- $serverName = include "kthrottle.advertisedHost" . -}}
{{- end -}}
{{- end -}}
{{- $reason := "" -}}
{{- if not $t.enabled -}}
{{- $reason = "helmTest.enabled is false" -}}
{{- else if not $bootstrap -}}
{{- $reason = "set helmTest.bootstrapServer (no client Service of the chart to test)" -}}
{{- else if not $readyz -}}
{{- $reason = "set helmTest.readyzUrl (metrics.service.enabled is false)" -}}
{{- else if and .Values.tls.enabled (eq .Values.tls.clientAuth "required") (not $t.tls.secretName) -}}
{{- $reason = "set helmTest.tls.secretName (a client certificate: tls.clientAuth is required)" -}}
{{- end -}}
{{- toJson (dict "bootstrap" $bootstrap "readyz" $readyz "serverName" $serverName "reason" $reason) -}}
{{- end -}}
