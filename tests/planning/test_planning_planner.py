"""SLA planner: tiers meet their SLA, and the values file is what the Helm chart accepts."""

from __future__ import annotations

import copy
import json
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from chart_tools import helm_bin

from dspark_sglang.cli import main
from dspark_sglang.planning.frontier import PolicySpec
from dspark_sglang.planning.planner import PlanError, PlannedTier, Planner, tier_name
from dspark_sglang.planning.values_edit import (
    CostTableSource,
    ProfileIdentity,
    apply_plan,
    base_draft_step_seconds,
    map_tiers,
)
from dspark_sglang.scheduling.config import SchedulerConfig

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "dspark-sglang"
SLAS = (150.0, 60.0)


@pytest.fixture(scope="module")
def planner(table, high_traces, lengths) -> Planner:
    return Planner(
        high_traces,
        table,
        lengths,
        specs=[PolicySpec("lagged"), PolicySpec("mtp1")],
        max_concurrency=64,
        num_requests=lambda c: max(24, 3 * c),
    )


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Helm's values merge: maps merge recursively, everything else is replaced."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def test_tiers_meet_their_sla_and_are_maximal(planner: Planner) -> None:
    tiers = planner.plan(SLAS)
    assert [t.sla for t in tiers] == [150.0, 60.0]
    for t in tiers:
        assert t.result.user_tps_p50 >= t.sla and t.result.user_tps_p90 >= t.sla
        # One more admitted request would break the SLA (for the chosen policy).
        if t.max_running_requests < planner.max_concurrency:
            nxt = planner.run(t.spec, t.max_running_requests + 1)
            assert min(nxt.user_tps_p50, nxt.user_tps_p90) < t.sla
    assert tiers[1].max_running_requests > tiers[0].max_running_requests  # looser SLA, more users
    assert tiers[1].result.throughput > tiers[0].result.throughput


def test_infeasible_sla_is_a_clear_error(planner: Planner) -> None:
    with pytest.raises(PlanError, match="no candidate meets 100000 tok/s/user"):
        planner.plan_tier(1e5)


def test_values_validate_against_chart_schema(planner: Planner, table) -> None:
    tiers = planner.plan(SLAS)
    inline = {
        "sample_batch_tokens": list(table.sample_batch_tokens),
        "sample_steps_per_sec": list(table.sample_steps_per_sec),
        "max_batch_tokens": table.max_batch_tokens,
    }
    doc = apply_plan(
        {"slaTiers": []},
        tiers,
        map_tiers(SLAS, None, {}),
        ProfileIdentity("test-hw", "test-model", 1, "0123456789"),
        cost_table=CostTableSource(published=None, inline=inline),
        sts={"configMapName": "dspark-sts"},
    )
    schema = yaml.safe_load((CHART / "values.schema.json").read_text())
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    jsonschema.validate(_merge(defaults, doc), schema)
    # And a broken tier is rejected by the same schema (the check has teeth).
    bad = copy.deepcopy(doc)
    del bad["slaTiers"][0]["scheduler"]["maxRunningRequests"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(_merge(defaults, bad), schema)
    assert tier_name(80.5) == "sla-80-5"


@pytest.mark.helm
@pytest.mark.parametrize("policy", ["lagged", "prefix", "mtp1", "none"])
def test_a_plan_keeps_the_draft_pass_only_where_the_planned_policy_reads_it(
    policy: str, tmp_path: Path
) -> None:
    """The operator's ``draftStepSeconds`` survives a plan that keeps a cost-table policy,
    and is dropped when the plan moves the tier to one the chart refuses it on."""
    base = {
        "slaTiers": [
            {
                "name": "interactive",
                "minTokensPerSecPerUser": 120,
                "tp": 1,
                "gpusPerPod": 1,
                "scheduler": {
                    "policy": "lagged",
                    "blockSize": 7,
                    "lagSteps": 2,
                    "maxVerifyTokens": 96,
                    "maxRunningRequests": 16,
                    "greedyOnly": True,
                    "draftStepSeconds": 0.004,
                },
                "costTable": {"hardwareGroup": "test-hw", "version": "3f1664f4b5"},
                "sts": {"configMapName": "dspark-sts"},
            }
        ]
    }
    # Only the scheduler keys are read from a planned tier here, not its simulation.
    planned = PlannedTier(120.0, PolicySpec(policy), 16, 96, 7, result=None)  # type: ignore[arg-type]
    doc = apply_plan(
        base,
        [planned],
        {120.0: "interactive"},
        ProfileIdentity("test-hw", "test-model", 1, "3f1664f4b5"),
        cost_table=CostTableSource(
            published={"hardwareGroup": "test-hw", "version": "3f1664f4b5"}, inline=None
        ),
        sts=None,
    )
    sched = doc["slaTiers"][0]["scheduler"]
    assert sched["policy"] == policy and sched["greedyOnly"] is True
    kept = policy in ("lagged", "prefix")
    assert sched.get("draftStepSeconds") == (0.004 if kept else None)
    out = tmp_path / "values.yaml"
    out.write_text(yaml.safe_dump({"model": {"slug": "test-model"}, **doc}))
    proc = subprocess.run(
        [str(helm_bin()), "template", "dspark", str(CHART), "-f", str(out)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (cm,) = [
        d
        for d in yaml.safe_load_all(proc.stdout)
        if d and d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-scheduler")
    ]
    cfg = SchedulerConfig.from_dict(yaml.safe_load(cm["data"]["scheduler.yaml"]))
    assert cfg.draft_step_seconds == (0.004 if kept else None)


#: Scheduler keys only ``prefix`` and ``lagged`` read (the chart and SchedulerConfig refuse
#: them on every other policy; ``copyConfidence`` also needs context copies).
_TABLE_POLICY_KEYS = ("draftStepSeconds", "draftDecision", "probeEvery", "copyConfidence")


@pytest.mark.helm
@pytest.mark.parametrize(
    "spec",
    [PolicySpec("lagged"), PolicySpec("prefix"), PolicySpec("mtp1"), PolicySpec("static", 3),
     PolicySpec("none"), PolicySpec("verify_all")],
    ids=lambda s: s.label,
)  # fmt: skip
def test_planning_the_chart_defaults_onto_another_policy_renders(
    spec: PolicySpec, tmp_path: Path
) -> None:
    """The chart's default tiers (``draftDecision: priced``), one of them with the options
    its comments offer set, planned onto each policy: the keys the planned policy does not
    read are dropped, the others kept, and ``helm template`` renders the result."""
    base = yaml.safe_load((CHART / "values.yaml").read_text())
    interactive, standard = base["slaTiers"]
    assert interactive["scheduler"]["draftDecision"] == "priced"
    assert standard["scheduler"]["draftDecision"] == "priced"
    interactive["scheduler"].update(
        draftStepSeconds=0.004, probeEvery=16, contextCopyNgram=2, copyConfidence=0.65,
        raggedMode="compact",
    )  # fmt: skip
    group = interactive["costTable"]["hardwareGroup"]
    # Only the scheduler keys are read from a planned tier here, not its simulation.
    planned = [
        PlannedTier(float(t["minTokensPerSecPerUser"]), spec, 16, 96, 7, result=None)  # type: ignore[arg-type]
        for t in (interactive, standard)
    ]
    doc = apply_plan(
        base,
        planned,
        {t.sla: name for t, name in zip(planned, ("interactive", "standard"), strict=True)},
        ProfileIdentity(group, "target", 1, "3f1664f4b5"),
        cost_table=CostTableSource(
            published={"hardwareGroup": group, "version": "3f1664f4b5"}, inline=None
        ),
        sts=None,
    )
    reads = spec.name in ("lagged", "prefix")
    scheds = {t["name"]: t["scheduler"] for t in doc["slaTiers"]}
    for name, sched in scheds.items():
        assert sched["policy"] == spec.name
        if reads:
            assert sched["draftDecision"] == "priced", (name, sched)
        else:
            assert not set(_TABLE_POLICY_KEYS) & set(sched), (name, sched)
    if reads:
        assert {k: scheds["interactive"][k] for k in _TABLE_POLICY_KEYS} == {
            "draftStepSeconds": 0.004, "draftDecision": "priced", "probeEvery": 16,
            "copyConfidence": 0.65,
        }  # fmt: skip
    # Copies are refused only where nothing is verified; raggedMode only on verify_all.
    assert scheds["interactive"].get("contextCopyNgram") == (None if spec.name == "none" else 2)
    ragged = None if spec.name == "verify_all" else "compact"
    assert scheds["interactive"].get("raggedMode") == ragged
    out = tmp_path / "values.yaml"
    out.write_text(yaml.safe_dump(doc))
    proc = subprocess.run(
        [str(helm_bin()), "template", "dspark", str(CHART), "-f", str(out)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    cfgs = {
        d["metadata"]["name"]: SchedulerConfig.from_dict(
            yaml.safe_load(d["data"]["scheduler.yaml"])
        )
        for d in yaml.safe_load_all(proc.stdout)
        if d and d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-scheduler")
    }
    assert len(cfgs) == 2, sorted(cfgs)
    for cfg in cfgs.values():
        assert cfg.policy == spec.name
        assert cfg.draft_decision == ("priced" if reads else "always")
        assert cfg.probe_every is None or reads
        assert cfg.copy_confidence is None or reads


@pytest.mark.helm
def test_plan_cli_output_renders_with_helm(tmp_path: Path, table) -> None:
    helm = helm_bin()
    profile = tmp_path / "sps.json"
    table.save(profile)
    # What the profiler writes beside a table: plan refuses a table without it.
    meta = {"hardware_slug": "test-hw", "model": "test-model", "tp_size": 1}
    (tmp_path / "sps.meta.json").write_text(json.dumps(meta))
    out = tmp_path / "values-planned.yaml"
    rc = main(
        ["plan", "--profile", str(profile), "--traces", "synthetic", "--sla", "150,60",
         "--policies", "lagged,mtp1", "--max-concurrency", "32", "--out", str(out)]
    )  # fmt: skip
    assert rc == 0
    values = yaml.safe_load(out.read_text())
    proc = subprocess.run(
        [str(helm), "template", "dspark", str(CHART), "-f", str(out)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    sched = {
        d["metadata"]["name"]: SchedulerConfig.from_dict(
            yaml.safe_load(d["data"]["scheduler.yaml"])
        )
        for d in docs
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-scheduler")
    }
    assert len(sched) == 2
    for tier in values["slaTiers"]:
        cfg = sched[f"dspark-dspark-sglang-{tier['name']}-scheduler"]
        s = tier["scheduler"]
        assert cfg.policy == s["policy"] and cfg.block_size == s["blockSize"] == 7
        assert cfg.max_verify_tokens == s["maxVerifyTokens"]
        # Admission is SGLang's own flag, rendered from the same tier values.
        (deploy,) = [
            d
            for d in docs
            if d["kind"] == "Deployment"
            and d["metadata"]["name"] == f"dspark-dspark-sglang-{tier['name']}"
        ]
        args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
        i = args.index("--max-running-requests")
        assert int(args[i + 1]) == s["maxRunningRequests"]


@pytest.mark.helm
def test_plan_from_committed_profile_mounts_the_profilers_configmap(tmp_path: Path) -> None:
    # The committed CPU profile carries its model and TP in .meta.json; a tier planned
    # from it must mount exactly the ConfigMap the profiler published for that table.
    from dspark_sglang.profiling.configmap import configmap_name, table_version

    helm = helm_bin()
    hw = "cpu-amd-epyc-avx2-2c"
    profile = ROOT / "profiles" / hw / "smollm2-135m-instruct-tp1.json"
    out = tmp_path / "values-planned.yaml"
    rc = main(
        ["plan", "--profile", str(profile), "--traces", "synthetic", "--sla", "8",
         "--policies", "lagged,mtp1", "--max-concurrency", "16", "--hardware-group", hw,
         "--out", str(out)]
    )  # fmt: skip
    assert rc == 0
    values = yaml.safe_load(out.read_text())
    assert values["model"] == {"slug": "smollm2-135m-instruct"}
    assert [t["tp"] for t in values["slaTiers"]] == [1]
    proc = subprocess.run(
        [str(helm), "template", "dspark", str(CHART), "-f", str(out)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    mounted = {
        v["configMap"]["name"]
        for d in yaml.safe_load_all(proc.stdout)
        if d and d["kind"] in ("Deployment", "LeaderWorkerSet")
        for v in _volumes(d)
        if "configMap" in v
    }
    committed = yaml.safe_load(
        (ROOT / "profiles" / hw / "smollm2-135m-instruct-tp1.configmap.yaml").read_text()
    )
    version = table_version(profile)
    assert {t["costTable"]["version"] for t in values["slaTiers"]} == {version}
    assert committed["metadata"]["name"] == configmap_name(hw, "smollm2-135m-instruct", 1, version)
    assert committed["metadata"]["name"] in mounted


def _volumes(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc["spec"]
    if doc["kind"] == "LeaderWorkerSet":
        spec = spec["leaderWorkerTemplate"]["workerTemplate"]
    else:
        spec = spec["template"]
    return spec["spec"].get("volumes", [])


def test_the_draft_pass_slows_every_run_and_is_recorded_per_tier(planner: Planner) -> None:
    """A tier's draft pass is charged to its runs only, and its tier records it."""
    mtp1 = PolicySpec("mtp1")  # static: the same steps with or without the draft pass
    only_mtp1 = replace(planner, specs=[mtp1])
    drafted = replace(only_mtp1, draft_step_seconds=0.004)
    plain_run, drafted_run = only_mtp1.run(mtp1, 4), drafted.run(mtp1, 4)
    assert (plain_run.draft_step_seconds, drafted_run.draft_step_seconds) == (0.0, 0.004)
    assert plain_run.steps == drafted_run.steps
    assert drafted_run.throughput < plain_run.throughput
    assert only_mtp1.run(mtp1, 4) is plain_run  # the cache keeps the two apart
    fast, slow = only_mtp1.plan([100.0, 60.0], {60.0: 0.004})
    assert (fast.sla, fast.draft_step_seconds, fast.result.draft_step_seconds) == (100.0, None, 0.0)
    assert (slow.sla, slow.draft_step_seconds, slow.result.draft_step_seconds) == (
        60.0,
        0.004,
        0.004,
    )
    # The same policy and cap without the draft pass: the same steps, each shorter.
    undrafted = only_mtp1.run(mtp1, slow.max_running_requests)
    assert slow.result.throughput < undrafted.throughput
    with pytest.raises(PlanError, match="draft pass was given for SLA 61"):
        planner.plan(SLAS, {61.0: 0.004})
    for bad in (-1.0, float("nan")):
        with pytest.raises(PlanError, match=r"Planner\.draft_step_seconds must be a finite"):
            replace(planner, draft_step_seconds=bad)


@pytest.mark.parametrize("policy", ["lagged", "prefix", "mtp1", "none"])
def test_a_modelled_draft_pass_is_written_where_the_planned_policy_reads_it(policy: str) -> None:
    """The served scheduler then decides with the cost the prediction charged; the base
    tier's own value is replaced, or dropped for a policy the chart refuses it on."""
    base = {
        "slaTiers": [
            {
                "name": "interactive",
                "minTokensPerSecPerUser": 120,
                "tp": 1,
                "scheduler": {"policy": "lagged", "blockSize": 7, "draftStepSeconds": 0.004},
                "costTable": {"hardwareGroup": "test-hw", "version": "3f1664f4b5"},
            }
        ]
    }
    names = {120.0: "interactive"}
    assert base_draft_step_seconds(base, names) == {120.0: 0.004}
    source = CostTableSource(
        published={"hardwareGroup": "test-hw", "version": "3f1664f4b5"}, inline=None
    )
    ident = ProfileIdentity("test-hw", "test-model", 1, "3f1664f4b5")
    for modelled, expected in ((0.01, 0.01), (None, 0.004)):
        planned = PlannedTier(120.0, PolicySpec(policy), 16, 96, 7, None, modelled)  # type: ignore[arg-type]
        doc = apply_plan(base, [planned], names, ident, cost_table=source, sts=None)
        sched = doc["slaTiers"][0]["scheduler"]
        reads = policy in ("lagged", "prefix")
        assert sched.get("draftStepSeconds") == (expected if reads else None)
    base["slaTiers"][0]["scheduler"]["draftStepSeconds"] = -0.004
    with pytest.raises(
        PlanError, match=r"slaTiers\[interactive\]\.scheduler\.draftStepSeconds = -0\.004"
    ):
        base_draft_step_seconds(base, names)
