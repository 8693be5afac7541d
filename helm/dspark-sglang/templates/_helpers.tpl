{{/*
Naming, labels and the per-tier merge. Every per-tier template starts from
"dspark.tier" so defaults are applied in exactly one place.
*/}}

{{- define "dspark.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/* Truncated to 40 so "<fullname>-<tier>" (tier <= 20) stays a valid 63-char DNS label. */}}
{{- define "dspark.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "dspark.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dspark.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dspark.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "dspark.labels" -}}
helm.sh/chart: {{ include "dspark.chart" . }}
{{ include "dspark.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* args: dict "root" $ "t" $tier */}}
{{- define "dspark.tierName" -}}
{{- printf "%s-%s" (include "dspark.fullname" .root) .t.name -}}
{{- end -}}

{{- define "dspark.tierSelectorLabels" -}}
{{ include "dspark.selectorLabels" .root }}
app.kubernetes.io/component: server
dspark-sglang.io/sla-tier: {{ .t.name }}
{{- end -}}

{{- define "dspark.tierLabels" -}}
{{ include "dspark.labels" .root }}
app.kubernetes.io/component: server
dspark-sglang.io/sla-tier: {{ .t.name }}
{{- end -}}

{{- define "dspark.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "dspark.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "dspark.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/*
dspark.tiers: the slaTiers list with tierDefaults merged in, as YAML ({tiers: [...]}).
Also the single place for the cross-field checks JSON Schema cannot express, so a
release rendered with --skip-schema-validation still fails with a clear message.
*/}}
{{- define "dspark.tiers" -}}
{{- $out := list -}}
{{- $seen := dict -}}
{{- range $i, $tier := .Values.slaTiers -}}
{{- $t := mergeOverwrite (deepCopy $.Values.tierDefaults) (deepCopy $tier) -}}
{{- $where := printf "slaTiers[%d] (%s)" $i $t.name -}}
{{- if hasKey $seen $t.name -}}
{{- fail (printf "%s: duplicate tier name %q; every tier needs its own name (it names the Deployment and Service)" $where $t.name) -}}
{{- end -}}
{{- $_ := set $seen $t.name true -}}
{{- $tp := int $t.tp -}}
{{- $gpus := int $t.gpusPerPod -}}
{{- $nodes := int (default 1 $t.nodes) -}}
{{- if ne (mod (mul $gpus $nodes) $tp) 0 -}}
{{- fail (printf "%s: tp=%d does not divide the %d GPUs of a replica (gpusPerPod=%d x nodes=%d); pick a tp that divides the GPU count" $where $tp (mul $gpus $nodes) $gpus $nodes) -}}
{{- end -}}
{{- if and (gt $nodes 1) (ne $tp (mul $gpus $nodes)) -}}
{{- fail (printf "%s: multi-node tiers run one tensor-parallel group across all nodes, so tp must equal gpusPerPod x nodes = %d (got tp=%d)" $where (mul $gpus $nodes) $tp) -}}
{{- end -}}
{{- $s := $t.scheduler -}}
{{- $b := int $s.blockSize -}}
{{- if hasKey $s "staticK" -}}
{{- if ne $s.policy "static" -}}
{{- fail (printf "%s: scheduler.staticK is only read by policy static (policy is %s); remove staticK or set policy: static" $where $s.policy) -}}
{{- end -}}
{{- if gt (int $s.staticK) $b -}}
{{- fail (printf "%s: scheduler.staticK=%d exceeds scheduler.blockSize=%d; a static policy cannot verify more drafts than the block holds" $where (int $s.staticK) $b) -}}
{{- end -}}
{{- end -}}
{{- if and (hasKey $s "draftStepSeconds") (not (has $s.policy (list "prefix" "lagged"))) -}}
{{- fail (printf "%s: scheduler.draftStepSeconds is only read by policies prefix and lagged, which rank drafts against a cost table (policy is %s); remove draftStepSeconds or set policy: prefix or lagged" $where $s.policy) -}}
{{- end -}}
{{- $copies := int (default 0 $s.contextCopyNgram) -}}
{{- if and (gt $copies 0) (eq $s.policy "none") -}}
{{- fail (printf "%s: scheduler.contextCopyNgram=%d with policy none: no draft is verified, so no copy would be; remove contextCopyNgram or choose another policy" $where $copies) -}}
{{- end -}}
{{- if hasKey $s "copyConfidence" -}}
{{- if eq $copies 0 -}}
{{- fail (printf "%s: scheduler.copyConfidence is the confidence of context-copied drafts, and contextCopyNgram is unset or 0 (no copies); set contextCopyNgram or remove copyConfidence" $where) -}}
{{- end -}}
{{- if not (has $s.policy (list "prefix" "lagged")) -}}
{{- fail (printf "%s: scheduler.copyConfidence is only read by policies prefix and lagged, which rank drafts by confidence (policy is %s); remove copyConfidence" $where $s.policy) -}}
{{- end -}}
{{- end -}}
{{- if and (hasKey $s "raggedMode") (eq $s.policy "verify_all") -}}
{{- fail (printf "%s: scheduler.raggedMode=%s with policy verify_all: verify_all verifies the whole block in SGLang's static mode; remove raggedMode or choose a policy that picks per-request lengths" $where $s.raggedMode) -}}
{{- end -}}
{{- if and (eq (default "" $s.draftDecision) "priced") (not (has $s.policy (list "prefix" "lagged"))) -}}
{{- fail (printf "%s: scheduler.draftDecision=priced prices drafting rounds with a cost table, which only policies prefix and lagged use (policy is %s); remove draftDecision, set it to always, or set policy: prefix or lagged" $where $s.policy) -}}
{{- end -}}
{{- if and (hasKey $s "probeEvery") (ne (default "" $s.draftDecision) "priced") -}}
{{- fail (printf "%s: scheduler.probeEvery is read only with scheduler.draftDecision=priced; remove probeEvery or set draftDecision: priced" $where) -}}
{{- end -}}
{{- with $t.costTable.inline -}}
{{- $probes := .sample_batch_tokens -}}
{{- if ne (len $probes) (len .sample_steps_per_sec) -}}
{{- fail (printf "%s: costTable.inline has %d sample_batch_tokens but %d sample_steps_per_sec; give one rate per probe" $where (len $probes) (len .sample_steps_per_sec)) -}}
{{- end -}}
{{- range $i, $x := $probes -}}
{{- if and (gt $i 0) (le (int $x) (int (index $probes (sub $i 1)))) -}}
{{- fail (printf "%s: costTable.inline.sample_batch_tokens must be strictly increasing (no duplicate probes), but entry %d (%d) follows %d" $where $i (int $x) (int (index $probes (sub $i 1)))) -}}
{{- end -}}
{{- end -}}
{{- if lt (int .max_batch_tokens) (int (last $probes)) -}}
{{- fail (printf "%s: costTable.inline.max_batch_tokens=%d is below the last probe %d; it must be >= the largest sample_batch_tokens" $where (int .max_batch_tokens) (int (last $probes))) -}}
{{- end -}}
{{- end -}}
{{- with $t.sts.inline -}}
{{- if ne (len .temperatures) $b -}}
{{- fail (printf "%s: sts.inline has %d temperatures but scheduler.blockSize is %d; STS needs one temperature per draft position (refit with `dspark-sglang calibrate` for this drafter)" $where (len .temperatures) $b) -}}
{{- end -}}
{{- range $k := list "ece_before" "ece_after" -}}
{{- $v := get $t.sts.inline $k -}}
{{- if and $v (ne (len $v) $b) -}}
{{- fail (printf "%s: sts.inline.%s has %d entries for blockSize %d; give one per position or leave it out" $where $k (len $v) $b) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and $t.autoscaling.enabled (lt (int $t.autoscaling.maxReplicas) (int $t.autoscaling.minReplicas)) -}}
{{- fail (printf "%s: autoscaling.maxReplicas=%d < minReplicas=%d" $where (int $t.autoscaling.maxReplicas) (int $t.autoscaling.minReplicas)) -}}
{{- end -}}
{{- if and $t.costTable.version (not $t.costTable.hardwareGroup) -}}
{{- fail (printf "%s: costTable.version pins a table the profiler published for costTable.hardwareGroup; set hardwareGroup (with configMapName give the full versioned name instead)" $where) -}}
{{- end -}}
{{- if and $t.sts.version (not $t.sts.configMapName) -}}
{{- fail (printf "%s: sts.version pins calibration's <sts.configMapName>-<version>; set sts.configMapName to calibration.configMapName (inline STS needs no version)" $where) -}}
{{- end -}}
{{- $cm := include "dspark.costTableConfigMap" (dict "root" $ "t" $t) -}}
{{- if gt (len $cm) 253 -}}
{{- fail (printf "%s: cost-table ConfigMap name %q is %d characters, over Kubernetes' 253; set a shorter model.slug (and profile with the same --model-slug)" $where $cm (len $cm)) -}}
{{- end -}}
{{- $_ := set $t "nodes" $nodes -}}
{{- $out = append $out $t -}}
{{- end -}}
{{- if and .Values.apiKey.enabled (not .Values.apiKey.existingSecret) (not .Values.apiKey.value) -}}
{{- fail "apiKey.enabled=true needs apiKey.existingSecret (recommended) or apiKey.value" -}}
{{- end -}}
{{- toYaml (dict "tiers" $out) -}}
{{- end -}}

{{/* Mount paths the plugin and SGLang read (kept in one place). */}}
{{- define "dspark.schedulerConfigPath" -}}/etc/dspark/scheduler/scheduler.yaml{{- end -}}
{{- define "dspark.costTablePath" -}}/etc/dspark/cost-table/sps.json{{- end -}}
{{- define "dspark.stsPath" -}}/etc/dspark/sts/sts.json{{- end -}}

{{/*
dspark.modelSlug: the model's name in cost-table files and ConfigMaps, as the profiler
writes it (meta "model", `dspark-sglang profile --model-slug`). model.slug when set,
else the last component of model.targetPath, slugified exactly as the profiler derives
it from --model (lowercase, runs of anything but [a-z0-9] -> "-", no edge dashes).
*/}}
{{- define "dspark.modelSlug" -}}
{{- $raw := default (base .Values.model.targetPath) .Values.model.slug -}}
{{- $slug := trimAll "-" (regexReplaceAll "[^a-z0-9]+" (lower $raw) "-") -}}
{{- if not $slug -}}
{{- fail (printf "model.slug is empty and model.targetPath %q has no usable last component to derive it from; set model.slug to the profiled model's slug (the \"model\" field of profiles/<hardware>/<model>-tp<N>.meta.json)" .Values.model.targetPath) -}}
{{- end -}}
{{- $slug -}}
{{- end -}}

{{/*
args: dict "root" $ "t" $tier -> name of the ConfigMap holding sps.json.
hardwareGroup + version resolves to the profiler's immutable, content-named
dspark-cost-table-<hardware>-<model>-tp<N>-<version>
(dspark_sglang.profiling.configmap.configmap_name): a table is only valid for the model
and TP degree it was measured with, and the tier serves model.* at its own tp. The
version pins one published table, so each release revision mounts the table it was
deployed with and `helm rollback` brings the previous one back. Without version: the
unversioned dspark-cost-table-<hardware>-<model>-tp<N> of hand-published or
pre-versioning tables (the profiler no longer publishes that name).
*/}}
{{- define "dspark.costTableConfigMap" -}}
{{- $c := .t.costTable -}}
{{- if $c.inline -}}{{ include "dspark.tierName" . }}-cost-table
{{- else if $c.configMapName -}}{{ $c.configMapName }}
{{- else -}}dspark-cost-table-{{ $c.hardwareGroup }}-{{ include "dspark.modelSlug" .root }}-tp{{ int .t.tp }}{{ with $c.version }}-{{ . }}{{ end }}
{{- end -}}
{{- end -}}

{{- define "dspark.costTableKey" -}}
{{- if .t.costTable.inline -}}sps.json{{- else -}}{{ default "sps.json" .t.costTable.key }}{{- end -}}
{{- end -}}

{{/* sts.configMapName + version -> calibration's immutable <configMapName>-<version>. */}}
{{- define "dspark.stsConfigMap" -}}
{{- if .t.sts.inline -}}{{ include "dspark.tierName" . }}-sts
{{- else -}}{{ .t.sts.configMapName }}{{ with .t.sts.version }}-{{ . }}{{ end }}
{{- end -}}
{{- end -}}

{{- define "dspark.stsKey" -}}
{{- if .t.sts.inline -}}sts.json{{- else -}}{{ default "sts.json" .t.sts.key }}{{- end -}}
{{- end -}}

{{/*
The scheduler config the plugin reads from $DSPARK_SCHEDULER_CONFIG
(dspark_sglang/scheduling/config.py field names). Optional knobs are written only
when set, so the plugin's own defaults apply otherwise. ragged_mode is always written
for a policy that picks per-request lengths (dspark.raggedVerifyMode), so the worker
refuses a SGLANG_RAGGED_VERIFY_MODE that is not the config's.
*/}}
{{- define "dspark.schedulerConfig" -}}
{{- $s := .t.scheduler -}}
policy: {{ $s.policy }}
block_size: {{ int $s.blockSize }}
{{- if hasKey $s "staticK" }}
static_k: {{ int $s.staticK }}
{{- end }}
{{- if hasKey $s "lagSteps" }}
lag_steps: {{ int $s.lagSteps }}
{{- end }}
max_verify_tokens: {{ int $s.maxVerifyTokens }}
cost_table_path: {{ include "dspark.costTablePath" . }}
sts_path: {{ include "dspark.stsPath" . }}
sla_name: {{ .t.name }}
greedy_only: {{ $s.greedyOnly | default false }}
{{- if hasKey $s "draftStepSeconds" }}
draft_step_seconds: {{ include "dspark.float" $s.draftStepSeconds }}
{{- end }}
{{- if hasKey $s "contextCopyNgram" }}
context_copy_ngram: {{ int $s.contextCopyNgram }}
{{- end }}
{{- if hasKey $s "copyConfidence" }}
copy_confidence: {{ include "dspark.float" $s.copyConfidence }}
{{- end }}
{{- if ne $s.policy "verify_all" }}
ragged_mode: {{ include "dspark.raggedVerifyMode" . }}
{{- end }}
{{- if hasKey $s "draftDecision" }}
draft_decision: {{ $s.draftDecision }}
{{- end }}
{{- if hasKey $s "probeEvery" }}
probe_every: {{ int $s.probeEvery }}
{{- end }}
{{- end -}}

{{/*
A number (seconds, a probability) as a YAML float every loader reads as one: fixed-point
to 9 decimals, trailing zeros dropped ("%v" would print 1e-05, which PyYAML reads as a
string).
*/}}
{{- define "dspark.float" -}}
{{- regexReplaceAll "\\.$" (regexReplaceAll "0+$" (printf "%.9f" (float64 .)) "") ".0" -}}
{{- end -}}

{{/*
What SGLang is told about the drafts, derived from the tier (never typed twice):
SGLang's --speculative-num-draft-tokens counts the anchor, so it is blockSize + 1;
SGLANG_RAGGED_VERIFY_MODE is "static" (verify the whole block, SGLang's own path)
for verify_all; every policy that picks per-request verify lengths runs the tier's
scheduler.raggedMode, unset "compact" (verify only the chosen drafts, so a shorter
verify is a cheaper one; with CUDA graphs trimmed to the step's captured token tier).
"cap-accept" is the opt-in that verifies every request's whole block and only caps
acceptance (no verify compute saved; the worker logs so). SGLANG_DSPARK_USE_GREEDY_DRAFT
(SGLang's argmax draft) is "1" exactly for a greedyOnly tier: it saves the drafter's sampling and stays lossless, but would lower
acceptance for sampled requests, which only such a tier refuses. The plugin holds the
same rules (SchedulerConfig.ragged_verify_mode, .num_draft_tokens, .greedy_draft) and
refuses a server whose settings disagree with the first two (the third is logged).
*/}}
{{- define "dspark.numDraftTokens" -}}
{{- add1 (int .t.scheduler.blockSize) -}}
{{- end -}}

{{- define "dspark.raggedVerifyMode" -}}
{{- if eq .t.scheduler.policy "verify_all" -}}static{{- else -}}{{ default "compact" .t.scheduler.raggedMode }}{{- end -}}
{{- end -}}

{{- define "dspark.greedyDraft" -}}
{{- if .t.scheduler.greedyOnly -}}1{{- else -}}0{{- end -}}
{{- end -}}

{{/* Everything a tier's pods read from ConfigMaps this chart owns: its hash rolls the pods. */}}
{{- define "dspark.tierConfigData" -}}
{{ include "dspark.schedulerConfig" . }}
{{ toJson .t.costTable }}
{{ toJson .t.sts }}
{{- end -}}
