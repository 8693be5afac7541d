"""The chart's default tier serving a drafter in DeepSpec's layout, as the chart renders it.

``values.yaml``'s first tier is rendered with the pinned helm and started through the CPU
overlay of ``rendered_tier.py`` (as ``test_chart_to_server.py`` starts every tier), its
drafter volume holding a dense DSpark drafter for SmolLM2 written in DeepSpec's layout
(``tests/deepspec_layout.py``: DeepSpec's tensor names and shapes, ``architectures:
["Qwen3DSparkModel"]``, the block size at the top level). It must start (the worker's
start-up checks of a DeepSpec folder against the target pass), answer chat completions,
and decode speculative rounds under the tier's own scheduler config: its policy and SLA
tier in ``dspark_scheduler_info``, its rounds and its draft decision's request-steps
counted. The tier runs bfloat16, where SGLang's dense draft would write its context K/V
with a Triton kernel (``cpu_bridges``, bridge 8).
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chart_tools import SHIPPED, render
from deepspec_layout import seeded_dense_drafter, write_deepspec_like
from rendered_tier import RenderedServer, cpu_launch, server_workloads

from dspark_sglang.scheduling.config import SchedulerConfig
from dspark_sglang.scheduling.policies import policy_from_config
from dspark_sglang.sglang_integration.server import RunningServer, server_process

pytestmark = [pytest.mark.sglang, pytest.mark.slow, pytest.mark.helm]

SCHEDULER_YAML = "/etc/dspark/scheduler/scheduler.yaml"


def _default_tier() -> RenderedServer:
    values = next(vf for vf in SHIPPED if vf.name == "values.yaml")
    return server_workloads(render(values), values.name)[0]


@pytest.fixture(scope="module")
def served(
    smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RenderedServer, Any, RunningServer, Path]]:
    from dspark_sglang.targets.hf_target import HFTarget

    server = _default_tier()
    root = tmp_path_factory.mktemp("deepspec-tier")
    target = HFTarget(smollm2_path)
    drafter = seeded_dense_drafter(target, server.block_size)
    folder = write_deepspec_like(drafter, target, smollm2_path / "config.json", root / "deepspec")
    launch = cpu_launch(server, root / "pod", smollm2_path, sys.executable, drafter=folder)
    with server_process(
        list(launch.argv), {**os.environ, **launch.env}, launch.base_url, root / "server.log",
        ready_path="/health",
    ) as running:  # fmt: skip
        yield server, launch, running, folder


def _get(running: RunningServer, path: str) -> str:
    with urllib.request.urlopen(running.base_url + path, timeout=30) as r:
        return r.read().decode()


def test_the_tier_mounts_a_deepspec_folder(served: tuple[Any, ...]) -> None:
    server, launch, _, folder = served
    mounted = Path(str(launch.root) + str(server.arg("--speculative-draft-model-path")))
    assert mounted.resolve() == folder.resolve()
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["Qwen3DSparkModel"] and "dspark_config" not in config
    assert config["block_size"] == server.block_size


def test_it_serves_chat_and_speculates_under_the_tiers_scheduler(
    served: tuple[Any, ...],
) -> None:
    server, launch, running, _ = served
    body = {
        "model": "default",
        "messages": [{"role": "user", "content": "Count from one to ten."}],
        "max_tokens": 16,
        "temperature": 0.0,
        "ignore_eos": True,
    }
    req = urllib.request.Request(
        running.base_url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        reply = json.loads(r.read())
    assert reply["usage"]["completion_tokens"] == 16
    assert reply["choices"][0]["message"]["content"].strip()
    text = _get(running, "/metrics")
    cfg = SchedulerConfig.load(launch.local(SCHEDULER_YAML))
    info = [line for line in text.splitlines() if line.startswith("dspark_scheduler_info{")]
    assert len(info) == 1, info
    assert f'policy="{policy_from_config(cfg).name}"' in info[0]
    assert f'sla_tier="{server.tier}"' in info[0]
    rounds = [line for line in text.splitlines() if line.startswith("dspark_rounds_total")]
    assert rounds and float(rounds[0].split()[-1]) > 0
    steps = [ln for ln in text.splitlines() if ln.startswith("dspark_draft_request_steps_total")]
    assert steps, "the tier's draft decision counts its request-steps"
