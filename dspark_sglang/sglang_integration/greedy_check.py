"""Greedy identity of plain vs speculative output, with an honest account of rounding.

Greedy verification is lossless in exact arithmetic: every token the
speculative engine emits is the target's argmax given the same prefix, so its
output must equal plain decoding token for token. In floating point the two
runs compute the target's logits in different shapes (plain decoding runs one
row per request and step; verification runs ``gamma + 1`` rows at once), so
reductions are ordered differently and the logits differ in their last bits.
Where the target's two best tokens are closer than that rounding, the argmax
may legitimately flip, and from there on the outputs differ.

So identity stays a hard check, with one exception that is printed loudly: at
the first position where a prompt's two outputs differ, the check looks up the
target's ``TOP_TOKENS`` most likely tokens there with their log-probabilities
(computed by the plain engine on the common prefix; a log-probability
difference equals the logit difference). The divergence is a *numerical
near-tie* only when both emitted tokens are among them and each is within
``NEAR_TIE_TOLERANCE[dtype]`` of the best one; anything else (a token further
below the best or not listed, an output that ends early, candidates that were
not computed) is a speculation bug. With the emitted tokens being the target's
top two this is "their margin is within the tolerance"; looking further than
two matters in bfloat16, whose logits come in steps of 0.125 near their usual
magnitude, so three tokens within one step of each other occur, and either
engine may then emit the third by the other's ranking.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "NEAR_TIE_TOLERANCE",
    "TOP_TOKENS",
    "Divergence",
    "MarginSummary",
    "TopTokens",
    "find_divergences",
    "first_difference",
    "near_tie_tolerance",
    "summarize_margins",
    "top_tokens_from_sglang",
]

NEAR_TIE_TOLERANCE: Mapping[str, float] = {
    "float32": 1e-3,
    "bfloat16": 0.5,
}
"""Largest logit gap below the best token that rounding alone may bridge, per engine dtype.

Both are far below the margin of a typical confident token (several logits),
so a real bug that picks a wrong token is rarely excused; the near-tie rule
also requires both emitted tokens to be among the target's ``TOP_TOKENS`` best.

float32 (unit roundoff 2**-24, about 6e-8): reordered reductions move the
logits in their last bits. In SGLang's CPU engine on SmolLM2-135M, the top-2
margins from decoding and from a prefill over the same tokens differed by at
most 3e-5 on an 8-token answer; 1e-3 leaves about 30 times that.

bfloat16 (8 significant bits, eps 2**-7): at a logit magnitude of 16-32
(top logits of language models usually lie between about 10 and 30) one ulp
is 0.125; rounding the logits alone can separate two computations by an ulp,
and the hidden states feeding them carry errors of a few ulps after many
layers. In the same engine in bfloat16, decoding and prefill margins differed
by up to 0.125 (one ulp) on the same 8-token answer. 0.5 is four ulps at
magnitude 16.
"""


def near_tie_tolerance(dtype: str) -> float:
    """``NEAR_TIE_TOLERANCE[dtype]``; a ``ValueError`` naming the known dtypes otherwise."""
    try:
        return NEAR_TIE_TOLERANCE[dtype]
    except KeyError:
        raise ValueError(
            f"no near-tie tolerance for dtype {dtype!r}; known: {sorted(NEAR_TIE_TOLERANCE)}"
        ) from None


#: Candidates per position the near-tie check asks the target for (best first).
TOP_TOKENS = 5


@dataclass(frozen=True)
class TopTokens:
    """The target's most likely tokens at one position, best first, with their log-probabilities."""

    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.tokens) < 2 or len(self.tokens) != len(self.logprobs):
            raise ValueError(
                f"TopTokens needs at least two tokens with one log-probability each, got "
                f"{len(self.tokens)} tokens and {len(self.logprobs)} log-probabilities"
            )
        if not all(math.isfinite(x) for x in self.logprobs):
            raise ValueError(f"TopTokens.logprobs must be finite, got {self.logprobs}")
        if any(a < b for a, b in zip(self.logprobs, self.logprobs[1:], strict=False)):
            raise ValueError(f"TopTokens.logprobs must be best first, got {self.logprobs}")

    @property
    def margin(self) -> float:
        """Logit margin between the best two (equal to the log-probability difference)."""
        return self.logprobs[0] - self.logprobs[1]

    def gap(self, token: int) -> float | None:
        """How many logits ``token`` lies below the best; None when it is not listed."""
        for t, lp in zip(self.tokens, self.logprobs, strict=True):
            if t == token:
                return self.logprobs[0] - lp
        return None


def top_tokens_from_sglang(entries: Sequence[Any], where: str) -> tuple[TopTokens | None, ...]:
    """SGLang's ``input_top_logprobs`` / ``output_top_logprobs`` list as ``TopTokens`` per position.

    Each entry is a list of ``(logprob, token_id, text)`` tuples, best first, or
    None (SGLang gives none for a position without a preceding token); such a
    position, or one with fewer than two candidates, becomes None.
    """
    out: list[TopTokens | None] = []
    for i, entry in enumerate(entries):
        if not entry or len(entry) < 2:
            out.append(None)
            continue
        try:
            pairs = [(float(lp), int(t)) for lp, t, *_ in entry]
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"{where}[{i}]: expected (logprob, token_id, text) tuples, got {entry!r}"
            ) from exc
        out.append(TopTokens(tuple(t for _, t in pairs), tuple(lp for lp, _ in pairs)))
    return tuple(out)


@dataclass(frozen=True)
class Divergence:
    """Where one prompt's plain and speculative outputs first differ."""

    prompt: int
    position: int
    #: The token each engine emitted there; None where that output had already ended.
    plain_token: int | None
    spec_token: int | None
    #: The target's best tokens at that position (None where they were not computed).
    top_tokens: TopTokens | None
    dtype: str
    tolerance: float
    #: The speculative engine's name in messages.
    spec_label: str = "DSPARK_MOE"

    def _gaps(self) -> tuple[float | None, float | None]:
        t = self.top_tokens
        if t is None or self.plain_token is None or self.spec_token is None:
            return None, None
        return t.gap(self.plain_token), t.gap(self.spec_token)

    @property
    def near_tie(self) -> bool:
        """Both tokens are among the target's best and each is within ``tolerance`` of the best."""
        gaps = self._gaps()
        return all(g is not None and g <= self.tolerance for g in gaps)

    def describe(self) -> str:
        """One line: where, which tokens, how far each is below the best, and the verdict."""

        def tok(t: int | None) -> str:
            return "end of output" if t is None else str(t)

        head = (
            f"prompt {self.prompt}, token {self.position}: plain {tok(self.plain_token)} vs "
            f"{self.spec_label} {tok(self.spec_token)}; "
        )
        t = self.top_tokens
        if t is None:
            return head + "the target's best tokens there are unknown: counted as a failure"
        listed = ", ".join(
            f"{tk} ({t.logprobs[0] - lp:.3g} below)"
            for tk, lp in zip(t.tokens, t.logprobs, strict=True)
        )
        where = (
            f"target's best {len(t.tokens)}: {listed} "
            f"(near-tie tolerance {self.tolerance:g} for {self.dtype})"
        )
        if self.near_tie:
            return head + where + ": a numerical near-tie, not a speculation bug"
        if self.plain_token is None or self.spec_token is None:
            return head + where + ": one output ended early, a speculation bug"
        if None in self._gaps():
            return head + where + ": an emitted token is not among them, a speculation bug"
        return head + where + ": above the tolerance, a speculation bug"


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where ``a`` and ``b`` differ (a length too), None if equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def find_divergences(
    plain: Sequence[Sequence[int]],
    spec: Sequence[Sequence[int]],
    top_tokens: Sequence[Sequence[TopTokens | None]],
    dtype: str,
    spec_label: str = "DSPARK_MOE",
) -> list[Divergence]:
    """The first divergence of every prompt whose outputs differ, in prompt order.

    ``top_tokens[i][j]`` is the target's best tokens for token ``j`` of prompt ``i``'s
    plain output (given the prompt and the plain tokens before it, which are
    also the speculative tokens before the first divergence); positions past
    its end count as not computed.
    """
    if not len(plain) == len(spec) == len(top_tokens):
        raise ValueError(
            f"plain, speculative and top-two lists must have one entry per prompt, got "
            f"{len(plain)}, {len(spec)} and {len(top_tokens)}"
        )
    tol = near_tie_tolerance(dtype)
    found = []
    for i, (p, s, t) in enumerate(zip(plain, spec, top_tokens, strict=True)):
        j = first_difference(p, s)
        if j is None:
            continue
        found.append(
            Divergence(
                prompt=i,
                position=j,
                plain_token=p[j] if j < len(p) else None,
                spec_token=s[j] if j < len(s) else None,
                top_tokens=t[j] if j < len(t) else None,
                dtype=dtype,
                tolerance=tol,
                spec_label=spec_label,
            )
        )
    return found


@dataclass(frozen=True)
class MarginSummary:
    """How close to a tie a run's outputs came, and whether the margins line up with them."""

    #: Output tokens with known best tokens.
    positions: int
    #: Of those, the ones whose emitted token is the target's first choice. Every
    #: one is, up to near-ties, when the margins belong to the tokens they are
    #: listed for (a shift by one position would rank almost none first).
    ranked_first: int
    #: ``(margin, prompt, token)`` of the smallest margin; None without positions.
    smallest: tuple[float, int, int] | None


def summarize_margins(
    outputs: Sequence[Sequence[int]], top_tokens: Sequence[Sequence[TopTokens | None]]
) -> MarginSummary:
    """``MarginSummary`` of ``top_tokens[i][j]`` against token ``outputs[i][j]``."""
    positions = ranked_first = 0
    smallest: tuple[float, int, int] | None = None
    for i, (out, row) in enumerate(zip(outputs, top_tokens, strict=True)):
        for j, (tok, t) in enumerate(zip(out, row, strict=False)):
            if t is None:
                continue
            positions += 1
            ranked_first += t.tokens[0] == tok
            if smallest is None or t.margin < smallest[0]:
                smallest = (t.margin, i, j)
    return MarginSummary(positions, ranked_first, smallest)
