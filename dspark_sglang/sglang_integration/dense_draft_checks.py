"""Start-up checks for drafters SGLang's own dense DSpark class serves under DSPARK_MOE.

Our MoE drafter is checked against the target by ``moe_draft_model.check_loaded_draft``;
a DeepSpec-layout folder (``model.formats.layout``) or SGLang's native dense layout is
built by SGLang's ``DSparkDraftModel`` family (``sglang/srt/models/dspark.py``), which
checks little against the target: a layer id past the target's captured layers, a block
size that is not the one SGLang drafts (``speculative_dspark_components/dspark_config.py``
only warns) or another vocabulary would serve garbage drafts. Three gates, each naming the
field and the fix:

* :func:`check_folder_at_launch`, from ``launch.check_server_args`` in the engine process:
  a DeepSpec folder's ``config.json`` and safetensors header (``formats.deepspec.
  check_checkpoint``: sizes, tensor names, shapes, dtypes), before any process allocates;
* :func:`check_folder_before_load`, from the worker's constructor before SGLang builds the
  draft: the same header check against the target SGLang loaded (hidden size, vocabulary,
  depth, layer ids);
* :func:`check_loaded_dense_draft`, after SGLang built it: what SGLang itself parsed from
  the draft config (its layer ids and block size, for any dense layout) against the target
  and the block it drafts.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dspark_sglang.model.checkpoint import CheckpointError
from dspark_sglang.model.formats.layout import is_deepspec_folder

__all__ = ["check_folder_at_launch", "check_folder_before_load", "check_loaded_dense_draft"]


def check_folder_at_launch(folder: str | Path) -> None:
    """A DeepSpec folder's config and tensor header (no target yet); other folders pass."""
    if is_deepspec_folder(folder):
        from dspark_sglang.model.formats.deepspec import check_checkpoint

        check_checkpoint(folder)


def _draft_path(target_worker: Any) -> str | None:
    runner = getattr(target_worker, "model_runner", None)
    draft = getattr(getattr(runner, "spec_aux_config", None), "draft_model_config", None)
    return None if draft is None else str(draft.model_path)


def _target_config(target_worker: Any) -> Mapping[str, Any]:
    hf = target_worker.model_runner.model_config.hf_text_config
    return hf if isinstance(hf, Mapping) else hf.to_dict()


def check_folder_before_load(target_worker: Any) -> None:
    """``check_checkpoint`` of a DeepSpec draft folder against the target SGLang loaded.

    Runs before SGLang builds the draft; a hub id or another layout passes (checked once
    built). A ``dummy`` draft load format (random weights, tests) skips the header, which
    then need not exist.
    """
    path = _draft_path(target_worker)
    if path is None or not Path(path).is_dir() or not is_deepspec_folder(path):
        return
    from sglang.srt.runtime_context import get_spec

    if get_spec().speculative_draft_load_format == "dummy":
        return
    from dspark_sglang.model.formats.deepspec import check_checkpoint

    check_checkpoint(path, _target_config(target_worker))


def check_loaded_dense_draft(draft_model: Any, target_hf: Any, gamma: int) -> None:
    """Refuse an SGLang dense DSpark draft that does not fit the target or the block.

    Reads what SGLang parsed (``parse_dspark_draft_config``), so the block size and layer
    ids are the ones it runs whatever nesting the config uses. Other draft classes pass.
    """
    from sglang.srt.models.dspark import DSparkDraftModel
    from sglang.srt.speculative.dspark_components.dspark_config import parse_dspark_draft_config

    if not isinstance(draft_model, DSparkDraftModel):
        return
    hf = draft_model.config
    where = f"draft {getattr(hf, 'architectures', None)}"
    parsed = parse_dspark_draft_config(draft_hf_config=hf)
    t = target_hf if isinstance(target_hf, Mapping) else target_hf.to_dict()
    for name in ("hidden_size", "vocab_size"):
        ours, theirs = getattr(hf, name, None), t.get(name)
        if ours != theirs:
            raise CheckpointError(
                f"{where}: {name}={ours} but the target's {name} is {theirs}; use a drafter "
                "trained for this target"
            )
    layers = int(t["num_hidden_layers"])
    for i, lid in enumerate(parsed.target_layer_ids or ()):
        if not 0 <= lid <= layers - 2:
            raise CheckpointError(
                f"{where}: target_layer_ids[{i}]={lid} but the target has {layers} layers: ids "
                f"must lie in [0, {layers - 2}] (SGLang captures layer L's output before layer "
                "L+1 runs, never the last layer's); use a drafter trained for this target"
            )
    if parsed.gamma is not None and int(parsed.gamma) != int(gamma):
        raise CheckpointError(
            f"{where}: block_size={parsed.gamma} but SGLang drafts {gamma} tokens per round "
            f"(--speculative-num-draft-tokens {int(gamma) + 1}); pass "
            f"--speculative-num-draft-tokens {int(parsed.gamma) + 1} or omit it"
        )
