"""``plan --base-values``: the SLA-retuning flow an on-call engineer runs, on committed files.

The flow (deploy/runbooks/sla-tier-tuning.md): fetch the live cost-table ConfigMap
(the committed CPU profile's manifest is what ``kubectl get configmap -o yaml`` returns),
the live values (``tests/cli/data/live-values-cpu.yaml``, a CPU staging release) and
acceptance traces (the embedded drafter's committed traces), then ``plan --base-values
--diff``, then ``helm template`` with the output. The output must keep the tier names
(so applying it deletes no Deployment), model paths and the operator's own choices, and
turn the given load into replicas.
"""

from __future__ import annotations

import math
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_tools import helm_bin

from dspark_sglang.cli import main

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "dspark-sglang"
HW = "cpu-amd-epyc-avx2-2c"
PROFILE_DIR = ROOT / "profiles" / HW
LIVE_TABLE = PROFILE_DIR / "smollm2-135m-instruct-tp1.configmap.yaml"
LIVE_VALUES = Path(__file__).parent / "data" / "live-values-cpu.yaml"
TRACES = [
    str(p) for p in sorted((ROOT / "benchmarks/results/traces").glob("smollm2_dspark_*.jsonl"))
]
STS = ROOT / "dspark_sglang/assets/drafters/smollm2/sts.json"
FAST = ["--policies", "lagged,static:3", "--max-concurrency", "16"]


def _plan(tmp_path: Path, *extra: str, sla: str = "7,2") -> tuple[int, Path]:
    out = tmp_path / "values-planned.yaml"
    rc = main(
        ["plan", "--profile", str(LIVE_TABLE), "--traces", *TRACES, "--sts", str(STS),
         "--sla", sla, *FAST, "--out", str(out), *extra]
    )  # fmt: skip
    return rc, out


def _render(values: Path) -> list[dict[str, Any]]:
    proc = subprocess.run(
        [str(helm_bin()), "template", "stg", str(CHART), "-f", str(values)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


@pytest.fixture(scope="module")
def retuned(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("retune")
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc, out = _plan(
            tmp, "--base-values", str(LIVE_VALUES), "--users", "interactive=10", "--diff"
        )
    assert rc == 0, buf.getvalue()
    return {"out": out, "stdout": buf.getvalue(), "values": yaml.safe_load(out.read_text())}


def test_retune_keeps_names_paths_and_unplanned_keys(retuned: dict[str, Any]) -> None:
    base = yaml.safe_load(LIVE_VALUES.read_text())
    new = retuned["values"]
    assert [t["name"] for t in new["slaTiers"]] == ["interactive", "batch"]
    assert new["model"] == base["model"] and new["weights"] == base["weights"]
    assert new["tierDefaults"] == base["tierDefaults"]
    by = {t["name"]: t for t in new["slaTiers"]}
    # The operator's own choice is kept; the planned keys are the planner's.
    assert by["interactive"]["scheduler"]["greedyOnly"] is True
    assert by["batch"]["replicas"] == 2  # no load given for batch: unchanged
    for t in new["slaTiers"]:
        assert t["costTable"]["hardwareGroup"] == HW and t["costTable"]["version"]
        temps = yaml.safe_load(STS.read_text())["temperatures"]
        assert t["sts"] == {"inline": {"temperatures": temps}}


def test_load_becomes_replicas(retuned: dict[str, Any]) -> None:
    t = {t["name"]: t for t in retuned["values"]["slaTiers"]}["interactive"]
    cap = t["scheduler"]["maxRunningRequests"]
    assert t["replicas"] == math.ceil(10 / cap)


def _leaves(doc: Any, prefix: str = "") -> dict[str, Any]:
    """Leaf paths as the diff prints them (tiers addressed by name)."""
    if isinstance(doc, dict):
        out: dict[str, Any] = {}
        for k, v in doc.items():
            out.update(_leaves(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(doc, list) and doc and all(isinstance(x, dict) and "name" in x for x in doc):
        out = {}
        for x in doc:
            out.update(_leaves(x, f"{prefix}[{x['name']}]"))
        return out
    return {prefix: doc}


def test_diff_names_every_change_and_only_changes(retuned: dict[str, Any]) -> None:
    printed = {
        ln.strip().partition(": ")[0]
        for ln in retuned["stdout"].splitlines()
        if ln.startswith("  ") and " -> " in ln
    }
    before = _leaves(yaml.safe_load(LIVE_VALUES.read_text()))
    after = _leaves(retuned["values"])
    changed = {k for k in before.keys() | after.keys() if before.get(k, "?") != after.get(k, "?")}
    assert printed == changed
    assert any(p.endswith(".scheduler.maxRunningRequests") for p in printed)
    assert not any(".greedyOnly" in p or p.startswith("model.") for p in printed)


def test_retuned_values_render_and_mount_the_pinned_table(retuned: dict[str, Any]) -> None:
    docs = _render(retuned["out"])
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    assert set(deployments) == {"stg-dspark-sglang-interactive", "stg-dspark-sglang-batch"}
    published = yaml.safe_load(LIVE_TABLE.read_text())["metadata"]["name"]
    for d in deployments.values():
        vols = d["spec"]["template"]["spec"]["volumes"]
        mounted = {v["configMap"]["name"] for v in vols if "configMap" in v}
        assert published in mounted
    inter = deployments["stg-dspark-sglang-interactive"]
    assert inter["spec"]["replicas"] == math.ceil(
        10
        / {t["name"]: t for t in retuned["values"]["slaTiers"]}["interactive"]["scheduler"][
            "maxRunningRequests"
        ]
    )


def test_refuses_a_profile_of_another_tp_or_hardware(tmp_path: Path, capsys) -> None:
    base = yaml.safe_load(LIVE_VALUES.read_text())
    base["slaTiers"][0]["tp"] = 2
    base["slaTiers"][0]["gpusPerPod"] = 2
    bad = tmp_path / "tp2.yaml"
    bad.write_text(yaml.safe_dump(base))
    rc, _ = _plan(tmp_path, "--base-values", str(bad))
    assert rc == 2
    err = capsys.readouterr().err
    assert "tier interactive runs at tp 2" in err and "measured at tp 1" in err

    base = yaml.safe_load(LIVE_VALUES.read_text())
    base["slaTiers"][1]["costTable"]["hardwareGroup"] = "cuda-nvidia-h200-1x"
    bad.write_text(yaml.safe_dump(base))
    rc, _ = _plan(tmp_path, "--base-values", str(bad))
    assert rc == 2
    err = capsys.readouterr().err
    assert "cuda-nvidia-h200-1x" in err and HW in err

    rc, _ = _plan(tmp_path, "--hardware-group", "cuda-nvidia-h200-1x")
    assert rc == 2
    assert f"measured on {HW}" in capsys.readouterr().err


def test_refuses_a_profile_without_metadata(tmp_path: Path, capsys) -> None:
    bare = tmp_path / "table.json"
    bare.write_bytes((PROFILE_DIR / "smollm2-135m-instruct-tp1.json").read_bytes())
    out = tmp_path / "v.yaml"
    rc = main(
        ["plan", "--profile", str(bare), "--traces", "synthetic", "--sla", "5", *FAST,
         "--out", str(out)]
    )  # fmt: skip
    assert rc == 2 and not out.exists()
    assert "has no metadata" in capsys.readouterr().err


def test_an_sla_without_a_tier_must_be_named(tmp_path: Path, capsys) -> None:
    rc, _ = _plan(tmp_path, "--base-values", str(LIVE_VALUES), sla="7,3")
    assert rc == 2
    err = capsys.readouterr().err
    assert "--tier 3=<name>" in err and "interactive (7)" in err
    rc, out = _plan(tmp_path, "--base-values", str(LIVE_VALUES), "--tier", "3=batch", sla="7,3")
    assert rc == 0
    tiers = {t["name"]: t for t in yaml.safe_load(out.read_text())["slaTiers"]}
    assert set(tiers) == {"interactive", "batch"} and tiers["batch"]["minTokensPerSecPerUser"] == 3


def test_malformed_tier_and_load_flags_name_the_flag(tmp_path: Path, capsys) -> None:
    for flag, value, msg in (
        ("--tier", "fast=interactive", "--tier fast=interactive: expected SLA=NAME"),
        ("--users", "interactive", "--users 'interactive': expected NAME=NUMBER"),
        ("--rps", "batch=x", "--rps 'batch=x': expected NAME=NUMBER"),
    ):
        rc, out = _plan(tmp_path, "--base-values", str(LIVE_VALUES), flag, value)
        assert rc == 2 and not out.exists()
        assert msg in capsys.readouterr().err


def test_the_draft_pass_comes_from_the_tier_or_the_flag_and_is_recorded(
    tmp_path: Path, capsys
) -> None:
    base = yaml.safe_load(LIVE_VALUES.read_text())
    batch = base["slaTiers"][1]
    del batch["scheduler"]["staticK"]
    batch["scheduler"].update(policy="lagged", lagSteps=2, draftStepSeconds=0.03)
    live = tmp_path / "live.yaml"
    live.write_text(yaml.safe_dump(base))

    rc, out = _plan(tmp_path, "--base-values", str(live))
    assert rc == 0
    printed = capsys.readouterr().out
    assert (
        "interactive: draft pass not modelled (0 s per decode step); give --draft-step-seconds"
        in printed
    )
    where = "--base-values slaTiers[batch].scheduler.draftStepSeconds"
    assert f"batch: draft pass 0.03 s per decode step (from {where})" in printed
    header = [ln for ln in out.read_text().splitlines() if ln.startswith("#   ")]
    assert [ln.rpartition("; ")[2] for ln in header] == [
        "draft pass not modelled (0 s per decode step)",
        "draft pass 0.03 s per decode step",
    ]

    # The flag wins, for every tier, and lands where the planned policy reads it.
    rc, out = _plan(tmp_path, "--base-values", str(live), "--draft-step-seconds", "0.02", sla="2")
    assert rc == 0
    assert "batch: draft pass 0.02 s per decode step (from --draft-step-seconds)" in (
        capsys.readouterr().out
    )
    (planned,) = [t for t in yaml.safe_load(out.read_text())["slaTiers"] if t["name"] == "batch"]
    sched = planned["scheduler"]
    assert sched.get("draftStepSeconds") == (0.02 if sched["policy"] == "lagged" else None)

    batch["scheduler"]["draftStepSeconds"] = "30ms"
    live.write_text(yaml.safe_dump(base))
    rc, _ = _plan(tmp_path, "--base-values", str(live))
    assert rc == 2
    assert "slaTiers[batch].scheduler.draftStepSeconds = '30ms'" in capsys.readouterr().err
