"""Ray fleet driver end to end (profile every node, survive a killed actor, resume
idempotently) plus its input checks.

The Ray part runs ``fleet_scenario.py`` as a subprocess inside a loopback-only
network namespace (``unshare --net`` + ``ip link set lo up``) with
``RAY_USAGE_STATS_ENABLED=0``: Ray probes an external address for its node IP,
and tests must not touch the network.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from sglang.srt.speculative.dspark_components.dspark_sps import SpsCostTable as SGLangSpsCostTable

from dspark_sglang.profiling.configmap import configmap_name, content_version
from dspark_sglang.profiling.fleet import FleetConfig, NodeTarget, _write_groups, resource_targets
from dspark_sglang.profiling.job import ProfileJob
from dspark_sglang.profiling.measure import GridSpec

SCENARIO = Path(__file__).with_name("fleet_scenario.py")


def _netns_available() -> bool:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--net", "ip", "link", "set", "lo", "up"], capture_output=True, timeout=30
    )
    return probe.returncode == 0


@pytest.fixture(scope="module")
def fleet_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not _netns_available():
        pytest.skip("needs `unshare --net` (root or user namespaces) for a loopback-only Ray")
    root = tmp_path_factory.mktemp("fleet")
    result = root / "result.json"
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1")
    cmd = f"ip link set lo up && exec {sys.executable} {SCENARIO} {root / 'out'} {result}"
    proc = subprocess.run(
        ["unshare", "--net", "bash", "-c", cmd],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"scenario failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    data = json.loads(result.read_text())
    data["root"] = str(root / "out")
    return data


@pytest.mark.ray
@pytest.mark.slow
def test_nodes_profile_smollm2_and_tables_load_in_sglang(fleet_runs: dict[str, Any]) -> None:
    fleet = fleet_runs["fleet"]
    assert fleet["ok_nodes"] == ["node-a", "node-b"]
    assert len(fleet["groups"]) == 1  # same machine -> one hardware group
    group = fleet["groups"][0]
    assert group["nodes"] == ["node-a", "node-b"]
    table_text = Path(group["table"]).read_text()
    table = SGLangSpsCostTable.from_json(table_text)
    assert table.sample_batch_tokens[0] == 1 and table.sample_batch_tokens[-1] == 8
    assert set(table.sample_batch_tokens) >= {1, 4, 8}
    assert all(s > 0 for s in table.sample_steps_per_sec)
    assert table.to_json() == table_text  # byte-identical round trip through SGLang
    meta = json.loads(Path(group["meta"]).read_text())
    assert meta["model"] == "smollm2-135m-instruct" and meta["tp_size"] == 1
    assert meta["nodes"] == ["node-a", "node-b"]
    assert set(meta["node_deviation"]) == {"node-a", "node-b"}
    assert Path(group["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    root = Path(fleet_runs["root"]) / "fleet"
    for node in ("node-a", "node-b"):  # each node's own profile is kept and loads too
        probes = json.loads((root / "nodes" / f"{node}.json").read_text())["profile"]["probes"]
        per_node = SGLangSpsCostTable(
            sample_batch_tokens=[p["batch_tokens"] for p in probes],
            sample_steps_per_sec=[p["steps_per_sec"] for p in probes],
            max_batch_tokens=8,
        )
        assert per_node.lookup(8) > 0
    cm = yaml.safe_load(Path(group["configmap"]).read_text())
    assert cm["kind"] == "ConfigMap"
    version = content_version(table_text)
    assert cm["metadata"]["name"] == configmap_name(
        group["group"], meta["model"], meta["tp_size"], version
    )
    assert cm["metadata"]["name"] == (
        f"dspark-cost-table-{group['group']}-smollm2-135m-instruct-tp1-{version}"
    )
    assert cm["data"]["sps.json"] == table_text


@pytest.mark.ray
@pytest.mark.slow
def test_killed_actor_is_reported_and_others_are_kept(fleet_runs: dict[str, Any]) -> None:
    fleet = fleet_runs["fleet"]
    done, planned = fleet_runs["killed_at_progress"]
    assert 1 <= done < planned, "the victim must be killed mid-run"
    assert [f["node"] for f in fleet["failed_nodes"]] == ["node-c"]
    assert "actor died" in fleet["failed_nodes"][0]["reason"]
    assert fleet["ok_nodes"] == ["node-a", "node-b"]  # nothing else lost
    root = Path(fleet_runs["root"]) / "fleet"
    assert sorted(p.name for p in (root / "nodes").iterdir()) == ["node-a.json", "node-b.json"]


@pytest.mark.ray
@pytest.mark.slow
def test_rerun_with_resume_is_idempotent(fleet_runs: dict[str, Any]) -> None:
    first, again = fleet_runs["fleet"], fleet_runs["resume"]
    assert again["reused_nodes"] == ["node-a", "node-b"]  # no actor re-measured them
    assert again["failed_nodes"] == []
    assert [g["table"] for g in again["groups"]] == [g["table"] for g in first["groups"]]
    assert Path(again["groups"][0]["table"]).read_text() == fleet_runs["fleet_table_text"]
    root = Path(fleet_runs["root"]) / "fleet"
    assert not list(root.rglob("*.tmp"))
    report = json.loads((root / "fleet-report.json").read_text())  # the latest run's report
    assert report["reused_nodes"] == ["node-a", "node-b"] and report["failed_nodes"] == []


def test_node_targets_reject_bad_input() -> None:
    with pytest.raises(ValueError, match="exactly one of resource"):
        NodeTarget(name="a")
    with pytest.raises(ValueError, match="exactly one of resource"):
        NodeTarget(name="a", resource="r", node_id="n")
    with pytest.raises(ValueError, match="file-safe"):
        NodeTarget(name="a/b", resource="r")
    with pytest.raises(ValueError, match="duplicate node resources"):
        resource_targets(["x", "x"])
    with pytest.raises(ValueError, match="no --node-resource"):
        resource_targets([])


def test_fleet_and_job_config_reject_bad_input(tmp_path: Path) -> None:
    grid = GridSpec(max_tokens=8)
    with pytest.raises(ValueError, match="node_timeout_s"):
        FleetConfig(job=ProfileJob(model="smollm2", grid=grid), out_dir=tmp_path, node_timeout_s=0)
    with pytest.raises(ValueError, match="backend must be one of"):
        ProfileJob(model="smollm2", grid=grid, backend="vllm")
    with pytest.raises(ValueError, match="sglang backend profiles GPUs"):
        ProfileJob(model="smollm2", grid=grid, backend="sglang", device="cpu")
    with pytest.raises(ValueError, match="tp_size=1 only"):
        ProfileJob(model="smollm2", grid=grid, tp_size=2)


def test_runs_for_tp4_and_tp8_on_one_group_publish_two_configmaps(tmp_path: Path) -> None:
    """Two profiler runs (one per TP) into one output tree keep both tables' ConfigMaps."""
    from test_profiling_artifacts import _node  # the artifacts test's NodeProfile builder

    cfg = FleetConfig(
        job=ProfileJob(model="smollm2", grid=GridSpec(max_tokens=16)), out_dir=tmp_path, plot=False
    )
    outs = [
        _write_groups({"a": _node("a", model="qwen3-235b-a22b", tp=tp)}, cfg)[0] for tp in (4, 8)
    ]
    assert [o.group for o in outs] == ["cuda-nvidia-h200-8x"] * 2
    cms = [yaml.safe_load(o.configmap.read_text()) for o in outs]  # the tp4 file survived
    assert [cm["metadata"]["name"] for cm in cms] == [
        f"dspark-cost-table-cuda-nvidia-h200-8x-qwen3-235b-a22b-tp{tp}-"
        + content_version(o.table.read_text())
        for tp, o in zip((4, 8), outs, strict=True)
    ]
    for o, cm in zip(outs, cms, strict=True):
        assert o.configmap.name == o.table.stem + ".configmap.yaml"
        assert cm["data"]["sps.json"] == o.table.read_text()
