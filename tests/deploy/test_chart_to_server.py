"""Chart-to-server contract: what the chart renders is what starts, serves and schedules.

For the default values and every file in ``helm/dspark-sglang/examples/``, the
chart is rendered with the pinned helm; every serving workload's container
``command``/``args``/``env`` and mounted ConfigMaps/Secrets are taken from the
render and started through the CPU overlay of ``rendered_tier.py`` (its module
doc lists every change, all of them device, network or file-location mappings).

Launched here (one node, TP <= 2): see :data:`LAUNCHED`. Each one must start;
answer ``/health`` and ``/v1/chat/completions`` (plain and streaming); serve the
``dspark_*`` series on ``/metrics``; show in ``dspark_scheduler_info`` that its own
policy, SLA tier, cost table and STS file decide; and the verify lengths SGLang
used must be exactly the tier policy's decisions, replayed here from the logged
confidences with the tier's mounted config, and not the whole block where the
tier's cost table says so.

Only parsed (:data:`PARSED_ONLY`, multi-node or TP > 2): the rendered arguments
go through SGLang's own ``prepare_server_args`` -> ``resolve_once`` ->
``check_server_args`` (which runs our algorithm's launch checks) and our
scheduler-config loader, so anything SGLang or the plugin would refuse at pod
start fails here.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from chart_tools import SHIPPED, render
from rendered_tier import (
    TEST_API_KEY,
    CpuLaunch,
    RenderedServer,
    cpu_launch,
    server_workloads,
)

from dspark_sglang.scheduling.config import NEEDS_COST_TABLE, SchedulerConfig
from dspark_sglang.scheduling.draft_decision import MAX_PROBE_BACKOFF
from dspark_sglang.scheduling.policies import policy_from_config
from dspark_sglang.sglang_integration.launch import (
    DECISION_LOG_ENV,
    GREEDY_DRAFT_ENV,
    scheduler_env,
)
from dspark_sglang.sglang_integration.server import RunningServer, server_process

pytestmark = [pytest.mark.sglang, pytest.mark.slow, pytest.mark.helm]

SCHEDULER_YAML = "/etc/dspark/scheduler/scheduler.yaml"
COST_TABLE = "/etc/dspark/cost-table/sps.json"
STS = "/etc/dspark/sts/sts.json"

#: (values file, tier) started as local servers.
LAUNCHED: tuple[tuple[str, str], ...] = (
    ("values.yaml", "interactive"),
    ("values.yaml", "standard"),
    ("inline-tables-apikey.yaml", "staging"),  # TP 2 over gloo, API key, greedy-only (argmax draft)
    ("jobs-profile-calibrate.yaml", "standard"),
    ("small-model-80-120.yaml", "interactive"),
    ("small-model-80-120.yaml", "standard"),
)
#: (values file, tier) -> why it cannot run on one 2-core machine; parsed only.
PARSED_ONLY: dict[tuple[str, str], str] = {
    ("large-model-35-50.yaml", "premium"): "TP 8",
    ("large-model-35-50.yaml", "standard"): "TP 8",
    ("large-model-35-50.yaml", "batch"): "TP 4",
    ("multinode-lws.yaml", "interactive"): "LeaderWorkerSet over 2 nodes, TP 16",
}


def _servers() -> dict[tuple[str, str], RenderedServer]:
    out: dict[tuple[str, str], RenderedServer] = {}
    for vf in SHIPPED:
        for s in server_workloads(render(vf), vf.name):
            out[(vf.name, s.tier)] = s
    return out


def test_every_rendered_server_is_launched_or_parsed() -> None:
    servers = _servers()
    assert set(servers) == set(LAUNCHED) | set(PARSED_ONLY), (
        "a shipped values file renders servers this test does not list; add them to "
        "LAUNCHED (CPU-runnable) or PARSED_ONLY"
    )
    for key, s in servers.items():
        assert s.launchable_on_cpu == (key in LAUNCHED), (key, s.tp, s.nodes)


# --------------------------------------------------------------------------- launched


@dataclass(frozen=True)
class Tier:
    server: RenderedServer
    launch: CpuLaunch
    running: RunningServer
    decision_log: Path

    @property
    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if "--api-key" in self.server.args:
            h["Authorization"] = f"Bearer {TEST_API_KEY}"
        return h

    @property
    def config(self) -> SchedulerConfig:
        return SchedulerConfig.load(self.launch.local(SCHEDULER_YAML))

    def post(self, path: str, body: dict[str, Any], auth: bool = True) -> tuple[int, Any]:
        headers = self.headers if auth else {"Content-Type": "application/json"}
        req = urllib.request.Request(
            self.running.base_url + path, data=json.dumps(body).encode(), headers=headers
        )
        try:
            with urllib.request.urlopen(req, timeout=600) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def get(self, path: str) -> str:
        with urllib.request.urlopen(self.running.base_url + path, timeout=30) as r:
            return r.read().decode()


def _chat(tier: Tier, content: str, **kw: Any) -> dict[str, Any]:
    return {
        "model": "default",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 24,
        "temperature": 0.0,
        **kw,
    }


#: A request that only has to make the server decode a few rounds, so that every series
#: exists even when the test runs alone: 8 tokens, never cut short by EOS (a bfloat16
#: decode round on the CPU takes about 0.4 s, and each tier runs this twice).
_A_FEW_ROUNDS: dict[str, Any] = {"max_tokens": 8, "ignore_eos": True}


@pytest.fixture(scope="module", params=LAUNCHED, ids=lambda k: f"{k[0]}:{k[1]}")
def tier(
    request: pytest.FixtureRequest, smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Tier]:
    server = _servers()[request.param]
    root = tmp_path_factory.mktemp(f"{Path(request.param[0]).stem}-{request.param[1]}")
    launch = cpu_launch(server, root / "pod", smollm2_path, sys.executable)
    log = root / "decisions.jsonl"
    env = {**os.environ, **launch.env, DECISION_LOG_ENV: str(log)}
    with server_process(
        list(launch.argv), env, launch.base_url, root / "server.log", ready_path="/health"
    ) as running:
        yield Tier(server, launch, running, log)


def test_health_and_plain_chat(tier: Tier) -> None:
    assert tier.get("/health") == ""
    status, body = tier.post("/v1/chat/completions", _chat(tier, "What is 2 + 3?"))
    assert status == 200, body
    assert body["choices"][0]["message"]["content"].strip()
    assert body["usage"]["completion_tokens"] >= 1


def test_streaming_chat_equals_non_streaming(tier: Tier) -> None:
    body = _chat(tier, "Name three colors.", max_tokens=8, ignore_eos=True)
    status, whole = tier.post("/v1/chat/completions", body)
    assert status == 200, whole
    conn = http.client.HTTPConnection(tier.launch.host, tier.launch.port, timeout=600)
    conn.request("POST", "/v1/chat/completions", json.dumps({**body, "stream": True}), tier.headers)
    resp = conn.getresponse()
    assert resp.status == 200
    pieces, done = [], False
    for raw in resp:
        line = raw.decode().strip()
        if line.startswith("data:"):
            data = line.removeprefix("data:").strip()
            if data == "[DONE]":
                done = True
                break
            pieces.append(json.loads(data)["choices"][0]["delta"].get("content") or "")
    conn.close()
    assert done and len([p for p in pieces if p]) > 1
    assert "".join(pieces) == whole["choices"][0]["message"]["content"]


def _series(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    out = []
    for m in re.finditer(rf"^{name}(?:\{{([^}}]*)\}})? (\S+)$", text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
        out.append((labels, float(m.group(2))))
    return out


def _sha12(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def test_metrics_show_the_tiers_own_scheduler(tier: Tier) -> None:
    tier.post("/v1/chat/completions", _chat(tier, "Count to five.", **_A_FEW_ROUNDS))
    text = tier.get("/metrics")
    for name in (
        "dspark_rounds_total",
        "dspark_accepted_length_bucket",
        "dspark_position_acceptance_ratio",
        "dspark_verify_budget_tokens_bucket",
        "dspark_scheduler_decision_seconds_bucket",
    ):
        assert _series(text, name), f"{name} missing from /metrics"
    assert _series(text, "dspark_rounds_total")[0][1] > 0
    (labels, value), *more = _series(text, "dspark_scheduler_info")
    assert value == 1 and not more, "one deciding scheduler config per server"
    cfg = tier.config
    assert labels["policy"] == policy_from_config(cfg).name
    assert labels["sla_tier"] == tier.server.tier == cfg.sla_name
    assert labels["block_size"] == str(cfg.block_size)
    assert labels["cost_table_sha256"] == _sha12(tier.launch.local(COST_TABLE))
    assert labels["sts_sha256"] == _sha12(tier.launch.local(STS))
    assert labels["ragged_verify_mode"] == tier.server.env["SGLANG_RAGGED_VERIFY_MODE"]
    log = tier.running.log_path.read_text(errors="replace")
    assert f"(sla={tier.server.tier}, cost table " in log


_METRIC = re.compile(r"\b(sglang:[a-z_]+|dspark_[a-z_]+)\b(?!\s*!?=)")
#: dspark_* words that are no metric: the Python package, config keys, and the
#: ``dspark_release`` label the ServiceMonitor adds (queries group and filter by it).
_NOT_METRICS = {"dspark_sglang", "dspark_config", "dspark_moe", "dspark_release"}


def _named_metrics() -> dict[str, set[str]]:
    """Metric names each operator-facing file uses: dashboard queries, alert rules, runbooks."""
    from chart_tools import ROOT

    dash = (ROOT / "deploy" / "dashboards" / "dspark-sglang.json").read_text()
    exprs = re.findall(r'"(?:expr|query|definition)": "((?:[^"\\]|\\.)*)"', dash)
    rules = [
        r["expr"]
        for d in render(SHIPPED[0])
        if d["kind"] == "PrometheusRule"
        for g in d["spec"]["groups"]
        for r in g["rules"]
    ]
    runbooks = [p.read_text() for p in sorted((ROOT / "deploy" / "runbooks").glob("*.md"))]
    found = {
        "dashboard": {m for e in exprs for m in _METRIC.findall(e)} - _NOT_METRICS,
        "PrometheusRule": {m for e in rules for m in _METRIC.findall(e)} - _NOT_METRICS,
        "runbooks": {m for t in runbooks for m in _METRIC.findall(t)} - _NOT_METRICS,
    }
    assert all(found.values()), found
    return found


def test_every_metric_operators_are_shown_is_emitted(tier: Tier) -> None:
    tier.post("/v1/chat/completions", _chat(tier, "One more answer, please.", **_A_FEW_ROUNDS))
    exported = {m.group(1) for m in re.finditer(r"^([a-zA-Z_:][\w:]*)", tier.get("/metrics"), re.M)}
    suffixes = ("", "_bucket", "_sum", "_count", "_total")
    for where, names in _named_metrics().items():
        missing = sorted(n for n in names if not any(n + x in exported for x in suffixes))
        assert missing == [], f"{where} names metrics nothing emits: {missing}"


@dataclass(frozen=True)
class _Step:
    """One decode step of the decision log (``DSPARK_DECISION_LOG``)."""

    #: The ``draft_decision`` row (``draft_decision: priced`` only), else None.
    gate: dict[str, Any] | None
    #: The policy's decision row (``verify_lens``); None for a plain step, which drafts
    #: nothing and does not call the policy.
    decision: dict[str, Any] | None
    #: The verify lengths SGLang used (``used_verify_lens``).
    used: list[int] | None


def _decode_steps(rows: list[dict[str, Any]], priced: bool) -> list[_Step]:
    """Pair each decision with the lengths used in the same step; recognise plain steps.

    The log is written in step order. A drafting step writes its ``draft_decision`` row
    (``"drafts": true``, only with ``draft_decision: priced``), the policy's decision row,
    then ``used_verify_lens`` (``timed_round`` rows, read by the replay, may come between).
    A plain step writes ``draft_decision`` with ``"drafts": false``, then
    ``used_verify_lens``: no decision row.
    """
    steps: list[_Step] = []
    gate: dict[str, Any] | None = None
    decision: dict[str, Any] | None = None
    for i, r in enumerate(rows):
        if "draft_decision" in r:
            assert priced, f"row {i}: a draft_decision row, and the tier drafts always: {r}"
            assert gate is None and decision is None, f"row {i}: the last step never ended"
            gate = r["draft_decision"]
        elif "verify_lens" in r:
            assert decision is None, f"row {i}: two decisions in one step"
            if priced:
                assert gate is not None, f"row {i}: a decision without a draft_decision row"
                assert gate["drafts"] is True, f"row {i}: the policy decided a plain step"
            decision = r
        elif "used_verify_lens" in r:
            if decision is None:
                assert gate is not None, f"row {i}: used lengths of no decision and no plain step"
                assert gate["drafts"] is False, f"row {i}: a drafting step without a decision"
            steps.append(_Step(gate, decision, r["used_verify_lens"]))
            gate, decision = None, None
    assert gate is None and decision is None, "the log ends inside a decode step"
    return steps


def test_verify_lengths_are_the_tier_policys(tier: Tier) -> None:
    """Replay every logged decision through the tier's own config: same lengths, used as is.

    With ``draft_decision: priced`` the plain steps (no draft pass) verify every anchor only
    and are not decided by the policy; each decision is paired with its own step's lengths.
    """
    gated = tier.config.draft_decision == "priced"
    # 16 tokens, never cut short: ~10 decode rounds at the drafter's ~1.5 tokens a round.
    # A priced tier may run plain steps instead (at least one step in probe_every + 1
    # drafts), so it is asked again until the policy has decided enough steps.
    body = _chat(tier, "Explain rain in two sentences.", max_tokens=16, ignore_eos=True)
    for _ in range(8 if gated else 1):
        tier.post("/v1/chat/completions", body)
        rows = [json.loads(line) for line in tier.decision_log.read_text().splitlines()]
        steps = _decode_steps(rows, gated)
        if sum(s.decision is not None for s in steps) >= 8:
            break
    decided = [s.decision for s in steps if s.decision is not None]
    used = [s.used for s in steps if s.decision is not None]
    assert len(decided) >= 8, "too few decode steps were decided by our policy"
    # Plain steps: every request verifies its anchor only.
    plain = [s for s in steps if s.decision is None]
    for s in plain:
        assert s.used and all(n == 1 for n in s.used), s
    gates = [s.gate for s in steps if s.gate is not None]
    if gated:
        # Every step was priced first, each decision follows from its own prices, and a
        # batch never goes more plain steps without drafting than the probes' largest gap
        # (probe_every, doubled by backoff up to MAX_PROBE_BACKOFF times).
        assert len(gates) == len(steps) > 0, "draft_decision: priced and no draft_decision rows"
        for g in gates:
            pays = g["reason"] != "priced" or g["draft_tok_s"] > g["plain_tok_s"]
            assert g["drafts"] is pays, g
        run, longest = 0, 0
        for s in steps:
            run = 0 if s.decision is not None else run + 1
            longest = max(longest, run)
        gap = MAX_PROBE_BACKOFF * tier.config.probe_every_value
        assert longest <= gap, (longest, tier.config.probe_every)
    else:
        assert not gates and not plain, "a tier that drafts always ran plain steps"
    import torch

    from dspark_sglang.scheduling.cost_table import load_cost_table
    from dspark_sglang.scheduling.round_costs import RoundTimings

    # One policy object, as in the worker (the lagged one keeps a history), rebuilt where
    # the worker priced rounds from the rounds it had timed (logged as ``timed_round``
    # rows, in order), with the same timings code: each decision must follow from them.
    uses_table = tier.config.policy in NEEDS_COST_TABLE
    current, timings = policy_from_config(tier.config), RoundTimings()
    priced = "table" if uses_table else None
    for r in rows:
        if "timed_round" in r:
            path = tier.config.cost_table_path
            assert uses_table and path is not None, "rounds timed for a policy without a table"
            timings.add(*r["timed_round"])
            if timings.ready:
                costs = timings.snapshot(load_cost_table(path))
                current = policy_from_config(tier.config, cost_model=costs)
                priced = f"rounds:{len(costs.verify)}"
        elif "verify_lens" in r:
            drafts = current.decide(torch.tensor(r["confidence"], dtype=torch.float32))
            assert (drafts + 1).tolist() == r["verify_lens"], r
            assert r["priced_from"] == priced, (r["priced_from"], priced)
    if uses_table and tier.config.draft_step_seconds is None:
        # A CPU worker with a table and no fixed draft cost prices from its timed rounds.
        assert priced is not None and priced.startswith("rounds:"), priced
    assert [r["verify_lens"] for r in decided] == used, "SGLang verified other lengths"
    whole = tier.config.num_draft_tokens
    if str(tier.launch.local(COST_TABLE)).endswith("sps.json") and "external" in (
        tier.server.file(COST_TABLE).source
    ):
        # The CPU cost table makes a verify token cost far more than it earns here.
        assert min(min(r["verify_lens"]) for r in decided) < whole


def test_bad_token_ids_get_400_and_the_server_stays_up(tier: Tier) -> None:
    body = {"model": "default", "prompt": [999999, 5], "max_tokens": 4}
    status, err = tier.post("/v1/completions", body)
    assert status == 400 and "outside the model's vocabulary" in err["message"]
    status, err = tier.post("/v1/chat/completions", {"model": "default", "messages": "x"})
    assert status == 400 and "File " not in err["message"] and ".py" not in err["message"]
    assert tier.get("/health") == ""
    status, _ = tier.post("/v1/chat/completions", _chat(tier, "Still there?", max_tokens=4))
    assert status == 200


def test_greedy_only_and_api_key_as_configured(tier: Tier) -> None:
    sampled = _chat(tier, "Tell me a story.", temperature=1.0, max_tokens=8)
    status, body = tier.post("/v1/chat/completions", sampled)
    # Greedy-only tiers draft by argmax (the plugin's rule, rendered by the chart).
    draft = tier.launch.env[GREEDY_DRAFT_ENV]
    assert (
        draft
        == ("1" if tier.config.greedy_draft else "0")
        == scheduler_env(tier.launch.local(SCHEDULER_YAML))[GREEDY_DRAFT_ENV]
    )
    if tier.config.greedy_only:
        assert status == 400 and "greedy" in body["message"], body
        refused = _series(tier.get("/metrics"), "dspark_requests_refused_total")
        assert any(lb.get("reason") == "greedy_only" and v >= 1 for lb, v in refused)
    else:
        assert status == 200, body
    status, _ = tier.post("/v1/chat/completions", _chat(tier, "hi", max_tokens=2), auth=False)
    assert status == (401 if "--api-key" in tier.server.args else 200)


# --------------------------------------------------------------------------- parsed only

_PARSE = r"""
import json, sys
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.server_args import prepare_server_args
args = prepare_server_args(sys.argv[1:])
args.resolve_once()
args.check_server_args()
from dspark_sglang.sglang_integration.launch import drafter_block_size
from dspark_sglang.sglang_integration.scheduler_bridge import load_decider
decider = load_decider(drafter_block_size(args.speculative_draft_model_path))
print("PARSED", json.dumps({"tp": args.tp_size, "policy": decider.policy.name}))
"""


@pytest.mark.parametrize("key", sorted(PARSED_ONLY), ids=lambda k: f"{k[0]}:{k[1]}")
def test_rendered_arguments_pass_sglangs_own_validation(
    key: tuple[str, str], smollm2_path: Path, tmp_path: Path
) -> None:
    server = _servers()[key]
    launch = cpu_launch(server, tmp_path / "pod", smollm2_path, sys.executable)
    proc = subprocess.run(
        [sys.executable, "-c", _PARSE, *launch.argv[3:]],
        env={**os.environ, **launch.env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, f"{key} ({PARSED_ONLY[key]}):\n{proc.stderr[-3000:]}"
    out = json.loads(proc.stdout.split("PARSED", 1)[1])
    assert out["tp"] == server.tp
    cfg = SchedulerConfig.load(launch.local(SCHEDULER_YAML))
    assert out["policy"] == policy_from_config(cfg).name
