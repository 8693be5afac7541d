"""Lossless chain verification of draft blocks with a per-request verify length.

Speculative decoding is only worth having if it changes *speed*, never *what* is
generated. Chain speculative sampling guarantees that: the tokens it emits are
distributed exactly as if the target had sampled them one by one. The scheduler
decides how many drafts of each request are checked (``verify_lens``), so both
verifiers here take a ragged length per request and stay vectorised over the batch.

Conventions (see docs/ARCHITECTURE.md): ``draft_tokens[:, k]`` is draft ``k`` (0-based)
after the anchor; ``target_probs[:, k]`` is the target's *processed* distribution
(``sampling.logits_to_probs``) for the token that follows anchor + ``drafts[:k]``,
so ``B`` drafts need ``B + 1`` target rows (the last one feeds the bonus token).
A round emits ``accept_len + 1`` tokens: the accepted drafts, then one correction
(after a rejection) or bonus (after accepting all ``l``) token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PAD_TOKEN = -1
"""Fill value of ``VerifyResult.tokens`` after a request's last emitted token."""


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of one verification round for ``N`` requests with block size ``B``.

    ``tokens[i, :num_emitted[i]]`` are the tokens request ``i`` emits this round
    (accepted drafts, then the correction/bonus token); the rest is ``PAD_TOKEN``.
    """

    accept_lens: torch.Tensor  # [N] int64, 0..verify_lens[i]
    tokens: torch.Tensor  # [N, B + 1] int64
    num_emitted: torch.Tensor  # [N] int64, accept_lens + 1

    def __post_init__(self) -> None:
        n = self.accept_lens.shape[0]
        if self.tokens.dim() != 2 or self.tokens.shape[0] != n or self.num_emitted.shape != (n,):
            raise ValueError(
                "VerifyResult: accept_lens [N], tokens [N, B+1] and num_emitted [N] must agree, "
                f"got {tuple(self.accept_lens.shape)}, {tuple(self.tokens.shape)}, "
                f"{tuple(self.num_emitted.shape)}"
            )


def _check_lengths(verify_lens: torch.Tensor, n: int, b: int) -> torch.Tensor:
    if verify_lens.shape != (n,):
        raise ValueError(f"verify_lens must have shape [N]=[{n}], got {tuple(verify_lens.shape)}")
    if verify_lens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"verify_lens must be an integer tensor, got {verify_lens.dtype}")
    lens = verify_lens.to(torch.int64)
    if n and (int(lens.min()) < 0 or int(lens.max()) > b):
        raise ValueError(
            f"verify_lens must lie in 0..B={b}, got range "
            f"[{int(lens.min())}, {int(lens.max())}]; clamp the scheduler output"
        )
    return lens


def _check_uniforms(uniforms: torch.Tensor, n: int, b: int) -> torch.Tensor:
    if uniforms.shape != (n, b) or not uniforms.is_floating_point():
        raise ValueError(
            f"uniforms must be a floating [N, B]=[{n}, {b}] tensor of U[0, 1) draws, got "
            f"{uniforms.dtype} {tuple(uniforms.shape)}"
        )
    if uniforms.numel() and not bool(((uniforms >= 0) & (uniforms < 1)).all()):
        raise ValueError("uniforms must lie in [0, 1) (one U[0, 1) draw per draft)")
    return uniforms


def _emit(
    draft_tokens: torch.Tensor, accept_lens: torch.Tensor, last_token: torch.Tensor
) -> VerifyResult:
    """Pack accepted drafts + the final token into a ``-1``-padded ``[N, B+1]`` tensor."""
    n, b = draft_tokens.shape
    cols = torch.arange(b + 1, device=draft_tokens.device).unsqueeze(0)
    drafts_padded = torch.cat(
        [draft_tokens, torch.full((n, 1), PAD_TOKEN, dtype=torch.int64, device=cols.device)], 1
    )
    acc = accept_lens.unsqueeze(1)
    tokens = torch.where(cols < acc, drafts_padded, torch.full_like(drafts_padded, PAD_TOKEN))
    tokens = torch.where(cols == acc, last_token.unsqueeze(1), tokens)
    return VerifyResult(accept_lens=accept_lens, tokens=tokens, num_emitted=accept_lens + 1)


def chain_verify(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    verify_lens: torch.Tensor,
    generator: torch.Generator | None = None,
    *,
    uniforms: torch.Tensor | None = None,
) -> VerifyResult:
    """Chain speculative sampling with a ragged verify length per request.

    Shapes: ``draft_tokens [N, B]`` int64, ``draft_probs [N, B, V]`` (row k is the
    distribution draft k was drawn from), ``target_probs [N, B+1, V]``,
    ``verify_lens [N]`` in ``0..B``.

    Algorithm: for k < l, accept draft ``x_k`` iff ``u_k * p_d(x_k) < p_t(x_k)``
    (``u_k ~ U[0, 1)``, i.e. with probability ``min(1, p_t/p_d)``; a draft with
    ``p_d(x) = 0`` is accepted iff ``p_t(x) > 0``). ``accept_len`` is the length of
    the accepted prefix. At the first rejection ``r`` the correction token is drawn
    from ``norm(max(0, p_t[r] - p_d[r]))``; if all ``l`` drafts were accepted the
    bonus token is drawn from ``p_t[l]``. A residual with zero mass means
    ``p_t <= p_d`` everywhere, hence ``p_t == p_d`` and rejection had probability 0;
    it can only be reached through float rounding, and then ``p_t`` itself is used.

    ``uniforms`` ``[N, B]`` in ``[0, 1)``, when given, are the ``u_k`` (instead of
    ``B`` draws from ``generator``, which still draws the final token): the same
    uniforms give the same accept lengths on any device, which is how a GPU run is
    compared with the CPU one.

    Invariant: for every request the emitted tokens, continued by plain target
    sampling, are distributed exactly as the target's own samples, for *any* choice
    of ``verify_lens`` that is non-anticipating, i.e. the event ``l >= k`` may depend
    on the drafts before ``k`` (and on anything independent of this round's
    randomness) but not on draft ``k`` or later ones.
    """
    if draft_tokens.dim() != 2:
        raise ValueError(f"draft_tokens must be [N, B], got shape {tuple(draft_tokens.shape)}")
    n, b = draft_tokens.shape
    if draft_probs.dim() != 3 or draft_probs.shape[:2] != (n, b):
        raise ValueError(
            f"draft_probs must be [N, B, V]=[{n}, {b}, V], got {tuple(draft_probs.shape)}"
        )
    v = draft_probs.shape[2]
    if target_probs.shape != (n, b + 1, v):
        raise ValueError(
            f"target_probs must be [N, B+1, V]=[{n}, {b + 1}, {v}] (one row per draft plus "
            f"the bonus row), got {tuple(target_probs.shape)}"
        )
    lens = _check_lengths(verify_lens, n, b)
    drafts = draft_tokens.to(torch.int64)
    device = drafts.device

    idx = drafts.unsqueeze(-1)
    p_d = draft_probs.gather(-1, idx).squeeze(-1)  # [N, B]
    p_t = target_probs[:, :b].gather(-1, idx).squeeze(-1)  # [N, B]
    if uniforms is None:
        u = torch.rand((n, b), generator=generator, device=device, dtype=p_d.dtype)
    else:
        u = _check_uniforms(uniforms, n, b).to(device=device, dtype=p_d.dtype)
    in_window = torch.arange(b, device=device).unsqueeze(0) < lens.unsqueeze(1)
    accepted = (u * p_d < p_t) & in_window
    accept_lens = accepted.to(torch.int64).cumprod(1).sum(1)

    rows = torch.arange(n, device=device)
    work = torch.promote_types(target_probs.dtype, torch.float32)
    final_target = target_probs[rows, accept_lens].to(work)  # [N, V], row r = accept_len
    rejected = accept_lens < lens
    # Draft row at the rejection point (clamped index is only read where rejected).
    final_draft = draft_probs[rows, accept_lens.clamp(max=max(b - 1, 0))].to(work) if b else None
    if final_draft is not None:
        residual = (final_target - final_draft).clamp_(min=0.0)
        has_mass = residual.sum(-1, keepdim=True) > 0
        use_residual = rejected.unsqueeze(1) & has_mass
        final_dist = torch.where(use_residual, residual, final_target)
    else:
        final_dist = final_target
    last_token = torch.multinomial(final_dist, 1, generator=generator).squeeze(1)
    return _emit(drafts, accept_lens, last_token)


def greedy_verify(
    draft_tokens: torch.Tensor, target_argmax: torch.Tensor, verify_lens: torch.Tensor
) -> VerifyResult:
    """Greedy (temperature 0) verification with a ragged verify length per request.

    Shapes: ``draft_tokens [N, B]``, ``target_argmax [N, B+1]`` (the target's argmax
    after anchor + ``drafts[:k]``), ``verify_lens [N]`` in ``0..B``.

    Algorithm: accept the longest prefix of the first ``l`` drafts on which
    ``draft == target_argmax``; the final token is ``target_argmax[accept_len]``.
    Invariant: the emitted tokens are exactly the target's greedy continuation,
    whatever ``verify_lens`` are.
    """
    if draft_tokens.dim() != 2:
        raise ValueError(f"draft_tokens must be [N, B], got shape {tuple(draft_tokens.shape)}")
    n, b = draft_tokens.shape
    if target_argmax.shape != (n, b + 1):
        raise ValueError(
            f"target_argmax must be [N, B+1]=[{n}, {b + 1}], got {tuple(target_argmax.shape)}"
        )
    lens = _check_lengths(verify_lens, n, b)
    drafts = draft_tokens.to(torch.int64)
    targets = target_argmax.to(torch.int64)
    in_window = torch.arange(b, device=drafts.device).unsqueeze(0) < lens.unsqueeze(1)
    match = (drafts == targets[:, :b]) & in_window
    accept_lens = match.to(torch.int64).cumprod(1).sum(1)
    last_token = targets.gather(1, accept_lens.unsqueeze(1)).squeeze(1)
    return _emit(drafts, accept_lens, last_token)
