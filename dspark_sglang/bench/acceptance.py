"""Accepted length per round of several drafters on several eval sets (paper Table 2, Figure 2).

Why this shape: the paper's offline claim is a comparison of drafters at equal
footing: temperature 1 by default, the whole block verified every round (no
scheduler, so the figure measures the drafter, not the policy), the
bonus/correction token counted. Every drafter therefore runs through the same
``ReferenceGenerator`` with the ``VerifyAll`` policy, the same prompts, the same
sampling settings and the same seed.

The figures (accepted length, its standard error clustered by request, position-wise
acceptance, paired gains between drafters) and their formulas are in
``acceptance_report``; every one is a pure function of the per-round ``accepted``
counts the report stores. The eval prompts are loaded by ``acceptance_prompts``, the
result JSON, traces and rollouts written by ``acceptance_outputs``; this module loads
drafters and runs the measurement. Every public name is importable from here too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from dspark_sglang.bench.acceptance_outputs import write_report_json, write_traces
from dspark_sglang.bench.acceptance_prompts import PromptFile, load_eval_prompts, load_prompt_file
from dspark_sglang.bench.acceptance_report import AcceptanceReport, CellResult
from dspark_sglang.bench.acceptance_report import accept_length_stats as accept_length_stats
from dspark_sglang.bench.acceptance_report import paired_covariance as paired_covariance
from dspark_sglang.bench.acceptance_report import ratio_gain_stderr as ratio_gain_stderr
from dspark_sglang.model.ar_drafter import ARDrafter
from dspark_sglang.model.discovery import DrafterCheckpoint
from dspark_sglang.model.drafter import DSparkDrafter
from dspark_sglang.reference.ar_proposer import ARProposer
from dspark_sglang.reference.generator import DSparkProposer, Proposer, ReferenceGenerator
from dspark_sglang.sampling import SamplingParams
from dspark_sglang.scheduling.policies import VerifyAll
from dspark_sglang.targets.hf_target import HFTarget

__all__ = [
    "AcceptanceReport",
    "CellResult",
    "PromptFile",
    "load_eval_prompts",
    "load_prompt_file",
    "load_proposer",
    "measure_acceptance",
    "write_report_json",
    "write_traces",
]

BENCH_SAMPLING = SamplingParams(temperature=1.0)
"""The paper's setting and the default: temperature 1, no top-k/top-p (SamplingParams' defaults)."""

Progress = Callable[[str, str, int], object]
"""``(drafter, domain, emitted_tokens)``; called with 0 when a cell starts."""


def load_proposer(ckpt: DrafterCheckpoint, target: HFTarget) -> Proposer:
    """Load the checkpoint's weights onto ``target``'s embedding/LM head as a ``Proposer``.

    DSpark/DFlash checkpoints go through ``load_drafter`` (which refuses a foreign
    target, slot convention or layer set); AR checkpoints are checked here for the
    same target facts, since their config does not carry the target's name.
    """
    from dspark_sglang.model.ar_drafter import load_ar_drafter
    from dspark_sglang.model.checkpoint import load_drafter

    if ckpt.kind == "ar":
        drafter = load_ar_drafter(ckpt.folder, target.embed_tokens, target.lm_head).eval()
        c, spec = drafter.config, target.spec
        if c.hidden_size != spec.hidden_size or c.vocab_size != spec.vocab_size:
            raise ValueError(
                f"drafter {ckpt.name!r}: AR drafter hidden_size={c.hidden_size}, vocab_size="
                f"{c.vocab_size} but the target has {spec.hidden_size}, {spec.vocab_size}; "
                "use a drafter trained for this target"
            )
        bad = [i for i in c.target_layer_ids if not 0 <= i < spec.num_layers - 1]
        if bad:
            raise ValueError(
                f"drafter {ckpt.name!r}: target_layer_ids {bad} are invalid for a target with "
                f"{spec.num_layers} layers (ids in [0, {spec.num_layers - 2}]); use a drafter "
                "trained for this target"
            )
        return ARProposer(drafter)
    dsd = load_drafter(ckpt.folder, target.spec, target.embed_tokens, target.lm_head).eval()
    return DSparkProposer(dsd)


# --------------------------------------------------------------------------- measurement


def _as_proposer(drafter: Proposer | DSparkDrafter | ARDrafter) -> Proposer:
    if isinstance(drafter, DSparkDrafter):
        return DSparkProposer(drafter)
    if isinstance(drafter, ARDrafter):
        return ARProposer(drafter)
    return drafter


def measure_acceptance(
    target: HFTarget,
    drafters: Mapping[str, Proposer | DSparkDrafter | ARDrafter],
    eval_sets: Mapping[str, Sequence[Sequence[int]]],
    num_prompts: int,
    max_new_tokens: int,
    seed: int = 0,
    *,
    stop_token_ids: Sequence[int] | None = None,
    progress: Progress | None = None,
    sampling: SamplingParams = BENCH_SAMPLING,
    context_copy: Mapping[str, int] | None = None,
) -> AcceptanceReport:
    """Run every drafter on the first ``num_prompts`` prompts of every eval set.

    ``eval_sets`` maps a domain name to token-id prompts (already chat-encoded).
    Every draft verified (``VerifyAll``), generator seed ``seed`` for every cell;
    stops at ``stop_token_ids`` (default: the target's EOS ids). ``sampling``
    defaults to the paper's temperature 1; other temperatures (0 = greedy) show
    how a drafter's advantage moves with the serving temperature, and apply to
    drafter and target alike, so verification stays lossless. ``context_copy`` maps a
    drafter name to an n-gram: that drafter's drafts are replaced by context copies
    (``model/context_copy.py``) where the context repeats itself.
    """
    if num_prompts < 1:
        raise ValueError(f"num_prompts must be >= 1, got {num_prompts}")
    if not drafters:
        raise ValueError("measure_acceptance needs at least one drafter")
    if not eval_sets:
        raise ValueError("measure_acceptance needs at least one eval set")
    for dom, prompts in eval_sets.items():
        if not prompts:
            raise ValueError(f"eval set {dom!r} has no prompts")
    copy = dict(context_copy or {})
    unknown = sorted(set(copy) - set(drafters))
    if unknown:
        raise ValueError(f"context_copy names drafters that are not measured: {unknown}")
    stops = tuple(target.eos_token_ids if stop_token_ids is None else stop_token_ids)
    cells: dict[str, dict[str, CellResult]] = {}
    for name, drafter in drafters.items():
        proposer = _as_proposer(drafter)
        cells[name] = {}
        for dom, prompts in eval_sets.items():
            chosen = [list(p) for p in prompts[:num_prompts]]
            gen = ReferenceGenerator(
                target,
                proposer,
                VerifyAll(),
                sampling=sampling,
                seed=seed,
                context_copy_ngram=copy.get(name, 0),
            )
            if progress is not None:
                progress(name, dom, 0)
            t0 = time.perf_counter()
            res = gen.generate(
                chosen,
                max_new_tokens,
                stops,
                progress=None if progress is None else (lambda n, a=name, d=dom: progress(a, d, n)),
            )
            wall = time.perf_counter() - t0
            b = proposer.block_size
            if any(v != b for r in res.rounds for v, _ in r):
                raise AssertionError("VerifyAll must verify the whole block every round")
            cells[name][dom] = CellResult(
                drafter=name,
                domain=dom,
                block_size=b,
                accepted=tuple(tuple(a for _, a in r) for r in res.rounds),
                position_reached=tuple(int(x) for x in res.position_reached.tolist()),
                position_accepted=tuple(int(x) for x in res.position_accepted.tolist()),
                num_tokens=res.num_tokens,
                wall_time_s=wall,
                target_forwards=res.target_forwards,
                confidence_logits=(
                    None if res.confidence_logits is None else tuple(res.confidence_logits)
                ),
                copies_reached=res.copies_reached,
                copies_accepted=res.copies_accepted,
            )
    return AcceptanceReport(
        drafters=tuple(drafters),
        domains=tuple(eval_sets),
        cells=cells,
        num_prompts=num_prompts,
        max_new_tokens=max_new_tokens,
        seed=seed,
        temperature=sampling.temperature,
        policy=VerifyAll().name,
        context_copy={name: n for name, n in copy.items() if n},
    )
