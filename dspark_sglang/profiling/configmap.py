"""Kubernetes ConfigMaps carrying a group's cost table to the serving pods.

The Helm chart mounts ``dspark-cost-table-<group>`` and points SGLang's
``--speculative-dspark-sps-table-path`` at its ``sps.json`` key, so the name and
key are a contract with the chart. Publishing is create-or-replace, so
re-running the profiler converges on the same objects (idempotent).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from dspark_sglang.profiling.hardware import slugify

TABLE_KEY = "sps.json"
META_KEY = "sps.meta.json"
NAME_PREFIX = "dspark-cost-table-"
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def configmap_name(group: str) -> str:
    """``dspark-cost-table-<group>`` as a valid DNS-1123 subdomain name."""
    name = NAME_PREFIX + slugify(group)
    if len(name) > 253 or name == NAME_PREFIX:
        raise ValueError(f"cannot build a ConfigMap name from group {group!r}")
    return name


def _label(value: str) -> str:
    v = slugify(value)[:63].strip("-")
    if not _LABEL_VALUE.match(v):
        raise ValueError(f"cannot build a Kubernetes label value from {value!r}")
    return v


def build_configmap(
    group: str,
    table_json: str,
    meta: dict[str, Any],
    namespace: str = "default",
) -> dict[str, Any]:
    """The ConfigMap manifest (a plain dict) for one hardware group's table."""
    if not namespace:
        raise ValueError("namespace must be non-empty")
    json.loads(table_json)  # refuse to ship something that is not JSON
    labels = {
        "app.kubernetes.io/part-of": "dspark-sglang",
        "app.kubernetes.io/component": "cost-table",
        "dspark-sglang.io/hardware": _label(group),
        "dspark-sglang.io/model": _label(str(meta.get("model", "unknown"))),
        "dspark-sglang.io/tp": str(int(meta.get("tp_size", 1))),
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
            "name": configmap_name(group),
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "data": {TABLE_KEY: table_json, META_KEY: json.dumps(meta, indent=2) + "\n"},
    }


def write_configmap(path: Path, manifest: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(manifest, sort_keys=False), encoding="utf-8")
    tmp.replace(path)
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
