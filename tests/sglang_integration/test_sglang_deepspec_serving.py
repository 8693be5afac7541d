"""A dense drafter in DeepSpec's layout, served under DSPARK_MOE with our scheduler, and our
export of it served by SGLang's own DSPARK, through SGLang's CPU engine.

The drafter: a seeded dense DSpark drafter for SmolLM2 (no trained dense one exists; the
embedded drafter is MoE, which DeepSpec cannot express), its residual branches scaled
down 100x as ``shaped_drafter`` does for the MoE one, so slot 0 mostly proposes "the
anchor again" and is accepted wherever the target repeats a token; its confidence head
leans confident (bias 3) so ``prefix`` verifies drafts. Three folders of the same weights:

* DeepSpec's layout, written by this test (``tests/deepspec_layout.py``: DeepSpec's tensor
  names and shapes, ``build_draft_config`` over a Qwen3 copy of SmolLM2's config, plus the
  target's embedding and LM head), cross-checked against ``expected_tensors`` only;
* ours (``save_drafter``);
* our export of ours (``export_from_ours``).

Engines (float32, greedy, 8 prompts x 64 tokens): the DeepSpec folder and ours under
``DSPARK_MOE`` with one scheduler config (``prefix`` on the committed SmolLM2 cost table,
``draft_step_seconds: 0`` so no round timing enters the decision, argmax drafts); the
export under SGLang's ``DSPARK`` verifying every draft, in an engine whose plugin scope is
``cpu-bridges`` (``DSPARK_PLUGIN_SCOPE``): only the CPU platform shims that let SGLang run
on a CPU at all are installed, so the algorithm, the worker and the model class that serve
the export are SGLang's own, with nothing of this package on the draft path.

Checked: every output equals the target's greedy output (HF float32, itself equal to
SGLang's plain decoding in ``test_sglang_engine_cpu.py``; float32 engines, as the other
speculative greedy tests here, so an exact check); per request the DeepSpec folder's
verify rounds and accepted drafts equal ours; the export's equal the reference
generator's greedy verify-all with the same drafter; drafts were accepted.

Not guarded here: the mapping of target layer ids. The drafter's residual branches are so
small that its drafts barely depend on the injected context, so shifting every id by one
in the export leaves these counts unchanged (tried); the no-engine forward comparison in
``tests/model/test_model_formats_deepspec.py`` guards the ids.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from deepspec_layout import deepspec_shapes, seeded_dense_drafter, write_deepspec_like

from dspark_sglang.model import DSparkDrafter, save_drafter
from dspark_sglang.model.formats.deepspec import (
    DeepSpecConfig,
    expected_tensors,
    export_from_ours,
)
from dspark_sglang.scheduling.config import SchedulerConfig
from dspark_sglang.sglang_integration.engine import CpuEngineSpec, cpu_engine, generate_outputs
from dspark_sglang.sglang_integration.launch import scheduler_env
from dspark_sglang.sglang_integration.plugin import SCOPE_ENV

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

NEW_TOKENS = 64  # as the hf_reference fixture
BLOCK = 4
ROOT = Path(__file__).resolve().parents[2]
COST_TABLE = ROOT / "profiles" / "cpu-amd-epyc-avx2-2c" / "smollm2-135m-instruct-tp1.json"


@pytest.fixture(scope="module")
def target(smollm2_path: Path) -> Any:
    from dspark_sglang.targets.hf_target import HFTarget

    return HFTarget(smollm2_path)


@pytest.fixture(scope="module")
def drafter(target: Any) -> DSparkDrafter:
    return seeded_dense_drafter(target, BLOCK)


@pytest.fixture(scope="module")
def folders(
    smollm2_path: Path,
    target: Any,
    drafter: DSparkDrafter,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("deepspec_serving")
    deepspec = write_deepspec_like(drafter, target, smollm2_path / "config.json", tmp / "deepspec")
    cfg = json.loads((deepspec / "config.json").read_text())
    assert expected_tensors(DeepSpecConfig.from_hf_dict(cfg)) == deepspec_shapes(cfg)
    ours = save_drafter(drafter, tmp / "ours")
    return {
        "deepspec": deepspec,
        "ours": ours,
        "export": export_from_ours(
            ours,
            tmp / "export",
            embed_tokens=target.embed_tokens.weight,
            lm_head=target.lm_head.weight,
        ),
        "tmp": tmp,
    }


def _moe_outputs(
    smollm2_path: Path, folders: dict[str, Path], name: str, prompts: list[list[int]]
) -> list[dict[str, Any]]:
    cfg = folders["tmp"] / "scheduler.yaml"
    SchedulerConfig(
        block_size=BLOCK,
        policy="prefix",
        sla_name="deepspec",
        cost_table_path=str(COST_TABLE),
        draft_step_seconds=0.0,
        greedy_only=True,
        ragged_mode="compact",
    ).save(cfg)
    spec = CpuEngineSpec(
        model_path=str(smollm2_path),
        overrides={
            "speculative_algorithm": "DSPARK_MOE",
            "speculative_draft_model_path": str(folders[name]),
            "random_seed": 0,
        },
        env=scheduler_env(cfg),
    )
    with cpu_engine(spec) as engine:
        return generate_outputs(engine, prompts, NEW_TOKENS)


@pytest.fixture(scope="module")
def deepspec_outputs(
    smollm2_path: Path, folders: dict[str, Path], prompt_ids: list[list[int]]
) -> Iterator[list[dict[str, Any]]]:
    yield _moe_outputs(smollm2_path, folders, "deepspec", prompt_ids)


@pytest.fixture(scope="module")
def ours_outputs(
    smollm2_path: Path, folders: dict[str, Path], prompt_ids: list[list[int]]
) -> Iterator[list[dict[str, Any]]]:
    yield _moe_outputs(smollm2_path, folders, "ours", prompt_ids)


def _counts(outs: list[dict[str, Any]]) -> list[tuple[int, int]]:
    return [
        (int(o["meta_info"]["spec_verify_ct"]), int(o["meta_info"]["spec_num_correct_drafts"]))
        for o in outs
    ]


def _assert_targets(outs: list[dict[str, Any]], reference: list[list[int]], what: str) -> None:
    for i, (o, ref) in enumerate(zip(outs, reference, strict=True)):
        assert list(o["output_ids"]) == ref, f"prompt {i}: {what} != the target's greedy output"


def test_a_deepspec_folder_under_dspark_moe_decodes_the_targets_greedy_output(
    deepspec_outputs: list[dict[str, Any]], hf_reference: list[list[int]]
) -> None:
    _assert_targets(deepspec_outputs, hf_reference, "DeepSpec layout under DSPARK_MOE")
    assert sum(a for _, a in _counts(deepspec_outputs)) > 0, "no draft accepted: nothing tested"


def test_a_deepspec_folder_accepts_what_the_same_weights_in_ours_accept(
    deepspec_outputs: list[dict[str, Any]],
    ours_outputs: list[dict[str, Any]],
    hf_reference: list[list[int]],
) -> None:
    _assert_targets(ours_outputs, hf_reference, "our format under DSPARK_MOE")
    assert _counts(deepspec_outputs) == _counts(ours_outputs)


def test_our_export_under_sglangs_dspark_accepts_what_the_reference_accepts(
    smollm2_path: Path,
    folders: dict[str, Path],
    target: Any,
    drafter: DSparkDrafter,
    prompt_ids: list[list[int]],
    hf_reference: list[list[int]],
    greedy_verify_all_reference: Any,
) -> None:
    spec = CpuEngineSpec(
        model_path=str(smollm2_path),
        overrides={
            "speculative_algorithm": "DSPARK",
            "speculative_draft_model_path": str(folders["export"]),
            "random_seed": 0,
        },
        # Every draft verified, argmax drafts; of this package only the CPU bridges.
        env={**scheduler_env(None, greedy_draft=True), SCOPE_ENV: "cpu-bridges"},
    )
    with cpu_engine(spec) as engine:
        outs = generate_outputs(engine, prompt_ids, NEW_TOKENS)
    _assert_targets(outs, hf_reference, "our export under SGLang's DSPARK")
    ref = greedy_verify_all_reference(target, drafter, prompt_ids, NEW_TOKENS)
    assert _counts(outs) == [(len(r), sum(a for _, a in r)) for r in ref.rounds]
    assert sum(a for _, a in _counts(outs)) > 0, "no draft accepted: nothing tested"
