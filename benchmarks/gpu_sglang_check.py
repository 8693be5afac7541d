"""GPU check: SGLang's engine with CUDA graphs, plain decoding vs DSPARK_MOE.

Why: the CPU suite proves DSPARK_MOE is lossless and counts acceptance, but says
nothing about speed -- on CPU every step is compute-bound and CUDA graphs are
off. This driver runs the same SGLang ``Engine`` on a GPU (CUDA graphs on,
bf16 by default) twice, once without speculation and once with
``--speculative-algorithm DSPARK_MOE`` and our drafter, on a fixed prompt set
(GSM8K test prompts through the target's chat template, greedy, EOS ignored,
``--new-tokens`` per request) at each batch size, and

* checks that every greedy continuation is identical in both runs,
* prints tokens/s plain vs DSpark, the speed-up, and SGLang's accepted length
  (tokens per verify round, bonus token included, as SGLang's
  ``spec_accept_length``) plus accepted drafts per round,
* writes everything to ``--out`` (default: ``gpu_sglang_check.json`` in a fresh run folder,
  ``<cache>/runs/bench/gpu_sglang_check-<UTC time>/``; ``scripts/gpu_sglang_check.sh`` names
  ``benchmarks/results/gpu_sglang_check.json``).

Exit status: 0 when all outputs matched, 1 when any differed (the table and
JSON name the first differing position per prompt), 2 on bad arguments.

Backends are SGLang's own choice on CUDA (attention: FA3/flashinfer on
Hopper; sampling: flashinfer when installed). Greedy decoding only needs an
argmax, so flashinfer's sampling kernels matter only for sampled runs; they
are not forced here. Windowed draft layers compute their attention
themselves (``moe_draft_model.windowed_block_attention``) with static shapes,
and the MoE is dense over experts, so the draft forward is graph-capturable.

bf16 caveat: verify runs ``gamma + 1`` query rows where plain decoding runs
one, so kernels may round differently and a near-tie in the target's argmax
can flip. A mismatch under bf16 that disappears with ``--dtype float32`` is
numerics, not a speculation bug; the JSON records which it was run with.

``--tp N`` sets the *target's* ``tp_size`` (the drafter runs unsharded beside
it); it needs N GPUs. Usage: ``scripts/gpu_sglang_check.sh`` (environment and the
no-GPU skip) or ``python benchmarks/gpu_sglang_check.py --help``. The engine-free parts
(settings, run accounting, the table and the JSON) are
``dspark_sglang/bench/gpu_sglang_check.py``, re-exported here.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from dspark_sglang.bench.gpu_sglang_check import (
    DTYPES,
    RAGGED_MODES,
    BatchRun,
    Comparison,
    GpuCheckArgs,
    compare,
    first_divergence,
    format_table,
    result_json,
    write_json,
)

__all__ = [
    "DEFAULT_DRAFTER",
    "DTYPES",
    "RAGGED_MODES",
    "REPO",
    "BatchRun",
    "Comparison",
    "GpuCheckArgs",
    "build_parser",
    "compare",
    "engine_kwargs",
    "environment",
    "first_divergence",
    "format_table",
    "load_prompt_ids",
    "main",
    "parse_args",
    "resolve_drafter",
    "resolve_model",
    "result_json",
    "run_mode",
    "write_json",
]

REPO = Path(__file__).resolve().parents[1]
#: The embedded SmolLM2 drafter, when the repository ships one.
DEFAULT_DRAFTER = REPO / "dspark_sglang" / "assets" / "drafters" / "smollm2"


# --------------------------------------------------------------------------- arguments


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from e


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpu_sglang_check.py",
        description="SGLang engine on a GPU (CUDA graphs): plain decoding vs DSPARK_MOE, "
        "greedy outputs must match; prints tokens/s, speed-up and accepted length.",
    )
    d = GpuCheckArgs()
    p.add_argument("--model", default=d.model, help="'smollm2' (converted cache) or a HF folder")
    p.add_argument(
        "--drafter",
        type=Path,
        default=None,
        help=f"drafter checkpoint folder (save_drafter); default {DEFAULT_DRAFTER} if present",
    )
    p.add_argument("--batch-sizes", type=_int_list, default=d.batch_sizes, help="e.g. 1,16")
    p.add_argument("--new-tokens", type=int, default=d.new_tokens)
    p.add_argument("--tp", type=int, default=d.tp, help="target tp_size (needs that many GPUs)")
    p.add_argument("--dtype", default=d.dtype, choices=DTYPES)
    p.add_argument("--mem-fraction-static", type=float, default=d.mem_fraction_static)
    p.add_argument(
        "--ragged-verify-mode",
        default=None,
        choices=RAGGED_MODES,
        help="SGLANG_RAGGED_VERIFY_MODE for the DSpark run (default: SGLang's, static)",
    )
    p.add_argument("--warmup-tokens", type=int, default=d.warmup_tokens)
    p.add_argument(
        "--out",
        type=Path,
        default=d.out,
        help="result JSON path (default: gpu_sglang_check.json in a fresh run folder, "
        "<cache>/runs/bench/gpu_sglang_check-<UTC time>/)",
    )
    return p


def parse_args(argv: Sequence[str] | None = None) -> GpuCheckArgs:
    """Parse and validate; a bad value exits with status 2 and names the option."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        return GpuCheckArgs(
            model=ns.model,
            drafter=ns.drafter,
            batch_sizes=tuple(ns.batch_sizes),
            new_tokens=ns.new_tokens,
            tp=ns.tp,
            dtype=ns.dtype,
            mem_fraction_static=ns.mem_fraction_static,
            ragged_verify_mode=ns.ragged_verify_mode,
            warmup_tokens=ns.warmup_tokens,
            out=ns.out,
        )
    except ValueError as e:
        parser.error(str(e))
        raise  # unreachable: parser.error exits


def resolve_drafter(explicit: Path | None, default: Path = DEFAULT_DRAFTER) -> Path:
    """The drafter folder to load: ``explicit``, else the embedded default.

    A folder must hold what ``save_drafter`` writes (``config.json`` and
    ``model.safetensors``), so a wrong path fails here rather than deep in
    SGLang's start-up.
    """
    folder = explicit if explicit is not None else default
    if not folder.is_dir():
        hint = (
            "pass DRAFTER=<dir> / --drafter <dir>"
            if explicit is None
            else "check the --drafter / DRAFTER path"
        )
        raise FileNotFoundError(f"drafter folder {folder} does not exist; {hint}")
    missing = [n for n in ("config.json", "model.safetensors") if not (folder / n).is_file()]
    if missing:
        raise FileNotFoundError(
            f"drafter folder {folder} lacks {missing}; it must be a checkpoint written by "
            "dspark_sglang.model.save_drafter"
        )
    return folder


# --------------------------------------------------------------------------- GPU (untested here)


def resolve_model(model: str) -> Path:
    """``smollm2`` -> the converted cache folder; anything else must be a HF folder."""
    if model == "smollm2":
        from dspark_sglang.targets.smollm2 import ensure_smollm2

        return ensure_smollm2()
    path = Path(model).expanduser()
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"--model {model}: no config.json there; pass a HF model folder")
    return path


def load_prompt_ids(model_path: Path, count: int) -> list[list[int]]:
    """The first ``count`` GSM8K test prompts through the target's chat template."""
    from transformers import AutoTokenizer

    from dspark_sglang.data.evalsets import load_gsm8k_test

    prompts = load_gsm8k_test(limit=count)
    if len(prompts) < count:
        raise ValueError(f"GSM8K test has {len(prompts)} prompts, {count} needed")
    tok = AutoTokenizer.from_pretrained(str(model_path))
    out: list[list[int]] = []
    for p in prompts:
        ids = tok.apply_chat_template(
            p.chat(), add_generation_prompt=True, tokenize=True, return_dict=False
        )
        if isinstance(ids, Mapping):
            ids = ids["input_ids"]
        out.append([int(t) for t in ids])
    return out


def engine_kwargs(args: GpuCheckArgs, model_path: Path, drafter: Path | None) -> dict[str, Any]:
    """SGLang ``Engine`` keyword arguments; ``drafter`` None means plain decoding."""
    kw: dict[str, Any] = {
        "model_path": str(model_path),
        "tp_size": args.tp,
        "dtype": args.dtype,
        "mem_fraction_static": args.mem_fraction_static,
        "disable_cuda_graph": False,
        "cuda_graph_max_bs_decode": max(args.batch_sizes),
        "max_running_requests": max(args.batch_sizes),
        "random_seed": 0,
        "log_level": "warning",
    }
    if drafter is not None:
        kw["speculative_algorithm"] = "DSPARK_MOE"
        kw["speculative_draft_model_path"] = str(drafter)
    return kw


def run_mode(
    args: GpuCheckArgs,
    model_path: Path,
    drafter: Path | None,
    prompts: list[list[int]],
) -> dict[int, BatchRun]:
    """One engine; a warm-up, then one timed greedy ``generate`` per batch size."""
    mode = "plain" if drafter is None else "dspark"
    env = {}
    if drafter is not None and args.ragged_verify_mode is not None:
        env["SGLANG_RAGGED_VERIFY_MODE"] = args.ragged_verify_mode
    params = {"temperature": 0.0, "max_new_tokens": args.new_tokens, "ignore_eos": True}
    runs: dict[int, BatchRun] = {}
    from dspark_sglang.sglang_integration.engine import managed_engine

    with managed_engine(engine_kwargs(args, model_path, drafter), env) as engine:
        warm = dict(params, max_new_tokens=args.warmup_tokens)
        for bs in args.batch_sizes:
            engine.generate(input_ids=prompts[:bs], sampling_params=warm)
        for bs in args.batch_sizes:
            t0 = time.perf_counter()
            outputs = engine.generate(input_ids=prompts[:bs], sampling_params=params)
            wall = time.perf_counter() - t0
            runs[bs] = BatchRun.from_outputs(mode, wall, list(outputs))
            print(
                f"[gpu_sglang_check] {mode:6s} bs={bs:<3d} {runs[bs].tokens_per_s:9.1f} tok/s",
                file=sys.stderr,
            )
    return runs


def environment() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__}
    with contextlib.suppress(Exception):
        import sglang

        info["sglang"] = sglang.__version__
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_count"] = torch.cuda.device_count()
        info["cuda"] = torch.version.cuda
    return info


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("[gpu_sglang_check] no CUDA device visible: skipped (this check needs a GPU)")
        return 0
    if args.tp > torch.cuda.device_count():
        print(
            f"[gpu_sglang_check] --tp {args.tp} needs {args.tp} GPUs, "
            f"{torch.cuda.device_count()} visible",
            file=sys.stderr,
        )
        return 2
    if args.out is None:
        from dspark_sglang.results import default_out

        args = replace(args, out=default_out("gpu_sglang_check", "gpu_sglang_check.json"))
    drafter = resolve_drafter(args.drafter)
    model_path = resolve_model(args.model)
    prompts = load_prompt_ids(model_path, args.num_prompts)
    plain = run_mode(args, model_path, None, prompts)
    dspark = run_mode(args, model_path, drafter, prompts)
    rows = [compare(plain[bs], dspark[bs]) for bs in args.batch_sizes]
    doc = result_json(
        args, rows, model_path=str(model_path), drafter=str(drafter), env=environment()
    )
    write_json(args.out, doc)
    print(format_table(rows))
    print(f"[gpu_sglang_check] wrote {args.out}")
    if not doc["all_identical"]:
        print(
            "[gpu_sglang_check] FAIL: DSpark's greedy output differs from plain decoding "
            "(first differing positions are in the JSON; retry with --dtype float32 "
            "to separate bf16 near-ties from a speculation bug)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
