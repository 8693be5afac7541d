"""deploy/ray/rayjob.yaml: valid Kubernetes, and its entrypoint is a valid `profile` call."""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml

from dspark_sglang.cli import build_parser
from dspark_sglang.cli.profile import job_from_args

RAYJOB = Path(__file__).resolve().parents[2] / "deploy" / "ray" / "rayjob.yaml"


def _docs() -> list[dict]:
    return [d for d in yaml.safe_load_all(RAYJOB.read_text()) if d]


def test_core_objects_validate_strictly() -> None:
    import kubernetes_validate

    core = [d for d in _docs() if d["apiVersion"] != "ray.io/v1"]
    kinds = {"ServiceAccount", "Role", "RoleBinding", "PersistentVolumeClaim"}
    assert {d["kind"] for d in core} == kinds
    for doc in core:
        kubernetes_validate.validate(doc, "1.30.0", strict=True)
    role = next(d for d in core if d["kind"] == "Role")
    # Publishing reads and creates; it never replaces a table (versions are immutable).
    assert set(role["rules"][0]["verbs"]) == {"get", "create"}


def test_rayjob_runs_the_fleet_profiler_one_worker_per_node() -> None:
    job = next(d for d in _docs() if d["kind"] == "RayJob")
    assert job["apiVersion"] == "ray.io/v1"
    argv = shlex.split(job["spec"]["entrypoint"])
    assert argv[:2] == ["dspark-sglang", "profile"]
    args = build_parser().parse_args(argv[1:])  # every flag exists in our CLI
    assert args.ray_address == "auto" and args.gpu_nodes_only and args.publish
    assert args.max_batch_tokens == 2048
    profile_job = job_from_args(args)  # and the combination is a valid job
    assert profile_job.backend == "sglang" and profile_job.device == "cuda"
    cluster = job["spec"]["rayClusterSpec"]
    assert cluster["rayVersion"] == "2.60.0"
    assert cluster["headGroupSpec"]["rayStartParams"]["num-gpus"] == "0"
    worker = cluster["workerGroupSpecs"][0]["template"]["spec"]
    anti = worker["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["topologyKey"] == "kubernetes.io/hostname"
    env = {e["name"]: e["value"] for e in worker["containers"][0]["env"]}
    assert env["RAY_USAGE_STATS_ENABLED"] == "0"
    head = cluster["headGroupSpec"]["template"]["spec"]
    head_sa = head["serviceAccountName"]
    # The driver runs on the head: its --out is the PVC it publishes from, not the pod's /tmp.
    (mount,) = [m for m in head["containers"][0]["volumeMounts"] if m["mountPath"] == "/profiles"]
    (vol,) = [v for v in head["volumes"] if v["name"] == mount["name"]]
    pvc = next(d for d in _docs() if d["kind"] == "PersistentVolumeClaim")
    assert vol["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    assert args.out == Path("/profiles") and not str(args.out).startswith("/tmp")
    binding = next(d for d in _docs() if d["kind"] == "RoleBinding")
    assert binding["subjects"][0]["name"] == head_sa  # the driver may publish ConfigMaps
