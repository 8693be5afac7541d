"""Ray fleet driver: one profiling actor per node, grouped and merged by hardware.

Why this design:

- *One actor per node*, pinned either by Ray node affinity (real clusters: every
  alive node, or every node with GPUs) or by a custom resource that only that node
  offers (``--node-resource``; also how the tests fake several nodes on one
  machine). The actor asks for all of its node's GPUs so nothing else runs there
  while it measures.
- *Failures are data*: each node's result is awaited with its own deadline; a
  node whose actor dies, raises or runs past ``node_timeout_s`` is killed, recorded
  with the reason, and skipped. Every finished node's profile is written to
  ``<out>/nodes/<node>.json`` the moment it arrives, so a crash of the driver or of
  another node loses nothing already measured.
- *Idempotent*: outputs have fixed paths and are replaced atomically; with
  ``resume`` a node whose stored result was made by the same job is not re-measured.
- Groups (hardware fingerprint slug) are merged by ``artifacts.merge_profiles``,
  which flags deviating nodes; each group gets its table, metadata, plot and a
  ConfigMap manifest (optionally published).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dspark_sglang.profiling.artifacts import (
    NodeProfile,
    _atomic_write,
    merge_profiles,
    utc_now,
    write_group,
)
from dspark_sglang.profiling.configmap import build_configmap, publish_configmap, write_configmap
from dspark_sglang.profiling.floor_table import DEFAULT_FLOOR_TOLERANCE
from dspark_sglang.profiling.job import ProfileJob, job_to_dict

REPORT_NAME = "fleet-report.json"


@dataclass(frozen=True)
class NodeTarget:
    """Where one actor goes: a custom resource only that node has, or a Ray node id."""

    name: str
    resource: str | None = None
    node_id: str | None = None
    num_gpus: float = 0.0

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise ValueError(
                f"NodeTarget.name must be a non-empty file-safe name, got {self.name!r}"
            )
        if (self.resource is None) == (self.node_id is None):
            raise ValueError(
                f"NodeTarget {self.name!r}: give exactly one of resource (custom-resource pin) "
                "or node_id (node affinity)"
            )


@dataclass(frozen=True)
class FleetConfig:
    job: ProfileJob
    out_dir: Path
    node_timeout_s: float = 1800.0
    deviation_threshold: float = 0.10
    namespace: str = "default"
    publish: bool = False
    resume: bool = False
    actor_num_cpus: float = 1.0
    plot: bool = True
    floor_tolerance: float = DEFAULT_FLOOR_TOLERANCE

    def __post_init__(self) -> None:
        if not self.node_timeout_s > 0:
            raise ValueError(f"FleetConfig.node_timeout_s must be > 0, got {self.node_timeout_s}")
        if not self.deviation_threshold > 0:
            raise ValueError(
                f"FleetConfig.deviation_threshold must be > 0, got {self.deviation_threshold}"
            )
        if self.actor_num_cpus < 0:
            raise ValueError(f"FleetConfig.actor_num_cpus must be >= 0, got {self.actor_num_cpus}")
        if not (math.isfinite(self.floor_tolerance) and self.floor_tolerance >= 0):
            raise ValueError(
                f"FleetConfig.floor_tolerance must be >= 0 (0 = probes only), "
                f"got {self.floor_tolerance}"
            )


@dataclass(frozen=True)
class NodeFailure:
    node: str
    reason: str


@dataclass(frozen=True)
class GroupOutput:
    group: str
    nodes: tuple[str, ...]
    flagged: tuple[str, ...]
    table: Path
    meta: Path
    plot: Path | None
    configmap: Path
    published: str | None = None


@dataclass(frozen=True)
class FleetResult:
    profiles: dict[str, NodeProfile]
    failures: tuple[NodeFailure, ...]
    groups: tuple[GroupOutput, ...]
    reused: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {
            "date": utc_now(),
            "ok_nodes": sorted(self.profiles),
            "reused_nodes": list(self.reused),
            "failed_nodes": [{"node": f.node, "reason": f.reason} for f in self.failures],
            "groups": [
                {
                    "group": g.group,
                    "nodes": list(g.nodes),
                    "flagged_nodes": list(g.flagged),
                    "table": str(g.table),
                    "meta": str(g.meta),
                    "plot": str(g.plot) if g.plot else None,
                    "configmap": str(g.configmap),
                    "published": g.published,
                }
                for g in self.groups
            ],
        }


def job_key(job: ProfileJob) -> str:
    blob = json.dumps(job_to_dict(job), sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def discover_nodes(require_gpu: bool = False) -> list[NodeTarget]:
    """One target per alive Ray node (optionally only nodes with GPUs), by node affinity."""
    import ray

    targets = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        gpus = float(n.get("Resources", {}).get("GPU", 0.0))
        if require_gpu and gpus < 1:
            continue
        host = str(n.get("NodeManagerHostname") or n.get("NodeManagerAddress") or "node")
        name = f"{host}-{n['NodeID'][:8]}".replace("/", "-")
        targets.append(NodeTarget(name=name, node_id=n["NodeID"], num_gpus=gpus))
    if not targets:
        raise RuntimeError(
            "no alive Ray nodes" + (" with GPUs" if require_gpu else "") + " to profile"
        )
    return targets


def resource_targets(resources: Sequence[str]) -> list[NodeTarget]:
    """Targets pinned by custom resources; the node name is the resource name."""
    if not resources:
        raise ValueError("no --node-resource given")
    if len(set(resources)) != len(resources):
        raise ValueError(f"duplicate node resources {list(resources)}")
    return [NodeTarget(name=r, resource=r) for r in resources]


class ProfilerActor:
    """Runs one node's job; ``progress`` answers while ``run`` is busy (threaded actor)."""

    def __init__(self, node: str) -> None:
        self.node = node
        self._progress = (0, 0)

    def hostname(self) -> str:
        import socket

        return socket.gethostname()

    def progress(self) -> tuple[int, int]:
        return self._progress

    def run(self, job_dict: dict[str, Any]) -> dict[str, Any]:
        from dspark_sglang.profiling.job import run_job
        from dspark_sglang.profiling.measure import GridSpec, MeasureConfig

        d = dict(job_dict)
        grid = dict(d.pop("grid"))
        if grid.get("points") is not None:
            grid["points"] = tuple(grid["points"])
        job = ProfileJob(grid=GridSpec(**grid), measure=MeasureConfig(**d.pop("measure")), **d)

        def progress(done: int, planned: int) -> None:
            self._progress = (done, planned)

        return run_job(job, self.node, progress).to_dict()


OnStarted = Callable[[NodeTarget, Any], None]


def _spawn(target: NodeTarget, cfg: FleetConfig) -> Any:
    import ray

    opts: dict[str, Any] = {
        "num_cpus": cfg.actor_num_cpus,
        "num_gpus": target.num_gpus,
        "max_concurrency": 2,
        "max_restarts": 0,
        "name": None,
    }
    if target.resource is not None:
        opts["resources"] = {target.resource: 1}
    else:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
            node_id=target.node_id, soft=False
        )
    return ray.remote(ProfilerActor).options(**opts).remote(target.name)


def _failure_reason(exc: BaseException) -> str:
    import ray.exceptions as rex

    if isinstance(exc, rex.ActorDiedError | rex.RayActorError):
        return f"actor died: {type(exc).__name__}"
    if isinstance(exc, rex.RayTaskError):
        cause = exc.cause if getattr(exc, "cause", None) is not None else exc
        return f"profiling raised {type(cause).__name__}: {str(cause).splitlines()[0][:300]}"
    return f"{type(exc).__name__}: {str(exc)[:300]}"


def _node_file(out_dir: Path, node: str) -> Path:
    return out_dir / "nodes" / f"{node}.json"


def _load_reusable(path: Path, key: str) -> NodeProfile | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    if data.get("job_key") != key:
        return None
    return NodeProfile.from_dict(data["profile"])


def run_fleet(
    targets: Sequence[NodeTarget],
    cfg: FleetConfig,
    on_started: OnStarted | None = None,
    poll_s: float = 1.0,
) -> FleetResult:
    """Profile every target (Ray must already be initialised), then merge and write."""
    import ray

    if not targets:
        raise ValueError("run_fleet: no node targets")
    names = [t.name for t in targets]
    if len(set(names)) != len(names):
        raise ValueError(f"run_fleet: duplicate node names {names}")
    key = job_key(cfg.job)
    jd = job_to_dict(cfg.job)
    profiles: dict[str, NodeProfile] = {}
    failures: list[NodeFailure] = []
    reused: list[str] = []
    pending: dict[Any, tuple[NodeTarget, Any, float]] = {}
    for t in targets:
        if cfg.resume:
            prev = _load_reusable(_node_file(cfg.out_dir, t.name), key)
            if prev is not None:
                profiles[t.name] = prev
                reused.append(t.name)
                continue
        actor = _spawn(t, cfg)
        ref = actor.run.remote(jd)
        pending[ref] = (t, actor, time.monotonic() + cfg.node_timeout_s)
        if on_started is not None:
            on_started(t, actor)

    while pending:
        now = time.monotonic()
        soonest = min(deadline for _, _, deadline in pending.values())
        ready, _ = ray.wait(
            list(pending), num_returns=1, timeout=max(0.0, min(poll_s, soonest - now))
        )
        for ref in ready:
            t, actor, _ = pending.pop(ref)
            try:
                prof = NodeProfile.from_dict(ray.get(ref))
            except Exception as exc:  # any node failure is reported, never fatal
                failures.append(NodeFailure(t.name, _failure_reason(exc)))
            else:
                profiles[t.name] = prof
                _atomic_write(
                    _node_file(cfg.out_dir, t.name),
                    json.dumps({"job_key": key, "profile": prof.to_dict()}, indent=1) + "\n",
                )
            ray.kill(actor, no_restart=True)
        now = time.monotonic()
        for ref, (t, actor, deadline) in list(pending.items()):
            if now >= deadline:
                ray.kill(actor, no_restart=True)
                pending.pop(ref)
                failures.append(NodeFailure(t.name, f"timed out after {cfg.node_timeout_s:g} s"))

    groups = _write_groups(profiles, cfg)
    result = FleetResult(
        profiles=profiles,
        failures=tuple(sorted(failures, key=lambda f: f.node)),
        groups=groups,
        reused=tuple(reused),
    )
    _atomic_write(cfg.out_dir / REPORT_NAME, json.dumps(result.to_dict(), indent=2) + "\n")
    return result


def _write_groups(profiles: dict[str, NodeProfile], cfg: FleetConfig) -> tuple[GroupOutput, ...]:
    by_group: dict[str, list[NodeProfile]] = {}
    for name in sorted(profiles):
        p = profiles[name]
        by_group.setdefault(p.hardware.slug, []).append(p)
    outs = []
    for slug, nodes in sorted(by_group.items()):
        group = merge_profiles(nodes, cfg.deviation_threshold)
        paths = write_group(cfg.out_dir, group, plot=cfg.plot, floor_tolerance=cfg.floor_tolerance)
        meta = json.loads(paths.meta.read_text(encoding="utf-8"))
        manifest = build_configmap(
            slug, paths.table.read_text(encoding="utf-8"), meta, cfg.namespace
        )
        cm_path = paths.table.with_name(paths.table.stem + ".configmap.yaml")
        write_configmap(cm_path, manifest)
        published = publish_configmap(manifest) if cfg.publish else None
        outs.append(
            GroupOutput(
                group=slug,
                nodes=tuple(n.node for n in nodes),
                flagged=group.flagged,
                table=paths.table,
                meta=paths.meta,
                plot=paths.plot if cfg.plot else None,
                configmap=cm_path,
                published=published,
            )
        )
    return tuple(outs)
