"""The plugin entry point and the CPU bridges, in-process (no engine start)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points

import pytest
import torch

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")


def test_entry_point_is_declared_and_resolves() -> None:
    eps = {ep.name: ep for ep in entry_points(group="sglang.srt.plugins")}
    assert "dspark_sglang" in eps
    from dspark_sglang import sglang_plugin

    assert eps["dspark_sglang"].load() is sglang_plugin.load


def test_load_registers_cpu_bridges_and_has_amx() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang.srt.runtime_context import get_platform

    from dspark_sglang import sglang_plugin
    from dspark_sglang.sglang_integration import cpu_bridges

    sglang_plugin.load()
    assert get_platform().has_amx is True
    for target in (
        cpu_bridges.HANDLE_DSPARK,
        cpu_bridges.RECORD_STREAM,
        cpu_bridges.AMX_EXTEND_METADATA,
        cpu_bridges.FUSED_KV_WRITE,
    ):
        assert any(
            h is not None and h.__module__ == cpu_bridges.__name__
            for _, h, _ in HookRegistry._hooks[target]
        ), target
    assert any(
        h is cpu_bridges.cpu_random_words
        for _, h, _ in HookRegistry._hooks[cpu_bridges.DRAFT_NOISE]
    )
    from sglang.srt.arg_groups.choices import DRAFT_ATTENTION_BACKEND_CHOICES

    assert "intel_amx" in DRAFT_ATTENTION_BACKEND_CHOICES


def test_record_stream_bridge_is_a_noop_only_for_cpu() -> None:
    from dspark_sglang.sglang_integration.cpu_bridges import record_stream_cpu_tolerant

    t = torch.zeros(3)
    stream = torch.get_device_module("cpu").current_stream()
    original = torch._C.TensorBase.record_stream
    with pytest.raises(RuntimeError):
        original(t, stream)  # the gap: SGLang's call fails on CPU unbridged
    assert record_stream_cpu_tolerant(original, t, stream) is None


def test_bridges_stay_off_without_cpu_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    from dspark_sglang.sglang_integration import cpu_bridges

    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "0")
    assert cpu_bridges.install() is False


def test_dspark_moe_is_registered_and_answers_like_dspark() -> None:
    from types import SimpleNamespace

    from sglang.srt.speculative.dspark_components.dspark_worker_v2 import DSparkWorkerV2
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from dspark_sglang import sglang_plugin
    from dspark_sglang.sglang_integration.dspark_moe import DSparkMoeSpecAlgo

    sglang_plugin.load()
    algo = SpeculativeAlgorithm.from_string("dspark_moe")
    assert isinstance(algo, DSparkMoeSpecAlgo)
    dspark = SpeculativeAlgorithm.DSPARK
    predicates = [n for n in vars(SpeculativeAlgorithm) if n.startswith(("is_", "supports_"))]
    assert predicates
    for name in predicates:
        assert getattr(algo, name)() == getattr(dspark, name)(), name
    # The methods SGLang 0.5.23's CustomSpecAlgo lacks but the scheduler calls.
    assert algo.carries_draft_hidden_states() == dspark.carries_draft_hidden_states()
    assert algo.need_topk() == dspark.need_topk()
    assert algo.get_platform_worker_cls() is None
    worker = algo.create_worker(SimpleNamespace(disable_overlap_schedule=False))
    assert issubclass(worker, DSparkWorkerV2)


def test_registering_dspark_moe_imports_no_worker_code() -> None:
    """``dspark_moe`` (run by the plugin in every SGLang process) imports the worker
    module, and with it SGLang's ``DSparkWorkerV2``, only inside its worker factory."""
    import ast
    import inspect

    from dspark_sglang.sglang_integration import dspark_moe

    heavy = ("dspark_moe_worker", "dspark_worker_v2")
    tree = ast.parse(inspect.getsource(dspark_moe))
    top_level = [
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in tree.body
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    ]
    assert top_level and not [m for m in top_level if m and m.endswith(heavy)]
    # Under ``if TYPE_CHECKING:`` only (never executed); the factory's import is deferred.
    factory = inspect.getsource(dspark_moe._worker_factory)
    assert "from dspark_sglang.sglang_integration.dspark_moe_worker import" in factory


def _load_in_a_fresh_process(scope: str) -> subprocess.CompletedProcess[str]:
    """Load the plugin as SGLang would, with ``DSPARK_PLUGIN_SCOPE=scope``, and report what
    it registered (a fresh interpreter: the registries are process-global)."""
    code = """
import json
from dspark_sglang import sglang_plugin
from dspark_sglang.sglang_integration import cpu_bridges, map_step, requests
from sglang.srt.plugins.hook_registry import HookRegistry
from sglang.srt.speculative.spec_registry import get_spec
sglang_plugin.load()
print(json.dumps({
    "dspark_moe": get_spec("DSPARK_MOE") is not None,
    "bridges": bool(HookRegistry._hooks[cpu_bridges.HANDLE_DSPARK]),
    "draft_step": bool(HookRegistry._hooks[map_step.DRAFT_STEP]),
    "requests": bool(HookRegistry._hooks[requests.VALIDATE_METHOD]),
}))
"""
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", "DSPARK_PLUGIN_SCOPE": scope}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize(
    ("scope", "installed"),
    [
        ("all", {"dspark_moe": True, "bridges": True, "draft_step": True, "requests": True}),
        (
            "cpu-bridges",
            {"dspark_moe": False, "bridges": True, "draft_step": False, "requests": False},
        ),
    ],
)
def test_the_plugin_scope_installs_the_cpu_bridges_alone_when_asked(
    scope: str, installed: dict[str, bool]
) -> None:
    done = _load_in_a_fresh_process(scope)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == installed


def test_an_unknown_plugin_scope_is_refused_by_name() -> None:
    done = _load_in_a_fresh_process("bridges")
    assert done.returncode != 0
    assert "DSPARK_PLUGIN_SCOPE='bridges': expected one of ('all', 'cpu-bridges')" in done.stderr
