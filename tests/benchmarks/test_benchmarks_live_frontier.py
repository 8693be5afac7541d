"""The live frontier benchmark's server-free parts (``dspark_sglang.bench.live_frontier``, run
by ``benchmarks/live_frontier.py``) and its prompt file (``benchmarks/data/mixed_prompts.json``).

Covered without a server: reading bench_serving's ``--output-file``, the server counters
read around a cell, the rows (median and range over the repeats, the ratio to plain taken
per repeat), the Pareto frontier (a dominated point is dropped), the per-user speed-up over
``mtp1`` at matched throughput (against values computed by hand), the engines' scheduler
configs and the chart's default engine, the turn order and the prompt subsets. ``slow``:
the committed prompt file is what ``make_mixed_prompts.py`` builds today and bench_serving's
ShareGPT loader keeps every item. No test starts a server: the smallest grid starts two,
minutes on a shared 2-core machine; run the script with ``--engines plain prefix
--concurrency 1 2 --temperatures 0 --repeats 1 --num-prompts 4`` for that.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from bench_scripts import REPO, load_benchmark

from dspark_sglang.bench.live_frontier import client as lf_client
from dspark_sglang.bench.live_frontier import engines as lf_engines
from dspark_sglang.bench.live_frontier import rows as lf_rows

PROMPTS = REPO / "benchmarks" / "data" / "mixed_prompts.json"
VALUES = REPO / "helm" / "dspark-sglang" / "values.yaml"


# ------------------------------------------------------------------ bench_serving's output


def _bench_line(**kw: Any) -> str:
    doc = {
        "backend": "sglang",
        "completed": 8,
        "total_output_tokens": 512,
        "duration": 20.0,
        "output_throughput": 25.6,
        "median_tpot_ms": 80.0,
        "median_ttft_ms": 150.0,
        "accept_length": 2.5,
    }
    return json.dumps({**doc, **kw})


def test_the_last_result_line_of_bench_serving_counts() -> None:
    """bench_serving appends one line per run to its --output-file; the last is this cell's."""
    text = _bench_line(output_throughput=1.0) + "\n" + _bench_line() + "\n\n"
    got = lf_client.parse_bench_output(text)
    assert got["output_tok_s"] == 25.6
    assert got["median_tpot_ms"] == 80.0
    assert got["user_tok_s"] == pytest.approx(1000.0 / 80.0)
    assert got["median_ttft_ms"] == 150.0
    assert got["completed"] == 8
    assert got["bench_accept_length"] == 2.5
    assert (
        lf_client.parse_bench_output(_bench_line(accept_length=None))["bench_accept_length"] is None
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no result line"),
        (_bench_line(median_tpot_ms=None), "median_tpot_ms"),
        (_bench_line(completed=0), "completed no request"),
        (_bench_line(median_tpot_ms=0.0), "no per-user speed"),
    ],
)
def test_a_result_without_its_figures_is_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        lf_client.parse_bench_output(text)


def test_the_client_is_bench_serving_with_the_cells_settings() -> None:
    cmd = lf_client.bench_command(
        "http://127.0.0.1:1",
        Path("p.json"),
        "/m",
        prompts=8,
        concurrency=4,
        temperature=1.0,
        output_len=64,
        seed=3,
        output_file=Path("o.jsonl"),
        python="py",
    )
    assert cmd[:5] == ["py", "-m", "sglang.bench_serving", "--backend", "sglang"]
    flags = dict(itertools.pairwise(cmd))  # each flag -> the word after it
    assert flags["--dataset-name"] == "sharegpt"
    assert flags["--num-prompts"] == "8"
    assert flags["--max-concurrency"] == "4"
    assert flags["--sharegpt-output-len"] == "64"
    assert flags["--temperature"] == "1"
    assert flags["--seed"] == "3"
    assert flags["--warmup-requests"] == "0"
    assert "--flush-cache" in cmd
    assert "--apply-chat-template" not in cmd  # the prompt file carries the template


# ------------------------------------------------------------------ server counters


def _metrics(accepted_sum: float, accepted_count: float, drafted: dict[str, float]) -> str:
    lines = [
        "# HELP dspark_accepted_length Tokens emitted per request per verify round",
        "# TYPE dspark_accepted_length histogram",
        f'dspark_accepted_length_bucket{{le="+Inf"}} {accepted_count}',
        f"dspark_accepted_length_sum {accepted_sum}",
        f"dspark_accepted_length_count {accepted_count}",
    ]
    if drafted:
        lines += [
            "# HELP dspark_draft_request_steps_total Request-steps by whether they drafted",
            "# TYPE dspark_draft_request_steps_total counter",
        ]
        lines += [
            f'dspark_draft_request_steps_total{{drafted="{k}"}} {v}' for k, v in drafted.items()
        ]
    lines += ["# TYPE sglang:num_requests_total counter", 'sglang:num_requests_total{a="b"} 5']
    return "\n".join(lines) + "\n"


def test_counters_are_read_as_the_cells_difference() -> None:
    before = lf_client.parse_prometheus(_metrics(100.0, 50.0, {"true": 40.0, "false": 10.0}))
    after = lf_client.parse_prometheus(_metrics(130.0, 62.0, {"true": 49.0, "false": 13.0}))
    got = lf_client.cell_counters(before, after)
    assert got["accept_length"] == pytest.approx(30.0 / 12.0)  # 2.5, not 130 / 62
    assert got["drafted_share"] == pytest.approx(9.0 / 12.0)
    assert lf_client.sample_sum(after, "sglang:num_requests_total") == 5


def test_counters_a_server_lacks_are_null() -> None:
    plain = lf_client.parse_prometheus("# TYPE sglang:x counter\nsglang:x_total 3\n")
    assert lf_client.cell_counters(plain, plain) == {"accept_length": None, "drafted_share": None}
    no_steps = lf_client.parse_prometheus(_metrics(10.0, 5.0, {}))
    got = lf_client.cell_counters(no_steps, lf_client.parse_prometheus(_metrics(16.0, 8.0, {})))
    assert got == {"accept_length": 2.0, "drafted_share": None}
    idle = lf_client.parse_prometheus(_metrics(10.0, 5.0, {"true": 1.0}))
    assert lf_client.cell_counters(idle, idle) == {"accept_length": None, "drafted_share": None}


# ------------------------------------------------------------------ rows


def _fig(out: float, tpot: float, ttft: float = 100.0, accept: float | None = None) -> dict:
    return {
        "output_tok_s": out,
        "median_tpot_ms": tpot,
        "user_tok_s": 1000.0 / tpot,
        "median_ttft_ms": ttft,
        "accept_length": accept,
        "drafted_share": None if accept is None else 1.0,
    }


def test_rows_take_the_median_and_range_over_repeats_and_the_ratio_per_repeat() -> None:
    """Plain 10 / 20 / 40 tok/s, prefix 30 / 22 / 40: per-repeat ratios 3.0 / 1.1 / 1.0,
    median 1.1; the ratio of the medians would be 30 / 20 = 1.5."""
    cell = lf_rows.Cell("all", 2, 0.0)
    runs = {
        (cell, "plain"): [_fig(10, 100), _fig(20, 50), _fig(40, 25)],
        (cell, "prefix"): [_fig(30, 40, 90, 2.0), _fig(22, 50, 80, 3.0), _fig(40, 20, 70, 2.5)],
    }
    plain, prefix = lf_rows.build_rows(runs, ["plain", "prefix"])
    assert (prefix["prompt_set"], prefix["concurrency"], prefix["temperature"]) == ("all", 2, 0.0)
    assert prefix["engine"] == "prefix"
    assert prefix["ratio_to_plain"] == pytest.approx(1.1)
    assert prefix["ratio_to_plain_range"] == pytest.approx([1.0, 3.0])
    assert prefix["output_tok_s"] == 30
    assert prefix["output_tok_s_range"] == [22, 40]
    assert prefix["user_tok_s"] == pytest.approx(25.0)  # 1000 / 40: the median of 25, 20, 50
    assert prefix["median_ttft_ms"] == 80
    assert prefix["accept_length"] == 2.5
    assert prefix["accept_length_range"] == [2.0, 3.0]
    assert [r["ratio_to_plain"] for r in prefix["repeats"]] == pytest.approx([3.0, 1.1, 1.0])
    assert plain["ratio_to_plain"] == 1.0
    assert plain["accept_length"] is None and plain["accept_length_range"] is None
    with pytest.raises(ValueError, match="repeats"):
        lf_rows.build_rows({**runs, (cell, "plain"): runs[(cell, "plain")][:2]}, ["prefix"])


def test_engines_take_turns_reversed_in_odd_repeats() -> None:
    engines = ["plain", "mtp1", "prefix"]
    assert lf_rows.turn_order(engines, 0) == engines
    assert lf_rows.turn_order(engines, 1) == ["prefix", "mtp1", "plain"]
    assert lf_rows.turn_order(engines, 2) == engines


# ------------------------------------------------------------------ frontier


def _pt(out: float, user: float, c: int) -> Any:
    return lf_rows.Point(out, user, c)


def test_the_frontier_drops_dominated_points() -> None:
    """Concurrency 4 (15 tok/s, 7 tok/s/user) is beaten by 2 (20, 8) on both axes, and 16
    ties 8's throughput more slowly: both go; the rest trade speed for throughput."""
    pts = [_pt(10, 10, 1), _pt(20, 8, 2), _pt(15, 7, 4), _pt(30, 5, 8), _pt(30, 4, 16)]
    front = lf_rows.engine_frontier(pts)
    assert [p.concurrency for p in front] == [1, 2, 8]
    assert lf_rows.engine_frontier([_pt(10, 10, 1), _pt(10, 10, 2)]) == [_pt(10, 10, 1)]


def test_matched_throughput_speedup_interpolates_each_frontier() -> None:
    """By hand. mtp1's frontier: (10 tok/s, 10 tok/s/user), (30, 6). The engine's: (20, 12),
    (40, 4). At 10 tok/s the engine's frontier starts above it (20 tok/s), so its fastest
    point's 12 applies: 12 / 10 = 1.2. At 30 tok/s it lies halfway from (20, 12) to (40, 4):
    12 + (30 - 20) / (40 - 20) x (4 - 12) = 8, so 8 / 6 = 1.333."""
    mtp1 = [_pt(10, 10, 1), _pt(30, 6, 4), _pt(20, 5, 2)]  # (20, 5) is dominated
    engine = [_pt(20, 12, 1), _pt(40, 4, 4)]
    got = lf_rows.matched_throughput_speedup(engine, mtp1)
    assert [g["output_tok_s"] for g in got] == [10, 30]
    assert [g["user_tok_s"] for g in got] == pytest.approx([12.0, 8.0])
    assert [g["baseline_user_tok_s"] for g in got] == pytest.approx([10.0, 6.0])
    assert [g["speedup"] for g in got] == pytest.approx([1.2, 8.0 / 6.0])
    # A frontier that never reaches the baseline's throughput has no speed-up there.
    short = lf_rows.matched_throughput_speedup([_pt(20, 12, 1)], mtp1)
    assert [g["speedup"] for g in short] == [pytest.approx(1.2), None]


def test_frontiers_group_rows_by_prompt_set_and_temperature() -> None:
    def row(engine: str, c: int, out: float, user: float, t: float = 0.0) -> dict:
        return {"prompt_set": "all", "temperature": t, "engine": engine, "concurrency": c,
                "output_tok_s": out, "user_tok_s": user}  # fmt: skip

    rows = [
        row("mtp1", 1, 10, 10),
        row("mtp1", 4, 30, 6),
        row("prefix", 1, 20, 12),
        row("prefix", 4, 40, 4),
        row("prefix", 2, 15, 7),
        row("prefix", 1, 99, 99, t=1.0),  # another panel: no mtp1 there
    ]
    fronts = {(f["engine"], f["temperature"]): f for f in lf_rows.frontiers(rows)}
    prefix = fronts[("prefix", 0.0)]
    assert [p["concurrency"] for p in prefix["points"]] == [1, 4]
    assert [x["speedup"] for x in prefix["vs_mtp1"]] == pytest.approx([1.2, 8.0 / 6.0])
    assert prefix["speedup_vs_mtp1_median"] == pytest.approx((1.2 + 8.0 / 6.0) / 2)
    assert [x["speedup"] for x in fronts[("mtp1", 0.0)]["vs_mtp1"]] == [1.0, 1.0]
    assert fronts[("prefix", 1.0)]["vs_mtp1"] is None


# ------------------------------------------------------------------ engines and the chart


def test_engine_names_map_to_policies() -> None:
    assert lf_engines.engine_policy("sglang") == (None, False)
    assert lf_engines.engine_policy("whole_block") == ("verify_all", False)
    assert lf_engines.engine_policy("mtp1") == ("mtp1", False)
    assert lf_engines.engine_policy("prefix+priced") == ("prefix", True)
    assert lf_engines.engine_policy("lagged+priced") == ("lagged", True)
    with pytest.raises(ValueError):
        lf_engines.engine_policy("plain")
    assert lf_engines.default_engine({"policy": "lagged"}) == "lagged"
    assert (
        lf_engines.default_engine({"policy": "lagged", "draftDecision": "priced"})
        == "lagged+priced"
    )
    assert lf_engines.default_engine({"policy": "prefix", "draftDecision": "always"}) == "prefix"
    assert lf_engines.default_engine({"policy": "verify_all"}) == "whole_block"


def test_every_engines_config_is_the_default_tiers_with_its_policy() -> None:
    """The chart's default tier (the shipped values) with each engine's policy is a config
    the scheduler accepts; priced exactly for the ``*+priced`` engines, whatever the tier's
    own ``draftDecision``; the tier's admission cap left out."""
    from dspark_sglang.scheduling.config import SchedulerConfig

    shipped = lf_engines.default_tier(yaml.safe_load(VALUES.read_text()))
    scheduler = {k: v for k, v in shipped["scheduler"].items() if k != "draftDecision"}
    for decision in (None, "always", "priced"):
        extra = {} if decision is None else {"draftDecision": decision}
        tier = {**shipped, "scheduler": {**scheduler, **extra}}
        fields = lf_engines.tier_config_fields(tier)
        assert "max_running_requests" not in fields
        assert fields["sla_name"] == tier["name"]
        assert fields["block_size"] == tier["scheduler"]["blockSize"]
        assert lf_engines.engine_config_fields("sglang", fields, "sts.json", None) is None
        for engine in lf_engines.ENGINES[1:]:
            cfg_fields = lf_engines.engine_config_fields(engine, fields, "/d/sts.json", None)
            if cfg_fields is None:
                continue
            cfg = SchedulerConfig.from_dict(cfg_fields, source=engine)
            policy, priced = lf_engines.engine_policy(engine)
            assert cfg.policy == policy
            assert cfg.draft_decision == ("priced" if priced else "always"), (engine, decision)
            assert cfg.max_verify_tokens == tier["scheduler"]["maxVerifyTokens"]
            assert cfg.ragged_verify_mode == ("static" if policy == "verify_all" else "compact")
            assert cfg.sts_path == (None if policy == "verify_all" else "/d/sts.json")
    with_table = lf_engines.engine_config_fields("mtp1", fields, None, "/t.json")
    assert with_table is not None and with_table["cost_table_path"] == "/t.json"


# ------------------------------------------------------------------ prompts


def test_prompt_sets_select_by_id_prefix() -> None:
    items = json.loads(PROMPTS.read_text(encoding="utf-8"))
    assert len(items) == 96
    every = lf_engines.select_prompts(items, "all")
    math_code = lf_engines.select_prompts(items, "math_code")
    assert every == items
    assert len(math_code) == 64
    assert {it["id"].split("-")[0] for it in math_code} == {"gsm8k", "humaneval"}
    assert {it["id"].split("-")[0] for it in items} == {"gsm8k", "humaneval", "mtbench"}
    for it in items:
        human, gpt = it["conversations"]
        assert (human["from"], gpt["from"]) == ("human", "gpt")
        assert human["value"].startswith("<|im_start|>") and human["value"].endswith(
            "<|im_start|>assistant\n"
        )
    with pytest.raises(ValueError, match="unknown prompt set"):
        lf_engines.select_prompts(items, "chat_only")
    assert (
        lf_engines.num_prompts(1) == 8
        and lf_engines.num_prompts(32) == 64
        and lf_engines.num_prompts(4, 5) == 5
    )


@pytest.mark.slow
def test_the_committed_prompt_file_is_what_the_builder_writes_and_bench_serving_keeps() -> None:
    from sglang.benchmark.datasets.sharegpt import sample_sharegpt_requests
    from transformers import AutoTokenizer

    from dspark_sglang.targets.smollm2 import ensure_smollm2

    make = load_benchmark("make_mixed_prompts", "make_mixed_prompts_bench")
    tokenizer = AutoTokenizer.from_pretrained(ensure_smollm2())
    assert make.build(tokenizer, 32) == json.loads(PROMPTS.read_text(encoding="utf-8"))
    kept = sample_sharegpt_requests(str(PROMPTS), 96, tokenizer, fixed_output_len=64)
    assert len(kept) == 96
    assert all(r.output_len == 64 for r in kept)
