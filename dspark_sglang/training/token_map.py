"""The reduced draft vocabulary of a training run, built from its regenerated responses.

The drafter's labels are the target's response tokens (anchors sit in the response,
``anchors.py``), so the map keeps the ``K`` tokens the target produced most often in
the data stage's responses, and always the EOS ids (a drafter that cannot propose the
end of a reply stalls every round at it). Counting reads only the response shards,
so every process of a distributed run builds the same map from the same files.

``<run.out_dir>/draft_vocab.json`` records the choice: ``K``, the target's ``V``, the
response tokens counted and the share of them the map covers (an upper bound on how
often a drafted token can be the target's next token).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dspark_sglang.model.vocab import DraftVocab
from dspark_sglang.training.datagen import MANIFEST_FILE, RESPONSES_DIR, load_responses

REPORT_FILE = "draft_vocab.json"


def response_token_counts(data_dir: str | Path, vocab_size: int) -> torch.Tensor:
    """``[V]`` int64: how often each target token occurs in the regenerated responses."""
    records = load_responses(data_dir)
    if not records:
        raise ValueError(
            f"{data_dir} holds no regenerated responses to build drafter.model.draft_vocab_size "
            "from; run the data stage first (dspark-sglang train --stage data)"
        )
    ids = torch.tensor([t for r in records for t in r.response_ids], dtype=torch.int64)
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ValueError(
            f"responses in {data_dir} hold token ids outside the target vocabulary "
            f"[0, {vocab_size}); the data directory belongs to another target (set data.dir)"
        )
    return torch.bincount(ids, minlength=vocab_size)


def eos_token_ids(data_dir: str | Path) -> list[int]:
    """The EOS ids the responses were generated with (from the responses' manifest)."""
    manifest = Path(data_dir) / RESPONSES_DIR / MANIFEST_FILE
    if not manifest.is_file():
        return []
    return [int(t) for t in json.loads(manifest.read_text()).get("eos_token_ids", [])]


def build_draft_vocab(
    data_dir: str | Path, vocab_size: int, size: int, counts: torch.Tensor | None = None
) -> DraftVocab:
    """The ``size`` most frequent response tokens of ``data_dir`` plus its EOS ids
    (``counts``: ``response_token_counts`` of it, when the caller has them already)."""
    if counts is None:
        counts = response_token_counts(data_dir, vocab_size)
    return DraftVocab.from_counts(counts, size, always=eos_token_ids(data_dir))


def coverage_report(counts: torch.Tensor, vocab: DraftVocab) -> dict[str, object]:
    """What ``draft_vocab.json`` holds: sizes and the share of the response tokens
    ``counts`` (``response_token_counts``) that the map covers."""
    total = int(counts.sum())
    covered = int(counts[vocab.ids].sum())
    return {
        "draft_vocab_size": vocab.size,
        "vocab_size": vocab.vocab_size,
        "response_tokens": total,
        "coverage": covered / total if total else 0.0,
    }
