"""The Helm chart renders, validates and carries each SLA tier's exact settings.

What is checked, for every values file the chart ships (values.yaml + examples/*.yaml):
- ``helm lint --strict`` and ``helm template`` succeed (the real helm binary that
  scripts/install_helm.sh pins; no cluster needed);
- every rendered built-in object validates with kubernetes-validate --strict against
  Kubernetes 1.30 and 1.35. CRD objects (ServiceMonitor, PrometheusRule,
  LeaderWorkerSet, RayJob) have no schema there, so they get a structural check of our
  own: required fields and types, cross-references (the ServiceMonitor selects every
  tier Service, alerts link runbooks that exist) and their embedded pod templates are
  validated as real core/v1 Pods;
- each tier's SGLang command line and scheduler ConfigMap hold exactly that tier's
  settings (computed here independently from the values file);
- bad values are rejected with a message naming the problem;
- ``helm template`` output for one tier is byte-stable (golden file). Regenerate after an
  intended chart change with:
      DSPARK_UPDATE_GOLDEN=1 python -m pytest tests/helm -k golden
  and review the diff of tests/helm/golden/rendered.yaml.
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from chart_tools import CHART, NAMESPACE, RELEASE, ROOT, SHIPPED, render, render_text, run_helm

from dspark_sglang.scheduling.config import POLICIES, ConfigError, SchedulerConfig

pytestmark = pytest.mark.helm

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
RUNBOOKS = ROOT / "deploy" / "runbooks"
K8S_VERSIONS = ("1.30.0", "1.35.0")
SHIPPED_IDS = [p.name for p in SHIPPED]
CRD_KINDS = {"ServiceMonitor", "PrometheusRule", "LeaderWorkerSet", "RayJob"}

Manifest = dict[str, Any]


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Helm's value merge: maps merge recursively, everything else (lists too) is replaced."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def effective_values(values_file: Path) -> dict[str, Any]:
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    return deep_merge(defaults, yaml.safe_load(values_file.read_text()) or {})


def tiers_of(values: dict[str, Any]) -> list[dict[str, Any]]:
    return [deep_merge(values["tierDefaults"], t) for t in values["slaTiers"]]


def by_kind_name(docs: list[Manifest]) -> dict[tuple[str, str], Manifest]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def pod_specs(doc: Manifest) -> list[dict[str, Any]]:
    """Every pod spec a workload-ish object carries (so all get the same checks)."""
    kind, spec = doc["kind"], doc.get("spec", {})
    if kind in ("Deployment", "Job"):
        return [spec["template"]["spec"]]
    if kind == "LeaderWorkerSet":
        lwt = spec["leaderWorkerTemplate"]
        return [lwt["leaderTemplate"]["spec"], lwt["workerTemplate"]["spec"]]
    if kind == "RayJob":
        rc = spec["rayClusterSpec"]
        return [rc["headGroupSpec"]["template"]["spec"]] + [
            g["template"]["spec"] for g in rc["workerGroupSpecs"]
        ]
    return []


def args_map(args: list[str]) -> dict[str, str | None]:
    """`--flag value` / bare `--flag` pairs; a repeated flag is an error (ambiguous CLI)."""
    out: dict[str, str | None] = {}
    i = 0
    while i < len(args):
        flag = args[i]
        assert flag.startswith("--"), f"stray argument {flag!r} in {args}"
        assert flag not in out, f"{flag} given twice in {args}"
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            out[flag] = args[i + 1]
            i += 2
        else:
            out[flag] = None
            i += 1
    return out


# --- 1. lint + template -------------------------------------------------------------


@pytest.mark.parametrize("values_file", SHIPPED, ids=SHIPPED_IDS)
def test_lint_strict_and_template(values_file: Path) -> None:
    proc = run_helm("lint", "--strict", str(CHART), "-f", str(values_file))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout
    # Helm 4's lint reports a template `fail` only as an INFO log line; treat it as failure.
    assert "funcMap fail" not in proc.stdout + proc.stderr, proc.stderr
    docs = render(values_file)
    kinds = {d["kind"] for d in docs}
    assert {"ConfigMap", "Service", "NetworkPolicy", "PodDisruptionBudget"} <= kinds
    assert kinds & {"Deployment", "LeaderWorkerSet"}


# --- 2. kubernetes-validate --strict, plus structural checks for CRDs ---------------


def validate_pod_spec(spec: dict[str, Any], where: str) -> None:
    """Embedded pod templates of CRDs are validated as real Pods by the k8s schema."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": spec}
    for version in K8S_VERSIONS:
        try:
            kubernetes_validate.validate(pod, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            raise AssertionError(f"{where}: pod template invalid for k8s {version}: {e}") from e


DURATION = re.compile(r"^[0-9]+(ms|s|m|h)$")


def check_service_monitor(doc: Manifest, docs: list[Manifest]) -> None:
    spec = doc["spec"]
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    sel = spec["selector"]["matchLabels"]
    assert isinstance(sel, dict) and sel
    assert spec["namespaceSelector"]["matchNames"] == [NAMESPACE]
    services = [d for d in docs if d["kind"] == "Service"]
    assert services
    for svc in services:  # every tier's Service is scraped, via a port it really has
        labels = svc["metadata"]["labels"]
        assert sel.items() <= labels.items(), f"ServiceMonitor misses {svc['metadata']['name']}"
        assert "dspark-sglang.io/sla-tier" in labels
    port_names = {p["name"] for svc in services for p in svc["spec"]["ports"]}
    for ep in spec["endpoints"]:
        assert ep["port"] in port_names
        assert ep["path"] == "/metrics"
        assert DURATION.match(ep["interval"]) and DURATION.match(ep["scrapeTimeout"])
        src = [r for r in ep["relabelings"] if r.get("targetLabel") == "sla_tier"]
        assert src[0]["sourceLabels"] == [
            "__meta_kubernetes_service_label_dspark_sglang_io_sla_tier"
        ]


KNOWN_SERIES = re.compile(r"\b(dspark_[a-z_]+|sglang:[a-z_]+|dspark:[a-z_0-9:]+)")
EMITTED = {
    # worker plugin (dspark_sglang.sglang_integration)
    "dspark_accepted_length_sum",
    "dspark_accepted_length_count",
    "dspark_verify_budget_tokens_sum",
    "dspark_verify_budget_tokens_count",
    "dspark_fallback_total",
    "dspark_rounds_total",
    # SGLang 0.5.23 metrics_collector
    "sglang:request_time_per_output_token_seconds_bucket",
    "sglang:num_requests_total",
}


def check_prometheus_rule(doc: Manifest, tiers: list[dict[str, Any]]) -> None:
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    recorded: set[str] = set()
    alerts: list[dict[str, Any]] = []
    for group in doc["spec"]["groups"]:
        assert isinstance(group["name"], str) and group["rules"]
        for rule in group["rules"]:
            assert ("record" in rule) != ("alert" in rule), rule
            expr = rule["expr"]
            assert isinstance(expr, str)
            assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}")
            if "record" in rule:
                recorded.add(rule["record"])
            else:
                alerts.append(rule)
                assert DURATION.match(rule["for"])
                assert rule["labels"]["severity"] in {"warning", "critical"}
                runbook = rule["annotations"]["runbook_url"].rsplit("/", 1)[-1]
                assert (RUNBOOKS / runbook).is_file(), f"{rule['alert']} links missing {runbook}"
    for rule in (r for g in doc["spec"]["groups"] for r in g["rules"]):
        # Label matchers and grouping clauses name labels, not series: drop them first.
        expr = re.sub(r"\{[^}]*\}", "", rule["expr"])
        expr = re.sub(r"\b(by|on|without|ignoring)\s*\([^)]*\)", "", expr)
        for series in KNOWN_SERIES.findall(expr):
            assert series in EMITTED or series in recorded, f"unknown series {series}"
    names = [a["alert"] for a in alerts]
    assert {"DSparkAcceptanceCollapse", "DSparkFallbackRateHigh"} <= set(names)
    breach = {a["labels"]["sla_tier"]: a["expr"] for a in alerts if a["alert"] == "DSparkSLABreach"}
    assert set(breach) == {t["name"] for t in tiers}
    for t in tiers:  # each tier is held to its own target, not another tier's
        assert re.search(rf"< {re.escape(str(t['minTokensPerSecPerUser']))}\s*$", breach[t["name"]])


def check_lws(doc: Manifest, tiers: list[dict[str, Any]]) -> None:
    assert doc["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    spec = doc["spec"]
    tier = next(t for t in tiers if doc["metadata"]["name"].endswith("-" + t["name"]))
    lwt = spec["leaderWorkerTemplate"]
    assert lwt["size"] == tier["nodes"] >= 2
    assert lwt["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert spec["rolloutStrategy"]["rollingUpdateConfiguration"]["maxUnavailable"] == 0
    leader = lwt["leaderTemplate"]["spec"]["containers"][0]
    worker = lwt["workerTemplate"]["spec"]["containers"][0]
    assert "readinessProbe" in leader and "readinessProbe" not in worker  # leader only
    for c in (leader, worker):
        a = args_map(c["args"])
        assert a["--nnodes"] == "$(LWS_GROUP_SIZE)"
        assert a["--node-rank"] == "$(LWS_WORKER_INDEX)"
        assert a["--tp"] == str(tier["tp"])


def check_rayjob(doc: Manifest) -> None:
    assert doc["apiVersion"] == "ray.io/v1"
    spec = doc["spec"]
    assert spec["entrypoint"].startswith("dspark-sglang profile --ray-address ")
    assert spec["shutdownAfterJobFinishes"] is True
    rc = spec["rayClusterSpec"]
    assert isinstance(rc["headGroupSpec"]["rayStartParams"], dict)
    for g in rc["workerGroupSpecs"]:
        assert g["minReplicas"] <= g["replicas"] <= g["maxReplicas"]
        assert all(isinstance(v, str) for v in g["rayStartParams"].values())


@pytest.mark.parametrize("values_file", SHIPPED, ids=SHIPPED_IDS)
def test_manifests_validate_against_k8s_schemas(values_file: Path) -> None:
    docs = render(values_file)
    tiers = tiers_of(effective_values(values_file))
    for t in tiers:
        t.setdefault("nodes", 1)
    crds_seen: set[str] = set()
    for doc in docs:
        where = f"{values_file.name}: {doc['kind']}/{doc['metadata']['name']}"
        if doc["kind"] in CRD_KINDS:
            crds_seen.add(doc["kind"])
            # The validator really has no schema for these (else it must be used instead).
            with pytest.raises(kubernetes_validate.SchemaNotFoundError):
                kubernetes_validate.validate(doc, K8S_VERSIONS[-1], strict=True)
            for i, spec in enumerate(pod_specs(doc)):
                validate_pod_spec(spec, f"{where} pod template {i}")
            if doc["kind"] == "ServiceMonitor":
                check_service_monitor(doc, docs)
            elif doc["kind"] == "PrometheusRule":
                check_prometheus_rule(doc, tiers)
            elif doc["kind"] == "LeaderWorkerSet":
                check_lws(doc, tiers)
            else:
                check_rayjob(doc)
            continue
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                raise AssertionError(f"{where} invalid for k8s {version}: {e}") from e
    assert {"ServiceMonitor", "PrometheusRule"} <= crds_seen


def test_strict_validation_catches_unknown_fields() -> None:
    """Guards the test above: --strict really rejects a misspelt field in our output."""
    dep = next(d for d in render(SHIPPED[0]) if d["kind"] == "Deployment")
    bad = copy.deepcopy(dep)
    bad["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSIONS[0], strict=True)


# --- 3. each tier's command line and scheduler config carry exactly its settings ----

SCHED_PATH = "/etc/dspark/scheduler/scheduler.yaml"
SPS_PATH = "/etc/dspark/cost-table/sps.json"
STS_PATH = "/etc/dspark/sts/sts.json"


def expected_scheduler_config(tier: dict[str, Any]) -> dict[str, Any]:
    s = tier["scheduler"]
    cfg: dict[str, Any] = {
        "policy": s["policy"],
        "block_size": s["blockSize"],
        "max_verify_tokens": s["maxVerifyTokens"],
        "cost_table_path": SPS_PATH,
        "sts_path": STS_PATH,
        "sla_name": tier["name"],
        "greedy_only": s.get("greedyOnly", False),
    }
    if "staticK" in s:
        cfg["static_k"] = s["staticK"]
    if "lagSteps" in s:
        cfg["lag_steps"] = s["lagSteps"]
    if "draftStepSeconds" in s:
        cfg["draft_step_seconds"] = s["draftStepSeconds"]
    if "contextCopyNgram" in s:
        cfg["context_copy_ngram"] = s["contextCopyNgram"]
    if "copyConfidence" in s:
        cfg["copy_confidence"] = s["copyConfidence"]
    # Every policy that picks per-request lengths names its ragged mode: compact unless the
    # tier opts into cap-accept; verify_all runs SGLang's static mode and names none.
    if s["policy"] != "verify_all":
        cfg["ragged_mode"] = s.get("raggedMode", "compact")
    if "draftDecision" in s:
        cfg["draft_decision"] = s["draftDecision"]
    if "probeEvery" in s:
        cfg["probe_every"] = s["probeEvery"]
    return cfg


def mounted_configmap(
    spec: dict[str, Any], container: dict[str, Any], path: str
) -> tuple[str, str]:
    """(ConfigMap name, key) that ends up at `path` inside the container."""
    for m in container["volumeMounts"]:
        prefix = m["mountPath"].rstrip("/") + "/"
        if path.startswith(prefix):
            vol = next(v for v in spec["volumes"] if v["name"] == m["name"])
            item = next(i for i in vol["configMap"]["items"] if i["path"] == path[len(prefix) :])
            return vol["configMap"]["name"], item["key"]
    raise AssertionError(f"nothing mounted at {path}")


def profiler_configmap_name(
    values: dict[str, Any], hardware_group: str, tp: int, version: str | None = None
) -> str:
    """The name `dspark-sglang profile` publishes for this chart's model at this TP (with
    ``version``, the content hash a tier pins; without, the unversioned legacy name).

    The model slug is the profiler's own derivation (``ProfileJob.slug`` from ``--model``
    = targetPath and ``--model-slug`` = model.slug), not the chart's, so the test links
    the two implementations instead of restating one of them.
    """
    from dspark_sglang.profiling.configmap import configmap_name
    from dspark_sglang.profiling.job import ProfileJob
    from dspark_sglang.profiling.measure import GridSpec

    job = ProfileJob(
        model=values["model"]["targetPath"],
        model_slug=values["model"].get("slug") or None,
        grid=GridSpec(max_tokens=8),
    )
    return configmap_name(hardware_group, job.slug, tp, version)


@pytest.mark.parametrize("values_file", SHIPPED, ids=SHIPPED_IDS)
def test_each_tier_command_line_carries_its_scheduler_settings(values_file: Path) -> None:
    values = effective_values(values_file)
    docs = render(values_file)
    index = by_kind_name(docs)
    prefix = f"{RELEASE}-dspark-sglang"
    tiers = tiers_of(values)
    workloads = [d for d in docs if d["kind"] in ("Deployment", "LeaderWorkerSet")]
    assert len(workloads) == len(tiers)
    for tier in tiers:
        name = f"{prefix}-{tier['name']}"
        nodes = tier.get("nodes", 1)
        kind = "Deployment" if nodes == 1 else "LeaderWorkerSet"
        workload = index[(kind, name)]
        for spec in pod_specs(workload):
            c = spec["containers"][0]
            assert c["command"] == ["python", "-m", "sglang.launch_server"]
            a = args_map(c["args"])
            s = tier["scheduler"]
            dp = tier["gpusPerPod"] * nodes // tier["tp"]
            assert a["--tp"] == str(tier["tp"])
            assert a.get("--dp-size") == (str(dp) if dp > 1 else None)
            assert a["--speculative-algorithm"] == "DSPARK_MOE"
            # SGLang counts the anchor too: block + 1.
            assert a["--speculative-num-draft-tokens"] == str(s["blockSize"] + 1)
            assert a["--dtype"] == values["model"]["dtype"]
            assert a["--max-running-requests"] == str(s["maxRunningRequests"])
            assert a["--speculative-dspark-sps-table-path"] == SPS_PATH
            assert a["--speculative-dspark-confidence-sts-path"] == STS_PATH
            assert a["--model-path"] == values["model"]["targetPath"]
            assert a["--speculative-draft-model-path"] == values["model"]["drafterPath"]
            assert "--enable-metrics" in a and a["--port"] == str(values["server"]["port"])
            assert ("--api-key" in a) == values["apiKey"]["enabled"]
            env = {e["name"]: e.get("value") for e in c["env"]}
            assert env["DSPARK_SCHEDULER_CONFIG"] == SCHED_PATH
            assert env["DSPARK_SLA_TIER"] == tier["name"]
            assert c["resources"]["limits"]["nvidia.com/gpu"] == str(tier["gpusPerPod"])

            cm_name, key = mounted_configmap(spec, c, SCHED_PATH)
            assert cm_name == f"{name}-scheduler"
            rendered = yaml.safe_load(index[("ConfigMap", cm_name)]["data"][key])
            assert rendered == expected_scheduler_config(tier)
            # The chart's derived SGLang settings agree with the plugin's rule.
            cfg = SchedulerConfig.from_dict(rendered)
            assert a["--speculative-num-draft-tokens"] == str(cfg.num_draft_tokens)
            assert env["SGLANG_RAGGED_VERIFY_MODE"] == cfg.ragged_verify_mode
            assert env["SGLANG_DSPARK_USE_GREEDY_DRAFT"] == ("1" if cfg.greedy_draft else "0")

            cost = tier["costTable"]
            cm_name, key = mounted_configmap(spec, c, SPS_PATH)
            if "inline" in cost:
                assert (cm_name, key) == (f"{name}-cost-table", "sps.json")
                got = yaml.safe_load(index[("ConfigMap", cm_name)]["data"]["sps.json"])
                assert got == cost["inline"]
            elif "hardwareGroup" in cost:
                expected = profiler_configmap_name(
                    values, cost["hardwareGroup"], tier["tp"], cost.get("version")
                )
                assert (cm_name, key) == (expected, "sps.json")
            else:
                assert cm_name == cost["configMapName"]
            sts = tier["sts"]
            cm_name, key = mounted_configmap(spec, c, STS_PATH)
            if "inline" in sts:
                got = yaml.safe_load(index[("ConfigMap", cm_name)]["data"]["sts.json"])
                assert got == sts["inline"]
            else:
                expected = sts["configMapName"] + (f"-{sts['version']}" if "version" in sts else "")
                assert (cm_name, key) == (expected, sts.get("key", "sts.json"))


@pytest.mark.parametrize("values_file", SHIPPED, ids=SHIPPED_IDS)
def test_serving_pods_are_hardened_and_drain(values_file: Path) -> None:
    values = effective_values(values_file)
    docs = render(values_file)
    sd = values["shutdown"]
    tiers = {t["name"]: t for t in tiers_of(values)}
    for doc in docs:
        if doc["kind"] not in ("Deployment", "LeaderWorkerSet"):
            continue
        tier = tiers[doc["metadata"]["labels"]["dspark-sglang.io/sla-tier"]]
        if doc["kind"] == "Deployment":
            assert doc["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
        assert ("replicas" in doc["spec"]) != tier["autoscaling"]["enabled"]
        for spec in pod_specs(doc):
            assert spec["securityContext"]["runAsNonRoot"] is True
            assert spec["automountServiceAccountToken"] is False
            assert spec["terminationGracePeriodSeconds"] > (
                sd["preStopSleepSeconds"] + sd["maxStreamSeconds"]
            )
            for c in spec["containers"] + spec.get("initContainers", []):
                sc = c["securityContext"]
                assert sc["allowPrivilegeEscalation"] is False
                assert sc["readOnlyRootFilesystem"] is True
                assert sc["capabilities"]["drop"] == ["ALL"]
                assert not sc.get("privileged")
            c = spec["containers"][0]
            assert c["lifecycle"]["preStop"]["sleep"]["seconds"] == sd["preStopSleepSeconds"]
            mounts = {m["mountPath"] for m in c["volumeMounts"]}
            assert {"/tmp", "/scratch"} <= mounts
            shm = [v for v in spec["volumes"] if v["name"] == "dshm"]
            assert bool(shm) == (tier["gpusPerPod"] > 1)
            if shm:
                assert shm[0]["emptyDir"]["medium"] == "Memory" and "/dev/shm" in mounts
            if "startupProbe" in c:
                p = c["startupProbe"]
                budget = p["periodSeconds"] * p["failureThreshold"]
                assert budget >= values["probes"]["modelLoadTimeoutSeconds"]
                assert c["readinessProbe"]["httpGet"]["path"] in ("/health_generate", "/health")


def mounted_cost_tables(docs: list[Manifest]) -> dict[str, str]:
    """Tier name -> ConfigMap mounted at the cost-table path (first pod template)."""
    out = {}
    for doc in docs:
        if doc["kind"] in ("Deployment", "LeaderWorkerSet"):
            spec = pod_specs(doc)[0]
            tier = doc["metadata"]["labels"]["dspark-sglang.io/sla-tier"]
            out[tier] = mounted_configmap(spec, spec["containers"][0], SPS_PATH)[0]
    return out


def test_tp4_and_tp8_tiers_on_one_hardware_group_mount_their_own_tables() -> None:
    """A per-hardware name used to make the TP-4 and TP-8 tables overwrite each other."""
    mounted = mounted_cost_tables(render(CHART / "examples" / "large-model-35-50.yaml"))
    assert mounted == {
        "premium": "dspark-cost-table-cuda-nvidia-h200-8x-qwen3-235b-a22b-tp8",
        "standard": "dspark-cost-table-cuda-nvidia-h200-8x-qwen3-235b-a22b-tp8",
        "batch": "dspark-cost-table-cuda-nvidia-h200-8x-qwen3-235b-a22b-tp4",
    }


@pytest.mark.parametrize(
    "overlay",
    [{}, {"model": {"slug": "qwen3-4b-instruct-2507"}}, {"model": {"targetPath": "/m/Qwen3_4B"}}],
    ids=["derived-slug", "explicit-slug", "derived-from-mixed-case"],
)
def test_profiling_rayjob_publishes_the_name_the_tiers_mount(
    overlay: dict[str, Any], tmp_path: Path
) -> None:
    """Parse the chart's RayJob entrypoint with the real CLI and name its output like the
    profiler does: a tier with hardwareGroup and tp = tpSize must mount exactly that."""
    from dspark_sglang.cli import build_parser
    from dspark_sglang.cli.profile import job_from_args
    from dspark_sglang.profiling.configmap import configmap_name

    example = CHART / "examples" / "jobs-profile-calibrate.yaml"
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(deep_merge(yaml.safe_load(example.read_text()), overlay)))
    docs = render(values_file)
    ray = next(d for d in docs if d["kind"] == "RayJob")
    argv = ray["spec"]["entrypoint"].split()
    assert argv[0] == "dspark-sglang"
    job = job_from_args(build_parser().parse_args(argv[1:]))
    values = effective_values(values_file)
    tier = next(t for t in tiers_of(values) if "hardwareGroup" in t["costTable"])
    assert tier["tp"] == job.tp_size == values["profiling"]["tpSize"]
    published = configmap_name(tier["costTable"]["hardwareGroup"], job.slug, job.tp_size)
    assert mounted_cost_tables(docs)[tier["name"]] == published
    assert published == profiler_configmap_name(values, tier["costTable"]["hardwareGroup"], 1)


# --- 4. the schema (and template guards) reject bad values clearly ------------------

GOOD_TIER: dict[str, Any] = {
    "name": "interactive",
    "minTokensPerSecPerUser": 120,
    "tp": 2,
    "gpusPerPod": 2,
    "scheduler": {
        "policy": "lagged",
        "blockSize": 7,
        "lagSteps": 2,
        "maxVerifyTokens": 96,
        "maxRunningRequests": 16,
    },
    "costTable": {"hardwareGroup": "h200"},
    "sts": {"configMapName": "dspark-sts"},
}


INLINE_TABLE: dict[str, Any] = {
    "sample_batch_tokens": [1, 16, 32],
    "sample_steps_per_sec": [9.0, 8.0, 6.0],
    "max_batch_tokens": 64,
}
INLINE_STS: dict[str, Any] = {"temperatures": [1.0] * 7, "ece_before": [0.1] * 7}


def tier_with(**changes: Any) -> dict[str, Any]:
    t = copy.deepcopy(GOOD_TIER)
    for dotted, v in changes.items():
        *path, last = dotted.split("__")
        node = t
        for p in path:
            node = node[p]
        if v is None:
            node.pop(last)
        else:
            node[last] = v
    return t


BAD_VALUES: list[tuple[str, dict[str, Any], str]] = [
    ("unknown top-level key", {"replicaCount": 3}, "additional properties 'replicaCount'"),
    (
        "unknown tier key",
        {"slaTiers": [{**GOOD_TIER, "blocksize": 7}]},
        "additional properties 'blocksize'",
    ),
    (
        "unknown scheduler key",
        {"slaTiers": [tier_with(scheduler__maxVerifyToken=9)]},
        "additional properties 'maxVerifyToken'",
    ),
    (
        "tier without a speed target",
        {"slaTiers": [tier_with(minTokensPerSecPerUser=None)]},
        "missing property 'minTokensPerSecPerUser'",
    ),
    (
        "zero speed target",
        {"slaTiers": [tier_with(minTokensPerSecPerUser=0)]},
        "/slaTiers/0/minTokensPerSecPerUser",
    ),
    (
        "tp not dividing the GPUs",
        {"slaTiers": [tier_with(tp=3, gpusPerPod=8)]},
        "at '/slaTiers/0/tp': value must be one of 1, 2, 4, 8",
    ),
    (
        "unknown policy",
        {"slaTiers": [tier_with(scheduler__policy="greedy")]},
        "/slaTiers/0/scheduler/policy",
    ),
    (
        "static policy without staticK",
        {"slaTiers": [tier_with(scheduler__policy="static")]},
        "missing property 'staticK'",
    ),
    (
        "block size above 16",
        {"slaTiers": [tier_with(scheduler__blockSize=17)]},
        "/slaTiers/0/scheduler/blockSize",
    ),
    (
        "two cost-table sources",
        {"slaTiers": [tier_with(costTable={"hardwareGroup": "h200", "configMapName": "x"})]},
        "/slaTiers/0/costTable",
    ),
    (
        "inline cost table missing max_batch_tokens",
        {
            "slaTiers": [
                tier_with(
                    costTable={
                        "inline": {"sample_batch_tokens": [1], "sample_steps_per_sec": [9.0]}
                    }
                )
            ]
        },
        "missing property 'max_batch_tokens'",
    ),
    ("no tiers", {"slaTiers": []}, "/slaTiers"),
    (
        "tier name not a DNS label",
        {"slaTiers": [tier_with(name="Interactive")]},
        "/slaTiers/0/name",
    ),
    # Cross-field rules JSON Schema cannot express: template guards with their own message.
    (
        "duplicate tier names",
        {"slaTiers": [GOOD_TIER, GOOD_TIER]},
        'duplicate tier name "interactive"',
    ),
    (
        "multi-node tp not spanning the group",
        {"slaTiers": [tier_with(tp=8, gpusPerPod=8, nodes=2)]},
        "tp must equal gpusPerPod x nodes = 16 (got tp=8)",
    ),
    (
        "staticK larger than the block",
        {
            "slaTiers": [
                tier_with(scheduler={**GOOD_TIER["scheduler"], "policy": "static", "staticK": 9})
            ]
        },
        "scheduler.staticK=9 exceeds scheduler.blockSize=7",
    ),
    (
        "model slug that is not a slug",
        {"model": {"slug": "Qwen3-8B"}},
        "/model/slug",
    ),
    (
        "no model slug to name the cost table by",
        {"model": {"targetPath": "/models/__"}, "slaTiers": [GOOD_TIER]},
        "model.slug is empty and model.targetPath",
    ),
    (
        "derived cost-table name over 253 characters",
        {"model": {"targetPath": "/models/" + "q" * 240}, "slaTiers": [GOOD_TIER]},
        "over Kubernetes' 253; set a shorter model.slug",
    ),
    (
        "api key without a secret",
        {"apiKey": {"enabled": True}},
        "apiKey.enabled=true needs apiKey.existingSecret",
    ),
    # What the plugin's loaders would refuse at pod start, refused at helm template time.
    (
        "staticK of zero",
        {
            "slaTiers": [
                tier_with(scheduler={**GOOD_TIER["scheduler"], "policy": "static", "staticK": 0})
            ]
        },
        "/slaTiers/0/scheduler/staticK",
    ),
    (
        "staticK with the lagged policy",
        {"slaTiers": [tier_with(scheduler__staticK=2)]},
        "scheduler.staticK is only read by policy static (policy is lagged)",
    ),
    (
        "negative draftStepSeconds",
        {"slaTiers": [tier_with(scheduler__draftStepSeconds=-0.004)]},
        "at '/slaTiers/0/scheduler/draftStepSeconds': minimum: got -0.004, want 0",
    ),
    (
        "draftStepSeconds as a string",
        {"slaTiers": [tier_with(scheduler__draftStepSeconds="4ms")]},
        "at '/slaTiers/0/scheduler/draftStepSeconds': got string, want number",
    ),
    (
        "draftStepSeconds with the verify_all policy",
        {
            "slaTiers": [
                tier_with(
                    scheduler={
                        **GOOD_TIER["scheduler"],
                        "policy": "verify_all",
                        "draftStepSeconds": 0.004,
                    }
                )
            ]
        },
        "scheduler.draftStepSeconds is only read by policies prefix and lagged, which rank "
        "drafts against a cost table (policy is verify_all); remove draftStepSeconds or set "
        "policy: prefix or lagged",
    ),
    (
        "contextCopyNgram negative",
        {"slaTiers": [tier_with(scheduler__contextCopyNgram=-1)]},
        "at '/slaTiers/0/scheduler/contextCopyNgram': minimum: got -1, want 0",
    ),
    (
        "copyConfidence of 1",
        {"slaTiers": [tier_with(scheduler__contextCopyNgram=2, scheduler__copyConfidence=1)]},
        "at '/slaTiers/0/scheduler/copyConfidence': exclusiveMaximum",
    ),
    (
        "copyConfidence without copies",
        {"slaTiers": [tier_with(scheduler__copyConfidence=0.6)]},
        "scheduler.copyConfidence is the confidence of context-copied drafts, and "
        "contextCopyNgram is unset or 0 (no copies); set contextCopyNgram or remove "
        "copyConfidence",
    ),
    (
        "raggedMode not a ragged mode",
        {"slaTiers": [tier_with(scheduler__raggedMode="bogus")]},
        "at '/slaTiers/0/scheduler/raggedMode': value must be one of 'compact', 'cap-accept'",
    ),
    (
        "raggedMode static (what verify_all runs by itself)",
        {"slaTiers": [tier_with(scheduler__raggedMode="static")]},
        "at '/slaTiers/0/scheduler/raggedMode': value must be one of 'compact', 'cap-accept'",
    ),
    (
        "raggedMode with the verify_all policy",
        {
            "slaTiers": [
                tier_with(
                    scheduler={
                        **GOOD_TIER["scheduler"],
                        "policy": "verify_all",
                        "raggedMode": "cap-accept",
                    }
                )
            ]
        },
        "slaTiers[0] (interactive): scheduler.raggedMode=cap-accept with policy verify_all: "
        "verify_all verifies the whole block in SGLang's static mode; remove raggedMode or "
        "choose a policy that picks per-request lengths",
    ),
    (
        "draftDecision not a decision",
        {"slaTiers": [tier_with(scheduler__draftDecision="sometimes")]},
        "at '/slaTiers/0/scheduler/draftDecision': value must be one of 'always', 'priced'",
    ),
    (
        "probeEvery of zero",
        {"slaTiers": [tier_with(scheduler__draftDecision="priced", scheduler__probeEvery=0)]},
        "at '/slaTiers/0/scheduler/probeEvery': minimum: got 0, want 1",
    ),
    (
        "probeEvery as a string",
        {"slaTiers": [tier_with(scheduler__draftDecision="priced", scheduler__probeEvery="8")]},
        "at '/slaTiers/0/scheduler/probeEvery': got string, want integer",
    ),
    (
        "probeEvery without the priced decision",
        {"slaTiers": [tier_with(scheduler__probeEvery=8)]},
        "slaTiers[0] (interactive): scheduler.probeEvery is read only with "
        "scheduler.draftDecision=priced; remove probeEvery or set draftDecision: priced",
    ),
    (
        "draftDecision priced with a policy that uses no cost table",
        {
            "slaTiers": [
                tier_with(
                    scheduler={
                        **GOOD_TIER["scheduler"],
                        "policy": "mtp1",
                        "draftDecision": "priced",
                    }
                )
            ]
        },
        "scheduler.draftDecision=priced prices drafting rounds with a cost table, which only "
        "policies prefix and lagged use (policy is mtp1)",
    ),
    (
        "inline cost table not sorted",
        {
            "slaTiers": [
                tier_with(
                    costTable={"inline": {**INLINE_TABLE, "sample_batch_tokens": [1, 32, 16]}}
                )
            ]
        },
        "sample_batch_tokens must be strictly increasing (no duplicate probes), but entry 2 (16)",
    ),
    (
        "inline cost table with a duplicate probe",
        {
            "slaTiers": [
                tier_with(
                    costTable={"inline": {**INLINE_TABLE, "sample_batch_tokens": [1, 16, 16]}}
                )
            ]
        },
        "must be strictly increasing (no duplicate probes)",
    ),
    (
        "inline cost table of mismatched lengths",
        {
            "slaTiers": [
                tier_with(
                    costTable={"inline": {**INLINE_TABLE, "sample_steps_per_sec": [9.0, 8.0]}}
                )
            ]
        },
        "has 3 sample_batch_tokens but 2 sample_steps_per_sec",
    ),
    (
        "inline cost table max_batch_tokens below the last probe",
        {"slaTiers": [tier_with(costTable={"inline": {**INLINE_TABLE, "max_batch_tokens": 20}})]},
        "max_batch_tokens=20 is below the last probe 32",
    ),
    (
        "inline cost table with an absurd max_batch_tokens",
        {
            "slaTiers": [
                tier_with(costTable={"inline": {**INLINE_TABLE, "max_batch_tokens": 10**30}})
            ]
        },
        "/slaTiers/0/costTable/inline/max_batch_tokens",
    ),
    (
        "inline STS with an unknown key",
        {"slaTiers": [tier_with(sts={"inline": {**INLINE_STS, "temperature": [1.0]}})]},
        "additional properties 'temperature'",
    ),
    (
        "inline STS with an ECE above 1",
        {"slaTiers": [tier_with(sts={"inline": {**INLINE_STS, "ece_after": [1.5] * 7}})]},
        "/slaTiers/0/sts/inline/ece_after/0",
    ),
    (
        "inline STS with one temperature too few",
        {"slaTiers": [tier_with(sts={"inline": {**INLINE_STS, "temperatures": [1.0] * 6}})]},
        "sts.inline has 6 temperatures but scheduler.blockSize is 7",
    ),
]


@pytest.mark.parametrize(
    ("overlay", "message"),
    [(o, m) for _, o, m in BAD_VALUES],
    ids=[name for name, _, _ in BAD_VALUES],
)
def test_bad_values_are_rejected_with_a_clear_message(
    overlay: dict[str, Any], message: str, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(overlay))
    proc = run_helm("template", RELEASE, str(CHART), "-f", str(bad))
    assert proc.returncode != 0, f"accepted bad values:\n{bad.read_text()}"
    assert message in proc.stderr, proc.stderr


def test_good_tier_used_by_bad_value_cases_is_itself_accepted(tmp_path: Path) -> None:
    """Each bad case differs from these accepted files by exactly the named mistake."""
    for i, tier in enumerate(
        [GOOD_TIER, tier_with(costTable={"inline": INLINE_TABLE}, sts={"inline": INLINE_STS})]
    ):
        good = tmp_path / f"good{i}.yaml"
        good.write_text(yaml.safe_dump({"slaTiers": [tier]}))
        proc = run_helm("template", RELEASE, str(CHART), "-f", str(good))
        assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("greedy_only", [False, True])
@pytest.mark.parametrize("policy", POLICIES)
def test_sglang_env_follows_the_tier_as_the_plugin_rules(
    policy: str, greedy_only: bool, tmp_path: Path
) -> None:
    """The chart's SGLANG_RAGGED_VERIFY_MODE (from the policy) and SGLANG_DSPARK_USE_GREEDY_DRAFT
    (from greedyOnly) are what the plugin's ``scheduler_env`` derives from the rendered config."""
    from dspark_sglang.sglang_integration.launch import scheduler_env

    sched: dict[str, Any] = {**GOOD_TIER["scheduler"], "policy": policy, "greedyOnly": greedy_only}
    if policy != "lagged":
        sched.pop("lagSteps")
    if policy == "static":
        sched["staticK"] = 3
    f = tmp_path / "v.yaml"
    f.write_text(yaml.safe_dump({"slaTiers": [tier_with(scheduler=sched)]}))
    proc = run_helm("template", RELEASE, str(CHART), "-f", str(f))
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    (deploy,) = [d for d in docs if d["kind"] == "Deployment"]
    env = {
        e["name"]: e.get("value")
        for e in deploy["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    (cm,) = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-scheduler")
    ]
    rendered = tmp_path / "scheduler.yaml"
    rendered.write_text(cm["data"]["scheduler.yaml"])
    cfg = SchedulerConfig.load(rendered)
    assert cfg.greedy_only is greedy_only
    plugin = scheduler_env(rendered)
    for name in ("SGLANG_RAGGED_VERIFY_MODE", "SGLANG_DSPARK_USE_GREEDY_DRAFT"):
        assert env[name] == plugin[name], name
    assert env["SGLANG_DSPARK_USE_GREEDY_DRAFT"] == ("1" if greedy_only else "0")


def _loaded_scheduler_config(manifests: str, tmp_path: Path) -> tuple[SchedulerConfig, str]:
    """The one tier's rendered scheduler config, loaded as the plugin loads it, and its text."""
    docs = [d for d in yaml.safe_load_all(manifests) if d]
    (cm,) = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-scheduler")
    ]
    rendered = tmp_path / "scheduler.yaml"
    rendered.write_text(cm["data"]["scheduler.yaml"])
    return SchedulerConfig.load(rendered), cm["data"]["scheduler.yaml"]


@pytest.mark.parametrize("policy", POLICIES)
def test_draft_step_seconds_is_accepted_exactly_where_the_plugin_reads_it(
    policy: str, tmp_path: Path
) -> None:
    """``scheduler.draftStepSeconds`` renders as the ``draft_step_seconds`` SchedulerConfig
    loads, to the value, under the policies whose SchedulerConfig takes the key; under
    every other policy the render is refused, naming the field and the fix."""
    sched: dict[str, Any] = {**GOOD_TIER["scheduler"], "policy": policy}
    if policy != "lagged":
        sched.pop("lagSteps")
    if policy == "static":
        sched["staticK"] = 3
    try:
        SchedulerConfig(
            block_size=7, policy=policy, static_k=sched.get("staticK"), draft_step_seconds=0.0
        )
        plugin_reads = True
    except ConfigError as exc:
        assert "draft_step_seconds is only used by policies" in str(exc)
        plugin_reads = False
    # 1e-05 and 5 are what a plain "{{ value }}" would print as 1e-05 (a string to PyYAML)
    # and 5 (an int).
    for seconds in (0.004, 0, 1e-05, 5, 0.123456789):
        f = tmp_path / "v.yaml"
        tier = tier_with(scheduler={**sched, "draftStepSeconds": seconds})
        f.write_text(yaml.safe_dump({"slaTiers": [tier]}))
        proc = run_helm("template", RELEASE, str(CHART), "-f", str(f))
        if not plugin_reads:
            assert proc.returncode != 0, f"policy {policy} accepted draftStepSeconds"
            assert (
                "slaTiers[0] (interactive): scheduler.draftStepSeconds is only read by policies "
                f"prefix and lagged, which rank drafts against a cost table (policy is {policy}); "
                "remove draftStepSeconds or set policy: prefix or lagged"
            ) in proc.stderr, proc.stderr
            continue
        assert proc.returncode == 0, proc.stderr
        cfg, text = _loaded_scheduler_config(proc.stdout, tmp_path)
        assert cfg.draft_step_seconds == seconds, text
        assert cfg.policy == policy


@pytest.mark.parametrize("policy", POLICIES)
def test_context_copy_knobs_are_accepted_exactly_where_the_plugin_reads_them(
    policy: str, tmp_path: Path
) -> None:
    """``scheduler.contextCopyNgram`` / ``copyConfidence`` render as the scheduler config's
    ``context_copy_ngram`` / ``copy_confidence`` wherever SchedulerConfig takes them, and the
    render is refused, naming the field and the fix, wherever it refuses them."""
    sched: dict[str, Any] = {**GOOD_TIER["scheduler"], "policy": policy}
    if policy != "lagged":
        sched.pop("lagSteps")
    if policy == "static":
        sched["staticK"] = 3
    for knobs in ({"contextCopyNgram": 2}, {"contextCopyNgram": 3, "copyConfidence": 0.7}):
        try:
            SchedulerConfig(
                block_size=7,
                policy=policy,
                static_k=sched.get("staticK"),
                context_copy_ngram=knobs["contextCopyNgram"],
                copy_confidence=knobs.get("copyConfidence"),
            )
            plugin_reads = True
        except ConfigError:
            plugin_reads = False
        f = tmp_path / "v.yaml"
        f.write_text(yaml.safe_dump({"slaTiers": [tier_with(scheduler={**sched, **knobs})]}))
        proc = run_helm("template", RELEASE, str(CHART), "-f", str(f))
        if not plugin_reads:
            assert proc.returncode != 0, f"policy {policy} accepted {knobs}"
            assert "slaTiers[0] (interactive): scheduler." in proc.stderr, proc.stderr
            assert "remove c" in proc.stderr, proc.stderr  # contextCopyNgram / copyConfidence
            continue
        assert proc.returncode == 0, proc.stderr
        cfg, text = _loaded_scheduler_config(proc.stdout, tmp_path)
        assert cfg.context_copy_ngram == knobs["contextCopyNgram"], text
        assert cfg.copy_confidence == knobs.get("copyConfidence"), text
    # Without the knob nothing is rendered: copies stay off (the plugin's default).
    for doc in render(CHART / "values.yaml"):
        if doc["kind"] == "ConfigMap" and doc["metadata"]["name"].endswith("-scheduler"):
            assert "context_copy" not in doc["data"]["scheduler.yaml"]


def test_draft_step_seconds_is_not_rendered_unless_set() -> None:
    """The default values leave it out, so the plugin's own rule (measure on CPU) applies."""
    for doc in render(CHART / "values.yaml"):
        if doc["kind"] == "ConfigMap" and doc["metadata"]["name"].endswith("-scheduler"):
            assert "draft_step_seconds" not in doc["data"]["scheduler.yaml"]


def _scheduler_for(policy: str, **knobs: Any) -> dict[str, Any]:
    """GOOD_TIER's scheduler under ``policy`` (the keys that policy needs), plus ``knobs``."""
    sched: dict[str, Any] = {**GOOD_TIER["scheduler"], "policy": policy, **knobs}
    if policy != "lagged":
        sched.pop("lagSteps")
    if policy == "static":
        sched["staticK"] = 3
    return sched


def _template(sched: dict[str, Any], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    f = tmp_path / "v.yaml"
    f.write_text(yaml.safe_dump({"slaTiers": [tier_with(scheduler=sched)]}))
    return run_helm("template", RELEASE, str(CHART), "-f", str(f))


def _server_env(manifests: str) -> dict[str, str | None]:
    """The one tier's SGLang container env."""
    (deploy,) = [d for d in yaml.safe_load_all(manifests) if d and d["kind"] == "Deployment"]
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value") for e in container["env"]}


def test_default_scheduled_tiers_verify_in_compact_mode(tmp_path: Path) -> None:
    """The shipped default tiers pick per-request lengths and set no raggedMode: each renders
    SGLANG_RAGGED_VERIFY_MODE=compact and ragged_mode: compact, a pair the worker accepts
    without the cap-accept warning."""
    from dspark_sglang.sglang_integration.launch import check_ragged_mode, ragged_mode_note

    values = effective_values(CHART / "values.yaml")
    tiers = tiers_of(values)
    assert tiers and all(t["scheduler"]["policy"] != "verify_all" for t in tiers)
    assert all("raggedMode" not in t["scheduler"] for t in tiers)
    index = by_kind_name(render(CHART / "values.yaml"))
    for tier in tiers:
        name = f"{RELEASE}-dspark-sglang-{tier['name']}"
        container = index[("Deployment", name)]["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        text = index[("ConfigMap", f"{name}-scheduler")]["data"]["scheduler.yaml"]
        cfg = SchedulerConfig.from_dict(yaml.safe_load(text))
        assert env["SGLANG_RAGGED_VERIFY_MODE"] == "compact", tier["name"]
        assert cfg.ragged_mode == "compact" and cfg.ragged_verify_mode == "compact", text
        check_ragged_mode(cfg, "compact", SCHED_PATH)
        assert ragged_mode_note(cfg, "compact", SCHED_PATH) is None


@pytest.mark.parametrize("ragged_mode", [None, "compact", "cap-accept"])
@pytest.mark.parametrize("policy", POLICIES)
def test_ragged_mode_is_compact_unless_a_tier_opts_into_cap_accept(
    policy: str, ragged_mode: str | None, tmp_path: Path
) -> None:
    """A tier whose policy picks per-request lengths verifies in ``scheduler.raggedMode``,
    ``compact`` when unset; its config's ``ragged_mode`` and SGLANG_RAGGED_VERIFY_MODE are
    that mode, the one the plugin derives from the config, and a ``cap-accept`` tier is one
    the worker warns about at start-up. verify_all runs SGLang's static mode and refuses a
    raggedMode, naming the value and the fix."""
    from dspark_sglang.sglang_integration.launch import (
        RAGGED_MODE_ENV,
        ragged_mode_note,
        scheduler_env,
    )

    knobs = {} if ragged_mode is None else {"raggedMode": ragged_mode}
    proc = _template(_scheduler_for(policy, **knobs), tmp_path)
    if policy == "verify_all" and ragged_mode is not None:
        assert proc.returncode != 0, f"verify_all accepted raggedMode={ragged_mode}"
        assert (
            f"slaTiers[0] (interactive): scheduler.raggedMode={ragged_mode} with policy "
            "verify_all: verify_all verifies the whole block in SGLang's static mode; remove "
            "raggedMode or choose a policy that picks per-request lengths"
        ) in proc.stderr, proc.stderr
        return
    assert proc.returncode == 0, proc.stderr
    cfg, text = _loaded_scheduler_config(proc.stdout, tmp_path)
    env = _server_env(proc.stdout)
    if policy == "verify_all":
        assert "ragged_mode" not in text
        expected = "static"
    else:
        expected = ragged_mode or "compact"
        assert cfg.ragged_mode == expected, text
    assert env[RAGGED_MODE_ENV] == cfg.ragged_verify_mode == expected
    assert scheduler_env(tmp_path / "scheduler.yaml")[RAGGED_MODE_ENV] == expected
    warned = ragged_mode_note(cfg, env[RAGGED_MODE_ENV] or "", SCHED_PATH) is not None
    assert warned == (expected == "cap-accept")


@pytest.mark.parametrize("policy", POLICIES)
def test_draft_decision_knobs_are_accepted_exactly_where_the_plugin_reads_them(
    policy: str, tmp_path: Path
) -> None:
    """``scheduler.draftDecision`` / ``probeEvery`` render as the scheduler config's
    ``draft_decision`` / ``probe_every``, to the value, wherever SchedulerConfig takes them,
    and the render is refused, naming the field and the fix, wherever it refuses them."""
    for knobs in (
        {"draftDecision": "always"},
        {"draftDecision": "priced"},
        {"draftDecision": "priced", "probeEvery": 3},
        {"draftDecision": "always", "probeEvery": 3},
        {"probeEvery": 3},
    ):
        sched = _scheduler_for(policy, **knobs)
        try:
            SchedulerConfig(
                block_size=7,
                policy=policy,  # type: ignore[arg-type]
                static_k=sched.get("staticK"),
                draft_decision=knobs.get("draftDecision", "always"),  # type: ignore[arg-type]
                probe_every=knobs.get("probeEvery"),
            )
            plugin_reads = True
        except ConfigError:
            plugin_reads = False
        proc = _template(sched, tmp_path)
        if not plugin_reads:
            assert proc.returncode != 0, f"policy {policy} accepted {knobs}"
            assert "slaTiers[0] (interactive): scheduler." in proc.stderr, proc.stderr
            assert "remove draftDecision" in proc.stderr or "remove probeEvery" in proc.stderr
            continue
        assert proc.returncode == 0, (knobs, proc.stderr)
        cfg, text = _loaded_scheduler_config(proc.stdout, tmp_path)
        assert cfg.draft_decision == knobs["draftDecision"], text
        assert cfg.probe_every == knobs.get("probeEvery"), text
    # Without the knobs nothing is rendered: the plugin's defaults apply.
    proc = _template(_scheduler_for(policy), tmp_path)
    assert proc.returncode == 0, proc.stderr
    _, text = _loaded_scheduler_config(proc.stdout, tmp_path)
    assert "draft_decision" not in text and "probe_every" not in text


def test_default_tiers_decide_drafting_by_price() -> None:
    """values.yaml's two tiers set draftDecision: priced (and leave probeEvery to the
    plugin), so each renders draft_decision: priced and no probe_every."""
    values = effective_values(CHART / "values.yaml")
    assert [t["scheduler"].get("draftDecision") for t in values["slaTiers"]] == ["priced"] * 2
    configs = [
        doc["data"]["scheduler.yaml"]
        for doc in render(CHART / "values.yaml")
        if doc["kind"] == "ConfigMap" and doc["metadata"]["name"].endswith("-scheduler")
    ]
    assert len(configs) == 2
    for text in configs:
        cfg = SchedulerConfig.from_dict(yaml.safe_load(text))
        assert cfg.draft_decision == "priced" and cfg.probe_every is None, text
        assert "probe_every" not in text


# --- 5. golden file ------------------------------------------------------------------


def test_golden_render_of_one_tier_is_stable() -> None:
    values = GOLDEN_DIR / "values.yaml"
    golden = GOLDEN_DIR / "rendered.yaml"
    got = render_text(values)
    if os.environ.get("DSPARK_UPDATE_GOLDEN") == "1":
        golden.write_text(got)
    assert golden.is_file(), "no golden file: run with DSPARK_UPDATE_GOLDEN=1 once"
    assert got == golden.read_text(), (
        "helm template output changed; if intended, regenerate with "
        "DSPARK_UPDATE_GOLDEN=1 python -m pytest tests/helm -k golden and review the diff"
    )
    # Rendering twice is byte-identical (no random names, timestamps or map-order noise).
    again = run_helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f", str(values))
    assert again.stdout == got
