"""SGLang engine + our MoE drafter vs the target and the reference generator.

One DSPARK_MOE engine on CPU loads a checkpoint written by ``save_drafter``
(our ``DSparkMoEDraftModel`` through the plugin; 2 MoE layers, window 16 so
it binds on every prompt, block 4). The drafter is random with a fixed seed,
then its residual branches (attention ``o_proj``, expert and shared-expert
``down_proj``) are scaled down 100x: the block's hidden state is then close to
the normed input embedding, so with SmolLM2's tied LM head slot 0 mostly
proposes "the anchor again" -- accepted whenever the target repeats a token --
while attention, window and MoE still shape every logit. That gives real,
ragged acceptance without a trained checkpoint (random drafts are never
accepted).

Checked: 8 prompts x 64 tokens of mixed lengths, greedy output identical to
the target's (HF greedy, itself identical to SGLang without speculation in
``test_sglang_engine_cpu.py``); per request, SGLang's verify count and
correct-draft count equal ``ReferenceGenerator`` greedy + ``VerifyAll`` with
the same drafter; at least one draft is accepted somewhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dspark_sglang.model import DSparkDrafter

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

NEW_TOKENS = 64
BLOCK = 4
WINDOW = 16


@pytest.fixture(scope="module")
def target(smollm2_path: Path) -> Any:
    from dspark_sglang.targets.hf_target import HFTarget

    return HFTarget(smollm2_path)


@pytest.fixture(scope="module")
def drafter(target: Any, shaped_drafter: Any) -> DSparkDrafter:
    return shaped_drafter(target, block_size=BLOCK, sliding_window=WINDOW)


@pytest.fixture(scope="module")
def sglang_outputs(
    smollm2_path: Path,
    prompt_ids: list[list[int]],
    drafter: DSparkDrafter,
    tmp_path_factory: pytest.TempPathFactory,
    verify_all_engine_outputs: Any,
) -> list[dict[str, Any]]:
    workdir = tmp_path_factory.mktemp("moe_parity")
    return list(verify_all_engine_outputs(smollm2_path, drafter, workdir, prompt_ids, NEW_TOKENS))


@pytest.fixture(scope="module")
def reference(
    target: Any,
    drafter: DSparkDrafter,
    prompt_ids: list[list[int]],
    greedy_verify_all_reference: Any,
) -> Any:
    return greedy_verify_all_reference(target, drafter, prompt_ids, NEW_TOKENS)


def test_greedy_output_is_the_targets(
    sglang_outputs: list[dict[str, Any]], hf_reference: list[list[int]], reference: Any
) -> None:
    for i, (o, ref) in enumerate(zip(sglang_outputs, hf_reference, strict=True)):
        assert list(o["output_ids"]) == ref, f"prompt {i}: SGLang + our drafter != target"
        assert reference.outputs[i] == ref, f"prompt {i}: reference generator != target"


def test_accepted_lengths_equal_the_reference_generators(
    sglang_outputs: list[dict[str, Any]], reference: Any
) -> None:
    sglang = [
        (int(o["meta_info"]["spec_verify_ct"]), int(o["meta_info"]["spec_num_correct_drafts"]))
        for o in sglang_outputs
    ]
    ours = [(len(r), sum(a for _, a in r)) for r in reference.rounds]
    assert sglang == ours
    assert sum(a for _, a in ours) > 0, "no draft was ever accepted: the test exercises nothing"
