"""``data.hidden_states: online``: the frozen target computes the hidden states inside each
training step; nothing is cached.

The online path must differ from the cache path only by the cache's 16-bit rounding. To
see exactly that, the equivalence tests use a float64 copy of the tiny target: its
states then agree across batch compositions to ~1e-16 (a float32 target's agree only to
its last bit, which could move a bfloat16 rounding), so online states rounded through
bfloat16 equal the bfloat16 cache bit for bit, and a training step on them gives the
cache step's loss and gradients bit for bit.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from tiny_dist import tiny_cfg, tiny_trainer
from tiny_training_target import PAD, TINY_LAYER_IDS, tiny_llama
from torch.overrides import TorchFunctionMode

from dspark_sglang.training.config import TrainConfig
from dspark_sglang.training.datagen import HIDDEN_DIR, RESPONSES_DIR, cache_hidden_states
from dspark_sglang.training.dataset import HiddenCache, ResponseSequences, TrainBatch
from dspark_sglang.training.online import OnlineHiddenStates
from dspark_sglang.training.trainer import (
    Trainer,
    batch_loss,
    build_drafter,
    epoch_plan,
    iterate_shards,
)

REPO = Path(__file__).resolve().parents[2]


class _RoundedOnline(OnlineHiddenStates):
    """Online states rounded through bfloat16, as the cache stores them (tests only)."""

    def states(
        self, tokens: torch.Tensor, seq_lens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        aux, last = super().states(tokens, seq_lens)
        return aux.to(torch.bfloat16), last.to(torch.bfloat16)


@pytest.fixture(scope="module")
def f64_data_dir(tiny_data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny responses with a bfloat16 cache written from the float64 tiny target."""
    out = tmp_path_factory.mktemp("f64")
    shutil.copytree(tiny_data_dir / RESPONSES_DIR, out / RESPONSES_DIR)
    cache_hidden_states(
        tiny_llama().double(), out, TINY_LAYER_IDS, batch_size=4, pad_token_id=PAD, progress=False
    )
    return out


def _pair(
    data: Path, tmp_path: Path, rounded: bool, kind: str = "dspark"
) -> tuple[Trainer, Trainer]:
    """(cache trainer, online trainer) over the same data; the online target is float64."""
    cfg = tiny_cfg(kind, data, tmp_path / "cache", 1)
    online_cfg = cfg.with_overrides(
        data={"hidden_states": "online"}, run={"out_dir": str(tmp_path / "online")}
    )
    target = tiny_llama().double()
    klass = _RoundedOnline if rounded else OnlineHiddenStates
    online = klass(target, TINY_LAYER_IDS, "cpu")
    return tiny_trainer(cfg, tiny_llama().double(), None), tiny_trainer(online_cfg, target, online)


def _batches(tr: Trainer, n: int) -> list[TrainBatch]:
    shards = iterate_shards(tr.cache, tr.cfg, 0, 0)
    return [tr.device_batch(next(shards).data) for _ in range(n)]


def test_hidden_states_option_is_validated(tiny_data_dir: Path, tmp_path: Path) -> None:
    cfg = tiny_cfg("dspark", tiny_data_dir, tmp_path, 1)
    assert cfg.data.hidden_states == "cache"
    assert cfg.with_overrides(data={"hidden_states": "online"}).data.hidden_states == "online"
    with pytest.raises(ValueError, match=r"data\.hidden_states must be 'cache' .* or 'online'"):
        cfg.with_overrides(data={"hidden_states": "disk"})


def test_responses_give_the_cache_sequences_and_batch_plan(tiny_data_dir: Path) -> None:
    cache, responses = HiddenCache(tiny_data_dir), ResponseSequences(tiny_data_dir)
    assert responses.ids == cache.ids and len(responses) == len(cache) == 16
    assert responses.seq_lens == cache.seq_lens
    assert responses.response_starts == cache.response_starts
    for i in range(len(cache)):
        assert torch.equal(responses[i].tokens, cache[i].tokens)
    cfg = tiny_cfg("dspark", tiny_data_dir, Path("unused"), 1)
    for epoch in (0, 1):
        (b1, a1), (b2, a2) = epoch_plan(cache, cfg, epoch), epoch_plan(responses, cfg, epoch)
        assert b1 == b2 and all(torch.equal(x, y) for x, y in zip(a1, a2, strict=True))


def test_online_states_rounded_through_bfloat16_equal_the_cache_bitwise(
    f64_data_dir: Path, tmp_path: Path
) -> None:
    cache_tr, online_tr = _pair(f64_data_dir, tmp_path, rounded=True)
    n = len(epoch_plan(cache_tr.cache, cache_tr.cfg, 0)[0])
    for got, ref in zip(_batches(online_tr, n), _batches(cache_tr, n), strict=True):
        assert got.has_hidden_states and ref.has_hidden_states
        for field in TrainBatch.__dataclass_fields__:
            assert torch.equal(getattr(got, field), getattr(ref, field)), field
    # Unrounded, the online states are the target's own (float64 here).
    aux, last = OnlineHiddenStates(tiny_llama().double(), TINY_LAYER_IDS, "cpu").states(
        ref.tokens, ref.seq_lens
    )
    assert aux.dtype == last.dtype == torch.float64
    assert aux.shape == (*ref.tokens.shape, 32 * len(TINY_LAYER_IDS))


def _step(tr: Trainer, batch: TrainBatch) -> tuple[float, dict[str, torch.Tensor]]:
    drafter = build_drafter(tr.cfg, tr.spec, tr.hf_config, tr.embed_tokens, tr.lm_head, 3)
    drafter.train()
    loss, _ = batch_loss(drafter, tr.lm_head, batch, tr.cfg)
    loss.backward()
    grads = {n: p.grad for n, p in drafter.named_parameters() if p.grad is not None}
    return float(loss.detach()), grads


@pytest.mark.parametrize("kind", ["dspark", "eagle3"])
def test_one_online_step_gives_the_cache_step_loss_and_gradients(
    kind: str, f64_data_dir: Path, tmp_path: Path
) -> None:
    """Rounded like the cache: identical loss and gradients. Unrounded (the real online
    path) the drafter sees states bfloat16 would round by up to 2^-9: the loss agrees to
    1e-4 relative and the whole gradient to 5 % relative L2, each tensor's to 10 %
    (measured on these batches and dflash: <= 3e-5, <= 2.3 %, <= 4.9 %)."""
    cache_tr, online_tr = _pair(f64_data_dir, tmp_path / "r", rounded=True, kind=kind)
    ref_loss, ref_grads = _step(cache_tr, _batches(cache_tr, 2)[1])
    loss, grads = _step(online_tr, _batches(online_tr, 2)[1])
    assert loss == ref_loss
    assert grads.keys() == ref_grads.keys() and len(grads) > 5
    assert all(torch.equal(grads[k], ref_grads[k]) for k in grads)

    _, exact_tr = _pair(f64_data_dir, tmp_path / "e", rounded=False, kind=kind)
    loss, grads = _step(exact_tr, _batches(exact_tr, 2)[1])
    assert loss != ref_loss and loss == pytest.approx(ref_loss, rel=1e-4)
    flat = lambda gs: torch.cat([gs[k].flatten() for k in sorted(gs)])  # noqa: E731
    assert float((flat(grads) - flat(ref_grads)).norm() / flat(ref_grads).norm()) < 5e-2
    for k, g in grads.items():
        assert float((g - ref_grads[k]).norm() / ref_grads[k].norm()) < 0.1, k


def test_online_training_resumes_exactly_and_keeps_the_target_frozen(
    tiny_data_dir: Path, tmp_path: Path
) -> None:
    online = {"data": {"hidden_states": "online"}}
    full_cfg = tiny_cfg("dspark", tiny_data_dir, tmp_path / "full", 6, **online)
    tr = tiny_trainer(full_cfg)
    target = tr.online.model
    before = {k: v.clone() for k, v in target.state_dict().items()}
    tr.train(progress=False)
    assert not target.training and all(not p.requires_grad for p in target.parameters())
    assert all(p.grad is None for p in target.parameters())
    assert all(torch.equal(v, before[k]) for k, v in target.state_dict().items())

    part = tmp_path / "part"
    part_cfg = tiny_cfg("dspark", tiny_data_dir, part, 6, **online)
    tiny_trainer(part_cfg).train(progress=False, stop_at=3)
    tiny_trainer(part_cfg).train(resume=True, progress=False)
    a = load_file(str(tmp_path / "full/checkpoints/step-000006/drafter/model.safetensors"))
    b = load_file(str(part / "checkpoints/step-000006/drafter/model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (tmp_path / "full/log.jsonl").read_text() == (part / "log.jsonl").read_text()
    assert json.loads((part / "config.json").read_text())["data"]["hidden_states"] == "online"


def test_the_trainer_refuses_a_mode_and_source_mismatch(
    tiny_data_dir: Path, tmp_path: Path
) -> None:
    cfg = tiny_cfg("dspark", tiny_data_dir, tmp_path, 1)
    target = tiny_llama()
    online = OnlineHiddenStates(target, TINY_LAYER_IDS, "cpu")
    with pytest.raises(ValueError, match=r"data\.hidden_states is 'cache'.*set data\.hidden"):
        tiny_trainer(cfg, target, online)
    on = cfg.with_overrides(data={"hidden_states": "online"})
    with pytest.raises(ValueError, match=r"data\.hidden_states is 'online'"):
        tiny_trainer(on, target, None)
    with pytest.raises(ValueError, match=r"target\.layer_ids"):
        tiny_trainer(on, target, OnlineHiddenStates(target, (0, 1), "cpu"))
    with pytest.raises(ValueError, match="out of range"):
        OnlineHiddenStates(target, (0, 5), "cpu")
    target.train()
    batch = next(iterate_shards(ResponseSequences(tiny_data_dir), on, 0, 0)).data
    with pytest.raises(RuntimeError, match="training mode"):
        online.attach(batch, 4)


TRAINING_SRC = str(REPO / "dspark_sglang" / "training")
FACTORIES = {torch.arange, torch.zeros, torch.ones, torch.empty, torch.full, torch.tensor}


class _DevicelessFactories(TorchFunctionMode):
    """Factory calls without ``device=`` from ``dspark_sglang/training`` (they would land
    on the CPU while the online step runs on a GPU)."""

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


def test_the_online_forward_creates_every_tensor_on_the_device(
    tiny_data_dir: Path, tmp_path: Path
) -> None:
    tr = tiny_trainer(
        tiny_cfg("dspark", tiny_data_dir, tmp_path, 1, data={"hidden_states": "online"})
    )
    data = next(iterate_shards(tr.cache, tr.cfg, 0, 0)).data
    assert not data.has_hidden_states
    factories = _DevicelessFactories()
    with factories:
        batch = tr.device_batch(data)
    assert factories.calls == []
    assert batch.context_hidden.dtype == batch.target_last.dtype == torch.float32
    assert batch.target_last.shape[-1] == 32


def test_data_stage_skips_the_hidden_pass_and_the_train_stage_runs_online(
    tiny_chat_model: Any,
    tiny_eval_cache: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tiny_chat_target import LAYER_IDS

    from dspark_sglang.training.pipeline import run_data_stage, run_train_stage

    monkeypatch.setenv("DSPARK_CACHE_DIR", str(tiny_eval_cache))
    cfg = TrainConfig.from_dict(
        {
            "name": "online",
            "target": {"name": "tiny", "layer_ids": list(LAYER_IDS)},
            "data": {
                "dir": str(tmp_path / "data"),
                "num_math": 2,
                "num_code": 1,
                "num_chat": 1,
                "max_new_tokens": 12,
                "max_prompt_tokens": 4096,
                "hidden_states": "online",
            },
            "drafter": {
                "block_size": 4,
                "model": {"num_hidden_layers": 1, "num_experts": 4, "num_experts_per_tok": 2},
            },
            "anchors": {"anchors_per_seq": 4, "max_anchors_per_batch": 16},
            "optim": {"warmup_steps": 1, "max_steps": 2},
            "run": {"out_dir": str(tmp_path / "run"), "threads": 1, "log_every": 1},
        }
    )
    figures = run_data_stage(cfg, tiny_chat_model, limit=None, progress=False)
    out = capsys.readouterr().out
    assert "no hidden cache written" in out and "a cache would take: hidden cache: " in out
    assert (tmp_path / "data" / RESPONSES_DIR).is_dir()
    assert not (tmp_path / "data" / HIDDEN_DIR).exists()
    assert figures["hidden_states"] == "online" and "hidden_tokens" not in figures
    assert figures["gen_tokens"] > 0
    res = run_train_stage(cfg, tiny_chat_model, resume=False, progress=False)
    assert res.final_step == 2 and res.last_loss == res.last_loss  # finite, not NaN
