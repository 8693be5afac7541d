"""Ship a trained drafter: a checked copy for ``--speculative-draft-model-path``.

``export_drafter`` loads the checkpoint against its target (so any mismatch is
refused here, not in SGLang's scheduler), re-saves config and weights at the chosen
dtype and ships a validated STS file beside them as ``sts.json`` (and one fitted on
greedy rollouts as ``sts_greedy.json``, for greedy-only tiers). It replaces
only the files an export writes (a stale STS file belongs to the old drafter)
and keeps anything else in the folder, e.g. the README of a shipped drafter.

With a token map (``draft_vocab_size`` and ``draft_vocab_data``, a data-stage folder
of regenerated responses) the shipped drafter drafts over the ``K`` most frequent
response tokens only (``DSparkDrafter.restricted_to``): the same weights, a cheaper
draft pass, the drafter's distribution renormalised over the map. ``draft_vocab_by``
ranks the tokens by how often the responses hold them (``count``) or by the target's
probability mass over the response positions (``mass``, ``response_token_mass``).

``greedy_draft_vocab_size`` (with the same ``draft_vocab_data`` and ranking) ships the
full drafter instead, plus a greedy map of ``K`` tokens (``DSparkDrafter.with_greedy_vocab``):
SGLang drafts over it only when it drafts by argmax (``SGLANG_DSPARK_USE_GREEDY_DRAFT=1``,
greedy-only tiers) and over the whole vocabulary otherwise.

``narrow_to_greedy_map`` ships a drafter that carries a greedy map narrowed to that map
(``restricted_to``, no data needed): sampled requests then draft over it too. On a CPU
engine that makes a sampled round cheaper (each draft step works in the map's columns,
``sglang_integration/map_step.py``) for the drafter's mass outside the map.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dspark_sglang.calibration.sts import GREEDY_STS_FILENAME, STS_FILENAME

__all__ = ["EXPORTED_FILES", "ExportResult", "export_drafter", "load_target"]

EXPORTED_FILES = ("config.json", "model.safetensors", STS_FILENAME, GREEDY_STS_FILENAME)
DRAFT_VOCAB_RANKINGS = ("count", "mass")
"""How ``--draft-vocab-by`` ranks the target's tokens for the map."""
"""The files an export owns in its destination folder."""


@dataclass(frozen=True)
class ExportResult:
    kind: str
    source: Path
    dest: Path
    size_bytes: int
    #: Files in ``dest`` the export did not write (and left alone).
    kept: tuple[str, ...]
    #: ``training.token_map.coverage_report`` of the map the export applied, if any.
    draft_vocab: dict[str, object] | None = None
    #: ``coverage_report`` of the greedy map the export added, if any.
    greedy_draft_vocab: dict[str, object] | None = None
    #: Size of the source's greedy map the drafter was narrowed to (``narrow_to_greedy_map``).
    narrowed_to_greedy_map: int | None = None


def load_target(target: str, whole: bool = False) -> tuple[Any, Any]:
    """``(HF model, TargetSpec)`` of ``--target``: ``smollm2`` or an HF model folder, with
    only its embedding and LM head in memory (``targets.heads``) unless ``whole``: all a
    drafter's export, import or check reads, so a target sharded for serving never has to
    fit here. ``whole`` loads every weight (a ranking that runs the target)."""
    from dspark_sglang.model.config import TargetSpec
    from dspark_sglang.targets.heads import heads_only_model
    from dspark_sglang.targets.hf_target import target_name_of
    from dspark_sglang.targets.smollm2 import ensure_smollm2

    path = ensure_smollm2() if target == "smollm2" else Path(target)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"--target {path}: no config.json; pass an HF model folder")
    if whole:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(path))
    else:
        model = heads_only_model(path)
    return model, TargetSpec.from_hf_config(model.config, name=target_name_of(path))


def export_drafter(
    source: Path,
    dest: Path,
    *,
    dtype: str,
    sts: Path | None,
    target: str,
    sts_greedy: Path | None = None,
    draft_vocab_size: int | None = None,
    draft_vocab_data: Path | None = None,
    draft_vocab_by: str = "count",
    greedy_draft_vocab_size: int | None = None,
    narrow_to_greedy_map: bool = False,
    progress: bool = False,
) -> ExportResult:
    """Export the DSpark/DFlash drafter at ``source`` to ``dest`` (see the module doc).

    ``source`` is anything ``resolve_checkpoint`` accepts; ``target`` is ``smollm2``
    or an HF model folder; ``dtype`` a torch dtype name. Raises ``ValueError``
    (``CheckpointError`` included) or ``FileNotFoundError`` naming the flag and
    the fix, before anything is written.
    """
    if narrow_to_greedy_map and (
        draft_vocab_size is not None
        or greedy_draft_vocab_size is not None
        or draft_vocab_data is not None
    ):
        raise ValueError(
            "--narrow-to-greedy-map uses the drafter's own greedy map: drop --draft-vocab-size, "
            "--greedy-draft-vocab-size and --draft-vocab-data"
        )
    if draft_vocab_size is not None and greedy_draft_vocab_size is not None:
        raise ValueError(
            "--draft-vocab-size and --greedy-draft-vocab-size exclude each other: the first "
            "narrows the drafter for every request, the second ships the full drafter with a "
            "map for greedy-only tiers; pass one of them"
        )
    if greedy_draft_vocab_size is not None and draft_vocab_data is None:
        raise ValueError(
            "--greedy-draft-vocab-size needs --draft-vocab-data DIR: the data-stage folder "
            "whose responses the greedy map is counted from"
        )
    if (draft_vocab_size is None and greedy_draft_vocab_size is None) != (draft_vocab_data is None):
        raise ValueError(
            "--draft-vocab-size and --draft-vocab-data go together: the size K of the token "
            "map and the data-stage folder whose responses it is counted from"
        )
    if draft_vocab_by not in DRAFT_VOCAB_RANKINGS:
        raise ValueError(
            f"--draft-vocab-by {draft_vocab_by!r}: choose one of {', '.join(DRAFT_VOCAB_RANKINGS)}"
        )
    import shutil

    import torch

    from dspark_sglang.calibration.sts import load_sts
    from dspark_sglang.model.checkpoint import load_drafter, save_drafter
    from dspark_sglang.model.discovery import resolve_checkpoint

    ckpt = resolve_checkpoint("--from", source)
    if ckpt.kind == "ar":
        raise ValueError(
            f"--from {source}: an EAGLE3-style AR drafter; export ships DSpark/DFlash "
            "drafters (the SGLang DSPARK_MOE model class)"
        )
    for flag_name, given in (("--sts", sts), ("--sts-greedy", sts_greedy)):
        cal = load_sts(given) if given is not None else None
        if cal is not None and cal.block_size != ckpt.block_size:
            raise ValueError(
                f"{flag_name} has {cal.block_size} temperatures but the drafter's block size "
                f"is {ckpt.block_size}; fit STS on this drafter's rollouts"
            )
    maps = draft_vocab_size is not None or greedy_draft_vocab_size is not None
    runs_target = draft_vocab_by == "mass" and maps and draft_vocab_data is not None
    model, spec = load_target(target, whole=runs_target)
    drafter = load_drafter(
        ckpt.folder, spec, model.get_input_embeddings(), model.get_output_embeddings()
    )
    coverage = greedy_coverage = None
    map_size = draft_vocab_size if draft_vocab_size is not None else greedy_draft_vocab_size
    flag = "--draft-vocab-size" if draft_vocab_size is not None else "--greedy-draft-vocab-size"
    if map_size is not None and draft_vocab_data is not None:
        from dspark_sglang.training.token_map import (
            build_draft_vocab,
            coverage_report,
            response_token_counts,
            response_token_mass,
        )

        counts = response_token_counts(draft_vocab_data, spec.vocab_size)
        mass = None
        if draft_vocab_by == "mass":
            mass = response_token_mass(draft_vocab_data, model, spec.vocab_size, progress=progress)
        ranking = counts if mass is None else mass
        try:
            vocab = build_draft_vocab(draft_vocab_data, spec.vocab_size, map_size, ranking)
        except ValueError as exc:
            raise ValueError(f"{flag}: {exc}") from exc
        if draft_vocab_size is not None:
            drafter = drafter.restricted_to(vocab)
            coverage = coverage_report(counts, vocab, mass)
        else:
            try:
                drafter = drafter.with_greedy_vocab(vocab)
            except ValueError as exc:  # the source drafter is already narrowed
                raise ValueError(f"{flag}: {exc}") from exc
            greedy_coverage = coverage_report(counts, vocab, mass)
    narrowed_to = None
    if narrow_to_greedy_map:
        greedy_map = drafter.greedy_vocab
        if greedy_map is None:
            raise ValueError(
                f"--narrow-to-greedy-map: the drafter at {ckpt.folder} carries no greedy map; "
                "narrow it with --draft-vocab-size K --draft-vocab-data DIR instead"
            )
        drafter = drafter.restricted_to(greedy_map)
        narrowed_to = greedy_map.size
    if dest.exists() and not dest.is_dir():
        raise ValueError(f"--to {dest} is a file; give a folder")
    for name in EXPORTED_FILES:
        (dest / name).unlink(missing_ok=True)
    save_drafter(drafter, dest, dtype=getattr(torch, dtype))
    if sts is not None:
        shutil.copyfile(sts, dest / STS_FILENAME)
    if sts_greedy is not None:
        shutil.copyfile(sts_greedy, dest / GREEDY_STS_FILENAME)
    size = sum(dest.joinpath(n).stat().st_size for n in EXPORTED_FILES if (dest / n).is_file())
    kept = tuple(sorted(p.name for p in dest.iterdir() if p.name not in EXPORTED_FILES))
    return ExportResult(
        ckpt.kind, ckpt.folder, dest, size, kept, coverage, greedy_coverage, narrowed_to
    )
