"""Kubernetes ConfigMaps carrying one cost table to the serving pods.

A cost table is measured for one (hardware group, model, TP degree): the same model
at TP 4 and TP 8 on the same nodes has a different staircase. The ConfigMap name
therefore carries that whole identity, ``dspark-cost-table-<hardware>-<model>-tp<N>``,
exactly the table file's identity ``profiles/<hardware>/<model>-tp<N>.json``; naming
it after the hardware alone made runs for different TP degrees or models overwrite
each other, because publishing is create-or-replace. The Helm chart derives the
same name from ``costTable.hardwareGroup``, the model slug and the tier's ``tp``,
and mounts its ``sps.json`` key at SGLang's ``--speculative-dspark-sps-table-path``,
so the name and key are a contract with the chart. Create-or-replace keeps
re-running the profiler idempotent: it converges on the same objects.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from dspark_sglang.profiling.artifacts import _atomic_write, profile_paths
from dspark_sglang.profiling.hardware import slugify

TABLE_KEY = "sps.json"
META_KEY = "sps.meta.json"
NAME_PREFIX = "dspark-cost-table-"
MAX_NAME_LEN = 253  # Kubernetes object names are DNS-1123 subdomains
_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def profile_id(group: str, model: str, tp_size: int) -> str:
    """``<hardware>-<model>-tp<N>``: the identity of one measured cost table.

    The ``<model>-tp<N>`` part is taken from ``profile_paths`` (the table file's
    stem) rather than re-derived, so file and ConfigMap can never disagree.
    """
    hardware = slugify(group)
    if not hardware:
        raise ValueError(
            f"cost-table hardware group {group!r} has no letters or digits; pass the node "
            "fingerprint slug `dspark-sglang profile` prints (e.g. cuda-nvidia-h200-8x)"
        )
    if not slugify(model):
        raise ValueError(
            f"cost-table model {model!r} has no letters or digits; pass the profiled model "
            "slug (the meta's 'model', `dspark-sglang profile --model-slug`)"
        )
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
        raise ValueError(
            f"cost-table tp_size must be an integer >= 1 (the meta's 'tp_size', "
            f"`--tp-size`), got {tp_size!r}"
        )
    stem = profile_paths(Path(), hardware, model, tp_size).table.stem
    return f"{hardware}-{stem}"


def configmap_name(group: str, model: str, tp_size: int) -> str:
    """``dspark-cost-table-<hardware>-<model>-tp<N>`` as a valid DNS-1123 subdomain name."""
    name = NAME_PREFIX + profile_id(group, model, tp_size)
    if len(name) > MAX_NAME_LEN:
        raise ValueError(
            f"ConfigMap name {name!r} is {len(name)} characters, over Kubernetes' "
            f"{MAX_NAME_LEN}; profile with a shorter `--model-slug`"
        )
    if not _DNS1123_SUBDOMAIN.match(name):  # slugs guarantee this; guard the contract
        raise ValueError(f"ConfigMap name {name!r} is not a DNS-1123 subdomain")
    return name


def _label(value: str) -> str:
    v = slugify(value)[:63].strip("-")
    if not _LABEL_VALUE.match(v):
        raise ValueError(f"cannot build a Kubernetes label value from {value!r}")
    return v


def _meta_identity(group: str, meta: dict[str, Any]) -> tuple[str, int]:
    """(model, tp_size) from a group's meta, checked against the group and table file.

    The name is built from the meta, so a meta from another group or another
    table would publish under the wrong name; refuse that instead.
    """
    for key in ("model", "tp_size"):
        if key not in meta:
            raise ValueError(
                f"cost-table meta has no {key!r}: the ConfigMap name needs the profiled "
                "model and TP degree; pass the .meta.json written next to the table"
            )
    model, tp_size = str(meta["model"]), meta["tp_size"]
    name = configmap_name(group, model, tp_size)  # validates model and tp_size
    hw = meta.get("hardware_slug")
    if hw is not None and hw != slugify(group):
        raise ValueError(
            f"cost-table meta hardware_slug {hw!r} does not match group {slugify(group)!r}: "
            "the meta belongs to another hardware group's table"
        )
    table_file = meta.get("table_file")
    expected = profile_paths(Path(), slugify(group), model, tp_size).table.name
    if table_file is not None and table_file != expected:
        raise ValueError(
            f"cost-table meta table_file {table_file!r} does not match {expected!r} "
            f"(model {model!r}, tp_size {tp_size}) that ConfigMap {name} would claim"
        )
    return model, tp_size


def build_configmap(
    group: str,
    table_json: str,
    meta: dict[str, Any],
    namespace: str = "default",
) -> dict[str, Any]:
    """The ConfigMap manifest (a plain dict) for one group's table of one model and TP.

    The name comes from ``group`` plus the meta's ``model`` and ``tp_size``
    (``configmap_name``), the same identity as the table file.
    """
    if not namespace:
        raise ValueError("namespace must be non-empty")
    model, tp_size = _meta_identity(group, meta)
    json.loads(table_json)  # refuse to ship something that is not JSON
    labels = {
        "app.kubernetes.io/part-of": "dspark-sglang",
        "app.kubernetes.io/component": "cost-table",
        "dspark-sglang.io/hardware": _label(group),
        "dspark-sglang.io/model": _label(model),
        "dspark-sglang.io/tp": str(tp_size),
    }
    annotations = {
        "dspark-sglang.io/profiled-at": str(meta.get("date", "")),
        "dspark-sglang.io/nodes": ",".join(meta.get("nodes", [])),
        "dspark-sglang.io/flagged-nodes": ",".join(meta.get("flagged_nodes", [])),
    }
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": configmap_name(group, model, tp_size),
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "data": {TABLE_KEY: table_json, META_KEY: json.dumps(meta, indent=2) + "\n"},
    }


def write_configmap(path: Path, manifest: dict[str, Any]) -> Path:
    """Write the manifest as YAML via a temp file + rename, so `kubectl apply` never reads
    a half-written file; returns ``path``."""
    _atomic_write(path, yaml.safe_dump(manifest, sort_keys=False))
    return path


def publish_configmap(manifest: dict[str, Any], api: Any | None = None) -> str:
    """Create or replace the ConfigMap through the ``kubernetes`` client.

    Uses in-cluster credentials when running in a pod (the RayJob), else the
    local kubeconfig. Returns ``"created"`` or ``"replaced"``.
    """
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    if api is None:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        api = client.CoreV1Api()
    meta = manifest["metadata"]
    try:
        api.read_namespaced_config_map(meta["name"], meta["namespace"])
    except ApiException as exc:
        if exc.status != 404:
            raise
        api.create_namespaced_config_map(meta["namespace"], manifest)
        return "created"
    api.replace_namespaced_config_map(meta["name"], meta["namespace"], manifest)
    return "replaced"
