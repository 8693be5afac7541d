"""Held-out rollouts for STS: raw confidence logits and how many drafts survived.

Three on-disk layouts are read, so calibration data can come from our reference
generator or from SGLang's own recorder without conversion:

``*.pt`` (ours)
    ``torch.save`` of ``{"confidence_logits": float [M, B], "accepted": int [M]}``
    plus optionally ``"verified": int [M]`` (drafts verified that round; omit
    when every round verified the whole block).
``*.jsonl`` (ours)
    One object per round: ``{"confidence_logits": [B floats], "accepted": int}``
    and optionally ``"verified": int``.
``*.pt`` (SGLang ``StsDataRecorder`` shards)
    ``{"logits": float [n, gamma], "prefix_mask": float [n, gamma]}`` with
    ``prefix_mask[i, k] = 1`` iff ``k < accepted_i``; converted back to counts
    (the mask must be a 0/1 prefix, or the shard is refused).

Invariants of ``Rollouts``: ``0 <= accepted <= verified <= B`` and finite logits.
"""

from __future__ import annotations

import glob
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

import msgspec
import torch

__all__ = ["RolloutRecord", "Rollouts", "check_round_logits", "load_rollouts", "save_rollouts"]


def check_round_logits(z: object, owner: str = "") -> tuple[int, int]:
    """Validate raw confidence logits of ``M`` rounds x ``B`` positions; return ``(M, B)``.

    Shared by calibration rollouts and the planner's acceptance traces, which
    record the same per-round logits. ``owner`` prefixes the field in messages.
    """
    if not isinstance(z, torch.Tensor) or z.dim() != 2 or z.shape[0] == 0 or z.shape[1] == 0:
        raise ValueError(
            f"{owner}confidence_logits must be a float tensor [M, B] with M, B >= 1, got "
            f"{tuple(z.shape) if isinstance(z, torch.Tensor) else type(z).__name__}"
        )
    if not z.is_floating_point() or not bool(torch.isfinite(z).all()):
        raise ValueError(f"{owner}confidence_logits must be finite floats")
    return int(z.shape[0]), int(z.shape[1])


@dataclass(frozen=True)
class Rollouts:
    """Concatenated calibration rounds (``M`` rounds, block size ``B``)."""

    confidence_logits: torch.Tensor  # float32 [M, B]
    accepted: torch.Tensor  # int64 [M]
    verified: torch.Tensor | None = None  # int64 [M]; None = whole block verified
    sources: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        acc, ver = self.accepted, self.verified
        m, b = check_round_logits(self.confidence_logits)
        if acc.dtype != torch.int64 or acc.shape != (m,):
            raise ValueError(f"accepted must be int64 [{m}], got {acc.dtype} {tuple(acc.shape)}")
        if bool(((acc < 0) | (acc > b)).any()):
            raise ValueError(f"accepted counts must lie in 0..{b} (the block size)")
        if ver is not None:
            if ver.dtype != torch.int64 or ver.shape != (m,):
                raise ValueError(
                    f"verified must be int64 [{m}], got {ver.dtype} {tuple(ver.shape)}"
                )
            if bool(((ver < acc) | (ver > b)).any()):
                raise ValueError(f"verified counts must satisfy accepted <= verified <= {b}")

    @property
    def block_size(self) -> int:
        return int(self.confidence_logits.shape[1])

    @property
    def num_rounds(self) -> int:
        return int(self.confidence_logits.shape[0])


class RolloutRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """One ``.jsonl`` line: one verification round of one request.

    ``confidence_logits`` has one raw logit per block position; ``accepted`` is
    how many drafts passed (``0..B``); ``verified`` (optional) how many were
    verified (``accepted..B``).
    """

    confidence_logits: list[float]
    accepted: int
    verified: int | None = None

    def __post_init__(self) -> None:
        b = len(self.confidence_logits)
        if b == 0:
            raise ValueError("confidence_logits is empty: give one raw logit per block position")
        if not 0 <= self.accepted <= b:
            raise ValueError(f"accepted = {self.accepted} must lie in 0..{b} (the block size)")
        if self.verified is not None and not self.accepted <= self.verified <= b:
            raise ValueError(
                f"verified = {self.verified} must lie in accepted..{b} ({self.accepted}..{b})"
            )


def _as_counts(name: str, t: object, source: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{source}: {name!r} must be a tensor, got {type(t).__name__}")
    if t.is_floating_point():
        if not bool((t == t.round()).all()):
            raise ValueError(f"{source}: {name!r} must hold whole counts")
    elif t.dtype == torch.bool or t.is_complex():
        raise ValueError(f"{source}: {name!r} must be an integer tensor, got {t.dtype}")
    return t.reshape(-1).to(torch.int64)


def _from_prefix_mask(mask: torch.Tensor, source: str) -> torch.Tensor:
    """Accepted counts from a 0/1 prefix mask ``[n, gamma]`` (SGLang's recorder layout)."""
    m = mask.to(torch.float64)
    if not bool(((m == 0) | (m == 1)).all()):
        raise ValueError(f"{source}: prefix_mask must contain only 0 and 1")
    if m.shape[1] > 1 and bool((m[:, 1:] > m[:, :-1]).any()):
        raise ValueError(
            f"{source}: prefix_mask rows must be prefixes (ones then zeros); "
            "this is not an StsDataRecorder shard"
        )
    return m.sum(1).to(torch.int64)


def _load_pt(path: Path) -> Rollouts:
    src = str(path)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ValueError(f"{src}: cannot load as a torch file ({exc})") from exc
    if not isinstance(obj, dict):
        raise ValueError(f"{src}: expected a dict of tensors, got {type(obj).__name__}")
    keys = set(obj)
    if keys == {"logits", "prefix_mask"}:
        z, mask = obj["logits"], obj["prefix_mask"]
        if not isinstance(z, torch.Tensor) or not isinstance(mask, torch.Tensor):
            raise ValueError(f"{src}: 'logits' and 'prefix_mask' must be tensors")
        if z.dim() != 2 or z.shape != mask.shape:
            raise ValueError(
                f"{src}: 'logits' and 'prefix_mask' must share a [n, gamma] shape, got "
                f"{tuple(z.shape)} vs {tuple(mask.shape)}"
            )
        return Rollouts(z.float(), _from_prefix_mask(mask, src), None, (src,))
    ours = {"confidence_logits", "accepted"}
    if ours <= keys <= ours | {"verified"}:
        z = obj["confidence_logits"]
        if not isinstance(z, torch.Tensor) or not z.is_floating_point():
            raise ValueError(f"{src}: 'confidence_logits' must be a float tensor")
        acc = _as_counts("accepted", obj["accepted"], src)
        ver = obj.get("verified")
        ver_t = None if ver is None else _as_counts("verified", ver, src)
        try:
            return Rollouts(z.float(), acc, ver_t, (src,))
        except ValueError as exc:
            raise ValueError(f"{src}: {exc}") from exc
    raise ValueError(
        f"{src}: unrecognised keys {sorted(map(str, keys))}; expected "
        "{'confidence_logits', 'accepted'[, 'verified']} (ours) or "
        "{'logits', 'prefix_mask'} (SGLang StsDataRecorder shard)"
    )


_Row = TypeVar("_Row")


def decode_jsonl(path: Path, record_type: type[_Row]) -> list[_Row]:
    """Typed rows of a ``.jsonl`` file; errors name ``file:line`` so a bad row is easy to find.

    Shared by calibration rollouts and the planner's acceptance traces.
    """
    decoder = msgspec.json.Decoder(record_type)
    rows: list[_Row] = []
    with path.open("rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(decoder.decode(line))
            except (msgspec.DecodeError, ValueError) as exc:
                raise ValueError(f"{path}:{lineno}: {exc}") from exc
    return rows


class _HasLogits(Protocol):
    confidence_logits: list[float]


def stack_round_logits(rows: Sequence[_HasLogits], src: str) -> torch.Tensor:
    """``[rounds, B]`` float32 confidence logits of decoded rows, one block size for all.

    Shared by calibration rollouts and the planner's acceptance traces: a ragged file
    would otherwise fail later inside ``torch.tensor`` without naming the line.
    """
    if not rows:
        raise ValueError(f"{src}: no rounds in file")
    b = len(rows[0].confidence_logits)
    for i, r in enumerate(rows):
        if len(r.confidence_logits) != b:
            raise ValueError(
                f"{src}: round {i + 1} has {len(r.confidence_logits)} confidence_logits, "
                f"the first has {b}; every round needs the same block size"
            )
    return torch.tensor([r.confidence_logits for r in rows], dtype=torch.float32)


def _load_jsonl(path: Path) -> Rollouts:
    src = str(path)
    rows = decode_jsonl(path, RolloutRecord)
    z = stack_round_logits(rows, src)
    has_ver = [r.verified is not None for r in rows]
    if any(has_ver) and not all(has_ver):
        raise ValueError(f"{src}: 'verified' must be given on every line or on none")
    acc = torch.tensor([r.accepted for r in rows], dtype=torch.int64)
    ver = torch.tensor([r.verified for r in rows], dtype=torch.int64) if all(has_ver) else None
    try:
        return Rollouts(z, acc, ver, (src,))
    except ValueError as exc:
        raise ValueError(f"{src}: {exc}") from exc


def _expand(paths: Iterable[str | Path]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        s = str(p)
        if not Path(s).exists() and glob.has_magic(s):
            matches = sorted(glob.glob(s))
            if not matches:
                raise ValueError(f"no rollout files match {s!r}")
            out.extend(Path(x) for x in matches)
        else:
            out.append(Path(s))
    return out


def load_rollouts(paths: Iterable[str | Path]) -> Rollouts:
    """Load and concatenate rollout files (globs allowed); all need one block size."""
    files = _expand(paths)
    if not files:
        raise ValueError("no rollout files given")
    parts: list[Rollouts] = []
    for p in files:
        if not p.is_file():
            raise ValueError(f"rollout file not found: {p}")
        part = _load_jsonl(p) if p.suffix == ".jsonl" else _load_pt(p)
        if parts and part.block_size != parts[0].block_size:
            raise ValueError(
                f"{p}: block size {part.block_size} differs from {parts[0].sources[0]}'s "
                f"{parts[0].block_size}; calibrate each block size separately"
            )
        parts.append(part)
    z = torch.cat([r.confidence_logits for r in parts])
    acc = torch.cat([r.accepted for r in parts])
    ver = None
    if any(r.verified is not None for r in parts):
        ver = torch.cat(
            [
                r.verified if r.verified is not None else torch.full_like(r.accepted, r.block_size)
                for r in parts
            ]
        )
    return Rollouts(z, acc, ver, tuple(s for r in parts for s in r.sources))


def save_rollouts(path: str | Path, rollouts: Rollouts) -> None:
    """Write our ``.pt`` (default) or ``.jsonl`` layout, chosen by suffix."""
    p = Path(path)
    if p.suffix == ".jsonl":
        enc = msgspec.json.Encoder()
        ver = rollouts.verified.tolist() if rollouts.verified is not None else None
        with p.open("wb") as f:
            for i, (z, a) in enumerate(
                zip(rollouts.confidence_logits.tolist(), rollouts.accepted.tolist(), strict=True)
            ):
                rec = RolloutRecord(z, a, None if ver is None else ver[i])
                f.write(enc.encode(rec) + b"\n")
        return
    obj: dict[str, torch.Tensor] = {
        "confidence_logits": rollouts.confidence_logits,
        "accepted": rollouts.accepted,
    }
    if rollouts.verified is not None:
        obj["verified"] = rollouts.verified
    torch.save(obj, p)
