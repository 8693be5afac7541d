"""What ``simulate`` and ``plan`` read: cost table, acceptance traces, STS, request lengths.

``load_inputs`` reads them and checks they fit together (an STS file must have one
temperature per draft position of the traces' drafter). A profile is either the
profiler's table file with its ``<table>.meta.json`` beside it, or the published
ConfigMap as ``kubectl get configmap NAME -o yaml`` prints it (``sps.json`` and
``sps.meta.json`` in one file), so the table a cluster runs is one command away.
``profile_identity`` reads what the table was measured for (hardware, model, TP) and
refuses a table without metadata, because a tier must run where its table was measured.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["PlanningInputs", "Profile", "load_inputs", "profile_identity", "read_profile"]

SYNTHETIC_BLOCK = 7
"""Block size of ``synthetic`` traces when the spec names none."""

_CONFIGMAP_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True)
class Profile:
    """A cost table as read from disk: its exact bytes and its metadata, if any."""

    source: str
    table_bytes: bytes
    meta: dict[str, Any] | None
    #: ``metadata.name`` when read from a ConfigMap manifest.
    configmap_name: str | None = None


@dataclass(frozen=True)
class PlanningInputs:
    table: Any  # SpsCostTable
    traces: Any  # AcceptanceTraces
    sts: Any  # StsCalibration | None
    lengths: Any  # LengthDistribution
    profile: Profile | None = None


def _json_object(text: str, where: str, fix: str) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON ({exc}); {fix}") from exc
    if not isinstance(doc, dict):
        raise ValueError(f"{where}: expected a JSON object; {fix}")
    return doc


def _read_configmap(p: Path) -> Profile:
    import yaml

    from dspark_sglang.profiling.configmap import META_KEY, TABLE_KEY

    fix = "fetch it with `kubectl get configmap <name> -o yaml > FILE`"
    try:
        doc = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"--profile {p}: cannot read it as YAML ({exc}); {fix}") from exc
    if not isinstance(doc, dict) or doc.get("kind") != "ConfigMap":
        raise ValueError(f"--profile {p}: a YAML profile must be a ConfigMap manifest; {fix}")
    data = doc.get("data") or {}
    if TABLE_KEY not in data:
        raise ValueError(
            f"--profile {p}: ConfigMap has no data key {TABLE_KEY!r} (keys: {sorted(data)}); "
            "it is not a cost-table ConfigMap the profiler published"
        )
    meta = (
        _json_object(data[META_KEY], f"--profile {p}: data.{META_KEY}", "re-publish the table")
        if META_KEY in data
        else None
    )
    name = (doc.get("metadata") or {}).get("name")
    return Profile(str(p), data[TABLE_KEY].encode("utf-8"), meta, name)


def read_profile(profile: Path) -> Profile:
    """The table bytes and metadata of a profile file or a fetched ConfigMap manifest."""
    p = Path(profile)
    if p.suffix in _CONFIGMAP_SUFFIXES:
        return _read_configmap(p)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ValueError(f"--profile {p}: cannot read it ({exc})") from exc
    meta_path = p.with_name(p.stem + ".meta.json")
    meta = None
    if meta_path.is_file():
        meta = _json_object(
            meta_path.read_text(encoding="utf-8"), str(meta_path), "re-run `dspark-sglang profile`"
        )
    return Profile(str(p), data, meta)


def load_inputs(
    profile: Path,
    traces: Sequence[str],
    sts: Path | None,
    lengths: Path | None,
    seed: int,
) -> PlanningInputs:
    """Read the inputs; ``traces`` are files, or one ``synthetic[:B]`` (a built-in set:
    high acceptance, block B, default 7); ``lengths`` defaults to GSM8K chars / 4."""
    from dspark_sglang.calibration.sts import load_sts
    from dspark_sglang.planning.traces import (
        decaying_acceptance,
        load_traces_many,
        synthetic_traces,
    )
    from dspark_sglang.planning.workload import default_lengths, load_lengths
    from dspark_sglang.scheduling.cost_table import parse_cost_table

    prof = read_profile(profile)
    table = parse_cost_table(prof.table_bytes, source=prof.source)
    if len(traces) == 1 and traces[0].startswith("synthetic"):
        _, _, b = traces[0].partition(":")
        block = int(b) if b else SYNTHETIC_BLOCK
        acceptance = synthetic_traces(
            200,
            40,
            decaying_acceptance(0.9, 0.98, block),
            auc=0.85,
            request_spread=1.0,
            seed=seed,
        )
    else:
        acceptance = load_traces_many(list(traces))
    cal = load_sts(sts) if sts else None
    if cal is not None and cal.block_size != acceptance.block_size:
        raise ValueError(
            f"--sts {sts} has {cal.block_size} temperatures but the traces' block size is "
            f"{acceptance.block_size}; calibrate STS on rollouts of the drafter that recorded them"
        )
    dist = load_lengths(lengths) if lengths else default_lengths()
    return PlanningInputs(table, acceptance, cal, dist, prof)


def profile_identity(prof: Profile) -> Any:
    """``ProfileIdentity`` (hardware, model, TP, content version) from a profile's metadata.

    Why refuse without metadata: a tier must run at the TP and on the hardware its
    table was measured at, and the chart finds the profiler's ConfigMap by hardware,
    model and TP; a table without them cannot be placed safely.
    """
    from dspark_sglang.planning.values_edit import ProfileIdentity
    from dspark_sglang.profiling.configmap import content_version

    if prof.meta is None:
        raise ValueError(
            f"--profile {prof.source} has no metadata (the profiler's <table>.meta.json beside "
            "it, or sps.meta.json in its ConfigMap), so its hardware, model and TP are unknown; "
            "plan from what `dspark-sglang profile` wrote, or from the live ConfigMap "
            "(`kubectl get configmap <name> -o yaml`)"
        )
    where = f"--profile {prof.source} metadata"
    missing = [k for k in ("hardware_slug", "model", "tp_size") if k not in prof.meta]
    if missing:
        raise ValueError(f"{where} lacks {missing}; re-run `dspark-sglang profile`")
    tp = prof.meta["tp_size"]
    if isinstance(tp, bool) or not (isinstance(tp, int) and tp >= 1):
        raise ValueError(f"{where}: tp_size must be an int >= 1, got {tp!r}")
    return ProfileIdentity(
        hardware=str(prof.meta["hardware_slug"]),
        model=str(prof.meta["model"]),
        tp_size=tp,
        version=content_version(prof.table_bytes.decode("utf-8")),
    )
