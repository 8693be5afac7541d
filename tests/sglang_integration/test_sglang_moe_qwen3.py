"""DSPARK_MOE with a Qwen3-architecture target, through SGLang's real Engine on CPU.

Why: the MoE drafter must work "for any target whose hidden states SGLang can
capture (SmolLM2/Llama and Qwen3 families at least)", and every other engine
test uses SmolLM2 (Llama architecture). Qwen3 differs where a Llama-shaped
assumption could hide: SGLang loads it through another model class
(``Qwen3ForCausalLM``: its own ``set_dflash_layers_to_capture``, q/k norms in
the target), its config states ``head_dim`` (here 32, so ``heads * head_dim =
128 != hidden_size = 64``, as in real Qwen3 models) and transformers 5 writes
its RoPE as ``rope_parameters`` rather than ``rope_theta``.

Built here, on CPU in seconds: a tiny random Qwen3 target (6 layers, hidden 64,
4 query / 2 KV heads of dim 32, tied embeddings as in Qwen3-0.6B..4B, SmolLM2's
vocabulary and tokenizer files copied next to it), and a drafter for it made
with the training-side classes (``DSparkConfig.for_target`` on the target's
``TargetSpec``, ``DSparkDrafter``, ``save_drafter``): 1 MoE layer (4 experts,
top-2, shared expert), block 4, window 16, captured target layers (1, 2, 3), and a
reduced draft vocabulary of 2048 of the 49152 tokens (the most frequent tokens of
the prompts and the target's own greedy replies, as training builds it from
regenerated responses), so SGLang drafts over the map and verifies over the
whole vocabulary.
As in ``test_sglang_moe_parity.py`` the seeded drafter's residual branches are
scaled down 100x so slot 0 mostly proposes "the anchor again" through the tied
head; the target's greedy path has runs of repeated tokens, so drafts are
accepted raggedly (some rounds accept, some do not) without a trained drafter.
The target's seed and ``initializer_range`` were chosen so that its greedy
path is not one token repeated (5-8 distinct tokens per 24) and the smallest
top-1/top-2 logit gap along it is ~1e-3, far above fp32 kernel noise.

Checked, 3 prompts of mixed length x 24 greedy tokens:

* SGLang without speculation == HF transformers greedy (SGLang's Qwen3 path is
  the model's true greedy decode);
* SGLang + DSPARK_MOE == the same tokens;
* the draft ran: every request went through verify rounds
  (``meta_info["spec_verify_ct"] > 0``; the plain engine reports none), and
  per request the verify count and correct-draft count equal
  ``ReferenceGenerator`` greedy + ``VerifyAll`` with the same drafter, so the
  SGLang drafter sees the same Qwen3 hidden states as the training-side one;
  at least one draft is accepted.
* a full-vocabulary drafter shipped with a greedy map (``greedy_draft_vocab_size``)
  under ``SGLANG_DSPARK_USE_GREEDY_DRAFT=1``: the output is HF greedy, and the
  verify and correct-draft counts are those of the drafter narrowed to the map
  (``restricted_to``), which differ from the full drafter's (the map leaves out the
  token the target repeats most): the engine drafted over the map. (The load log
  line is checked in ``test_sglang_moe_draft_model.py``; engines log at warning.)
"""

from __future__ import annotations

from collections import Counter
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_hf_targets import save_tiny_target

from dspark_sglang.model import DSparkDrafter
from dspark_sglang.model.vocab import DraftVocab
from dspark_sglang.sglang_integration.engine import CpuEngineSpec, cpu_engine, generate_outputs
from dspark_sglang.sglang_integration.launch import GREEDY_DRAFT_ENV

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

PROMPTS: tuple[str, ...] = (
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village at the edge of a dark forest, there lived",
)
NEW_TOKENS = 24
BLOCK = 4
WINDOW = 16
DRAFT_VOCAB = 2048


@pytest.fixture(scope="module")
def qwen3_path(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen3 causal LM (fp32 safetensors) with SmolLM2's tokenizer files."""
    folder = tmp_path_factory.mktemp("qwen3_target") / "tiny-qwen3"
    return save_tiny_target("qwen3", folder, smollm2_path)


@pytest.fixture(scope="module")
def qwen3_prompt_ids(qwen3_path: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(qwen3_path)
    return [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]


@pytest.fixture(scope="module")
def target(qwen3_path: Path) -> Any:
    from dspark_sglang.targets.hf_target import HFTarget

    return HFTarget(qwen3_path)


@pytest.fixture(scope="module")
def drafter(
    target: Any,
    shaped_drafter: Any,
    qwen3_prompt_ids: list[list[int]],
    hf_qwen3_reference: list[list[int]],
) -> DSparkDrafter:
    model = shaped_drafter(
        target,
        block_size=BLOCK,
        sliding_window=WINDOW,
        num_hidden_layers=1,
        markov_rank=16,
        draft_vocab_size=DRAFT_VOCAB,
    )
    seen = torch.tensor([t for row in qwen3_prompt_ids + hf_qwen3_reference for t in row])
    counts = torch.bincount(seen, minlength=target.spec.vocab_size)
    model.set_draft_vocab(DraftVocab.from_counts(counts, DRAFT_VOCAB, always=target.eos_token_ids))
    config = model.config
    assert config.head_dim * config.num_attention_heads != config.hidden_size  # Qwen3-shaped
    return model


@pytest.fixture(scope="module")
def hf_qwen3_reference(
    qwen3_path: Path, qwen3_prompt_ids: list[list[int]], hf_greedy_fn: Any
) -> list[list[int]]:
    return list(hf_greedy_fn(qwen3_path, qwen3_prompt_ids, NEW_TOKENS))


@pytest.fixture(scope="module")
def plain_outputs(qwen3_path: Path, qwen3_prompt_ids: list[list[int]]) -> list[dict[str, Any]]:
    with cpu_engine(CpuEngineSpec(model_path=str(qwen3_path))) as engine:
        return generate_outputs(engine, qwen3_prompt_ids, NEW_TOKENS)


@pytest.fixture(scope="module")
def dspark_outputs(
    qwen3_path: Path,
    qwen3_prompt_ids: list[list[int]],
    drafter: DSparkDrafter,
    tmp_path_factory: pytest.TempPathFactory,
    plain_outputs: list[dict[str, Any]],
    verify_all_engine_outputs: Any,
) -> list[dict[str, Any]]:
    del plain_outputs  # only orders the engines: one at a time on a small machine
    workdir = tmp_path_factory.mktemp("qwen3_draft")
    return list(
        verify_all_engine_outputs(qwen3_path, drafter, workdir, qwen3_prompt_ids, NEW_TOKENS)
    )


@pytest.fixture(scope="module")
def reference(
    target: Any,
    drafter: DSparkDrafter,
    qwen3_prompt_ids: list[list[int]],
    greedy_verify_all_reference: Any,
) -> Any:
    return greedy_verify_all_reference(target, drafter, qwen3_prompt_ids, NEW_TOKENS)


def test_plain_sglang_qwen3_is_hf_greedy(
    plain_outputs: list[dict[str, Any]], hf_qwen3_reference: list[list[int]]
) -> None:
    assert all(len(set(ref)) > 1 for ref in hf_qwen3_reference), "degenerate target"
    for i, (o, ref) in enumerate(zip(plain_outputs, hf_qwen3_reference, strict=True)):
        assert list(o["output_ids"]) == ref, f"prompt {i}: SGLang Qwen3 != HF greedy"
        assert "spec_verify_ct" not in o["meta_info"], "plain engine reports speculation"


def test_dspark_moe_output_is_the_targets(
    dspark_outputs: list[dict[str, Any]],
    plain_outputs: list[dict[str, Any]],
    hf_qwen3_reference: list[list[int]],
) -> None:
    for i, (o, plain, ref) in enumerate(
        zip(dspark_outputs, plain_outputs, hf_qwen3_reference, strict=True)
    ):
        assert list(o["output_ids"]) == list(plain["output_ids"]), (
            f"prompt {i}: DSPARK_MOE != plain"
        )
        assert list(o["output_ids"]) == ref, f"prompt {i}: DSPARK_MOE != HF greedy"


def test_draft_ran_and_matches_the_reference_generator(
    dspark_outputs: list[dict[str, Any]], reference: Any, hf_qwen3_reference: list[list[int]]
) -> None:
    assert reference.outputs == hf_qwen3_reference, "reference generator != HF greedy"
    sglang = [
        (int(o["meta_info"]["spec_verify_ct"]), int(o["meta_info"]["spec_num_correct_drafts"]))
        for o in dspark_outputs
    ]
    assert all(verify > 0 for verify, _ in sglang), f"a request was never verified: {sglang}"
    ours = [(len(r), sum(a for _, a in r)) for r in reference.rounds]
    assert sglang == ours
    assert sum(a for _, a in ours) > 0, "no draft was ever accepted: the test exercises nothing"


def _counts(reference: Any) -> list[tuple[int, int]]:
    """Per request: (verify rounds, accepted drafts) of a ``ReferenceGenerator`` result."""
    return [(len(r), sum(a for _, a in r)) for r in reference.rounds]


def test_a_greedy_map_is_drafted_over_under_the_argmax_draft(
    qwen3_path: Path,
    qwen3_prompt_ids: list[list[int]],
    target: Any,
    shaped_drafter: Any,
    hf_qwen3_reference: list[list[int]],
    greedy_verify_all_reference: Any,
    verify_all_engine_outputs: Any,
    tmp_path: Path,
) -> None:
    full = shaped_drafter(
        target, block_size=BLOCK, sliding_window=WINDOW, num_hidden_layers=1, markov_rank=16
    )
    # The reduced drafter's map, less the token the target's greedy path repeats most
    # (what "the anchor again" drafts get accepted on), so the map changes the drafts.
    pairs = (pair for row in hf_qwen3_reference for pair in pairwise(row))
    repeats = Counter(a for a, b in pairs if a == b)
    assert repeats, "the target never repeats a token: no draft can be accepted"
    dropped = repeats.most_common(1)[0][0]
    assert dropped not in target.eos_token_ids
    seen = torch.tensor([t for row in qwen3_prompt_ids + hf_qwen3_reference for t in row])
    counts = torch.bincount(seen, minlength=target.spec.vocab_size).double()
    counts[dropped] = -1.0
    vocab = DraftVocab.from_counts(counts, DRAFT_VOCAB, always=target.eos_token_ids)
    assert dropped not in vocab.ids.tolist()
    narrowed = greedy_verify_all_reference(
        target, full.restricted_to(vocab), qwen3_prompt_ids, NEW_TOKENS
    )
    whole = greedy_verify_all_reference(target, full, qwen3_prompt_ids, NEW_TOKENS)
    assert narrowed.outputs == whole.outputs == hf_qwen3_reference
    assert _counts(narrowed) != _counts(whole), "the map changes no draft: the test tells nothing"

    outputs = verify_all_engine_outputs(
        qwen3_path,
        full.with_greedy_vocab(vocab),
        tmp_path,
        qwen3_prompt_ids,
        NEW_TOKENS,
        env={GREEDY_DRAFT_ENV: "1"},
    )
    for i, (o, ref) in enumerate(zip(outputs, hf_qwen3_reference, strict=True)):
        assert list(o["output_ids"]) == ref, f"prompt {i}: DSPARK_MOE with a greedy map != greedy"
    sglang = [
        (int(o["meta_info"]["spec_verify_ct"]), int(o["meta_info"]["spec_num_correct_drafts"]))
        for o in outputs
    ]
    assert sglang == _counts(narrowed), f"SGLang {sglang}, full drafter {_counts(whole)}"
