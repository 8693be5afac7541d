"""Start-up refusal of a drafter whose attention heads the TP ranks cannot share.

SGLang shards query heads ``heads / tp`` and KV heads ``kv / tp`` per rank (KV heads
replicated evenly once ``tp >= kv``); only its CPU backend pads heads to fit. The
bundled SmolLM2 drafter has 9 query and 3 KV heads, so ``tp=2`` only runs on CPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dspark_sglang.sglang_integration import launch

DRAFTER = Path(launch.__file__).resolve().parents[1] / "assets" / "drafters" / "smollm2"


def test_query_heads_not_divisible_by_tp_are_refused_on_gpu() -> None:
    with pytest.raises(launch.LaunchError) as err:
        launch.check_draft_heads(9, 3, 2, "cuda", "draft/config.json")
    msg = str(err.value)
    assert "num_attention_heads=9" in msg and "tensor-parallel size 2" in msg
    assert "--tp-size" in msg and "Retrain" in msg
    assert "[1, 3, 9]" in msg  # the TP sizes this drafter does fit


@pytest.mark.parametrize(("heads", "kv_heads", "tp"), [(12, 3, 2), (12, 3, 4)])
def test_kv_heads_that_neither_divide_nor_replicate_are_refused(
    heads: int, kv_heads: int, tp: int
) -> None:
    with pytest.raises(launch.LaunchError, match=f"num_key_value_heads={kv_heads} .* size {tp}"):
        launch.check_draft_heads(heads, kv_heads, tp, "cuda", "draft/config.json")


@pytest.mark.parametrize(("heads", "kv_heads", "tp"), [(12, 4, 4), (8, 2, 4), (9, 3, 1)])
def test_heads_that_split_pass(heads: int, kv_heads: int, tp: int) -> None:
    launch.check_draft_heads(heads, kv_heads, tp, "cuda", "draft/config.json")


def test_cpu_pads_heads_so_any_tp_passes() -> None:
    launch.check_draft_heads(9, 3, 2, "cpu", "draft/config.json")
    launch.check_draft_heads(12, 3, 4, "cpu", "draft/config.json")


def test_launch_check_reads_the_drafter_folder(tmp_path: Path) -> None:
    """``check_server_args`` (SGLang's argument resolution) reads the heads from config.json."""
    with pytest.raises(launch.LaunchError, match="num_attention_heads=9"):
        launch.check_server_args(None, str(DRAFTER), {}, tp_size=2, device="cuda")
    launch.check_server_args(None, str(DRAFTER), {}, tp_size=2, device="cpu")
    launch.check_server_args(None, str(DRAFTER), {}, tp_size=3, device="cuda")
    broken = tmp_path / "draft"
    broken.mkdir()
    config = json.loads((DRAFTER / "config.json").read_text())
    del config["num_attention_heads"]
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(launch.LaunchError, match="cannot read num_attention_heads"):
        launch.check_server_args(None, str(broken), {}, tp_size=2, device="cuda")


def test_worker_refuses_before_loading_the_draft() -> None:
    """``DSparkMoeWorker`` checks the draft config SGLang built, at the attention-TP width."""
    from types import SimpleNamespace

    from sglang.srt.runtime_context import SpawnRanks, create_context, use_context
    from sglang.srt.server_args import ServerArgs

    from dspark_sglang.sglang_integration.dspark_moe_worker import _check_draft_heads

    def target(device: str) -> SimpleNamespace:
        hf = SimpleNamespace(num_attention_heads=9, num_key_value_heads=3)
        draft = SimpleNamespace(hf_config=hf, model_path="draft")
        aux = SimpleNamespace(draft_model_config=draft)
        return SimpleNamespace(device=device, model_runner=SimpleNamespace(spec_aux_config=aux))

    args = ServerArgs(model_path="dummy", device="cpu", tp_size=2)
    with use_context(create_context(args, role="test", ranks=SpawnRanks(world_rank=0))):
        with pytest.raises(launch.LaunchError, match=r"num_attention_heads=9 .* size 2"):
            _check_draft_heads(target("cuda"))
        _check_draft_heads(target("cpu"))


def test_server_argument_resolution_refuses_the_tp_size() -> None:
    """DSPARK_MOE's ``handle_server_args`` (SGLang calls it while resolving arguments)."""
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from dspark_sglang import sglang_plugin

    sglang_plugin.load()
    algo = SpeculativeAlgorithm.from_string("dspark_moe")

    args = ServerArgs(
        model_path="dummy",
        device="cuda",
        tp_size=2,
        speculative_algorithm="DSPARK_MOE",
        speculative_draft_model_path=str(DRAFTER),
    )
    with pytest.raises(launch.LaunchError, match=r"num_attention_heads=9 .* size 2"):
        algo.handle_server_args(args)


@pytest.mark.parametrize(
    ("device", "env", "in_step"),
    [("cpu", None, True), ("cpu", "0", True), ("cpu", "1", False), ("cuda", None, False)],
)
def test_dspark_moe_runs_without_the_overlap_scheduler_on_cpu_unless_told(
    device: str, env: str | None, in_step: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.server_args import ServerArgs

    from dspark_sglang.sglang_integration import dspark_moe

    if env is None:
        monkeypatch.delenv(launch.CPU_OVERLAP_ENV, raising=False)
    else:
        monkeypatch.setenv(launch.CPU_OVERLAP_ENV, env)
    args = ServerArgs(model_path="dummy", device=device)
    dspark_moe._in_step_on_cpu(args, device)
    assert resolving_view(args).disable_overlap_schedule is in_step


def test_the_cpu_overlap_switch_takes_0_or_1() -> None:
    assert launch.cpu_overlap_kept({launch.CPU_OVERLAP_ENV: "1"})
    assert not launch.cpu_overlap_kept({})
    with pytest.raises(launch.LaunchError, match="DSPARK_CPU_OVERLAP_SCHEDULE='yes': use 1"):
        launch.cpu_overlap_kept({launch.CPU_OVERLAP_ENV: "yes"})
