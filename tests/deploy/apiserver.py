"""A real kube-apiserver (1.20.2) + etcd on 127.0.0.1 for tests that need a cluster's API.

``scripts/build_kube_apiserver.sh`` builds the apiserver from Debian's source package into
``${DSPARK_CACHE_DIR:-~/.cache/dspark-sglang}/kube/`` (with Debian's etcd beside it); tests
that use ``running_apiserver`` skip with that command as the reason when it has not been
run. Override the directory with ``$DSPARK_KUBE_DIR``.

What it is: the API, storage and admission of Kubernetes 1.20, so ConfigMaps, Secrets,
CRDs, immutability, conflicts, ``kubectl`` and helm's release history (Secrets) are real.
What it is not: a cluster. No controller-manager, scheduler or kubelet runs, so no pod is
ever created from a Deployment, and 1.20 lacks policy/v1 PDBs and autoscaling/v2 HPAs.

Auth is a static bearer token (``--token-auth-file``, user ``admin`` in
``system:masters``) with ``--authorization-mode=AlwaysAllow``; the apiserver makes its own
self-signed serving certificate in ``--cert-dir``, which the kubeconfig trusts. Both
processes run from a temp data dir on free loopback ports and are stopped by PID.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dspark_sglang.sglang_integration.server import free_port

BUILD_HINT = "run `bash scripts/build_kube_apiserver.sh` (about 7 minutes)"


def kube_dir() -> Path:
    """Where the build script put ``kube-apiserver`` and ``etcd``."""
    env = os.environ.get("DSPARK_KUBE_DIR")
    if env:
        return Path(env)
    cache = Path(
        os.environ.get("DSPARK_CACHE_DIR")
        or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dspark-sglang"
    )
    return cache / "kube"


def binaries() -> tuple[Path, Path]:
    """(kube-apiserver, etcd), or ``pytest.skip`` with the command that builds them."""
    d = kube_dir()
    apiserver, etcd = d / "kube-apiserver", d / "etcd"
    for b in (apiserver, etcd):
        if not (b.is_file() and os.access(b, os.X_OK)):
            pytest.skip(f"kube-apiserver not built ({b} missing): {BUILD_HINT}")
    if shutil.which("openssl") is None:  # makes the service-account signing key
        pytest.skip("openssl not found: the test apiserver needs it for its signing key")
    return apiserver, etcd


@dataclass
class ApiServer:
    url: str
    token: str
    ca_file: Path
    kubeconfig: Path
    log_dir: Path

    def env(self) -> dict[str, str]:
        """The environment for kubectl / helm: only this server's kubeconfig, never ~/.kube."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        # helm keeps its cache/config beside the kubeconfig, not in the user's home.
        for var, sub in (
            ("HELM_CACHE_HOME", "helm-cache"),
            ("HELM_CONFIG_HOME", "helm-config"),
            ("HELM_DATA_HOME", "helm-data"),
        ):
            env[var] = str(self.kubeconfig.parent / sub)
        return env

    def api_client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` for this server (token auth, its own CA)."""
        from kubernetes import client

        cfg = client.Configuration()
        cfg.host = self.url
        cfg.api_key = {"authorization": f"Bearer {self.token}"}
        cfg.ssl_ca_cert = str(self.ca_file)
        cfg.verify_ssl = True
        return client.ApiClient(cfg)

    def core_v1(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.api_client())

    def apps_v1(self) -> Any:
        from kubernetes import client

        return client.AppsV1Api(self.api_client())

    def create_namespace(self, name: str) -> str:
        from kubernetes import client

        self.core_v1().create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        return name

    def logs(self) -> str:
        """The last lines of etcd's and the apiserver's logs (for assertion messages)."""
        return _log_tails(self.log_dir)


def _log_tails(log_dir: Path, lines: int = 40) -> str:
    return "\n".join(
        f"--- {f.name} (last {lines} lines)\n"
        + "\n".join(f.read_text(errors="replace").splitlines()[-lines:])
        for f in sorted(log_dir.glob("*.log"))
    )


def _wait_ready(
    url: str, token: str, ca: Path, procs: dict[str, subprocess.Popen[bytes]], timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while time.monotonic() < deadline:
        for name, p in procs.items():
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited with {p.returncode} before the API was ready")
        if ca.is_file():
            ctx = ssl.create_default_context(cafile=str(ca))
            req = urllib.request.Request(
                f"{url}/readyz", headers={"Authorization": f"Bearer {token}"}
            )
            try:
                with urllib.request.urlopen(req, context=ctx, timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError, ssl.SSLError) as exc:
                last = str(exc)
        time.sleep(0.25)
    raise RuntimeError(f"kube-apiserver at {url} not ready after {timeout:.0f}s: {last}")


def _stop(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=15)


@contextlib.contextmanager
def running_apiserver(workdir: Path, ready_timeout: float = 90.0) -> Iterator[ApiServer]:
    """etcd + kube-apiserver on free 127.0.0.1 ports under ``workdir``; stopped on exit."""
    apiserver_bin, etcd_bin = binaries()
    workdir.mkdir(parents=True, exist_ok=True)
    logs = workdir / "logs"
    logs.mkdir(exist_ok=True)
    certs = workdir / "certs"
    certs.mkdir(exist_ok=True)
    token = secrets.token_hex(16)
    (workdir / "tokens.csv").write_text(f'{token},admin,admin,"system:masters"\n')
    sa_key = workdir / "sa.key"
    subprocess.run(
        ["openssl", "genrsa", "-out", str(sa_key), "2048"], check=True, capture_output=True
    )
    client_port, peer_port, secure_port = free_port(), free_port(), free_port()
    etcd_url = f"http://127.0.0.1:{client_port}"
    peer_url = f"http://127.0.0.1:{peer_port}"
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        with open(logs / "etcd.log", "wb") as out:
            procs["etcd"] = subprocess.Popen(
                [
                    str(etcd_bin),
                    "--name=test",
                    f"--data-dir={workdir / 'etcd-data'}",
                    f"--listen-client-urls={etcd_url}",
                    f"--advertise-client-urls={etcd_url}",
                    f"--listen-peer-urls={peer_url}",
                    f"--initial-advertise-peer-urls={peer_url}",
                    f"--initial-cluster=test={peer_url}",
                    "--log-level=warn",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        with open(logs / "kube-apiserver.log", "wb") as out:
            procs["kube-apiserver"] = subprocess.Popen(
                [
                    str(apiserver_bin),
                    f"--etcd-servers={etcd_url}",
                    "--bind-address=127.0.0.1",
                    "--advertise-address=127.0.0.1",
                    f"--secure-port={secure_port}",
                    "--insecure-port=0",
                    f"--cert-dir={certs}",
                    f"--token-auth-file={workdir / 'tokens.csv'}",
                    "--authorization-mode=AlwaysAllow",
                    "--service-cluster-ip-range=10.0.0.0/24",
                    f"--service-account-key-file={sa_key}",
                    f"--service-account-signing-key-file={sa_key}",
                    "--service-account-issuer=https://kubernetes.default.svc",
                    "--v=1",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        url = f"https://127.0.0.1:{secure_port}"
        ca = certs / "apiserver.crt"  # self-signed: the serving cert is its own CA
        try:
            _wait_ready(url, token, ca, procs, ready_timeout)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}\n{_log_tails(logs)}") from None
        kubeconfig = workdir / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "test",
                            "cluster": {"server": url, "certificate-authority": str(ca)},
                        }
                    ],
                    "users": [{"name": "admin", "user": {"token": token}}],
                    "contexts": [{"name": "test", "context": {"cluster": "test", "user": "admin"}}],
                    "current-context": "test",
                }
            )
        )
        kubeconfig.chmod(0o600)
        yield ApiServer(url=url, token=token, ca_file=ca, kubeconfig=kubeconfig, log_dir=logs)
    finally:
        # The apiserver first (it holds etcd connections), then etcd; by PID, never by name.
        for name in ("kube-apiserver", "etcd"):
            if name in procs:
                _stop(procs[name])
