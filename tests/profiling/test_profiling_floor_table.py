"""Tables written for SGLang's floor lookup: no free tokens between sparse probes."""

from __future__ import annotations

import bisect
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from sglang.srt.speculative.dspark_components.dspark_sps import SpsCostTable as SGLangSpsCostTable

from dspark_sglang.cli import main
from dspark_sglang.profiling.artifacts import (
    GroupProfile,
    NodeProfile,
    cost_table,
    merge_profiles,
    write_group,
)
from dspark_sglang.profiling.backend import BackendInfo
from dspark_sglang.profiling.floor_table import floor_table
from dspark_sglang.profiling.hardware import HardwareFingerprint
from dspark_sglang.profiling.measure import GridSpec, MeasureConfig, Probe
from dspark_sglang.scheduling.cost_table import load_cost_table
from dspark_sglang.scheduling.policies import PrefixScheduler

CPU = HardwareFingerprint("cpu", "Test CPU", 2, "6.0", "avx2")


def _interp_t(sizes: list[int], rates: list[float], b: int) -> float:
    i = bisect.bisect_right(sizes, b) - 1
    if i == len(sizes) - 1:
        return 1.0 / rates[i]
    t0, t1 = 1.0 / rates[i], 1.0 / rates[i + 1]
    return t0 + (t1 - t0) * (b - sizes[i]) / (sizes[i + 1] - sizes[i])


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("tolerance", [0.01, 0.02, 0.1])
def test_floor_lookup_tracks_the_interpolated_curve_within_tolerance(
    seed: int, tolerance: float
) -> None:
    rng = np.random.default_rng(seed)
    sizes = sorted({1, 2, 3, 4, *rng.integers(5, 600, size=14).tolist()})
    # Rising step time with noise (some intervals even get faster) and one cliff.
    t = np.cumsum(rng.uniform(-0.002, 0.03, size=len(sizes))) + 0.1
    cliff = len(sizes) // 2
    t[cliff:] += 0.2
    rates = (1.0 / t).tolist()
    stairs = [(sizes[cliff - 1], sizes[cliff])]
    ft = floor_table(sizes, rates, stairs, tolerance)

    entries = dict(zip(ft.batch_tokens, ft.steps_per_sec, strict=True))
    assert all(entries[b] == r for b, r in zip(sizes, rates, strict=True))  # probes kept exactly
    assert sorted(ft.interpolated) == sorted(set(ft.batch_tokens) - set(sizes))
    assert list(ft.batch_tokens) == sorted(set(ft.batch_tokens))
    lo, hi = stairs[0]
    assert not [b for b in ft.interpolated if lo < b < hi]  # the cliff stays a cliff
    table_sizes = list(ft.batch_tokens)
    for b in range(sizes[0], sizes[-1] + 1):
        if lo < b < hi:
            continue
        floor_t = 1.0 / entries[table_sizes[bisect.bisect_right(table_sizes, b) - 1]]
        assert floor_t * (1 + tolerance) >= _interp_t(sizes, rates, b) * (1 - 1e-12), b


def test_zero_tolerance_writes_the_probes_only_and_bad_tolerances_are_named() -> None:
    ft = floor_table([1, 8, 64], [10.0, 5.0, 1.0], tolerance=0.0)
    assert ft.batch_tokens == (1, 8, 64) and ft.interpolated == ()
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="floor tolerance must be a finite number >= 0"):
            floor_table([1, 8], [10.0, 5.0], tolerance=bad)
    with pytest.raises(ValueError, match="strictly increasing"):
        floor_table([8, 1], [10.0, 5.0])


def test_flat_stretches_stay_sparse() -> None:
    """A GPU plateau (same step time up to a tile edge) needs no extra entries."""
    ft = floor_table([1, 64, 65, 128], [60.0, 60.0, 57.0, 57.0], [(64, 65)], 0.02)
    assert ft.batch_tokens == (1, 64, 65, 128)


def _linear_cpu_probes(sizes: tuple[int, ...]) -> tuple[Probe, ...]:
    out = []
    for b in sizes:
        step = 0.1 + 0.01 * b  # a CPU: every token costs the same, no plateaus
        out.append(Probe(b, 1.0 / step, step, 0.02, 8, 0.002))
    return tuple(out)


def test_prefix_scheduler_gets_no_free_tokens_between_sparse_probes() -> None:
    """The reason for the module: floor lookup over probes 32 and 38 made 33-37 free."""
    probes = _linear_cpu_probes((1, 2, 4, 8, 16, 32, 38, 64))
    sparse = cost_table(probes, 64, floor_tolerance=0.0)
    dense = cost_table(probes, 64, floor_tolerance=0.02)
    # 32 requests, each with one middling draft (survival 0.3) and nothing after it.
    conf = torch.zeros(32, 6)
    conf[:, 0] = 0.3
    admitted_sparse = int(PrefixScheduler(sparse).decide(conf).sum())
    admitted_dense = int(PrefixScheduler(dense).decide(conf).sum())
    # Sparse: SPS(33..37) == SPS(32), so 5 drafts look free. True marginal cost of
    # one token at b = 32 is 0.01 / 0.42 = 2.4 % of a step, i.e. 32 * 0.024 = 0.76
    # expected tokens, more than the 0.3 a draft brings: none is worth verifying.
    assert admitted_sparse == 5
    assert admitted_dense == 0


def _group(probes: tuple[Probe, ...]) -> GroupProfile:
    node = NodeProfile(
        node="n0",
        hardware=CPU,
        backend=BackendInfo(kind="hf", model="m", dtype="float32", tp_size=1, device="cpu"),
        grid=GridSpec(max_tokens=64),
        measure=MeasureConfig(),
        probes=probes,
        versions={"torch": "x"},
        started_at="2026-01-01T00:00:00+00:00",
        finished_at="2026-01-01T00:01:00+00:00",
    )
    return merge_profiles([node])


def test_written_table_is_sglang_loadable_and_meta_lists_the_interpolated_sizes(
    tmp_path: Path,
) -> None:
    group = _group(_linear_cpu_probes((1, 2, 4, 8, 16, 32, 64)))
    paths = write_group(tmp_path, group, plot=False, floor_tolerance=0.02)
    text = paths.table.read_text()
    sg = SGLangSpsCostTable.from_json(text)
    assert sg.to_json() == text
    meta = json.loads(paths.meta.read_text())
    probed = [p["batch_tokens"] for p in meta["probes"]]
    assert sorted(probed + meta["table"]["interpolated_batch_tokens"]) == sg.sample_batch_tokens
    assert meta["table"]["floor_tolerance"] == 0.02 and len(sg.sample_batch_tokens) > len(probed)
    # Only the rendering changed: SGLang reads the measured rate at every probe.
    for p in meta["probes"]:
        assert sg.lookup(p["batch_tokens"]) == p["steps_per_sec"]


def test_rerender_rebuilds_from_the_meta_without_measuring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    group = _group(_linear_cpu_probes((1, 2, 4, 8, 16, 32, 64)))
    paths = write_group(tmp_path, group, plot=False, floor_tolerance=0.0)
    sparse = load_cost_table(paths.table)
    assert list(sparse.sample_batch_tokens) == [1, 2, 4, 8, 16, 32, 64]
    assert main(["profile", "--rerender", str(paths.meta), "--no-plot"]) == 0
    dense = load_cost_table(paths.table)
    # The same table a fresh profile would write, built here from the group's own probes.
    fresh = cost_table(
        group.probes, group.max_batch_tokens, stairs=group.stairs(), floor_tolerance=0.02
    )
    assert dense == fresh
    cm = yaml.safe_load(paths.table.with_name(paths.table.stem + ".configmap.yaml").read_text())
    assert cm["data"]["sps.json"] == paths.table.read_text()
    meta = json.loads(paths.meta.read_text())
    assert meta["table"]["interpolated_batch_tokens"] and meta["probes"][0]["batch_tokens"] == 1

    bad = tmp_path / "bad.meta.json"
    bad.write_text(json.dumps({"schema": "something-else"}))
    assert main(["profile", "--rerender", str(bad)]) == 2
    assert "schema" in capsys.readouterr().err
