"""Request length distributions for the serving simulator.

Throughput and per-user speed depend on how long requests are: prompt length sets the
prefill load, output length how many decode rounds a request occupies a batch slot.
The simulator draws ``(prompt, output)`` *pairs* from recorded data (so their
correlation is kept) instead of assuming fixed lengths.

Default (no tokenizer at hand): GSM8K train problems (shipped with the package,
``dspark_sglang.data.evalsets.gsm8k_train_path``) with token counts approximated as
``ceil(characters / 4)``; the answer's calculator annotations ``<<...>>`` are stripped
since a model never generates them. These are the *reference* answers, not the target's
own responses, so outputs are shorter than a chat model's; pass lengths measured from
real target generations (``load_lengths``) when you have them.
"""

from __future__ import annotations

import gzip
import math
import re
from dataclasses import dataclass
from pathlib import Path

import msgspec
import torch

from dspark_sglang.data.evalsets import gsm8k_train_path

__all__ = [
    "LengthDistribution",
    "default_lengths",
    "gsm8k_lengths",
    "gsm8k_path",
    "load_lengths",
]

_CHARS_PER_TOKEN = 4
_CALC_ANNOTATION = re.compile(r"<<[^>]*>>")


@dataclass(frozen=True)
class LengthDistribution:
    """Empirical joint distribution of (prompt tokens, output tokens), one pair per request.

    Fields:
        prompt_tokens: prompt length of each recorded request, each >= 1.
        output_tokens: tokens generated for that request, each >= 1, same count.
        source: where the pairs came from (shown in reports).
    """

    prompt_tokens: tuple[int, ...]
    output_tokens: tuple[int, ...]
    source: str = ""

    def __post_init__(self) -> None:
        p, o = self.prompt_tokens, self.output_tokens
        if len(p) == 0 or len(p) != len(o):
            raise ValueError(
                "LengthDistribution needs the same non-zero number of prompt_tokens and "
                f"output_tokens (one pair per request), got {len(p)} and {len(o)}"
            )
        for name, vals in (("prompt_tokens", p), ("output_tokens", o)):
            bad = [v for v in vals if isinstance(v, bool) or not isinstance(v, int) or v < 1]
            if bad:
                raise ValueError(
                    f"LengthDistribution.{name} must be integers >= 1, got e.g. {bad[0]!r}"
                )

    def __len__(self) -> int:
        return len(self.prompt_tokens)

    def sample(self, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``n`` pairs drawn with replacement: ``(prompt [n], output [n])`` int64."""
        idx = torch.randint(len(self), (n,), generator=generator)
        return (
            torch.tensor(self.prompt_tokens, dtype=torch.int64)[idx],
            torch.tensor(self.output_tokens, dtype=torch.int64)[idx],
        )

    def mean_output(self) -> float:
        return sum(self.output_tokens) / len(self)


def gsm8k_path() -> Path:
    """The GSM8K train split the package ships (``.jsonl.gz``)."""
    return gsm8k_train_path()


class _Gsm8kRow(msgspec.Struct):
    question: str
    answer: str


def gsm8k_lengths(path: str | Path | None = None) -> LengthDistribution:
    """All GSM8K train problems as ``(ceil(len(question)/4), ceil(len(answer)/4))`` pairs."""
    p = Path(path) if path is not None else gsm8k_path()
    decoder = msgspec.json.Decoder(_Gsm8kRow)
    prompts: list[int] = []
    outputs: list[int] = []
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = decoder.decode(line)
            except msgspec.DecodeError as exc:
                raise ValueError(f"{p}:{lineno}: not a GSM8K row ({exc})") from exc
            answer = _CALC_ANNOTATION.sub("", row.answer)
            prompts.append(max(1, math.ceil(len(row.question) / _CHARS_PER_TOKEN)))
            outputs.append(max(1, math.ceil(len(answer) / _CHARS_PER_TOKEN)))
    return LengthDistribution(tuple(prompts), tuple(outputs), f"gsm8k-train chars/4 ({p.name})")


def default_lengths() -> LengthDistribution:
    """GSM8K train lengths (chars/4) from the split the package ships."""
    return gsm8k_lengths(gsm8k_path())


class _LengthRow(msgspec.Struct, forbid_unknown_fields=True):
    prompt_tokens: int
    output_tokens: int


def load_lengths(path: str | Path) -> LengthDistribution:
    """``.jsonl`` of ``{"prompt_tokens": int, "output_tokens": int}``, one request a line."""
    p = Path(path)
    decoder = msgspec.json.Decoder(_LengthRow)
    rows: list[_LengthRow] = []
    try:
        with p.open("rb") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    try:
                        rows.append(decoder.decode(line))
                    except msgspec.DecodeError as exc:
                        raise ValueError(f"{p}:{lineno}: {exc}") from exc
    except OSError as exc:
        raise ValueError(f"cannot read length file {p}: {exc}") from exc
    try:
        return LengthDistribution(
            tuple(r.prompt_tokens for r in rows), tuple(r.output_tokens for r in rows), str(p)
        )
    except ValueError as exc:
        raise ValueError(f"{p}: {exc}") from exc
