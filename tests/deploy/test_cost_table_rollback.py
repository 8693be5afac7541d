"""Versioned cost tables and STS fits: two publishes, two release revisions, a rollback.

A published cost table is immutable and named by its content
(``dspark-cost-table-<hw>-<model>-tp<N>-<version>``); a chart tier pins one with
``costTable: {hardwareGroup, version}``. So a ``helm rollback`` (which re-applies the
previous revision's stored manifest) mounts the previous table again, provided the
publisher kept it. Shown here on real ``helm template`` renders:

- publishing the committed CPU table and a changed copy gives two names, and neither
  publish replaces anything; re-publishing the first is a no-op;
- revision 1 (pinned to table 1) and revision 2 (table 2) render Deployments that mount
  different ConfigMaps, and every ConfigMap revision 1 mounts still exists with table 1's
  bytes after the second publish;
- pruning with revisions {1, 2} kept drops nothing; with only {2} it drops table 1.

No kube-apiserver exists on this machine, so the cluster side of ``publish_configmap``
is ``InMemoryCoreV1``: a small in-memory double of the three ``CoreV1Api`` calls it
makes, returning the real client's ``V1ConfigMap`` objects and raising its
``ApiException`` with the statuses the API server uses (404 missing, 409 exists), and
failing the test on any replace, patch or delete.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_tools import CHART, NAMESPACE, RELEASE, ROOT, render, render_text, run_helm
from kubernetes.client import V1ConfigMap, V1ObjectMeta
from kubernetes.client.exceptions import ApiException

from dspark_sglang.profiling.configmap import (
    CONTENT_HASH_LABEL,
    ConfigMapConflictError,
    build_configmap,
    build_sts_configmap,
    configmap_name,
    content_version,
    load_manifests,
    pin_of,
    publish_configmap,
    table_version,
    unreferenced_configmaps,
)

pytestmark = pytest.mark.helm

PROFILE = ROOT / "profiles" / "cpu-amd-epyc-avx2-2c" / "smollm2-135m-instruct-tp1.json"
GROUP = PROFILE.parent.name
MODEL = "smollm2-135m-instruct"
SPS_PATH = "/etc/dspark/cost-table/sps.json"
STS_PATH = "/etc/dspark/sts/sts.json"
STS_REF = {"configMapName": "dspark-sts-smollm2-b7"}


class InMemoryCoreV1:
    """The ``CoreV1Api`` calls ``publish_configmap`` makes, against a dict (see module doc)."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.creates = 0

    def read_namespaced_config_map(self, name: str, namespace: str) -> V1ConfigMap:
        obj = self.objects.get((namespace, name))
        if obj is None:
            raise ApiException(status=404, reason="Not Found")
        m = obj["metadata"]
        return V1ConfigMap(
            api_version="v1",
            kind="ConfigMap",
            metadata=V1ObjectMeta(
                name=m["name"],
                namespace=m["namespace"],
                labels=m.get("labels"),
                annotations=m.get("annotations"),
            ),
            data=dict(obj.get("data") or {}),
            immutable=obj.get("immutable"),
        )

    def create_namespaced_config_map(self, namespace: str, body: dict[str, Any]) -> None:
        key = (namespace, body["metadata"]["name"])
        if key in self.objects:
            raise ApiException(status=409, reason="AlreadyExists")
        self.objects[key] = copy.deepcopy(body)
        self.creates += 1

    def replace_namespaced_config_map(self, *a: Any, **k: Any) -> None:
        raise AssertionError("publish must never replace a published ConfigMap")

    patch_namespaced_config_map = replace_namespaced_config_map
    delete_namespaced_config_map = replace_namespaced_config_map

    def listed(self) -> list[dict[str, Any]]:
        """What `kubectl get configmap -o yaml` would list (as plain manifests)."""
        return [copy.deepcopy(o) for o in self.objects.values()]


def _meta() -> dict[str, Any]:
    return json.loads(PROFILE.with_name(f"{PROFILE.stem}.meta.json").read_text())


def _tables() -> tuple[str, str]:
    """The committed table and a re-profile of it: 8 % slower everywhere (a driver change)."""
    first = PROFILE.read_text(encoding="utf-8")
    obj = json.loads(first)
    obj["sample_steps_per_sec"] = [round(r * 0.92, 12) for r in obj["sample_steps_per_sec"]]
    return first, json.dumps(obj, separators=(",", ":"))


def _values(tmp_path: Path, name: str, cost: dict[str, Any], sts: dict[str, Any]) -> Path:
    """A one-tier values file for the committed CPU profile's model."""
    tier = {
        "name": "interactive",
        "minTokensPerSecPerUser": 120,
        "tp": 1,
        "gpusPerPod": 1,
        "scheduler": {
            "policy": "lagged",
            "blockSize": 7,
            "lagSteps": 2,
            "maxVerifyTokens": 96,
            "maxRunningRequests": 16,
        },
        "costTable": cost,
        "sts": sts,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"model": {"slug": MODEL}, "slaTiers": [tier]}))
    return path


def _deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    return dep


def _mounted(docs: list[dict[str, Any]], path: str) -> tuple[str, str]:
    """(ConfigMap, key) the tier's server container reads at ``path``."""
    pod = _deployment(docs)["spec"]["template"]["spec"]
    (c,) = [c for c in pod["containers"] if c["name"] == "sglang"]
    for m in c["volumeMounts"]:
        prefix = m["mountPath"].rstrip("/") + "/"
        if path.startswith(prefix):
            (vol,) = [v for v in pod["volumes"] if v["name"] == m["name"]]
            (item,) = [i for i in vol["configMap"]["items"] if i["path"] == path[len(prefix) :]]
            return vol["configMap"]["name"], item["key"]
    raise AssertionError(f"nothing mounted at {path}")


def _external_mounts_resolve(docs: list[dict[str, Any]], api: InMemoryCoreV1) -> dict[str, str]:
    """Every ConfigMap file the Deployment mounts that the release does not own, read from
    the cluster double (what the kubelet would mount for this revision's pods)."""
    owned = {d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"}
    pod = _deployment(docs)["spec"]["template"]["spec"]
    out = {}
    for vol in pod["volumes"]:
        cm = vol.get("configMap")
        if cm is None or cm["name"] in owned:
            continue
        obj = api.read_namespaced_config_map(cm["name"], NAMESPACE)  # 404 = stuck pod
        for item in cm["items"]:
            out[f"{cm['name']}:{item['key']}"] = obj.data[item["key"]]
    return out


@pytest.fixture
def two_publishes() -> dict[str, Any]:
    api = InMemoryCoreV1()
    first, second = _tables()
    m1 = build_configmap(GROUP, first, _meta(), namespace=NAMESPACE)
    m2 = build_configmap(GROUP, second, _meta(), namespace=NAMESPACE)
    assert publish_configmap(m1, api) == "created"
    assert publish_configmap(m2, api) == "created"
    return {"api": api, "tables": (first, second), "manifests": (m1, m2)}


def test_two_publishes_make_two_immutable_versions_and_replace_nothing(
    two_publishes: dict[str, Any],
) -> None:
    api, (first, second) = two_publishes["api"], two_publishes["tables"]
    m1, m2 = two_publishes["manifests"]
    v1, v2 = content_version(first), content_version(second)
    assert v1 != v2
    assert v1 == table_version(PROFILE)  # what `plan` pins for the committed profile
    assert m1["metadata"]["name"] == configmap_name(GROUP, MODEL, 1, v1)
    assert m2["metadata"]["name"] == f"dspark-cost-table-{GROUP}-{MODEL}-tp1-{v2}"
    for m, v in ((m1, v1), (m2, v2)):
        assert m["immutable"] is True and m["metadata"]["labels"][CONTENT_HASH_LABEL] == v
        assert pin_of(m) == {"hardwareGroup": GROUP, "version": v}
    # The committed manifest is the first version (the file `kubectl apply -f` ships).
    committed = yaml.safe_load(PROFILE.with_name(f"{PROFILE.stem}.configmap.yaml").read_text())
    assert committed["metadata"]["name"] == m1["metadata"]["name"]
    # Both exist, the first untouched; publishing the same table again is a no-op.
    stored = {k[1]: o["data"]["sps.json"] for k, o in api.objects.items()}
    assert stored == {m1["metadata"]["name"]: first, m2["metadata"]["name"]: second}
    assert publish_configmap(copy.deepcopy(m1), api) == "unchanged"
    # A re-run that reproduces the table bytes but not the run record is the same version.
    rerun = build_configmap(
        GROUP, first, {**_meta(), "date": "2027-01-01T00:00:00+00:00"}, NAMESPACE
    )
    assert rerun["metadata"]["name"] == m1["metadata"]["name"]
    assert publish_configmap(rerun, api) == "unchanged"
    assert api.creates == 2


def test_helm_rollback_mounts_the_previous_table_which_the_publisher_kept(
    two_publishes: dict[str, Any], tmp_path: Path
) -> None:
    api, (first, second) = two_publishes["api"], two_publishes["tables"]
    m1, m2 = two_publishes["manifests"]
    sts = {"configMapName": "dspark-sts-smollm2-b7"}
    rev1 = render(_values(tmp_path, "rev1", pin_of(m1), sts))
    rev2 = render(_values(tmp_path, "rev2", pin_of(m2), sts))
    assert _mounted(rev1, SPS_PATH) == (m1["metadata"]["name"], "sps.json")
    assert _mounted(rev2, SPS_PATH) == (m2["metadata"]["name"], "sps.json")
    # The upgrade changes the pod template (new pods read the new table) ...
    a1, a2 = (_deployment(r)["spec"]["template"]["metadata"]["annotations"] for r in (rev1, rev2))
    assert a1["checksum/dspark-config"] != a2["checksum/dspark-config"]
    # ... and after both publishes, what revision 1 mounts is still there with table 1's
    # bytes: `helm rollback` re-applies revision 1's manifest and its pods start on table 1.
    api.objects[(NAMESPACE, "dspark-sts-smollm2-b7")] = {
        "metadata": {"name": "dspark-sts-smollm2-b7", "namespace": NAMESPACE},
        "data": {"sts.json": '{"temperatures": [1, 1, 1, 1, 1, 1, 1]}'},
    }
    files1 = _external_mounts_resolve(rev1, api)
    assert files1[f"{m1['metadata']['name']}:sps.json"] == first
    assert _external_mounts_resolve(rev2, api)[f"{m2['metadata']['name']}:sps.json"] == second


def test_prune_keeps_every_version_a_kept_revision_mounts(
    two_publishes: dict[str, Any], tmp_path: Path
) -> None:
    api = two_publishes["api"]
    m1, m2 = two_publishes["manifests"]
    sts = {"configMapName": "dspark-sts-smollm2-b7"}
    texts = {
        rev: render_text(_values(tmp_path, f"rev{rev}", pin_of(m), sts))
        for rev, m in ((1, m1), (2, m2))
    }
    # Release-owned and hand-made ConfigMaps are in the listing too; never candidates.
    listed = [
        *api.listed(),
        *[d for d in load_manifests(texts[1]) if d["kind"] == "ConfigMap"],
        {"kind": "ConfigMap", "metadata": {"name": "dspark-cost-table-by-hand", "labels": {}}},
    ]
    revs = {rev: load_manifests(t) for rev, t in texts.items()}
    assert unreferenced_configmaps(listed, [revs[1], revs[2]]) == []
    assert unreferenced_configmaps(listed, [revs[2]]) == [m1["metadata"]["name"]]
    assert unreferenced_configmaps(listed, [revs[1]]) == [m2["metadata"]["name"]]
    with pytest.raises(ValueError, match="no release revisions given"):
        unreferenced_configmaps(listed, [])


def test_prune_cli_prints_exactly_the_unreferenced_names(
    two_publishes: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dspark_sglang.cli import main

    api = two_publishes["api"]
    m1, m2 = two_publishes["manifests"]
    cms = tmp_path / "configmaps.yaml"
    cms.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": api.listed()}))
    keeps = []
    for rev, m in ((1, m1), (2, m2)):
        f = tmp_path / f"manifest-{rev}.yaml"
        f.write_text(render_text(_values(tmp_path, f"cli{rev}", pin_of(m), {"configMapName": "s"})))
        keeps.append(f)
    capsys.readouterr()
    assert main(["profile", "--prune", str(cms), "--keep", str(keeps[1])]) == 0
    assert capsys.readouterr().out.split() == [m1["metadata"]["name"]]
    assert (
        main(["profile", "--prune", str(cms), "--keep", str(keeps[0]), "--keep", str(keeps[1])])
        == 0
    )
    assert capsys.readouterr().out.split() == []
    assert main(["profile", "--prune", str(cms)]) == 2
    assert "--keep RELEASE_MANIFEST" in capsys.readouterr().err


def test_publish_refuses_a_different_table_under_a_published_name(
    two_publishes: dict[str, Any],
) -> None:
    api = two_publishes["api"]
    m1, _ = two_publishes["manifests"]
    forged = copy.deepcopy(m1)
    forged["data"]["sps.json"] = two_publishes["tables"][1]  # other bytes, same name
    with pytest.raises(
        ConfigMapConflictError, match=r"already exists with different sps\.json"
    ) as e:
        publish_configmap(forged, api)
    assert f"kubectl -n {NAMESPACE} delete configmap {m1['metadata']['name']}" in str(e.value)
    assert api.objects[(NAMESPACE, m1["metadata"]["name"])]["data"] == m1["data"]


def test_a_concurrent_publisher_of_the_same_table_is_not_an_error() -> None:
    """Two drivers publishing the same version: the loser's create gets 409, then compares."""
    api = InMemoryCoreV1()
    m = build_configmap(GROUP, _tables()[0], _meta(), NAMESPACE)
    real_read = api.read_namespaced_config_map
    calls = {"n": 0}

    def read_then_lose_the_race(name: str, namespace: str) -> V1ConfigMap:
        calls["n"] += 1
        if calls["n"] == 1:  # nothing there yet ... and the other driver creates it now
            api.objects[(namespace, name)] = copy.deepcopy(m)
            raise ApiException(status=404, reason="Not Found")
        return real_read(name, namespace)

    api.read_namespaced_config_map = read_then_lose_the_race  # type: ignore[method-assign]
    assert publish_configmap(m, api) == "unchanged"
    assert calls["n"] == 2


def test_sts_versions_pin_the_same_way(tmp_path: Path) -> None:
    """Calibration's <configMapName>-<version> is what a tier with sts.version mounts."""
    fits = ['{"temperatures":[1.1,1.2,1.3,1.4,1.5,1.6,1.7]}', '{"temperatures":[1,1,1,1,1,1,1]}']
    api = InMemoryCoreV1()
    manifests = [build_sts_configmap("dspark-sts", f, NAMESPACE) for f in fits]
    assert [publish_configmap(m, api) for m in manifests] == ["created", "created"]
    names = [m["metadata"]["name"] for m in manifests]
    assert names == [f"dspark-sts-{content_version(f)}" for f in fits]
    cost = {"hardwareGroup": GROUP, "version": table_version(PROFILE)}
    for i, m in enumerate(manifests):
        assert m["immutable"] is True and pin_of(m)["configMapName"] == "dspark-sts"
        docs = render(_values(tmp_path, f"sts{i}", cost, pin_of(m)))
        assert _mounted(docs, STS_PATH) == (names[i], "sts.json")
        assert api.objects[(NAMESPACE, names[i])]["data"]["sts.json"] == fits[i]
    with pytest.raises(ValueError, match="temperatures"):
        build_sts_configmap("dspark-sts", '{"temperature": [1.0]}', NAMESPACE)


def test_unpinned_tiers_keep_the_unversioned_name() -> None:
    """Without costTable.version: the legacy name (hand-published tables), as before."""
    docs = render(CHART / "values.yaml")
    for d in docs:
        if d["kind"] == "Deployment":
            vols = {v["name"]: v for v in d["spec"]["template"]["spec"]["volumes"]}
            assert vols["cost-table"]["configMap"]["name"] == (
                "dspark-cost-table-cuda-nvidia-h200-1x-target-tp1"
            )


@pytest.mark.parametrize(
    ("cost", "sts", "message"),
    [
        ({"hardwareGroup": GROUP, "version": "3F1664F4B5"}, {"configMapName": "s"}, "version"),
        ({"hardwareGroup": GROUP, "version": "3f1664f4"}, {"configMapName": "s"}, "version"),
        (
            {"configMapName": "x", "version": "3f1664f4b5"},
            {"configMapName": "s"},
            "costTable.version pins a table the profiler published for costTable.hardwareGroup",
        ),
        (
            {"hardwareGroup": GROUP},
            {"inline": {"temperatures": [1.0] * 7}, "version": "3f1664f4b5"},
            "sts.version pins calibration's <sts.configMapName>-<version>",
        ),
    ],
    ids=["uppercase-version", "short-version", "version-without-group", "sts-version-inline"],
)
def test_bad_version_pins_are_rejected(
    cost: dict[str, Any], sts: dict[str, Any], message: str, tmp_path: Path
) -> None:
    proc = run_helm("template", RELEASE, str(CHART), "-f", str(_values(tmp_path, "bad", cost, sts)))
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


def test_inline_table_edits_roll_the_pods_and_live_in_the_release(tmp_path: Path) -> None:
    """An inline table is a release-owned ConfigMap of a fixed name: a content change
    changes the pod template's checksum (pods restart onto it), and helm rollback
    restores it with the rest of the revision."""
    table = {"sample_batch_tokens": [1, 32], "sample_steps_per_sec": [9.0, 6.0]}
    revs = [
        render(
            _values(tmp_path, f"inline{i}", {"inline": {**table, "max_batch_tokens": m}}, STS_REF)
        )
        for i, m in enumerate((64, 128))
    ]
    cms = [
        next(
            d
            for d in r
            if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-cost-table")
        )
        for r in revs
    ]
    assert cms[0]["metadata"]["name"] == cms[1]["metadata"]["name"]
    assert cms[0]["data"] != cms[1]["data"]
    sums = [_deployment(r)["spec"]["template"]["metadata"]["annotations"] for r in revs]
    assert sums[0]["checksum/dspark-config"] != sums[1]["checksum/dspark-config"]


def test_chart_rayjob_writes_to_a_mounted_volume_and_publishes_from_it(tmp_path: Path) -> None:
    """The driver runs on the Ray head: --out is a volume there (a PVC when
    profiling.outputClaimName is set), never the pod's /tmp."""
    from dspark_sglang.cli import build_parser

    example = yaml.safe_load((CHART / "examples" / "jobs-profile-calibrate.yaml").read_text())
    for claim in ("", "dspark-profiles"):
        example["profiling"]["outputClaimName"] = claim
        f = tmp_path / f"jobs-{claim or 'emptydir'}.yaml"
        f.write_text(yaml.safe_dump(example))
        ray = next(d for d in render(f) if d["kind"] == "RayJob")
        args = build_parser().parse_args(ray["spec"]["entrypoint"].split()[1:])
        assert args.publish and not str(args.out).startswith("/tmp")
        head = ray["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
        (mount,) = [
            m for m in head["containers"][0]["volumeMounts"] if Path(m["mountPath"]) == args.out
        ]
        (vol,) = [v for v in head["volumes"] if v["name"] == mount["name"]]
        if claim:
            assert vol["persistentVolumeClaim"] == {"claimName": claim}
        else:
            assert vol["emptyDir"] == {}


def test_chart_calibration_publisher_prints_the_pin_that_mounts_its_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The calibration Job's publish script as rendered, run against the cluster double
    (its /out volume is a temp dir here): it creates <configMapName>-<version>, and the pin it
    prints mounts exactly that."""
    import dspark_sglang.profiling.configmap as cm_module

    docs = render(CHART / "examples" / "jobs-profile-calibrate.yaml")
    job = next(d for d in docs if d["kind"] == "Job")
    (publish,) = job["spec"]["template"]["spec"]["containers"]
    assert {"name": "out", "mountPath": "/out", "readOnly": True} in publish["volumeMounts"]
    script = publish["args"][0]
    fit = '{"temperatures":[1.1,1.2,1.3,1.4,1.5,1.6,1.7]}'
    (tmp_path / "sts.json").write_text(fit)
    api = InMemoryCoreV1()
    monkeypatch.setattr(cm_module, "publish_configmap", lambda m: publish_configmap(m, api))
    for _ in range(2):  # a rerun of the same fit is a no-op
        exec(compile(script.replace("/out/", f"{tmp_path}/"), "publish", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert "(created)" in out[0] and "(unchanged)" in out[2]
    pin = json.loads(out[1].split("sts: ", 1)[1])
    ((_, name),) = api.objects
    assert name == f"{pin['configMapName']}-{pin['version']}" and pin["version"] == content_version(
        fit
    )
    cost = {"hardwareGroup": GROUP, "version": table_version(PROFILE)}
    assert _mounted(render(_values(tmp_path, "calibrated", cost, pin)), STS_PATH) == (
        name,
        "sts.json",
    )
