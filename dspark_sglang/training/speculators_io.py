"""vLLM speculators DSpark drafters to ours, checked against the target on both sides.

What ``dspark-sglang import-drafter --format speculators`` runs. The conversion is
``model.formats.speculators.import_to_ours``; here the target is loaded (speculators does
not record its depth, and our checkpoint names it), the folder is checked against it
before anything is written, and the result is read back through the loader that serves it.
"""

from __future__ import annotations

from pathlib import Path

from dspark_sglang.training.deepspec_io import _fresh, loaded_back

__all__ = ["import_speculators"]


def import_speculators(
    source: Path, dest: Path, *, target: str, sample_from_anchor: bool | None = None
) -> Path:
    """Write the speculators DSpark folder ``source`` in our format into ``dest`` for
    ``target``. ``sample_from_anchor`` states the slot layout of a file without the field
    (never guessed); a 1+N checkpoint is refused by name."""
    import json

    from dspark_sglang.model.checkpoint import CONFIG_FILE
    from dspark_sglang.model.formats.layout import is_speculators_config
    from dspark_sglang.model.formats.speculators import import_to_ours
    from dspark_sglang.training.export import load_target

    try:
        raw = json.loads((source / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        raw = None
    if not is_speculators_config(raw):
        raise ValueError(
            f"--from {source}: not a speculators DSpark folder (its config.json must say "
            "speculators_model_type: dspark)"
        )
    _fresh(dest, "--to")
    model, spec = load_target(target)
    out = import_to_ours(source, dest, target_hf_config=model.config.to_dict(),
                         target_name=spec.name, sample_from_anchor=sample_from_anchor)  # fmt: skip
    return loaded_back(out, model, spec)
