"""``dspark-sglang bench acceptance`` on a tiny random Llama chat target (fast; no SmolLM2).

The target is a real HF folder (random Llama + a character-level tokenizer with a
ChatML template), the drafters are tiny untrained DSpark / DFlash-style / AR
checkpoints written by the real save functions, and the eval sets are small
files in the real on-disk layouts. Covers: the figures in the JSON are exactly
what the per-round records imply (accepted length, macro, gains, position-wise
acceptance), a cell equals an independent reference-generator run, the PNG,
traces and rollouts readable by their own loaders, kind detection, and CLI errors.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import string
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tokenizers import Regex, Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from dspark_sglang.bench.acceptance import (
    AcceptanceReport,
    CellResult,
    accept_length_stats,
    load_eval_prompts,
    load_proposer,
    measure_acceptance,
    resolve_checkpoint,
)
from dspark_sglang.calibration.rollouts import load_rollouts
from dspark_sglang.cli import main
from dspark_sglang.model import DSparkConfig, DSparkDrafter, save_drafter
from dspark_sglang.planning.traces import load_traces
from dspark_sglang.reference.generator import ReferenceGenerator
from dspark_sglang.sampling import SamplingParams
from dspark_sglang.scheduling.policies import VerifyAll
from dspark_sglang.targets.hf_target import HFTarget
from dspark_sglang.training.ar_drafter import ARDrafter, ARDrafterConfig, save_ar_drafter

B = 4
LAYER_IDS = (0, 1, 2)
SPECIALS = ["<unk>", "<s>", "<|im_end|>", "<|im_start|>", "<mask>"]
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _tokenizer() -> PreTrainedTokenizerFast:
    chars = sorted(set(string.printable) - set("\x0b\x0c\r"))
    vocab = {t: i for i, t in enumerate(SPECIALS + chars)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="<|im_end|>",
        mask_token="<mask>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHATML
    return fast


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved HF chat model: random 4-layer Llama (peaked head) + char tokenizer."""
    path = tmp_path_factory.mktemp("models") / "tiny-chat"
    tok = _tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def target(target_dir: Path) -> HFTarget:
    return HFTarget(target_dir)


@pytest.fixture(scope="module")
def checkpoints(target: HFTarget, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Untrained drafters saved the way `dspark-sglang train` saves them."""
    root = tmp_path_factory.mktemp("runs")
    spec = target.spec
    common = {
        "num_hidden_layers": 1,
        "num_experts": 2,
        "num_experts_per_tok": 1,
        "intermediate_size": 64,
        "block_size": B,
        "sliding_window": 16,
        "target_layer_ids": LAYER_IDS,
    }
    torch.manual_seed(1)
    dspark = DSparkDrafter(
        DSparkConfig.for_target(
            spec, mask_token_id=target.default_mask_token_id(), markov_rank=8, **common
        ),
        target.embed_tokens,
        target.lm_head,
    )
    dflash = DSparkDrafter(
        DSparkConfig.for_target(
            spec,
            mask_token_id=target.default_mask_token_id(),
            markov_head_type="none",
            enable_confidence_head=False,
            confidence_head_with_markov=False,
            **common,
        ),
        target.embed_tokens,
        target.lm_head,
    )
    ar = ARDrafter(
        ARDrafterConfig(
            hidden_size=spec.hidden_size,
            vocab_size=spec.vocab_size,
            target_layer_ids=LAYER_IDS,
            num_attention_heads=spec.num_attention_heads,
            num_key_value_heads=spec.num_key_value_heads,
            intermediate_size=64,
            block_size=B,
        ),
        target.embed_tokens,
        target.lm_head,
    )
    # Layouts the trainer writes: run_dir/checkpoints/step-N/drafter, and plain folders.
    run = root / "dspark_run"
    save_drafter(dspark, run / "checkpoints" / "step-000002" / "drafter")
    save_drafter(dspark, run / "checkpoints" / "step-000004" / "drafter")
    save_drafter(dflash, root / "dflash" / "step-000004" / "drafter")
    save_ar_drafter(ar, root / "ar")
    (run / "config.json").write_text('{"name": "a training config, not a drafter"}')
    return {"dspark": run, "dflash": root / "dflash" / "step-000004", "ar": root / "ar"}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Eval sets in the fetched layouts (3 prompts each; the bench takes the first N)."""
    root = tmp_path_factory.mktemp("cache")
    assets = root / "assets"
    (assets / "gsm8k").mkdir(parents=True)
    (assets / "humaneval").mkdir()
    (assets / "mt_bench").mkdir()
    qs = ["Tom has 3 apples and buys 4. How many?", "2 + 5 = ?", "Half of 18 is?"]
    (assets / "gsm8k" / "test.jsonl").write_text(
        "".join(json.dumps({"question": q, "answer": "#### 7"}) + "\n" for q in qs)
    )
    with gzip.open(assets / "humaneval" / "HumanEval.jsonl.gz", "wt") as f:
        for i, stub in enumerate(["def add(a, b):\n", "def neg(x):\n", "def one():\n"]):
            f.write(json.dumps({"task_id": f"HumanEval/{i}", "prompt": stub}) + "\n")
    turns = [["Write a haiku.", "Again."], ["Say hi.", "Bye."], ["Name a color.", "Why?"]]
    (assets / "mt_bench" / "question.jsonl").write_text(
        "".join(json.dumps({"question_id": 81 + i, "turns": t}) + "\n" for i, t in enumerate(turns))
    )
    return root


# --------------------------------------------------------------------------- unit figures


def test_accept_length_stats_by_hand() -> None:
    # Request 0: rounds accepting 0 and 1 (tokens 1 + 2 = 3); request 1: one round of 3 (4).
    mean, se = accept_length_stats([[0, 1], [3]])
    assert mean == pytest.approx(7 / 3)
    resid = [3 - 7 / 3 * 2, 4 - 7 / 3 * 1]
    assert se == pytest.approx(math.sqrt(2 * sum(r * r for r in resid)) / 3)
    assert math.isnan(accept_length_stats([[1, 2]])[1])  # one request: no spread estimate


def _cell(name: str, dom: str, accepted: list[list[int]]) -> CellResult:
    flat = [a for r in accepted for a in r]
    reached = tuple(sum(a >= k for a in flat) for k in range(B))
    acc = tuple(sum(a > k for a in flat) for k in range(B))
    return CellResult(name, dom, B, tuple(map(tuple, accepted)), reached, acc, 0, 0.0, 0)


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


# --------------------------------------------------------------------------- checkpoints


def test_resolve_checkpoint_kinds_and_layouts(checkpoints: dict[str, Path]) -> None:
    ds = resolve_checkpoint("dspark", checkpoints["dspark"])
    assert ds.kind == "dspark" and ds.block_size == B
    assert ds.folder.parent.name == "step-000004"  # the run's latest checkpoint
    assert ds.config_sha256 == hashlib.sha256(ds.config_file.read_bytes()).hexdigest()
    assert resolve_checkpoint("f", checkpoints["dflash"]).kind == "dflash"
    assert resolve_checkpoint("a", checkpoints["ar"]).kind == "ar"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_checkpoint("x", checkpoints["ar"] / "nope")
    with pytest.raises(ValueError, match="unknown drafter kind"):
        resolve_checkpoint("x", checkpoints["dspark"].parent)  # no drafter config at all


# --------------------------------------------------------------------------- measurement


def test_cell_equals_an_independent_generator_run(
    target: HFTarget, checkpoints: dict[str, Path], cache_dir: Path
) -> None:
    prompts = load_eval_prompts(target, ["gsm8k", "mtbench"], 2, cache_dir=cache_dir)
    assert [len(p) for p in prompts.values()] == [2, 2]
    proposers = {
        n: load_proposer(resolve_checkpoint(n, checkpoints[n]), target) for n in ("dspark", "ar")
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
    later = load_eval_prompts(target, ["gsm8k"], 1, cache_dir=cache_dir, skip=1)
    assert later["gsm8k"] == prompts["gsm8k"][1:2]
    assert rep.cells["ar"]["gsm8k"].confidence_logits is None
    z = rep.cells["dspark"]["gsm8k"].confidence_logits
    assert z is not None and sum(t.shape[0] for t in z) == rep.cells["dspark"]["gsm8k"].num_rounds


# --------------------------------------------------------------------------- CLI end to end


def test_cli_end_to_end(
    target_dir: Path,
    checkpoints: dict[str, Path],
    cache_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DSPARK_CACHE_DIR", str(cache_dir))
    out, plot, traces = tmp_path / "r" / "acc.json", tmp_path / "r" / "acc.png", tmp_path / "tr"
    argv = ["bench", "acceptance", "--target", str(target_dir), "--num-prompts", "2"]
    for name in ("dspark", "dflash", "ar"):
        argv += ["--drafter", f"{name}={checkpoints[name]}"]
    argv += ["--max-new-tokens", "12", "--seed", "5", "--out", str(out), "--plot", str(plot)]
    assert main([*argv, "--traces-dir", str(traces)]) == 0

    data = json.loads(out.read_text())
    assert data["drafters"] == ["dspark", "dflash", "ar"]
    assert data["domains"] == ["gsm8k", "humaneval", "mtbench"]
    assert data["settings"]["temperature"] == 1.0 and data["settings"]["policy"] == "verify_all"
    assert data["command"]["temperature"] == 1.0
    assert {k: v["kind"] for k, v in data["checkpoints"].items()} == {
        "dspark": "dspark",
        "dflash": "dflash",
        "ar": "ar",
    }
    for c in data["checkpoints"].values():
        assert c["config_sha256"] == hashlib.sha256(Path(c["config_file"]).read_bytes()).hexdigest()
    assert set(data["versions"]) >= {"torch", "transformers"}
    assert data["versions"]["torch"] == torch.__version__

    for name in data["drafters"]:
        lengths = []
        for dom in data["domains"]:
            cell = data["results"][name][dom]
            rounds = cell["accepted_per_round"]
            flat = [a for r in rounds for a in r]
            assert len(rounds) == cell["num_requests"] == 2
            assert cell["accept_length"] == pytest.approx(sum(a + 1 for a in flat) / len(flat))
            # Every draft verified: reached k iff accepted >= k, accepted k iff accepted > k.
            assert cell["position_reached"] == [sum(a >= k for a in flat) for k in range(B)]
            assert cell["position_accepted"] == [sum(a > k for a in flat) for k in range(B)]
            lengths.append(cell["accept_length"])
        assert data["macro"][name]["accept_length"] == pytest.approx(sum(lengths) / len(lengths))
    for a in data["drafters"]:
        for b in data["drafters"]:
            if a == b:
                continue
            g = data["gains_percent"][a][b]
            for dom in data["domains"]:
                la = data["results"][a][dom]["accept_length"]
                lb = data["results"][b][dom]["accept_length"]
                assert g[dom] == pytest.approx(100 * (la / lb - 1))
            ma, mb = data["macro"][a]["accept_length"], data["macro"][b]["accept_length"]
            assert g["macro"] == pytest.approx(100 * (ma / mb - 1))

    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 10_000

    # Traces and rollouts only for the drafter with a confidence head.
    assert sorted(p.name for p in traces.iterdir()) == ["dspark"]
    for dom in data["domains"]:
        rounds = data["results"]["dspark"][dom]["accepted_per_round"]
        flat = [a for r in rounds for a in r]
        tr = load_traces(traces / "dspark" / f"{dom}.jsonl")
        assert tr.domains == (dom,) and tr.block_size == B
        assert tr.accepted.tolist() == flat
        assert tr.request_id.tolist() == [i for i, r in enumerate(rounds) for _ in r]
        ro = load_rollouts([traces / "dspark" / f"rollouts_{dom}.jsonl"])
        assert ro.accepted.tolist() == flat
        assert ro.verified is not None and set(ro.verified.tolist()) == {B}
        assert torch.equal(ro.confidence_logits, tr.confidence_logits)


def _err(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    try:
        rc = main(["bench", "acceptance", *argv])
    except SystemExit as exc:  # argparse's own errors
        rc = int(exc.code or 0)
    return rc, capsys.readouterr().err


def test_cli_errors_name_the_flag(
    checkpoints: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ar = f"ar={checkpoints['ar']}"
    cases = [
        ([], "--drafter"),
        (["--drafter", str(checkpoints["ar"])], "NAME=PATH"),
        (["--drafter", f"x={tmp_path / 'missing'}"], "does not exist"),
        (["--drafter", ar, "--drafter", ar], "given twice"),
        (["--drafter", ar, "--num-prompts", "0"], "--num-prompts must be >= 1"),
        (["--drafter", ar, "--skip-prompts", "-1"], "--skip-prompts must be >= 0"),
        (["--drafter", ar, "--eval-sets", "gsm8k,nope"], "--eval-sets"),
        (["--drafter", ar, "--temperature", "-0.5"], "--temperature must be a finite number"),
        (["--drafter", ar, "--temperature", "nan"], "--temperature must be a finite number"),
        (["--drafter", f"x={checkpoints['dspark'].parent}"], "unknown drafter kind"),
        (["--drafter", f"x={checkpoints['ar']}", "--target", str(tmp_path / "t")], "--target"),
    ]
    for argv, needle in cases:
        rc, err = _err(capsys, argv)
        assert rc == 2, (argv, err)
        assert needle in err, (argv, err)


def test_bench_without_benchmark_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench"]) == 2
    assert "acceptance" in capsys.readouterr().err


# --------------------------------------------------------------------------- committed runs

REPO = Path(__file__).resolve().parents[2]
COMMITTED = sorted(
    str(p.relative_to(REPO))
    for p in (REPO / "benchmarks" / "results").rglob("*.json")
    if json.loads(p.read_text()).get("benchmark") == "acceptance"
)


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
