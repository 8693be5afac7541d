"""Rebuild a profile's table, ConfigMap and plot from its ``.meta.json``, measuring nothing.

Why: the meta sidecar keeps every measured probe, so a change in how tables are
written from probes (``floor_table.py``) should not cost a re-measurement on
every node. The stairs are recomputed from the probes with the grid's own
thresholds; the meta's record of how it was measured is kept as it was.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from dspark_sglang.profiling.artifacts import (
    META_SCHEMA,
    _atomic_write,
    floor_entries,
    probes_stairs,
    table_from_entries,
    table_note,
)
from dspark_sglang.profiling.configmap import build_configmap, write_configmap
from dspark_sglang.profiling.measure import GridSpec, Probe


def _meta_field(meta: dict[str, Any], key: str, path: Path) -> Any:
    if key not in meta:
        raise ValueError(
            f"{path}: meta has no {key!r}; is this a dspark-sglang profile .meta.json?"
        )
    return meta[key]


def rerender(meta_path: Path, *, floor_tolerance: float, plot: bool = True) -> dict[str, Path]:
    """Rewrite ``<stem>.json``, ``<stem>.configmap.yaml`` (+ ``.png``) beside ``meta_path``."""
    meta_path = Path(meta_path)
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    if not isinstance(meta, dict) or meta.get("schema") != META_SCHEMA:
        raise ValueError(
            f"{meta_path}: schema is {meta.get('schema') if isinstance(meta, dict) else None!r}, "
            f"expected {META_SCHEMA!r}; pass the .meta.json written by `dspark-sglang profile`"
        )
    probes = tuple(Probe.from_dict(p) for p in _meta_field(meta, "probes", meta_path))
    spec = dict(_meta_field(meta, "grid", meta_path)["spec"])
    if spec.get("points") is not None:
        spec["points"] = tuple(spec["points"])
    try:
        grid = GridSpec(**spec)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{meta_path}: grid.spec is not a valid probe grid: {exc}") from exc
    stairs = probes_stairs(probes, grid)
    max_tokens = max(grid.max_tokens, probes[-1].batch_tokens)
    entries = floor_entries(probes, stairs, floor_tolerance)
    table = table_from_entries(entries, max_tokens)
    meta["stairs"] = [s.to_dict() for s in stairs]
    meta["table"] = table_note(entries)

    table_path = meta_path.with_name(_meta_field(meta, "table_file", meta_path))
    stem = table_path.stem
    cm_path = table_path.with_name(f"{stem}.configmap.yaml")
    namespace = "default"
    if cm_path.exists():
        namespace = yaml.safe_load(cm_path.read_text(encoding="utf-8"))["metadata"]["namespace"]
    text = table.to_json()
    # Atomic, as in write_group: a crashed re-render must not leave a torn table to a fleet.
    _atomic_write(table_path, text)
    _atomic_write(meta_path, json.dumps(meta, indent=2, sort_keys=False) + "\n")
    write_configmap(cm_path, build_configmap(meta["hardware_slug"], text, meta, namespace))
    out = {"table": table_path, "meta": meta_path, "configmap": cm_path}
    if plot:
        from dspark_sglang.profiling.plot import plot_staircase

        png = table_path.with_name(f"{stem}.png")
        title = f"{meta['model']} tp{meta['tp_size']} on {meta['hardware_slug']} (re-rendered)"
        out["plot"] = plot_staircase(png, probes, stairs, title, table=table)
    return out
