"""``bench acceptance``'s measurement on a tiny random Llama chat target (fast; no SmolLM2).

Target, drafters and eval sets are the suite's tiny-chat fixtures (``tests/conftest.py``,
built by ``tiny_chat_target``: real on-disk layouts, written by the real save functions).
Covers: the figures in the report are exactly what the per-round records imply
(accepted length, macro, gains, position-wise acceptance), a cell equals an independent
reference-generator run, kind detection, the user's own chat files as eval sets
(``load_prompt_file``), and the committed runs. The command itself
(JSON, PNG, traces, rollouts, flag errors) is tested in
``tests/cli/test_cli_bench_acceptance.py``.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
from pathlib import Path

import pytest
import torch
from tiny_chat_target import B

from dspark_sglang.bench.acceptance import (
    AcceptanceReport,
    CellResult,
    accept_length_stats,
    load_eval_prompts,
    load_prompt_file,
    load_proposer,
    measure_acceptance,
    ratio_gain_stderr,
)
from dspark_sglang.model.discovery import resolve_checkpoint
from dspark_sglang.reference.generator import ReferenceGenerator
from dspark_sglang.sampling import SamplingParams
from dspark_sglang.scheduling.policies import VerifyAll
from dspark_sglang.targets.hf_target import HFTarget

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# --------------------------------------------------------------------------- unit figures


def test_accept_length_stats_by_hand() -> None:
    # Request 0: rounds accepting 0 and 1 (tokens 1 + 2 = 3); request 1: one round of 3 (4).
    mean, se = accept_length_stats([[0, 1], [3]])
    assert mean == pytest.approx(7 / 3)
    resid = [3 - 7 / 3 * 2, 4 - 7 / 3 * 1]
    assert se == pytest.approx(math.sqrt(2 * sum(r * r for r in resid)) / 3)
    assert math.isnan(accept_length_stats([[1, 2]])[1])  # one request: no spread estimate


def _cell(name: str, dom: str, accepted: list[list[int]], block: int = B) -> CellResult:
    flat = [a for r in accepted for a in r]
    reached = tuple(sum(a >= k for a in flat) for k in range(block))
    acc = tuple(sum(a > k for a in flat) for k in range(block))
    return CellResult(name, dom, block, tuple(map(tuple, accepted)), reached, acc, 0, 0.0, 0)


def test_report_macro_and_gains() -> None:
    cells = {
        "fast": {"x": _cell("fast", "x", [[2, 2], [2]]), "y": _cell("fast", "y", [[4], [0]])},
        "slow": {"x": _cell("slow", "x", [[1], [1]]), "y": _cell("slow", "y", [[0, 1], [1]])},
    }
    rep = AcceptanceReport(("fast", "slow"), ("x", "y"), cells, 2, 8, 0)
    # fast: x = 3.0, y = 3.0; slow: x = 2.0, y = 5/3.
    assert rep.cells["fast"]["y"].accept_length == pytest.approx(3.0)
    assert rep.macro("slow")[0] == pytest.approx((2.0 + 5 / 3) / 2)
    assert rep.gain("fast", "slow", "x") == pytest.approx(50.0)
    assert rep.gain("fast", "slow", "y") == pytest.approx(80.0)
    assert rep.gain("fast", "slow") == pytest.approx(100 * (3.0 / ((2 + 5 / 3) / 2) - 1))
    assert rep.gains()["slow"]["fast"]["x"] == pytest.approx(100 * (2 / 3 - 1))
    # Position-wise pooled over domains: fast rounds accepted 2,2,2,4,0.
    assert rep.pooled_position_acceptance("fast") == pytest.approx([4 / 5, 4 / 4, 1 / 4, 1 / 1])
    with pytest.raises(ValueError, match="no result"):
        AcceptanceReport(("fast", "slow"), ("x", "z"), cells, 2, 8, 0)


def _paired_requests(
    gen: torch.Generator, requests: int, block: int
) -> tuple[list[list[int]], list[list[int]]]:
    """Two drafters on the same requests: each prompt has its own difficulty, shared by both
    (so their accepted lengths co-vary by prompt); drafter ``a`` accepts each slot more often."""
    ease = 0.2 + 0.6 * torch.rand(requests, generator=gen)
    out: tuple[list[list[int]], list[list[int]]] = ([], [])
    for i in range(requests):
        for rows, q in zip(out, (min(0.95, 1.3 * float(ease[i])), float(ease[i])), strict=True):
            rounds = int(torch.randint(4, 16, (1,), generator=gen))
            ok = torch.rand(rounds, block, generator=gen) < q
            rows.append([int(x) for x in ok.int().cumprod(dim=1).sum(dim=1)])
    return out


def test_gain_stderr_matches_the_spread_of_replicated_gains() -> None:
    """The paired delta-method SE of the macro gain equals the gain's spread over replicates.

    1000 replicate benchmarks (seed 0) of 2 domains x 30 requests; tolerance: the mean
    reported SE lies within 10 % of the replicates' SD (the SD's own sampling error is ~2 %).
    Ignoring the pairing (covariance 0) overstates it by far more than that.
    """
    gen = torch.Generator().manual_seed(0)
    block, gains, ses, unpaired = 4, [], [], []
    for _ in range(1000):
        cells: dict[str, dict[str, CellResult]] = {"a": {}, "b": {}}
        for dom in ("x", "y"):
            rows_a, rows_b = _paired_requests(gen, 30, block)
            cells["a"][dom] = _cell("a", dom, rows_a, block)
            cells["b"][dom] = _cell("b", dom, rows_b, block)
        rep = AcceptanceReport(("a", "b"), ("x", "y"), cells, 30, 8, 0)
        gains.append(rep.gain("a", "b"))
        ses.append(rep.gain_stderr("a", "b"))
        (ma, va), (mb, vb) = rep.macro("a"), rep.macro("b")
        unpaired.append(ratio_gain_stderr(ma, mb, va**2, vb**2, 0.0))
    sd = float(torch.tensor(gains, dtype=torch.float64).std())
    assert sum(ses) / len(ses) == pytest.approx(sd, rel=0.10)
    assert sum(unpaired) / len(unpaired) > 1.3 * sd


def test_gain_stderr_needs_the_same_requests() -> None:
    cells = {
        "a": {"x": _cell("a", "x", [[1], [2], [0]])},
        "b": {"x": _cell("b", "x", [[1], [2]])},
    }
    rep = AcceptanceReport(("a", "b"), ("x",), cells, 3, 8, 0)
    with pytest.raises(ValueError, match="pair by request"):
        rep.gain_stderr("a", "b")
    same = AcceptanceReport(("a", "b"), ("x",), {"a": cells["a"], "b": cells["a"]}, 3, 8, 0)
    assert same.gain_stderr("a", "b") == pytest.approx(0.0, abs=1e-9)  # identical runs


# --------------------------------------------------------------------------- checkpoints


def test_resolve_checkpoint_kinds_and_layouts(tiny_drafters: dict[str, Path]) -> None:
    ds = resolve_checkpoint("dspark", tiny_drafters["dspark"])
    assert ds.kind == "dspark" and ds.block_size == B
    assert ds.folder.parent.name == "step-000004"  # the run's latest checkpoint
    assert ds.config_sha256 == hashlib.sha256(ds.config_file.read_bytes()).hexdigest()
    assert resolve_checkpoint("f", tiny_drafters["dflash"]).kind == "dflash"
    assert resolve_checkpoint("a", tiny_drafters["ar"]).kind == "ar"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_checkpoint("x", tiny_drafters["ar"] / "nope")
    with pytest.raises(ValueError, match="unknown drafter kind"):
        resolve_checkpoint("x", tiny_drafters["dspark"].parent)  # no drafter config at all


# --------------------------------------------------------------------------- measurement


def test_cell_equals_an_independent_generator_run(
    tiny_chat_model: HFTarget, tiny_drafters: dict[str, Path], tiny_eval_cache: Path
) -> None:
    target = tiny_chat_model
    prompts = load_eval_prompts(target, ["gsm8k", "mtbench"], 2, cache_dir=tiny_eval_cache)
    assert [len(p) for p in prompts.values()] == [2, 2]
    proposers = {
        n: load_proposer(resolve_checkpoint(n, tiny_drafters[n]), target) for n in ("dspark", "ar")
    }
    rep = measure_acceptance(target, proposers, prompts, 2, 10, seed=3)
    for name, prop in proposers.items():
        for dom, ps in prompts.items():
            gen = ReferenceGenerator(target, prop, VerifyAll(), sampling=SamplingParams(), seed=3)
            res = gen.generate(ps, 10, target.eos_token_ids)
            cell = rep.cells[name][dom]
            assert [list(r) for r in cell.accepted] == [[a for _, a in r] for r in res.rounds]
            assert cell.accept_length == pytest.approx(res.accept_length_mean)
            assert cell.num_tokens == res.num_tokens
            assert cell.num_rounds > 0
    assert rep.temperature == 1.0
    # Another temperature reaches both the drafters and the target: greedy cells equal
    # independent greedy generator runs, and the report says which temperature it holds.
    greedy = SamplingParams(temperature=0.0)
    rep0 = measure_acceptance(target, proposers, prompts, 2, 10, seed=3, sampling=greedy)
    assert rep0.temperature == 0.0 and rep0.to_dict()["settings"]["temperature"] == 0.0
    for name, prop in proposers.items():
        for dom, ps in prompts.items():
            gen = ReferenceGenerator(target, prop, VerifyAll(), sampling=greedy, seed=3)
            res = gen.generate(ps, 10, target.eos_token_ids)
            got = [list(r) for r in rep0.cells[name][dom].accepted]
            assert got == [[a for _, a in r] for r in res.rounds]
    # A skipped split continues where the first one stopped (disjoint STS fit/eval splits).
    later = load_eval_prompts(target, ["gsm8k"], 1, cache_dir=tiny_eval_cache, skip=1)
    assert later["gsm8k"] == prompts["gsm8k"][1:2]
    assert rep.cells["ar"]["gsm8k"].confidence_logits is None
    z = rep.cells["dspark"]["gsm8k"].confidence_logits
    assert z is not None and sum(t.shape[0] for t in z) == rep.cells["dspark"]["gsm8k"].num_rounds


# --------------------------------------------------------------------------- own prompt files

SYS = {"role": "system", "content": "Be brief."}
#: Prompts P1, P2 (line 1), P3 (line 3), P4 (line 5: about 1010 tokens, one per character,
#: over the tiny target's 1024-token context with 100 new tokens), P5 (line 6); lines 2
#: and 4 are bad rows.
OWN_ROWS = [
    {
        "messages": [
            SYS,
            {"role": "user", "content": "What is 7 times 6?"},
            {"role": "assistant", "content": "42."},
            {"role": "user", "content": "And 8 times 9?"},
            {"role": "assistant", "content": "72."},
        ]
    },
    "this line is not JSON",
    {"conversations": [{"from": "human", "value": "Say hello."}]},
    {"messages": [{"role": "tool", "content": "{}"}, {"role": "user", "content": "Hi."}]},
    {"messages": [{"role": "user", "content": "x" * 990}, {"role": "assistant", "content": "ok"}]},
    {"conversations": [{"from": "human", "value": "Name a fruit."}, {"from": "gpt", "value": "A"}]},
]


def _write_rows(path: Path, rows: list[object]) -> Path:
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_prompt_file_reads_chat_rows_as_training_does(
    tiny_chat_model: HFTarget, tmp_path: Path
) -> None:
    target = tiny_chat_model
    path = _write_rows(tmp_path / "mine.jsonl", OWN_ROWS)
    turns = OWN_ROWS[0]["messages"]  # type: ignore[index]
    expected = [
        target.encode_chat(turns[:2]),  # P1: the conversation before the first reply
        target.encode_chat(turns[:4]),  # P2: before the second reply
        target.encode_chat([{"role": "user", "content": "Say hello."}]),  # P3: ends with user
        target.encode_chat([{"role": "user", "content": "Name a fruit."}]),  # P5 (ShareGPT)
    ]
    got = load_prompt_file(target, "mine", path, 10, 100)
    assert [list(p) for p in got.prompts] == expected
    assert got.rows == 6 and got.skip == 0
    assert got.skipped == {"not_json": 1, "unknown_role": 1, "over_context": 1}
    assert any(e.startswith("mine.jsonl:5 reply 1: over_context: ") for e in got.examples)
    assert "the target's context 1024 - --max-new-tokens 100=924" in " ".join(got.examples)
    summary = got.summary()
    assert summary.startswith(f"--prompts mine: {path}: 6 rows -> 4 prompts; skipped ")
    assert "mine.jsonl:2: not_json" in summary and "over_context 1" in summary
    assert got.size == path.stat().st_size
    assert got.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert got.to_dict()["sha256"] == got.sha256 and got.to_dict()["prompts"] == 4
    # With fewer new tokens P4 fits: the bound is the context minus --max-new-tokens.
    roomy = load_prompt_file(target, "mine", path, 10, 8)
    assert len(roomy.prompts) == 5 and "over_context" not in roomy.skipped

    # --num-prompts stops the reading; --skip-prompts numbers prompts in file order, and a
    # skipped prompt (P4) keeps its number, so disjoint ranges give disjoint prompts.
    first = load_prompt_file(target, "mine", path, 2, 100)
    assert [list(p) for p in first.prompts] == expected[:2]
    assert first.rows == 1 and first.skipped == {}
    later = load_prompt_file(target, "mine", path, 3, 100, skip=2)
    assert [list(p) for p in later.prompts] == expected[2:]
    assert "after the first 2" in later.summary()
    with pytest.raises(ValueError, match=r"gave no usable prompt \(5 rows; .*over_context 1"):
        load_prompt_file(target, "mine", path, 1, 100, skip=3)  # P4 alone: over the context

    # .jsonl.gz reads the same.
    gz = tmp_path / "mine.jsonl.gz"
    with gzip.open(gz, "wb") as f:
        f.write(path.read_bytes())
    assert load_prompt_file(target, "mine", gz, 10, 100).prompts == got.prompts


def test_prompt_file_without_a_usable_prompt_names_the_flag_file_and_fix(
    tiny_chat_model: HFTarget, tmp_path: Path
) -> None:
    target = tiny_chat_model
    bad = _write_rows(tmp_path / "bad.jsonl", ["nope", {"messages": []}])
    with pytest.raises(ValueError, match=r"--prompts mine: .*bad\.jsonl gave no usable") as e:
        load_prompt_file(target, "mine", bad, 4, 16)
    assert "no_conversation 1, not_json 1" in str(e.value) and "Fix: " in str(e.value)
    long = _write_rows(tmp_path / "long.jsonl", [OWN_ROWS[4]])
    with pytest.raises(ValueError, match=r"over_context 1.*Fix: over_context: .*--max-new"):
        load_prompt_file(target, "mine", long, 4, 100)
    few = _write_rows(tmp_path / "few.jsonl", [OWN_ROWS[2]])
    with pytest.raises(ValueError, match=r"few\.jsonl has 1 prompts .*lower --skip-prompts"):
        load_prompt_file(target, "mine", few, 4, 16, skip=1)
    with pytest.raises(FileNotFoundError, match=r"--prompts mine: .*nothere\.jsonl not found"):
        load_prompt_file(target, "mine", tmp_path / "nothere.jsonl", 4, 16)


# --------------------------------------------------------------------------- committed runs

REPO = Path(__file__).resolve().parents[2]
COMMITTED = sorted(
    str(p.relative_to(REPO))
    for p in (REPO / "benchmarks" / "results").rglob("*.json")
    if json.loads(p.read_text()).get("benchmark") == "acceptance"
)


def test_the_headline_acceptance_run_is_committed() -> None:
    """The README's acceptance table cites this file; the loop below checks its figures."""
    assert "benchmarks/results/acceptance.json" in COMMITTED


@pytest.mark.parametrize("rel", COMMITTED)
def test_committed_acceptance_figures_follow_from_their_rounds(rel: str) -> None:
    """Every figure the READMEs quote is recomputed from the stored per-round counts."""
    data = json.loads((REPO / rel).read_text())
    settings = data["settings"]
    assert settings["policy"] == "verify_all" and settings["bonus_token_included"] is True
    assert settings["temperature"] == data["command"].get("temperature", 1.0)
    macro: dict[str, float] = {}
    for name in data["drafters"]:
        lengths = []
        for dom in data["domains"]:
            cell = data["results"][name][dom]
            rounds = cell["accepted_per_round"]
            flat = [a for r in rounds for a in r]
            block = len(cell["position_reached"])
            assert len(rounds) == cell["num_requests"] <= settings["num_prompts"]
            assert all(0 <= a <= block for a in flat)
            mean, se = accept_length_stats(rounds)
            assert cell["accept_length"] == pytest.approx(mean)
            assert cell["accept_length_stderr"] == pytest.approx(se)
            assert cell["position_reached"] == [sum(a >= k for a in flat) for k in range(block)]
            assert cell["position_accepted"] == [sum(a > k for a in flat) for k in range(block)]
            lengths.append(mean)
        macro[name] = sum(lengths) / len(lengths)
        assert data["macro"][name]["accept_length"] == pytest.approx(macro[name])
    for a, row in data["gains_percent"].items():
        for b, gains in row.items():
            assert gains["macro"] == pytest.approx(100 * (macro[a] / macro[b] - 1))
