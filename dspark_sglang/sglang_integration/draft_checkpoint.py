"""Reading our drafter checkpoints inside SGLang, without importing SGLang's models.

Why a separate module: the plugin must make ``AutoConfig`` understand
``model_type: dspark_moe`` in *every* SGLang process (the engine process
resolves server args from the draft's ``config.json`` before any scheduler
exists), and that must stay cheap; the model class itself
(``moe_draft_model.py``) imports SGLang's model stack and is only loaded where
a draft is built. The same checks the training-side loader applies
(``model/checkpoint.py``) gate the checkpoint here, with errors naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformers import PretrainedConfig

from dspark_sglang.model.checkpoint import CheckpointError, check_compatible
from dspark_sglang.model.config import HF_MODEL_TYPE, DSparkConfig, TargetSpec, check_torch_dtype


class DSparkMoeHFConfig(PretrainedConfig):
    """transformers config class for ``model_type: dspark_moe`` (fields kept as written)."""

    model_type = HF_MODEL_TYPE


def register_hf_config() -> None:
    """Make ``AutoConfig`` know ``dspark_moe`` (idempotent)."""
    from transformers import AutoConfig

    AutoConfig.register(HF_MODEL_TYPE, DSparkMoeHFConfig, exist_ok=True)


def dspark_config_of(hf_config: Any) -> DSparkConfig:
    """Our validated ``DSparkConfig`` from SGLang's view of the draft's ``config.json``.

    Refuses what cannot run under SGLang's DSpark worker: a ``dflash`` slot
    convention (SGLang's ``sample_from_anchor`` layout is ``anchor_next``), a
    drafter without a Markov head (SGLang's DSpark requires one) and a
    ``torch_dtype`` that is not a floating dtype (``--dtype auto`` would run it so).
    """
    raw = getattr(hf_config, "dspark_config", None)
    if not isinstance(raw, Mapping):
        raise CheckpointError(
            "draft config.json has no dspark_config object: it is not a checkpoint written "
            "by dspark_sglang.model.save_drafter (architectures "
            f"{getattr(hf_config, 'architectures', None)!r}); re-save the drafter"
        )
    dtype = getattr(hf_config, "dtype", None)  # transformers' parse of torch_dtype
    try:
        if dtype is not None:
            check_torch_dtype(str(dtype).removeprefix("torch."))
        config = DSparkConfig.from_dict(raw)
    except ValueError as exc:
        raise CheckpointError(f"draft config.json: {exc}") from exc
    if config.slot_convention != "anchor_next":
        raise CheckpointError(
            f"draft slot_convention={config.slot_convention!r}: SGLang's DSpark worker "
            "(sample_from_anchor) needs 'anchor_next' (slot k predicts anchor+k+1); "
            "retrain or convert the drafter"
        )
    if config.markov_head_type == "none":
        raise CheckpointError(
            "draft markov_head_type='none': SGLang's DSpark worker requires a Markov head "
            "(vanilla, gated or rnn); use a drafter trained with one"
        )
    return config


def check_against_target(config: DSparkConfig, target_hf_config: Any, gamma: int) -> None:
    """``check_compatible`` with the target SGLang loaded and the block it will draft.

    The target's *name* is not knowable from SGLang's model path, so the
    structural facts are checked (vocabulary, hidden size, depth, layer ids)
    and the name is taken from the checkpoint. ``gamma`` (SGLang's
    ``speculative_num_draft_tokens - 1``) must equal the trained block size.
    """
    target = TargetSpec.from_hf_config(target_hf_config, name=config.target_name)
    check_compatible(config, target, block_size=gamma, expected_slot_convention="anchor_next")
