"""End-to-end training on the tiny target: the loss goes down, resume is exact, configs load."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tiny_dist import tiny_cfg
from tiny_training_target import EOS, TINY_VOCAB, tiny_llama

from dspark_sglang.model import TargetSpec
from dspark_sglang.training.config import TrainConfig, load_config
from dspark_sglang.training.dataset import HiddenCache
from dspark_sglang.training.token_map import build_draft_vocab, response_token_counts
from dspark_sglang.training.trainer import Trainer, build_drafter

REPO = Path(__file__).resolve().parents[2]


def _tiny_cfg(kind: str, data_dir: Path, out_dir: Path, steps: int, **optim: float) -> TrainConfig:
    """``tiny_dist.tiny_cfg`` (the trainer tests' tiny config) with optimiser overrides."""
    return tiny_cfg(kind, data_dir, out_dir, steps, optim=optim)


def _trainer(cfg: TrainConfig, data_dir: Path) -> Trainer:
    target = tiny_llama()
    spec = TargetSpec.from_hf_config(target.config, name="tiny")
    return Trainer(
        cfg,
        HiddenCache(data_dir),
        spec,
        target.config,
        target.get_input_embeddings(),
        target.get_output_embeddings(),
        mask_token_id=3,
    )


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


@pytest.mark.parametrize("kind", ["dspark", "dflash", "eagle3"])
def test_twenty_steps_reduce_the_loss(kind: str, tiny_data_dir: Path, tmp_path: Path) -> None:
    cfg = _tiny_cfg(kind, tiny_data_dir, tmp_path / kind, steps=20)
    trainer = _trainer(cfg, tiny_data_dir)
    res = trainer.train(progress=False)
    log = [json.loads(x) for x in (tmp_path / kind / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(1, 21))
    first, last = _mean([r["total"] for r in log[:4]]), _mean([r["total"] for r in log[-4:]])
    # A random drafter starts near L1 ~ 2 (no overlap with the sharp target); 20 steps of
    # AdamW at lr 3e-3 must cut the loss by well over 10 %.
    assert last < 0.9 * first, (first, last)
    acc_first = _mean([r["accept_per_slot"][0] for r in log[:4]])
    acc_last = _mean([r["accept_per_slot"][0] for r in log[-4:]])
    assert acc_last > acc_first
    if kind == "dspark":
        assert all(r["bce"] > 0 for r in log)
    else:
        assert all(r["bce"] == 0 for r in log)
    assert res.final_step == 20 and (res.final_checkpoint / "train_state.pt").exists()
    assert (tmp_path / kind / "loss_curves.png").stat().st_size > 1000
    # Frozen target parts: the shared embedding / LM head are not in the optimizer.
    assert all(not p.requires_grad for p in trainer.lm_head.parameters())


@pytest.mark.parametrize("kind", ["dspark", "eagle3"])
def test_resumed_run_matches_uninterrupted_run_bitwise(
    kind: str, tiny_data_dir: Path, tmp_path: Path
) -> None:
    full_cfg = _tiny_cfg(kind, tiny_data_dir, tmp_path / "full", steps=10)
    _trainer(full_cfg, tiny_data_dir).train(progress=False)

    part_dir = tmp_path / "part"
    part_cfg = _tiny_cfg(kind, tiny_data_dir, part_dir, steps=10)
    _trainer(part_cfg, tiny_data_dir).train(progress=False, stop_at=7)  # "killed" at step 7
    # Lose the work after the last checkpoint, as a real kill would.
    shutil.rmtree(part_dir / "checkpoints/step-000007")
    with pytest.raises(FileExistsError):
        _trainer(part_cfg, tiny_data_dir).train(progress=False)
    _trainer(part_cfg, tiny_data_dir).train(resume=True, progress=False)

    name = "ar_drafter.safetensors" if kind == "eagle3" else "model.safetensors"
    a = load_file(str(tmp_path / "full/checkpoints/step-000010/drafter" / name))
    b = load_file(str(part_dir / "checkpoints/step-000010/drafter" / name))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    sa = torch.load(tmp_path / "full/checkpoints/step-000010/train_state.pt", weights_only=False)
    sb = torch.load(part_dir / "checkpoints/step-000010/train_state.pt", weights_only=False)
    assert sa["scheduler"] == sb["scheduler"] and (sa["epoch"], sa["batch"]) == (
        sb["epoch"],
        sb["batch"],
    )
    log_full = (tmp_path / "full/log.jsonl").read_text().splitlines()
    log_part = (part_dir / "log.jsonl").read_text().splitlines()
    assert log_full == log_part


@pytest.mark.parametrize("kind", ["dspark", "dflash", "eagle3"])
def test_bfloat16_autocast_keeps_float32_state_and_the_same_loss(
    kind: str, tiny_data_dir: Path, tmp_path: Path
) -> None:
    """``run.autocast: bfloat16`` changes only the matmul precision of the forward: on one
    batch its loss agrees with the float32 loss to bf16 rounding (2 % relative), gradients
    are finite float32, and a short run still learns and saves float32 weights."""
    from dspark_sglang.training.trainer import batch_loss, iterate_batches

    cfg32 = _tiny_cfg(kind, tiny_data_dir, tmp_path / "fp32", steps=12)
    cfg16 = cfg32.with_overrides(run={"autocast": "bfloat16", "out_dir": str(tmp_path / "bf16")})
    trainer = _trainer(cfg16, tiny_data_dir)
    torch.manual_seed(0)
    drafter = build_drafter(
        cfg16, trainer.spec, trainer.hf_config, trainer.embed_tokens, trainer.lm_head, 3
    )
    tb = next(iterate_batches(trainer.cache, cfg16, 0, 0))[2]
    loss32, _ = batch_loss(drafter, trainer.lm_head, tb, cfg32)
    loss16, _ = batch_loss(drafter, trainer.lm_head, tb, cfg16)
    assert loss16.dtype == torch.float32
    l32, l16 = float(loss32.detach()), float(loss16.detach())
    assert l16 != l32  # the flag took effect: bf16 rounding moved the loss...
    assert l16 == pytest.approx(l32, rel=0.02)  # ...by no more than rounding would
    loss16.backward()
    grads = [p.grad for p in drafter.parameters() if p.requires_grad and p.grad is not None]
    assert grads and all(g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads)

    res = trainer.train(progress=False)
    log = [json.loads(x) for x in (tmp_path / "bf16" / "log.jsonl").read_text().splitlines()]
    assert _mean([r["total"] for r in log[-3:]]) < _mean([r["total"] for r in log[:3]])
    name = "ar_drafter.safetensors" if kind == "eagle3" else "model.safetensors"
    saved = load_file(str(res.final_checkpoint / "drafter" / name))
    assert all(t.dtype == torch.float32 for t in saved.values())
    with pytest.raises(ValueError, match=r"run\.autocast"):
        cfg32.with_overrides(run={"autocast": "float16"})


def test_mismatched_cache_layers_are_refused(tiny_data_dir: Path, tmp_path: Path) -> None:
    cfg = _tiny_cfg("eagle3", tiny_data_dir, tmp_path, steps=1)
    cfg = cfg.with_overrides(target={"layer_ids": (0, 1, 2)})
    with pytest.raises(ValueError, match="target layers"):
        _trainer(cfg, tiny_data_dir)


SHIPPED_CONFIGS = sorted(
    str(p.relative_to(REPO / "configs").with_suffix("")) for p in (REPO / "configs").rglob("*.yaml")
)


@pytest.mark.parametrize("name", SHIPPED_CONFIGS)
def test_shipped_configs_load(name: str) -> None:
    cfg = load_config(REPO / "configs" / f"{name}.yaml")
    assert cfg.drafter.block_size == 7 and cfg.anchors.block_size == 7
    assert cfg.target.layer_ids == (1, 8, 14, 20, 27)
    assert Path(cfg.data.dir).is_absolute() and Path(cfg.data.dir).parent.parent == REPO / "runs"
    assert (cfg.loss.ce_weight, cfg.loss.l1_weight, cfg.loss.bce_weight) == (0.1, 0.9, 1.0)


def test_config_errors_name_the_field(tmp_path: Path) -> None:
    base = {"name": "x", "drafter": {"kind": "dspark"}}
    with pytest.raises(ValueError, match=r"optim\.warmup_step"):
        TrainConfig.from_dict({**base, "optim": {"warmup_step": 3}})
    with pytest.raises(ValueError, match="unknown top-level"):
        TrainConfig.from_dict({**base, "optimizer": {}})
    with pytest.raises(ValueError, match=r"drafter\.kind"):
        TrainConfig.from_dict({"name": "x", "drafter": {"kind": "medusa"}})
    with pytest.raises(ValueError, match=r"drafter\.block_size"):
        TrainConfig.from_dict({"name": "x", "drafter": {"model": {"block_size": 5}}})
    bad = tmp_path / "configs" / "bad.yaml"
    bad.parent.mkdir()
    bad.write_text("name: x\nrun:\n  threads: 0\n")
    with pytest.raises(ValueError, match=r"bad\.yaml.*run\.threads"):
        load_config(bad)


def test_markov_head_gets_its_own_learning_rate(tiny_data_dir: Path, tmp_path: Path) -> None:
    cfg = _tiny_cfg("dspark", tiny_data_dir, tmp_path, steps=4, markov_lr_scale=5.0)
    trainer = _trainer(cfg, tiny_data_dir)
    drafter = build_drafter(
        cfg, trainer.spec, trainer.hf_config, trainer.embed_tokens, trainer.lm_head, 3
    )
    opt, _ = trainer._make_optimizer(drafter)
    markov_ids = {id(p) for n, p in drafter.named_parameters() if n.startswith("markov_head.")}
    assert markov_ids, "a DSpark drafter has a Markov head"
    by_group = [({id(p) for p in g["params"]}, g["lr"]) for g in opt.param_groups]
    markov_groups = [(ids, lr) for ids, lr in by_group if ids & markov_ids]
    assert len(markov_groups) == 1 and markov_groups[0][0] == markov_ids
    others = {lr for ids, lr in by_group if not ids & markov_ids}
    assert markov_groups[0][1] == pytest.approx(5.0 * max(others))
    with pytest.raises(ValueError, match=r"optim\.markov_lr_scale"):
        _tiny_cfg("dspark", tiny_data_dir, tmp_path, steps=1, markov_lr_scale=0.0)


X5_DSPARK = "scale/dspark_smollm2_1layer_r96_x5"


@pytest.mark.parametrize(
    ("ablation", "base", "field", "value"),
    [
        ("ablations/dspark_smollm2_1layer", "dspark_smollm2", "num_hidden_layers", 1),
        ("ablations/dspark_smollm2_rnn", "dspark_smollm2", "markov_head_type", "rnn"),
        (
            "ablations/dspark_smollm2_1layer_r96",
            "ablations/dspark_smollm2_1layer",
            "markov_rank",
            96,
        ),
        ("ablations/dflash_smollm2_1layer", "dflash_smollm2", "num_hidden_layers", 1),
        *(
            (f"scale/dspark_smollm2_1layer_{head}_r96_x5", X5_DSPARK, "markov_head_type", head)
            for head in ("gated", "rnn")
        ),
    ],
)
def test_ablation_configs_change_one_thing(
    ablation: str, base: str, field: str, value: object
) -> None:
    """An ablation is only readable if it differs from the recipe it is compared to in one knob."""
    ref = load_config(REPO / "configs" / f"{base}.yaml")
    abl = load_config(REPO / "configs" / f"{ablation}.yaml")
    assert abl.drafter.model[field] == value != ref.drafter.model[field]
    assert {k: v for k, v in abl.drafter.model.items() if k != field} == {
        k: v for k, v in ref.drafter.model.items() if k != field
    }
    for section in ("target", "data", "anchors", "loss", "optim"):
        assert getattr(abl, section) == getattr(ref, section), section
    assert abl.run.autocast == ref.run.autocast  # one precision for both
    assert Path(abl.run.out_dir).name == Path(ablation).name != Path(ref.run.out_dir).name


@pytest.mark.parametrize(
    ("scaled", "base"),
    [
        ("scale/dspark_smollm2_1layer_r96_x2", "ablations/dspark_smollm2_1layer_r96"),
        ("scale/dflash_smollm2_1layer_x2", "ablations/dflash_smollm2_1layer"),
        ("scale/dspark_smollm2_1layer_r96_x3", "scale/dspark_smollm2_1layer_r96_x2"),
        ("scale/dflash_smollm2_1layer_x3", "scale/dflash_smollm2_1layer_x2"),
        ("scale/dspark_smollm2_1layer_r96_x4", "scale/dspark_smollm2_1layer_r96_x3"),
        ("scale/dflash_smollm2_1layer_x4", "scale/dflash_smollm2_1layer_x3"),
        ("scale/dspark_smollm2_1layer_r96_x5", "scale/dspark_smollm2_1layer_r96_x3"),
        ("scale/dflash_smollm2_1layer_x5", "scale/dflash_smollm2_1layer_x3"),
        ("scale/dspark_smollm2_1layer_r96_regen", "ablations/dspark_smollm2_1layer_r96"),
        ("scale/dflash_smollm2_1layer_regen", "ablations/dflash_smollm2_1layer"),
    ],
)
def test_scale_configs_change_only_data_and_schedule(scaled: str, base: str) -> None:
    """A scale-up run is comparable to its base only if the model and the loss stay put."""
    ref = load_config(REPO / "configs" / f"{base}.yaml")
    big = load_config(REPO / "configs" / f"{scaled}.yaml")
    for section in ("target", "drafter", "anchors", "loss"):
        assert getattr(big, section) == getattr(ref, section), section
    assert big.optim.max_steps > ref.optim.max_steps
    keep = ("lr", "weight_decay", "min_lr_ratio", "grad_clip", "aux_loss_weight")
    assert [getattr(big.optim, k) for k in keep] == [getattr(ref.optim, k) for k in keep]
    assert Path(big.run.out_dir).name == Path(scaled).name
    # A continuation starts from its base's run; a fresh scale-up must at least see new data.
    if big.run.init_from is not None:
        assert Path(big.run.init_from).name == Path(ref.run.out_dir).name
    else:
        assert big.data.dir != ref.data.dir


@pytest.mark.parametrize(
    ("scale", "previous"),
    [("x2", None), ("x3", "x2"), ("x4", "x3"), ("x5", None), ("regen", None)],
)
def test_scale_pair_shares_data_and_schedule(scale: str, previous: str | None) -> None:
    """DSpark vs DFlash is only a head-to-head if both saw the same data for the same steps."""
    dspark = load_config(REPO / "configs" / "scale" / f"dspark_smollm2_1layer_r96_{scale}.yaml")
    dflash = load_config(REPO / "configs" / "scale" / f"dflash_smollm2_1layer_{scale}.yaml")
    assert dspark.data == dflash.data
    assert dspark.run.autocast == dflash.run.autocast  # one precision for both
    assert (dspark.optim.max_steps, dspark.optim.warmup_steps) == (
        dflash.optim.max_steps,
        dflash.optim.warmup_steps,
    )
    # A continued pair continues each drafter's own previous run.
    for cfg in (dspark, dflash):
        if previous is None:
            assert cfg.run.init_from is None
        else:
            assert cfg.run.init_from is not None
            assert Path(cfg.run.init_from).name == Path(cfg.run.out_dir).name.replace(
                f"_{scale}", f"_{previous}"
            )


def test_greedy_recipe_is_x5_on_greedy_continuations() -> None:
    """The greedy drafter is compared with x5-style T = 1 drafters: only how its data is
    regenerated (temperature 0, through SGLang's engine), where it lives, and the schedule
    may differ."""
    x5 = load_config(REPO / "configs" / f"{X5_DSPARK}.yaml")
    greedy = load_config(REPO / "configs/scale/dspark_smollm2_1layer_r96_greedy.yaml")
    for section in ("target", "drafter", "anchors", "loss"):
        assert getattr(greedy, section) == getattr(x5, section), section
    assert (greedy.data.temperature, x5.data.temperature) == (0, 1.0)
    regen = ("dir", "temperature", "generator", "max_in_flight", "gen_batch_size")
    for f in dataclasses.fields(greedy.data):
        if f.name not in regen:
            assert getattr(greedy.data, f.name) == getattr(x5.data, f.name), f.name
    assert greedy.data.dir != x5.data.dir
    assert greedy.run.autocast == x5.run.autocast == "bfloat16"
    assert greedy.run.init_from is None


def test_x5_ar_baseline_shares_the_pairs_data_and_precision() -> None:
    """The three drafters are compared on the same data: the x5 EAGLE3 run reads the
    pair's data dir with the pair's settings and trains at the pair's precision."""
    pair = load_config(REPO / "configs/scale/dspark_smollm2_1layer_r96_x5.yaml")
    ar = load_config(REPO / "configs/scale/eagle3_smollm2_x5.yaml")
    assert ar.drafter.kind == "eagle3"
    assert ar.data == pair.data and ar.target == pair.target
    assert ar.run.autocast == pair.run.autocast == "bfloat16"
    assert ar.data.gen_dtype == "bfloat16"


def test_init_from_continues_another_run(tiny_data_dir: Path, tmp_path: Path) -> None:
    """Weights, optimizer and step carry over; the schedule and the log are the new run's."""
    from dspark_sglang.training.trainer import lr_lambda

    src_cfg = _tiny_cfg("dspark", tiny_data_dir, tmp_path / "src", steps=6)
    _trainer(src_cfg, tiny_data_dir).train(progress=False)
    cfg = _tiny_cfg(
        "dspark", tiny_data_dir, tmp_path / "cont", steps=20, weight_decay=0.05
    ).with_overrides(run={"init_from": str(tmp_path / "src")})
    res = _trainer(cfg, tiny_data_dir).train(progress=False, stop_at=7)
    assert res.final_step == 7
    # The optimizer's hyperparameters are the new config's; only its moments are inherited.
    src_opt = torch.load(
        tmp_path / "src/checkpoints/step-000006/train_state.pt", weights_only=False
    )
    cont_opt = torch.load(res.final_checkpoint / "train_state.pt", weights_only=False)
    decays = [g["weight_decay"] for g in cont_opt["optimizer"]["param_groups"]]
    assert src_opt["optimizer"]["param_groups"][0]["weight_decay"] == 0.01
    assert decays[0] == 0.05 and decays[1] == 0.0
    log = [json.loads(x) for x in (tmp_path / "cont/log.jsonl").read_text().splitlines()]
    src_log = (tmp_path / "src/log.jsonl").read_text().splitlines()
    assert [r["step"] for r in log] == list(range(1, 8))
    assert [json.dumps(r) for r in log[:6]] == src_log  # the inherited history, verbatim
    # Step 7 runs at the new schedule's rate for step 6: a warm restart, since max_steps grew
    # (the source had decayed towards its floor).
    assert log[6]["lr"] == pytest.approx(cfg.optim.lr * lr_lambda(cfg)(6))
    assert log[6]["lr"] > 2 * log[5]["lr"]
    # One AdamW step moves each weight by about lr (3e-3); a fresh drafter (another seed) is
    # a different draw.
    src = load_file(str(tmp_path / "src/checkpoints/step-000006/drafter/model.safetensors"))
    cont = load_file(str(tmp_path / "cont/checkpoints/step-000007/drafter/model.safetensors"))
    fresh_cfg = _tiny_cfg("dspark", tiny_data_dir, tmp_path / "fresh", steps=1).with_overrides(
        run={"seed": 1}
    )
    _trainer(fresh_cfg, tiny_data_dir).train(progress=False)
    fresh = load_file(str(tmp_path / "fresh/checkpoints/step-000001/drafter/model.safetensors"))

    def gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
        return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)

    assert gap(cont, src) < 10 * cfg.optim.lr < gap(fresh, src)


def test_init_from_refuses_a_different_drafter_or_an_exhausted_schedule(
    tiny_data_dir: Path, tmp_path: Path
) -> None:
    src_cfg = _tiny_cfg("dspark", tiny_data_dir, tmp_path / "src", steps=5)
    _trainer(src_cfg, tiny_data_dir).train(progress=False)
    other = _tiny_cfg("dflash", tiny_data_dir, tmp_path / "a", steps=10).with_overrides(
        run={"init_from": str(tmp_path / "src")}
    )
    with pytest.raises(ValueError, match=r"run\.init_from.*different 'drafter'"):
        _trainer(other, tiny_data_dir).train(progress=False)
    short = _tiny_cfg("dspark", tiny_data_dir, tmp_path / "b", steps=5).with_overrides(
        run={"init_from": str(tmp_path / "src" / "checkpoints" / "step-000005")}
    )
    with pytest.raises(ValueError, match=r"already at step 5.*optim\.max_steps"):
        _trainer(short, tiny_data_dir).train(progress=False)
    missing = _tiny_cfg("dspark", tiny_data_dir, tmp_path / "c", steps=9).with_overrides(
        run={"init_from": str(tmp_path / "nowhere")}
    )
    with pytest.raises(FileNotFoundError, match=r"run\.init_from"):
        _trainer(missing, tiny_data_dir).train(progress=False)


def test_a_reduced_vocabulary_drafter_trains_on_its_token_map(
    tiny_data_dir: Path, tmp_path: Path
) -> None:
    """drafter.model.draft_vocab_size: the map is the data's most frequent response tokens
    (EOS included), it is recorded with its coverage, saved in the checkpoint, and the
    loss still falls."""
    k = 48
    model = dict(tiny_cfg("dspark", tiny_data_dir, tmp_path, 20).drafter.model)
    drafter = {"model": {**model, "draft_vocab_size": k}}
    cfg = tiny_cfg("dspark", tiny_data_dir, tmp_path / "run", 20, drafter=drafter)
    res = _trainer(cfg, tiny_data_dir).train(progress=False)
    expected = build_draft_vocab(tiny_data_dir, TINY_VOCAB, k)
    assert EOS in expected.ids.tolist()
    report = json.loads((tmp_path / "run" / "draft_vocab.json").read_text())
    assert report["draft_vocab_size"] == k and report["vocab_size"] == TINY_VOCAB
    counts = response_token_counts(tiny_data_dir, TINY_VOCAB)
    assert report["coverage"] == pytest.approx(float(counts[expected.ids].sum() / counts.sum()))
    assert 0.0 < report["coverage"] < 1.0
    saved = json.loads((res.final_checkpoint / "drafter" / "config.json").read_text())
    assert saved["dspark_config"]["draft_vocab_size"] == k
    weights = load_file(str(res.final_checkpoint / "drafter" / "model.safetensors"))
    assert torch.equal(weights["draft_vocab_ids"], expected.ids)
    assert weights["markov_head.markov_w2.weight"].shape[0] == k
    # This tiny target's replies are flat (the map covers ~70 % of them), so L1 keeps a
    # floor of twice the uncovered mass; the drafter must still learn within the map.
    log = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    first, last = _mean([r["total"] for r in log[:4]]), _mean([r["total"] for r in log[-4:]])
    assert last < 0.97 * first, (first, last)
    acc_first = _mean([r["accept_per_slot"][0] for r in log[:4]])
    assert _mean([r["accept_per_slot"][0] for r in log[-4:]]) > acc_first


def test_a_token_map_of_the_whole_vocabulary_trains_like_the_full_drafter(
    tiny_data_dir: Path, tmp_path: Path
) -> None:
    """K = V: the reduced path (gathered LM-head rows, CE through the map, TV with the
    outside mass) computes the full drafter's losses, step for step."""
    logs = {}
    for name, extra in (("full", {}), ("mapped", {"draft_vocab_size": TINY_VOCAB})):
        model = {**tiny_cfg("dspark", tiny_data_dir, tmp_path, 6).drafter.model, **extra}
        cfg = tiny_cfg("dspark", tiny_data_dir, tmp_path / name, 6, drafter={"model": model})
        _trainer(cfg, tiny_data_dir).train(progress=False)
        lines = (tmp_path / name / "log.jsonl").read_text().splitlines()
        logs[name] = [json.loads(x) for x in lines]
    for key in ("total", "ce", "l1", "bce"):
        got = [r[key] for r in logs["mapped"]]
        assert got == pytest.approx([r[key] for r in logs["full"]], rel=1e-5), key
