"""Several processes (gloo on 127.0.0.1) train exactly like one on the same global batch.

Two ranks each take their share of one global batch; the loss they report (summed over
ranks) and the gradients DDP leaves on every rank (or FSDP's gradient shards, gathered
whole) must match one process computing the whole batch. They differ only by float32
rounding: each rank pads its share to its own longest sequence and anchor count (other
matmul shapes), and the loss numerators and gradients are summed in another order (two
partial sums instead of one). That is a few ulps of the largest terms, so float32
comparisons use ``rtol=1e-5`` and an ``atol`` of ``1e-6`` times the largest magnitude of
the compared tensor. A normalisation bug is far outside that: the ranks' valid-slot
counts differ, so per-rank means (no denominator all-reduce) are off by a relative 1e-2
or more.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from tiny_dist import cli_task, grads_task, run_ranks, tiny_cfg, tiny_trainer, train_task

from dspark_sglang.training.config import TrainConfig
from dspark_sglang.training.distributed import (
    DistContext,
    init_distributed,
    resolve_device,
    shard_batch,
    world_from_env,
)
from dspark_sglang.training.trainer import batch_loss, build_drafter, epoch_plan, iterate_batches

RTOL = 1e-5
ATOL_REL = 1e-6  # times the largest |value| of the tensor compared


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    scale = float(b.abs().max()) if b.numel() else 0.0
    return torch.allclose(a, b, rtol=RTOL, atol=ATOL_REL * max(scale, 1e-30))


def _one_process(cfg_raw: dict, global_batch: int) -> tuple[float, dict[str, torch.Tensor]]:
    cfg = TrainConfig.from_dict(cfg_raw)
    tr = tiny_trainer(cfg)
    drafter = build_drafter(cfg, tr.spec, tr.hf_config, tr.embed_tokens, tr.lm_head, 3)
    drafter.train()
    it = iterate_batches(tr.cache, cfg, 0, global_batch)
    epoch, b, tb = next(it)
    assert (epoch, b) == (0, global_batch)
    tb = tr.device_batch(tb)
    loss, _ = batch_loss(drafter, tr.lm_head, tb, cfg)
    loss.backward()
    grads = {
        n: p.grad.clone()
        for n, p in drafter.named_parameters()
        if p.requires_grad and p.grad is not None
    }
    return float(loss.detach()), grads


def _pick_batch(cfg_raw: dict, min_seqs: int) -> int:
    """The first global batch of epoch 0 with at least ``min_seqs`` sequences (exactly one
    when ``min_seqs`` is 1)."""
    cfg = TrainConfig.from_dict(cfg_raw)
    batches, _ = epoch_plan(tiny_trainer(cfg).cache, cfg, 0)
    for b, idx in enumerate(batches):
        if (len(idx) == 1) if min_seqs == 1 else (len(idx) >= min_seqs):
            return b
    pytest.fail(f"no global batch with {min_seqs} sequence(s) in the tiny plan")


# name: (drafter kind, config sections, sequences in the global batch; 1 = exactly one)
CASES = {
    # MoE backbone + Markov head + confidence head; a heavy balancing weight so that a
    # per-rank (not global) MoE statistic would show in the loss and the router gradient.
    "dspark": ("dspark", {"optim": {"aux_loss_weight": 1.0}}, 3),
    "eagle3": ("eagle3", {}, 3),
    # The same MoE backbone without a sequential head.
    "dflash": ("dflash", {"optim": {"aux_loss_weight": 1.0}}, 3),
    # One sequence for two ranks: rank 1 trains on a zero-weight batch.
    "one_sequence": ("dspark", {"anchors": {"max_anchors_per_batch": 8}}, 1),
    # No cache: each rank runs the target on its own share of the global batch.
    "online": ("dspark", {"data": {"hidden_states": "online"}}, 3),
    # The drafter sharded over the two ranks (FSDP2): the same loss and gradients.
    "fsdp_dspark": ("dspark", {"optim": {"aux_loss_weight": 1.0}, "run": {"parallel": "fsdp"}}, 3),
    # EAGLE3 registers the frozen embedding / LM head: they must stay whole and frozen.
    "fsdp_eagle3": ("eagle3", {"run": {"parallel": "fsdp"}}, 3),
    "fsdp_one_sequence": (
        "dspark",
        {"anchors": {"max_anchors_per_batch": 8}, "run": {"parallel": "fsdp"}},
        1,
    ),
}


def test_two_ranks_match_one_rank_on_the_same_global_batch(
    tiny_data_dir: Path, tmp_path: Path
) -> None:
    cases, refs = [], {}
    for name, (kind, sections, seqs) in CASES.items():
        cfg = tiny_cfg(kind, tiny_data_dir, tmp_path / name, 1, **sections)
        raw = json.loads(json.dumps(cfg.to_dict()))
        raw["anchors"].pop("block_size")
        gb = _pick_batch(raw, seqs)
        cases.append((name, raw, gb))
        refs[name] = _one_process(raw, gb)

    out = tmp_path / "ranks"
    out.mkdir()
    run_ranks(2, grads_task, cases, str(out))  # one launch for every case (startup is slow)

    for name, (ref_loss, ref_grads) in refs.items():
        r0, r1 = (torch.load(out / f"{name}-rank{r}.pt", weights_only=False) for r in (0, 1))
        if CASES[name][2] == 1:
            assert r1["anchors"] == 0 and float(r1["local_den"][0]) == 0.0, name
            assert r1["share"] == 0.0, name
        else:
            # Unequal valid-slot weights per rank: per-rank means are not the global mean.
            assert r0["anchors"] > 0 and r1["anchors"] > 0, name
            assert abs(float(r0["local_den"][0]) - float(r1["local_den"][0])) > 1.0, name
        assert r0["loss"] == r1["loss"], name
        assert r0["loss"] == pytest.approx(ref_loss, rel=RTOL), (name, r0["loss"], ref_loss)
        assert r0["grads"].keys() == r1["grads"].keys() == ref_grads.keys(), name
        if name.startswith("fsdp_"):  # every trainable weight sharded, nothing frozen
            assert r0["sharded"] == r0["trainable"] == set(ref_grads), name
        else:
            assert not r0["sharded"], name
        bad = []
        for p, g in ref_grads.items():
            # DDP: one gradient on every rank; FSDP: the same shards gathered on every rank.
            assert torch.equal(r0["grads"][p], r1["grads"][p]), (name, p)
            if not _close(r0["grads"][p], g):
                bad.append((p, float((r0["grads"][p] - g).abs().max()), float(g.abs().max())))
        assert not bad, (name, bad)


def test_two_ranks_resume_a_one_rank_checkpoint(tiny_data_dir: Path, tmp_path: Path) -> None:
    """The checkpoint holds the unwrapped drafter and the global step; the data plan is the
    same at any world size, so 2 ranks continue a 1-rank run as 1 rank would."""
    one, two = tmp_path / "one", tmp_path / "two"
    cfg = tiny_cfg(
        "dspark", tiny_data_dir, one, 5, run={"checkpoint_every": 100}, optim={"markov_lr_scale": 5}
    )
    tiny_trainer(cfg).train(progress=False, stop_at=3)
    shutil.copytree(one, two)
    tiny_trainer(cfg).train(resume=True, progress=False)  # 1 rank: steps 4, 5

    raw = json.loads(json.dumps(cfg.to_dict()))
    raw["anchors"].pop("block_size")
    raw["run"]["out_dir"] = str(two)
    run_ranks(2, train_task, raw, True, None)

    log1 = [json.loads(x) for x in (one / "log.jsonl").read_text().splitlines()]
    log2 = [json.loads(x) for x in (two / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log1] == [r["step"] for r in log2] == [1, 2, 3, 4, 5]
    assert log1[:3] == log2[:3]  # the inherited history
    for a, b in zip(log1[3:], log2[3:], strict=True):
        assert (a["epoch"], a["anchors"], a["lr"]) == (b["epoch"], b["anchors"], b["lr"])
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5), (a, b)
        # Step 5 compounds step 4's rounding through one AdamW update: still float32 noise.
        assert b["total"] == pytest.approx(a["total"], rel=1e-5), (a, b)
        assert b["accept_per_slot"] == pytest.approx(a["accept_per_slot"], abs=1e-4)
    from safetensors.torch import load_file

    w1 = load_file(str(one / "checkpoints/step-000005/drafter/model.safetensors"))
    w2 = load_file(str(two / "checkpoints/step-000005/drafter/model.safetensors"))
    for k in w1:
        # Two AdamW steps from gradients that agree to ~1e-7 relative: the weights agree to
        # ~1e-8 here (measured); 1e-6 absolute leaves room for other BLAS builds.
        assert torch.allclose(w1[k], w2[k], rtol=1e-5, atol=1e-6), k
    state = torch.load(two / "checkpoints/step-000005/train_state.pt", weights_only=False)
    assert state["world_size"] == 2 and state["step"] == 5
    # The optimizer was built from the unwrapped drafter: the Markov head keeps its own group
    # (under DDP its parameter names would start with "module.drafter.").
    ref = torch.load(one / "checkpoints/step-000005/train_state.pt", weights_only=False)
    groups = state["optimizer"]["param_groups"]
    assert [g["params"] for g in groups] == [g["params"] for g in ref["optimizer"]["param_groups"]]
    assert len(groups) == 3 and groups[2]["lr"] == pytest.approx(5 * groups[0]["lr"])


def test_fsdp_checkpoints_move_between_one_rank_and_two_sharded_ranks(
    tiny_data_dir: Path, tmp_path: Path
) -> None:
    """1 rank to step 3, then 2 FSDP ranks resume it (steps 4, 5, writing step 5 from the
    gathered shards), then 1 rank resumes that (step 6): the same run as 1 rank throughout,
    and the FSDP checkpoint has the one-rank format (keys, shapes, optimizer groups)."""
    one, two = tmp_path / "one", tmp_path / "two"
    cfg = tiny_cfg(
        "dspark",
        tiny_data_dir,
        one,
        6,
        run={"checkpoint_every": 100, "keep_checkpoints": 5, "parallel": "fsdp"},
        optim={"markov_lr_scale": 5},
    )
    tiny_trainer(cfg).train(progress=False, stop_at=3)
    shutil.copytree(one, two)
    tiny_trainer(cfg).train(resume=True, progress=False, stop_at=5)
    tiny_trainer(cfg).train(resume=True, progress=False)  # 1 rank: steps 4..6

    raw = json.loads(json.dumps(cfg.to_dict()))
    raw["anchors"].pop("block_size")
    raw["run"]["out_dir"] = str(two)
    run_ranks(2, train_task, raw, True, 5)  # sharded: steps 4, 5
    state2 = torch.load(two / "checkpoints/step-000005/train_state.pt", weights_only=False)
    assert state2["world_size"] == 2 and state2["step"] == 5
    tiny_trainer(TrainConfig.from_dict(raw)).train(resume=True, progress=False)  # 1 rank: 6

    log1 = [json.loads(x) for x in (one / "log.jsonl").read_text().splitlines()]
    log2 = [json.loads(x) for x in (two / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log1] == [r["step"] for r in log2] == [1, 2, 3, 4, 5, 6]
    assert log1[:3] == log2[:3]  # the inherited history
    for a, b in zip(log1[3:], log2[3:], strict=True):
        assert (a["epoch"], a["anchors"], a["lr"]) == (b["epoch"], b["anchors"], b["lr"])
        # Global-norm clipping: the norm over all shards is the one-rank norm.
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5), (a, b)
        assert b["total"] == pytest.approx(a["total"], rel=1e-5), (a, b)
        assert b["accept_per_slot"] == pytest.approx(a["accept_per_slot"], abs=1e-4)
    from safetensors.torch import load_file

    for step in ("000005", "000006"):
        w1 = load_file(str(one / f"checkpoints/step-{step}/drafter/model.safetensors"))
        w2 = load_file(str(two / f"checkpoints/step-{step}/drafter/model.safetensors"))
        assert w1.keys() == w2.keys()
        for k in w1:
            assert w1[k].shape == w2[k].shape and w1[k].dtype == w2[k].dtype, k
            # A few AdamW steps from gradients that agree to ~1e-7 relative (as the DDP
            # resume test): 1e-6 absolute leaves room for other BLAS builds.
            assert torch.allclose(w1[k], w2[k], rtol=1e-5, atol=1e-6), (step, k)
    # The optimizer state FSDP gathered is indexed, grouped and shaped as one rank's, and
    # the Markov head kept its own learning-rate group (built after sharding).
    state1 = torch.load(one / "checkpoints/step-000005/train_state.pt", weights_only=False)
    opt1, opt2 = state1["optimizer"], state2["optimizer"]
    assert opt1["param_groups"] == opt2["param_groups"]
    groups = opt2["param_groups"]
    assert len(groups) == 3 and groups[2]["lr"] == pytest.approx(5 * groups[0]["lr"])
    assert opt1["state"].keys() == opt2["state"].keys()
    for i, s1 in opt1["state"].items():
        s2 = opt2["state"][i]
        assert s1.keys() == s2.keys(), i
        for k in s1:
            assert type(s2[k]) is torch.Tensor and s1[k].shape == s2[k].shape, (i, k)
            assert torch.allclose(s1[k], s2[k], rtol=1e-4, atol=1e-9), (i, k)


def test_parallel_mode_is_checked() -> None:
    from dspark_sglang.training.config import RunConfig

    assert RunConfig().parallel == "ddp"
    with pytest.raises(ValueError, match=r"run\.parallel must be one of \('ddp', 'fsdp'\)"):
        RunConfig(parallel="zero3")


def test_train_command_under_two_processes(
    tiny_chat_model: Any, tiny_chat_dir: Path, tmp_path: Path
) -> None:
    """``train --stage train`` started once per rank (torchrun's environment, a loopback
    rendezvous): rank 0 alone writes the run folder, with the global batch's figures."""
    from tiny_chat_target import LAYER_IDS
    from tiny_training_target import tiny_prompts

    from dspark_sglang.training.datagen import (
        GenerationSettings,
        cache_hidden_states,
        generate_responses,
    )

    data = tmp_path / "data"
    tok = tiny_chat_model.tokenizer
    settings = GenerationSettings(max_new_tokens=24, batch_size=4, seed=0)
    generate_responses(
        tiny_chat_model.model,
        tiny_prompts(8),
        data,
        settings,
        pad_token_id=tok.pad_token_id or 0,
        eos_token_ids=list(tiny_chat_model.eos_token_ids),
        progress=False,
    )
    cache_hidden_states(
        tiny_chat_model.model, data, LAYER_IDS, batch_size=4, pad_token_id=0, progress=False
    )
    out = tmp_path / "run"
    config = {
        "name": "tiny_cli",
        "target": {"name": str(tiny_chat_dir), "layer_ids": list(LAYER_IDS)},
        "data": {"dir": str(data)},
        "drafter": {
            "kind": "dspark",
            "block_size": 4,
            "model": {"num_hidden_layers": 1, "num_experts": 4, "num_experts_per_tok": 2},
        },
        "anchors": {"anchors_per_seq": 4, "max_anchors_per_batch": 16},
        "optim": {"warmup_steps": 1, "max_steps": 3},
        "run": {"out_dir": str(out), "checkpoint_every": 2, "log_every": 1, "threads": 1},
    }
    cfg_path = tmp_path / "tiny_cli.yaml"
    cfg_path.write_text(yaml.safe_dump(config))
    argv = ["train", "--config", str(cfg_path), "--stage", "train", "--device", "cpu"]
    run_ranks(2, cli_task, [*argv, "--no-progress"])

    log = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3]  # one writer: no line twice
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["device"] == "cpu"
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "step-000002",
        "step-000003",
    ]


def test_shard_batch_is_a_deterministic_balanced_partition() -> None:
    lens = [50, 10, 40, 30, 20, 60]
    idx = [5, 0, 3, 1, 4, 2]
    parts = [shard_batch(idx, lens, 2, r) for r in (0, 1)]
    assert sorted(parts[0] + parts[1]) == sorted(idx)
    assert parts == [shard_batch(idx, lens, 2, r) for r in (0, 1)]  # deterministic
    loads = [sum(lens[i] for i in p) for p in parts]
    assert abs(loads[0] - loads[1]) <= max(lens)
    for p in parts:  # each keeps the batch's order
        assert p == [i for i in idx if i in p]
    assert shard_batch(idx, lens, 1, 0) == idx
    assert shard_batch([3], lens, 2, 1) == []  # fewer sequences than ranks
    with pytest.raises(ValueError, match="rank 2"):
        shard_batch(idx, lens, 2, 2)


def test_one_process_needs_no_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert world_from_env() == (0, 1, 0)
    ctx = init_distributed("cpu")
    assert ctx == DistContext() and not ctx.enabled and ctx.is_main
    assert not torch.distributed.is_initialized()
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert init_distributed("cpu") == DistContext()
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(ValueError, match=r"RANK is not set.*torchrun"):
        world_from_env()
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ValueError, match="RANK=2 must be < WORLD_SIZE=2"):
        world_from_env()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_several_cuda_processes_need_cuda() -> None:
    with pytest.raises(ValueError, match=r"run\.device='cuda'.*not available"):
        resolve_device("cuda", local_rank=1, world_size=2)
    assert resolve_device("cpu", local_rank=1, world_size=2) == torch.device("cpu")
