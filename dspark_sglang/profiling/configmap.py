"""Kubernetes ConfigMaps carrying one cost table (or one STS fit) to the serving pods.

A cost table is measured for one (hardware group, model, TP degree): the same model
at TP 4 and TP 8 on the same nodes has a different staircase. That identity,
``<hardware>-<model>-tp<N>`` (the table file's ``profiles/<hardware>/<model>-tp<N>.json``),
is the table id. A *published* table is one version of it, named by its content:
``dspark-cost-table-<hardware>-<model>-tp<N>-<version>``, where the version is
``content_version`` of the table JSON (the ``sps.json`` bytes the server reads).

Why versioned and immutable: publishing used to create-or-replace one name per table
id, so the previous table was gone the moment a new one was published, and any pod
restart or scale-up silently switched tables. Now a publish only ever creates (the
same bytes give the same name, so re-publishing is a no-op), objects are
``immutable: true``, and the Helm chart pins a version per tier
(``costTable: {hardwareGroup, version}``). The previous release revision keeps
mounting the previous table, so rolling back is ``helm rollback``. Old versions
stay until ``unreferenced_configmaps`` finds that no kept release revision mounts them.

STS fits follow the same rule: ``build_sts_configmap`` names them
``<base>-<version>`` (the chart's ``sts: {configMapName: <base>, version}``).

The chart derives the same names (``dspark.costTableConfigMap``, ``dspark.stsConfigMap``
in ``helm/dspark-sglang/templates/_helpers.tpl``) and mounts key ``sps.json`` /
``sts.json``, so names and keys are a contract with the chart.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from dspark_sglang.profiling.artifacts import _atomic_write, profile_paths
from dspark_sglang.profiling.hardware import slugify

TABLE_KEY = "sps.json"
META_KEY = "sps.meta.json"
STS_KEY = "sts.json"
NAME_PREFIX = "dspark-cost-table-"
MAX_NAME_LEN = 253  # Kubernetes object names are DNS-1123 subdomains
VERSION_LEN = 10
#: Label every versioned (immutable, prunable) ConfigMap carries: its content version.
CONTENT_HASH_LABEL = "dspark-sglang.io/content-hash"
#: Annotation naming the unversioned identity (a label value is capped at 63 characters).
TABLE_ID_ANNOTATION = "dspark-sglang.io/table-id"
_VERSION = re.compile(rf"^[0-9a-f]{{{VERSION_LEN}}}$")
_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


class ConfigMapConflictError(RuntimeError):
    """A ConfigMap of the versioned name exists with other content (made or edited by hand)."""


def content_version(text: str | bytes) -> str:
    """The version of a cost table or STS file: the first 10 hex digits of the SHA-256 of
    its UTF-8 bytes (the exact ``sps.json`` / ``sts.json`` a server reads; ``bytes`` are
    hashed as given).

    The one place the hash is defined: the profiler and the calibration Job name what
    they publish with it, and ``dspark-sglang plan`` writes it as the tier's
    ``costTable.version`` (``table_version`` of the profile it planned on).
    """
    raw = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    return hashlib.sha256(raw).hexdigest()[:VERSION_LEN]


def table_version(table_path: Path) -> str:
    """``content_version`` of a cost-table file as the profiler publishes it (the text
    ``read_text`` gives, which is what goes into the ConfigMap)."""
    return content_version(Path(table_path).read_text(encoding="utf-8"))


def _check_version(version: str) -> str:
    if not (isinstance(version, str) and _VERSION.match(version)):
        raise ValueError(
            f"version {version!r} is not {VERSION_LEN} lowercase hex digits; use the "
            "content_version `dspark-sglang profile --publish` prints"
        )
    return version


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


def configmap_name(group: str, model: str, tp_size: int, version: str | None = None) -> str:
    """``dspark-cost-table-<hardware>-<model>-tp<N>[-<version>]``, a DNS-1123 subdomain.

    With ``version`` (``content_version`` of the table) it is the name the profiler
    publishes and a chart tier with ``costTable.version`` mounts; without, the
    unversioned name of hand-published or pre-versioning tables (never published by
    the profiler any more).
    """
    name = NAME_PREFIX + profile_id(group, model, tp_size)
    if version is not None:
        name += "-" + _check_version(version)
    if len(name) > MAX_NAME_LEN:
        raise ValueError(
            f"ConfigMap name {name!r} is {len(name)} characters, over Kubernetes' "
            f"{MAX_NAME_LEN}; profile with a shorter `--model-slug`"
        )
    if not _DNS1123_SUBDOMAIN.match(name):  # slugs guarantee this; guard the contract
        raise ValueError(f"ConfigMap name {name!r} is not a DNS-1123 subdomain")
    return name


def sts_configmap_name(base: str, version: str) -> str:
    """``<base>-<version>``: an STS fit as calibration publishes it (chart: sts.configMapName
    + sts.version)."""
    if not (isinstance(base, str) and _DNS1123_LABEL.match(base) and len(base) <= 63):
        raise ValueError(
            f"STS ConfigMap base name {base!r} must be a DNS-1123 label of at most 63 "
            "characters (the chart's calibration.configMapName / sts.configMapName)"
        )
    return f"{base}-{_check_version(version)}"


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
    """The immutable ConfigMap manifest (a plain dict) of one version of one table.

    Named ``configmap_name(group, meta model, meta tp_size, content_version(table_json))``.
    The version covers ``sps.json`` only: the meta (date, nodes) describes the run, and
    a re-run that reproduces the same table bytes is the same version.
    """
    if not namespace:
        raise ValueError("namespace must be non-empty")
    model, tp_size = _meta_identity(group, meta)
    json.loads(table_json)  # refuse to ship something that is not JSON
    version = content_version(table_json)
    labels = {
        "app.kubernetes.io/part-of": "dspark-sglang",
        "app.kubernetes.io/component": "cost-table",
        "dspark-sglang.io/hardware": _label(group),
        "dspark-sglang.io/model": _label(model),
        "dspark-sglang.io/tp": str(tp_size),
        CONTENT_HASH_LABEL: version,
    }
    annotations = {
        TABLE_ID_ANNOTATION: profile_id(group, model, tp_size),
        "dspark-sglang.io/profiled-at": str(meta.get("date", "")),
        "dspark-sglang.io/nodes": ",".join(meta.get("nodes", [])),
        "dspark-sglang.io/flagged-nodes": ",".join(meta.get("flagged_nodes", [])),
    }
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": configmap_name(group, model, tp_size, version),
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "immutable": True,
        "data": {TABLE_KEY: table_json, META_KEY: json.dumps(meta, indent=2) + "\n"},
    }


def build_sts_configmap(base: str, sts_json: str, namespace: str = "default") -> dict[str, Any]:
    """The immutable ConfigMap of one STS fit: ``<base>-<content_version(sts_json)>``, key
    ``sts.json``. Refuses JSON SGLang's STS loader would refuse (``StsCalibration``)."""
    from dspark_sglang.calibration.sts import StsCalibration

    if not namespace:
        raise ValueError("namespace must be non-empty")
    StsCalibration.from_json(sts_json, source="STS to publish")
    version = content_version(sts_json)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": sts_configmap_name(base, version),
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/part-of": "dspark-sglang",
                "app.kubernetes.io/component": "sts",
                CONTENT_HASH_LABEL: version,
            },
            "annotations": {TABLE_ID_ANNOTATION: base},
        },
        "immutable": True,
        "data": {STS_KEY: sts_json},
    }


def pin_of(manifest: Mapping[str, Any]) -> dict[str, str]:
    """What a chart tier writes to mount this published ConfigMap.

    ``{"hardwareGroup", "version"}`` for a cost table (under ``costTable``),
    ``{"configMapName", "version"}`` for an STS fit (under ``sts``).
    """
    meta = manifest["metadata"]
    version = meta["labels"][CONTENT_HASH_LABEL]
    if meta["labels"].get("app.kubernetes.io/component") == "sts":
        return {"configMapName": meta["annotations"][TABLE_ID_ANNOTATION], "version": version}
    return {"hardwareGroup": meta["labels"]["dspark-sglang.io/hardware"], "version": version}


def write_configmap(path: Path, manifest: dict[str, Any]) -> Path:
    """Write the manifest as YAML via a temp file + rename, so `kubectl apply` never reads
    a half-written file; returns ``path``."""
    _atomic_write(path, yaml.safe_dump(manifest, sort_keys=False))
    return path


def _content(data: Mapping[str, Any] | None) -> dict[str, Any]:
    """The keys a version covers: everything but the ``*.meta.json`` run description."""
    return {k: v for k, v in (data or {}).items() if not k.endswith(".meta.json")}


def _data_of(obj: Any) -> Mapping[str, Any] | None:
    return obj.get("data") if isinstance(obj, Mapping) else obj.data


def publish_configmap(manifest: dict[str, Any], api: Any | None = None) -> str:
    """Create the versioned ConfigMap; never replace or delete one.

    Returns ``"created"``, or ``"unchanged"`` when a ConfigMap of that name already
    holds the same content (the name is the content's hash, so re-publishing the same
    table is a no-op). Raises ``ConfigMapConflictError`` when it holds other content.
    Uses in-cluster credentials when running in a pod (the RayJob), else the local
    kubeconfig, unless ``api`` (a ``CoreV1Api``) is given.
    """
    from kubernetes.client.exceptions import ApiException

    if api is None:
        from kubernetes import client, config

        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        api = client.CoreV1Api()
    meta = manifest["metadata"]
    name, namespace = meta["name"], meta["namespace"]

    def compare(existing: Any) -> str:
        if _content(_data_of(existing)) == _content(manifest["data"]):
            return "unchanged"
        raise ConfigMapConflictError(
            f"ConfigMap {namespace}/{name} already exists with different "
            f"{'/'.join(sorted(_content(manifest['data'])))}: published ConfigMaps are "
            "immutable and named by their content hash, so that object was made or edited "
            "by hand. Check that no release revision mounts it (`dspark-sglang profile "
            f"--prune ...`), then `kubectl -n {namespace} delete configmap {name}` and "
            "publish again"
        )

    try:
        return compare(api.read_namespaced_config_map(name, namespace))
    except ApiException as exc:
        if exc.status != 404:
            raise
    try:
        api.create_namespaced_config_map(namespace, manifest)
    except ApiException as exc:
        if exc.status != 409:  # 409: another publisher created it since we looked
            raise
        return compare(api.read_namespaced_config_map(name, namespace))
    return "created"


# --- pruning: which published versions no kept release revision mounts ------------------


def load_manifests(text: str) -> list[dict[str, Any]]:
    """The objects of a multi-document YAML (``helm get manifest``, ``kubectl get -o yaml``);
    ``kind: List`` documents contribute their items."""
    out: list[dict[str, Any]] = []
    for doc in yaml.safe_load_all(text):
        if not doc:
            continue
        if doc.get("kind", "").endswith("List") and "items" in doc:
            out.extend(d for d in doc["items"] or [] if d)
        else:
            out.append(doc)
    return out


def referenced_configmaps(docs: Iterable[Mapping[str, Any]]) -> set[str]:
    """Every ConfigMap name the objects in ``docs`` mount or read, at any depth.

    Covers ``configMap`` volumes and projected sources (``{"configMap": {"name": ..}}``),
    ``envFrom[].configMapRef`` and ``env[].valueFrom.configMapKeyRef``, in any workload
    kind (Deployment, LeaderWorkerSet, RayJob, Job) without knowing its layout.
    """
    names: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, Mapping):
            for key, value in node.items():
                refs = ("configMap", "configMapRef", "configMapKeyRef")
                if key in refs and isinstance(value, Mapping) and value.get("name"):
                    names.add(str(value["name"]))
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    for doc in docs:
        walk(doc)
    return names


def unreferenced_configmaps(
    published: Iterable[Mapping[str, Any]],
    revisions: Iterable[Iterable[Mapping[str, Any]]],
) -> list[str]:
    """Names of the versioned ConfigMaps in ``published`` that no revision references.

    ``published``: ConfigMap objects (e.g. ``kubectl get configmap -o yaml`` items); only
    versioned ones (label ``dspark-sglang.io/content-hash``) are candidates, so a
    hand-made or release-owned ConfigMap is never listed. ``revisions``: the rendered
    manifests of every release revision that can still be rolled back to (``helm get
    manifest <release> --revision <n>`` for each revision ``helm history`` keeps, for
    every release in the namespace). A version any of them mounts is kept.
    """
    revisions = [list(r) for r in revisions]
    if not revisions:
        raise ValueError(
            "no release revisions given: every published table would look unreferenced; "
            "pass the manifests of every kept revision (helm get manifest --revision N)"
        )
    keep: set[str] = set()
    for docs in revisions:
        keep |= referenced_configmaps(docs)
    out = []
    for cm in published:
        meta = cm.get("metadata") or {}
        if cm.get("kind") != "ConfigMap" or CONTENT_HASH_LABEL not in (meta.get("labels") or {}):
            continue
        if meta["name"] not in keep:
            out.append(str(meta["name"]))
    return sorted(out)
