"""Device, precision and data-loading plumbing of the trainer (checked on CPU).

The machine running the tests has no GPU, so the device checks are of two kinds: every
tensor a training step touches lives on the configured device (``cpu``, named
explicitly), and the trainer's own code never creates a tensor without saying where
(a factory call without ``device=`` would land on the CPU while the step runs on a GPU);
asking for CUDA where there is none fails early with an error that names ``run.device``.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_dist import tiny_cfg, tiny_trainer
from tiny_training_target import tiny_llama
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from dspark_sglang.model import TargetSpec
from dspark_sglang.model.moe import load_balancing_loss, route
from dspark_sglang.training.dataset import HiddenCache, Prefetcher
from dspark_sglang.training.distributed import resolve_device
from dspark_sglang.training.trainer import (
    DraftStep,
    Trainer,
    _rng_state,
    balance_loss,
    batch_loss,
    build_drafter,
    iterate_batches,
)

REPO = Path(__file__).resolve().parents[2]
TRAINING_SRC = str(REPO / "dspark_sglang" / "training")
FACTORIES = {
    torch.arange,
    torch.zeros,
    torch.ones,
    torch.empty,
    torch.full,
    torch.tensor,
    torch.eye,
    torch.linspace,
    torch.rand,
    torch.randn,
    torch.randint,
    torch.randperm,
}
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")


class _Devices(TorchDispatchMode):
    """Records the device of every tensor an aten op returns."""

    def __init__(self) -> None:
        super().__init__()
        self.devices: set[torch.device] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.devices.add(t.device)
        return out


class _DevicelessFactories(TorchFunctionMode):
    """Records factory calls without ``device=`` made from ``dspark_sglang/training``."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES and "device" not in kwargs:
            frame = sys._getframe(1)
            if frame.f_code.co_filename.startswith(TRAINING_SRC):
                self.calls.append(f"{frame.f_code.co_filename}:{frame.f_lineno} {func.__name__}")
        return func(*args, **kwargs)


@pytest.mark.parametrize("kind", ["dspark", "dflash", "eagle3"])
@pytest.mark.parametrize("autocast", ["float32", "bfloat16"])
def test_every_tensor_of_a_training_step_is_on_the_configured_device(
    kind: str, autocast: str, tiny_data_dir: Path, tmp_path: Path
) -> None:
    cfg = tiny_cfg(kind, tiny_data_dir, tmp_path, 1, run={"device": "cpu", "autocast": autocast})
    tr = tiny_trainer(cfg)
    device = torch.device(cfg.run.device)
    assert tr.device == device and tr.lm_head.weight.device == device
    drafter = build_drafter(cfg, tr.spec, tr.hf_config, tr.embed_tokens, tr.lm_head, 3)
    drafter = drafter.to(tr.device)
    opt, _ = tr._make_optimizer(drafter)
    tb = next(iterate_batches(tr.cache, cfg, 0, 0))[2].to(tr.device)
    devices, factories = _Devices(), _DevicelessFactories()
    with factories, devices:
        loss, _ = batch_loss(DraftStep(drafter), tr.lm_head, tb, cfg)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), cfg.optim.grad_clip)
        opt.step()
    assert devices.devices == {device}
    assert factories.calls == []
    assert loss.dtype == torch.float32 and torch.isfinite(loss)


def test_the_device_check_catches_a_deviceless_tensor(tiny_data_dir: Path, tmp_path: Path) -> None:
    """The factory check is live: a ``torch.arange(T)`` in the trainer would be reported."""
    from dspark_sglang.training import trainer as trainer_mod

    code = compile("def probe(n):\n    return torch.arange(n)\n", trainer_mod.__file__, "exec")
    scope: dict[str, Any] = {"torch": torch}
    exec(code, scope)  # a function whose code lives in trainer.py, as a regression would
    factories = _DevicelessFactories()
    with factories:
        scope["probe"](3)
    assert len(factories.calls) == 1 and "arange" in factories.calls[0]


def test_run_device_and_precision_keys_are_validated(tiny_data_dir: Path, tmp_path: Path) -> None:
    cfg = tiny_cfg("dspark", tiny_data_dir, tmp_path, 1)
    assert (cfg.run.device, cfg.run.target_dtype, cfg.run.prefetch) == ("cpu", "float32", 2)
    for device in ("cuda", "cuda:0", "cuda:12"):
        assert cfg.with_overrides(run={"device": device}).run.device == device
    for bad in ("gpu", "cuda:", "cuda:x", "CPU", "mps", ""):
        with pytest.raises(ValueError, match=r"run\.device"):
            cfg.with_overrides(run={"device": bad})
    with pytest.raises(ValueError, match=r"run\.target_dtype"):
        cfg.with_overrides(run={"target_dtype": "int8"})
    with pytest.raises(ValueError, match=r"run\.prefetch"):
        cfg.with_overrides(run={"prefetch": -1})


@NO_CUDA
def test_cuda_without_cuda_is_refused_naming_run_device(
    tiny_data_dir: Path, tmp_path: Path, tiny_chat_dir: Path
) -> None:
    for spec in ("cuda", "cuda:1"):
        with pytest.raises(ValueError, match=rf"run\.device='{spec}'.*CUDA is not available"):
            resolve_device(spec, local_rank=0, world_size=1)
    cfg = tiny_cfg("dspark", tiny_data_dir, tmp_path, 1, run={"device": "cuda"})
    with pytest.raises(ValueError, match=r"run\.device='cuda'"):
        tiny_trainer(cfg)
    from dspark_sglang.training.pipeline import load_target

    target_cfg = cfg.with_overrides(target={"name": str(tiny_chat_dir)})
    with pytest.raises(ValueError, match=r"run\.device='cuda'"):
        load_target(target_cfg)


@NO_CUDA
def test_cli_device_flag_overrides_run_device(monkeypatch: pytest.MonkeyPatch) -> None:
    from dspark_sglang.cli import main

    smoke = str(REPO / "configs" / "smoke_smollm2.yaml")
    # --device reaches run.device: the CUDA check fires before the target is loaded.
    with pytest.raises(ValueError, match=r"run\.device='cuda:0'"):
        main(["train", "--config", smoke, "--stage", "train", "--device", "cuda:0"])
    # The data stage is one process: refused under torchrun before anything is loaded.
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit, match="data stage runs in one process"):
        main(["train", "--config", smoke, "--stage", "all"])


def test_target_loads_at_run_target_dtype(
    tiny_chat_dir: Path, tiny_data_dir: Path, tmp_path: Path
) -> None:
    from dspark_sglang.training.pipeline import load_target

    cfg = tiny_cfg("dspark", tiny_data_dir, tmp_path, 1)
    for dtype in ("float32", "bfloat16"):
        target = load_target(
            cfg.with_overrides(target={"name": str(tiny_chat_dir)}, run={"target_dtype": dtype})
        )
        assert target.dtype == getattr(torch, dtype)
        assert target.device == torch.device("cpu")


def test_a_bfloat16_target_trains_against_float32_copies(
    tiny_data_dir: Path, tmp_path: Path
) -> None:
    """Without autocast the float32 drafter needs float32 target modules: the trainer makes
    copies (the target keeps its bfloat16 weights)."""
    cfg = tiny_cfg("dspark", tiny_data_dir, tmp_path / "run", 2, run={"target_dtype": "bfloat16"})
    target = tiny_llama().to(torch.bfloat16)
    tr = Trainer(
        cfg,
        HiddenCache(tiny_data_dir),
        TargetSpec.from_hf_config(target.config, name="tiny"),
        target.config,
        target.get_input_embeddings(),
        target.get_output_embeddings(),
        mask_token_id=3,
    )
    assert tr.lm_head.weight.dtype == tr.embed_tokens.weight.dtype == torch.float32
    assert target.get_output_embeddings().weight.dtype == torch.bfloat16
    res = tr.train(progress=False)
    assert res.final_step == 2 and torch.isfinite(torch.tensor(res.last_loss))


def test_prefetcher_keeps_the_order_and_raises_where_the_producer_failed() -> None:
    for depth in (0, 1, 3):
        assert list(Prefetcher(iter(range(20)), depth)) == list(range(20))

    def failing():
        yield 1
        yield 2
        raise RuntimeError("bad shard")

    for depth in (0, 2):
        pf = Prefetcher(failing(), depth)
        assert [next(pf), next(pf)] == [1, 2]
        with pytest.raises(RuntimeError, match="bad shard"):
            next(pf)
        pf.close()

    def endless():
        i = 0
        while True:
            yield i
            i += 1

    with Prefetcher(endless(), 2) as pf:  # stops its thread on close
        assert next(pf) == 0
    assert pf._thread is not None and not pf._thread.is_alive()
    with pytest.raises(ValueError, match="prefetch depth"):
        Prefetcher(iter([]), -1)


def test_prefetch_depth_does_not_change_training(tiny_data_dir: Path, tmp_path: Path) -> None:
    logs = []
    for depth in (0, 3):
        cfg = tiny_cfg("dspark", tiny_data_dir, tmp_path / f"p{depth}", 4, run={"prefetch": depth})
        tiny_trainer(cfg).train(progress=False)
        logs.append((tmp_path / f"p{depth}" / "log.jsonl").read_text())
    assert logs[0] == logs[1]


def test_checkpoints_hold_the_rng_states_and_resume_restores_them(
    tiny_data_dir: Path, tmp_path: Path
) -> None:
    assert set(_rng_state(torch.device("cpu"))) == {"torch", "python", "numpy"}
    full = tiny_cfg("eagle3", tiny_data_dir, tmp_path / "full", 6, run={"checkpoint_every": 3})
    tiny_trainer(full).train(progress=False)
    after_full = torch.get_rng_state()
    part_dir = tmp_path / "part"
    part = tiny_cfg("eagle3", tiny_data_dir, part_dir, 6, run={"checkpoint_every": 3})
    tiny_trainer(part).train(progress=False, stop_at=4)
    shutil.rmtree(part_dir / "checkpoints/step-000004")
    torch.manual_seed(12345)  # a different process state: resume must restore the saved one
    tiny_trainer(part).train(resume=True, progress=False)
    assert torch.equal(torch.get_rng_state(), after_full)
    state = torch.load(part_dir / "checkpoints/step-000006/train_state.pt", weights_only=False)
    assert torch.equal(state["rng"]["torch"], after_full) and "cuda" not in state["rng"]
    assert state["world_size"] == 1


def test_balance_loss_is_the_moe_aux_loss_over_the_real_rows() -> None:
    """With every row real it is ``model/moe.py``'s Switch loss; padding rows are left out."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 4, 6, generator=g)  # [S, A, B, E] rows of the block layout
    flat = logits.reshape(-1, 6)
    mask = torch.ones(2, 3, 4, dtype=torch.bool)
    _, experts, probs = route(flat, 2)
    assert torch.allclose(balance_loss([flat], [2], mask), load_balancing_loss(probs, experts))
    mask[1, 2] = False  # a padding anchor
    keep = mask.reshape(-1)
    _, experts, probs = route(flat[keep], 2)
    assert torch.allclose(balance_loss([flat], [2], mask), load_balancing_loss(probs, experts))
    two = balance_loss([flat, flat * 2], [2, 1], mask)
    _, e2, p2 = route((flat * 2)[keep], 1)
    assert torch.allclose(two, load_balancing_loss(probs, experts) + load_balancing_loss(p2, e2))
    with pytest.raises(RuntimeError, match="row layout"):
        balance_loss([flat[:-1]], [2], mask)
    assert json.dumps(float(balance_loss([], [], mask))) == "0.0"
