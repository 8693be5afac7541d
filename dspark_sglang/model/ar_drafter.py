"""An EAGLE3-style one-layer autoregressive drafter (the comparison baseline).

Architecture (kept small and honest, written from the EAGLE3 description):

* the target features of the selected layers at position t are concatenated
  and fused, ``f_t = fc([h^(l1)_t; ...; h^(ln)_t])`` (n*H -> H); the drafter
  uses the *same* target layers as the DSpark/DFlash drafters so all three
  train from one hidden-state cache;
* one Llama-style decoder layer whose attention input is
  ``[norm(embed(x_{t+1})); norm(feature_t)]`` (2H wide), residual on the
  feature, then a SwiGLU MLP; the target's embedding and LM head are shared
  and frozen.

Row t of the drafter predicts ``x_{t+2}`` at step 0 from the *target* feature
``f_t``; at step k >= 1 the same row uses the drafter's *own* output hidden
of step k-1 in place of the target feature and the embedding of
``x_{t+1+k}``, predicting ``x_{t+k+2}``. A block anchored at ``p``
(``slot_convention = "anchor_next"``: slot k predicts ``x_{p+k+1}``) therefore
lives on row ``p-1``, and its context is the target features at positions
``< p``, exactly what the other drafters see.

Training is "training-time test" with teacher forcing: all rows of a
sequence run step 0 in one causal pass, then steps 1..B-1 each run over all
rows, a step-k query at row t attending to step-0 keys at rows ``<= t`` and to
its own chain's keys of steps 1..k (same row). Inference (``propose``) runs the
identical ``_step`` code on the single row ``p-1``, drafting token by token, so
training and inference compute the same function (a test checks it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from dspark_sglang.sampling import logits_to_probs
from dspark_sglang.sampling import sample as sample_tokens

SLOT_CONVENTION = "anchor_next"


@dataclass(frozen=True)
class ARDrafterConfig:
    """Shape of the AR drafter; ``hidden_size``/``vocab_size`` must match the target."""

    hidden_size: int
    vocab_size: int
    target_layer_ids: tuple[int, ...]
    num_attention_heads: int = 8
    num_key_value_heads: int = 8
    intermediate_size: int = 1024
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    block_size: int = 7
    slot_convention: str = SLOT_CONVENTION

    def __post_init__(self) -> None:
        object.__setattr__(self, "target_layer_ids", tuple(int(x) for x in self.target_layer_ids))
        for name in (
            "hidden_size",
            "vocab_size",
            "num_attention_heads",
            "num_key_value_heads",
            "intermediate_size",
            "block_size",
        ):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"ar_drafter.{name} must be an integer >= 1, got {value!r}")
        if not self.target_layer_ids:
            raise ValueError("ar_drafter.target_layer_ids must name at least one target layer")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"ar_drafter.hidden_size ({self.hidden_size}) must be divisible by "
                f"num_attention_heads ({self.num_attention_heads})"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"ar_drafter.num_attention_heads ({self.num_attention_heads}) must be a "
                f"multiple of num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.slot_convention != SLOT_CONVENTION:
            raise ValueError(
                f"ar_drafter.slot_convention must be {SLOT_CONVENTION!r} (slot k predicts "
                f"anchor+k+1), got {self.slot_convention!r}"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> ARDrafterConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown ar_drafter config keys {unknown}; allowed: {sorted(known)}")
        return cls(**data)  # type: ignore[arg-type]


class _RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


def _rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding of ``x`` ``[S, heads, R, d]`` at integer positions ``pos`` ``[R]``."""
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d)
    ang = pos.to(torch.float32).unsqueeze(-1) * inv  # [R, d/2]
    cos = torch.cat([ang.cos(), ang.cos()], -1)
    sin = torch.cat([ang.sin(), ang.sin()], -1)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    rotated = torch.cat([-x2, x1], -1)
    return x * cos + rotated * sin


class ARDrafter(nn.Module):
    """One-layer autoregressive drafter over fused target features."""

    def __init__(
        self, config: ARDrafterConfig, embed_tokens: nn.Embedding, lm_head: nn.Linear
    ) -> None:
        super().__init__()
        c = config
        if embed_tokens.weight.shape != (c.vocab_size, c.hidden_size):
            raise ValueError(
                f"embed_tokens is {tuple(embed_tokens.weight.shape)}, config expects "
                f"({c.vocab_size}, {c.hidden_size})"
            )
        self.config = c
        self.embed_tokens = embed_tokens
        self.lm_head = lm_head
        for p in (*embed_tokens.parameters(), *lm_head.parameters()):
            p.requires_grad_(False)
        n, H, hd = len(c.target_layer_ids), c.hidden_size, c.head_dim
        self.fc = nn.Linear(n * H, H, bias=False)
        self.norm_emb = _RMSNorm(H, c.rms_norm_eps)
        self.norm_feat = _RMSNorm(H, c.rms_norm_eps)
        self.q_proj = nn.Linear(2 * H, c.num_attention_heads * hd, bias=False)
        self.k_proj = nn.Linear(2 * H, c.num_key_value_heads * hd, bias=False)
        self.v_proj = nn.Linear(2 * H, c.num_key_value_heads * hd, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * hd, H, bias=False)
        self.post_norm = _RMSNorm(H, c.rms_norm_eps)
        self.gate_proj = nn.Linear(H, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(H, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, H, bias=False)
        self.final_norm = _RMSNorm(H, c.rms_norm_eps)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for m in (self.fc, self.q_proj, self.k_proj, self.v_proj, self.o_proj):
            nn.init.normal_(m.weight, std=0.02)
        for m in (self.gate_proj, self.up_proj, self.down_proj):
            nn.init.normal_(m.weight, std=0.02)

    # -- building blocks ---------------------------------------------------------------------
    def _split(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        S, R, _ = x.shape
        return x.view(S, R, heads, self.config.head_dim).transpose(1, 2)

    def _kv(self, x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.config
        k = _rope(self._split(self.k_proj(x), c.num_key_value_heads), pos, c.rope_theta)
        v = self._split(self.v_proj(x), c.num_key_value_heads)
        return k, v

    def _inputs(self, emb: torch.Tensor, feat: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.norm_emb(emb), self.norm_feat(feat)], -1)

    def _step(
        self,
        x: torch.Tensor,
        residual: torch.Tensor,
        q_pos: torch.Tensor,
        rows: torch.Tensor,
        k0: torch.Tensor,
        v0: torch.Tensor,
        chain_k: list[torch.Tensor],
        chain_v: list[torch.Tensor],
    ) -> torch.Tensor:
        """One decoder-layer application for query rows ``rows`` ``[R]``.

        Keys: step-0 keys at rows ``<= row`` (causal) plus this row's own chain
        keys ``chain_k[j]`` (``[S, kvh, R, d]``), which must already include
        this step's key. Returns the layer output (pre final-norm) ``[S, R, H]``.
        """
        c = self.config
        rep = c.num_attention_heads // c.num_key_value_heads
        q = _rope(self._split(self.q_proj(x), c.num_attention_heads), q_pos, c.rope_theta)
        k0r, v0r = k0.repeat_interleave(rep, 1), v0.repeat_interleave(rep, 1)
        scale = 1.0 / math.sqrt(c.head_dim)
        s0 = torch.matmul(q, k0r.transpose(-1, -2)) * scale  # [S, h, R, T]
        key_rows = torch.arange(k0.shape[2], device=x.device)
        s0 = s0.masked_fill(key_rows.view(1, 1, 1, -1) > rows.view(1, 1, -1, 1), float("-inf"))
        if chain_k:
            ck = torch.stack([k.repeat_interleave(rep, 1) for k in chain_k], -2)  # [S,h,R,j,d]
            cv = torch.stack([v.repeat_interleave(rep, 1) for v in chain_v], -2)
            sc = (q.unsqueeze(-2) * ck).sum(-1) * scale  # [S, h, R, j]
            probs = torch.softmax(torch.cat([s0, sc], -1), -1)
            T = k0.shape[2]
            attn = torch.matmul(probs[..., :T], v0r) + (probs[..., T:].unsqueeze(-1) * cv).sum(-2)
        else:
            attn = torch.matmul(torch.softmax(s0, -1), v0r)
        S, _, R, _ = attn.shape
        h = residual + self.o_proj(attn.transpose(1, 2).reshape(S, R, -1))
        y = self.post_norm(h)
        return h + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))

    # -- training ----------------------------------------------------------------------------
    def forward_train(
        self, context_hidden: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor
    ) -> torch.Tensor:
        """Teacher-forced training-time test: normed hidden ``[S, A, B, H]`` at the anchors.

        ``context_hidden`` ``[S, T, n*H]`` target features, ``tokens`` ``[S, T]``
        ground truth, ``anchors`` ``[S, A]`` positions ``>= 1``. Slot k of anchor p
        is the step-k output at row ``p-1`` (it predicts ``x_{p+k+1}``).
        """
        S, T, _ = context_hidden.shape
        B = self.config.block_size
        rows = torch.arange(T, device=tokens.device)
        feat = self.fc(context_hidden)
        outs: list[torch.Tensor] = []
        chain_k: list[torch.Tensor] = []
        chain_v: list[torch.Tensor] = []
        k0 = v0 = torch.empty(0)
        prev = feat
        for k in range(B):
            nxt = tokens.gather(1, (rows + 1 + k).clamp(max=T - 1).expand(S, T))
            x = self._inputs(self.embed_tokens(nxt), prev)
            pos = rows + k
            if k == 0:
                k0, v0 = self._kv(x, pos)
            else:
                kk, vv = self._kv(x, pos)
                chain_k.append(kk)
                chain_v.append(vv)
            prev = self._step(x, prev, pos, rows, k0, v0, chain_k, chain_v)
            outs.append(prev)
        hidden = self.final_norm(torch.stack(outs, 2))  # [S, T, B, H]
        idx = (anchors - 1).clamp(min=0)
        return hidden.gather(1, idx[..., None, None].expand(-1, -1, B, hidden.shape[-1]))

    # -- inference ---------------------------------------------------------------------------
    @torch.no_grad()
    def propose(
        self,
        context_hidden: torch.Tensor,
        tokens: torch.Tensor,
        num_tokens: int | None = None,
        temperature: float = 1.0,
        top_k: int = -1,
        top_p: float = 1.0,
        generator: torch.Generator | None = None,
        forced_tokens: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Draft ``num_tokens`` (default B) tokens step by step after the anchor.

        ``tokens`` ``[S, p+1]`` is the sequence up to and including the anchor
        ``x_p``; ``context_hidden`` ``[S, p, n*H]`` the target features at
        positions ``< p``. Returns ``(draft_tokens [S, n], draft_probs [S, n, V],
        logits [S, n, V])`` where ``draft_probs`` is the processed distribution
        each token was drawn from (what chain verification needs as ``p_d``).
        ``forced_tokens`` ``[S, n]`` replaces the sampled tokens (teacher forcing,
        used to check inference against training).
        """
        n = self.config.block_size if num_tokens is None else num_tokens
        S, P, _ = context_hidden.shape
        if tokens.shape != (S, P + 1):
            raise ValueError(
                f"tokens must be [S, p+1] = {(S, P + 1)} for {P} context positions, "
                f"got {tuple(tokens.shape)}"
            )
        if P < 1:
            raise ValueError("propose needs at least one context position (anchor p >= 1)")
        rows_all = torch.arange(P, device=tokens.device)
        x_all = self._inputs(self.embed_tokens(tokens[:, 1:]), self.fc(context_hidden))
        k0, v0 = self._kv(x_all, rows_all)
        row = rows_all[-1:]
        prev = self.fc(context_hidden[:, -1:])
        x = x_all[:, -1:]
        chain_k: list[torch.Tensor] = []
        chain_v: list[torch.Tensor] = []
        drafted, probs_out, logits_out = [], [], []
        for k in range(n):
            if k > 0:
                kk, vv = self._kv(x, row + k)
                chain_k.append(kk)
                chain_v.append(vv)
            prev = self._step(x, prev, row + k, row, k0, v0, chain_k, chain_v)
            logits = self.lm_head(self.final_norm(prev))[:, 0]  # [S, V]
            probs = logits_to_probs(logits, temperature, top_k, top_p)
            tok = (
                forced_tokens[:, k]
                if forced_tokens is not None
                else sample_tokens(probs, generator)
            )
            drafted.append(tok)
            probs_out.append(probs)
            logits_out.append(logits)
            x = self._inputs(self.embed_tokens(tok[:, None]), prev)
        return torch.stack(drafted, 1), torch.stack(probs_out, 1), torch.stack(logits_out, 1)


def save_ar_drafter(
    drafter: ARDrafter, path: str | Path, state: Mapping[str, torch.Tensor] | None = None
) -> None:
    """Trainable weights (not the shared embedding / LM head) + config JSON.

    ``state`` replaces ``drafter.state_dict()`` (e.g. sharded weights gathered whole)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {
        k: v.detach().contiguous()
        for k, v in (drafter.state_dict() if state is None else state).items()
        if not k.startswith(("embed_tokens.", "lm_head."))
    }
    save_file(state, str(path / "ar_drafter.safetensors"))
    (path / "ar_config.json").write_text(json.dumps(asdict(drafter.config), indent=2))


def load_ar_drafter(path: str | Path, embed_tokens: nn.Embedding, lm_head: nn.Linear) -> ARDrafter:
    """Inverse of :func:`save_ar_drafter`; refuses a foreign slot convention via the config."""
    path = Path(path)
    cfg = ARDrafterConfig.from_dict(json.loads((path / "ar_config.json").read_text()))
    drafter = ARDrafter(cfg, embed_tokens, lm_head)
    missing, unexpected = drafter.load_state_dict(
        load_file(str(path / "ar_drafter.safetensors")), strict=False
    )
    missing = [m for m in missing if not m.startswith(("embed_tokens.", "lm_head."))]
    if missing or unexpected:
        raise ValueError(
            f"AR drafter checkpoint {path} does not match its config: missing {missing}, "
            f"unexpected {unexpected}"
        )
    return drafter
