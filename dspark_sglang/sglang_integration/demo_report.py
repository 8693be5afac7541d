"""What the demo prints: each engine's figures and the greedy verdict (``demo.py`` runs them).

``EngineRun`` holds what one engine produced for the demo prompts and how fast;
``report`` prints plain decoding's figures and every DSPARK_MOE engine's beside them
(tokens/s, ratio to plain decoding, SGLang's accepted length per round) and decides
the greedy check per engine: token-identical to plain decoding, or every first
divergence a numerical near-tie in the engines' dtype (``greedy_check``); plain
decoding's timed passes must repeat exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dspark_sglang.sglang_integration.greedy_check import (
    TopTokens,
    find_divergences,
    near_tie_tolerance,
    summarize_margins,
)

__all__ = ["EngineRun", "report"]


@dataclass(frozen=True)
class EngineRun:
    """What one engine produced for the demo prompts, and how fast."""

    label: str
    outputs: tuple[tuple[int, ...], ...]
    wall_s: float
    #: SGLang's per-request ``spec_verify_ct`` summed (0 without speculation).
    verify_rounds: int
    #: SGLang's per-request ``spec_num_correct_drafts`` summed.
    correct_drafts: int
    #: Sum over requests of SGLang's ``spec_correct_drafts_histogram`` (steps that
    #: accepted exactly k drafts), empty without speculation.
    accepted_histogram: tuple[int, ...]
    #: The target's best tokens at every token of every output (``target_top_tokens``);
    #: empty where they were not computed.
    top_tokens: tuple[tuple[TopTokens | None, ...], ...] = ()
    #: Wall time of every timed pass (``wall_s`` is their median); empty for one pass.
    pass_walls: tuple[float, ...] = ()
    #: Outputs of the timed passes after the first that differed from the first's.
    differing_outputs: tuple[tuple[tuple[int, ...], ...], ...] = ()

    @property
    def differing_passes(self) -> int:
        """Timed passes after the first whose outputs differed from the first's."""
        return len(self.differing_outputs)

    @property
    def num_tokens(self) -> int:
        return sum(len(o) for o in self.outputs)

    @property
    def tokens_per_second(self) -> float:
        return self.num_tokens / self.wall_s if self.wall_s > 0 else math.nan

    def pass_tokens_per_second(self) -> tuple[float, ...]:
        """Tokens/s of every timed pass (the one ``wall_s`` when only one was timed)."""
        walls = self.pass_walls or (self.wall_s,)
        return tuple(self.num_tokens / w if w > 0 else math.nan for w in walls)

    @property
    def accept_length(self) -> float:
        """SGLang's accepted length per round: completion tokens / verify rounds (incl. bonus)."""
        return self.num_tokens / self.verify_rounds if self.verify_rounds else math.nan

    @classmethod
    def from_outputs(
        cls,
        label: str,
        outputs: Sequence[dict[str, Any]],
        wall_s: float,
        top_tokens: tuple[tuple[TopTokens | None, ...], ...] = (),
        pass_walls: Sequence[float] = (),
        differing_outputs: Sequence[Sequence[Sequence[int]]] = (),
    ) -> EngineRun:
        """Aggregate SGLang's output dicts (``output_ids`` + ``meta_info``) of one pass."""
        verify = correct = 0
        hist: list[int] = []
        for o in outputs:
            meta = o.get("meta_info", {})
            verify += int(meta.get("spec_verify_ct", 0))
            correct += int(meta.get("spec_num_correct_drafts", 0))
            h = [int(x) for x in meta.get("spec_correct_drafts_histogram", None) or []]
            hist += [0] * (len(h) - len(hist))
            for k, n in enumerate(h):
                hist[k] += n
        return cls(
            label=label,
            outputs=tuple(tuple(int(t) for t in o["output_ids"]) for o in outputs),
            wall_s=wall_s,
            verify_rounds=verify,
            correct_drafts=correct,
            accepted_histogram=tuple(hist),
            top_tokens=top_tokens,
            pass_walls=tuple(float(w) for w in pass_walls),
            differing_outputs=tuple(
                tuple(tuple(int(t) for t in o) for o in run) for run in differing_outputs
            ),
        )


def _fmt(x: float, digits: int = 2) -> str:
    return "-" if x != x else f"{x:.{digits}f}"


def report(console: Any, plain: EngineRun, specs: Sequence[EngineRun], dtype: str) -> bool:
    """Print the figures of every engine; returns whether every greedy check passed.

    ``specs`` are the DSPARK_MOE engines, the one the report leads with first. Each passes
    when its outputs are token-identical to plain decoding's or every prompt's first
    divergence is a numerical near-tie in ``dtype`` (``greedy_check``), which is printed
    loudly. ``plain.top_tokens`` holds the target's best tokens along the plain outputs.
    """
    from rich.table import Table

    table = Table(title="SGLang engine on CPU, greedy: plain decoding vs DSPARK_MOE")
    for col in ("engine", "tokens", "wall s", "tok/s", "x plain", "rounds", "tokens/round"):
        table.add_column(col, justify="left" if col == "engine" else "right", no_wrap=True)
    for run in (plain, *specs):
        table.add_row(
            run.label,
            str(run.num_tokens),
            _fmt(run.wall_s),
            _fmt(run.tokens_per_second),
            _fmt(run.tokens_per_second / plain.tokens_per_second, 3),
            str(run.verify_rounds) if run.verify_rounds else "-",
            _fmt(run.accept_length) if run.verify_rounds else "1.00",
        )
    console.print(table)
    for run in (plain, *specs):
        line = (
            f"{run.label}: {run.num_tokens} tokens in {run.wall_s:.3f} s = "
            f"{run.tokens_per_second:.2f} tok/s"
        )
        if run.pass_walls:
            tps = run.pass_tokens_per_second()
            line += (
                f" (median of {len(tps)} timed passes; passes {min(tps):.2f}-{max(tps):.2f} tok/s)"
            )
        console.print(line, soft_wrap=True, highlight=False)
    for spec in specs:
        ratio = spec.tokens_per_second / plain.tokens_per_second
        console.print(
            f"speed ratio {spec.label} / plain: {ratio:.3f}x", soft_wrap=True, highlight=False
        )
    tops = plain.top_tokens or tuple(() for _ in plain.outputs)
    passed = _check_repeats(console, plain, plain, tops, dtype)
    for spec in specs:
        console.print(
            f"{spec.label}: accepted length per round (SGLang, incl. bonus): "
            f"{_fmt(spec.accept_length, 3)} over {spec.verify_rounds} verify rounds, "
            f"{spec.correct_drafts} drafts accepted",
            soft_wrap=True,
            highlight=False,
        )
        if spec.accepted_histogram:
            hist = ", ".join(f"{k}:{n}" for k, n in enumerate(spec.accepted_histogram))
            console.print(
                f"{spec.label}: rounds by drafts accepted (k:rounds): {hist}",
                soft_wrap=True,
                highlight=False,
            )
        same = [a == b for a, b in zip(plain.outputs, spec.outputs, strict=True)]
        divergences = find_divergences(plain.outputs, spec.outputs, tops, dtype)
        ok = all(d.near_tie for d in divergences) and _check_repeats(
            console, plain, spec, tops, dtype
        )
        style = "bold green" if all(same) else "bold yellow" if ok else "bold red"
        console.print(
            f"[{style}]{spec.label}: identical output at temperature 0: "
            f"{sum(same)}/{len(same)} prompts[/]",
            soft_wrap=True,
        )
        for d in divergences:
            style = "bold yellow" if d.near_tie else "bold red"
            kind = "NEAR-TIE" if d.near_tie else "MISMATCH"
            console.print(
                f"[{style}]{spec.label}: {kind}: {d.describe()}[/]", soft_wrap=True, highlight=False
            )
        passed = passed and ok
    summary = summarize_margins(plain.outputs, tops)
    if summary.smallest is not None:
        margin, i, j = summary.smallest
        console.print(
            f"target top-2 margins ({dtype}, from the plain engine): {summary.positions} of "
            f"{plain.num_tokens} plain tokens, {summary.ranked_first} of them the target's first "
            f"choice; smallest margin {margin:.3g} (prompt {i}, token {j}), near-tie tolerance "
            f"{near_tie_tolerance(dtype):g}",
            soft_wrap=True,
            highlight=False,
        )
    return passed


def _check_repeats(
    console: Any,
    plain: EngineRun,
    run: EngineRun,
    tops: Sequence[Sequence[TopTokens | None]],
    dtype: str,
) -> bool:
    """Whether ``run``'s later timed passes are acceptable; prints why not.

    Plain decoding must repeat itself exactly. A speculative engine's later pass may verify
    other lengths than its first (a policy that prices rounds from their timings), which
    rounds differently: it passes when it, too, differs from plain decoding only at near-ties.
    """
    if not run.differing_passes:
        return True
    later = [find_divergences(plain.outputs, o, tops, dtype) for o in run.differing_outputs]
    counted = f"{run.differing_passes} of {len(run.pass_walls) - 1} later timed passes"
    if run is not plain and all(d.near_tie for ds in later for d in ds):
        console.print(
            f"[bold yellow]{run.label}: {counted} gave other outputs than the first, each "
            "differing from plain decoding only at numerical near-ties (the verify lengths "
            "changed between passes, and with them the rounding)[/]",
            soft_wrap=True,
        )
        return True
    console.print(
        f"[bold red]{run.label}: {counted} gave other outputs than the first (greedy "
        "decoding must repeat itself"
        + ("" if run is plain else ", up to near-ties with plain decoding")
        + ")[/]",
        soft_wrap=True,
    )
    for ds in later:
        for d in ds:
            if not d.near_tie:
                console.print(
                    f"[bold red]{run.label}: MISMATCH (later pass): {d.describe()}[/]",
                    soft_wrap=True,
                    highlight=False,
                )
    return False
