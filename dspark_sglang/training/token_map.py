"""The reduced draft vocabulary of a training run, built from its regenerated responses.

The drafter's labels are the target's response tokens (anchors sit in the response,
``anchors.py``), so the map keeps the ``K`` tokens the target produced most often in
the data stage's responses, and always the EOS ids (a drafter that cannot propose the
end of a reply stalls every round at it). Counting reads only the response shards,
so every process of a distributed run builds the same map from the same files.

``response_token_mass`` ranks the tokens by the target's own probability instead of by
its samples: the whole distribution at every response position, summed. It estimates
the same frequencies with far less variance (the counts of a few thousand responses
leave most of the vocabulary at zero, ranked by id), at the price of one target forward
pass over the data; ``export-drafter --draft-vocab-by mass`` uses it.

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


def response_token_mass(
    data_dir: str | Path,
    target: torch.nn.Module,
    vocab_size: int,
    *,
    temperature: float = 1.0,
    progress: bool = False,
) -> torch.Tensor:
    """``[V]`` float64: the target's probability of each token at ``temperature``, summed
    over every response position of ``data_dir`` (it sums to the number of positions).

    ``target`` is an HF causal LM; it runs once over each prompt + response, in its own
    dtype and device, without gradients.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 for a probability mass, got {temperature}")
    counts = response_token_counts(data_dir, vocab_size)  # validates the ids and the folder
    records = load_responses(data_dir)
    param = next(target.parameters())
    mass = torch.zeros(vocab_size, dtype=torch.float64)
    from tqdm.auto import tqdm

    with torch.no_grad():
        for rec in tqdm(records, desc="token mass", unit="reply", disable=not progress):
            n_prompt, n_reply = len(rec.prompt_ids), len(rec.response_ids)
            if n_reply == 0:
                continue
            ids = torch.tensor([[*rec.prompt_ids, *rec.response_ids]], device=param.device)
            # Position t predicts token t + 1: the reply's tokens are predicted from
            # positions n_prompt - 1 .. n_prompt + n_reply - 2.
            logits = target(input_ids=ids).logits[0, n_prompt - 1 : n_prompt + n_reply - 1]
            if logits.shape[-1] < vocab_size:
                raise ValueError(
                    f"the target has {logits.shape[-1]} logits but the map is over {vocab_size} "
                    "tokens; pass the target the responses were generated with"
                )
            probs = torch.softmax(logits[:, :vocab_size].double() / temperature, dim=-1)
            mass += probs.sum(0).cpu()
    assert mass.sum().round() == counts.sum(), "one distribution per response token"
    return mass


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


def coverage_report(
    counts: torch.Tensor, vocab: DraftVocab, mass: torch.Tensor | None = None
) -> dict[str, object]:
    """What ``draft_vocab.json`` holds: sizes and the share of the response tokens
    ``counts`` (``response_token_counts``) that the map covers; with ``mass``
    (``response_token_mass``) also the share of the target's probability it covers."""
    total = int(counts.sum())
    covered = int(counts[vocab.ids].sum())
    report: dict[str, object] = {
        "draft_vocab_size": vocab.size,
        "vocab_size": vocab.vocab_size,
        "response_tokens": total,
        "coverage": covered / total if total else 0.0,
    }
    if mass is not None:
        whole = float(mass.sum())
        report["mass_coverage"] = float(mass[vocab.ids].sum()) / whole if whole else 0.0
    return report
