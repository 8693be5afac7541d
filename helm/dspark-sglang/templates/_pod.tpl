{{/*
dspark.serverArgs: the SGLang command line of one tier, one flag per list item.
args: dict "root" $ "t" $tier "role" ("single" | "leader" | "worker")
The scheduler-facing flags come only from the tier (tests/helm checks this).
*/}}
{{- define "dspark.serverArgs" -}}
{{- $root := .root -}}
{{- $t := .t -}}
{{- $s := $t.scheduler -}}
{{- $dp := div (mul (int $t.gpusPerPod) (int $t.nodes)) (int $t.tp) -}}
- --model-path
- {{ $root.Values.model.targetPath | quote }}
- --dtype
- {{ $root.Values.model.dtype | quote }}
- --tp
- {{ int $t.tp | quote }}
{{- if gt (int $dp) 1 }}
- --dp-size
- {{ $dp | quote }}
{{- end }}
- --host
- 0.0.0.0
- --port
- {{ int $root.Values.server.port | quote }}
- --speculative-algorithm
- DSPARK_MOE
- --speculative-draft-model-path
- {{ $root.Values.model.drafterPath | quote }}
- --speculative-num-draft-tokens
- {{ include "dspark.numDraftTokens" . | quote }}
- --speculative-dspark-sps-table-path
- {{ include "dspark.costTablePath" . }}
- --speculative-dspark-confidence-sts-path
- {{ include "dspark.stsPath" . }}
- --max-running-requests
- {{ int $s.maxRunningRequests | quote }}
- --enable-metrics
- --log-level
- {{ $root.Values.server.logLevel }}
{{- with $root.Values.model.servedModelName }}
- --served-model-name
- {{ . | quote }}
{{- end }}
{{- if $root.Values.model.trustRemoteCode }}
- --trust-remote-code
{{- end }}
{{- if $root.Values.apiKey.enabled }}
- --api-key
- $(SGLANG_API_KEY)
{{- end }}
{{- if gt (int $t.nodes) 1 }}
- --nnodes
- $(LWS_GROUP_SIZE)
- --node-rank
- $(LWS_WORKER_INDEX)
- --dist-init-addr
- $(LWS_LEADER_ADDRESS):{{ int $root.Values.server.distInitPort }}
{{- end }}
{{- range $root.Values.server.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- range $t.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{/*
dspark.podSpec: the pod spec shared by Deployments and LeaderWorkerSet leader/worker templates.
args: dict "root" $ "t" $tier "role" ("single" | "leader" | "worker")
*/}}
{{- define "dspark.podSpec" -}}
{{- $root := .root -}}
{{- $t := .t -}}
{{- $v := $root.Values -}}
{{- $serving := ne .role "worker" -}}
{{- $multiGpu := gt (int $t.gpusPerPod) 1 -}}
{{- $grace := add (int $v.shutdown.preStopSleepSeconds) (int $v.shutdown.maxStreamSeconds) (int $v.shutdown.extraGraceSeconds) -}}
serviceAccountName: {{ include "dspark.serviceAccountName" $root }}
automountServiceAccountToken: {{ $v.serviceAccount.automountToken }}
enableServiceLinks: false
terminationGracePeriodSeconds: {{ $grace }}
{{- with $v.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $v.runtimeClassName }}
runtimeClassName: {{ . }}
{{- end }}
{{- with $v.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml $v.podSecurityContext | nindent 2 }}
{{- with (merge (deepCopy (default dict $t.nodeSelector)) $v.nodeSelector) }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with (concat $v.tolerations (default list $t.tolerations)) }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if $v.topologySpread.enabled }}
topologySpreadConstraints:
  - maxSkew: {{ int $v.topologySpread.maxSkew }}
    topologyKey: {{ $v.topologySpread.topologyKey }}
    whenUnsatisfiable: {{ $v.topologySpread.whenUnsatisfiable }}
    labelSelector:
      matchLabels:
        {{- include "dspark.tierSelectorLabels" . | nindent 8 }}
{{- end }}
{{- if eq $v.weights.source "initContainer" }}
initContainers:
  - name: fetch-weights
    image: {{ $v.weights.initContainer.image | quote }}
    imagePullPolicy: {{ $v.image.pullPolicy }}
    {{- with $v.weights.initContainer.command }}
    command:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- with $v.weights.initContainer.args }}
    args:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    env:
      - name: WEIGHTS_DIR
        value: {{ $v.weights.mountPath | quote }}
      - name: HOME
        value: /scratch/home
      {{- with $v.weights.initContainer.env }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
    securityContext:
      {{- toYaml $v.securityContext | nindent 6 }}
    {{- with $v.weights.initContainer.resources }}
    resources:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    volumeMounts:
      - name: weights
        mountPath: {{ $v.weights.mountPath }}
      - name: scratch
        mountPath: /scratch
      - name: tmp
        mountPath: /tmp
{{- end }}
containers:
  - name: sglang
    image: {{ include "dspark.image" $root }}
    imagePullPolicy: {{ $v.image.pullPolicy }}
    command:
      - python
      - -m
      - sglang.launch_server
    args:
      {{- include "dspark.serverArgs" . | nindent 6 }}
    ports:
      - name: http
        containerPort: {{ int $v.server.port }}
        protocol: TCP
      {{- if gt (int $t.nodes) 1 }}
      - name: dist-init
        containerPort: {{ int $v.server.distInitPort }}
        protocol: TCP
      {{- end }}
    env:
      - name: DSPARK_SCHEDULER_CONFIG
        value: {{ include "dspark.schedulerConfigPath" . }}
      - name: DSPARK_SLA_TIER
        value: {{ $t.name | quote }}
      # How SGLang verifies the drafts: the tier's policy and raggedMode (dspark.raggedVerifyMode).
      - name: SGLANG_RAGGED_VERIFY_MODE
        value: {{ include "dspark.raggedVerifyMode" . | quote }}
      # Argmax drafts exactly on greedy-only tiers (dspark.greedyDraft).
      - name: SGLANG_DSPARK_USE_GREEDY_DRAFT
        value: {{ include "dspark.greedyDraft" . | quote }}
      # Cheap /health for liveness; readiness uses /health_generate.
      - name: SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION
        value: "false"
      # Weights are local; never reach out to a hub from a serving pod.
      - name: HF_HUB_OFFLINE
        value: "1"
      - name: HOME
        value: /scratch/home
      - name: XDG_CACHE_HOME
        value: /scratch/cache
      - name: HF_HOME
        value: /scratch/cache/huggingface
      - name: TRITON_CACHE_DIR
        value: /scratch/cache/triton
      - name: TORCHINDUCTOR_CACHE_DIR
        value: /scratch/cache/inductor
      - name: TMPDIR
        value: /tmp
      {{- if $v.apiKey.enabled }}
      - name: SGLANG_API_KEY
        valueFrom:
          secretKeyRef:
            name: {{ default (printf "%s-api-key" (include "dspark.fullname" $root)) $v.apiKey.existingSecret }}
            key: {{ $v.apiKey.secretKey }}
      {{- end }}
      {{- with $v.server.env }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
      {{- with $t.env }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
    resources:
      requests:
        {{- with $t.resources.requests }}
        {{- toYaml (omit . "nvidia.com/gpu") | nindent 8 }}
        {{- end }}
        nvidia.com/gpu: {{ int $t.gpusPerPod | quote }}
      limits:
        {{- with $t.resources.limits }}
        {{- toYaml (omit . "nvidia.com/gpu") | nindent 8 }}
        {{- end }}
        nvidia.com/gpu: {{ int $t.gpusPerPod | quote }}
    securityContext:
      {{- toYaml $v.securityContext | nindent 6 }}
    {{- if $serving }}
    startupProbe:
      httpGet:
        path: /health
        port: http
      periodSeconds: {{ int $v.probes.startupPeriodSeconds }}
      timeoutSeconds: 5
      # ceil(modelLoadTimeoutSeconds / periodSeconds): the pod gets the whole load budget.
      failureThreshold: {{ div (add (int $v.probes.modelLoadTimeoutSeconds) (sub (int $v.probes.startupPeriodSeconds) 1)) (int $v.probes.startupPeriodSeconds) }}
    readinessProbe:
      httpGet:
        path: {{ $v.probes.readiness.path }}
        port: http
      periodSeconds: {{ int $v.probes.readiness.periodSeconds }}
      timeoutSeconds: {{ int $v.probes.readiness.timeoutSeconds }}
      failureThreshold: {{ int $v.probes.readiness.failureThreshold }}
    livenessProbe:
      httpGet:
        path: {{ $v.probes.liveness.path }}
        port: http
      periodSeconds: {{ int $v.probes.liveness.periodSeconds }}
      timeoutSeconds: {{ int $v.probes.liveness.timeoutSeconds }}
      failureThreshold: {{ int $v.probes.liveness.failureThreshold }}
    {{- end }}
    lifecycle:
      preStop:
        # Endpoints removal propagates while we keep serving; SIGTERM then drains streams.
        sleep:
          seconds: {{ int $v.shutdown.preStopSleepSeconds }}
    volumeMounts:
      - name: weights
        mountPath: {{ $v.weights.mountPath }}
        readOnly: true
      - name: scheduler-config
        mountPath: /etc/dspark/scheduler
        readOnly: true
      - name: cost-table
        mountPath: /etc/dspark/cost-table
        readOnly: true
      - name: sts
        mountPath: /etc/dspark/sts
        readOnly: true
      - name: scratch
        mountPath: /scratch
      - name: tmp
        mountPath: /tmp
      {{- if $multiGpu }}
      - name: dshm
        mountPath: /dev/shm
      {{- end }}
volumes:
  {{- if eq $v.weights.source "pvc" }}
  - name: weights
    persistentVolumeClaim:
      claimName: {{ $v.weights.pvc.claimName }}
      readOnly: {{ $v.weights.pvc.readOnly }}
  {{- else }}
  - name: weights
    emptyDir:
      sizeLimit: {{ $v.weights.initContainer.sizeLimit }}
  {{- end }}
  - name: scheduler-config
    configMap:
      name: {{ include "dspark.tierName" . }}-scheduler
      items:
        - key: scheduler.yaml
          path: scheduler.yaml
  - name: cost-table
    configMap:
      name: {{ include "dspark.costTableConfigMap" . }}
      items:
        - key: {{ include "dspark.costTableKey" . }}
          path: sps.json
  - name: sts
    configMap:
      name: {{ include "dspark.stsConfigMap" . }}
      items:
        - key: {{ include "dspark.stsKey" . }}
          path: sts.json
  - name: scratch
    emptyDir:
      sizeLimit: {{ $v.scratch.sizeLimit }}
  - name: tmp
    emptyDir:
      sizeLimit: 2Gi
  {{- if $multiGpu }}
  - name: dshm
    emptyDir:
      medium: Memory
      sizeLimit: {{ $v.shm.sizeLimit }}
  {{- end }}
{{- end -}}
