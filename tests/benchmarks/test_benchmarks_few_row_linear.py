"""``benchmarks/few_row_linear.py``: both paths compute the same product, and the
committed result's ratios are the ones its raw timings give."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from bench_scripts import REPO, load_benchmark

from dspark_sglang.sglang_integration import cpu_linear

pytestmark = pytest.mark.skipif(
    not cpu_linear.onednn_available(), reason="this torch build has no oneDNN packed linear"
)

RESULT = REPO / "benchmarks" / "results" / "few_row_linear.json"


def test_one_measurement_compares_equal_products() -> None:
    bench = load_benchmark("few_row_linear", "few_row_linear_bench")
    r = bench.measure([(48, 32), (32, 48)], rows=4, repeats=2, iters=1)
    assert r["max_abs_diff"] < 1e-5  # the same float32 product, summed in another order
    assert len(r["sglang"]["ms"]) == len(r["few_row"]["ms"]) == 2
    assert r["sglang_over_few_row"] == pytest.approx(r["sglang"]["median"] / r["few_row"]["median"])


def test_shapes_are_smollm2s() -> None:
    bench = load_benchmark("few_row_linear", "few_row_linear_bench")
    shapes = bench.smollm2_shapes()
    # qkv (9 + 2 x 3 heads of 64), o, gate+up (2 x 1536), down; tied head 49152 x 576
    assert shapes["decoder_layer"] == [(960, 576), (576, 576), (3072, 576), (576, 1536)]
    assert shapes["lm_head"] == [(49152, 576)]


@pytest.mark.skipif(not RESULT.exists(), reason="no committed result yet")
def test_committed_ratios_follow_from_the_raw_timings() -> None:
    result = json.loads(Path(RESULT).read_text())
    for per_rows in result["rows"].values():
        one = statistics.median(per_rows["1"]["sglang"]["ms"])
        for r in per_rows.values():
            for path in ("sglang", "few_row"):
                assert r[path]["median"] == pytest.approx(statistics.median(r[path]["ms"]))
            assert r["sglang_over_few_row"] == pytest.approx(
                r["sglang"]["median"] / r["few_row"]["median"]
            )
            assert r["few_row_in_one_row_units"] == pytest.approx(r["few_row"]["median"] / one)
            assert r["max_abs_diff"] < 1e-3
