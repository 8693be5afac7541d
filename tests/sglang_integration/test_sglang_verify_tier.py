"""Our policy behind SGLang's real ``DSparkVerifyPlanner`` in compact ragged-verify mode.

The planner is SGLang 0.5.23's own class, built as its worker builds it, under a
runtime context published from ``ServerArgs`` (``--cuda-graph-bs-decode``,
``--speculative-dspark-sps-table-path``, ``--max-running-requests``). On the CPU there
is no CUDA-graph runner, so the model runner carries the one its planner reads:
``capture_bs`` from the published ``cuda_graph_bs_decode`` and the token tiers from
SGLang's own ``DecodeCudaGraphRunner._build_ragged_verify_token_buckets``. Our hook is
installed on the class exactly as SGLang's ``HookRegistry`` wraps an AROUND hook.
"""

from __future__ import annotations

import json
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import torch

from dspark_sglang.scheduling.config import SchedulerConfig
from dspark_sglang.scheduling.policies import policy_from_config, survival
from dspark_sglang.sglang_integration import scheduler_bridge
from dspark_sglang.sglang_integration.dspark_moe_worker import DSparkMoeWorker

BLOCK = 4
WIDTH = BLOCK + 1  # --speculative-num-draft-tokens
GRAPH_BS = [1, 2, 4]
N = 3


def _published(**server_args: Any) -> Any:
    from sglang.srt.runtime_context import SpawnRanks, create_context
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(
        model_path="dummy",
        device="cpu",
        cuda_graph_bs_decode=GRAPH_BS,
        max_running_requests=max(GRAPH_BS),
        disable_overlap_schedule=True,
        **server_args,
    )
    return create_context(args, role="test", ranks=SpawnRanks(world_rank=0))


def _planner(*, graphs: bool = True) -> Any:
    """SGLang's planner with the graph tiers its CUDA-graph runner would capture, or
    (``graphs=False``) with no graph runner, as on a CPU engine."""
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import (
        DecodeCudaGraphRunner,
    )
    from sglang.srt.runtime_context import get_exec
    from sglang.srt.speculative.dspark_components.dspark_planner import DSparkVerifyPlanner
    from sglang.srt.speculative.spec_tp_sync import SpecTpSync

    capture_bs = sorted(get_exec().graph.cuda_graph_bs_decode)
    runner = types.SimpleNamespace(
        ragged_verify_mode=True,
        capture_bs=capture_bs,
        captured_req_width=WIDTH,
        max_bs=max(capture_bs),
    )
    runner.capture_num_tokens = DecodeCudaGraphRunner._build_ragged_verify_token_buckets(runner)
    slots = max(capture_bs)
    pool = types.SimpleNamespace(
        size=slots,
        req_generation=torch.ones(slots, dtype=torch.int64),
        req_to_token=torch.zeros(slots, 64, dtype=torch.int32),
    )
    return DSparkVerifyPlanner(
        draft_model=types.SimpleNamespace(confidence_head=torch.nn.Identity()),
        gamma=BLOCK,
        model_runner=types.SimpleNamespace(
            decode_cuda_graph_runner=runner if graphs else None, req_to_token_pool=pool
        ),
        device=torch.device("cpu"),
        tp_rank=0,
        verify_num_draft_tokens=WIDTH,
        tp_sync=SpecTpSync(types.SimpleNamespace(world_size=1, rank_in_group=0)),
    )


@pytest.fixture
def hooked(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Compact mode, and our AROUND hook on ``_schedule_verify_lens`` (as SGLang wraps it)."""
    from sglang.srt.speculative.dspark_components.dspark_planner import DSparkVerifyPlanner

    monkeypatch.setenv("SGLANG_RAGGED_VERIFY_MODE", "compact")
    original = DSparkVerifyPlanner._schedule_verify_lens

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return scheduler_bridge.schedule_verify_lens_hook(original, *args, **kwargs)

    monkeypatch.setattr(DSparkVerifyPlanner, "_schedule_verify_lens", wrapper)
    yield


def _attach(planner: Any, cfg: SchedulerConfig) -> scheduler_bridge.VerifyDecider:
    """What ``DSparkMoeWorker.__init__`` does with a loaded config (its own method)."""
    decider = scheduler_bridge.VerifyDecider(cfg, policy_from_config(cfg), None, records=False)
    worker = types.SimpleNamespace(_verify_planner=planner, _simulate_acc_len=0.0)
    DSparkMoeWorker._attach_decider(worker, decider)
    return decider


def _step(planner: Any, confidence: torch.Tensor) -> Any:
    """One decode step's planner calls, as ``DSparkWorkerV2._forward_decode`` makes them."""
    n = confidence.shape[0]
    prefix = torch.full((n,), 16, dtype=torch.int64)
    slots = torch.arange(n)
    budget = planner.resolve_verify_token_budget(
        draft_input=types.SimpleNamespace(verify_token_budget=None),
        confidence=confidence,
        prefix_lens=prefix,
        req_pool_indices=slots,
    )
    return planner.schedule_layout(
        req_pool_indices=slots,
        prefix_lens=prefix,
        device=torch.device("cpu"),
        confidence=confidence,
        budget=budget,
    )


def _confidence(seed: int) -> torch.Tensor:
    """Requests at distinct confidence levels, so the lowest-value drafts sit in one row."""
    gen = torch.Generator().manual_seed(seed)
    levels = torch.linspace(0.95, 0.3, N)[torch.randperm(N, generator=gen)].unsqueeze(1)
    return levels * (0.9 + 0.1 * torch.rand(N, BLOCK, generator=gen))


def _steep_table(tmp_path: Path) -> Path:
    """An SPS table whose steps/s falls off a cliff past N + 2 batch tokens: SGLang's own
    budget then admits few drafts."""
    table = tmp_path / "sps.json"
    table.write_text(
        json.dumps(
            {
                "sample_batch_tokens": [1, N + 2],
                "sample_steps_per_sec": [100.0, 1.0],
                "max_batch_tokens": max(GRAPH_BS) * WIDTH,
            }
        )
    )
    return table


def test_compact_lengths_fit_the_graph_tier_sglang_sized(hooked: None, tmp_path: Path) -> None:
    """A profiled SPS table that makes SGLang's budget small: our verify-every-draft policy
    is trimmed into the step's graph, lowest-survival drafts first, every anchor kept."""
    from sglang.kernels.ops.speculative.ragged_verify_kernels import pad_verify_lens_to_bucket
    from sglang.srt.runtime_context import use_context

    table = _steep_table(tmp_path)
    with use_context(_published(speculative_dspark_sps_table_path=str(table))):
        planner = _planner()
        assert not planner.is_verify_all  # a profiled table: SGLang schedules itself
        cfg = SchedulerConfig(policy="static", static_k=BLOCK, block_size=BLOCK)
        decider = _attach(planner, cfg)
        confidence = _confidence(0)
        wanted = decider.policy.decide(confidence) + 1
        layout = _step(planner, confidence)

    lens = layout.verify_lens.to(torch.int64)
    assert int(wanted.sum()) > layout.graph_num_tokens  # the policy alone would overflow
    assert int(lens.sum()) <= layout.graph_num_tokens
    assert bool((lens >= 1).all()) and bool((lens <= wanted).all())
    # SGLang's padding to the captured bucket never makes a negative length.
    padded_bs = min(bs for bs in GRAPH_BS if bs >= N)
    padded = pad_verify_lens_to_bucket(
        verify_lens=layout.verify_lens,
        graph_num_tokens=layout.graph_num_tokens,
        bs=N,
        padded_bs=padded_bs,
    )
    assert bool((padded >= 0).all()), padded.tolist()
    # The drafts kept are the most likely to survive: none dropped beats one kept.
    surv = survival(confidence)
    pos = torch.arange(BLOCK)
    kept = pos < (lens - 1).unsqueeze(1)
    dropped = (pos < (wanted - 1).unsqueeze(1)) & ~kept
    assert bool(dropped.any())
    assert float(surv[kept].min()) >= float(surv[dropped].max())


def test_without_graphs_the_policys_lengths_stand_and_the_verify_is_exactly_them(
    hooked: None, tmp_path: Path
) -> None:
    """The same small SGLang budget on an engine without graphs (CPU): there is no tier to
    fit, SGLang lays out exactly the lengths it is given, so ours are not trimmed."""
    from sglang.srt.runtime_context import use_context

    table = _steep_table(tmp_path)
    with use_context(_published(speculative_dspark_sps_table_path=str(table))):
        planner = _planner(graphs=False)
        cfg = SchedulerConfig(policy="static", static_k=BLOCK, block_size=BLOCK)
        decider = _attach(planner, cfg)
        confidence = _confidence(0)
        wanted = decider.policy.decide(confidence) + 1
        layout = _step(planner, confidence)

    assert layout.verify_lens.tolist() == wanted.tolist() == [WIDTH] * N
    assert int(layout.verify_lens.sum()) == layout.graph_num_tokens == N * WIDTH


def test_verify_all_shortcut_does_not_bypass_the_policy(hooked: None) -> None:
    """Without an SGLang SPS table the planner would serve a verify-all layout and never
    ask our hook; with a DSPARK_MOE config attached, the policy's lengths are used."""
    from sglang.srt.runtime_context import use_context

    with use_context(_published()):
        planner = _planner()
        assert planner.is_verify_all  # SGLang's shortcut condition holds
        cfg = SchedulerConfig(policy="mtp1", block_size=BLOCK)
        decider = _attach(planner, cfg)
        confidence = _confidence(1)
        layout = _step(planner, confidence)

    want = (decider.policy.decide(confidence) + 1).tolist()
    assert want != [WIDTH] * N  # distinguishable from verify-all
    assert layout.verify_lens.tolist() == want
    assert int(layout.verify_lens.sum()) <= layout.graph_num_tokens


def _fit_oracle(lens: list[int], conf: torch.Tensor, limit: int) -> list[int]:
    """Drop drafts one by one, lowest survival first (then later position, later request)."""
    surv = survival(conf.double()).tolist()
    drafts = [max(0, min(x - 1, conf.shape[1])) for x in lens]
    while sum(drafts) + len(drafts) > limit:
        last = [(surv[r][d - 1], -(d - 1), -r) for r, d in enumerate(drafts) if d > 0]
        if not last:
            break
        _, _, neg_r = min(last)
        drafts[-neg_r] -= 1
    return [d + 1 for d in drafts]


def test_fit_to_budget_matches_dropping_the_lowest_survival_drafts_without_host_reads() -> None:
    from host_sync_guard import host_syncs_raise

    from dspark_sglang.sglang_integration.verify_tier import fit_to_budget

    g = torch.Generator().manual_seed(0)
    for trial in range(300):
        n, b = int(torch.randint(1, 7, (1,), generator=g)), int(torch.randint(1, 8, (1,)))
        conf = torch.rand(n, b, generator=g)
        if trial % 3 == 0:  # ties in survival
            conf = (conf * 4).round() / 4
        lens = torch.randint(0, b + 2, (n,), generator=g).clamp(1, b + 1).to(torch.int32)
        budget = int(torch.randint(0, n * b + 2, (1,), generator=g))
        with host_syncs_raise("fit_to_budget"):
            got = fit_to_budget(lens, conf, budget, 1)
        want = _fit_oracle(lens.tolist(), conf, n + budget)
        assert got.dtype == torch.int32 and got.tolist() == want, (trial, lens, budget)
    assert fit_to_budget(lens, conf, None) is lens


def test_without_graphs_a_whole_block_step_runs_the_non_compact_verify(
    hooked: None, tmp_path: Path
) -> None:
    """On an engine without graphs, a step whose layout verifies every request's whole
    block takes SGLang's non-compact verify (the same window, without packing the rows
    and scattering them back); a step with a shorter request stays compact."""
    from sglang.srt.runtime_context import use_context

    with use_context(_published()):
        planner = _planner(graphs=False)
        assert planner.is_compact_mode
        _attach(planner, SchedulerConfig(policy="static", static_k=BLOCK, block_size=BLOCK))
        whole = _step(planner, _confidence(0))
        _attach(planner, SchedulerConfig(policy="mtp1", block_size=BLOCK))
        short = _step(planner, _confidence(0))

    assert whole.verify_lens.tolist() == [WIDTH] * N
    assert planner.should_run_compact(layout=whole) is False
    assert short.verify_lens.tolist() == [2] * N
    assert planner.should_run_compact(layout=short) is True
    mixed = msgspec.structs.replace(
        short, verify_lens=torch.tensor([WIDTH, 2, WIDTH]), verify_lens_cpu=None
    )
    assert planner.should_run_compact(layout=mixed) is True


def test_with_graphs_every_step_stays_compact(hooked: None) -> None:
    """Where ragged verify graphs are replayed, a captured compact graph runs the step it
    was sized for: the planner is left as SGLang built it."""
    from sglang.srt.runtime_context import use_context

    with use_context(_published()):
        planner = _planner()
        _attach(planner, SchedulerConfig(policy="static", static_k=BLOCK, block_size=BLOCK))
        whole = _step(planner, _confidence(0))

    assert whole.verify_lens.tolist() == [WIDTH] * N
    assert planner.should_run_compact(layout=whole) is True


def test_a_policy_attached_before_the_graph_runner_exists_reads_it_at_the_first_step(
    hooked: None,
) -> None:
    """A policy without a start-up table is attached in the worker's constructor, before
    SGLang builds its graph runner: attaching must not read it, the first step does."""
    from sglang.srt.runtime_context import use_context

    with use_context(_published()):
        planner = _planner(graphs=False)
        runner = planner.model_runner
        del runner.decode_cuda_graph_runner  # as a ModelRunner before init_cuda_graphs
        _attach(planner, SchedulerConfig(policy="static", static_k=BLOCK, block_size=BLOCK))
        runner.decode_cuda_graph_runner = None  # built: none on a CPU engine
        whole = _step(planner, _confidence(0))

    assert planner.should_run_compact(layout=whole) is False


def test_lengths_only_on_a_device_are_not_read_back() -> None:
    """An engine without graphs on a GPU (``--disable-cuda-graph``): lengths without a
    host copy stay where they are and the step stays compact (no read mid-step)."""
    from dspark_sglang.sglang_integration.verify_tier import is_full_block

    on_device = types.SimpleNamespace(
        verify_lens=torch.full((N,), WIDTH, device="meta"), verify_lens_cpu=None
    )
    assert is_full_block(on_device, WIDTH) is False
    on_host = types.SimpleNamespace(verify_lens=torch.full((N,), WIDTH), verify_lens_cpu=None)
    assert is_full_block(on_host, WIDTH) is True
