"""Versioned cost tables against a real kube-apiserver: publish, fetch, roll back, prune.

``tests/deploy/test_cost_table_rollback.py`` shows the same contract on ``helm template``
renders and an in-memory ``CoreV1Api`` double. Here the other side is a real API server
(Kubernetes 1.20.2 + etcd on 127.0.0.1, ``tests/deploy/apiserver.py``; built by
``bash scripts/build_kube_apiserver.sh``, else these tests skip saying so):

- ``publish_configmap`` with the real ``kubernetes`` client: created, then unchanged; a
  changed table is another name; a hand-made object under a versioned name is refused;
  the server itself rejects replacing a published (``immutable``) ConfigMap;
- the runbook's ``kubectl get configmap NAME -o yaml > live-table.yaml`` with the pinned
  kubectl gives ``read_profile`` the published bytes and metadata;
- ``helm install`` / ``upgrade`` / ``rollback`` of the chart: the Deployment the server
  stores mounts table 1 again after the rollback, both tables still exist, and pruning
  with the revisions ``helm history`` keeps (``helm get manifest --revision N``) drops
  only what no kept revision mounts.

The server has no scheduler or kubelet (no pod ever runs) and is 1.20, so the chart is
installed from a copy with two 1.20 adaptations, both outside what is tested: its
``kubeVersion`` floor (>=1.30) lowered, and the preStop ``sleep`` action (1.29+) written as
an ``exec`` of ``sleep``; PDBs (policy/v1), the HPA (autoscaling/v2) and the Prometheus
Operator kinds are turned off in the values.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from apiserver import ApiServer, running_apiserver
from chart_tools import CHART, ROOT, helm_bin, kubectl_bin
from kubernetes.client.exceptions import ApiException

from dspark_sglang.planning.inputs import profile_identity, read_profile
from dspark_sglang.profiling.configmap import (
    ConfigMapConflictError,
    build_configmap,
    content_version,
    load_manifests,
    pin_of,
    publish_configmap,
    table_version,
    unreferenced_configmaps,
)

pytestmark = pytest.mark.apiserver

PROFILE = ROOT / "profiles" / "cpu-amd-epyc-avx2-2c" / "smollm2-135m-instruct-tp1.json"
GROUP = PROFILE.parent.name
MODEL = "smollm2-135m-instruct"
RELEASE = "dspark"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    with running_apiserver(tmp_path_factory.mktemp("apiserver")) as s:
        yield s


_namespaces = iter(range(1, 1000))


@pytest.fixture
def ns(server: ApiServer) -> str:
    """A fresh namespace per test, so tests never see each other's objects."""
    return server.create_namespace(f"t{next(_namespaces)}")


def _meta() -> dict[str, Any]:
    return json.loads(PROFILE.with_name(f"{PROFILE.stem}.meta.json").read_text())


def _tables() -> tuple[str, str]:
    """The committed table and a re-profile of it: 8 % slower everywhere."""
    first = PROFILE.read_text(encoding="utf-8")
    obj = json.loads(first)
    obj["sample_steps_per_sec"] = [round(r * 0.92, 12) for r in obj["sample_steps_per_sec"]]
    return first, json.dumps(obj, separators=(",", ":"))


def _manifests(namespace: str) -> tuple[dict[str, Any], dict[str, Any]]:
    first, second = _tables()
    return (
        build_configmap(GROUP, first, _meta(), namespace=namespace),
        build_configmap(GROUP, second, _meta(), namespace=namespace),
    )


def _run(server: ApiServer, *cmd: str, stdout: Any = subprocess.PIPE) -> str:
    proc = subprocess.run(
        list(cmd),
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        env=server.env(),
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr}"
    return proc.stdout or ""


def _kubectl(server: ApiServer, *args: str, stdout: Any = subprocess.PIPE) -> str:
    return _run(server, kubectl_bin(), "--kubeconfig", str(server.kubeconfig), *args, stdout=stdout)


def _helm(server: ApiServer, *args: str) -> str:
    return _run(server, helm_bin(), "--kubeconfig", str(server.kubeconfig), *args)


# --------------------------------------------------------------------------- the publisher


def test_publish_creates_once_and_the_server_keeps_it_immutable(server: ApiServer, ns: str) -> None:
    api = server.core_v1()
    m1, m2 = _manifests(ns)
    first, second = _tables()
    assert publish_configmap(copy.deepcopy(m1), api) == "created"
    assert publish_configmap(copy.deepcopy(m1), api) == "unchanged"
    # A re-run that reproduces the bytes but not the run record is the same version.
    rerun = build_configmap(GROUP, first, {**_meta(), "date": "2027-01-01T00:00:00+00:00"}, ns)
    assert publish_configmap(rerun, api) == "unchanged"
    # Another table is another name; publishing it touches nothing of the first.
    assert m2["metadata"]["name"] != m1["metadata"]["name"]
    assert publish_configmap(copy.deepcopy(m2), api) == "created"
    stored = {
        cm.metadata.name: cm
        for cm in api.list_namespaced_config_map(
            ns, label_selector="dspark-sglang.io/content-hash"
        ).items
    }
    assert set(stored) == {m1["metadata"]["name"], m2["metadata"]["name"]}
    assert stored[m1["metadata"]["name"]].data == m1["data"]
    assert stored[m2["metadata"]["name"]].data["sps.json"] == second
    assert all(cm.immutable is True for cm in stored.values())
    assert m1["metadata"]["name"].endswith("-" + table_version(PROFILE))

    # The server, not only the publisher, refuses to change a published version.
    live = stored[m1["metadata"]["name"]]
    live.data = {**live.data, "sps.json": second}
    with pytest.raises(ApiException) as e:
        api.replace_namespaced_config_map(live.metadata.name, ns, live)
    assert e.value.status == 422 and "immutable" in e.value.body, e.value.body
    with pytest.raises(ApiException) as e:
        api.patch_namespaced_config_map(live.metadata.name, ns, {"data": {"sps.json": "{}"}})
    assert e.value.status == 422, e.value.body
    after = api.read_namespaced_config_map(m1["metadata"]["name"], ns)
    assert after.data == m1["data"]


def test_publish_refuses_a_hand_made_configmap_under_a_versioned_name(
    server: ApiServer, ns: str
) -> None:
    api = server.core_v1()
    _, m2 = _manifests(ns)
    name = m2["metadata"]["name"]
    # Made by hand with the name of table 2's version but other bytes, and mutable.
    _kubectl(
        server,
        "-n",
        ns,
        "create",
        "configmap",
        name,
        "--from-literal=sps.json={}",
        "--from-literal=sps.meta.json={}",
    )
    with pytest.raises(
        ConfigMapConflictError, match=r"already exists with different sps\.json"
    ) as e:
        publish_configmap(copy.deepcopy(m2), api)
    assert f"kubectl -n {ns} delete configmap {name}" in str(e.value)
    assert api.read_namespaced_config_map(name, ns).data["sps.json"] == "{}"  # untouched
    # Following the error's advice: delete it, publish again.
    _kubectl(server, "-n", ns, "delete", "configmap", name)
    assert publish_configmap(copy.deepcopy(m2), api) == "created"
    assert api.read_namespaced_config_map(name, ns).data == m2["data"]


# --------------------------------------------------------------------------- the live table


def test_live_table_fetched_with_kubectl_is_the_published_table(
    server: ApiServer, ns: str, tmp_path: Path
) -> None:
    m1, _ = _manifests(ns)
    first, _ = _tables()
    name = m1["metadata"]["name"]
    assert publish_configmap(copy.deepcopy(m1), server.core_v1()) == "created"
    live = tmp_path / "live-table.yaml"
    with live.open("w") as out:  # the runbook: kubectl -n $NS get configmap $CM -o yaml > ...
        _kubectl(server, "-n", ns, "get", "configmap", name, "-o", "yaml", stdout=out)
    prof = read_profile(live)
    assert prof.table_bytes == first.encode("utf-8")
    assert prof.meta == _meta()
    assert prof.configmap_name == name
    ident = profile_identity(prof)
    assert ident.version == name.rsplit("-", 1)[1] == content_version(first)
    assert (ident.hardware, ident.model, ident.tp_size) == (GROUP, MODEL, 1)


# --------------------------------------------------------------------------- helm history


def _chart_for_1_20(dst: Path) -> Path:
    """A copy of the chart a 1.20 API server accepts (see the module doc); fails loudly
    when the chart no longer has what is adapted, so the copy never drifts silently."""
    shutil.copytree(CHART, dst)
    chart_yaml = dst / "Chart.yaml"
    text, n = re.subn(r"(?m)^kubeVersion: .*$", 'kubeVersion: ">=1.20.0-0"', chart_yaml.read_text())
    assert n == 1, "Chart.yaml has no kubeVersion line to lower for the 1.20 test server"
    chart_yaml.write_text(text)
    pod = dst / "templates" / "_pod.tpl"
    text, n = re.subn(
        r"sleep:\n(\s+)seconds: (\{\{[^}]*\}\})",
        r'exec:\n\1command: ["sleep", "\2"]',
        pod.read_text(),
    )
    assert n == 1, "_pod.tpl has no preStop sleep action to rewrite for the 1.20 test server"
    pod.write_text(text)
    return dst


def _values(tmp_path: Path, name: str, cost: dict[str, Any]) -> Path:
    """One tier pinned to ``cost``, with every kind a 1.20 server lacks turned off."""
    values = {
        "model": {"slug": MODEL},
        "metrics": {"serviceMonitor": {"enabled": False}, "prometheusRule": {"enabled": False}},
        "tierDefaults": {
            "podDisruptionBudget": {"enabled": False},
            "autoscaling": {"enabled": False},
        },
        "slaTiers": [
            {
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
                "sts": {"configMapName": "dspark-sts"},
            }
        ],
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def _mounted_table(server: ApiServer, ns: str) -> str:
    """The cost-table ConfigMap the Deployment stored in the server mounts (runbook query)."""
    return _kubectl(
        server,
        "-n",
        ns,
        "get",
        "deployment",
        f"{RELEASE}-dspark-sglang-interactive",
        "-o",
        'jsonpath={.spec.template.spec.volumes[?(@.name=="cost-table")].configMap.name}',
    ).strip()


@pytest.mark.helm
def test_helm_rollback_mounts_the_kept_table_and_prune_follows_the_history(
    server: ApiServer, ns: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dspark_sglang.cli import main

    api = server.core_v1()
    m1, m2 = _manifests(ns)
    n1, n2 = m1["metadata"]["name"], m2["metadata"]["name"]
    first, second = _tables()
    assert [publish_configmap(copy.deepcopy(m), api) for m in (m1, m2)] == ["created"] * 2
    chart = str(_chart_for_1_20(tmp_path / "chart"))
    v1 = _values(tmp_path, "rev1", pin_of(m1))
    v2 = _values(tmp_path, "rev2", pin_of(m2))

    _helm(server, "install", RELEASE, chart, "-n", ns, "-f", str(v1))
    assert _mounted_table(server, ns) == n1
    _helm(server, "upgrade", RELEASE, chart, "-n", ns, "-f", str(v2))
    assert _mounted_table(server, ns) == n2
    _helm(server, "rollback", RELEASE, "1", "-n", ns)
    history = json.loads(_helm(server, "history", RELEASE, "-n", ns, "-o", "json"))
    assert [h["revision"] for h in history] == [1, 2, 3]
    assert history[-1]["status"] == "deployed" and "Rollback to 1" in history[-1]["description"]

    # Revision 3 is revision 1 again: its Deployment mounts table 1, which still exists
    # with table 1's bytes (publishing table 2 replaced nothing), and so does table 2.
    assert _mounted_table(server, ns) == n1
    dep = server.apps_v1().read_namespaced_deployment(f"{RELEASE}-dspark-sglang-interactive", ns)
    vols = {v.name: v for v in dep.spec.template.spec.volumes}
    assert vols["cost-table"].config_map.name == n1
    assert api.read_namespaced_config_map(n1, ns).data["sps.json"] == first
    assert api.read_namespaced_config_map(n2, ns).data["sps.json"] == second

    # Prune as reprofile.md step 4 does, from what helm and the server hold.
    manifests = {}
    for h in history:
        rev = h["revision"]
        path = tmp_path / f"{RELEASE}-{rev}.yaml"
        path.write_text(_helm(server, "get", "manifest", RELEASE, "-n", ns, "--revision", str(rev)))
        manifests[rev] = path
    cms = tmp_path / "configmaps.yaml"
    with cms.open("w") as out:
        _kubectl(
            server, "-n", ns, "get", "configmap", "-l", "dspark-sglang.io/content-hash",
            "-o", "yaml", stdout=out,
        )  # fmt: skip
    published = load_manifests(cms.read_text())
    assert sorted(c["metadata"]["name"] for c in published) == sorted([n1, n2])
    revs = {r: load_manifests(p.read_text()) for r, p in manifests.items()}
    assert unreferenced_configmaps(published, revs.values()) == []
    assert unreferenced_configmaps(published, [revs[3]]) == [n2]
    assert unreferenced_configmaps(published, [revs[2]]) == [n1]

    capsys.readouterr()
    keep_all = [str(p) for p in manifests.values()]
    assert main(["profile", "--prune", str(cms), "--keep", *keep_all]) == 0
    assert capsys.readouterr().out.split() == []
    assert main(["profile", "--prune", str(cms), "--keep", str(manifests[3])]) == 0
    assert capsys.readouterr().out.split() == [n2]
