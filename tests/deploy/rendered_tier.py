"""A chart tier's server as the cluster would start it, and the CPU overlay that starts it here.

:func:`server_workloads` reads a ``helm template`` render the way the kubelet
would: for every Deployment and LeaderWorkerSet leader, the ``sglang``
container's ``command``, ``args`` and ``env``, and every ConfigMap/Secret file it
mounts, taken from the render (objects the chart owns) or from
:data:`EXTERNAL_FILES` (objects other jobs publish).

:func:`cpu_launch` is the CPU overlay: the only differences between what runs
in these tests and what runs in a pod. Each one maps something that cannot
exist on a CPU test machine; nothing a tier configures is touched.

1. Files: every mounted file is written under a temporary ``root`` at its mount
   path, and every absolute container path under a volume mount (in args, env
   values and inside the mounted files) becomes ``root + path``.
2. Weights: the chart's ``--model-path`` and ``--speculative-draft-model-path``
   are symlinks under ``root`` to SmolLM2-135M-Instruct and to a drafter of the
   tier's ``blockSize``: the embedded (trained) drafter for its block size, else a
   seeded untrained DSpark drafter for SmolLM2 with that block size.
3. Objects the chart references but does not render (the profiler's
   ``dspark-cost-table-*`` ConfigMaps, calibration's STS ConfigMap, an existing
   API-key Secret) come from :data:`EXTERNAL_FILES`: the committed CPU cost table,
   the embedded drafter's STS file (unit temperatures for another block size), a
   test key.
4. ``$(VAR)`` in args is expanded from the container env, as the kubelet does; a
   LeaderWorkerSet leader also gets the variables the LWS controller injects
   (``LWS_GROUP_SIZE``, ``LWS_WORKER_INDEX=0``, ``LWS_LEADER_ADDRESS=127.0.0.1``).
5. Network: ``--host 127.0.0.1`` and a free ``--port``.
6. Device: :data:`CPU_FLAGS` are appended (last flag wins in SGLang's parser) and
   :data:`CPU_ENV` is added (SGLang's CPU engine; see ``sglang_integration.engine``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dspark_sglang.sglang_integration.engine import CPU_ENGINE_DEFAULTS
from dspark_sglang.sglang_integration.server import free_port

ROOT = Path(__file__).resolve().parents[2]
DRAFTER = ROOT / "dspark_sglang" / "assets" / "drafters" / "smollm2"
CPU_COST_TABLE = ROOT / "profiles" / "cpu-amd-epyc-avx2-2c" / "smollm2-135m-instruct-tp1.json"
TEST_API_KEY = "contract-test-key"

Manifest = dict[str, Any]


def _sts_for(block_size: int) -> str:
    from dspark_sglang.calibration.sts import StsCalibration, load_sts

    if load_sts(DRAFTER / "sts.json").block_size == block_size:
        return (DRAFTER / "sts.json").read_text()
    return StsCalibration(temperatures=(1.0,) * block_size, dataset="unit").to_json()


#: Published by other jobs, not by the chart: (kind, name prefix) -> content(block size).
EXTERNAL_FILES: dict[tuple[str, str], Callable[[int], str]] = {
    ("ConfigMap", "dspark-cost-table-"): lambda _b: CPU_COST_TABLE.read_text(),
    ("ConfigMap", "dspark-sts"): _sts_for,
    ("Secret", ""): lambda _b: TEST_API_KEY,
}


def drafter_for(block_size: int, target: Path, cache: Path) -> Path:
    """The embedded drafter when it has ``block_size``, else a seeded one written to ``cache``."""
    from dspark_sglang.sglang_integration.launch import drafter_block_size

    if drafter_block_size(DRAFTER) == block_size:
        return DRAFTER
    folder = cache / f"seeded-drafter-b{block_size}"
    if (folder / "config.json").is_file():
        return folder
    import torch
    from torch import nn
    from transformers import AutoConfig, AutoTokenizer

    from dspark_sglang.model import DSparkConfig, DSparkDrafter, TargetSpec, save_drafter
    from dspark_sglang.targets.hf_target import default_mask_token_id
    from dspark_sglang.targets.smollm2 import SMOLLM2_NAME

    spec = TargetSpec.from_hf_config(AutoConfig.from_pretrained(target), name=SMOLLM2_NAME)
    mask = default_mask_token_id(AutoTokenizer.from_pretrained(target))
    config = DSparkConfig.for_target(spec, mask_token_id=mask, block_size=block_size)
    embed = nn.Embedding(spec.vocab_size, spec.hidden_size, device="meta")
    head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False, device="meta")
    torch.manual_seed(0)
    return save_drafter(DSparkDrafter(config, embed, head), folder)


#: SGLang's CPU engine, as server flags (the same settings the CPU Engine helper uses).
_CPU_KEYS = (
    "device",
    "attention_backend",
    "sampling_backend",
    "disable_cuda_graph",
    "grammar_backend",
    "skip_server_warmup",
    "mem_fraction_static",
    "max_total_tokens",
)
CPU_FLAGS: tuple[str, ...] = tuple(
    tok
    for k in _CPU_KEYS
    for tok in (
        ["--" + k.replace("_", "-")]
        if CPU_ENGINE_DEFAULTS[k] is True
        else ["--" + k.replace("_", "-"), str(CPU_ENGINE_DEFAULTS[k])]
    )
)
CPU_ENV: dict[str, str] = {"SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": "1"}
#: Tensor parallelism over gloo needs one OpenMP core list per rank (PLATFORM: CPU TP).
CPU_TP_ENV: dict[int, dict[str, str]] = {2: {"SGLANG_CPU_OMP_THREADS_BIND": "0|1"}}
#: Launchable here: one node, TP <= 2 (2 cores). Others are only parsed by SGLang.
MAX_CPU_TP = 2


@dataclass(frozen=True)
class MountedFile:
    path: str  # absolute path in the container
    content: str
    source: str  # "ConfigMap/<name>:<key>" (rendered) or "external ConfigMap/<name>:<key>"


@dataclass(frozen=True)
class RenderedServer:
    """One server container exactly as rendered (before the CPU overlay)."""

    values_file: str
    workload: str  # "Deployment/<name>" or "LeaderWorkerSet/<name>"
    tier: str
    command: tuple[str, ...]
    args: tuple[str, ...]
    env: Mapping[str, str]
    files: tuple[MountedFile, ...]
    mount_paths: tuple[str, ...]
    nodes: int
    block_size: int  # the tier's scheduler config block_size (values' blockSize)

    def arg(self, flag: str) -> str | None:
        """The value after the last ``flag`` in ``args`` (None if absent)."""
        idx = [i for i, a in enumerate(self.args) if a == flag]
        return self.args[idx[-1] + 1] if idx else None

    @property
    def tp(self) -> int:
        return int(self.arg("--tp") or 1)

    @property
    def launchable_on_cpu(self) -> bool:
        return self.nodes == 1 and self.tp <= MAX_CPU_TP

    def file(self, path: str) -> MountedFile:
        (f,) = [f for f in self.files if f.path == path]
        return f


def _object_data(
    docs: list[Manifest], kind: str, name: str, key: str, block_size: int
) -> tuple[str, str]:
    for d in docs:
        if d.get("kind") == kind and d["metadata"]["name"] == name:
            data = d.get("stringData") or d.get("data") or {}
            assert key in data, f"{kind}/{name} has no key {key!r} (keys {sorted(data)})"
            return str(data[key]), f"{kind}/{name}:{key}"
    for (k, prefix), content in EXTERNAL_FILES.items():
        if k == kind and name.startswith(prefix):
            return content(block_size), f"external {kind}/{name}:{key}"
    raise AssertionError(f"{kind}/{name} is neither rendered nor a known external object")


def _env(container: Manifest, docs: list[Manifest], block_size: int) -> dict[str, str]:
    env: dict[str, str] = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = str(e["value"])
        else:
            ref = e["valueFrom"]["secretKeyRef"]
            secret = _object_data(docs, "Secret", ref["name"], ref["key"], block_size)
            env[e["name"]] = secret[0]
    return env


def _files(
    pod: Manifest, container: Manifest, docs: list[Manifest], block_size: int
) -> list[MountedFile]:
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    out: list[MountedFile] = []
    for m in container.get("volumeMounts", []):
        vol = volumes[m["name"]]
        for kind, key in (("ConfigMap", "configMap"), ("Secret", "secret")):
            if key not in vol:
                continue
            src = vol[key]
            name = src.get("name") or src.get("secretName")
            for item in src.get("items", []):
                content, source = _object_data(docs, kind, name, item["key"], block_size)
                out.append(MountedFile(f"{m['mountPath']}/{item['path']}", content, source))
    return out


def _tier_block_size(pod: Manifest, docs: list[Manifest]) -> int:
    """``block_size`` of the tier's rendered scheduler ConfigMap (the values' blockSize).

    Taken from the scheduler config, never from ``--speculative-num-draft-tokens``, so a
    wrong flag meets a drafter of the tier's real block size and fails as in a pod.
    """
    import yaml

    names = {v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v}
    for d in docs:
        data = d.get("data") or {}
        if d["kind"] == "ConfigMap" and d["metadata"]["name"] in names and "scheduler.yaml" in data:
            return int(yaml.safe_load(data["scheduler.yaml"])["block_size"])
    raise AssertionError("the pod mounts no rendered scheduler ConfigMap")


def server_workloads(docs: list[Manifest], values_file: str) -> list[RenderedServer]:
    """Every serving container the render would start (Deployments, LWS leaders)."""
    out: list[RenderedServer] = []
    for d in docs:
        kind = d.get("kind")
        if kind == "Deployment":
            pod, nodes = d["spec"]["template"]["spec"], 1
        elif kind == "LeaderWorkerSet":
            lwt = d["spec"]["leaderWorkerTemplate"]
            pod, nodes = lwt["leaderTemplate"]["spec"], int(lwt["size"])
        else:
            continue
        (c,) = [c for c in pod["containers"] if c["name"] == "sglang"]
        args = [str(a) for a in c["args"]]
        block = _tier_block_size(pod, docs)
        out.append(
            RenderedServer(
                values_file=values_file,
                workload=f"{kind}/{d['metadata']['name']}",
                tier=d["metadata"]["labels"]["dspark-sglang.io/sla-tier"],
                command=tuple(c["command"]),
                args=tuple(args),
                env=_env(c, docs, block),
                files=tuple(_files(pod, c, docs, block)),
                mount_paths=tuple(m["mountPath"] for m in c.get("volumeMounts", [])),
                nodes=nodes,
                block_size=block,
            )
        )
    return out


_VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand_k8s_vars(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion in command/args (unknown references stay as they are)."""
    return _VAR_REF.sub(lambda m: env.get(m.group(1), m.group(0)), text)


@dataclass(frozen=True)
class CpuLaunch:
    """What the overlay turns a :class:`RenderedServer` into: argv, env and files under root."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    root: Path
    host: str
    port: int
    rewritten: Mapping[str, str] = field(default_factory=dict)  # container path -> local

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def local(self, container_path: str) -> Path:
        return Path(self.rewritten.get(container_path, container_path))


def _set_flag(args: list[str], flag: str, value: str) -> None:
    for i, a in enumerate(args):
        if a == flag:
            args[i + 1] = value


def cpu_launch(
    server: RenderedServer,
    root: Path,
    target: Path,
    python: str,
    port: int | None = None,
    drafter: Path | None = None,
) -> CpuLaunch:
    """Apply the CPU overlay (module doc) to ``server``; writes its files under ``root``.
    ``drafter``: the folder the drafter path mounts (default :func:`drafter_for`)."""
    # One pass, longest mount first, so a rewritten path is never rewritten again.
    mounts = sorted(server.mount_paths, key=len, reverse=True)
    under_mount = re.compile(
        r"(?<![\w/.-])(" + "|".join(re.escape(m.rstrip("/")) for m in mounts) + r")(?![\w.-])"
    )

    def local(text: str) -> str:
        return under_mount.sub(lambda mt: str(root) + mt.group(1), text)

    for m in server.mount_paths:
        Path(str(root) + m).mkdir(parents=True, exist_ok=True)
    for f in server.files:
        dest = Path(str(root) + f.path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(local(f.content))
    pod_env = dict(server.env)
    if server.nodes > 1:
        pod_env.update(
            LWS_GROUP_SIZE=str(server.nodes), LWS_WORKER_INDEX="0", LWS_LEADER_ADDRESS="127.0.0.1"
        )
    env = {k: local(v) for k, v in pod_env.items()}
    args = [local(expand_k8s_vars(a, pod_env)) for a in server.args]
    drafter = drafter or drafter_for(server.block_size, target, root.parent)
    weights = {"--model-path": target, "--speculative-draft-model-path": drafter}
    for flag, real in weights.items():
        path = server.arg(flag)
        assert path is not None, f"{server.workload} renders no {flag}"
        link = Path(local(path))
        assert str(link).startswith(str(root)), f"{flag} {path} is not under a volume mount"
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(real, target_is_directory=True)
    host, port = "127.0.0.1", port or free_port()
    _set_flag(args, "--host", host)
    _set_flag(args, "--port", str(port))
    assert server.command[:3] == ("python", "-m", "sglang.launch_server"), server.command
    env.update(CPU_ENV)
    env.update(CPU_TP_ENV.get(server.tp, {}))
    rewritten = {f.path: str(root) + f.path for f in server.files}
    return CpuLaunch(
        argv=(python, *server.command[1:], *args, *CPU_FLAGS),
        env=env,
        root=root,
        host=host,
        port=port,
        rewritten=rewritten,
    )
