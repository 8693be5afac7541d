"""Find and classify drafter checkpoints on disk without loading weights.

A drafter folder holds ``config.json`` (DSpark/DFlash, ``model.checkpoint.save_drafter``)
or ``ar_config.json`` (EAGLE3-style AR, ``model.ar_drafter.save_ar_drafter``). Users
may also point at what the trainer writes around it: a ``step-NNNNNN`` folder (its
``drafter/`` subfolder) or a whole run's ``out_dir`` (its latest checkpoint). Benchmarks
and ``export-drafter`` resolve their paths here, so every command accepts the same
layouts and refuses an unknown one with the same message.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = ["AR_CONFIG", "DSPARK_CONFIG", "DrafterCheckpoint", "DrafterKind", "resolve_checkpoint"]

DrafterKind = Literal["dspark", "dflash", "ar"]
DSPARK_CONFIG = "config.json"
AR_CONFIG = "ar_config.json"


@dataclass(frozen=True)
class DrafterCheckpoint:
    """A drafter checkpoint folder found on disk, its kind, and a hash of its config.

    ``folder`` holds ``config.json`` (DSpark/DFlash: ``save_drafter``) or
    ``ar_config.json`` (EAGLE3-style AR: ``save_ar_drafter``). ``kind`` is
    ``dflash`` for a DSpark-format drafter without a sequential (Markov) head.
    """

    name: str
    kind: DrafterKind
    folder: Path
    config_file: Path
    config_sha256: str
    block_size: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "path": str(self.folder),
            "config_file": str(self.config_file),
            "config_sha256": self.config_sha256,
            "block_size": self.block_size,
        }


def _drafter_folder(path: Path) -> Path:
    """The folder holding the drafter config, given it, a ``step-N`` folder or a run dir."""
    root = path / "checkpoints"
    steps = (
        sorted(c for c in root.glob("step-*") if (c / "drafter").is_dir()) if path.is_dir() else []
    )
    if steps:  # a training run's out_dir (its config.json is the run's): latest checkpoint
        return _drafter_folder(steps[-1])
    if (path / "drafter").is_dir():  # trainer checkpoint: step-NNNNNN/drafter/
        return _drafter_folder(path / "drafter")
    return path


def resolve_checkpoint(name: str, path: str | Path) -> DrafterCheckpoint:
    """Find and classify a drafter checkpoint without loading weights (fails fast).

    ``path`` may be the drafter folder, a trainer ``step-NNNNNN`` folder or a
    training run's ``out_dir`` (its latest checkpoint is used).
    """
    from dspark_sglang.model.ar_drafter import ARDrafterConfig
    from dspark_sglang.model.config import DSparkConfig

    given = Path(path).expanduser()
    if not given.exists():
        raise FileNotFoundError(
            f"drafter {name!r}: {given} does not exist; pass a checkpoint folder "
            "(runs/train/<run>/checkpoints/step-NNNNNN or its drafter/ subfolder)"
        )
    folder = _drafter_folder(given).resolve()
    if (folder / AR_CONFIG).is_file():
        cfg_file = folder / AR_CONFIG
        raw = cfg_file.read_bytes()
        try:
            ar_cfg = ARDrafterConfig.from_dict(json.loads(raw))
        except (ValueError, TypeError) as exc:
            raise ValueError(
                f"drafter {name!r}: {cfg_file} is not an AR drafter config: {exc}"
            ) from exc
        kind: DrafterKind = "ar"
        block = ar_cfg.block_size
    elif (folder / DSPARK_CONFIG).is_file():
        cfg_file = folder / DSPARK_CONFIG
        raw = cfg_file.read_bytes()
        try:
            cfg = DSparkConfig.from_hf_dict(json.loads(raw))
        except (ValueError, TypeError) as exc:
            raise ValueError(
                f"drafter {name!r}: unknown drafter kind: {cfg_file} is neither a DSpark/DFlash "
                f"drafter config (save_drafter) nor an AR one (ar_config.json): {exc}"
            ) from exc
        kind = "dflash" if cfg.markov_head_type == "none" else "dspark"
        block = cfg.block_size
    else:
        raise ValueError(
            f"drafter {name!r}: unknown drafter kind: {folder} has neither {DSPARK_CONFIG} "
            f"(DSpark/DFlash, save_drafter) nor {AR_CONFIG} (EAGLE3-style AR, save_ar_drafter); "
            "pass a checkpoint folder written by `dspark-sglang train`"
        )
    return DrafterCheckpoint(
        name=name,
        kind=kind,
        folder=folder,
        config_file=cfg_file,
        config_sha256=hashlib.sha256(raw).hexdigest(),
        block_size=block,
    )
