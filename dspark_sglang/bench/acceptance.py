"""Accepted length per round of several drafters on several eval sets (paper Table 2, Figure 2).

Why this shape: the paper's offline claim is a comparison of drafters at equal
footing: temperature 1 by default, the whole block verified every round (no
scheduler, so the figure measures the drafter, not the policy), the
bonus/correction token counted. Every drafter therefore runs through the same
``ReferenceGenerator`` with the ``VerifyAll`` policy, the same prompts, the same
sampling settings and the same seed.

Per drafter ``d`` and domain ``D`` (requests ``i``, each with ``n_i`` rounds and
``s_i = sum over its rounds of (accepted + 1)``):

    accept_length   L = sum_i s_i / sum_i n_i          (= GenerationResult.accept_length_mean)
    stderr          sqrt(R/(R-1) * sum_i (s_i - L n_i)^2) / sum_i n_i
                    (ratio estimator clustered by request: rounds of one request
                     are correlated, requests are the independent units)
    position k      accepted_k / reached_k             (conditional acceptance)
    macro           mean over domains of L, stderr sqrt(sum se_D^2) / |domains|
    copy acceptance copies_accepted / copies_reached   (drafters run with context copies:
                    the copied drafts among the reached / accepted ones)
    gain(a over b)  100 * (L_a / L_b - 1) %           (per domain and macro)
    its stderr      100 * sqrt(V_a/L_b^2 + L_a^2 V_b/L_b^4 - 2 L_a C_ab/L_b^3)  (delta method)
                    V = stderr^2; C_ab = R/(R-1) sum_i u_ai u_bi with u_i = (s_i - L n_i) / sum n,
                    the two drafters' estimates paired by request (same prompts, same order);
                    macro: V and C summed over domains / |domains|^2

Invariant: every figure in the report is a pure function of the per-round
``accepted`` counts it stores, so a reader can recompute them from the JSON.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dspark_sglang.model.ar_drafter import ARDrafter
from dspark_sglang.model.discovery import DrafterCheckpoint
from dspark_sglang.model.drafter import DSparkDrafter
from dspark_sglang.reference.ar_proposer import ARProposer
from dspark_sglang.reference.generator import DSparkProposer, Proposer, ReferenceGenerator
from dspark_sglang.results import dump_json
from dspark_sglang.sampling import SamplingParams
from dspark_sglang.scheduling.policies import VerifyAll
from dspark_sglang.targets.hf_target import HFTarget
from dspark_sglang.targets.smollm2 import sha256_file

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


# --------------------------------------------------------------------------- eval prompts


def load_eval_prompts(
    target: HFTarget,
    names: Sequence[str],
    num_prompts: int,
    cache_dir: str | Path | None = None,
    skip: int = 0,
) -> dict[str, list[list[int]]]:
    """Prompts ``skip .. skip + num_prompts - 1`` of each eval set, through the chat template.

    ``skip`` gives a split disjoint from another run's (e.g. STS is fitted on prompts
    the acceptance run never decoded, then scored on the acceptance run's rounds).
    """
    from dspark_sglang.data.evalsets import load_eval_set

    if num_prompts < 1:
        raise ValueError(f"num_prompts must be >= 1, got {num_prompts}")
    if skip < 0:
        raise ValueError(f"skip must be >= 0, got {skip}")
    out: dict[str, list[list[int]]] = {}
    for name in names:
        prompts = load_eval_set(name, cache_dir=cache_dir, limit=skip + num_prompts)[skip:]
        if not prompts:
            raise ValueError(
                f"eval set {name!r} has no prompts after skipping {skip}; lower --skip-prompts"
            )
        out[name] = [target.encode_chat(p.chat()) for p in prompts]
    return out


@dataclass(frozen=True)
class PromptFile:
    """An eval set read from the user's chat JSONL (``bench acceptance --prompts NAME=FILE``).

    ``prompts`` are the token ids of the file's prompts ``skip .. skip + num_prompts - 1``
    that fit; ``rows`` counts the rows read (stopping after the last prompt needed),
    ``skipped``/``examples`` the rows and prompts left out and why (``chat_jsonl.SkipLog``);
    ``size``/``sha256`` identify the file in the result's metadata.
    """

    name: str
    path: Path
    prompts: tuple[tuple[int, ...], ...]
    rows: int
    skip: int
    skipped: Mapping[str, int]
    examples: tuple[str, ...]
    size: int
    sha256: str

    def summary(self) -> str:
        """One line, ``--prompts NAME: FILE: R rows -> P prompts`` and the skips below it."""
        from dspark_sglang.data.chat_jsonl import skip_lines

        after = f" after the first {self.skip}" if self.skip else ""
        line = f"--prompts {self.name}: {self.path}: {self.rows} rows -> "
        line += f"{len(self.prompts)} prompts{after}"
        return line + skip_lines(self.skipped, self.examples, "  ")

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "bytes": self.size,
            "sha256": self.sha256,
            "rows": self.rows,
            "prompts": len(self.prompts),
            "skipped": dict(self.skipped),
        }


def load_prompt_file(
    target: HFTarget,
    name: str,
    path: str | Path,
    num_prompts: int,
    max_new_tokens: int,
    *,
    skip: int = 0,
    max_examples: int = 5,
) -> PromptFile:
    """Prompts ``skip .. skip + num_prompts - 1`` of a chat JSONL file, through the chat template.

    The file is read as the training data stage reads one (``data.chat_jsonl``): each
    assistant turn of a row is one prompt, the conversation before it, and a row ending
    with a user turn one more; a bad row gives none and is counted. Prompts are numbered
    in file order, so runs with disjoint ``skip`` ranges decode disjoint prompts: a
    prompt of the range that the chat template refuses (``template_error``) or that
    leaves fewer than ``max_new_tokens`` positions of the target's context
    (``over_context``) is counted and left out, not replaced. Raises ``ValueError``
    naming ``--prompts NAME``, the file and the fix when no prompt is left.
    """
    from dspark_sglang.data.chat_jsonl import (
        SkipLog,
        encode_or_skip,
        no_usable_prompt,
        read_chat_rows,
    )

    if num_prompts < 1:
        raise ValueError(f"num_prompts must be >= 1, got {num_prompts}")
    if skip < 0:
        raise ValueError(f"skip must be >= 0, got {skip}")
    path = Path(path)
    source = f"--prompts {name}"
    if not path.is_file():
        raise FileNotFoundError(
            f"{source}: {path} not found; give an existing chat JSONL file (.jsonl or "
            ".jsonl.gz, OpenAI messages or ShareGPT conversations rows)"
        )
    context = target.spec.max_position_embeddings
    max_tokens = context - max_new_tokens
    limit = f"the target's context {context} - --max-new-tokens {max_new_tokens}"
    log, out, rows, seen = SkipLog(max_examples), [], 0, 0
    for row in read_chat_rows(path, log):
        rows += 1
        for k, p in enumerate(row.prompts("chat"), start=1):
            seen += 1
            if seen <= skip:
                continue
            where = f"{row.where} reply {k}"
            ids = encode_or_skip(
                p, where, target.encode_chat, log, max_tokens, too_long="over_context", limit=limit
            )
            if ids is not None:
                out.append(tuple(ids))
            if seen >= skip + num_prompts:
                break
        if seen >= skip + num_prompts:
            break
    rows += log.rows
    if not out and seen <= skip and rows > log.rows:
        raise ValueError(
            f"{source}: {path} has {seen} prompts ({rows} rows), none after skipping {skip}; "
            "lower --skip-prompts or give a file with more conversations"
        )
    if not out:
        raise no_usable_prompt(source, path, rows, log)
    return PromptFile(
        name=name,
        path=path,
        prompts=tuple(out),
        rows=rows,
        skip=skip,
        skipped=dict(log.counts),
        examples=tuple(log.examples),
        size=path.stat().st_size,
        sha256=sha256_file(path),
    )


# --------------------------------------------------------------------------- results


def _nan_to_none(xs: Sequence[float]) -> list[float | None]:
    return [None if not math.isfinite(x) else float(x) for x in xs]


def _influence(accepted: Sequence[Sequence[int]]) -> tuple[float, torch.Tensor]:
    """``(L, u)``: tokens per round and each request's ``u_i = (s_i - L n_i) / sum n``."""
    s = torch.tensor([sum(a + 1 for a in r) for r in accepted], dtype=torch.float64)
    n = torch.tensor([len(r) for r in accepted], dtype=torch.float64)
    total = float(n.sum())
    if total == 0:
        return float("nan"), torch.full_like(s, float("nan"))
    mean = float(s.sum()) / total
    return mean, (s - mean * n) / total


def accept_length_stats(accepted: Sequence[Sequence[int]]) -> tuple[float, float]:
    """``(L, stderr)`` of tokens per round from per-request accepted counts (module docstring)."""
    mean, u = _influence(accepted)
    r = len(accepted)
    if r < 2 or not math.isfinite(mean):
        return mean, float("nan")
    return mean, math.sqrt(r / (r - 1) * float((u * u).sum()))


def paired_covariance(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]]) -> float:
    """Covariance of two drafters' ``L`` estimates run on the same requests, in order.

    Requests are the independent units, and request ``i`` is the same prompt for both,
    so the two estimates co-vary through it (a prompt easy for one is easy for the other).
    """
    if len(a) != len(b):
        raise ValueError(f"paired_covariance: {len(a)} vs {len(b)} requests; pair by request")
    r = len(a)
    if r < 2:
        return float("nan")
    (_, ua), (_, ub) = _influence(a), _influence(b)
    return r / (r - 1) * float((ua * ub).sum())


def ratio_gain_stderr(a: float, b: float, var_a: float, var_b: float, cov: float) -> float:
    """Standard error, in %, of ``100 * (a / b - 1)`` by the delta method (module docstring)."""
    var = var_a / b**2 + a**2 * var_b / b**4 - 2.0 * a * cov / b**3
    return 100.0 * math.sqrt(max(var, 0.0)) if math.isfinite(var) else float("nan")


@dataclass(frozen=True)
class CellResult:
    """One drafter on one domain. ``accepted[i]``: accepted drafts per round of request ``i``.

    ``confidence_logits[i]`` (``[rounds_i, B]`` raw, pre-STS) is kept in memory for
    traces/rollouts only; ``None`` for drafters without a confidence head.
    """

    drafter: str
    domain: str
    block_size: int
    accepted: tuple[tuple[int, ...], ...]
    position_reached: tuple[int, ...]
    position_accepted: tuple[int, ...]
    num_tokens: int
    wall_time_s: float
    target_forwards: int
    confidence_logits: tuple[torch.Tensor, ...] | None = field(
        default=None, repr=False, compare=False
    )
    copies_reached: int = 0
    copies_accepted: int = 0

    def __post_init__(self) -> None:
        b = self.block_size
        if len(self.position_reached) != b or len(self.position_accepted) != b:
            raise ValueError(f"CellResult: position counts must have block_size={b} entries")
        if any(not 0 <= a <= b for r in self.accepted for a in r):
            raise ValueError(f"CellResult: accepted counts must lie in 0..{b}")

    @property
    def num_requests(self) -> int:
        return len(self.accepted)

    @property
    def num_rounds(self) -> int:
        return sum(len(r) for r in self.accepted)

    @property
    def accept_length(self) -> float:
        return accept_length_stats(self.accepted)[0]

    @property
    def accept_length_stderr(self) -> float:
        return accept_length_stats(self.accepted)[1]

    @property
    def position_acceptance(self) -> list[float]:
        """Conditional acceptance per position (NaN where never reached)."""
        return [
            a / r if r > 0 else float("nan")
            for a, r in zip(self.position_accepted, self.position_reached, strict=True)
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "accept_length": self.accept_length,
            "accept_length_stderr": _nan_to_none([self.accept_length_stderr])[0],
            "num_requests": self.num_requests,
            "num_rounds": self.num_rounds,
            "num_tokens": self.num_tokens,
            "wall_time_s": self.wall_time_s,
            "target_forwards": self.target_forwards,
            "position_acceptance": _nan_to_none(self.position_acceptance),
            "position_reached": list(self.position_reached),
            "position_accepted": list(self.position_accepted),
            "accepted_per_round": [list(r) for r in self.accepted],
            "copies_reached": self.copies_reached,
            "copies_accepted": self.copies_accepted,
        }


@dataclass(frozen=True)
class AcceptanceReport:
    """All cells of one benchmark run, ``cells[drafter][domain]``, in the given orders."""

    drafters: tuple[str, ...]
    domains: tuple[str, ...]
    cells: Mapping[str, Mapping[str, CellResult]]
    num_prompts: int
    max_new_tokens: int
    seed: int
    temperature: float = 1.0
    policy: str = "verify_all"
    #: Drafters run with context copies: name -> n-gram (absent: none).
    context_copy: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for d in self.drafters:
            missing = [x for x in self.domains if x not in self.cells.get(d, {})]
            if missing:
                raise ValueError(f"AcceptanceReport: drafter {d!r} has no result for {missing}")

    def macro(self, drafter: str) -> tuple[float, float]:
        """``(mean over domains of L, its stderr)`` for one drafter."""
        cells = [self.cells[drafter][d] for d in self.domains]
        mean = sum(c.accept_length for c in cells) / len(cells)
        se = math.sqrt(sum(c.accept_length_stderr**2 for c in cells)) / len(cells)
        return mean, se

    def pooled_position_acceptance(self, drafter: str) -> list[float]:
        """Conditional acceptance per position over all domains' rounds of one drafter."""
        cells = [self.cells[drafter][d] for d in self.domains]
        reached = [sum(c.position_reached[k] for c in cells) for k in range(cells[0].block_size)]
        acc = [sum(c.position_accepted[k] for c in cells) for k in range(cells[0].block_size)]
        return [a / r if r > 0 else float("nan") for a, r in zip(acc, reached, strict=True)]

    def _lengths(self, better: str, base: str, domain: str | None) -> tuple[float, float]:
        """The two accepted lengths a gain compares: one domain's, or macro (``None``)."""
        if domain is None:
            return self.macro(better)[0], self.macro(base)[0]
        return self.cells[better][domain].accept_length, self.cells[base][domain].accept_length

    def gain(self, better: str, base: str, domain: str | None = None) -> float:
        """Relative gain of ``better`` over ``base`` in %, per domain or macro (``None``)."""
        a, b = self._lengths(better, base, domain)
        return 100.0 * (a / b - 1.0)

    def gain_stderr(self, better: str, base: str, domain: str | None = None) -> float:
        """Standard error of :meth:`gain`, in %, pairing the two drafters by request."""
        domains = self.domains if domain is None else (domain,)
        k = len(domains)
        va = vb = cov = 0.0
        for d in domains:
            ca, cb = self.cells[better][d], self.cells[base][d]
            va += ca.accept_length_stderr**2 / k**2
            vb += cb.accept_length_stderr**2 / k**2
            cov += paired_covariance(ca.accepted, cb.accepted) / k**2
        return ratio_gain_stderr(*self._lengths(better, base, domain), va, vb, cov)

    def gains(self) -> dict[str, dict[str, dict[str, float]]]:
        """``gains[a][b][domain or 'macro']`` for every ordered pair of distinct drafters."""
        return {
            a: {
                b: {
                    **{d: self.gain(a, b, d) for d in self.domains},
                    "macro": self.gain(a, b),
                }
                for b in self.drafters
                if b != a
            }
            for a in self.drafters
        }

    def to_dict(self) -> dict[str, Any]:
        """The figures as JSON-ready data (NaN written as null)."""

        def clean(x: float) -> float | None:
            return _nan_to_none([x])[0]

        gains = self.gains()
        return {
            "settings": {
                "num_prompts": self.num_prompts,
                "max_new_tokens": self.max_new_tokens,
                "seed": self.seed,
                "temperature": self.temperature,
                "policy": self.policy,
                "bonus_token_included": True,
                "context_copy_ngram": {d: self.context_copy.get(d, 0) for d in self.drafters},
            },
            "drafters": list(self.drafters),
            "domains": list(self.domains),
            "results": {
                d: {dom: self.cells[d][dom].to_dict() for dom in self.domains}
                for d in self.drafters
            },
            "macro": {
                d: {"accept_length": clean(self.macro(d)[0]), "stderr": clean(self.macro(d)[1])}
                for d in self.drafters
            },
            "position_acceptance_pooled": {
                d: _nan_to_none(self.pooled_position_acceptance(d)) for d in self.drafters
            },
            "gains_percent": {
                a: {b: {k: clean(v) for k, v in row.items()} for b, row in cols.items()}
                for a, cols in gains.items()
            },
            "gains_stderr_percent": {
                a: {
                    b: {
                        **{d: clean(self.gain_stderr(a, b, d)) for d in self.domains},
                        "macro": clean(self.gain_stderr(a, b)),
                    }
                    for b in cols
                }
                for a, cols in gains.items()
            },
        }


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


# --------------------------------------------------------------------------- outputs


def write_report_json(
    path: str | Path, report: AcceptanceReport, metadata: Mapping[str, Any]
) -> Path:
    """``metadata`` (command settings, versions, checkpoints, date) + ``report.to_dict()``."""
    body = {"benchmark": "acceptance", **dict(metadata), **report.to_dict()}
    return dump_json(path, body, allow_nan=False)


def write_traces(report: AcceptanceReport, traces_dir: str | Path) -> list[Path]:
    """Per drafter with a confidence head and domain: planner traces and STS rollouts.

    ``DIR/<drafter>/<domain>.jsonl`` (``planning.traces`` format) and
    ``DIR/<drafter>/rollouts_<domain>.jsonl`` (``calibration.rollouts`` format,
    ``verified = B``). ``accepted`` is exact: every round verified all ``B`` drafts.
    Request ids are the prompt's index in its eval set (unique per file). Cells
    without any round (every request ended at its first token) are skipped, and so are
    drafters run with context copies (their confidences scored drafts that copies
    replaced, so their rounds would mislead a calibration).
    """
    from dspark_sglang.calibration.rollouts import Rollouts, save_rollouts
    from dspark_sglang.planning.traces import AcceptanceTraces, save_traces

    written: list[Path] = []
    root = Path(traces_dir)
    for name in report.drafters:
        if report.context_copy.get(name, 0):
            continue
        for dom in report.domains:
            cell = report.cells[name][dom]
            if cell.confidence_logits is None or cell.num_rounds == 0:
                continue
            z = torch.cat([t.reshape(-1, cell.block_size) for t in cell.confidence_logits]).float()
            acc = torch.tensor([a for r in cell.accepted for a in r], dtype=torch.int64)
            counts = torch.tensor([len(r) for r in cell.accepted], dtype=torch.int64)
            if z.shape[0] != acc.numel():
                raise ValueError(
                    f"{name}/{dom}: {z.shape[0]} confidence rows for {acc.numel()} rounds"
                )
            rid = torch.repeat_interleave(torch.arange(cell.num_requests), counts)
            folder = root / name
            folder.mkdir(parents=True, exist_ok=True)
            traces = AcceptanceTraces(
                request_id=rid,
                domain_index=torch.zeros_like(rid),
                domains=(dom,),
                confidence_logits=z,
                accepted=acc,
            )
            save_traces(traces, folder / f"{dom}.jsonl")
            rollouts = Rollouts(z, acc, torch.full_like(acc, cell.block_size))
            save_rollouts(folder / f"rollouts_{dom}.jsonl", rollouts)
            written += [folder / f"{dom}.jsonl", folder / f"rollouts_{dom}.jsonl"]
    return written
