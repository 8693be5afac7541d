"""The EAGLE3-style AR drafter inside the reference generator (tiny random Llama; fast).

Covers: greedy speculative decoding with the AR proposer equals the target's own
greedy decoding; every proposal the generator got equals ``ARDrafter.propose``
run directly on that request's full context recomputed from scratch (which also
checks the generator's ``context_tokens`` and hidden-state bookkeeping); the
generator records the raw confidence logits of every round (DSpark) or none (AR);
clear errors for inputs the AR drafter cannot use. Sampled losslessness is the
chain verifier's property and is tested there.
"""

from __future__ import annotations

import pytest
import torch
from reference_helpers import tiny_drafter, tiny_target

from dspark_sglang.model.ar_drafter import ARDrafter, ARDrafterConfig
from dspark_sglang.model.block_sampler import DraftProposal
from dspark_sglang.reference.ar_proposer import ARProposer
from dspark_sglang.reference.generator import (
    DraftInputs,
    DSparkProposer,
    Proposer,
    ReferenceGenerator,
    plain_generate,
)
from dspark_sglang.sampling import SamplingParams
from dspark_sglang.scheduling.policies import VerifyAll
from dspark_sglang.targets.hf_target import HFTarget

GREEDY = SamplingParams(temperature=0.0)
PROMPTS = [[1, 2, 3], [4, 0, 1, 2, 2], [3], [2, 2, 1, 0, 4, 3, 1]]
LAYER_IDS = (0, 1)  # the tiny target has 3 layers; its last (2) is never captured


@pytest.fixture(scope="module")
def target() -> HFTarget:
    return tiny_target(seed=0)


def tiny_ar(target: HFTarget, block_size: int = 4, seed: int = 3) -> ARDrafter:
    spec = target.spec
    cfg = ARDrafterConfig(
        hidden_size=spec.hidden_size,
        vocab_size=spec.vocab_size,
        target_layer_ids=LAYER_IDS,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        intermediate_size=64,
        block_size=block_size,
    )
    torch.manual_seed(seed)
    drafter = ARDrafter(cfg, target.embed_tokens, target.lm_head).eval()
    with torch.no_grad():  # larger weights than the 0.02 init: drafts that vary with context
        for p in drafter.parameters():
            if p.requires_grad and p.dim() == 2:
                p.normal_(0.0, 0.3)
    return drafter


class Recording:
    """Calls the real proposer and keeps what it saw and returned, plus the RNG state."""

    def __init__(self, inner: Proposer) -> None:
        self.inner = inner
        self.calls: list[tuple[DraftInputs, torch.Tensor, DraftProposal]] = []

    @property
    def block_size(self) -> int:
        return self.inner.block_size

    @property
    def target_layer_ids(self) -> tuple[int, ...]:
        return self.inner.target_layer_ids

    @property
    def sliding_window(self) -> int | None:
        return self.inner.sliding_window

    def propose(
        self, inputs: DraftInputs, sampling: SamplingParams, generator: torch.Generator
    ) -> DraftProposal:
        state = generator.get_state()
        out = self.inner.propose(inputs, sampling, generator)
        self.calls.append((inputs, state, out))
        return out


def test_ar_proposer_protocol(target: HFTarget) -> None:
    prop = ARProposer(tiny_ar(target, block_size=5))
    assert isinstance(prop, Proposer)
    assert prop.block_size == 5
    assert prop.target_layer_ids == LAYER_IDS
    assert prop.sliding_window is None


def test_greedy_ar_speculation_equals_plain_greedy(target: HFTarget) -> None:
    plain = plain_generate(target, PROMPTS, 20, sampling=GREEDY)
    gen = ReferenceGenerator(target, ARProposer(tiny_ar(target)), VerifyAll(), sampling=GREEDY)
    res = gen.generate(PROMPTS, 20)
    assert res.outputs == plain.outputs
    assert res.confidence_logits is None  # no confidence head
    assert all(lv == 4 for r in res.rounds for lv, _ in r)
    # Both paths of the verifier ran: some drafts accepted, some rejected.
    assert int(res.position_accepted[0]) > 0
    assert int(res.position_accepted[0]) < int(res.position_reached[0])


def test_proposals_equal_direct_propose_on_full_context(target: HFTarget) -> None:
    ar = tiny_ar(target)
    rec = Recording(ARProposer(ar))
    sampling = SamplingParams(temperature=1.0)
    res = ReferenceGenerator(target, rec, VerifyAll(), sampling=sampling, seed=7).generate(
        PROMPTS, 16
    )
    sequences = [p + o for p, o in zip(PROMPTS, res.outputs, strict=True)]
    assert len(rec.calls) == res.draft_forwards >= 3
    ragged = False
    for inputs, state, out in rec.calls:
        g = torch.Generator()
        g.set_state(state)
        ragged |= bool((~inputs.context_valid).any())
        for i, (rid, p) in enumerate(
            zip(inputs.request_ids.tolist(), inputs.anchor_positions.tolist(), strict=True)
        ):
            seq = torch.tensor([sequences[rid][: p + 1]])
            assert int(inputs.anchor_tokens[i]) == sequences[rid][p]
            # context_tokens: the real tokens at the valid context positions.
            valid = inputs.context_valid[i]
            assert inputs.context_tokens is not None
            assert inputs.context_tokens[i, valid].tolist() == sequences[rid][:p]
            # The target features recomputed from scratch for positions < p.
            _, hidden, _ = target.forward(seq[:, :p], None, 0, LAYER_IDS)
            toks, probs, _ = ar.propose(hidden, seq, temperature=1.0, generator=g)
            assert torch.equal(out.tokens[i], toks[0])
            torch.testing.assert_close(out.probs[i], probs[0], atol=1e-5, rtol=1e-4)
    assert ragged  # prompts of different lengths: padded contexts were exercised


def test_generator_records_raw_confidence_logits_per_round(target: HFTarget) -> None:
    rec = Recording(DSparkProposer(tiny_drafter(target)))
    res = ReferenceGenerator(target, rec, VerifyAll(), seed=1).generate(PROMPTS, 12)
    assert res.confidence_logits is not None
    expected: dict[int, list[torch.Tensor]] = {i: [] for i in range(len(PROMPTS))}
    for inputs, _, out in rec.calls:
        assert out.confidence_logits is not None
        for i, rid in enumerate(inputs.request_ids.tolist()):
            expected[rid].append(out.confidence_logits[i])
    for rid, z in enumerate(res.confidence_logits):
        assert z.shape == (len(res.rounds[rid]), 4)
        assert z.dtype == torch.float32
        assert torch.equal(z, torch.stack(expected[rid]))


def _inputs(target: HFTarget, window_start: int) -> DraftInputs:
    seq = torch.tensor([[1, 2, 3, 4, 0, 1]])
    _, hidden, _ = target.forward(seq[:, :5], None, 0, LAYER_IDS)
    rows = hidden[:, window_start:]
    return DraftInputs(
        context_hidden=rows,
        context_positions=torch.arange(window_start, 5).unsqueeze(0),
        context_valid=torch.ones((1, 5 - window_start), dtype=torch.bool),
        anchor_tokens=torch.tensor([1]),
        anchor_positions=torch.tensor([5]),
        request_ids=torch.tensor([0]),
        context_tokens=seq[:, window_start:5],
    )


def test_ar_proposer_refuses_inputs_it_cannot_use(target: HFTarget) -> None:
    prop = ARProposer(tiny_ar(target))
    g = torch.Generator().manual_seed(0)
    ok = prop.propose(_inputs(target, 0), SamplingParams(), g)
    assert ok.tokens.shape == (1, 4) and ok.probs.shape == (1, 4, target.spec.vocab_size)
    with pytest.raises(ValueError, match="full history"):
        prop.propose(_inputs(target, 2), SamplingParams(), g)
    no_tokens = _inputs(target, 0)
    no_tokens = DraftInputs(**{**no_tokens.__dict__, "context_tokens": None})
    with pytest.raises(ValueError, match="context_tokens"):
        prop.propose(no_tokens, SamplingParams(), g)
    with pytest.raises(TypeError, match="ARDrafter"):
        ARProposer(tiny_drafter(target))  # type: ignore[arg-type]
