"""The sampled draft step in a reduced map's columns draws from softmax(logits / T).

``map_step.sample_in_map`` replaces SGLang's sampled draft step over the whole vocabulary
for a drafter with a reduced map on CPU. Verification checks each draft against the step
logits it writes, so the law that matters is: the token is distributed as
``softmax(logits_out / T)``, whose mass lies on the map. A chi-square over 20 000 rows at
two temperatures (fixed seed, p > 1e-3) holds it. That the written logits equal SGLang's
own, through SGLang's draft loop and the real model class:
``test_sglang_moe_draft_model.py``. Last, one engine serves sampled requests with a
narrowed drafter.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from scipy.stats import chisquare

from dspark_sglang.sglang_integration.map_step import sample_in_map
from dspark_sglang.sglang_integration.moe_draft_model import OFF_MAP_LOGIT

V = 64
IDS = torch.tensor([2, 5, 9, 17, 30, 31, 44, 63])
MAPPED = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -2.0, 0.3, 1.5])
BIAS = torch.tensor([0.25, -0.5, 0.0, 0.75, 0.0, 1.0, -0.25, 0.0])
ROWS = 20_000


def _draw(
    temperatures: torch.Tensor, seed: int = 20261204, step_dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    rows = temperatures.numel()
    base = torch.full((rows, V), OFF_MAP_LOGIT)
    base[:, IDS] = MAPPED
    logits_out = torch.empty(rows, V, dtype=step_dtype)
    tokens = sample_in_map(
        base,
        BIAS.expand(rows, -1),
        IDS,
        temperatures,
        logits_out,
        torch.Generator().manual_seed(seed),
    )
    return tokens, logits_out


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_sampled_tokens_follow_the_step_logits_softmax(temperature: float) -> None:
    tokens, logits_out = _draw(torch.full((ROWS,), temperature))
    # The law is the one the written step logits describe (verification reads those).
    law = torch.softmax(logits_out[0].double() / temperature, 0)
    assert float(law[IDS].sum()) == pytest.approx(1.0, abs=1e-12)
    counts = torch.bincount(tokens, minlength=V).double()
    assert int(counts.sum()) == ROWS and float(counts[law == 0].sum()) == 0
    expected = law[IDS] * ROWS
    assert float(chisquare(counts[IDS].numpy(), expected.numpy()).pvalue) > 1e-3


def test_written_logits_are_base_plus_bias_on_the_map_and_base_off_it() -> None:
    _, logits_out = _draw(torch.ones(3), step_dtype=torch.bfloat16)
    want = torch.full((3, V), OFF_MAP_LOGIT).to(torch.bfloat16)
    want[:, IDS] = (MAPPED + BIAS).to(torch.bfloat16)
    assert torch.equal(logits_out, want)


def test_rows_at_temperature_zero_take_the_first_maximum_and_seeds_repeat() -> None:
    temperatures = torch.tensor([0.0, 1.0, 0.0, 1.0] * 50)
    tokens, _ = _draw(temperatures)
    # MAPPED + BIAS peaks at 2.25 in the first mapped column.
    assert bool((tokens[temperatures == 0] == IDS[0]).all())
    assert len(set(tokens[temperatures == 1].tolist())) > 1
    again, _ = _draw(temperatures)
    other, _ = _draw(temperatures, seed=1)
    assert torch.equal(tokens, again) and not torch.equal(tokens, other)


MAP_TOKENS = 256
ENGINE_TOKENS = 32


@pytest.mark.sglang
@pytest.mark.slow
def test_a_narrowed_drafter_serves_sampled_requests_through_sglangs_engine(
    smollm2_path: Path,
    prompt_ids: list[list[int]],
    hf_reference: list[list[int]],
    shaped_drafter: Any,
    verify_all_engine_outputs: Any,
    tmp_path: Path,
) -> None:
    """DSPARK_MOE with a drafter narrowed to a token map, sampled requests at temperature 1
    (SGLang's rejection sampling; each draft step in the map's columns on this CPU engine):
    every request gets all its tokens and drafts from the map are accepted."""
    from dspark_sglang.model.vocab import DraftVocab
    from dspark_sglang.targets.hf_target import HFTarget

    target = HFTarget(smollm2_path)
    drafter = shaped_drafter(target, draft_vocab_size=MAP_TOKENS)
    seen = torch.tensor([t for row in prompt_ids + hf_reference for t in row])
    counts = torch.bincount(seen, minlength=target.spec.vocab_size)
    drafter.set_draft_vocab(DraftVocab.from_counts(counts, MAP_TOKENS, always=target.eos_token_ids))
    outs = verify_all_engine_outputs(
        smollm2_path, drafter, tmp_path, prompt_ids, ENGINE_TOKENS, sampling={"temperature": 1.0}
    )
    accepted = 0
    for i, o in enumerate(outs):
        assert len(o["output_ids"]) == ENGINE_TOKENS, f"prompt {i}"
        assert all(0 <= t < target.spec.vocab_size for t in o["output_ids"])
        meta = o["meta_info"]
        assert meta["spec_verify_ct"] > 0, f"prompt {i}: no speculative verify ran"
        accepted += int(meta["spec_num_correct_drafts"])
    assert accepted > 0, "no draft was ever accepted: the test exercises nothing"
