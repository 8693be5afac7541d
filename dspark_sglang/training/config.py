"""Training run configuration: one YAML file -> one validated, frozen ``TrainConfig``.

Why a strict schema: a typo in a config key (``warmup_step``) that is silently
ignored costs a 2-hour CPU run. Every section is a frozen dataclass that
validates its own fields; unknown keys anywhere are refused with the allowed
names listed. Relative paths in the file are resolved against the repository
root (the parent of ``configs/``) so a run behaves the same from any cwd.

Why ``base:``: an ablation or scale-up is only readable as "the recipe, with
this changed". A config may name another config file (``base: x.yaml``,
relative to its own folder); its mappings are merged key by key over the
base's, so the file holds exactly the knobs it changes. It must still set its
own ``name`` and ``run.out_dir``, or two runs would share one checkpoint folder.

This module holds ``TrainConfig`` and the YAML loader. The sections live in
``config_sections`` (target, drafter, optim, run) and ``config_data`` (data), their
shared field checks in ``config_checks``; every name is re-exported here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dspark_sglang.training.anchors import AnchorConfig
from dspark_sglang.training.config_checks import COMPUTE_DTYPES
from dspark_sglang.training.config_data import (
    GENERATORS,
    PROMPT_DOMAINS,
    RESERVED_SGLANG_ARGS,
    RESERVED_TEMPLATE_KWARGS,
    BuiltinSource,
    DataConfig,
    DataSource,
    HiddenStatesMode,
    JsonlSource,
    check_data_temperature,
)
from dspark_sglang.training.config_sections import (
    PARALLEL_MODES,
    TARGET_DTYPES,
    DrafterKind,
    DrafterSection,
    OptimConfig,
    RunConfig,
    TargetConfig,
)
from dspark_sglang.training.losses import LossConfig

__all__ = [
    "BASE_KEY",
    "COMPUTE_DTYPES",
    "GENERATORS",
    "PARALLEL_MODES",
    "PROMPT_DOMAINS",
    "RESERVED_SGLANG_ARGS",
    "RESERVED_TEMPLATE_KWARGS",
    "TARGET_DTYPES",
    "BuiltinSource",
    "DataConfig",
    "DataSource",
    "DrafterKind",
    "DrafterSection",
    "HiddenStatesMode",
    "JsonlSource",
    "OptimConfig",
    "RunConfig",
    "TargetConfig",
    "TrainConfig",
    "check_data_temperature",
    "load_config",
    "merge_config",
]

_SECTIONS: dict[str, type] = {
    "target": TargetConfig,
    "data": DataConfig,
    "drafter": DrafterSection,
    "anchors": AnchorConfig,
    "loss": LossConfig,
    "optim": OptimConfig,
    "run": RunConfig,
}


@dataclass(frozen=True)
class TrainConfig:
    name: str
    target: TargetConfig
    data: DataConfig
    drafter: DrafterSection
    anchors: AnchorConfig
    loss: LossConfig
    optim: OptimConfig
    run: RunConfig

    def __post_init__(self) -> None:
        if self.anchors.block_size != self.drafter.block_size:
            raise ValueError(
                f"anchors.block_size ({self.anchors.block_size}) must equal drafter.block_size "
                f"({self.drafter.block_size}); set only drafter.block_size"
            )

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], base_dir: Path | None = None) -> TrainConfig:
        """Validate a parsed YAML mapping; relative paths resolve against ``base_dir``."""
        if not isinstance(raw, Mapping):
            raise ValueError(f"a training config must be a YAML mapping, got {type(raw).__name__}")
        allowed = {"name", *_SECTIONS}
        unknown = sorted(set(raw) - allowed)
        if unknown:
            raise ValueError(f"unknown top-level config keys {unknown}; allowed: {sorted(allowed)}")
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError("config needs a non-empty 'name' (used in logs and plots)")
        sections: dict[str, Any] = {}
        for key, klass in _SECTIONS.items():
            body = raw.get(key) or {}
            if not isinstance(body, Mapping):
                raise ValueError(f"config section '{key}' must be a mapping, got {body!r}")
            body = dict(body)
            if key == "anchors":
                if "block_size" in body:
                    raise ValueError("anchors.block_size is derived; set drafter.block_size")
                body["block_size"] = (raw.get("drafter") or {}).get("block_size", 7)
            known = {f.name for f in dataclasses.fields(klass)}
            bad = sorted(set(body) - known)
            if bad:
                raise ValueError(
                    f"unknown keys {[f'{key}.{b}' for b in bad]}; allowed in '{key}': "
                    f"{sorted(known - {'block_size'} if key == 'anchors' else known)}"
                )
            if key == "target" and body.get("layer_ids") is not None:
                body["layer_ids"] = tuple(body["layer_ids"])
            sections[key] = klass(**body)
        cfg = cls(name=name, **sections)
        if base_dir is not None:
            cfg = cfg.resolve_paths(base_dir)
        return cfg

    def resolve_paths(self, base_dir: Path) -> TrainConfig:
        def res(p: str) -> str:
            return str(p if Path(p).is_absolute() else (base_dir / p).resolve())

        return dataclasses.replace(
            self,
            data=self.data.resolve_paths(res),
            run=dataclasses.replace(
                self.run,
                out_dir=res(self.run.out_dir),
                init_from=None if self.run.init_from is None else res(self.run.init_from),
            ),
        )

    def with_overrides(self, **sections: Mapping[str, Any]) -> TrainConfig:
        """A copy with some fields of some sections replaced (CLI flags, tests)."""
        out = self
        for key, values in sections.items():
            out = dataclasses.replace(
                out, **{key: dataclasses.replace(getattr(out, key), **values)}
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["drafter"]["model"] = dict(self.drafter.model)
        return d


BASE_KEY = "base"
"""Top-level key naming the config file this one changes (see the module docstring)."""


def merge_config(base: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``changes`` over ``base``: mappings merge key by key, anything else replaces.

    Invariant: every key of either input is in the result, and a value from
    ``changes`` wins wherever both hold a non-mapping (lists replace whole).
    """
    out = dict(base)
    for key, value in changes.items():
        old = out.get(key)
        if isinstance(value, Mapping) and isinstance(old, Mapping):
            out[key] = merge_config(old, value)
        else:
            out[key] = value
    return out


def _read_raw(path: Path, seen: tuple[Path, ...] = ()) -> Any:
    """The YAML mapping of ``path`` with its ``base`` chain merged in (base first)."""
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"{path} is not valid YAML: {exc}") from exc
    if not isinstance(raw, Mapping) or BASE_KEY not in raw:
        return raw
    raw = dict(raw)
    parent = raw.pop(BASE_KEY)
    if not isinstance(parent, str) or not parent.strip():
        raise ValueError(
            f"{path}: '{BASE_KEY}' must be the path of another config YAML, relative to "
            f"{path.parent}; got {parent!r}"
        )
    parent_path = (path.parent / parent).resolve()
    chain = (*seen, path.resolve())
    if parent_path in chain:
        loop = " -> ".join(p.name for p in (*chain, parent_path))
        raise ValueError(f"{path}: '{BASE_KEY}' chain loops ({loop}); point it at the recipe")
    if not parent_path.is_file():
        raise ValueError(
            f"{path}: '{BASE_KEY}: {parent}' not found (looked for {parent_path}); "
            f"give a path relative to {path.parent}"
        )
    run = raw.get("run")
    out_dir = run.get("out_dir") if isinstance(run, Mapping) else None
    if not raw.get("name") or not out_dir:
        raise ValueError(
            f"{path}: a config with '{BASE_KEY}' must set its own 'name' and 'run.out_dir' "
            "(inherited ones would make two runs share one checkpoint folder)"
        )
    base_raw = _read_raw(parent_path, chain)
    if not isinstance(base_raw, Mapping):
        raise ValueError(f"{parent_path} (the '{BASE_KEY}' of {path}) is not a YAML mapping")
    return merge_config(base_raw, raw)


def load_config(path: str | Path) -> TrainConfig:
    """Parse and validate a YAML training config (paths relative to the repo root)."""
    path = Path(path)
    raw = _read_raw(path)
    base = path.resolve().parent
    # Configs may live in subfolders (configs/ablations/): the root is above ``configs/``.
    configs_dir = next((d for d in (base, *base.parents) if d.name == "configs"), None)
    if configs_dir is not None:
        base = configs_dir.parent
    try:
        return TrainConfig.from_dict(raw, base_dir=base)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from exc
