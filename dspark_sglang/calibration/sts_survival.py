"""STS labels and application: survival indicators, observation masks, temperatures.

A round's accepted-draft count gives the prefix-survival label of each block
position (``accepted >= k``); its verified count, when given, says which positions
enter a fit (see ``sts``'s module docstring on why only ``verified`` selects).
``apply_sts`` divides raw confidence logits by one temperature per position and
``survival_probs`` multiplies the conditional confidences into ``A_k``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = [
    "apply_sts",
    "observed_mask",
    "survival_labels",
    "survival_probs",
]


def _check_counts(
    logits: torch.Tensor, accepted: torch.Tensor, verified: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    z = torch.as_tensor(logits)
    if z.dim() != 2 or z.shape[0] == 0 or z.shape[1] == 0:
        raise ValueError(f"logits must be [M, B] with M, B >= 1, got shape {tuple(z.shape)}")
    if not bool(torch.isfinite(z).all()):
        raise ValueError("logits contain NaN or inf")
    m, b = z.shape
    acc = torch.as_tensor(accepted)
    if acc.is_floating_point() and not bool((acc == acc.round()).all()):
        raise ValueError("accepted must hold whole counts")
    acc = acc.reshape(-1).to(torch.int64)
    if acc.numel() != m:
        raise ValueError(f"accepted has {acc.numel()} entries but logits has {m} rows")
    if bool(((acc < 0) | (acc > b)).any()):
        raise ValueError(f"accepted counts must lie in 0..{b} (the block size)")
    ver = None
    if verified is not None:
        ver = torch.as_tensor(verified).reshape(-1).to(torch.int64)
        if ver.numel() != m:
            raise ValueError(f"verified has {ver.numel()} entries but logits has {m} rows")
        if bool(((ver < acc) | (ver > b)).any()):
            raise ValueError(f"verified counts must satisfy accepted <= verified <= {b}")
    return z.to(torch.float64), acc, ver


def survival_labels(accepted: torch.Tensor, block_size: int) -> torch.Tensor:
    """``[M, B]`` bool: draft ``k`` (1-based column ``k-1``) survived iff ``accepted >= k``."""
    ks = torch.arange(1, block_size + 1, device=torch.as_tensor(accepted).device)
    return torch.as_tensor(accepted).reshape(-1, 1) >= ks


def observed_mask(
    accepted: torch.Tensor, verified: torch.Tensor | None, block_size: int
) -> torch.Tensor:
    """``[M, B]`` bool: does position ``k`` of this round enter the fit?

    Only when draft ``k`` was verified (``k <= verified``). Early rejections
    beyond ``verified`` are deliberately *not* kept: including a round only when
    it failed would select on the outcome (see ``sts``'s module docstring).
    """
    acc = torch.as_tensor(accepted).reshape(-1, 1)
    if verified is None:
        return torch.ones(acc.shape[0], block_size, dtype=torch.bool, device=acc.device)
    ver = torch.as_tensor(verified).reshape(-1, 1)
    ks = torch.arange(1, block_size + 1, device=acc.device)
    return (ks <= ver).expand(acc.shape[0], block_size)


def apply_sts(logits: torch.Tensor, temperatures: Sequence[float] | torch.Tensor) -> torch.Tensor:
    """Calibrated conditional confidences ``c_k = sigmoid(z_k / T_k)`` over the last axis."""
    z = torch.as_tensor(logits)
    t = torch.as_tensor(temperatures, dtype=z.dtype if z.is_floating_point() else torch.float32)
    if t.dim() != 1 or t.numel() != z.shape[-1]:
        raise ValueError(
            f"need one temperature per block position: {t.numel()} temperatures for "
            f"logits of block size {z.shape[-1]}"
        )
    if not bool((t > 0).all()) or not bool(torch.isfinite(t).all()):
        raise ValueError("temperatures must be finite and > 0")
    return torch.sigmoid(z / t.to(z.device))


def survival_probs(confidences: torch.Tensor) -> torch.Tensor:
    """``A_k = prod_{j<=k} c_j`` over the last axis (non-increasing in ``k``)."""
    return torch.cumprod(confidences, dim=-1)
