"""Reference DSpark speculative generator in plain PyTorch (the CPU oracle).

Why: SGLang's DSPARK worker is fast but hard to inspect; this generator runs the
same algorithm step by step on any ``HFTarget`` so its outputs and acceptance
statistics can be checked token by token (greedy: identical to the target's own
decoding; sampling: distributed exactly as the target's).

One round for the active batch (requests ``i = 1..N``, block size ``B``):

    context_i  = captured target hidden states of positions < anchor_i (last W if windowed)
    block      = drafter.forward_block(context, anchors)             one parallel pass
    proposal   = sample_block(block)      drafts y_i [B], p_d [B, V], confidence logits z_i
               (z_i is recorded per round, raw, in GenerationResult.confidence_logits)
    copies     = copy_drafts(tokens_i, y_i)   with context_copy_ngram n > 0 only: drafts
               taken from the request's own text (model/context_copy.py), p_d one-hot there
    c_i        = sigmoid(z_i / T)                                     STS (T = 1 without)
               (copied slots: copy_confidence instead)
    l_i        = policy.decide(c)                                     0..B drafts to verify
    target     = forward([anchor_i, y_i[:l_i]]) on request i's KV cache, capturing layers
    a_i, emit  = chain_verify(p_d, p_t, l) (greedy_verify at temperature 0)
    commit     emit_i (a_i drafts + correction/bonus), crop KV to anchor_i + a_i + 1,
               keep hidden states of anchor_i .. anchor_i + a_i

Invariant (per request): the cache holds exactly positions ``0 .. anchor-1``,
the kept hidden states cover the same positions, and the anchor is the last
emitted token; a request stops at a stop token (which is emitted) or after
``max_new_tokens`` tokens, with any overshoot of the last round dropped, exactly
as plain decoding would have stopped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch
from transformers import DynamicCache

from dspark_sglang.model.block_sampler import DraftProposal, sample_block
from dspark_sglang.model.context_copy import (
    ContextCopies,
    copy_drafts,
    one_hot_rows,
    pad_histories,
)
from dspark_sglang.model.drafter import DSparkDrafter
from dspark_sglang.model.heads import calibrated_confidence
from dspark_sglang.sampling import SamplingParams, logits_to_probs, sample
from dspark_sglang.scheduling.config import DEFAULT_COPY_CONFIDENCE, check_ngram
from dspark_sglang.scheduling.policies import SchedulingPolicy
from dspark_sglang.targets.hf_target import HFTarget
from dspark_sglang.verify.chain import VerifyResult, chain_verify, greedy_verify

# --------------------------------------------------------------------------- proposers


@dataclass(frozen=True)
class DraftInputs:
    """What a proposer sees for the ``N`` active requests of one round.

    ``context_*`` are right-aligned (padding first, ``context_valid`` False);
    ``request_ids`` index the prompts given to ``generate``. ``context_tokens``
    holds the token id at each context position (0 where invalid) so an
    autoregressive proposer, which embeds the tokens next to the hidden states,
    sees them too; the generator always fills it (``None`` only for inputs built
    by hand for a proposer that does not read tokens).
    """

    context_hidden: torch.Tensor  # [N, C, n*H]
    context_positions: torch.Tensor  # [N, C] int64
    context_valid: torch.Tensor  # [N, C] bool
    anchor_tokens: torch.Tensor  # [N] int64
    anchor_positions: torch.Tensor  # [N] int64
    request_ids: torch.Tensor  # [N] int64
    context_tokens: torch.Tensor | None = None  # [N, C] int64


@runtime_checkable
class Proposer(Protocol):
    """Anything that drafts a block per request (the DSpark drafter, a test oracle)."""

    @property
    def block_size(self) -> int: ...

    @property
    def target_layer_ids(self) -> tuple[int, ...]: ...

    @property
    def sliding_window(self) -> int | None: ...

    def propose(
        self, inputs: DraftInputs, sampling: SamplingParams, generator: torch.Generator
    ) -> DraftProposal: ...


class DSparkProposer:
    """The real path: ``drafter.forward_block`` then ``sample_block``."""

    def __init__(self, drafter: DSparkDrafter) -> None:
        self.drafter = drafter

    @property
    def block_size(self) -> int:
        return self.drafter.config.block_size

    @property
    def target_layer_ids(self) -> tuple[int, ...]:
        return tuple(self.drafter.config.target_layer_ids)

    @property
    def sliding_window(self) -> int | None:
        return self.drafter.config.sliding_window

    @torch.inference_mode()
    def propose(
        self, inputs: DraftInputs, sampling: SamplingParams, generator: torch.Generator
    ) -> DraftProposal:
        block = self.drafter.forward_block(
            inputs.context_hidden,
            inputs.context_positions,
            inputs.context_valid,
            inputs.anchor_tokens,
            inputs.anchor_positions,
        )
        return sample_block(
            self.drafter,
            block,
            inputs.anchor_tokens,
            sampling.temperature,
            sampling.top_k,
            sampling.top_p,
            generator,
        )


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class GenerationResult:
    """Outputs and acceptance statistics of one ``generate``/``plain_generate`` call.

    ``rounds[i]`` lists ``(verify_len, accepted)`` per speculative round of request
    ``i`` (empty for plain decoding). ``position_reached[k]`` counts rounds where
    draft ``k`` was verified with all earlier drafts accepted, ``position_accepted[k]``
    those where it was also accepted (conditional acceptance = accepted / reached).
    ``confidence_logits[i]`` is float32 ``[len(rounds[i]), B]``: the drafter's raw
    confidence logits (before STS) of every round of request ``i``, in round order,
    so rollouts for calibration and traces for the planner can be written from a
    run; ``None`` when the drafter has no confidence head (and for plain decoding).
    ``copies_reached`` / ``copies_accepted`` count the context-copied drafts among
    ``position_reached`` / ``position_accepted`` (0 without context copies).
    """

    outputs: list[list[int]]
    rounds: list[list[tuple[int, int]]]
    position_reached: torch.Tensor  # [B] int64
    position_accepted: torch.Tensor  # [B] int64
    wall_time_s: float
    target_forwards: int
    draft_forwards: int
    confidence_logits: list[torch.Tensor] | None = None
    copies_reached: int = 0
    copies_accepted: int = 0

    @property
    def num_tokens(self) -> int:
        return sum(len(o) for o in self.outputs)

    @property
    def num_rounds(self) -> int:
        return sum(len(r) for r in self.rounds)

    @property
    def accept_length_mean(self) -> float:
        """Mean tokens emitted per round, accepted drafts + the correction/bonus token."""
        n = self.num_rounds
        return sum(a + 1 for r in self.rounds for _, a in r) / n if n else float("nan")

    @property
    def verify_length_mean(self) -> float:
        n = self.num_rounds
        return sum(v for r in self.rounds for v, _ in r) / n if n else float("nan")

    @property
    def position_acceptance(self) -> torch.Tensor:
        """Conditional acceptance per draft position (NaN where never reached)."""
        reached = self.position_reached.double()
        return torch.where(
            reached > 0, self.position_accepted.double() / reached.clamp(min=1), torch.nan
        )

    @property
    def tokens_per_second(self) -> float:
        return self.num_tokens / self.wall_time_s if self.wall_time_s > 0 else float("nan")


# --------------------------------------------------------------------------- requests


@dataclass
class _Request:
    """Mutable per-request state; see the module invariant."""

    rid: int
    tokens: list[int]  # prompt + emitted; the last one is the anchor
    cache: DynamicCache | None
    hidden: torch.Tensor  # [K, n*H] captured hidden states of positions hidden_start..
    hidden_start: int
    output: list[int] = field(default_factory=list)
    rounds: list[tuple[int, int]] = field(default_factory=list)
    confidence: list[torch.Tensor] = field(default_factory=list)  # raw logits [B] per round
    done: bool = False

    @property
    def anchor_position(self) -> int:
        return len(self.tokens) - 1


def _validate_prompts(prompts: Sequence[Sequence[int]], vocab: int, max_new_tokens: int) -> None:
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompts[{i}] is empty; every prompt needs at least one token")
        bad = [t for t in p if not 0 <= int(t) < vocab]
        if bad:
            raise ValueError(f"prompts[{i}] has token ids outside [0, {vocab}): {bad[:5]}")


def _emit_tokens(req: _Request, new: Sequence[int], max_new: int, stops: frozenset[int]) -> int:
    """Append ``new`` as plain decoding would: stop after a stop token or ``max_new``.

    Returns how many of ``new`` were kept.
    """
    kept = 0
    for tok in new:
        req.output.append(tok)
        req.tokens.append(tok)
        kept += 1
        if tok in stops or len(req.output) >= max_new:
            req.done = True
            break
    return kept


def _prefill(
    target: HFTarget,
    prompt: Sequence[int],
    layer_ids: Sequence[int],
    sampling: SamplingParams,
    generator: torch.Generator,
) -> tuple[int, DynamicCache, torch.Tensor]:
    """Run the prompt, sample the first token. Returns ``(token, cache, captured [P, n*H])``."""
    ids = torch.tensor([list(prompt)], dtype=torch.long)
    logits, captured, cache = target.forward(ids, None, 0, layer_ids, logits_to_keep=1)
    probs = logits_to_probs(logits[0, -1], sampling.temperature, sampling.top_k, sampling.top_p)
    return int(sample(probs, generator)), cache, captured[0]


# --------------------------------------------------------------------------- baseline


@torch.inference_mode()
def plain_generate(
    target: HFTarget,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    stop_token_ids: Sequence[int] = (),
    *,
    sampling: SamplingParams | None = None,
    seed: int = 0,
) -> GenerationResult:
    """Target-only autoregressive decoding, one token per forward, same sampling path.

    The baseline the speculative generator is compared with (speed) and must equal
    at temperature 0 (tokens).
    """
    sampling = sampling or SamplingParams()
    _validate_prompts(prompts, target.spec.vocab_size, max_new_tokens)
    stops = frozenset(int(t) for t in stop_token_ids)
    gen = torch.Generator().manual_seed(seed)
    outputs: list[list[int]] = []
    forwards = 0
    t0 = time.perf_counter()
    for prompt in prompts:
        tok, cache, _ = _prefill(target, prompt, (), sampling, gen)
        forwards += 1
        out = [tok]
        while tok not in stops and len(out) < max_new_tokens:
            logits, _, cache = target.forward(torch.tensor([[tok]]), cache)
            forwards += 1
            probs = logits_to_probs(
                logits[0, -1], sampling.temperature, sampling.top_k, sampling.top_p
            )
            tok = int(sample(probs, gen))
            out.append(tok)
        outputs.append(out)
    wall = time.perf_counter() - t0
    empty = torch.zeros(0, dtype=torch.int64)
    return GenerationResult(
        outputs=outputs,
        rounds=[[] for _ in prompts],
        position_reached=empty,
        position_accepted=empty,
        wall_time_s=wall,
        target_forwards=forwards,
        draft_forwards=0,
    )


# --------------------------------------------------------------------------- speculative


class ReferenceGenerator:
    """DSpark speculative decoding on an ``HFTarget`` (see the module docstring).

    ``drafter`` is a ``DSparkDrafter`` (wrapped in ``DSparkProposer``) or any
    ``Proposer``; ``policy`` decides verify lengths from calibrated confidences;
    ``sts_temperatures`` are the per-position STS temperatures (``[B]``; 1 if None).
    ``context_copy_ngram`` > 0 replaces drafts by context copies matching that many
    trailing tokens (``model/context_copy.py``; 0: the drafter's drafts only), and
    ``copy_confidence`` is the confidence the policy sees for a copied slot (the
    drafter's confidence head scored its own token there, not the copy).
    """

    def __init__(
        self,
        target: HFTarget,
        drafter: DSparkDrafter | Proposer,
        policy: SchedulingPolicy,
        *,
        sts_temperatures: Sequence[float] | torch.Tensor | None = None,
        sampling: SamplingParams | None = None,
        seed: int = 0,
        context_copy_ngram: int = 0,
        copy_confidence: float = DEFAULT_COPY_CONFIDENCE,
    ) -> None:
        self.target = target
        self.context_copy_ngram = check_ngram(context_copy_ngram, "context_copy_ngram")
        if not 0.0 <= float(copy_confidence) <= 1.0:
            raise ValueError(
                f"copy_confidence must be a probability in [0, 1], got {copy_confidence!r}"
            )
        self.copy_confidence = float(copy_confidence)
        self.proposer: Proposer = (
            DSparkProposer(drafter) if isinstance(drafter, DSparkDrafter) else drafter
        )
        if not isinstance(self.proposer, Proposer):
            raise TypeError(
                f"drafter must be a DSparkDrafter or a Proposer, got {type(drafter).__name__}"
            )
        if isinstance(drafter, DSparkDrafter):
            cfg = drafter.config
            if cfg.vocab_size != target.spec.vocab_size:
                raise ValueError(
                    f"drafter vocab_size={cfg.vocab_size} != target vocab_size="
                    f"{target.spec.vocab_size}; use a drafter built for this target"
                )
            if cfg.target_num_layers != target.spec.num_layers:
                raise ValueError(
                    f"drafter target_num_layers={cfg.target_num_layers} != target layers="
                    f"{target.spec.num_layers}; use a drafter built for this target"
                )
        self.policy = policy
        b = self.proposer.block_size
        if sts_temperatures is None:
            temps = torch.ones(b)
        else:
            temps = torch.as_tensor(sts_temperatures, dtype=torch.float32).reshape(-1)
            if temps.numel() < b:
                raise ValueError(
                    f"sts_temperatures has {temps.numel()} values but the block has {b} "
                    "positions; fit STS for this block size"
                )
            temps = temps[:b]
            if not bool((temps > 0).all()) or not bool(torch.isfinite(temps).all()):
                raise ValueError(f"sts_temperatures must be finite and > 0, got {temps.tolist()}")
        self.sts_temperatures = temps
        self.sampling = sampling or SamplingParams()
        self.seed = seed

    # ------------------------------------------------------------------ helpers

    def _context(self, reqs: Sequence[_Request]) -> tuple[torch.Tensor, ...]:
        """Right-aligned context (last W rows when windowed).

        Returns ``(hidden [N, C, n*H], positions [N, C], valid [N, C], tokens [N, C])``.
        """
        window = self.proposer.sliding_window
        lens = [
            r.hidden.shape[0] if window is None else min(window, r.hidden.shape[0]) for r in reqs
        ]
        c = max(max(lens), 1)
        feat = reqs[0].hidden.shape[1]
        hidden = reqs[0].hidden.new_zeros((len(reqs), c, feat))
        positions = torch.zeros((len(reqs), c), dtype=torch.int64)
        valid = torch.zeros((len(reqs), c), dtype=torch.bool)
        tokens = torch.zeros((len(reqs), c), dtype=torch.int64)
        for i, (r, n) in enumerate(zip(reqs, lens, strict=True)):
            if n == 0:
                continue
            hidden[i, c - n :] = r.hidden[-n:]
            end = r.hidden_start + r.hidden.shape[0]
            positions[i, c - n :] = torch.arange(end - n, end)
            valid[i, c - n :] = True
            tokens[i, c - n :] = torch.tensor(r.tokens[end - n : end], dtype=torch.int64)
        return hidden, positions, valid, tokens

    def _keep_hidden(self, req: _Request, new_rows: torch.Tensor) -> None:
        """Append committed rows; drop rows older than the window (never read again)."""
        req.hidden = torch.cat([req.hidden, new_rows], dim=0)
        window = self.proposer.sliding_window
        if window is not None and req.hidden.shape[0] > window:
            drop = req.hidden.shape[0] - window
            req.hidden = req.hidden[drop:].clone()
            req.hidden_start += drop

    def confidence(
        self, proposal: DraftProposal, copies: ContextCopies | None = None
    ) -> torch.Tensor:
        """Calibrated per-position confidence ``[N, B]``; 1 when the drafter has no head;
        ``copy_confidence`` at copied slots."""
        if proposal.confidence_logits is None:
            conf = torch.ones(proposal.tokens.shape, dtype=torch.float32)
        else:
            conf = calibrated_confidence(proposal.confidence_logits, self.sts_temperatures)
        if copies is not None:
            conf = torch.where(copies.copied, torch.full_like(conf, self.copy_confidence), conf)
        return conf

    def _copy_from_context(
        self, reqs: Sequence[_Request], proposal: DraftProposal
    ) -> tuple[DraftProposal, ContextCopies]:
        """``proposal`` with context copies (their draft distributions one-hot)."""
        history, lengths = pad_histories([r.tokens for r in reqs])
        copies = copy_drafts(history, lengths, proposal.tokens, self.context_copy_ngram)
        copied = DraftProposal(
            tokens=copies.tokens,
            probs=one_hot_rows(proposal.probs, copies),
            confidence_logits=proposal.confidence_logits,
        )
        return copied, copies

    # ------------------------------------------------------------------ generate

    @torch.inference_mode()
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        stop_token_ids: Sequence[int] = (),
        *,
        progress: Callable[[int], object] | None = None,
    ) -> GenerationResult:
        """Speculatively decode every prompt (token ids) up to ``max_new_tokens``.

        ``progress``: optional callable ``(emitted_tokens_this_round) -> None``
        (e.g. a rich progress bar's advance) called after every round.
        """
        target, sp = self.target, self.sampling
        _validate_prompts(prompts, target.spec.vocab_size, max_new_tokens)
        stops = frozenset(int(t) for t in stop_token_ids)
        layer_ids = self.proposer.target_layer_ids
        b = self.proposer.block_size
        gen = torch.Generator().manual_seed(self.seed)
        self.policy.reset()
        reached = torch.zeros(b, dtype=torch.int64)
        accepted = torch.zeros(b, dtype=torch.int64)
        forwards = drafts_run = copies_reached = copies_accepted = 0
        t0 = time.perf_counter()

        reqs: list[_Request] = []
        for rid, prompt in enumerate(prompts):
            tok, cache, captured = _prefill(target, prompt, layer_ids, sp, gen)
            forwards += 1
            req = _Request(
                rid=rid, tokens=list(prompt), cache=cache, hidden=captured[:0], hidden_start=0
            )
            self._keep_hidden(req, captured)
            _emit_tokens(req, [tok], max_new_tokens, stops)
            if req.done:
                req.cache = None
            reqs.append(req)
            if progress is not None:
                progress(1)

        cols = torch.arange(b)
        has_confidence: bool | None = None
        while active := [r for r in reqs if not r.done]:
            n = len(active)
            ctx_h, ctx_pos, ctx_valid, ctx_tok = self._context(active)
            inputs = DraftInputs(
                context_hidden=ctx_h,
                context_positions=ctx_pos,
                context_valid=ctx_valid,
                context_tokens=ctx_tok,
                anchor_tokens=torch.tensor([r.tokens[-1] for r in active], dtype=torch.int64),
                anchor_positions=torch.tensor(
                    [r.anchor_position for r in active], dtype=torch.int64
                ),
                request_ids=torch.tensor([r.rid for r in active], dtype=torch.int64),
            )
            proposal = self.proposer.propose(inputs, sp, gen)
            drafts_run += 1
            z = proposal.confidence_logits
            if has_confidence is None:
                has_confidence = z is not None
            elif has_confidence != (z is not None):
                raise ValueError(
                    "proposer returned confidence_logits in some rounds and None in others; "
                    "a proposer either has a confidence head or not"
                )
            copies = None
            if self.context_copy_ngram:
                proposal, copies = self._copy_from_context(active, proposal)
            verify_lens = self.policy.decide(self.confidence(proposal, copies)).to(torch.int64)
            if verify_lens.shape != (n,) or bool((verify_lens < 0).any() | (verify_lens > b).any()):
                raise ValueError(
                    f"policy {self.policy.name!r} returned verify lengths "
                    f"{verify_lens.tolist()}; expected [N]={n} values in 0..{b}"
                )

            # Target verification forward per request (ragged lengths, own KV cache).
            target_logits: list[torch.Tensor] = []
            captured_rows: list[torch.Tensor] = []
            for i, r in enumerate(active):
                lv = int(verify_lens[i])
                ids = torch.tensor([[r.tokens[-1], *proposal.tokens[i, :lv].tolist()]])
                logits, cap, r.cache = target.forward(ids, r.cache, r.anchor_position, layer_ids)
                forwards += 1
                target_logits.append(logits[0])
                captured_rows.append(cap[0])

            result = self._verify(proposal, target_logits, verify_lens, gen)

            acc = result.accept_lens
            reach = (cols < verify_lens.unsqueeze(1)) & (cols <= acc.unsqueeze(1))
            take = cols < acc.unsqueeze(1)
            reached += reach.sum(0)
            accepted += take.sum(0)
            if copies is not None:
                copies_reached += int((reach & copies.copied).sum())
                copies_accepted += int((take & copies.copied).sum())
            emitted_total = 0
            for i, r in enumerate(active):
                a = int(acc[i])
                r.rounds.append((int(verify_lens[i]), a))
                if z is not None:
                    r.confidence.append(z[i].detach().float().cpu())
                anchor_pos = r.anchor_position
                new = result.tokens[i, : a + 1].tolist()
                emitted_total += _emit_tokens(r, new, max_new_tokens, stops)
                if r.done:
                    r.cache = None  # free memory early; the request is finished
                    continue
                # Positions anchor..anchor+a are now committed context.
                assert r.cache is not None
                target.crop_cache(r.cache, anchor_pos + a + 1)
                self._keep_hidden(r, captured_rows[i][: a + 1])
            if progress is not None:
                progress(emitted_total)

        wall = time.perf_counter() - t0
        confidence = None
        if has_confidence:
            confidence = [
                torch.stack(r.confidence) if r.confidence else torch.zeros((0, b)) for r in reqs
            ]
        return GenerationResult(
            outputs=[r.output for r in reqs],
            rounds=[r.rounds for r in reqs],
            position_reached=reached,
            position_accepted=accepted,
            wall_time_s=wall,
            target_forwards=forwards,
            draft_forwards=drafts_run,
            confidence_logits=confidence,
            copies_reached=copies_reached,
            copies_accepted=copies_accepted,
        )

    def _verify(
        self,
        proposal: DraftProposal,
        target_logits: Sequence[torch.Tensor],
        verify_lens: torch.Tensor,
        gen: torch.Generator,
    ) -> VerifyResult:
        """Pad per-request target rows to ``[N, B+1, ...]`` and run the verifier.

        Rows past ``l_i`` are never read by the verifiers (they index ``<= l_i``).
        """
        sp = self.sampling
        n, b = proposal.tokens.shape
        if sp.greedy:
            argmax = torch.full((n, b + 1), -1, dtype=torch.int64)
            for i, lg in enumerate(target_logits):
                argmax[i, : lg.shape[0]] = lg.argmax(-1)
            return greedy_verify(proposal.tokens, argmax, verify_lens)
        v = proposal.probs.shape[-1]
        target_probs = torch.zeros((n, b + 1, v), dtype=torch.float32)
        for i, lg in enumerate(target_logits):
            target_probs[i, : lg.shape[0]] = logits_to_probs(lg, sp.temperature, sp.top_k, sp.top_p)
        return chain_verify(proposal.tokens, proposal.probs, target_probs, verify_lens, gen)

    def plain_generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        stop_token_ids: Sequence[int] = (),
    ) -> GenerationResult:
        """The target-only baseline with this generator's sampling settings and seed."""
        return plain_generate(
            self.target,
            prompts,
            max_new_tokens,
            stop_token_ids,
            sampling=self.sampling,
            seed=self.seed,
        )
