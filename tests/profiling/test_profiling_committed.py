"""The committed CPU profile of SmolLM2-135M (issue 5, Must-show 4) is complete and loadable."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
import yaml
from sglang.srt.speculative.dspark_components.dspark_sps import SpsCostTable as SGLangSpsCostTable
from sglang.srt.speculative.dspark_components.dspark_sps import load_sps_table_from_path

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
    assert [p["batch_tokens"] for p in probes] == sg.sample_batch_tokens
    assert [p["steps_per_sec"] for p in probes] == sg.sample_steps_per_sec
    assert sg.sample_batch_tokens[0] == 1 and sg.sample_batch_tokens[-1] >= 256
    assert set(range(1, 17)) <= set(sg.sample_batch_tokens)  # dense where stairs are small
    assert all(p["samples"] >= 8 for p in probes)
    grid = meta["grid"]["spec"]
    recomputed = detect_stairs(
        sg.sample_batch_tokens,
        sg.sample_steps_per_sec,
        [p["median_se"] for p in probes],
        threshold=grid["drop_threshold"],
        noise_k=grid["noise_k"],
    )
    assert [s.to_dict() for s in recomputed] == meta["stairs"]

    png = table_path.with_name("smollm2-135m-instruct-tp1.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    cm = yaml.safe_load(
        table_path.with_name("smollm2-135m-instruct-tp1.configmap.yaml").read_text()
    )
    assert cm["metadata"]["name"] == f"dspark-cost-table-{table_path.parent.name}"
    assert cm["data"]["sps.json"] == text
