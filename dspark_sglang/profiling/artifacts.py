"""Profiles on disk: one node's measurement, merged groups, and the file layout.

Layout (``profiles/`` in the repo, or any output root)::

    <root>/<hardware-slug>/<model>-tp<N>.json        SGLang-loadable SpsCostTable
    <root>/<hardware-slug>/<model>-tp<N>.meta.json   how/where/when it was measured
    <root>/<hardware-slug>/<model>-tp<N>.png         staircase plot

The table file holds *only* SGLang's three keys (SGLang 0.5.23 rejects nothing
but our own loader forbids unknown keys, and the Helm chart mounts it verbatim);
everything else lives in the ``.meta.json`` sidecar. Files are written to a
temporary name and renamed, so a crashed or repeated run never leaves a torn file
and re-running overwrites the same paths (idempotent).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import itertools
import json
import platform
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dspark_sglang.profiling.backend import BackendInfo
from dspark_sglang.profiling.floor_table import DEFAULT_FLOOR_TOLERANCE, FloorTable, floor_table
from dspark_sglang.profiling.hardware import HardwareFingerprint, slugify
from dspark_sglang.profiling.measure import GridSpec, MeasureConfig, Probe
from dspark_sglang.profiling.stairs import Stair, detect_stairs
from dspark_sglang.scheduling.cost_table import SpsCostTable, from_probes

META_SCHEMA = "dspark-sglang/sps-profile-meta/v1"
ADDITIVE_NOTE = (
    "not written: an SpsAdditiveCostTable separates per-request from per-token cost and "
    "needs probes that vary the request count at fixed batch tokens; this profile sweeps "
    "batch tokens only (one request layout per size), so the split is not identifiable"
)


def software_versions() -> dict[str, str]:
    """Versions that change kernels and therefore the staircase."""
    from importlib import metadata

    import torch

    out = {"python": platform.python_version(), "torch": torch.__version__}
    for dist in ("sglang", "transformers", "dspark-sglang"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not-installed"
    return out


def utc_now() -> str:
    return _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat()


def _check_probes(probes: Sequence[Probe], where: str) -> None:
    if not probes:
        raise ValueError(f"{where}: no probes (empty grid?); measure at least one batch size")
    b = [p.batch_tokens for p in probes]
    if any(b1 <= b0 for b0, b1 in itertools.pairwise(b)):
        raise ValueError(
            f"{where}: probes must be strictly increasing in batch_tokens (non-monotone or "
            f"duplicate probes {b}); sort them and median repeated sizes"
        )


@dataclass(frozen=True)
class NodeProfile:
    """One node's measured staircase plus everything needed to trust or reject it."""

    node: str
    hardware: HardwareFingerprint
    backend: BackendInfo
    grid: GridSpec
    measure: MeasureConfig
    probes: tuple[Probe, ...]
    versions: dict[str, str]
    started_at: str
    finished_at: str

    def __post_init__(self) -> None:
        if not self.node:
            raise ValueError("NodeProfile.node must be a non-empty node name")
        _check_probes(self.probes, f"NodeProfile({self.node}).probes")

    @property
    def config_key(self) -> str:
        """Hash of everything that must match for a stored result to be reused."""
        return config_key(self.hardware, self.backend, self.grid, self.measure)

    def stairs(self) -> list[Stair]:
        return probes_stairs(self.probes, self.grid)

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "hardware": self.hardware.to_dict(),
            "backend": _backend_dict(self.backend),
            "grid": self.grid.to_dict(),
            "measure": self.measure.to_dict(),
            "probes": [p.to_dict() for p in self.probes],
            "versions": dict(self.versions),
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "config_key": self.config_key,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> NodeProfile:
        try:
            grid = dict(d["grid"])
            if grid.get("points") is not None:
                grid["points"] = tuple(grid["points"])
            return cls(
                node=str(d["node"]),
                hardware=HardwareFingerprint.from_dict(d["hardware"]),
                backend=BackendInfo(**d["backend"]),
                grid=GridSpec(**grid),
                measure=MeasureConfig(**d["measure"]),
                probes=tuple(Probe.from_dict(p) for p in d["probes"]),
                versions={str(k): str(v) for k, v in d["versions"].items()},
                started_at=str(d["started_at"]),
                finished_at=str(d["finished_at"]),
            )
        except KeyError as exc:
            raise ValueError(f"node profile is missing field {exc.args[0]!r}") from None


def _backend_dict(info: BackendInfo) -> dict[str, Any]:
    return {
        "kind": info.kind,
        "model": info.model,
        "dtype": info.dtype,
        "tp_size": info.tp_size,
        "device": info.device,
        "settings": dict(info.settings),
    }


def config_key(
    hardware: HardwareFingerprint, backend: BackendInfo, grid: GridSpec, measure: MeasureConfig
) -> str:
    blob = json.dumps(
        [hardware.to_dict(), _backend_dict(backend), grid.to_dict(), measure.to_dict()],
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def probes_stairs(probes: Sequence[Probe], grid: GridSpec) -> list[Stair]:
    return detect_stairs(
        [p.batch_tokens for p in probes],
        [p.steps_per_sec for p in probes],
        [p.median_se for p in probes],
        threshold=grid.drop_threshold,
        noise_k=grid.noise_k,
    )


def floor_entries(
    probes: Sequence[Probe], stairs: Sequence[Stair] = (), floor_tolerance: float = 0.0
) -> FloorTable:
    """Table entries for ``probes``: measured, plus interpolated ones on smooth stretches."""
    _check_probes(probes, "cost_table")
    return floor_table(
        [p.batch_tokens for p in probes],
        [p.steps_per_sec for p in probes],
        [(s.lo_tokens, s.hi_tokens) for s in stairs],
        floor_tolerance,
    )


def cost_table(
    probes: Sequence[Probe],
    max_batch_tokens: int | None = None,
    *,
    stairs: Sequence[Stair] = (),
    floor_tolerance: float = 0.0,
) -> SpsCostTable:
    """The SGLang staircase table for ``probes``.

    With ``floor_tolerance > 0`` smooth intervals get interpolated entries so that
    SGLang's floor lookup does not invent free tokens between sparse probes
    (``floor_table.py``); ``stairs`` keep their flat-then-cliff shape.
    """
    return table_from_entries(floor_entries(probes, stairs, floor_tolerance), max_batch_tokens)


def table_from_entries(entries: FloorTable, max_batch_tokens: int | None = None) -> SpsCostTable:
    return from_probes(
        list(zip(entries.batch_tokens, entries.steps_per_sec, strict=True)), max_batch_tokens
    )


def _floor_lookup(probes: Sequence[Probe], b: int) -> Probe:
    idx = 0
    for i, p in enumerate(probes):
        if p.batch_tokens <= b:
            idx = i
    return probes[idx]


@dataclass(frozen=True)
class GroupProfile:
    """Nodes with one hardware fingerprint, merged into one table.

    ``probes`` is the per-size median over nodes, each node's staircase evaluated
    by floor lookup on the union of all nodes' probe sizes (refinement makes grids
    differ). ``deviation[node]`` is the mean relative distance of that node's curve
    from the merged one; ``flagged`` lists nodes above the threshold (a bad node,
    thermal throttling, a different driver). The median merge already keeps one
    outlier among three or more nodes from moving the table; with two nodes a
    deviation flags both, since the data cannot tell which one is wrong.
    """

    group: str
    hardware: HardwareFingerprint
    nodes: tuple[NodeProfile, ...]
    probes: tuple[Probe, ...]
    deviation: dict[str, float]
    flagged: tuple[str, ...]
    threshold: float
    drivers: dict[str, str] = field(default_factory=dict)

    @property
    def model(self) -> str:
        return self.nodes[0].backend.model

    @property
    def tp_size(self) -> int:
        return self.nodes[0].backend.tp_size

    @property
    def max_batch_tokens(self) -> int:
        return max(n.grid.max_tokens for n in self.nodes)

    def stairs(self) -> list[Stair]:
        return probes_stairs(self.probes, self.nodes[0].grid)


def merge_profiles(nodes: Sequence[NodeProfile], threshold: float = 0.10) -> GroupProfile:
    """Merge same-hardware node profiles; refuse anything that should not share a table."""
    if not nodes:
        raise ValueError("merge_profiles: no node profiles to merge")
    if not threshold > 0:
        raise ValueError(f"merge_profiles: threshold must be > 0, got {threshold}")
    first = nodes[0]
    names = [n.node for n in nodes]
    if len(set(names)) != len(names):
        raise ValueError(f"merge_profiles: duplicate node names {sorted(names)}")
    for n in nodes[1:]:
        if n.hardware.slug != first.hardware.slug:
            raise ValueError(
                f"merge_profiles: mismatched hardware: node {n.node!r} is {n.hardware.slug!r} "
                f"but node {first.node!r} is {first.hardware.slug!r}; group nodes by "
                "hardware fingerprint before merging"
            )
        for attr in ("model", "tp_size", "dtype", "kind"):
            a, b = getattr(n.backend, attr), getattr(first.backend, attr)
            if a != b:
                raise ValueError(
                    f"merge_profiles: mismatched backend {attr}: node {n.node!r} has {a!r}, "
                    f"node {first.node!r} has {b!r}; profile one configuration per table"
                )
    sizes = sorted({p.batch_tokens for n in nodes for p in n.probes})
    merged: list[Probe] = []
    per_node: dict[str, list[float]] = {n.node: [] for n in nodes}
    for b in sizes:
        at = [_floor_lookup(n.probes, b) for n in nodes]
        for n, p in zip(nodes, at, strict=True):
            per_node[n.node].append(p.steps_per_sec)
        sps = statistics.median(p.steps_per_sec for p in at)
        merged.append(
            Probe(
                batch_tokens=b,
                steps_per_sec=sps,
                median_step_s=1.0 / sps,
                spread=statistics.median(p.spread for p in at),
                samples=sum(p.samples for p in at),
                median_se=statistics.median(p.median_se for p in at),
            )
        )
    deviation = {
        name: statistics.fmean(
            abs(v / m.steps_per_sec - 1.0) for v, m in zip(vals, merged, strict=True)
        )
        for name, vals in per_node.items()
    }
    return GroupProfile(
        group=first.hardware.slug,
        hardware=first.hardware,
        nodes=tuple(nodes),
        probes=tuple(merged),
        deviation=deviation,
        flagged=tuple(sorted(k for k, v in deviation.items() if v > threshold)),
        threshold=threshold,
        drivers={n.node: n.hardware.driver for n in nodes},
    )


@dataclass(frozen=True)
class ProfilePaths:
    table: Path
    meta: Path
    plot: Path


def profile_paths(root: Path, hardware_slug: str, model: str, tp_size: int) -> ProfilePaths:
    stem = f"{slugify(model)}-tp{int(tp_size)}"
    d = Path(root) / hardware_slug
    return ProfilePaths(d / f"{stem}.json", d / f"{stem}.meta.json", d / f"{stem}.png")


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def write_group(
    root: Path,
    group: GroupProfile,
    *,
    plot: bool = True,
    floor_tolerance: float = DEFAULT_FLOOR_TOLERANCE,
) -> ProfilePaths:
    """Write table + metadata (+ plot) for a merged group (a single node is a group of one)."""
    paths = profile_paths(root, group.group, group.model, group.tp_size)
    stairs = group.stairs()
    entries = floor_entries(group.probes, stairs, floor_tolerance)
    table = table_from_entries(entries, group.max_batch_tokens)
    first = group.nodes[0]
    meta = {
        "schema": META_SCHEMA,
        "table_file": paths.table.name,
        "hardware_slug": group.group,
        "hardware": group.hardware.to_dict(),
        "drivers": dict(sorted(group.drivers.items())),
        "versions": first.versions,
        "model": first.backend.model,
        "tp_size": first.backend.tp_size,
        "dtype": first.backend.dtype,
        "backend": _backend_dict(first.backend),
        "grid": {"spec": first.grid.to_dict(), "probed": [p.batch_tokens for p in group.probes]},
        "measure": first.measure.to_dict(),
        "date": max(n.finished_at for n in group.nodes),
        "probes": [p.to_dict() for p in group.probes],
        "spread_median": statistics.median(p.spread for p in group.probes),
        "spread_max": max(p.spread for p in group.probes),
        "stairs": [s.to_dict() for s in stairs],
        "table": table_note(entries),
        "nodes": sorted(n.node for n in group.nodes),
        "node_deviation": dict(sorted(group.deviation.items())),
        "deviation_threshold": group.threshold,
        "flagged_nodes": list(group.flagged),
        "additive_table": ADDITIVE_NOTE,
    }
    _atomic_write(paths.table, table.to_json())
    _atomic_write(paths.meta, json.dumps(meta, indent=2, sort_keys=False) + "\n")
    if plot:
        from dspark_sglang.profiling.plot import plot_staircase

        curves = {n.node: n.probes for n in group.nodes} if len(group.nodes) > 1 else None
        title = (
            f"{group.model} tp{group.tp_size} on {group.group} "
            f"({len(group.nodes)} node{'s' if len(group.nodes) > 1 else ''})"
        )
        plot_staircase(paths.plot, group.probes, stairs, title, curves, table=table)
    return paths


def table_note(entries: FloorTable) -> dict[str, Any]:
    """What the meta says about the table's entries beyond the measured probes."""
    return {
        "lookup": "floor (SGLang SpsCostTable.lookup)",
        "floor_tolerance": entries.tolerance,
        "interpolated_batch_tokens": list(entries.interpolated),
        "why": (
            "entries between probes on smooth stretches (not across detected stairs) are "
            "linear in step time between the two probes, so a floor lookup under-states "
            "the step time there by at most floor_tolerance; measured rates are in probes"
        ),
    }
