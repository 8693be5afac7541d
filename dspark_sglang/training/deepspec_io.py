"""Our drafters to DeepSpec's layout and back, checked against the target on both sides.

What ``dspark-sglang export-drafter --format deepspec`` and ``import-drafter --format
deepspec`` run. The conversions are ``model.formats.deepspec`` (``export_from_ours``,
``import_to_ours``); here the target is loaded (DeepSpec stores its embedding and LM head,
we do not), every input is checked against it before anything is written, and the written
folder is read back through the loader that will serve it.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from dspark_sglang.calibration.sts import GREEDY_STS_FILENAME, STS_FILENAME

__all__ = ["export_deepspec", "import_deepspec"]


def _fresh(dest: Path, flag: str) -> None:
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ValueError(f"{flag} {dest} exists and is not an empty folder; give a new folder")


def export_deepspec(
    source: Path,
    dest: Path,
    *,
    target: str,
    dtype: str,
    sts: Path | None = None,
    sts_greedy: Path | None = None,
) -> Path:
    """Write our DSpark drafter at ``source`` (a run, step or drafter folder) in DeepSpec's
    layout into ``dest``, with the target's embedding and LM head at ``dtype``.

    A drafter DeepSpec cannot express (our MoE FFN, a sliding window, a token map, ...) is
    refused by ``export_from_ours``, naming the field, before ``dest`` is created. STS
    files are copied beside it (SGLang reads them by path; DeepSpec has none).
    """
    import torch

    from dspark_sglang.calibration.sts import load_sts
    from dspark_sglang.model.checkpoint import load_drafter, save_drafter
    from dspark_sglang.model.discovery import resolve_checkpoint
    from dspark_sglang.model.formats.deepspec import export_from_ours
    from dspark_sglang.training.export import load_target

    ckpt = resolve_checkpoint("--from", source)
    if ckpt.kind != "dspark":
        raise ValueError(
            f"--from {source}: a {ckpt.kind} drafter; DeepSpec's layout holds DSpark drafters "
            "(a Markov head and a confidence head) only"
        )
    for flag, given in (("--sts", sts), ("--sts-greedy", sts_greedy)):
        if given is not None and load_sts(given).block_size != ckpt.block_size:
            raise ValueError(f"{flag} {given} was not fit for block size {ckpt.block_size}")
    _fresh(dest, "--to")
    model, spec = load_target(target)
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    drafter = load_drafter(ckpt.folder, spec, emb, head)  # every check against the target
    with tempfile.TemporaryDirectory() as tmp:
        ours = save_drafter(drafter, Path(tmp) / "ours", dtype=getattr(torch, dtype))
        export_from_ours(ours, dest, embed_tokens=emb.weight, lm_head=head.weight)
    for name, given in ((STS_FILENAME, sts), (GREEDY_STS_FILENAME, sts_greedy)):
        if given is not None:
            shutil.copyfile(given, dest / name)
    return dest


def import_deepspec(source: Path, dest: Path, *, target: str) -> Path:
    """Write the DeepSpec drafter folder ``source`` in our format into ``dest`` for
    ``target``: its config and tensor header are checked against the target first, the
    result is loaded back with every tensor checked (finite values included)."""
    from dspark_sglang.model.formats.deepspec import check_checkpoint, import_to_ours
    from dspark_sglang.model.formats.layout import is_deepspec_folder
    from dspark_sglang.training.export import load_target

    if not is_deepspec_folder(source):
        raise ValueError(
            f"--from {source}: not a DeepSpec drafter folder (its config.json must name "
            "architectures ['Qwen3DSparkModel'] with the draft fields at the top level)"
        )
    _fresh(dest, "--to")
    model, spec = load_target(target)
    check_checkpoint(source, model.config.to_dict())
    return loaded_back(import_to_ours(source, dest, target_name=spec.name), model, spec)


def loaded_back(out: Path, model: Any, spec: Any) -> Path:
    """``out``, an imported drafter folder, once it loads with every tensor checked
    against the target (finite values included); removed if it does not, so nothing
    half-right stays behind."""
    from dspark_sglang.model.checkpoint import load_drafter

    try:
        load_drafter(out, spec, model.get_input_embeddings(), model.get_output_embeddings())
    except ValueError:
        shutil.rmtree(out)
        raise
    return out
