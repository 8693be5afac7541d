"""The committed CPU profile of SmolLM2-135M is complete and loadable."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
from pathlib import Path

import pytest
import yaml
from sglang.srt.speculative.dspark_components.dspark_sps import SpsCostTable as SGLangSpsCostTable
from sglang.srt.speculative.dspark_components.dspark_sps import load_sps_table_from_path

from dspark_sglang.profiling.configmap import build_configmap, write_configmap
from dspark_sglang.profiling.floor_table import floor_table
from dspark_sglang.profiling.hardware import HardwareFingerprint
from dspark_sglang.profiling.stairs import detect_stairs
from dspark_sglang.scheduling.cost_table import load_cost_table

PROFILES = Path(__file__).resolve().parents[2] / "profiles"
TABLES = sorted(PROFILES.glob("cpu-*/smollm2-135m-instruct-tp1.json"))


def test_a_cpu_profile_of_smollm2_is_committed() -> None:
    assert TABLES, f"no profiles/cpu-*/smollm2-135m-instruct-tp1.json under {PROFILES}"


@pytest.mark.parametrize("table_path", TABLES, ids=[p.parent.name for p in TABLES])
def test_committed_profile_is_consistent(table_path: Path) -> None:
    text = table_path.read_text()
    sg = SGLangSpsCostTable.from_json(text)
    assert sg.to_json() == text
    assert isinstance(load_sps_table_from_path(str(table_path)), SGLangSpsCostTable)
    ours = load_cost_table(table_path)
    assert list(ours.sample_batch_tokens) == sg.sample_batch_tokens

    meta = json.loads(table_path.with_name("smollm2-135m-instruct-tp1.meta.json").read_text())
    assert meta["table_file"] == table_path.name
    assert meta["model"] == "smollm2-135m-instruct" and meta["tp_size"] == 1
    assert HardwareFingerprint.from_dict(meta["hardware"]).slug == table_path.parent.name
    assert meta["versions"]["torch"] and meta["versions"]["sglang"] == "0.5.23"
    dt.datetime.fromisoformat(meta["date"])
    probes = meta["probes"]
    sizes = [p["batch_tokens"] for p in probes]
    rates = [p["steps_per_sec"] for p in probes]
    assert sizes[0] == 1 and sizes[-1] >= 256
    assert set(range(1, 17)) <= set(sizes)  # measured densely where stairs are small
    assert all(p["samples"] >= 8 for p in probes)
    grid = meta["grid"]["spec"]
    recomputed = detect_stairs(
        sizes,
        rates,
        [p["median_se"] for p in probes],
        threshold=grid["drop_threshold"],
        noise_k=grid["noise_k"],
    )
    assert [s.to_dict() for s in recomputed] == meta["stairs"]
    # The table is the probes plus the interpolated entries the meta lists, and it is
    # exactly what floor_table builds from them (no hand edits).
    note = meta["table"]
    assert note["floor_tolerance"] > 0
    assert sorted(sizes + note["interpolated_batch_tokens"]) == sg.sample_batch_tokens
    assert all(sg.lookup(b) == r for b, r in zip(sizes, rates, strict=True))
    built = floor_table(
        sizes, rates, [(s.lo_tokens, s.hi_tokens) for s in recomputed], note["floor_tolerance"]
    )
    assert list(built.batch_tokens) == sg.sample_batch_tokens
    assert list(built.steps_per_sec) == sg.sample_steps_per_sec

    png = table_path.with_name("smollm2-135m-instruct-tp1.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


@pytest.mark.parametrize("table_path", TABLES, ids=[p.parent.name for p in TABLES])
def test_committed_configmap_is_what_the_code_builds(table_path: Path) -> None:
    """The committed manifest is exactly ``build_configmap`` of the committed table + meta.

    After an intended change to the ConfigMap contract, regenerate it with the code
    (never by hand):
        DSPARK_UPDATE_GOLDEN=1 python -m pytest tests/profiling -k committed_configmap
    and review the diff.
    """
    text = table_path.read_text()
    meta = json.loads(table_path.with_name(f"{table_path.stem}.meta.json").read_text())
    cm_path = table_path.with_name(f"{table_path.stem}.configmap.yaml")
    committed = yaml.safe_load(cm_path.read_text())
    built = build_configmap(
        table_path.parent.name, text, meta, namespace=committed["metadata"]["namespace"]
    )
    if os.environ.get("DSPARK_UPDATE_GOLDEN") == "1":
        write_configmap(cm_path, built)
        committed = yaml.safe_load(cm_path.read_text())
    assert committed == built, (
        f"{cm_path} is stale; regenerate with DSPARK_UPDATE_GOLDEN=1 python -m pytest "
        "tests/profiling -k committed_configmap and review the diff"
    )
    # The contract the Helm chart relies on, spelled out rather than re-derived: the name
    # ends in the first 10 hex digits of the SHA-256 of the table file's bytes.
    version = hashlib.sha256(table_path.read_bytes()).hexdigest()[:10]
    assert committed["metadata"]["name"] == (
        f"dspark-cost-table-{table_path.parent.name}-smollm2-135m-instruct-tp1-{version}"
    )
    assert committed["metadata"]["labels"]["dspark-sglang.io/tp"] == "1"
    assert committed["metadata"]["labels"]["dspark-sglang.io/content-hash"] == version
    assert committed["immutable"] is True
    assert committed["data"]["sps.json"] == text
    assert json.loads(committed["data"]["sps.meta.json"]) == meta
