"""Every shell step of the runbooks (deploy/runbooks/*.md) runs here or is checked against
the real tools and the rendered chart, so a renamed flag, file, label or resource fails.

Each runbook is executed once, top to bottom, in its own work folder
(``runbook_commands.py`` extracts and parses its fenced blocks and inline command spans),
with the shell variables and ``<placeholders>`` of ``SUBSTITUTIONS``. Per command kind:

- ``dspark-sglang``: parsed by the real CLI parser (``build_parser``); the files it reads
  must exist (committed, or written by an earlier step); ``plan``, ``calibrate``,
  ``profile --rerender`` and ``profile --prune`` *run* (on the committed CPU profile and
  traces), the others are parse-only with the reason in ``NOT_RUN``.
- ``helm``: ``template``/``lint`` run; ``upgrade``/``install`` run as the equivalent
  ``helm template`` with the same ``-n``/``-f``/``--set*`` (every ``--set`` path must be in
  values.schema.json), and every verb also runs against a dead API server: it must fail
  to connect, not on an unknown flag or command.
- ``kubectl``: runs against the dead API server (flags and arguments must pass kubectl's
  own parsing), and every resource it names (``deployment/NAME``, ``configmap NAME``,
  ``-c CONTAINER``, ``-l SELECTOR``, jsonpath / custom-columns fields, paths inside a pod)
  must exist in the rendered chart (the shipped values, the live values of the SLA flow and
  what the runbook's own helm steps render) or be what ``dspark_sglang.profiling.configmap``
  publishes. ``kubectl get`` whose output a later step reads is evaluated on those objects.
- anything else must be in ``OTHER_TOOLS`` (it runs here when its input does).

Steps that need a cluster's state (``helm get values``, ``kubectl cp`` from a pod, ...) and
whose output a later step reads come from ``STAND_INS``, each with what it stands for.
A variable, placeholder, tool or untagged block the tables do not know fails the test.
Metric names the runbooks use are checked by tests/helm/test_helm_deploy_assets.py.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import fnmatch
import functools
import io
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from chart_tools import CHART, NAMESPACE, RELEASE, ROOT, SHIPPED, helm_bin, kubectl_bin, render
from cli_parsing import strict
from runbook_commands import (
    NON_SHELL_LANGS,
    PLACEHOLDER,
    SHELL_LANGS,
    AndOr,
    For,
    Lit,
    Simple,
    Source,
    Sub,
    Var,
    Word,
    parse_source,
    runbook_sources,
    walk_simple,
)

pytestmark = pytest.mark.helm

RUNBOOKS = ROOT / "deploy" / "runbooks"
HW = "cpu-amd-epyc-avx2-2c"
MODEL = "smollm2-135m-instruct"
PROFILE_DIR = ROOT / "profiles" / HW
TABLE = PROFILE_DIR / f"{MODEL}-tp1.json"
META = PROFILE_DIR / f"{MODEL}-tp1.meta.json"
LIVE_TABLE = PROFILE_DIR / f"{MODEL}-tp1.configmap.yaml"
LIVE_VALUES = ROOT / "tests" / "cli" / "data" / "live-values-cpu.yaml"
TRACES = sorted((ROOT / "benchmarks" / "results" / "traces").glob("smollm2_dspark_*.jsonl"))
STS = ROOT / "dspark_sglang" / "assets" / "drafters" / "smollm2" / "sts.json"
#: What the README's `VALUES=values-prod.yaml` holds in the work folder: a shipped example
#: with the default tier names (interactive, standard), autoscaling and a qwen3-8b drafter,
#: the model the canary and STS runbooks use as their example.
VALUES_PROD = CHART / "examples" / "small-model-80-120.yaml"
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
#: Pods get these made-up suffixes (a ReplicaSet hash and a pod id).
POD_SUFFIX = "5d8f7c9b4c-x7k2p"


@functools.cache
def published_table() -> dict[str, Any]:
    """The cost-table ConfigMap the profiler publishes for the committed CPU profile."""
    from dspark_sglang.profiling.configmap import build_configmap

    meta = json.loads(META.read_text())
    return build_configmap(HW, TABLE.read_text(encoding="utf-8"), meta, namespace=NAMESPACE)


@functools.cache
def published_sts() -> dict[str, Any]:
    """An STS fit as calibration publishes it (the committed drafter's, base dspark-sts)."""
    from dspark_sglang.profiling.configmap import build_sts_configmap

    return build_sts_configmap("dspark-sts", STS.read_text(encoding="utf-8"), NAMESPACE)


def table_version() -> str:
    return published_table()["metadata"]["labels"]["dspark-sglang.io/content-hash"]


def pod_name(workload: str) -> str:
    return f"{workload}-{POD_SUFFIX}"


# --------------------------------------------------------------------------- the tables

#: Every shell variable and placeholder the runbooks use, and its value here. Variables a
#: runbook assigns itself (CM, POD, v, r) are not listed: they get what the assignment
#: computes. A value may be a function (evaluated when first used).
SUBSTITUTIONS: dict[str, tuple[str | Callable[[], str], str]] = {
    "$REL": (RELEASE, "the release (README.md: REL=dspark; chart_tools.RELEASE)"),
    "$NS": (NAMESPACE, "its namespace (README.md: NS=llm; chart_tools.NAMESPACE)"),
    "$CHART": (
        "helm/dspark-sglang",
        "README.md's CHART; the work folder links helm/ to the repo's",
    ),
    "$VALUES": (
        "values-prod.yaml",
        "README.md's VALUES; the work folder holds VALUES_PROD under it",
    ),
    "$TIER": ("interactive", "sla-tier-tuning.md's example tier, one of the live values' tiers"),
    "<tier>": ("interactive", "a tier of the default values, the examples and the live values"),
    "<batch-tier>": ("batch", "the lower tier of the live values and large-model-35-50.yaml"),
    "<group>": (HW, "the committed CPU profile's hardware group"),
    "<model>": (MODEL, "the committed CPU profile's model slug"),
    "<N>": ("1", "the committed CPU profile's tp"),
    "<version>": (table_version, "the content version of the committed CPU table"),
    "<v>": (table_version, "a content version (the committed CPU table's)"),
    "<pod>": (lambda: pod_name(f"{RELEASE}-dspark-sglang-interactive"), "a pod of <tier>"),
    "<pending pod>": (lambda: pod_name(f"{RELEASE}-dspark-sglang-interactive"), "a pod of <tier>"),
    "<node>": ("gpu-node-1", "a node: nodes are the cluster's, never the chart's, so unchecked"),
    "<n>": ("3", "a replica count (scale) or a revision number (helm get values --revision)"),
    "<previous revision>": ("1", "a revision helm history lists"),
    "<last good revision>": ("1", "a revision helm history lists"),
    "<last good>": ("1", "a revision helm history lists"),
    "<revision>": ("1", "a revision helm history lists"),
    "<drafter dir>": (
        "drafter",
        "the drafter's folder under /models (chart default /models/drafter)",
    ),
    "<dir>": ("./drafter", "a local drafter checkpoint folder (demo is parse-only here)"),
}

#: Literal arguments replaced for the one run of a command here (its flags are parsed as
#: written first). The committed CPU table cannot serve 120/80 tok/s/user (its fastest
#: step is 9 steps/s), and the live values (tests/cli/data/live-values-cpu.yaml) have tiers
#: interactive (SLA 7) and batch (SLA 2), not interactive/standard.
FLOW_ARGS: dict[tuple[str, str], dict[str, str]] = {
    ("sla-tier-tuning.md", "plan"): {
        "120,80": "7,2",
        "interactive=64,standard=200": "interactive=10,batch=40",
    },
}

#: Untagged blocks that are printed output, not commands: (runbook, first characters).
OUTPUT_BLOCKS: dict[tuple[str, str], str] = {
    ("reprofile.md", "[profile] ConfigMap "): "the last line of the profiling job's log",
}

#: Commands other than dspark-sglang/helm/kubectl: whether they run here, and why they are
#: allowed. Filters run when the step before them produced their input here.
OTHER_TOOLS: dict[str, str] = {
    "cp": "copies a file in the work folder (runs)",
    "mkdir": "makes a folder in the work folder (runs)",
    "date": "a timestamp for an annotation (runs)",
    "sha256sum": "the content version of a file, as the profiler computes it (runs)",
    "cut": "text filter (runs on its input)",
    "head": "text filter (runs on its input)",
    "tail": "text filter (runs on its input)",
    "grep": "text filter (runs on its input)",
    "sed": "text filter (runs on its input)",
    "jq": "JSON filter (runs on its input)",
    "python": "only `python -m json.tool`, a JSON pretty-printer (runs on its input)",
    "xargs": "runs its command (checked as that command) on the names it reads",
}

#: dspark-sglang commands that are parsed but not run here, and why.
NOT_RUN: dict[str, str] = {
    "bench acceptance": "runs the reference generator on the SmolLM2 target with two "
    "drafter checkpoints the runbook names by placeholder paths",
    "demo": "loads a target and a drafter checkpoint from a placeholder folder",
    "profile": "measures a GPU with SGLang (--backend sglang --device cuda)",
}


# ----------------------------------------------------------------------------- stand-ins


@dataclass(frozen=True)
class StandIn:
    """A step that reads a live cluster, replaced by what it returns."""

    runbook: str
    pattern: str  # fnmatch pattern on the expanded command line
    reason: str
    produce: Callable[[RunbookRun, list[str]], str]


def _shards(folder: Path) -> None:
    """SGLang STS-recorder shards (``shard.<n>.pt``) from the committed acceptance traces:
    ``{"logits": [M, B], "prefix_mask": [M, B]}``, ``prefix_mask[i, k] = 1`` iff ``k <
    accepted_i``, one shard per committed trace file."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    for n, path in enumerate(TRACES):
        rows = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
        logits = torch.tensor([r["confidence_logits"] for r in rows], dtype=torch.float32)
        accepted = torch.tensor([r["accepted"] for r in rows])
        mask = (torch.arange(logits.shape[1])[None, :] < accepted[:, None]).float()
        torch.save({"logits": logits, "prefix_mask": mask}, folder / f"shard.{n}.pt")


def _cp_target(argv: list[str]) -> str:
    """The local path of `kubectl ... cp POD:PATH LOCAL [-c C]`."""
    rest, pos = argv[argv.index("cp") + 1 :], []
    while rest:
        a = rest.pop(0)
        if a in ("-c", "--container", "-n", "--namespace"):
            rest.pop(0)
        elif not a.startswith("-"):
            pos.append(a)
    return next(p for p in pos if ":" not in p)


def _shards_to_target(run: RunbookRun, argv: list[str]) -> str:
    _shards(run.cwd / _cp_target(argv))
    return ""


def _live_table(run: RunbookRun, argv: list[str]) -> str:
    """The committed table's ConfigMap as `kubectl get -o yaml` prints it, provided the name
    the step asks for is a cost table of the same (hardware, model, tp)."""
    from dspark_sglang.profiling.configmap import configmap_name

    name = argv[argv.index("configmap") + 1]
    ok = {configmap_name(HW, MODEL, 1), configmap_name(HW, MODEL, 1, table_version())}
    if name not in ok:
        raise CheckError(f"the stand-in is the table of {sorted(ok)}; the step asks for {name}")
    return LIVE_TABLE.read_text()


def _history(run: RunbookRun, argv: list[str]) -> str:
    return json.dumps(
        [
            {"revision": r, "status": s, "chart": "dspark-sglang-0.1.0", "description": d}
            for r, s, d in (
                (1, "superseded", "Install complete"),
                (2, "deployed", "Upgrade complete"),
            )
        ]
    )


def _manifest(run: RunbookRun, argv: list[str]) -> str:
    """Revision 1 runs the live values; revision 2 the same with every tier pinning the
    committed table's version (what a retune with `plan` writes)."""
    rev = argv[argv.index("--revision") + 1]
    values = yaml.safe_load(LIVE_VALUES.read_text())
    if rev == "2":
        for t in values["slaTiers"]:
            t["costTable"]["version"] = table_version()
    elif rev != "1":
        raise CheckError(f"the stand-in history has revisions 1 and 2, not {rev}")
    f = run.cwd / f".revision-{rev}.values.yaml"
    f.write_text(yaml.safe_dump(values))
    return helm_template(RELEASE, str(CHART), ["-n", NAMESPACE, "-f", str(f)], run.cwd).stdout


STAND_INS: list[StandIn] = [
    StandIn(
        "sla-tier-tuning.md",
        f"helm get values {RELEASE} -n {NAMESPACE} -o yaml",
        "the live values of a CPU staging release (tests/cli/data/live-values-cpu.yaml)",
        lambda run, argv: LIVE_VALUES.read_text(),
    ),
    StandIn(
        "sla-tier-tuning.md",
        f"kubectl -n {NAMESPACE} get configmap * -o yaml",
        "the committed CPU profile's ConfigMap, as `kubectl get -o yaml` returns it",
        _live_table,
    ),
    StandIn(
        "sla-tier-tuning.md",
        f"kubectl -n {NAMESPACE} cp {NAMESPACE}/*:/scratch/sts ./traces -c sglang",
        "STS-recorder shards, built from the committed acceptance traces",
        _shards_to_target,
    ),
    StandIn(
        "recalibrate-sts.md",
        f"kubectl -n {NAMESPACE} cp *:/scratch/sts ./sts-shards",
        "STS-recorder shards, built from the committed acceptance traces",
        _shards_to_target,
    ),
    StandIn(
        "reprofile.md",
        f"helm history {RELEASE} -n {NAMESPACE} -o json",
        "a release with two revisions",
        _history,
    ),
    StandIn(
        "reprofile.md",
        f"helm get manifest {RELEASE} -n {NAMESPACE} --revision *",
        "the rendered live values (revision 1) and the same pinning the committed table (2)",
        _manifest,
    ),
]


def canary_edits(run: RunbookRun, source: Source) -> None:
    """Make the edits the comment of drafter-canary-rollout.md step 1 lists in canary.yaml
    (each backticked `path: value`): top-level keys at the top, tier keys in tierDefaults
    and in every tier."""
    comment = " ".join(
        ln.strip().lstrip("#") for ln in source.text.splitlines() if ln.strip().startswith("#")
    )
    edits = re.findall(r"`([A-Za-z][\w.]*): ([^`]+)`", comment)
    if len(edits) < 5:
        raise CheckError(f"found only {edits} in the canary step's comment")
    path = run.cwd / "canary.yaml"
    values = yaml.safe_load(path.read_text())
    tier_keys = set(SCHEMA["properties"]["tierDefaults"]["properties"])
    for key, raw in edits:
        value = yaml.safe_load(run.expand_text(raw))
        parts = key.split(".")
        if parts[0] in SCHEMA["properties"]:
            targets = [values]
        elif parts[0] in tier_keys or parts[0] == "sts":
            targets = [values.setdefault("tierDefaults", {}), *values["slaTiers"]]
            if parts[0] not in tier_keys:
                targets = targets[1:]
        else:
            raise CheckError(f"canary edit {key}: neither a top-level nor a tier key")
        for t in targets:
            for p in parts[:-1]:
                t = t.setdefault(p, {})
            t[parts[-1]] = value
    path.write_text(yaml.safe_dump(values, sort_keys=False))
    run.notes["canary_edits"] = edits


#: Edits a runbook tells the reader to make by hand after a step: (runbook, step) -> edit.
MANUAL_EDITS: dict[tuple[str, str], Callable[[RunbookRun, Source], None]] = {
    ("drafter-canary-rollout.md", "cp values-prod.yaml canary.yaml"): canary_edits,
}


# ------------------------------------------------------------------------------ the world


class CheckError(Exception):
    """A runbook step that does not hold."""


KINDS = {
    **dict.fromkeys(["deployment", "deployments", "deploy"], "Deployment"),
    **dict.fromkeys(["pod", "pods", "po"], "Pod"),
    **dict.fromkeys(["job", "jobs"], "Job"),
    **dict.fromkeys(["configmap", "configmaps", "cm"], "ConfigMap"),
    **dict.fromkeys(["service", "services", "svc"], "Service"),
    **dict.fromkeys(["hpa", "horizontalpodautoscaler"], "HorizontalPodAutoscaler"),
    **dict.fromkeys(["rayjob", "rayjobs"], "RayJob"),
    **dict.fromkeys(["leaderworkerset", "leaderworkersets", "lws"], "LeaderWorkerSet"),
    **dict.fromkeys(["pdb", "poddisruptionbudget"], "PodDisruptionBudget"),
    **dict.fromkeys(["node", "nodes", "no"], "Node"),
}


def pod_templates(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj.get("spec") or {}
    if obj["kind"] in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
        return [spec["template"]]
    if obj["kind"] == "LeaderWorkerSet":
        lwt = spec["leaderWorkerTemplate"]
        return [t for t in (lwt.get("leaderTemplate"), lwt.get("workerTemplate")) if t]
    if obj["kind"] == "Pod":
        return [{"metadata": obj["metadata"], "spec": spec}]
    return []


def derived(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """Objects the cluster makes from a rendered one: the pods of a workload and KubeRay's
    submitter Job of a RayJob (a Job of the RayJob's name, container ray-job-submitter)."""
    meta = obj["metadata"]
    out = []
    if obj["kind"] == "RayJob":
        out.append(
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": meta["name"], "labels": dict(meta.get("labels") or {})},
                "spec": {
                    "template": {
                        "metadata": {"labels": {}},
                        "spec": {"containers": [{"name": "ray-job-submitter", "image": "kuberay"}]},
                    }
                },
            }
        )
    for n, tmpl in enumerate(pod_templates(obj) if obj["kind"] != "Pod" else []):
        # An LWS group's leader is <name>-0, its first worker <name>-0-1.
        lws = obj["kind"] == "LeaderWorkerSet"
        name = (f"{meta['name']}-0" + ("-1" if n else "")) if lws else pod_name(meta["name"])
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": meta.get("namespace", NAMESPACE),
                    "labels": dict((tmpl.get("metadata") or {}).get("labels") or {}),
                },
                "spec": tmpl["spec"],
            }
        )
    for d in list(out):
        if d["kind"] == "Job":
            out.extend(derived(d))
    return out


#: Key naming where a World object comes from (stripped from anything printed).
SOURCE = "__source"


def preferred(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The objects of the first source among `objs`: one release's, as a cluster has."""
    return [o for o in objs if o[SOURCE] == objs[0][SOURCE]] if objs else []


def clean(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k != SOURCE}


@dataclass
class World:
    """What the runbook's cluster would hold: rendered objects (first source first) and
    what the cluster derives from them, and published ConfigMaps."""

    objects: list[dict[str, Any]] = field(default_factory=list)

    def add(self, docs: list[dict[str, Any]], source: str, first: bool = False) -> None:
        """Add `docs` (and what the cluster derives from them) from one `source` (a values
        file or a runbook step); `first`: they take precedence for evaluated output."""
        new = []
        for d in docs:
            new.append(d)
            new.extend(derived(d))
        for d in new:
            d.setdefault(SOURCE, source)
        self.objects = new + self.objects if first else self.objects + new

    def named(self, kind: str, name: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind and o["metadata"]["name"] == name]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def mounted_configmaps(self) -> set[str]:
        names = set()
        for o in self.objects:
            for t in pod_templates(o):
                for v in t["spec"].get("volumes") or []:
                    if "configMap" in v:
                        names.add(v["configMap"]["name"])
        return names

    def remove(self, kind: str, name: str) -> None:
        self.objects = [
            o for o in self.objects if not (o["kind"] == kind and o["metadata"]["name"] == name)
        ]


def baseline() -> World:
    """The live release first (what `helm get values` returns in the SLA flow), then every
    shipped values file, then the ConfigMaps the profiler and calibration publish."""
    world = World()
    for f in [LIVE_VALUES, *SHIPPED]:
        world.add(copy.deepcopy(render(f)), f.name)
    world.add(copy.deepcopy([published_table(), published_sts()]), "published")
    return world


# ------------------------------------------------------------------- selectors, jsonpath


def selector_matches(selector: str, labels: dict[str, str]) -> bool:
    for term in selector.split(","):
        term = term.strip()
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = re.split(r"==?", term, maxsplit=1)
            if labels.get(k) != v:
                return False
        elif re.fullmatch(r"[\w./-]+", term):
            if term not in labels:
                return False
        else:
            raise CheckError(f"label selector term {term!r} is not supported by this test")
    return True


class JsonPathMissingError(CheckError):
    pass


def _jp_steps(expr: str) -> list[tuple[str, str]]:
    steps, i = [], 0
    while i < len(expr):
        c = expr[i]
        if c == ".":
            i += 1
            name = ""
            while i < len(expr) and expr[i] not in ".[":
                if expr[i] == "\\" and i + 1 < len(expr):
                    name += expr[i + 1]
                    i += 2
                    continue
                name += expr[i]
                i += 1
            if name:
                steps.append(("key", name))
        elif c == "[":
            j = expr.index("]", i) if not expr.startswith("[?(", i) else expr.index(")]", i) + 1
            inner = expr[i + 1 : j]
            if inner == "*":
                steps.append(("all", ""))
            elif re.fullmatch(r"-?\d+", inner):
                steps.append(("index", inner))
            elif m := re.fullmatch(r"\?\(@\.([\w.-]+)\s*==\s*[\"']([^\"']*)[\"']\)", inner):
                steps.append(("filter", f"{m.group(1)}\0{m.group(2)}"))
            else:
                raise CheckError(f"jsonpath step [{inner}] is not supported by this test")
            i = j + 1
        else:
            raise CheckError(f"cannot read jsonpath {expr!r} at {expr[i:]!r}")
    return steps


def jsonpath(template: str, obj: Any) -> str:
    """kubectl's ``-o jsonpath`` with ``--allow-missing-template-keys=false`` (the subset
    the runbooks use): a missing key raises, a filter that matches nothing prints nothing."""
    out = []
    for lit, expr in re.findall(r"([^{]*)(?:\{([^}]*)\})?", template):
        out.append(lit)
        if not expr:
            continue
        vals = [obj]
        for kind, arg in _jp_steps(expr.strip()):
            nxt = []
            for v in vals:
                if kind == "key":
                    if not isinstance(v, dict) or arg not in v:
                        raise JsonPathMissingError(f"{arg} is not found in {expr}")
                    nxt.append(v[arg])
                elif kind == "index":
                    if not isinstance(v, list) or not -len(v) <= int(arg) < len(v):
                        raise JsonPathMissingError(f"index {arg} out of range in {expr}")
                    nxt.append(v[int(arg)])
                elif kind == "all":
                    nxt.extend(v if isinstance(v, list) else list(v.values()))
                else:
                    path, want = arg.split("\0")
                    for item in v if isinstance(v, list) else []:
                        cur: Any = item
                        for p in path.split("."):
                            cur = cur.get(p) if isinstance(cur, dict) else None
                        if cur == want:
                            nxt.append(item)
            vals = nxt
        out.append(
            " ".join(
                v if isinstance(v, str) else json.dumps(v, separators=(",", ":")) for v in vals
            )
        )
    return "".join(out)


def as_list(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "List", "items": objs, "metadata": {}}


# ------------------------------------------------------------------------- real tools

DEAD_KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: dead
  cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}
users:
- name: token
  user: {token: not-a-credential}
contexts:
- name: dead
  context: {cluster: dead, user: token, namespace: default}
current-context: dead
"""
_CONNECTION = re.compile(
    r"connection refused|was refused|Unable to connect to the server|cluster unreachable|"
    r"couldn't get current server API group list"
)
_USAGE = re.compile(
    r"unknown (flag|shorthand flag|command)|required flag|invalid argument|accepts \d+ arg|"
    r"requires (at least|exactly)|must specify|no such file|does not exist|error: (?!.*refused)"
)


def _tool_env(cwd: Path) -> dict[str, str]:
    kubeconfig = cwd.parent / "dead-kubeconfig"
    if not kubeconfig.exists():
        kubeconfig.write_text(DEAD_KUBECONFIG)
    helm_home = cwd.parent / ".helm"
    return {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "HELM_CACHE_HOME": str(helm_home / "cache"),
        "HELM_CONFIG_HOME": str(helm_home / "config"),
        "HELM_DATA_HOME": str(helm_home / "data"),
        "KUBECACHEDIR": str(cwd.parent / ".kube-cache"),
    }


def against_dead_server(tool: str, argv: list[str], cwd: Path) -> str:
    """Run the real helm/kubectl on `argv` with an API server that refuses connections:
    kubectl's and helm's own flag and argument parsing must pass, so it fails to connect."""
    env = _tool_env(cwd)
    if tool == "kubectl":
        cmd = [kubectl_bin(), f"--kubeconfig={env['KUBECONFIG']}", "--request-timeout=1s", *argv]
    else:
        cmd = [helm_bin(), *argv]
    proc = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    out = (proc.stdout + proc.stderr).strip()
    other = "\n".join(ln for ln in out.splitlines() if not _CONNECTION.search(ln))
    if proc.returncode == 0 or _USAGE.search(other) or not _CONNECTION.search(out):
        raise CheckError(
            f"`{tool} {' '.join(argv)}` against a dead API server did not fail on the "
            f"connection (rc {proc.returncode}):\n{out[-1500:]}"
        )
    line = next(ln for ln in out.splitlines() if _CONNECTION.search(ln))
    return "fails to connect: " + line.split("Error: ")[-1].split('err="')[-1][:100]


def helm_template(
    release: str, chart: str, flags: list[str], cwd: Path
) -> subprocess.CompletedProcess[str]:
    key = ["template", release, chart, *flags]
    proc = subprocess.run(
        [helm_bin(), *key], cwd=cwd, env=_tool_env(cwd), capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise CheckError(f"`helm {' '.join(key)}` failed:\n{proc.stderr[-2000:]}")
    return proc


def schema_node(path: str) -> str | None:
    """Why ``--set path=...`` is not a values key in values.schema.json, or None."""
    node: dict[str, Any] = SCHEMA
    for seg in path.split("."):
        m = re.fullmatch(r"([\w-]+)((?:\[\d+\])*)", seg)
        if not m:
            return f"cannot read segment {seg!r}"
        name, idx = m.group(1), m.group(2)
        props = node.get("properties") or {}
        if name in props:
            node = props[name]
        elif isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        elif node.get("additionalProperties") is False:
            return f"{name!r} is not a key of {sorted(props)}"
        else:
            return None
        for _ in re.findall(r"\[\d+\]", idx):
            node = node.get("items") or {}
    return None


# ------------------------------------------------------------------------------- the run


@dataclass
class Outcome:
    cmd: Simple
    kind: str = ""
    argv: list[str] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


_OUT_FLAGS = {"--out", "--plot"}
_FILE_SUFFIXES = (".json", ".yaml", ".yml", ".jsonl", ".pt", ".png")


class RunbookRun:
    """One runbook executed top to bottom in its own work folder."""

    def __init__(self, path: Path, cwd: Path) -> None:
        self.path = path
        self.name = path.name
        self.cwd = cwd
        self.env: dict[str, str] = {}
        self.world = baseline()
        self.outcomes: dict[int, Outcome] = {}
        self.order: list[Simple] = []
        self.sources: list[Source] = []
        self.skipped: list[tuple[Source, str]] = []
        self.notes: dict[str, Any] = {}
        cwd.mkdir(parents=True)
        (cwd / "helm").symlink_to(ROOT / "helm")
        shutil.copytree(ROOT / "profiles", cwd / "profiles")
        # A table measured outside the profiler, as reprofile.md step 2 publishes by hand.
        shutil.copy(TABLE, cwd / "profiles" / HW / f"{MODEL}-tp16.json")
        shutil.copy(VALUES_PROD, cwd / "values-prod.yaml")

    # -- expansion
    def lookup(self, key: str) -> str:
        if key.startswith("$") and key[1:] in self.env:
            return self.env[key[1:]]
        if key not in SUBSTITUTIONS:
            raise CheckError(f"{key} is not in SUBSTITUTIONS: map it to a test value")
        value = SUBSTITUTIONS[key][0]
        return value() if callable(value) else value

    def expand_text(self, text: str) -> str:
        return PLACEHOLDER.sub(lambda m: self.lookup(m.group(0)), text)

    def expand_word(self, w: Word, split: bool = True) -> list[str]:
        fields = [""]
        globbable = False
        for p in w.parts:
            if isinstance(p, Lit):
                fields[-1] += self.expand_text(p.text)
                globbable |= not p.quote and "*" in p.text
                continue
            if isinstance(p, Var):
                value = self.lookup("$" + p.name)
            else:
                assert isinstance(p, Sub)
                out = self.run_nodes(p.script, want_output="need")
                if out is None:
                    raise CheckError(f"{p.raw} produces nothing here: add a stand-in")
                value = out.rstrip("\n")
            if split and not p.quoted:
                pieces = value.split()
                if not pieces:
                    continue
                fields[-1] += pieces[0]
                fields.extend(pieces[1:])
            else:
                fields[-1] += value
        if globbable and split:
            out = []
            for f in fields:
                hits = sorted(str(p.relative_to(self.cwd)) for p in self.cwd.glob(f))
                if f.startswith("./"):
                    hits = ["./" + h for h in hits]
                out.extend(hits or [f])
            return out
        return fields

    # -- execution
    def run(self) -> None:
        for src in runbook_sources(self.path):
            if src.kind == "block" and src.lang in NON_SHELL_LANGS:
                self.skipped.append((src, f"```{src.lang} block"))
                continue
            if src.kind == "block" and src.lang not in SHELL_LANGS:
                if src.lang:
                    raise AssertionError(f"{src.label}: unknown block language {src.lang!r}")
                why = next(
                    (r for (rb, head), r in OUTPUT_BLOCKS.items()
                     if rb == self.name and src.text.lstrip().startswith(head)),
                    None,
                )  # fmt: skip
                if why:
                    self.skipped.append((src, why))
                    continue
            self.sources.append(src)
            try:
                parsed = parse_source(src)
            except ValueError as e:  # reported by test_runbook_command (ordinal -1)
                self.skipped.append((src, f"cannot parse: {e}"))
                continue
            for c in parsed.commands:
                c.ordinal = len(self.order)
                self.order.append(c)
                self.outcomes[id(c)] = Outcome(c)
            self.run_nodes(parsed.nodes, want_output=None)

    def run_nodes(self, nodes: list, want_output: str | None) -> str | None:
        """Run `nodes`; the last output. `want_output`: "need" (a substitution reads it),
        None (the reader reads it); a pipe into the next command asks "pipe" (produce it
        if the step can be evaluated here)."""
        out: str | None = None
        for n in nodes:
            if isinstance(n, For):
                items: list[str] = []
                try:
                    for w in n.items:
                        items.extend(self.expand_word(w))
                except CheckError as e:  # the loop's commands never run: they fail, named
                    for c in walk_simple(n.body):
                        self.outcomes[id(c)].errors.append(f"for {n.var} in ...: {e}")
                for value in items:
                    self.env[n.var] = value
                    out = self.run_nodes(n.body, want_output)
                continue
            assert isinstance(n, AndOr)
            for pl in n.pipelines:
                stdin: str | None = None
                for k, c in enumerate(pl.cmds):
                    last = k == len(pl.cmds) - 1
                    stdin = self.run_simple(c, stdin, want_output if last else "pipe")
                out = stdin
        return out

    def run_simple(self, c: Simple, stdin: str | None, want_output: str | None) -> str | None:
        o = self.outcomes[id(c)]
        try:
            for name, w in c.assigns:
                value = "".join(self.expand_word(w, split=False))
                literal = w.literal()
                if literal is not None and f"${name}" in SUBSTITUTIONS:
                    mapped = self.lookup(f"${name}")
                    if mapped != value:
                        raise CheckError(
                            f"sets {name}={value} but SUBSTITUTIONS maps ${name} to {mapped}"
                        )
                self.env[name] = value
                o.checks.append(f"assigns {name}={value[:60]}")
            if not c.words:
                o.kind = o.kind or "assignment"
                return None
            argv: list[str] = []
            for w in c.words:
                argv.extend(self.expand_word(w))
            o.argv = argv
            targets = [
                (op, "".join(self.expand_word(t, split=False))) for op, t in c.redirects if t
            ]
            want = "need" if any(op.endswith(">") for op, _ in targets) else want_output
            out = self.dispatch(argv, stdin, want, o)
            edit = MANUAL_EDITS.get((self.name, " ".join(argv)))
            if edit:
                assert c.source is not None
                edit(self, c.source)
                o.checks.append(f"then the edits the runbook lists ({edit.__name__})")
            for op, target in targets:
                if op.startswith("2"):
                    continue
                if out is None:
                    raise CheckError(f"nothing here produces what this step writes to {target}")
                dest = self.cwd / target
                dest.parent.mkdir(parents=True, exist_ok=True)
                with dest.open("a" if op == ">>" else "w") as f:
                    f.write(out)
                o.checks.append(f"wrote {target}")
            return out
        except CheckError as e:
            o.errors.append(str(e))
            return None
        except Exception as e:  # a step this test does not understand fails, named
            o.errors.append(f"{type(e).__name__}: {e}")
            return None

    def stand_in(self, argv: list[str]) -> StandIn | None:
        line = " ".join(argv)
        for s in STAND_INS:
            if s.runbook == self.name and fnmatch.fnmatchcase(line, s.pattern):
                return s
        return None

    def dispatch(
        self, argv: list[str], stdin: str | None, want: str | None, o: Outcome
    ) -> str | None:
        tool = argv[0]
        role = o.cmd.source.role if o.cmd.source else "command"
        o.kind = o.kind or (tool if role == "command" else f"{tool} ({role})")
        if tool == "dspark-sglang":
            return self.dspark(argv, role, o)
        if tool == "helm":
            return self.helm(argv, role, want, o)
        if tool == "kubectl":
            return self.kubectl(argv, stdin, want, o)
        if tool not in OTHER_TOOLS:
            raise CheckError(
                f"unknown command kind {tool!r}: add a handler or an OTHER_TOOLS entry"
            )
        o.kind = "shell"
        if tool == "xargs":
            return self.xargs(argv, stdin, o)
        if tool == "python":
            if argv[1:] != ["-m", "json.tool"]:
                raise CheckError("only `python -m json.tool` runs here (other python is in a pod)")
            argv = [sys.executable, *argv[1:]]
        reads_stdin = tool in ("cut", "head", "tail", "grep", "sed", "jq", "python")
        if reads_stdin and stdin is None:
            o.checks.append(
                f"{tool}: allowed ({OTHER_TOOLS[tool]}); its input comes from a cluster"
            )
            return None
        if shutil.which(argv[0]) is None:
            # An operator's tool the project does not install (jq): its input is a stand-in
            # for a cluster read, so what it would print is not needed by a later check.
            o.checks.append(f"{tool}: allowed ({OTHER_TOOLS[tool]}); not installed here, not run")
            return None
        proc = subprocess.run(
            argv, cwd=self.cwd, input=stdin, capture_output=True, text=True, timeout=60,
            check=False,
        )  # fmt: skip
        if proc.returncode != 0 and not (tool in ("head", "grep") and proc.returncode in (1, 141)):
            raise CheckError(f"`{' '.join(argv)}` failed ({proc.returncode}): {proc.stderr[-500:]}")
        o.checks.append(f"ran {tool}")
        return proc.stdout

    def xargs(self, argv: list[str], stdin: str | None, o: Outcome) -> str | None:
        i = 1
        no_empty = False
        while argv[i].startswith("-"):
            if argv[i] not in ("-r", "--no-run-if-empty"):
                raise CheckError(f"xargs {argv[i]} is not supported by this test")
            no_empty = True
            i += 1
        inner = argv[i:]
        names = (stdin or "").split()
        if stdin is None:
            o.checks.append("xargs: its input comes from a cluster")
        elif not names and no_empty:
            o.checks.append("xargs -r: no input, the command would not run")
        o.kind = f"{inner[0]} (via xargs)"
        self.dispatch(inner + names, None, None, o)
        o.kind = f"{inner[0]} (via xargs)"
        return None

    # -- dspark-sglang
    def dspark(self, argv: list[str], role: str, o: Outcome) -> str | None:
        from dspark_sglang.cli import build_parser, main

        parser = strict(build_parser())
        sub, chain = parser, []
        rest = argv[1:]
        while rest and not rest[0].startswith("-"):
            actions = [a for a in sub._actions if isinstance(a, argparse._SubParsersAction)]
            if not actions or rest[0] not in actions[0].choices:
                break
            sub = actions[0].choices[rest[0]]
            chain.append(rest.pop(0))
        name = " ".join(chain)
        if not chain:
            raise CheckError(f"`{' '.join(argv)}`: no such dspark-sglang command")
        if role == "mention" and any(not a.startswith("-") for a in rest):
            raise CheckError(f"{[a for a in rest if not a.startswith('-')]}: not subcommands")
        if role in ("mention", "elided"):
            for a in rest:
                flag = a.split("=", 1)[0]
                if a.startswith("-") and flag not in sub._option_string_actions:
                    raise CheckError(f"dspark-sglang {name} has no flag {flag}")
            o.checks.append(f"{role}: dspark-sglang {name} and its flags exist")
            self.check_inputs(sub, rest, o)
            return None
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                parser.parse_args(argv[1:])
        except SystemExit as e:
            if e.code:
                raise CheckError(f"the CLI rejects `{' '.join(argv)}`:\n{err.getvalue()}") from e
        o.checks.append(f"dspark-sglang {name}: parsed")
        self.check_inputs(sub, rest, o)
        runnable = name in ("plan", "calibrate") or (
            name == "profile" and ("--rerender" in rest or "--prune" in rest)
        )
        if not runnable:
            if name not in NOT_RUN:
                raise CheckError(f"dspark-sglang {name}: run it here or say in NOT_RUN why not")
            o.checks.append(f"not run: {NOT_RUN[name]}")
            return None
        subst = FLOW_ARGS.get((self.name, name), {})
        run_argv = [subst.get(a, a) for a in argv[1:]]
        out, err = io.StringIO(), io.StringIO()
        with (
            contextlib.chdir(self.cwd),
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            rc = main(run_argv)
        if rc != 0:
            raise CheckError(
                f"`dspark-sglang {' '.join(run_argv)}` exited {rc}:\n{err.getvalue()[-2000:]}"
            )
        o.checks.append(f"ran dspark-sglang {' '.join(run_argv)}")
        self.notes.setdefault("ran", []).append((argv, run_argv, out.getvalue()))
        return out.getvalue()

    def check_inputs(self, sub: Any, rest: list[str], o: Outcome) -> None:
        """Relative files the command reads must exist (committed or made by a step)."""
        prev = ""
        for a in rest:
            if (
                not a.startswith(("-", "/"))
                and prev not in _OUT_FLAGS
                and a.endswith(_FILE_SUFFIXES)
                and "=" not in a
            ):
                if not (self.cwd / a).exists():
                    raise CheckError(
                        f"{a} (for {prev}) does not exist in the work folder or the repo"
                    )
                o.checks.append(f"reads {a}: exists")
            prev = a if a.startswith("-") else ""

    # -- helm
    _HELM_VALUE_FLAGS: ClassVar[set[str]] = {
        "-n", "--namespace", "-f", "--values", "--set", "--set-string", "--set-json",
        "--set-file", "--timeout", "--revision", "-o", "--output", "--version", "--kube-context",
    }  # fmt: skip

    def helm(self, argv: list[str], role: str, want: str | None, o: Outcome) -> str | None:
        args = argv[1:]
        verb = args[0]
        if role == "mention":
            proc = subprocess.run(
                [helm_bin(), *args, "--help"], capture_output=True, text=True, timeout=60,
                env=_tool_env(self.cwd), check=False,
            )  # fmt: skip
            if proc.returncode != 0:
                raise CheckError(f"`helm {' '.join(args)}` is not a helm command: {proc.stderr}")
            o.checks.append(f"mention: helm {' '.join(args)} exists")
            return None
        pos, flags, i = [], [], 1
        while i < len(args):
            a = args[i]
            if a in self._HELM_VALUE_FLAGS:
                flags += [a, args[i + 1]]
                i += 2
            elif a.startswith("-"):
                flags.append(a)
                i += 1
            else:
                pos.append(a)
                i += 1
        for j, f in enumerate(flags):
            if f in ("--set", "--set-string"):
                for assignment in flags[j + 1].split(","):
                    why = schema_node(assignment.split("=", 1)[0])
                    if why:
                        raise CheckError(f"--set {assignment}: {why} (values.schema.json)")
                    o.checks.append(f"{f} {assignment.split('=', 1)[0]}: in values.schema.json")
        if verb in ("template", "lint"):
            proc = subprocess.run(
                [helm_bin(), *args], cwd=self.cwd, env=_tool_env(self.cwd), capture_output=True,
                text=True, timeout=120, check=False,
            )  # fmt: skip
            if proc.returncode != 0:
                raise CheckError(f"`helm {' '.join(args)}` failed:\n{proc.stderr[-2000:]}")
            o.checks.append(f"ran helm {verb}")
            if verb == "template":
                docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
                self.world.add(docs, f"{self.name}: helm template", first=True)
            return proc.stdout
        o.checks.append("helm (dead API server): " + against_dead_server("helm", args, self.cwd))
        if verb in ("upgrade", "install"):
            release, chart = pos[0], pos[1]
            keep = []
            for j, f in enumerate(flags):
                if f in (
                    "-n",
                    "--namespace",
                    "-f",
                    "--values",
                    "--set",
                    "--set-string",
                    "--set-json",
                    "--set-file",
                ):
                    keep += [f, flags[j + 1]]
            proc = helm_template(release, chart, keep, self.cwd)
            docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
            self.world.add(docs, f"{self.name}: helm {verb} {release}", first=True)
            self.notes.setdefault("rendered", []).append((release, keep, docs))
            o.checks.append(f"helm template {release} {' '.join(keep)}: {len(docs)} objects")
        if verb == "rollback" and len(pos) > 1 and not pos[1].isdigit():
            raise CheckError(f"helm rollback revision {pos[1]!r} is not a number")
        s = self.stand_in(argv)
        if s:
            o.checks.append(f"stand-in: {s.reason}")
            return s.produce(self, argv)
        if want == "need":
            raise CheckError(f"a later step reads the output of `{' '.join(argv)}`: add a stand-in")
        return None

    # -- kubectl
    _KUBECTL_VALUE_FLAGS: ClassVar[set[str]] = {
        "-n", "--namespace", "-l", "--selector", "-o", "--output", "-c", "--container",
        "--kubeconfig", "--context", "--request-timeout",
    }  # fmt: skip

    def kubectl(
        self, argv: list[str], stdin: str | None, want: str | None, o: Outcome
    ) -> str | None:
        args = argv[1:]
        o.checks.append(
            "kubectl (dead API server): " + against_dead_server("kubectl", args, self.cwd)
        )
        flags: dict[str, str] = {}
        pos: list[str] = []
        after: list[str] = []
        i = 0
        verb = ""
        while i < len(args):
            a = args[i]
            if a == "--":
                after = args[i + 1 :]
                break
            key, eq, val = a.partition("=")
            if a.startswith("-") and eq and key.startswith("--"):
                flags[key] = val
                i += 1
            elif a in self._KUBECTL_VALUE_FLAGS or (a in ("-f", "--filename") and verb != "logs"):
                flags[a] = args[i + 1]
                i += 2
            elif a.startswith("-"):
                flags[a] = ""
                i += 1
            else:
                verb = verb or a
                pos.append(a)
                i += 1
        pos = pos[1:]
        container = flags.get("-c") or flags.get("--container")
        selector = flags.get("-l") or flags.get("--selector")
        output = flags.get("-o") or flags.get("--output") or ""
        refs: list[tuple[str, str]] = []
        kind: str | None = None
        if verb in ("cordon", "drain", "uncordon"):
            o.checks.append(f"{verb} {pos}: node names are the cluster's (not checked)")
            return None
        if verb == "rollout":
            pos = pos[1:]
        if verb == "create":
            return self.kubectl_create(pos, flags, o)
        if verb == "cp":
            return self.kubectl_cp(argv, pos, container, o)
        if verb in ("logs", "exec"):
            target = pos[0]
            refs.append(tuple(target.split("/", 1)) if "/" in target else ("pod", target))  # type: ignore[arg-type]
        else:
            for k, p in enumerate(pos):
                if "/" in p and not re.match(r"^[\w.-]+/[\w.-]+=", p):
                    refs.append(tuple(p.split("/", 1)))  # type: ignore[arg-type]
                elif k == 0:
                    kind = p
                elif "=" in p and verb in ("label", "annotate"):
                    continue
                elif kind:
                    refs.append((kind, p))
        if kind and kind not in KINDS:
            raise CheckError(f"unknown resource type {kind!r}")
        resolved: list[list[dict[str, Any]]] = []
        for rtype, name in refs:
            k = KINDS.get(rtype)
            if k is None:
                raise CheckError(f"unknown resource type {rtype!r} in {rtype}/{name}")
            if k == "Node":
                o.checks.append(f"node {name}: the cluster's (not checked)")
                continue
            found = self.world.named(k, name)
            if not found and k == "ConfigMap" and name in self.world.mounted_configmaps():
                o.checks.append(f"configmap {name}: mounted by a rendered pod (external)")
                resolved.append([])
                continue
            if not found:
                have = sorted({x["metadata"]["name"] for x in self.world.of_kind(k)})
                raise CheckError(f"no {k} {name} in the rendered chart (have {have})")
            o.checks.append(f"{k} {name}: exists ({len(found)} rendered variant(s))")
            resolved.append(found)
        if verb in ("logs", "exec") or container:
            for found in resolved:
                self.check_container(found, container, after, o)
        selected: list[dict[str, Any]] = []
        if selector is not None:
            k = KINDS[kind] if kind else None
            if k is None:
                raise CheckError("a label selector without a resource type")
            cands = self.world.of_kind(k)
            selected = [
                x for x in cands if selector_matches(selector, x["metadata"].get("labels") or {})
            ]
            if not selected:
                raise CheckError(f"-l {selector} matches no rendered or published {k}")
            names = sorted({x["metadata"]["name"] for x in selected})
            o.checks.append(f"-l {selector}: matches {len(names)} {k}(s)")
            if k != "ConfigMap":  # published ConfigMaps are one namespace's, not a release's
                selected = preferred(selected)
            uniq: dict[str, dict[str, Any]] = {}
            for x in selected:
                uniq.setdefault(x["metadata"]["name"], x)
            selected = [uniq[n] for n in sorted(uniq)]
        if verb == "label":
            self.kubectl_label(refs, pos, o)
        if verb == "delete":
            for rtype, name in refs:
                self.world.remove(KINDS[rtype], name)
        if verb == "scale":
            r = flags.get("--replicas", "")
            if not r.isdigit():
                raise CheckError(f"--replicas={r!r} is not a number")
        # Output formats evaluated on the rendered objects.
        if output.startswith(("jsonpath=", "custom-columns=")) or (want and verb == "get"):
            objs = [f for found in resolved for f in found]
            if selector is not None:
                return self.kubectl_output(output, selected, True, want, o)
            if objs:
                return self.kubectl_output(output, objs, False, want, o)
        s = self.stand_in(argv)
        if s:
            o.checks.append(f"stand-in: {s.reason}")
            return s.produce(self, argv)
        if want == "need":
            raise CheckError(f"a later step reads the output of `{' '.join(argv)}`: add a stand-in")
        return None

    def kubectl_output(
        self, output: str, objs: list[dict[str, Any]], is_list: bool, want: str | None, o: Outcome
    ) -> str | None:
        fmt, _, arg = output.partition("=")
        if fmt == "jsonpath":
            variants = [as_list(objs)] if is_list else objs
            results = []
            for v in variants:
                try:
                    r = jsonpath(arg, v)
                except JsonPathMissingError as e:
                    raise CheckError(
                        f"-o jsonpath={arg}: {e} (in {v['kind']} {v['metadata'].get('name', '')})"
                    ) from e
                if not r.strip():
                    what = f"{v['kind']} {v['metadata'].get('name', '')}"
                    raise CheckError(f"-o jsonpath={arg} prints nothing for {what}")
                results.append(r)
            o.checks.append(
                f"jsonpath {arg}: resolves in {len(variants)} object(s) -> {results[0][:60]}"
            )
            return results[0]
        if fmt == "custom-columns":
            cols = [c.split(":", 1) for c in arg.split(",")]
            rows = ["   ".join(h for h, _ in cols)]
            for obj in objs:
                cells = []
                for head, expr in cols:
                    try:
                        cells.append(jsonpath("{" + expr + "}", obj) or "<none>")
                    except JsonPathMissingError as e:
                        raise CheckError(
                            f"custom column {head}:{expr}: {e} in {obj['metadata']['name']}"
                        ) from e
                rows.append("   ".join(cells))
            o.checks.append(
                f"custom-columns {[h for h, _ in cols]}: resolve in {len(objs)} object(s)"
            )
            return "\n".join(rows) + "\n"
        if fmt == "name":
            o.checks.append("-o name")
            return "".join(f"{x['kind'].lower()}/{x['metadata']['name']}\n" for x in objs)
        if fmt == "yaml":
            docs = [clean(x) for x in objs]
            o.checks.append(f"-o yaml of {len(docs)} object(s)")
            return yaml.safe_dump(as_list(docs) if is_list else docs[0], sort_keys=False)
        if want == "need":
            raise CheckError(f"-o {output!r}: not evaluated by this test")
        return None

    def check_container(
        self, objs: list[dict[str, Any]], container: str | None, after: list[str], o: Outcome
    ) -> None:
        """Every rendered variant of the object runs `container` (default: its first), and
        the absolute paths the command names are on volumes that container mounts."""
        paths = re.findall(r"(?<![\w.:/-])(/[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)+)", " ".join(after))
        for obj in objs:
            self._check_container(obj, container, paths)
        o.checks.append(
            f"container {container or '(default)'} in {len(objs)} variant(s)"
            + (f", paths {paths} on its volumes" if paths else "")
        )

    def _check_container(
        self, obj: dict[str, Any], container: str | None, paths: list[str]
    ) -> None:
        for tmpl in pod_templates(obj):
            spec = tmpl["spec"]
            cs = {c["name"]: c for c in [*spec.get("initContainers", []), *spec["containers"]]}
            c = cs.get(container) if container else spec["containers"][0]
            if c is None:
                what = f"{obj['kind']} {obj['metadata']['name']}"
                raise CheckError(f"{what} has no container {container} (has {sorted(cs)})")
            for path in paths:
                self.check_path(spec, c, path, obj)

    def check_path(
        self, spec: dict[str, Any], c: dict[str, Any], path: str, obj: dict[str, Any]
    ) -> None:
        """`path` is on a volume the container mounts; in a ConfigMap volume, a file it has."""
        mounts = sorted(c.get("volumeMounts") or [], key=lambda m: -len(m["mountPath"]))
        for m in mounts:
            mp = m["mountPath"].rstrip("/")
            if path == mp or path.startswith(mp + "/"):
                vol = next(v for v in spec["volumes"] if v["name"] == m["name"])
                rel = path[len(mp) + 1 :]
                cm = vol.get("configMap")
                if cm and rel:
                    files = [it["path"] for it in cm.get("items") or []]
                    if files and rel not in files:
                        raise CheckError(
                            f"{path}: volume {m['name']} at {mp} holds {files}, not {rel}"
                        )
                return
        at = [m["mountPath"] for m in mounts]
        raise CheckError(
            f"{path} is on no volume of container {c['name']} in {obj['metadata']['name']} "
            f"(it mounts {at})"
        )

    def kubectl_cp(
        self, argv: list[str], pos: list[str], container: str | None, o: Outcome
    ) -> str | None:
        remote = [p for p in pos if ":" in p]
        if len(pos) != 2 or len(remote) != 1:
            raise CheckError(f"kubectl cp needs one pod:path and one local path, got {pos}")
        pod, _, path = remote[0].partition(":")
        if "/" in pod:
            ns, pod = pod.split("/", 1)
            if ns != NAMESPACE:
                raise CheckError(f"cp from namespace {ns}, the release is in {NAMESPACE}")
        found = self.world.named("Pod", pod)
        if not found:
            raise CheckError(f"no pod {pod} in the rendered chart")
        self.check_container(found, container, [path], o)
        o.checks.append(f"cp from pod {pod}:{path}")
        s = self.stand_in(argv)
        if s is None:
            raise CheckError(
                f"`{' '.join(argv)}` copies from a pod: add a stand-in for what it copies"
            )
        o.checks.append(f"stand-in: {s.reason}")
        return s.produce(self, argv)

    def kubectl_create(self, pos: list[str], flags: dict[str, str], o: Outcome) -> str | None:
        from dspark_sglang.profiling.configmap import (
            STS_KEY,
            TABLE_KEY,
            configmap_name,
            content_version,
            sts_configmap_name,
        )

        if pos and pos[0] in KINDS and KINDS[pos[0]] == "ConfigMap":
            name = pos[1]
            src = flags.get("--from-file", "")
            key, _, path = src.partition("=")
            text = (self.cwd / path).read_text(encoding="utf-8")
            version = content_version(text)
            if key == TABLE_KEY:
                m = re.fullmatch(r"profiles/([^/]+)/(.+)-tp(\d+)\.json", path)
                if not m:
                    raise CheckError(f"{path} is not profiles/<group>/<model>-tp<N>.json")
                want = configmap_name(m.group(1), m.group(2), int(m.group(3)), version)
            elif key == STS_KEY:
                want = sts_configmap_name(name.rsplit("-", 1)[0], version)
            else:
                raise CheckError(
                    f"--from-file key {key!r}: the chart mounts {TABLE_KEY} or {STS_KEY}"
                )
            if name != want:
                raise CheckError(f"configmap {name}: publishing names this content {want}")
            self.world.add([{"apiVersion": "v1", "kind": "ConfigMap",
                             "metadata": {"name": name, "labels": {}}, "data": {key: text}}],
                           f"{self.name}: kubectl create")  # fmt: skip
            o.checks.append(f"configmap {name}: the versioned name of {path} (key {key})")
            self.notes.setdefault("created", []).append(name)
            return None
        if "-f" in flags:
            f = self.cwd / flags["-f"]
            docs = [d for d in yaml.safe_load_all(f.read_text()) if d]
            if not docs or any(d.get("kind") != "ConfigMap" for d in docs):
                raise CheckError(
                    f"{flags['-f']} holds {[d.get('kind') for d in docs]}, not ConfigMaps"
                )
            self.world.add(docs, f"{self.name}: kubectl create -f")
            o.checks.append(f"create -f {flags['-f']}: {[d['metadata']['name'] for d in docs]}")
            return None
        raise CheckError(f"kubectl create {pos}: not understood by this test")

    def kubectl_label(self, refs: list[tuple[str, str]], pos: list[str], o: Outcome) -> None:
        from dspark_sglang.profiling.configmap import CONTENT_HASH_LABEL

        pairs = dict(p.split("=", 1) for p in pos if "=" in p)
        for rtype, name in refs:
            if KINDS[rtype] != "ConfigMap":
                continue
            obj = self.world.named("ConfigMap", name)[0]
            key = next(iter(obj.get("data") or {}), "")
            builder = published_sts() if key == "sts.json" else published_table()
            want = builder["metadata"]["labels"]
            version = name.rsplit("-", 1)[1]
            for k, v in pairs.items():
                expected = version if k == CONTENT_HASH_LABEL else want.get(k)
                if k not in want:
                    raise CheckError(f"label {k}: not one the publisher sets ({sorted(want)})")
                if v != expected:
                    raise CheckError(f"label {k}={v}: the publisher sets {k}={expected}")
            if CONTENT_HASH_LABEL not in pairs:
                raise CheckError(f"without {CONTENT_HASH_LABEL}, --prune never sees {name}")
            obj["metadata"].setdefault("labels", {}).update(pairs)
            o.checks.append(f"labels {sorted(pairs)}: as the publisher sets them")


# ------------------------------------------------------------------------------ fixtures

ALL_RUNBOOKS = sorted(RUNBOOKS.glob("*.md"))


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], RunbookRun]:
    base = tmp_path_factory.mktemp("runbooks")
    done: dict[str, RunbookRun] = {}

    def get(name: str) -> RunbookRun:
        if name not in done:
            run = RunbookRun(RUNBOOKS / name, base / name.removesuffix(".md"))
            run.run()
            done[name] = run
        return done[name]

    return get


def _command_ids() -> list[tuple[str, int, str]]:
    """(runbook, ordinal, command text) of every command, as the run numbers them."""
    out = []
    for md in ALL_RUNBOOKS:
        n = 0
        for src in runbook_sources(md):
            if src.kind == "block" and (src.lang in NON_SHELL_LANGS or (
                not src.lang and any(rb == md.name and src.text.lstrip().startswith(h)
                                     for rb, h in OUTPUT_BLOCKS))):  # fmt: skip
                continue
            try:
                cmds = parse_source(src).commands
            except ValueError as e:
                out.append((md.name, -1, f"{src.label}: {e}"))
                continue
            for c in cmds:
                out.append((md.name, n, f"{src.line}: {' '.join(c.raw.split())}"))
                n += 1
    return out


COMMANDS = _command_ids()


@pytest.mark.parametrize(
    ("runbook", "ordinal", "text"),
    COMMANDS,
    ids=[f"{rb}:{t.split(':')[0]}:{n}" for rb, n, t in COMMANDS],
)
def test_runbook_command(
    runs: Callable[[str], RunbookRun], runbook: str, ordinal: int, text: str
) -> None:
    assert ordinal >= 0, f"{runbook}: cannot parse {text}"
    run = runs(runbook)
    cmd = run.order[ordinal]
    o = run.outcomes[id(cmd)]
    where = f"{runbook}:{cmd.source.line} `{' '.join(cmd.raw.split())}`"
    assert not o.errors, f"{where}\n  -> {' '.join(o.argv)}\n" + "\n".join(o.errors)
    assert o.checks, f"{where}: nothing was checked"


def test_every_runbook_yields_its_commands(runs: Callable[[str], RunbookRun]) -> None:
    """The extractor finds every step, counted a second, naive way: a broken extractor
    cannot pass by finding nothing."""
    counts: dict[str, Counter[str]] = {}
    for md in ALL_RUNBOOKS:
        run = runs(md.name)
        assert not [s for s in run.skipped if s[1].startswith("cannot parse")], run.skipped
        counts[md.name] = Counter(run.outcomes[id(c)].kind for c in run.order)
        blocks = [s for s in run.sources if s.kind == "block"]
        for src in blocks:
            assert any(c.source is src for c in run.order), f"{src.label}: a block with no command"
        text = md.read_text()
        fences = len(re.findall(r"^\s*```(?:bash|sh|shell|console)\s*$", text, flags=re.M))
        assert len([s for s in blocks if s.lang in SHELL_LANGS]) == fences, md.name
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        spans = len(re.findall(r"`(?:kubectl|helm|dspark-sglang) [^`]+`|`[A-Za-z_]+=\$\(", prose))
        inline = [s for s in run.sources if s.kind == "inline"]
        assert len(inline) == spans, (md.name, [s.text for s in inline])
        assert sum(counts[md.name].values()) >= fences + spans, (md.name, counts[md.name])
    total = Counter[str]()
    for c in counts.values():
        total.update(c)
    assert total["kubectl"] >= 40 and total["helm"] >= 25 and total["dspark-sglang"] >= 8, total
    print("\n".join(f"{k}: {dict(v)}" for k, v in counts.items()), f"\nall: {dict(total)}")


def test_substitution_table_is_used_and_commented(runs: Callable[[str], RunbookRun]) -> None:
    used = set()
    for md in ALL_RUNBOOKS:
        text = md.read_text()
        used |= {m.group(0) for m in PLACEHOLDER.finditer(text)} & set(SUBSTITUTIONS)
        used |= {f"${v}" for v in re.findall(r"\$([A-Z]+)\b", text)} & set(SUBSTITUTIONS)
    assert used == set(SUBSTITUTIONS), f"unused entries: {set(SUBSTITUTIONS) - used}"
    assert all(why for _, why in SUBSTITUTIONS.values())
    for s in STAND_INS:
        used_by = [o for o in runs(s.runbook).outcomes.values()]
        assert any(fnmatch.fnmatchcase(" ".join(o.argv), s.pattern) for o in used_by), s
    for (rb, head), _ in OUTPUT_BLOCKS.items():
        assert any(src.text.lstrip().startswith(head) for src, _ in runs(rb).skipped), (rb, head)
    for (rb, name), subst in FLOW_ARGS.items():
        ran = [argv for argv, _, _ in runs(rb).notes["ran"] if argv[1] == name]
        assert ran and all(set(subst) <= set(argv) for argv in ran), (rb, name, ran)
    for key in MANUAL_EDITS:
        assert any(" ".join(o.argv) == key[1] for o in runs(key[0]).outcomes.values()), key


# ---------------------------------------------------------------------------- the flows


def test_sla_retune_flow_keeps_the_live_tiers(runs: Callable[[str], RunbookRun]) -> None:
    """sla-tier-tuning.md section 1 ran end to end: plan with the runbook's own flags onto
    the live values, then `helm template` of its output keeps the live tier names and
    mounts the table the plan was made on."""
    run = runs("sla-tier-tuning.md")
    (argv, run_argv, stdout), *more = [r for r in run.notes["ran"] if r[0][1] == "plan"]
    assert not more
    flags = lambda a: [x for x in a if x.startswith("--")]  # noqa: E731
    assert flags(argv[1:]) == flags(run_argv)  # only values were substituted
    assert {"--base-values", "--diff", "--users", "--traces", "--profile"} <= set(flags(run_argv))
    assert "changes to live-values.yaml" in stdout
    planned = [d for d in yaml.safe_load_all((run.cwd / "planned.yaml").read_text()) if d]
    deps = {d["metadata"]["name"]: d for d in planned if d["kind"] == "Deployment"}
    live = [t["name"] for t in yaml.safe_load(LIVE_VALUES.read_text())["slaTiers"]]
    assert sorted(deps) == sorted(f"{RELEASE}-dspark-sglang-{t}" for t in live)
    for d in deps.values():
        vols = {v["name"]: v for v in d["spec"]["template"]["spec"]["volumes"]}
        assert vols["cost-table"]["configMap"]["name"] == published_table()["metadata"]["name"]


def test_canary_flow_renders_a_second_release(runs: Callable[[str], RunbookRun]) -> None:
    """drafter-canary-rollout.md: canary.yaml (the step's listed edits) renders objects
    named dspark-canary-<tier>, no PVC of its own, the new STS pinned; the gateway's
    backendRefs name Services of the stable and the canary release."""
    run = runs("drafter-canary-rollout.md")
    assert len(run.notes["canary_edits"]) >= 6
    _, _, docs = next(r for r in run.notes["rendered"] if r[0] == f"{RELEASE}-canary")
    tiers = [t["name"] for t in yaml.safe_load(VALUES_PROD.read_text())["slaTiers"]]
    deps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    assert sorted(deps) == sorted(f"dspark-canary-{t}" for t in tiers)
    assert not [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    assert not [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
    for d in deps.values():
        assert d["spec"]["replicas"] == 1
        pod = d["spec"]["template"]["spec"]
        sts = next(v for v in pod["volumes"] if v["name"] == "sts")["configMap"]["name"]
        assert re.fullmatch(r"dspark-sts-qwen3-8b-b7-v2-[0-9a-f]{10}", sts), sts
        assert "/models/qwen3-8b-dspark-moe-b7-v2" in pod["containers"][0]["args"]
    yaml_block = next(s for s in runbook_sources(run.path) if s.lang == "yaml")
    services = {d["metadata"]["name"]: d for d in run.world.of_kind("Service")}
    for ref in yaml.safe_load(yaml_block.text)["backendRefs"]:
        assert ref["name"] in services, ref
        assert ref["port"] in [p["port"] for p in services[ref["name"]]["spec"]["ports"]]


def test_recalibrate_flow_publishes_what_the_job_would(runs: Callable[[str], RunbookRun]) -> None:
    """recalibrate-sts.md: calibrate ran on recorder shards; the hand-published name and
    labels are what ``build_sts_configmap`` (the Job's publisher) gives that sts.json."""
    from dspark_sglang.profiling.configmap import build_sts_configmap

    run = runs("recalibrate-sts.md")
    sts = (run.cwd / "sts.json").read_text()
    assert len(json.loads(sts)["temperatures"]) == 7 and (run.cwd / "reliability.png").is_file()
    job = build_sts_configmap("dspark-sts-qwen3-8b-b7-v2", sts, NAMESPACE)
    assert run.notes["created"] == [job["metadata"]["name"]]
    made = run.world.named("ConfigMap", job["metadata"]["name"])[0]
    assert made["metadata"]["labels"].items() <= job["metadata"]["labels"].items()


def test_reprofile_prune_flow_keeps_the_pinned_table(runs: Callable[[str], RunbookRun]) -> None:
    """reprofile.md step 4 ran: --prune over the published ConfigMaps and the kept
    revisions lists the unreferenced versions, never the one revision 2 pins."""
    run = runs("reprofile.md")
    prune = [r for r in run.notes["ran"] if "--prune" in r[0]]
    assert len(prune) == 2 and prune[0][2] == prune[1][2]
    listed = prune[0][2].split()
    assert published_table()["metadata"]["name"] not in listed
    assert published_sts()["metadata"]["name"] in listed
    assert sorted((run.cwd / "manifests").glob("*.yaml")) == [
        run.cwd / "manifests" / f"{RELEASE}-1.yaml", run.cwd / "manifests" / f"{RELEASE}-2.yaml"
    ]  # fmt: skip
    assert any("--rerender" in r[0] for r in run.notes["ran"])
