"""The SGLang demo's pieces that need no engine: figures, the greedy verdict, the --policy route.

The demo end to end (plain and one CPU engine per verify policy) is tested through the CLI in
``tests/cli/test_cli_demo.py``.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from dspark_sglang.calibration.sts import StsCalibration
from dspark_sglang.cli import build_parser
from dspark_sglang.cli.base import resolve_context_copy
from dspark_sglang.model.context_copy import DEFAULT_NGRAM
from dspark_sglang.scheduling.config import SchedulerConfig
from dspark_sglang.sglang_integration.cpu_dtype import choose_cpu_dtype
from dspark_sglang.sglang_integration.demo import (
    DemoEngine,
    DemoError,
    DemoPlan,
    cost_table_dtype,
    demo_policies,
    flush_radix_cache,
    write_scheduler_config,
)
from dspark_sglang.sglang_integration.demo_report import EngineRun, report
from dspark_sglang.sglang_integration.greedy_check import NEAR_TIE_TOLERANCE, TopTokens
from dspark_sglang.sglang_integration.launch import (
    GREEDY_STS_FILENAME,
    SGLANG_DECISION,
    STS_FILENAME,
    drafter_sts,
    scheduler_env,
)


def test_engine_run_aggregates_sglang_meta_info() -> None:
    outputs = [
        {
            "output_ids": [5, 6, 7, 8, 9],
            "meta_info": {
                "spec_verify_ct": 3,
                "spec_num_correct_drafts": 1,
                "spec_correct_drafts_histogram": [2, 1],
            },
        },
        # finished at prefill: SGLang sends no spec_* keys for it
        {"output_ids": [4], "meta_info": {"completion_tokens": 1}},
        {
            "output_ids": [1, 2, 3],
            "meta_info": {
                "spec_verify_ct": 2,
                "spec_num_correct_drafts": 0,
                "spec_correct_drafts_histogram": [2],
            },
        },
    ]
    run = EngineRun.from_outputs("DSPARK_MOE", outputs, wall_s=2.0)
    assert run.outputs == ((5, 6, 7, 8, 9), (4,), (1, 2, 3))
    assert run.num_tokens == 9 and run.tokens_per_second == 4.5
    assert (run.verify_rounds, run.correct_drafts) == (5, 1)
    assert run.accept_length == pytest.approx(9 / 5)
    assert run.accepted_histogram == (4, 1)
    plain = EngineRun.from_outputs("plain", [{"output_ids": [1, 2], "meta_info": {}}], 1.0)
    assert plain.verify_rounds == 0 and math.isnan(plain.accept_length)


def _args(**kw: object) -> argparse.Namespace:
    base: dict[str, object] = {"policy": None, "static_k": 3, "cost_table": None, "sts": None}
    base.update(kw)
    return argparse.Namespace(**base)


def _drafter_dir(tmp_path: Path, block_size: int, sts_block: int | None) -> Path:
    folder = tmp_path / "drafter"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"dspark_config": {"block_size": block_size}}))
    if sts_block is not None:
        StsCalibration(temperatures=(1.5,) * sts_block).save(folder / STS_FILENAME)
    return folder


def _plan(tmp_path: Path, scheduler_config: Path | None) -> DemoPlan:
    return DemoPlan(
        model_path=tmp_path,
        drafter_dir=tmp_path,
        trained=True,
        prompts=((1, 2),),
        max_new_tokens=4,
        omp_threads=1,
        passes=1,
        concurrency=1,
        engines=(DemoEngine("x", scheduler_config),),
        dtype=choose_cpu_dtype("float32", None),
    )


def _demo_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["demo", *argv])


def test_the_demo_leads_with_the_charts_default_beside_the_whole_block_and_mtp1() -> None:
    assert demo_policies(_demo_args()) == ("lagged+priced", SGLANG_DECISION, "mtp1")
    # A lead named in --compare too runs once; --compare with no names runs the lead only.
    assert demo_policies(_demo_args("--policy", SGLANG_DECISION)) == (SGLANG_DECISION, "mtp1")
    assert demo_policies(_demo_args("--compare")) == ("lagged+priced",)
    assert demo_policies(_demo_args("--policy", "prefix", "--compare")) == ("prefix",)
    assert demo_policies(_demo_args("--policy", "static", "--compare", "mtp1", "mtp1")) == (
        "static",
        "mtp1",
    )
    with pytest.raises(SystemExit):
        _demo_args("--compare", "nope")


def test_several_engines_get_one_config_file_each(tmp_path: Path) -> None:
    drafter = _drafter_dir(tmp_path, 7, 7)
    quiet = Console(quiet=True)
    args = _demo_args()
    paths = {
        policy: write_scheduler_config(args, drafter, tmp_path, quiet, policy=policy)
        for policy in demo_policies(args)
    }
    assert paths[SGLANG_DECISION] is None  # SGLang's own decision: no config
    assert paths["lagged+priced"] != paths["mtp1"]
    for name, policy, decision in (
        ("lagged+priced", "lagged", "priced"),
        ("mtp1", "mtp1", "always"),
    ):
        path = paths[name]
        assert path is not None
        cfg = SchedulerConfig.load(path)
        assert (cfg.policy, cfg.draft_decision) == (policy, decision)
    env = DemoEngine(SGLANG_DECISION, None).env
    assert env["SGLANG_RAGGED_VERIFY_MODE"] == "static" and "DSPARK_SCHEDULER_CONFIG" not in env
    assert DemoEngine("mtp1", paths["mtp1"]).label == "DSPARK_MOE (mtp1)"


def test_without_policy_sglang_decides(tmp_path: Path) -> None:
    quiet = Console(quiet=True)
    assert write_scheduler_config(_args(), _drafter_dir(tmp_path, 7, 7), tmp_path, quiet) is None
    assert (
        write_scheduler_config(_args(policy=SGLANG_DECISION), tmp_path / "drafter", tmp_path, quiet)
        is None
    )
    assert scheduler_env(None) == {
        "SGLANG_RAGGED_VERIFY_MODE": "static",
        "SGLANG_DSPARK_USE_GREEDY_DRAFT": "0",
    }
    # Every demo request is greedy, so the demo's engine drafts by argmax all the same.
    assert _plan(tmp_path, None).dspark_env == {
        "SGLANG_RAGGED_VERIFY_MODE": "static",
        "SGLANG_DSPARK_USE_GREEDY_DRAFT": "1",
    }


def test_policy_becomes_a_scheduler_config_with_the_drafters_sts(tmp_path: Path) -> None:
    drafter = _drafter_dir(tmp_path, 5, 5)
    path = write_scheduler_config(
        _args(policy="static", static_k=2), drafter, tmp_path, Console(quiet=True)
    )
    assert path is not None
    cfg = SchedulerConfig.load(path)
    assert (cfg.policy, cfg.static_k, cfg.block_size) == ("static", 2, 5)
    assert cfg.sts_path == str((drafter / STS_FILENAME).resolve())
    # The demo sends only greedy requests: its tier is greedy-only, so it drafts by argmax.
    assert cfg.greedy_only and cfg.greedy_draft
    # The demo's engines run on CPU: only the chosen drafts are verified.
    assert cfg.ragged_mode == "compact"
    env = {
        "SGLANG_RAGGED_VERIFY_MODE": "compact",
        "SGLANG_DSPARK_USE_GREEDY_DRAFT": "1",
        "DSPARK_SCHEDULER_CONFIG": str(path),
    }
    assert scheduler_env(path) == env
    assert _plan(tmp_path, path).dspark_env == env


def test_a_greedy_only_tier_takes_the_drafters_greedy_sts(tmp_path: Path) -> None:
    """Greedy acceptance is not sampled acceptance: a greedy-only tier reads the drafter's
    fit on greedy rollouts when it ships one, every other tier its ``sts.json``."""
    drafter = _drafter_dir(tmp_path, 5, 5)
    greedy = drafter / GREEDY_STS_FILENAME
    StsCalibration(temperatures=(0.5,) * 5).save(greedy)
    quiet = Console(quiet=True)
    for greedy_only, expected in ((True, greedy), (False, drafter / STS_FILENAME)):
        work = tmp_path / f"work-{greedy_only}"
        work.mkdir()
        path = write_scheduler_config(
            _args(policy="prefix"), drafter, work, quiet, greedy_only=greedy_only
        )
        assert path is not None
        assert SchedulerConfig.load(path).sts_path == str(expected.resolve()), greedy_only
    # Without sts.json a sampling tier runs uncalibrated; a greedy tier still finds its own.
    (drafter / STS_FILENAME).unlink()
    assert drafter_sts(drafter, greedy_only=False) is None
    assert drafter_sts(drafter, greedy_only=True) == greedy
    # A greedy STS for another block size is refused like any other.
    StsCalibration(temperatures=(0.5,) * 4).save(greedy)
    with pytest.raises(DemoError, match="STS"):
        write_scheduler_config(_args(policy="prefix"), drafter, tmp_path, quiet)


def test_context_copies_go_into_every_policys_config(tmp_path: Path) -> None:
    drafter = _drafter_dir(tmp_path, 7, 7)
    quiet = Console(quiet=True)
    # On for greedy runs unless told otherwise (the SGLang demo is greedy), off when sampling.
    assert resolve_context_copy(_demo_args()) == DEFAULT_NGRAM
    assert resolve_context_copy(_demo_args("--engine", "reference", "--temperature", "1")) == 0
    assert resolve_context_copy(_demo_args("--temperature", "1", "--context-copy", "2")) == 2
    for argv, n in (
        ((), DEFAULT_NGRAM),
        (("--context-copy", "3"), 3),
        (("--context-copy", "0"), 0),
    ):
        work = tmp_path / f"w{n}"
        work.mkdir()
        args = _demo_args(*argv)
        args.context_copy = resolve_context_copy(args)  # as the demo command does
        for policy in ("prefix", "mtp1", "verify_all"):
            path = write_scheduler_config(args, drafter, work, quiet, policy=policy)
            assert path is not None and SchedulerConfig.load(path).context_copy_ngram == n
    # verify_all runs SGLang's static mode, whose draft has no confidence head: no STS.
    args = _demo_args()
    args.context_copy = resolve_context_copy(args)
    path = write_scheduler_config(args, drafter, tmp_path, quiet, policy="verify_all")
    assert path is not None and SchedulerConfig.load(path).sts_path is None
    with pytest.raises(SystemExit):
        _demo_args("--context-copy", "-1")


def test_policy_refuses_sts_for_another_block_size(tmp_path: Path) -> None:
    drafter = _drafter_dir(tmp_path, 7, 4)
    with pytest.raises(DemoError, match="fit for block size 4, the drafter proposes 7"):
        write_scheduler_config(_args(policy="mtp1"), drafter, tmp_path, Console(quiet=True))
    with pytest.raises(ValueError, match="static_k must be <= block_size"):
        write_scheduler_config(
            _args(policy="static", static_k=9),
            _drafter_dir(tmp_path / "b", 7, None),
            tmp_path,
            Console(quiet=True),
        )


def _run(label: str, outputs: list[list[int]], top_tokens: tuple = ()) -> EngineRun:
    return EngineRun.from_outputs(
        label, [{"output_ids": o, "meta_info": {}} for o in outputs], 1.0, top_tokens
    )


def _tops(outputs: list[list[int]], runner_up: int, margin: float) -> tuple:
    return tuple(
        tuple(TopTokens((t, runner_up), (-0.1, -0.1 - margin)) for t in o) for o in outputs
    )


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_report_passes_a_near_tie_loudly_and_fails_a_real_mismatch(dtype: str) -> None:
    tol = NEAR_TIE_TOLERANCE[dtype]
    plain_out = [[1, 2, 3], [4, 5, 6]]
    spec = _run("DSPARK_MOE", [[1, 2, 3], [4, 7, 7]])  # prompt 1 flips 5 -> 7 at token 1
    for margin, ok, word in ((tol / 4, True, "NEAR-TIE"), (tol * 4, False, "MISMATCH")):
        console = Console(record=True, width=400)
        plain = _run("plain", plain_out, _tops(plain_out, 7, margin))
        assert report(console, plain, [spec], dtype) is ok
        text = console.export_text()
        assert "identical output at temperature 0: 1/2 prompts" in text
        assert f"{word}: prompt 1, token 1: plain 5 vs DSPARK_MOE 7" in text
        assert "6 of 6 plain tokens, 6 of them the target's first choice" in text
    # identical outputs pass, and without margins a mismatch cannot be excused
    assert report(Console(quiet=True), plain, [_run("DSPARK_MOE", plain_out)], dtype)
    assert not report(Console(quiet=True), _run("plain", plain_out), [spec], dtype)


def test_report_checks_every_engine_and_fails_if_one_fails() -> None:
    plain_out = [[1, 2, 3], [4, 5, 6]]
    plain = _run("plain", plain_out, _tops(plain_out, 7, 10.0))  # no near-ties anywhere
    good = EngineRun.from_outputs(
        "DSPARK_MOE (prefix)", [{"output_ids": o, "meta_info": {}} for o in plain_out], 0.5
    )
    bad = _run("DSPARK_MOE (mtp1)", [[1, 2, 3], [4, 7, 7]])
    console = Console(record=True, width=400)
    assert report(console, plain, [good, bad], "float32") is False
    text = console.export_text()
    assert "speed ratio DSPARK_MOE (prefix) / plain: 2.000x" in text
    assert "speed ratio DSPARK_MOE (mtp1) / plain: 1.000x" in text
    assert "DSPARK_MOE (prefix): identical output at temperature 0: 2/2 prompts" in text
    assert "DSPARK_MOE (mtp1): identical output at temperature 0: 1/2 prompts" in text
    assert "DSPARK_MOE (mtp1): MISMATCH: prompt 1, token 1" in text
    assert report(Console(quiet=True), plain, [good, good], "float32")


def test_report_gives_the_median_of_the_passes_and_fails_a_pass_that_differs() -> None:
    out = [{"output_ids": [1, 2, 3, 4], "meta_info": {}}]
    plain = EngineRun.from_outputs("plain", out, 2.0, pass_walls=(4.0, 2.0, 1.0))
    assert plain.tokens_per_second == 2.0
    assert plain.pass_tokens_per_second() == (1.0, 2.0, 4.0)
    spec = EngineRun.from_outputs("DSPARK_MOE", out, 1.0, pass_walls=(1.0, 0.5, 2.0))
    console = Console(record=True, width=400)
    assert report(console, plain, [spec], "float32")
    text = console.export_text()
    assert "plain: 4 tokens in 2.000 s = 2.00 tok/s (median of 3 timed passes; " in text
    assert "passes 1.00-4.00 tok/s)" in text
    assert "speed ratio DSPARK_MOE / plain: 2.000x" in text
    # Without the target's best tokens a later pass that differs cannot be excused.
    shaky = EngineRun.from_outputs(
        "DSPARK_MOE", out, 1.0, pass_walls=(1.0, 1.0, 1.0), differing_outputs=[[[1, 2, 9, 9]]]
    )
    console = Console(record=True, width=400)
    assert not report(console, plain, [shaky], "float32")
    assert "DSPARK_MOE: 1 of 2 later timed passes gave other outputs" in console.export_text()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_later_speculative_pass_may_differ_only_at_a_near_tie(dtype: str) -> None:
    # The first pass equals plain; a later one flips 3 -> 7 at token 2, where the target
    # ranks 7 a margin below 3: a near-tie passes (the verify lengths, and so the rounding,
    # may change between passes of a policy priced from timed rounds), a real gap fails.
    tol = NEAR_TIE_TOLERANCE[dtype]
    plain_out = [[1, 2, 3, 4]]
    for margin, ok in ((tol / 4, True), (tol * 4, False)):
        plain = _run("plain", plain_out, _tops(plain_out, 7, margin))
        spec = EngineRun.from_outputs(
            "DSPARK_MOE",
            [{"output_ids": plain_out[0], "meta_info": {}}],
            1.0,
            pass_walls=(1.0, 1.0, 1.0),
            differing_outputs=[[[1, 2, 7, 7]]],
        )
        console = Console(record=True, width=400)
        assert report(console, plain, [spec], dtype) is ok
        text = console.export_text()
        assert "DSPARK_MOE: 1 of 2 later timed passes gave other outputs than the first" in text
        if ok:
            assert "only at numerical near-ties" in text
        else:
            assert "MISMATCH (later pass): prompt 0, token 2: plain 3 vs DSPARK_MOE 7" in text
        # Plain decoding's own passes must repeat exactly, near-tie or not.
        shaky_plain = EngineRun.from_outputs(
            "plain",
            [{"output_ids": plain_out[0], "meta_info": {}}],
            1.0,
            plain.top_tokens,
            pass_walls=(1.0, 1.0, 1.0),
            differing_outputs=[[[1, 2, 7, 7]]],
        )
        assert not report(Console(quiet=True), shaky_plain, [_run("DSPARK_MOE", plain_out)], dtype)


def test_without_a_cost_table_the_worker_measures_one_at_start_up(tmp_path: Path) -> None:
    drafter = _drafter_dir(tmp_path, 7, None)
    console = Console(record=True, width=400)
    path = write_scheduler_config(_args(policy="prefix"), drafter, tmp_path, console, "bfloat16")
    assert path is not None
    cfg = SchedulerConfig.load(path)
    assert cfg.cost_table_path is None and cfg.profiles_at_startup
    assert "measures the target at start-up in the engine's own settings (bfloat16" in (
        console.export_text()
    )


def test_a_cost_table_from_another_dtype_is_named(tmp_path: Path) -> None:
    table = tmp_path / "sps.json"
    table.write_text(
        json.dumps(
            {"sample_batch_tokens": [1], "sample_steps_per_sec": [5.0], "max_batch_tokens": 8}
        )
    )
    drafter = _drafter_dir(tmp_path, 7, None)
    args = _args(policy="prefix", cost_table=table)

    def notes(dtype: str) -> str:
        console = Console(record=True, width=400)
        assert write_scheduler_config(args, drafter, tmp_path, console, dtype) is not None
        return console.export_text()

    assert cost_table_dtype(table) is None
    assert "has no .meta.json naming its dtype" in notes("bfloat16")
    (tmp_path / "sps.meta.json").write_text(json.dumps({"dtype": "float32"}))
    assert cost_table_dtype(table) == "float32"
    assert notes("float32") == ""
    warning = notes("bfloat16")
    assert "measured in float32" in warning and "engines run in bfloat16" in warning
    assert "dspark-sglang profile --dtype bfloat16" in warning


class _RefusingEngine:
    """SGLang's ``flush_cache`` answer, refused ``refusals`` times before it succeeds."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.calls = 0

    def flush_cache(self) -> SimpleNamespace:
        self.calls += 1
        return SimpleNamespace(success=self.calls > self.refusals)


def test_a_flush_refused_while_the_scheduler_retires_a_request_is_asked_again() -> None:
    engine = _RefusingEngine(refusals=3)
    flush_radix_cache(engine, wait_s=5.0, poll_s=0.0)
    assert engine.calls == 4


def test_a_flush_refused_for_the_whole_wait_is_an_error() -> None:
    engine = _RefusingEngine(refusals=10**9)
    with pytest.raises(RuntimeError, match="refused to flush the radix cache"):
        flush_radix_cache(engine, wait_s=0.05, poll_s=0.01)
    assert engine.calls >= 2


def test_the_demos_lead_engine_is_what_the_charts_default_tier_runs() -> None:
    """``make demo`` leads with the chart's default tier: its policy and draft decision."""
    import yaml

    from dspark_sglang.bench.live_frontier.engines import default_engine, default_tier
    from dspark_sglang.sglang_integration.demo import DEFAULT_POLICY

    values = Path(__file__).resolve().parents[2] / "helm" / "dspark-sglang" / "values.yaml"
    tier = default_tier(yaml.safe_load(values.read_text(encoding="utf-8")))
    assert default_engine(tier["scheduler"]) == DEFAULT_POLICY
