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

This module is the speculative loop (``ReferenceGenerator``). Its parts live beside
it and are re-exported here: ``proposer.py`` (``DraftInputs``, ``Proposer``,
``DSparkProposer``), ``result.py`` (``GenerationResult``), ``request_state.py`` (the
per-request state and the prefill / emit steps) and ``plain.py`` (``plain_generate``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from dspark_sglang.model.block_sampler import DraftProposal
from dspark_sglang.model.context_copy import (
    ContextCopies,
    copy_drafts,
    one_hot_rows,
    pad_histories,
)
from dspark_sglang.model.drafter import DSparkDrafter
from dspark_sglang.model.heads import calibrated_confidence
from dspark_sglang.reference.plain import plain_generate
from dspark_sglang.reference.proposer import DraftInputs, DSparkProposer, Proposer
from dspark_sglang.reference.request_state import Request, emit_tokens, prefill, validate_prompts
from dspark_sglang.reference.result import GenerationResult
from dspark_sglang.sampling import SamplingParams, logits_to_probs
from dspark_sglang.scheduling.config import DEFAULT_COPY_CONFIDENCE, check_ngram
from dspark_sglang.scheduling.policies import SchedulingPolicy
from dspark_sglang.targets.hf_target import HFTarget
from dspark_sglang.verify.chain import VerifyResult, chain_verify, greedy_verify

__all__ = [
    "DSparkProposer",
    "DraftInputs",
    "GenerationResult",
    "Proposer",
    "ReferenceGenerator",
    "plain_generate",
]

# The helpers' names before they moved to ``request_state.py``.
_Request = Request
_validate_prompts, _emit_tokens, _prefill = validate_prompts, emit_tokens, prefill


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

    def _context(self, reqs: Sequence[Request]) -> tuple[torch.Tensor, ...]:
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

    def _keep_hidden(self, req: Request, new_rows: torch.Tensor) -> None:
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
        self, reqs: Sequence[Request], proposal: DraftProposal
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
        validate_prompts(prompts, target.spec.vocab_size, max_new_tokens)
        stops = frozenset(int(t) for t in stop_token_ids)
        layer_ids = self.proposer.target_layer_ids
        b = self.proposer.block_size
        gen = torch.Generator().manual_seed(self.seed)
        self.policy.reset()
        reached = torch.zeros(b, dtype=torch.int64)
        accepted = torch.zeros(b, dtype=torch.int64)
        forwards = drafts_run = copies_reached = copies_accepted = 0
        t0 = time.perf_counter()

        reqs: list[Request] = []
        for rid, prompt in enumerate(prompts):
            tok, cache, captured = prefill(target, prompt, layer_ids, sp, gen)
            forwards += 1
            req = Request(
                rid=rid, tokens=list(prompt), cache=cache, hidden=captured[:0], hidden_start=0
            )
            self._keep_hidden(req, captured)
            emit_tokens(req, [tok], max_new_tokens, stops)
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
                emitted_total += emit_tokens(r, new, max_new_tokens, stops)
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
