"""``benchmarks/datagen_speed.py``: ``--compare hidden``'s cache check compares the rows
both caches computed from the same tokens, each comparison rewrites only its own part of
the result file, and the committed figures follow from their raw runs."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest
import torch
from bench_scripts import REPO, load_benchmark

from dspark_sglang.training.datagen_hidden import open_hidden_cache, write_hidden_shard
from dspark_sglang.training.datagen_store import ResponseRecord

RESULT = REPO / "benchmarks" / "results" / "datagen_speed.json"
LAYERS = [1, 3]
H = 4


@pytest.fixture(scope="module")
def bench() -> Any:
    return load_benchmark("datagen_speed", "datagen_speed_bench")


def _cache(folder: Path, seqs: list[tuple[list[int], int]], states: list[torch.Tensor]) -> Path:
    """One hidden shard: ``seqs[i] = (tokens, prompt length)``, ``states[i]`` ``[T, 3H]``."""
    root, fmt = open_hidden_cache(folder, LAYERS, H, None)
    recs = [
        ResponseRecord(f"p{i}", "chat", toks[:n], toks[n:], False)
        for i, (toks, n) in enumerate(seqs)
    ]
    pairs = [(s[:, : len(LAYERS) * H], s[:, len(LAYERS) * H :]) for s in states]
    write_hidden_shard(root, 0, recs, pairs, fmt, 1.0)
    return folder


def test_the_cache_check_compares_rows_before_the_first_differing_token(
    bench: Any, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    a = [torch.randn(6, 3 * H), torch.randn(5, 3 * H)]
    b = [x.clone() for x in a]
    b[0][-1] = 0  # the last token's row: never forwarded by SGLang, not compared
    b[1][3:] += 100  # rows from the differing token on: other tokens, not compared
    b[1][1, H : 2 * H] += 1.0  # layer 3, a row both computed from the same tokens
    ref = _cache(tmp_path / "ref", [([1, 2, 3, 4, 5, 6], 3), ([1, 2, 3, 4, 5], 2)], a)
    got = _cache(tmp_path / "got", [([1, 2, 3, 4, 5, 6], 3), ([1, 2, 3, 9, 9], 2)], b)
    c = bench.compare_caches(ref, got, LAYERS, H)
    assert c["same_ids"] and c["same_token_counts"]
    assert (c["identical_sequences"], c["sequences"], c["rows_compared"]) == (1, 2, 5 + 3)
    assert c["states"]["layer_1"] == {"max_abs_over_rms": 0.0, "rel_l2": 0.0}
    assert c["states"]["last"]["rel_l2"] == 0.0
    # The stored bfloat16 values, as the check reads them.
    ref_l3 = torch.cat([a[0][:5, H : 2 * H], a[1][:3, H : 2 * H]]).bfloat16().double()
    diff = (b[1][1, H : 2 * H].bfloat16().double() - a[1][1, H : 2 * H].bfloat16().double()).abs()
    rms = ref_l3.pow(2).mean().sqrt()
    assert c["states"]["layer_3"]["max_abs_over_rms"] == pytest.approx(float(diff.max() / rms))
    assert c["max_abs_over_rms"] == c["states"]["layer_3"]["max_abs_over_rms"]
    # Other ids: nothing is compared row by row.
    other = _cache(tmp_path / "other", [([1, 2, 3], 1)], [torch.randn(3, 3 * H)])
    c = bench.compare_caches(ref, other, LAYERS, H)
    assert not c["same_ids"] and not c["same_token_counts"] and c["rows_compared"] == 0


def test_each_comparison_rewrites_only_its_own_part_of_the_result(
    bench: Any, tmp_path: Path
) -> None:
    out = tmp_path / "datagen_speed.json"
    bench.write_result(out, {"runs": 1, "speedup_median": 1.2}, None)
    bench.write_result(out, {"runs": 2}, bench.HIDDEN_KEY)
    assert json.loads(out.read_text()) == {
        "runs": 1,
        "speedup_median": 1.2,
        bench.HIDDEN_KEY: {"runs": 2},
    }
    bench.write_result(out, {"runs": 3}, None)
    assert json.loads(out.read_text()) == {"runs": 3, bench.HIDDEN_KEY: {"runs": 2}}


def _spread(xs: list[float]) -> dict[str, Any]:
    return {"median": pytest.approx(statistics.median(xs)), "min": min(xs), "max": max(xs)}


@pytest.mark.skipif(not RESULT.exists(), reason="no committed result yet")
def test_committed_figures_follow_from_the_raw_runs(bench: Any) -> None:
    result = json.loads(RESULT.read_text())
    for g in bench.GENERATORS:
        assert result["tokens_per_s"][g] == _spread([r["tokens_per_s"] for r in result["runs"][g]])
    hidden = result.get(bench.HIDDEN_KEY)
    if hidden is None:
        pytest.skip("no committed --compare hidden result yet")
    runs = hidden["runs"]
    plain, capture = (runs[p] for p in bench.HIDDEN_PASSES)
    assert len(plain) == len(capture) == hidden["settings"]["repeats"]
    for r in plain:
        assert r["seconds"] == pytest.approx(r["regen_s"] + r["hf_forward_s"])
    for r in capture:
        assert r["filled"] == 0  # every hidden shard came from the regeneration pass
    for p in bench.HIDDEN_PASSES:
        for key in ("tokens_per_s", "seq_tokens_per_s"):
            for r in runs[p]:
                assert r[key] == pytest.approx(r[key.removesuffix("_per_s")] / r["seconds"])
            assert hidden[key][p] == _spread([r[key] for r in runs[p]])
    med = hidden["tokens_per_s"]
    assert hidden["ratio_median"] == pytest.approx(
        med["sglang_capture"]["median"] / med["sglang+hf_forward"]["median"]
    )
    for c in hidden["cache_checks"]:
        assert c["same_ids"] and c["sequences"] == hidden["settings"]["num_prompts"]
