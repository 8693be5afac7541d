"""The CPU speed benchmark's engine-free parts (``benchmarks/cpu_speedup.py``).

Covered without an engine: which prompts each cell sends (its own, distinct from every
other cell's, too small a set refused), how a cell splits them into calls of exactly
``concurrency`` requests, the rotated engine order, the rows built from per-repeat runs
(ratio per repeat then median and range, accepted length, the greedy identical verdict,
the NGRAM note at temperature > 0), the row contract (``check_row``), the flag checks, and
(``slow``: it reads the SmolLM2 target) what every engine would be started with. No test
starts the engines: even the smallest grid starts three, several minutes on a shared
2-core machine; run the script with ``--sets gsm8k --prompts-per-cell 1 --concurrency 1
--temperatures 0 --policies sglang --repeats 1 --max-new-tokens 8`` for that.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from bench_scripts import load_benchmark

from dspark_sglang.sglang_integration.demo_report import EngineRun
from dspark_sglang.sglang_integration.greedy_check import TopTokens

REPO = Path(__file__).resolve().parents[2]


bench = load_benchmark("cpu_speedup", "cpu_speedup_bench")

GREEDY = bench.Cell("gsm8k", 2, 0.0)
SAMPLED = bench.Cell("gsm8k", 2, 1.0)
DSPARK = bench.Engine(bench.DSPARK, "sglang")
NGRAM = bench.Engine(bench.NGRAM)


def _run(
    tok_s: float,
    outputs: tuple[tuple[int, ...], ...],
    verify_rounds: int = 0,
    top_tokens: tuple[tuple[TopTokens | None, ...], ...] = (),
) -> EngineRun:
    """An EngineRun of ``outputs`` whose tokens/s is ``tok_s``."""
    tokens = sum(len(o) for o in outputs)
    return EngineRun(
        label="x",
        outputs=outputs,
        wall_s=tokens / tok_s,
        verify_rounds=verify_rounds,
        correct_drafts=tokens - verify_rounds if verify_rounds else 0,
        accepted_histogram=(),
        top_tokens=top_tokens,
    )


SAME = ((1, 2, 3, 4), (5, 6, 7, 8))
OTHER = ((1, 2, 3, 4), (5, 6, 7, 9))
#: The target's top two along SAME's outputs: a confident token everywhere (margin 3)
#: except the last token of the second output, where 8 and 9 are 0.25 apart.
PLAIN_TOP_TOKENS = (
    tuple(TopTokens((t, 100 + t), (-0.1, -3.1)) for t in SAME[0]),
    (
        *(TopTokens((t, 100 + t), (-0.1, -3.1)) for t in SAME[1][:3]),
        TopTokens((8, 9), (-0.6, -0.85)),
    ),
)


def _runs(spec_outputs_repeat_1: tuple[tuple[int, ...], ...] = SAME) -> dict[str, Any]:
    """Three repeats; plain 10/20/40 tok/s, DSPARK_MOE 30/22/40, NGRAM 12/24/44."""
    plain_tps, dspark_tps, ngram_tps = (10, 20, 40), (30, 22, 40), (12, 24, 44)
    # DSPARK_MOE: 8 tokens in 4, 2, 5 verify rounds -> accepted length 2, 4, 1.6
    rounds = (4, 2, 5)
    runs: dict[str, Any] = {bench.PLAIN: [], DSPARK.label: [], NGRAM.label: []}
    for r in range(3):
        dspark_out = spec_outputs_repeat_1 if r == 1 else SAME
        runs[bench.PLAIN].append(
            {c: _run(plain_tps[r], SAME, top_tokens=PLAIN_TOP_TOKENS) for c in (GREEDY, SAMPLED)}
        )
        runs[DSPARK.label].append(
            {c: _run(dspark_tps[r], dspark_out, rounds[r]) for c in (GREEDY, SAMPLED)}
        )
        runs[NGRAM.label].append({c: _run(ngram_tps[r], SAME, 8) for c in (GREEDY, SAMPLED)})
    return runs


# ------------------------------------------------------------------ grid and order


def test_a_cell_must_hold_its_concurrency() -> None:
    bench.check_cell_size(8, 8)
    with pytest.raises(ValueError, match="prompts-per-cell"):
        bench.check_cell_size(2, 4)
    with pytest.raises(ValueError, match="concurrency"):
        bench.check_cell_size(2, 0)


def test_every_cell_of_a_set_gets_its_own_prompts_in_grid_order() -> None:
    """Cell j of a set takes prompts j*n .. j*n+n-1: no prompt is sent in two cells, so
    NGRAM cannot replay a continuation it generated for the same prompt in another cell."""
    cells = bench.grid(["gsm8k", "mtbench"], [1, 4], [0, 1])
    slices = bench.cell_prompt_slices(cells, 4)
    assert list(slices) == cells
    gsm8k = [slices[c] for c in cells if c.prompt_set == "gsm8k"]
    assert gsm8k == [range(0, 4), range(4, 8), range(8, 12), range(12, 16)]
    assert slices[bench.Cell("gsm8k", 4, 0.0)] == range(8, 12)
    assert slices[bench.Cell("mtbench", 1, 0.0)] == range(0, 4)  # each set counts its own
    for name in ("gsm8k", "mtbench"):
        used = [i for c in cells if c.prompt_set == name for i in slices[c]]
        assert len(used) == len(set(used)) == 16
    # The prompts themselves: set-tagged stand-ins for the encoded ones.
    per_set = {s: [f"{s}-{i}" for i in range(16)] for s in ("gsm8k", "mtbench")}
    prompts = bench.cell_prompts(cells, per_set, 4)
    assert prompts[bench.Cell("gsm8k", 1, 1.0)] == ["gsm8k-4", "gsm8k-5", "gsm8k-6", "gsm8k-7"]
    assert prompts[bench.Cell("mtbench", 4, 1.0)] == [f"mtbench-{i}" for i in range(12, 16)]
    sent = [p for ps in prompts.values() for p in ps]
    assert len(sent) == len(set(sent)) == 32
    # Built once per run from the grid alone: every engine sends the same prompts.
    assert bench.cell_prompts(cells, per_set, 4) == prompts
    assert bench.prompts_needed(cells, 4) == {"gsm8k": 16, "mtbench": 16}
    assert bench.prompts_needed(bench.grid(["humaneval"], [1, 4, 8], [0]), 8) == {"humaneval": 24}
    with pytest.raises(ValueError, match="prompts-per-cell"):
        bench.cell_prompt_slices(cells, 0)
    with pytest.raises(ValueError, match="twice"):
        bench.cell_prompt_slices([*cells, cells[0]], 4)


def test_a_set_too_small_for_the_grid_is_refused_naming_the_flags() -> None:
    cells = bench.grid(["gsm8k", "mtbench"], [1, 4], [0])
    short = {"gsm8k": list(range(8)), "mtbench": list(range(7))}
    with pytest.raises(ValueError, match="'mtbench' has 7 prompts; the grid needs 8"):
        bench.cell_prompts(cells, short, 4)
    with pytest.raises(ValueError, match="'mtbench' has 0 prompts"):
        bench.cell_prompts(cells, {"gsm8k": list(range(8))}, 4)
    assert len(bench.cell_prompts(cells, {**short, "mtbench": list(range(9))}, 4)) == 4
    bench.check_set_size("mtbench", 80, 48, 8)
    bench.check_set_size("mtbench", 48, 48, 8)
    with pytest.raises(ValueError) as exc:
        bench.check_set_size("mtbench", 47, 48, 8)
    message = str(exc.value)
    assert "'mtbench' has 47 prompts; the grid needs 48" in message
    assert "6 cells" in message
    for flag in ("--prompts-per-cell", "--concurrency", "--temperatures"):
        assert flag in message


def test_engine_order_rotates_one_place_per_repeat() -> None:
    names = [e.label for e in bench.engines(["sglang", "mtp1"], ngram=True)]
    assert names == ["plain", "DSPARK_MOE/sglang", "DSPARK_MOE/mtp1", "NGRAM"]
    assert bench.rotated(names, 0) == names
    assert bench.rotated(names, 1) == ["DSPARK_MOE/sglang", "DSPARK_MOE/mtp1", "NGRAM", "plain"]
    assert bench.rotated(names, 4) == names
    firsts = {bench.rotated(names, r)[0] for r in range(4)}
    assert firsts == set(names)
    assert [e.label for e in bench.engines([], ngram=True)] == ["plain", "NGRAM"]
    assert [e.label for e in bench.engines(["prefix"], ngram=False)] == [
        "plain",
        "DSPARK_MOE/prefix",
    ]
    with pytest.raises(ValueError, match="policy"):
        bench.Engine(bench.NGRAM, "prefix")
    with pytest.raises(ValueError, match="policy"):
        bench.Engine(bench.DSPARK)


def test_grid_is_set_major() -> None:
    cells = bench.grid(["gsm8k", "mtbench"], [1, 4], [0, 1])
    assert len(cells) == 8
    assert cells[0] == bench.Cell("gsm8k", 1, 0.0)
    assert cells[1] == bench.Cell("gsm8k", 1, 1.0)
    assert cells[-1] == bench.Cell("mtbench", 4, 1.0)


# ------------------------------------------------------------------ rows


def test_rows_take_the_ratio_per_repeat_then_its_median_and_range() -> None:
    rows = bench.build_rows(_runs(), [GREEDY, SAMPLED], [DSPARK, NGRAM])
    assert [(r["temperature"], r["algorithm"], r["policy"]) for r in rows] == [
        (0.0, "DSPARK_MOE", "sglang"),
        (0.0, "NGRAM", None),
        (1.0, "DSPARK_MOE", "sglang"),
        (1.0, "NGRAM", None),
    ]
    row = rows[0]
    # ratios per repeat 3.0, 1.1, 1.0: median 1.1 (the ratio of the medians would be 1.5)
    assert row["ratio"] == pytest.approx(1.1)
    assert (row["ratio_min"], row["ratio_max"]) == pytest.approx((1.0, 3.0))
    assert row["plain_tok_s"] == pytest.approx(20.0)
    assert row["dspark_tok_s"] == pytest.approx(30.0)
    assert (row["plain_tok_s_min"], row["plain_tok_s_max"]) == pytest.approx((10.0, 40.0))
    assert row["accept_length"] == pytest.approx(2.0)  # median of 2, 4, 1.6
    assert row["identical"] is True
    assert row["note"] is None
    assert [x["ratio"] for x in row["repeats"]] == pytest.approx([3.0, 1.1, 1.0])
    assert [x["verify_rounds"] for x in row["repeats"]] == [4, 2, 5]
    assert [x["identical_outputs"] for x in row["repeats"]] == [2, 2, 2]
    assert row["repeats"][0]["plain_tokens"] == 8
    assert row["repeats"][0]["dspark_wall_s"] == pytest.approx(8 / 30)
    ngram = rows[1]
    assert ngram["dspark_tok_s"] == pytest.approx(24.0)
    assert ngram["ratio"] == pytest.approx(1.2)
    assert ngram["accept_length"] == pytest.approx(1.0)
    for r in rows:
        assert set(bench.ROW_KEYS) <= set(r)
        bench.check_row(r)
    assert rows[2]["identical"] is None and rows[3]["identical"] is None
    assert rows[2]["note"] is None
    assert rows[3]["note"] == bench.NGRAM_SAMPLED_NOTE
    assert bench.not_identical(rows) == []


def test_one_differing_output_in_one_repeat_makes_the_greedy_row_not_identical() -> None:
    rows = bench.build_rows(_runs(OTHER), [GREEDY, SAMPLED], [DSPARK, NGRAM])
    by = {(r["temperature"], r["algorithm"]): r for r in rows}
    bad = by[(0.0, "DSPARK_MOE")]
    assert bad["identical"] is False
    assert [x["identical_outputs"] for x in bad["repeats"]] == [2, 1, 2]
    assert by[(0.0, "NGRAM")]["identical"] is True
    assert by[(1.0, "DSPARK_MOE")]["identical"] is None  # sampled outputs are not compared
    assert bench.not_identical(rows) == [bad]
    text = bench.table(rows)
    assert "NO" in text.splitlines()[2] and "yes" in text.splitlines()[3]


@pytest.mark.parametrize(
    ("dtype", "lossless", "verdict"),
    [("bfloat16", True, "near-ties"), ("float32", False, "NO")],
)
def test_a_divergence_at_a_near_tie_is_lossless_only_within_the_dtypes_rounding(
    dtype: str, lossless: bool, verdict: str
) -> None:
    """OTHER differs from plain at the one position where the target's top two (8, 9) are
    0.25 apart: within bfloat16's tolerance (0.5), far above float32's (1e-3)."""
    rows = bench.build_rows(_runs(OTHER), [GREEDY], [DSPARK, NGRAM], dtype)
    bad, ngram = rows
    assert bad["identical"] is False and bad["lossless"] is lossless
    assert [x["near_ties"] for x in bad["repeats"]] == [0, int(lossless), 0]
    assert [x["mismatches"] for x in bad["repeats"]] == [0, int(not lossless), 0]
    assert (
        "prompt 1, token 3: plain 8 vs DSPARK_MOE/sglang 9" in bad["repeats"][1]["divergences"][0]
    )
    assert ngram["identical"] is True and ngram["lossless"] is True
    bench.check_row(bad)
    assert bench.not_lossless(rows) == ([] if lossless else [bad])
    assert verdict in bench.table(rows).splitlines()[2]


def test_a_divergence_without_the_targets_top_tokens_is_not_lossless() -> None:
    runs = _runs(OTHER)
    runs[bench.PLAIN][1][GREEDY] = _run(20, SAME)  # no top two computed
    row = bench.build_rows(runs, [GREEDY], [DSPARK], "bfloat16")[0]
    assert row["lossless"] is False
    assert "unknown" in row["repeats"][1]["divergences"][0]


def test_rows_refuse_mismatched_runs() -> None:
    runs = _runs()
    with pytest.raises(ValueError, match="no plain"):
        bench.build_rows({DSPARK.label: runs[DSPARK.label]}, [GREEDY], [DSPARK])
    short = {**runs, NGRAM.label: runs[NGRAM.label][:2]}
    with pytest.raises(ValueError, match="NGRAM has 2 repeats, plain has 3"):
        bench.build_rows(short, [GREEDY], [NGRAM])
    fewer = _runs()
    fewer[DSPARK.label][0][GREEDY] = _run(30, SAME[:1], 2)
    with pytest.raises(ValueError, match="plain has 2 outputs"):
        bench.build_rows(fewer, [GREEDY], [DSPARK])


def _good_row() -> dict[str, Any]:
    return bench.build_rows(_runs(), [GREEDY], [DSPARK])[0]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"policy": None}, "policy must name"),
        ({"algorithm": "NGRAM"}, "policy must be null"),
        ({"algorithm": "EAGLE"}, "algorithm must be"),
        ({"identical": None}, "identical must be true or false"),
        ({"lossless": None}, "lossless must be true or false"),
        ({"lossless": False}, "identical outputs are lossless"),
        ({"temperature": 1.0}, "identical must be null"),
        ({"temperature": 1.0, "identical": None}, "lossless must be null"),
        ({"ratio": 5.0}, r"ratio must lie in \[ratio_min, ratio_max\]"),
        ({"plain_tok_s": float("nan")}, "plain_tok_s must be a positive finite number"),
        ({"dspark_tok_s": 0.0}, "dspark_tok_s must be a positive finite number"),
        ({"accept_length": 0.5}, "accept_length"),
        ({"concurrency": 0}, "concurrency"),
    ],
)
def test_check_row_names_the_broken_field(change: dict[str, Any], message: str) -> None:
    bench.check_row(_good_row())
    with pytest.raises(ValueError, match=message):
        bench.check_row({**_good_row(), **change})


def test_check_row_names_missing_keys() -> None:
    row = _good_row()
    del row["ratio_max"]
    with pytest.raises(ValueError, match="ratio_max"):
        bench.check_row(row)


# ------------------------------------------------------------------ flags


def test_defaults_are_the_full_grid() -> None:
    args = bench.parse_args([])
    assert args.sets == ["gsm8k", "humaneval", "mtbench"]
    assert args.concurrency == [1, 4, 8]
    assert args.temperatures == [0.0, 1.0]
    assert args.policies == ["sglang", "mtp1", "prefix"]
    assert args.ngram is True
    assert (args.prompts_per_cell, args.max_new_tokens, args.repeats) == (8, 64, 3)
    assert (args.dtype, args.threads, args.out) == ("auto", 1, None)
    small = bench.parse_args(
        ["--concurrency", "1", "4", "--temperatures", "0", "--policies", "--prompts-per-cell", "4"]
    )
    assert small.concurrency == [1, 4] and small.temperatures == [0.0] and small.policies == []
    # Context copies: on for an all-greedy grid, off when a cell samples, unless given.
    assert args.context_copy == 0 and small.context_copy == 2
    assert bench.parse_args(["--context-copy", "3"]).context_copy == 3


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--concurrency", "1", "16"], "--prompts-per-cell 8 cannot fill a call at concurrency 16"),
        (["--concurrency", "1", "1"], "--concurrency lists a value twice"),
        (["--concurrency", "0"], "--concurrency levels must be >= 1"),
        (["--temperatures", "-1"], "--temperatures must be finite and >= 0"),
        (["--repeats", "0"], "--repeats must be >= 1"),
        (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
        (["--policies", "--no-ngram"], "nothing to compare"),
        (["--policies", "static"], "--static-k"),
        (["--static-k", "2"], "--static-k"),
        (["--policies", "sglang", "mtp1", "--cost-table", "x.json"], "--cost-table feeds"),
        (["--policies", "sglang", "--sts", "x.json"], "--sts feeds our policies"),
        (["--sts", "/nonexistent/sts.json"], "--sts /nonexistent/sts.json: no such file"),
        (["--mem-fraction-static", "1.5"], "--mem-fraction-static must be in"),
        (["--sets", "gsm8k", "gsm8k"], "--sets lists a value twice"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


# ------------------------------------------------------------------ engine specs


@pytest.mark.slow
def test_engine_specs_share_one_base_and_route_each_policy(
    smollm2_path: Path, tmp_path: Path
) -> None:
    """What each engine would be started with (no engine starts): the same server settings
    for all, DSPARK_MOE's environment from ``scheduler_env`` alone, our policies through a
    config with the drafter's STS, ``prefix`` without a table measuring one at start-up."""
    from dspark_sglang.scheduling.config import SchedulerConfig
    from dspark_sglang.sglang_integration.cpu_dtype import choose_cpu_dtype
    from dspark_sglang.sglang_integration.launch import CONFIG_ENV, GREEDY_DRAFT_ENV, scheduler_env
    from dspark_sglang.targets.smollm2 import DEFAULT_DRAFTER_DIR

    args = bench.parse_args(["--seed", "3", "--threads", "2"])
    all_engines = bench.engines(args.policies, args.ngram)
    specs, configs, drafter = bench.engine_specs(
        args, all_engines, smollm2_path, choose_cpu_dtype("float32", None), str(tmp_path)
    )
    assert drafter == DEFAULT_DRAFTER_DIR
    labels = ["plain", "DSPARK_MOE/sglang", "DSPARK_MOE/mtp1", "DSPARK_MOE/prefix", "NGRAM"]
    assert list(specs) == labels
    plain = specs["plain"]
    assert plain.env == {} and plain.omp_threads == 2
    assert plain.overrides["random_seed"] == 3 and plain.overrides["dtype"] == "float32"
    # A repeat's engines are alive together and take turns: the waiting ones must sleep.
    assert plain.overrides["sleep_on_idle"] is True
    spec_keys = {"speculative_algorithm", "speculative_draft_model_path"}
    for label, spec in specs.items():
        assert spec.model_path == str(smollm2_path)
        common = {k: v for k, v in spec.overrides.items() if k not in spec_keys}
        assert common == plain.overrides, label
    assert specs["NGRAM"].overrides["speculative_algorithm"] == "NGRAM"
    assert "speculative_draft_model_path" not in specs["NGRAM"].overrides
    assert specs["NGRAM"].env == {}
    own = specs["DSPARK_MOE/sglang"]
    assert own.overrides["speculative_draft_model_path"] == str(DEFAULT_DRAFTER_DIR)
    assert own.env == scheduler_env(None) and configs["sglang"] is None
    for policy in ("mtp1", "prefix"):
        env = specs[f"DSPARK_MOE/{policy}"].env
        assert env == scheduler_env(env[CONFIG_ENV])
        cfg = SchedulerConfig.load(env[CONFIG_ENV])
        assert cfg.policy == policy and configs[policy]["policy"] == policy
        assert cfg.sts_path == str((DEFAULT_DRAFTER_DIR / "sts.json").resolve())
    prefix = SchedulerConfig.load(specs["DSPARK_MOE/prefix"].env[CONFIG_ENV])
    assert prefix.cost_table_path is None and prefix.profiles_at_startup
    # The default grid mixes temperatures: one engine per policy samples its drafts.
    assert all(
        not SchedulerConfig.load(specs[f"DSPARK_MOE/{p}"].env[CONFIG_ENV]).greedy_only
        for p in ("mtp1", "prefix")
    )
    assert own.env[GREEDY_DRAFT_ENV] == "0"


@pytest.mark.slow
def test_an_all_greedy_grid_runs_greedy_only_tiers_with_argmax_drafts(
    smollm2_path: Path, tmp_path: Path
) -> None:
    """Temperature 0 alone is what a greedy-only tier serves: every DSPARK_MOE engine
    drafts by argmax, with its policy's config saying greedy_only."""
    from dspark_sglang.scheduling.config import SchedulerConfig
    from dspark_sglang.sglang_integration.cpu_dtype import choose_cpu_dtype
    from dspark_sglang.sglang_integration.launch import CONFIG_ENV, GREEDY_DRAFT_ENV

    args = bench.parse_args(["--temperatures", "0", "--policies", "sglang", "prefix"])
    all_engines = bench.engines(args.policies, args.ngram)
    specs, _, _ = bench.engine_specs(
        args, all_engines, smollm2_path, choose_cpu_dtype("float32", None), str(tmp_path)
    )
    assert specs["DSPARK_MOE/sglang"].env[GREEDY_DRAFT_ENV] == "1"
    prefix = specs["DSPARK_MOE/prefix"].env
    assert prefix[GREEDY_DRAFT_ENV] == "1"
    assert SchedulerConfig.load(prefix[CONFIG_ENV]).greedy_only


# ------------------------------------------------------------------ the committed result


def test_the_committed_result_agrees_with_its_own_repeats() -> None:
    """Every row of ``benchmarks/results/cpu_speedup.json`` keeps the contract, and its
    figures are recomputed from the per-repeat token counts and wall times stored beside
    them (tok/s, the per-repeat ratio, its median and range, the greedy verdict)."""
    import json
    import statistics

    path = REPO / "benchmarks" / "results" / "cpu_speedup.json"
    result = json.loads(path.read_text(encoding="utf-8"))
    rows = result["rows"]
    assert rows, "the committed result has no rows"
    for row in rows:
        bench.check_row(row)
        per = row["repeats"]
        assert len(per) == result["settings"]["repeats"]
        ratios = []
        for rep in per:
            plain = rep["plain_tokens"] / rep["plain_wall_s"]
            spec = rep["dspark_tokens"] / rep["dspark_wall_s"]
            assert rep["plain_tok_s"] == pytest.approx(plain, rel=1e-9)
            assert rep["dspark_tok_s"] == pytest.approx(spec, rel=1e-9)
            assert rep["ratio"] == pytest.approx(spec / plain, rel=1e-9)
            ratios.append(spec / plain)
        assert row["ratio"] == pytest.approx(statistics.median(ratios), rel=1e-9)
        assert (row["ratio_min"], row["ratio_max"]) == pytest.approx((min(ratios), max(ratios)))
        if row["temperature"] == 0:
            assert row["identical"] == all(r["identical_outputs"] == r["outputs"] for r in per)
            assert row["lossless"] == all(r["mismatches"] == 0 for r in per)
            for r in per:
                assert r["near_ties"] + r["mismatches"] == r["outputs"] - r["identical_outputs"]
                assert len(r["divergences"]) == r["outputs"] - r["identical_outputs"]
