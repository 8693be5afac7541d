"""Request length distributions for the serving simulator.

Throughput and per-user speed depend on how long requests are: prompt length sets the
prefill load, output length how many decode rounds a request occupies a batch slot.
The simulator draws ``(prompt, output)`` *pairs* from recorded data (so their
correlation is kept) instead of assuming fixed lengths.

Default (no tokenizer at hand): GSM8K train problems (``../shared/data/gsm8k/train.jsonl``)
with token counts approximated as ``ceil(characters / 4)``; the answer's calculator
annotations ``<<...>>`` are stripped since a model never generates them. These are the
*reference* answers, not the target's own responses, so outputs are shorter than a chat
model's; pass lengths measured from real target generations (``load_lengths``) when
you have them. When the data file is not found, a fixed 256-pair random subsample of
it (embedded below, regenerated and checked against the file by the tests) is used.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import msgspec
import torch

__all__ = [
    "LengthDistribution",
    "default_lengths",
    "gsm8k_lengths",
    "gsm8k_path",
    "load_lengths",
]

_CHARS_PER_TOKEN = 4
_CALC_ANNOTATION = re.compile(r"<<[^>]*>>")
EMBEDDED_SAMPLE_SIZE = 256
EMBEDDED_SAMPLE_SEED = 0


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
    """``$DSPARK_SHARED_DIR/data/gsm8k/train.jsonl``, default ``<repo>/../shared/...``."""
    shared = os.environ.get("DSPARK_SHARED_DIR")
    root = Path(shared) if shared else Path(__file__).resolve().parents[3] / "shared"
    return root / "data" / "gsm8k" / "train.jsonl"


class _Gsm8kRow(msgspec.Struct):
    question: str
    answer: str


def gsm8k_lengths(path: str | Path | None = None) -> LengthDistribution:
    """All GSM8K train problems as ``(ceil(len(question)/4), ceil(len(answer)/4))`` pairs."""
    p = Path(path) if path is not None else gsm8k_path()
    decoder = msgspec.json.Decoder(_Gsm8kRow)
    prompts: list[int] = []
    outputs: list[int] = []
    with p.open("rb") as f:
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


def embedded_subsample(full: LengthDistribution) -> LengthDistribution:
    """The fixed random subsample that is embedded in this module (for the fallback)."""
    g = torch.Generator().manual_seed(EMBEDDED_SAMPLE_SEED)
    idx = torch.randperm(len(full), generator=g)[:EMBEDDED_SAMPLE_SIZE].tolist()
    return LengthDistribution(
        tuple(full.prompt_tokens[i] for i in idx),
        tuple(full.output_tokens[i] for i in idx),
        "gsm8k-train chars/4, embedded 256-pair subsample",
    )


def default_lengths() -> LengthDistribution:
    """GSM8K train lengths (chars/4) from the shared data file, else the embedded subsample."""
    p = gsm8k_path()
    if p.is_file():
        return gsm8k_lengths(p)
    return LengthDistribution(
        tuple(int(x) for x in "".join(_GSM8K_PROMPT_SAMPLE).split()),
        tuple(int(x) for x in "".join(_GSM8K_OUTPUT_SAMPLE).split()),
        "gsm8k-train chars/4, embedded 256-pair subsample",
    )


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


# fmt: off
_GSM8K_PROMPT_SAMPLE = (
    "45 111 57 103 61 27 51 19 66 101 107 46 31 97 40 49 59 25 39 38 45 39 83 71 47 43 97 29 62 "
    "37 50 78 72 55 59 77 71 64 49 28 80 117 247 44 126 102 81 59 44 49 50 50 68 86 54 54 80 43 "
    "48 92 57 23 72 77 63 114 49 53 50 51 62 36 57 39 84 33 68 50 86 26 67 28 36 44 45 55 92 35 "
    "77 47 95 74 49 40 57 81 33 114 77 47 64 102 115 96 39 47 97 135 56 49 53 83 125 65 68 81 "
    "34 47 47 42 69 45 40 113 40 70 55 33 51 67 55 35 41 44 59 27 101 31 34 49 66 50 57 43 66 "
    "70 119 94 57 48 58 98 112 59 87 79 62 41 69 57 45 76 34 52 61 29 57 39 58 60 28 56 45 46 "
    "62 57 55 57 62 57 46 46 73 75 33 42 40 55 49 42 55 98 41 53 68 69 58 61 123 56 32 35 31 "
    "125 75 74 40 63 45 49 91 53 62 72 43 30 87 53 85 122 44 114 43 32 78 32 83 63 102 48 74 98 "
    "58 62 71 40 65 29 105 88 66 47 57 55 40 52 69 59 25 51 41 91 41 48 62 84 "
)
_GSM8K_OUTPUT_SAMPLE = (
    "67 87 51 94 81 48 93 27 42 68 71 66 21 70 16 97 72 37 13 65 36 65 74 75 48 28 80 31 59 22 "
    "27 137 73 53 45 110 48 23 43 18 45 108 171 79 99 54 110 66 23 63 19 55 102 43 40 60 93 79 "
    "55 78 30 43 51 230 73 59 42 87 39 72 102 15 57 33 60 36 75 78 75 14 70 67 19 21 39 133 118 "
    "33 84 36 181 84 67 57 42 94 44 80 54 24 48 92 120 75 15 18 104 96 60 38 100 80 141 43 85 "
    "114 39 53 35 49 66 40 32 31 59 44 39 15 30 75 44 15 38 48 79 42 90 85 34 30 40 145 51 39 "
    "165 47 55 54 36 35 73 83 84 90 92 68 70 42 77 20 26 54 25 50 72 20 24 34 76 34 22 24 49 42 "
    "139 98 26 67 20 178 71 72 46 33 57 89 45 45 51 29 72 111 143 32 70 21 87 75 90 37 26 22 49 "
    "65 141 88 33 36 45 68 95 69 57 50 33 29 67 39 71 71 65 104 77 36 97 22 120 28 88 33 75 42 "
    "174 51 76 38 40 26 107 90 74 62 36 36 29 36 94 31 71 33 50 78 29 41 64 55 "
)
# fmt: on
