"""``dspark-sglang profile``: measure SPS staircases locally or across a Ray fleet.

Times engine steps at a grid of forward batch sizes (``profiling/measure.py``) and
writes SGLang cost tables, their ConfigMaps and plots: for this node, or for every
node of a Ray cluster with ``--ray-address`` (``profiling/fleet.py``). ``--publish``
creates each table's immutable, content-named ConfigMap and prints the pin a chart tier
needs (``costTable: {hardwareGroup, version}``). ``--rerender`` rebuilds the files of an
existing profile without measuring; ``--prune`` lists published ConfigMaps no kept
release revision mounts.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from pathlib import Path

from dspark_sglang.cli.base import Command


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers like 1,2,4,8, got {text!r}"
        ) from None


def _add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("what to measure")
    g.add_argument("--model", default="smollm2", help="'smollm2' or a HF model folder")
    g.add_argument("--model-slug", default=None, help="name used in file names (default: derived)")
    g.add_argument("--backend", choices=("hf", "sglang"), default="hf")
    g.add_argument("--device", default="cpu")
    g.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    g.add_argument("--threads", type=int, default=2, help="torch CPU threads per node")
    g.add_argument("--tp-size", type=int, default=1)
    g.add_argument("--context-len", type=int, default=128, help="KV length per request")
    g.add_argument("--verify-width", type=int, default=4, help="verify tokens per request")
    g.add_argument("--no-cuda-graphs", action="store_true", help="sglang backend only")
    g.add_argument(
        "--clock",
        choices=("wall", "thread_cpu"),
        default="wall",
        help="thread_cpu: time the forward thread's CPU time (needs --threads 1 on CPU); "
        "robust on a shared machine",
    )
    g = p.add_argument_group("probe grid")
    g.add_argument("--max-batch-tokens", type=int, default=256)
    g.add_argument("--min-batch-tokens", type=int, default=1)
    g.add_argument("--dense-until", type=int, default=16, help="probe every size up to this")
    g.add_argument("--points-per-octave", type=int, default=4)
    g.add_argument("--points", type=_int_list, default=None, help="explicit grid, e.g. 1,2,4,8")
    g.add_argument("--no-refine", action="store_true", help="skip refinement around drops")
    g.add_argument("--max-refine-probes", type=int, default=24)
    g.add_argument("--drop-threshold", type=float, default=0.05)
    g.add_argument(
        "--floor-tolerance",
        type=float,
        default=0.02,
        help="SGLang looks tables up by floor: on smooth stretches between sparse probes, add "
        "entries interpolated in step time so a lookup under-states the cost by at most this "
        "much (0 = write the probes only). Stairs are never interpolated.",
    )
    g.add_argument(
        "--rerender",
        type=Path,
        default=None,
        metavar="META_JSON",
        help="measure nothing: rebuild the table, ConfigMap and plot of an existing profile "
        "from its .meta.json probes (e.g. after changing --floor-tolerance)",
    )
    g = p.add_argument_group("repeats")
    g.add_argument("--warmup", type=int, default=2)
    g.add_argument("--repeats", type=int, default=5, help="timed steps per probe per round")
    g.add_argument("--rounds", type=int, default=2, help="shuffled passes over the grid")
    g.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("output")
    g.add_argument("--out", type=Path, default=Path("profiles"), help="profiles root")
    g.add_argument("--node-name", default=None, help="local mode: name of this node")
    g.add_argument("--no-plot", action="store_true")
    g.add_argument("--namespace", default="default", help="ConfigMap namespace")
    g.add_argument(
        "--publish",
        action="store_true",
        help="create each table's immutable ConfigMap dspark-cost-table-<hw>-<model>-tp<N>-"
        "<version> (never replaces one; the same table again is a no-op) and print the "
        "costTable pin (hardwareGroup, version) for the chart",
    )
    g = p.add_argument_group("prune (measure nothing)")
    g.add_argument(
        "--prune",
        type=Path,
        default=None,
        metavar="CONFIGMAPS_YAML",
        help="print the versioned cost-table/STS ConfigMaps in this file (kubectl get "
        "configmap -l dspark-sglang.io/content-hash -o yaml) that no --keep manifest "
        "mounts, one name per line",
    )
    g.add_argument(
        "--keep",
        type=Path,
        action="extend",
        nargs="+",
        default=None,
        metavar="RELEASE_MANIFEST",
        help="with --prune: rendered manifests of the release revisions that can still be "
        "rolled back to (helm get manifest REL --revision N), one file each, for every kept "
        "revision of every release in the namespace",
    )
    g = p.add_argument_group("fleet (Ray)")
    g.add_argument("--ray-address", default=None, help="profile every node of this cluster")
    g.add_argument(
        "--node-resource",
        action="append",
        default=None,
        help="pin one actor per custom resource instead of per Ray node (repeatable)",
    )
    g.add_argument("--gpu-nodes-only", action="store_true")
    g.add_argument("--node-timeout", type=float, default=1800.0, help="seconds per node")
    g.add_argument("--deviation-threshold", type=float, default=0.10)
    g.add_argument("--resume", action="store_true", help="reuse finished nodes of the same job")
    g.add_argument("--actor-cpus", type=float, default=1.0)


def job_from_args(args: argparse.Namespace):  # -> ProfileJob
    """The ``ProfileJob`` the flags describe; a ValueError names a bad combination."""
    from dspark_sglang.profiling.job import ProfileJob
    from dspark_sglang.profiling.measure import GridSpec, MeasureConfig

    grid = GridSpec(
        max_tokens=args.max_batch_tokens,
        min_tokens=args.min_batch_tokens,
        dense_until=args.dense_until,
        points_per_octave=args.points_per_octave,
        points=args.points,
        refine=not args.no_refine,
        max_refine_probes=args.max_refine_probes,
        drop_threshold=args.drop_threshold,
    )
    measure = MeasureConfig(
        warmup=args.warmup, repeats=args.repeats, rounds=args.rounds, seed=args.seed
    )
    return ProfileJob(
        model=args.model,
        model_slug=args.model_slug,
        grid=grid,
        measure=measure,
        backend=args.backend,
        device=args.device,
        dtype=args.dtype,
        threads=args.threads,
        context_len=args.context_len,
        verify_width=args.verify_width,
        tp_size=args.tp_size,
        cuda_graphs=not args.no_cuda_graphs,
        clock=args.clock,
    )


def _pin_lines(groups) -> list[str]:  # groups: iterable of fleet.GroupOutput
    """One line per group: its versioned ConfigMap, whether it was published, and the
    chart pin (``costTable: {hardwareGroup, version}``) that mounts it."""
    import yaml

    from dspark_sglang.profiling.configmap import pin_of

    lines = []
    for g in groups:
        manifest = yaml.safe_load(Path(g.configmap).read_text(encoding="utf-8"))
        state = f"published ({g.published})" if g.published else f"not published ({g.configmap})"
        lines.append(
            f"[profile] ConfigMap {manifest['metadata']['name']} {state}; "
            f"pin: costTable: {json.dumps(pin_of(manifest))}"
        )
    return lines


def _prune(args: argparse.Namespace) -> int:
    from dspark_sglang.profiling.configmap import load_manifests, unreferenced_configmaps

    if not args.keep:
        print(
            "dspark-sglang profile --prune: pass --keep RELEASE_MANIFEST for every kept "
            "release revision (helm get manifest REL --revision N); without them every "
            "published table looks unused",
            file=sys.stderr,
        )
        return 2
    try:
        published = load_manifests(args.prune.read_text(encoding="utf-8"))
        revisions = [load_manifests(k.read_text(encoding="utf-8")) for k in args.keep]
        names = unreferenced_configmaps(published, revisions)
    except (OSError, ValueError) as exc:
        print(f"dspark-sglang profile --prune: {exc}", file=sys.stderr)
        return 2
    for name in names:
        print(name)
    print(
        f"[profile] {len(names)} published ConfigMap(s) mounted by none of "
        f"{len(revisions)} release revision(s)",
        file=sys.stderr,
    )
    return 0


def _run(args: argparse.Namespace) -> int:
    from dspark_sglang.profiling.fleet import FleetConfig, _write_groups

    if args.prune is not None:
        return _prune(args)
    if args.keep:
        print("dspark-sglang profile: --keep needs --prune", file=sys.stderr)
        return 2
    if args.rerender is not None:
        from dspark_sglang.profiling.rerender import rerender

        try:
            paths = rerender(
                args.rerender, floor_tolerance=args.floor_tolerance, plot=not args.no_plot
            )
        except (OSError, ValueError) as exc:
            print(f"dspark-sglang profile --rerender: {exc}", file=sys.stderr)
            return 2
        print(json.dumps({k: str(v) for k, v in paths.items()}))
        return 0

    try:
        job = job_from_args(args)
        cfg = FleetConfig(
            job=job,
            out_dir=args.out,
            node_timeout_s=args.node_timeout,
            deviation_threshold=args.deviation_threshold,
            namespace=args.namespace,
            publish=args.publish,
            resume=args.resume,
            actor_num_cpus=args.actor_cpus,
            plot=not args.no_plot,
            floor_tolerance=args.floor_tolerance,
        )
    except ValueError as exc:
        print(f"dspark-sglang profile: {exc}", file=sys.stderr)
        return 2
    if args.ray_address is None and not args.node_resource:
        from dspark_sglang.profiling.job import run_job

        node = args.node_name or socket.gethostname()

        def progress(done: int, planned: int) -> None:
            print(f"[profile] {node}: {done}/{planned} probe passes", file=sys.stderr)

        prof = run_job(job, node, progress)
        groups = _write_groups({node: prof}, cfg)
        for g in groups:
            print(
                json.dumps(
                    {
                        "table": str(g.table),
                        "meta": str(g.meta),
                        "plot": str(g.plot),
                        "configmap": str(g.configmap),
                        "published": g.published,
                    }
                )
            )
        for line in _pin_lines(groups):
            print(line, file=sys.stderr)
        return 0
    return _run_fleet(args, cfg)


def _run_fleet(args: argparse.Namespace, cfg) -> int:  # cfg: FleetConfig
    import ray

    from dspark_sglang.profiling.fleet import discover_nodes, resource_targets, run_fleet

    ray.init(address=args.ray_address, include_dashboard=False, log_to_driver=False)
    try:
        targets = (
            resource_targets(args.node_resource)
            if args.node_resource
            else discover_nodes(require_gpu=args.gpu_nodes_only)
        )
        result = run_fleet(targets, cfg)
    finally:
        ray.shutdown()
    print(json.dumps(result.to_dict(), indent=2))
    # The job log's last word: what each group published and how a tier pins it.
    for line in _pin_lines(result.groups):
        print(line, file=sys.stderr, flush=True)
    for f in result.failures:
        print(f"[profile] node {f.node} FAILED: {f.reason}", file=sys.stderr)
    for g in result.groups:
        if g.flagged:
            print(f"[profile] group {g.group}: deviating nodes {list(g.flagged)}", file=sys.stderr)
    return 0 if result.groups else 1


COMMAND = Command(
    name="profile",
    help="Measure SPS staircases into SGLang cost tables",
    description=(
        "Measure engine steps/s vs forward batch tokens (SPS staircase) into SGLang cost "
        "tables, locally or on every node of a Ray cluster (--ray-address)."
    ),
    add_arguments=_add_arguments,
    run=_run,
)
