"""Shared pieces of the reference-generator tests.

* a tiny random Llama target (real transformers model, seconds to build) so the
  generator's bookkeeping can be exercised over many configurations fast;
* the test-only *oracle* proposer: it runs the real drafter (so shapes, the
  sampler and the confidence head are the real ones) and then overwrites the
  drafts with the target's own greedy continuation, the first ``k`` right and
  the rest deliberately wrong. It is what makes acceptance, partial acceptance
  and ragged verify lengths testable with an untrained drafter (whose random
  drafts are never accepted);
* a cycling policy giving ragged verify lengths that vary per request and round.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from dspark_sglang.model import DraftProposal, DSparkConfig, DSparkDrafter
from dspark_sglang.reference.generator import DraftInputs, DSparkProposer
from dspark_sglang.sampling import SamplingParams
from dspark_sglang.scheduling.policies import SchedulingPolicy, survival
from dspark_sglang.targets.hf_target import HFTarget

torch.set_num_threads(1)

TINY_VOCAB = 6


def tiny_target(seed: int = 0, vocab: int = TINY_VOCAB, layers: int = 3) -> HFTarget:
    """Random Llama with a peaked (large-init) next-token distribution."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        initializer_range=0.3,
    )
    return HFTarget.from_model(LlamaForCausalLM(cfg).eval(), name=f"tiny-llama-{seed}")


def tiny_drafter(
    target: HFTarget, *, block_size: int = 4, sliding_window: int | None = 16, seed: int = 1
) -> DSparkDrafter:
    """An untrained (seeded) DSpark drafter with the production structure, scaled down."""
    cfg = DSparkConfig.for_target(
        target.spec,
        mask_token_id=target.spec.vocab_size - 1,
        num_hidden_layers=1,
        num_experts=2,
        num_experts_per_tok=1,
        intermediate_size=64,
        markov_rank=8,
        block_size=block_size,
        sliding_window=sliding_window,
    )
    torch.manual_seed(seed)
    return DSparkDrafter(cfg, target.embed_tokens, target.lm_head).eval()


class OracleProposer:
    """Proposes the reference (target greedy) continuation: first ``k`` right, rest wrong.

    ``references[rid]`` is prompt + greedy continuation (long enough to cover every
    anchor + B); ``correct(rid, round_of_request)`` gives ``k`` in ``0..B``. The
    ``k`` used for each round is logged in ``ks[rid]`` for the expectations.
    """

    def __init__(
        self,
        base: DSparkProposer,
        references: Sequence[Sequence[int]],
        correct: Callable[[int, int], int],
        vocab_size: int,
    ) -> None:
        self.base = base
        self.references = [list(r) for r in references]
        self.correct = correct
        self.vocab_size = vocab_size
        self.ks: dict[int, list[int]] = {}
        self.anchor_mismatches = 0

    @property
    def block_size(self) -> int:
        return self.base.block_size

    @property
    def target_layer_ids(self) -> tuple[int, ...]:
        return self.base.target_layer_ids

    @property
    def sliding_window(self) -> int | None:
        return self.base.sliding_window

    def propose(
        self, inputs: DraftInputs, sampling: SamplingParams, generator: torch.Generator
    ) -> DraftProposal:
        real = self.base.propose(inputs, sampling, generator)
        b = self.block_size
        tokens = real.tokens.clone()
        for i, (rid, pos) in enumerate(
            zip(inputs.request_ids.tolist(), inputs.anchor_positions.tolist(), strict=True)
        ):
            ref = self.references[rid]
            if ref[pos] != int(inputs.anchor_tokens[i]):
                self.anchor_mismatches += 1
            truth = torch.tensor(ref[pos + 1 : pos + 1 + b], dtype=torch.int64)
            assert truth.numel() == b, "reference too short for the oracle"
            ks = self.ks.setdefault(rid, [])
            k = self.correct(rid, len(ks))
            ks.append(k)
            tokens[i, :k] = truth[:k]
            tokens[i, k:] = (truth[k:] + 1) % self.vocab_size  # guaranteed wrong
        probs = torch.nn.functional.one_hot(tokens, real.probs.shape[-1]).to(real.probs.dtype)
        return DraftProposal(tokens=tokens, probs=probs, confidence_logits=real.confidence_logits)


class CyclingPolicy(SchedulingPolicy):
    """Ragged, deterministic verify lengths ``(i + step) % (B + 1)`` (non-anticipating)."""

    def __init__(self) -> None:
        self.step = 0

    @property
    def name(self) -> str:
        return "cycling"

    def decide(self, confidence: torch.Tensor) -> torch.Tensor:
        n, b = survival(confidence).shape
        lens = (torch.arange(n, dtype=torch.int64) + self.step) % (b + 1)
        self.step += 1
        return lens

    def reset(self) -> None:
        self.step = 0


def expected_accepts(rounds: Sequence[tuple[int, int]], ks: Sequence[int]) -> list[tuple[int, int]]:
    """What the oracle implies: ``(l, min(k, l))`` per round."""
    return [(lv, min(k, lv)) for (lv, _), k in zip(rounds, ks, strict=True)]
