"""Tokens per round that other draft shapes would buy, replayed on the target's greedy path.

At temperature 0 what is emitted does not depend on the drafts: verification accepts the
longest draft prefix equal to the target's greedy continuation. So one plain greedy
decode of a prompt fixes every round of any greedy speculative run over it. From anchor
position ``p``, a round whose candidate drafts are the rows of ``D`` (``B`` tokens each)
accepts

    a = max over rows of the common prefix of the row and path[p+1 : p+1+B]

and the next anchor is ``p + a + 1``; the prompt's first new token (from the prefill) is
the first anchor. Replaying that gives each shape's exact accepted drafts per round, as
the reference generator would count them with every draft verified, without running a
verify. It prices nothing: a tree of ``M`` branches verifies ``1 + M * B`` tokens a round
where the chain verifies ``1 + B``, and whether that pays is the cost table's question.

Shapes (``--shapes``):

* ``chain``: today's draft, the Markov head's argmax after each slot;
* ``treeM``: slot 1 branched over the drafter's top ``M`` tokens (after the Markov bias
  from the anchor), each branch continued by the Markov head's argmax (branch 0 is the
  chain);
* ``+copy``: context copies (``model/context_copy.py``, ``--copy-ngram`` trailing tokens)
  applied to every branch, as the worker applies them to its chain.

Also recorded, at every position of every reply: whether the target's next token is among
the drafter's top ``m`` at slot 1 (``m = 1..--top-m``), the ceiling of any tree over slot 1.

With ``--cost-table`` (an SGLang SPS JSON, either format; e.g. the table a DSPARK_MOE worker
writes at start-up where ``DSPARK_STARTUP_COST_TABLE`` points), each shape's verify forward
is priced at one request in one-token steps, ``price = SPS(1) / SPS(1 + M * B)``, and
``ratio_ceiling = tokens_per_round / price`` bounds its speed-up over plain decoding from
above: it counts the verify forward alone, as if drafting and bookkeeping were free.

Usage: ``python benchmarks/draft_headroom.py [--sets mtbench gsm8k humaneval]
[--num-prompts 16] [--max-new-tokens 48] [--cost-table FILE] [--out FILE]``; the committed
result is ``--out benchmarks/results/draft_headroom.json`` with ``--cost-table
benchmarks/results/draft_headroom_cost_table.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dspark_sglang.data.evalsets import load_eval_set
from dspark_sglang.model.checkpoint import load_drafter
from dspark_sglang.model.context_copy import copy_drafts, pad_histories
from dspark_sglang.model.drafter import DraftBlock, DSparkDrafter
from dspark_sglang.reference.generator import plain_generate
from dspark_sglang.results import default_out, dump_json, software_versions
from dspark_sglang.sampling import SamplingParams
from dspark_sglang.scheduling.cost_table import CostModel, load_cost_table
from dspark_sglang.targets.hf_target import HFTarget
from dspark_sglang.targets.smollm2 import ensure_smollm2

EMBEDDED_DRAFTER = Path("dspark_sglang/assets/drafters/smollm2")
DEFAULT_SHAPES = ("chain", "chain+copy", "tree2", "tree2+copy", "tree4", "tree4+copy", "tree8+copy")
_SHAPE = re.compile(r"^(chain|tree(\d+))(\+copy)?$")


@dataclass(frozen=True)
class Shape:
    """``width`` branches at slot 1 (1: the chain); ``copy`` applies context copies."""

    name: str
    width: int
    copy: bool

    @classmethod
    def parse(cls, name: str) -> Shape:
        m = _SHAPE.match(name)
        if m is None or (m.group(2) is not None and int(m.group(2)) < 2):
            raise ValueError(
                f"draft shape {name!r}: use chain, treeM with M >= 2, either with +copy "
                "(e.g. tree4+copy)"
            )
        return cls(name, int(m.group(2) or 1), m.group(3) is not None)


def common_prefix(drafts: torch.Tensor, path: Sequence[int]) -> int:
    """Longest prefix of ``path`` that some row of ``drafts`` ``[M, B]`` starts with."""
    n = min(drafts.shape[1], len(path))
    if n == 0:
        return 0
    match = drafts[:, :n] == torch.as_tensor(list(path[:n]), dtype=drafts.dtype)
    return int(match.long().cumprod(dim=1).sum(dim=1).max())


@torch.inference_mode()
def slot1(
    drafter: DSparkDrafter, block: DraftBlock, anchor: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Slot 1's logits over the draft vocabulary (base + the Markov bias from the anchor)
    and the Markov head's state after slot 1 (``None`` for memoryless heads)."""
    logits, state = block.base_logits[0, 0].float(), None
    if drafter.markov_head is not None:
        bias, state = drafter.markov_head.step(torch.tensor([anchor]), block.hidden[0, :1], None)
        logits = logits + bias[0].float()
    return logits, state


@torch.inference_mode()
def branches(drafter: DSparkDrafter, block: DraftBlock, anchor: int, width: int) -> torch.Tensor:
    """``[width, B]`` target ids: slot 1's top ``width`` tokens, each continued by the Markov
    head's argmax (row 0 is the chain ``sample_block`` draws at temperature 0)."""
    head, b = drafter.markov_head, drafter.block_size
    logits, state = slot1(drafter, block, anchor)
    rows = [drafter.to_target_vocab(logits.topk(width).indices)]
    prev = rows[0]
    if state is not None:
        state = state.expand(width, -1)
    for k in range(1, b):
        logits = block.base_logits[0, k].float().expand(width, -1)
        if head is not None:
            bias, state = head.step(prev, block.hidden[0, k : k + 1].expand(width, -1), state)
            logits = logits + bias.float()
        prev = drafter.to_target_vocab(logits.argmax(dim=-1))
        rows.append(prev)
    return torch.stack(rows, dim=1).long()


@dataclass
class Reply:
    """One prompt and the target's greedy reply (``max_new + B`` tokens, so the last round
    can be checked as far as the generator checks it), with the target's hidden states
    at the drafter's layers for every position."""

    tokens: list[int]
    prompt_len: int
    hidden: torch.Tensor  # [len(tokens), n*H]


class BlockCache:
    """The drafter's block per anchor position of one reply (every shape reuses it)."""

    def __init__(self, drafter: DSparkDrafter, reply: Reply) -> None:
        self.drafter, self.reply = drafter, reply
        self._blocks: dict[int, DraftBlock] = {}

    @torch.inference_mode()
    def at(self, p: int) -> DraftBlock:
        if p not in self._blocks:
            window = self.drafter.config.sliding_window
            lo = 0 if window is None else max(0, p - window)
            positions = torch.arange(lo, p).unsqueeze(0)
            self._blocks[p] = self.drafter.forward_block(
                self.reply.hidden[lo:p].unsqueeze(0),
                positions,
                torch.ones_like(positions, dtype=torch.bool),
                torch.tensor([self.reply.tokens[p]]),
                torch.tensor([p]),
            )
        return self._blocks[p]


def replay(
    candidates: Callable[[int], torch.Tensor], reply: Reply, max_new: int, block_size: int
) -> list[int]:
    """Accepted drafts per round of a greedy run whose round at anchor ``p`` verifies
    ``candidates(p)`` (the module docstring), until ``max_new`` tokens are emitted."""
    accepted: list[int] = []
    p, emitted = reply.prompt_len, 1
    while emitted < max_new:
        a = common_prefix(candidates(p), reply.tokens[p + 1 : p + 1 + block_size])
        accepted.append(a)
        emitted += a + 1
        p += a + 1
    return accepted


def shape_candidates(
    drafter: DSparkDrafter, blocks: BlockCache, shape: Shape, copy_ngram: int
) -> Callable[[int], torch.Tensor]:
    tokens = blocks.reply.tokens

    def at(p: int) -> torch.Tensor:
        rows = branches(drafter, blocks.at(p), tokens[p], shape.width)
        if shape.copy:
            history, lengths = pad_histories([tokens[: p + 1]] * rows.shape[0])
            rows = copy_drafts(history, lengths, rows, copy_ngram).tokens
        return rows

    return at


def top_m_hits(drafter: DSparkDrafter, blocks: BlockCache, max_new: int, top_m: int) -> list[int]:
    """For ``m = 1..top_m``: positions of the reply where the target's next token is among
    the drafter's top ``m`` at slot 1 (anchors: the first ``max_new - 1`` reply tokens)."""
    hits = [0] * top_m
    reply = blocks.reply
    for p in range(reply.prompt_len, reply.prompt_len + max_new - 1):
        ranked = drafter.to_target_vocab(
            slot1(drafter, blocks.at(p), reply.tokens[p])[0].topk(top_m).indices
        ).tolist()
        nxt = reply.tokens[p + 1]
        for m in range(top_m):
            hits[m] += int(nxt in ranked[: m + 1])
    return hits


@torch.inference_mode()
def greedy_replies(
    target: HFTarget, prompts: Sequence[Sequence[int]], max_new: int, drafter: DSparkDrafter
) -> list[Reply]:
    """Each prompt's plain greedy reply (EOS ignored) and the hidden states the drafter
    reads, from one target forward over prompt + reply."""
    b = drafter.block_size
    plain = plain_generate(target, prompts, max_new + b, sampling=SamplingParams(temperature=0.0))
    layers = tuple(drafter.config.target_layer_ids)
    out = []
    for prompt, reply in zip(prompts, plain.outputs, strict=True):
        tokens = [*prompt, *reply]
        _, hidden, _ = target.forward(torch.tensor([tokens]), None, 0, layers, logits_to_keep=1)
        out.append(Reply(tokens, len(prompt), hidden[0]))
    return out


def measure(
    target: HFTarget,
    drafter: DSparkDrafter,
    prompts: Sequence[Sequence[int]],
    max_new: int,
    shapes: Sequence[Shape],
    *,
    copy_ngram: int = 2,
    top_m: int = 8,
) -> dict[str, Any]:
    """One prompt set: per shape, every prompt's accepted drafts per round, and the
    slot-1 top-m hits (raw counts; the summary figures follow from them)."""
    if max_new < 2:
        raise ValueError(f"max_new must be >= 2 (one prefill token and a round), got {max_new}")
    replies = greedy_replies(target, prompts, max_new, drafter)
    caches = [BlockCache(drafter, r) for r in replies]
    b = drafter.block_size
    per_shape: dict[str, Any] = {}
    for shape in shapes:
        accepted = [
            replay(shape_candidates(drafter, c, shape, copy_ngram), c.reply, max_new, b)
            for c in caches
        ]
        per_shape[shape.name] = {
            "width": shape.width,
            "copy": shape.copy,
            "verify_tokens_per_round": 1 + shape.width * b,
            "accepted": accepted,
            **summary(accepted),
        }
    hits = [top_m_hits(drafter, c, max_new, top_m) for c in caches]
    positions = len(caches) * (max_new - 1)
    total = [sum(h[m] for h in hits) for m in range(top_m)]
    return {
        "prompt_tokens": [r.prompt_len for r in replies],
        "shapes": per_shape,
        "slot1_top_m": {
            "positions": positions,
            "hits": total,
            "rate": [round(h / positions, 4) for h in total],
        },
    }


def verify_price(table: CostModel, tokens: int) -> float:
    """A verify forward of ``tokens`` tokens at one request, in one-token steps."""
    sps = table.steps_per_sec(1, torch.tensor([1, tokens]))
    return float(sps[0] / sps[1])


def price(result: dict[str, Any], table: CostModel) -> None:
    """Add ``verify_plain_steps`` and ``ratio_ceiling`` to every shape row (module doc)."""
    for per_set in result["sets"].values():
        for row in per_set["shapes"].values():
            row["verify_plain_steps"] = round(
                verify_price(table, row["verify_tokens_per_round"]), 4
            )
            row["ratio_ceiling"] = round(row["tokens_per_round"] / row["verify_plain_steps"], 4)


def summary(accepted: Sequence[Sequence[int]]) -> dict[str, Any]:
    """``tokens`` (accepted drafts + the bonus token, summed over rounds), ``rounds`` and
    ``tokens_per_round``, as the reference generator's ``accept_length_mean`` counts."""
    rounds = sum(len(a) for a in accepted)
    tokens = sum(x + 1 for a in accepted for x in a)
    return {"tokens": tokens, "rounds": rounds, "tokens_per_round": round(tokens / rounds, 4)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", nargs="+", default=["gsm8k", "humaneval", "mtbench"])
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--shapes", nargs="+", default=list(DEFAULT_SHAPES))
    ap.add_argument("--copy-ngram", type=int, default=2)
    ap.add_argument("--top-m", type=int, default=8)
    ap.add_argument("--drafter", type=Path, default=EMBEDDED_DRAFTER)
    ap.add_argument("--cost-table", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    shapes = [Shape.parse(s) for s in args.shapes]
    table = None if args.cost_table is None else load_cost_table(args.cost_table)
    target = HFTarget(ensure_smollm2(), dtype=torch.float32, num_threads=args.threads)
    drafter = load_drafter(args.drafter, target.spec, target.embed_tokens, target.lm_head).eval()
    result: dict[str, Any] = {
        "settings": {
            "target": "smollm2 (SmolLM2-135M-Instruct), float32, HF transformers",
            "drafter": str(args.drafter),
            "block_size": drafter.block_size,
            "sampling": "greedy, EOS ignored",
            "prompts": "the first --num-prompts of each eval set, chat template applied",
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        },
        "loadavg_start": os.getloadavg(),
        "sets": {},
    }
    for name in args.sets:
        t0 = time.perf_counter()
        prompts = [
            target.encode_chat(p.chat()) for p in load_eval_set(name, limit=args.num_prompts)
        ]
        result["sets"][name] = measure(
            target,
            drafter,
            prompts,
            args.max_new_tokens,
            shapes,
            copy_ngram=args.copy_ngram,
            top_m=args.top_m,
        )
        print(f"{name}: {time.perf_counter() - t0:.0f} s", flush=True)
    result["loadavg_end"] = os.getloadavg()
    result["software"] = software_versions()
    if table is not None:
        result["cost_table"] = json.loads(table.to_json())
        price(result, table)
    print_table(result)
    out = args.out or default_out("draft_headroom", "draft_headroom.json")
    print(f"wrote {dump_json(out, result)}")
    return 0


def print_table(result: dict[str, Any]) -> None:
    sets = list(result["sets"])
    shapes = list(result["sets"][sets[0]]["shapes"])
    priced = "ratio_ceiling" in result["sets"][sets[0]]["shapes"][shapes[0]]
    head = f"{'tokens per round':<18}" + "".join(f"{s:>12}" for s in sets) + "   verify tokens"
    if priced:
        head += "   price" + "".join(f"{'ceiling ' + s:>18}" for s in sets)
    print(head)
    for shape in shapes:
        rows = [result["sets"][s]["shapes"][shape] for s in sets]
        line = f"{shape:<18}" + "".join(f"{r['tokens_per_round']:>12.3f}" for r in rows)
        line += f"   {rows[0]['verify_tokens_per_round']:>13}"
        if priced:
            line += f"   {rows[0]['verify_plain_steps']:>5.2f}"
            line += "".join(f"{r['ratio_ceiling']:>18.2f}" for r in rows)
        print(line)
    print("slot-1 top-m hit rate (m = 1..):")
    for s in sets:
        print(
            f"  {s:<10} " + " ".join(f"{r:.3f}" for r in result["sets"][s]["slot1_top_m"]["rate"])
        )


if __name__ == "__main__":
    raise SystemExit(main())
