"""The two stages of ``dspark-sglang train``, callable without the command line.

``run_data_stage`` builds the prompt mix, checks it is disjoint from the eval sets,
has the target regenerate responses (temperature 1) and caches hidden states;
``run_train_stage`` trains the configured drafter on that cache. Both resume where
they stopped (data: per shard; training: ``resume=True`` from the latest checkpoint).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dspark_sglang.training.config import TrainConfig

__all__ = ["load_target", "run_data_stage", "run_train_stage"]


def load_target(cfg: TrainConfig):
    """The configured target (``smollm2`` = the converted PyPI GGUF, else an HF folder)."""
    from dspark_sglang.targets.hf_target import HFTarget
    from dspark_sglang.targets.smollm2 import ensure_smollm2

    path = ensure_smollm2() if cfg.target.name == "smollm2" else Path(cfg.target.name)
    return HFTarget(path, num_threads=cfg.run.threads)


def run_data_stage(
    cfg: TrainConfig,
    target,
    limit: int | None,
    progress: bool,
    gen_batches: int | None = None,
) -> dict[str, float]:
    """Prompts -> regenerated responses -> float16 hidden cache; returns throughput figures."""
    from dspark_sglang.data.evalsets import load_gsm8k_test, load_humaneval, load_mtbench
    from dspark_sglang.training.datagen import (
        HIDDEN_DIR,
        RESPONSES_DIR,
        EncodedPrompt,
        GenerationSettings,
        cache_hidden_states,
        generate_responses,
        throughput,
    )
    from dspark_sglang.training.prompts import assert_disjoint, build_training_prompts
    from dspark_sglang.training.trainer import resolve_layer_ids

    d = cfg.data
    prompts = build_training_prompts(d.num_math, d.num_code, d.num_chat, d.seed)
    assert_disjoint(prompts, [*load_gsm8k_test(), *load_humaneval(), *load_mtbench()])
    encoded = []
    for p in prompts:
        ids = target.encode_chat(p.chat())
        if len(ids) <= d.max_prompt_tokens:
            encoded.append(EncodedPrompt(id=p.id, domain=p.domain, prompt_ids=ids))
    if limit is not None:
        encoded = encoded[:limit]
    tok = target.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else target.eos_token_ids[0]
    settings = GenerationSettings(
        max_new_tokens=d.max_new_tokens,
        batch_size=d.gen_batch_size,
        seed=d.seed,
        dtype=d.gen_dtype,
    )
    print(f"[data] {len(encoded)} prompts (of {len(prompts)}) -> {d.dir}")
    generate_responses(
        target.model,
        encoded,
        d.dir,
        settings,
        pad_token_id=pad,
        eos_token_ids=target.eos_token_ids,
        max_batches=gen_batches,
        progress=progress,
    )
    layer_ids = resolve_layer_ids(cfg, target.spec.num_layers)
    cache_hidden_states(
        target.model,
        d.dir,
        layer_ids,
        batch_size=d.hidden_batch_size,
        pad_token_id=pad,
        progress=progress,
    )
    gen = throughput(Path(d.dir) / RESPONSES_DIR)
    hid = throughput(Path(d.dir) / HIDDEN_DIR)
    figures = {
        "gen_tokens": gen["tokens"],
        "gen_tokens_per_s": gen["tokens_per_s"],
        "hidden_tokens": hid["tokens"],
        "hidden_tokens_per_s": hid["tokens_per_s"],
        "threads": cfg.run.threads,
    }
    (Path(d.dir) / "throughput.json").write_text(json.dumps(figures, indent=2))
    print(
        f"[data] generation {gen['tokens_per_s']:.1f} tok/s, hidden cache "
        f"{hid['tokens_per_s']:.1f} tok/s"
    )
    return figures


def run_train_stage(cfg: TrainConfig, target, resume: bool, progress: bool) -> Any:
    """Train ``cfg``'s drafter on the hidden-state cache in ``cfg.data.dir``.

    Returns the trainer's result (final step, losses, speed, final checkpoint).
    """
    from dspark_sglang.training.dataset import HiddenCache
    from dspark_sglang.training.trainer import Trainer

    trainer = Trainer(
        cfg,
        HiddenCache(cfg.data.dir),
        target.spec,
        target.model.config,
        target.embed_tokens,
        target.lm_head,
        target.default_mask_token_id(),
    )
    return trainer.train(resume=resume, progress=progress)
