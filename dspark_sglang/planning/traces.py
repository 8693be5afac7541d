"""Acceptance traces: what the scheduler would see live, recorded once, replayed by the simulator.

A trace is a sequence of drafting *rounds*. Each round records, for one request of one
domain, the drafter's raw confidence logits ``z`` (``[B]``, before STS) and
``accepted``: how many of the ``B`` drafts the target would have accepted had all of
them been verified (``0..B``).

Why "had all been verified" is enough: chain verification checks drafts left to right
and stops at the first rejection, and whether draft ``k`` survives depends only on the
tokens up to ``k`` (the target's distribution at each position is conditioned on the
accepted prefix only). A round verified with ``l`` drafts therefore accepts exactly

    accepted(l) = min(accepted_full, l)

(``accepted_under`` below), so one full-block recording answers every policy's
question about that round. Rounds of one request are stored in generation order so a
replay keeps the within-request correlation of acceptance (easy/hard passages).

On-disk formats (both round-trip exactly):

``*.jsonl``
    One object per round: ``{"request_id": int, "domain": str,
    "confidence_logits": [B floats], "accepted": int}``.
``*.pt``
    ``torch.save`` of ``{"request_id": int64 [M], "domain_index": int64 [M],
    "domains": list[str], "confidence_logits": float32 [M, B], "accepted": int64 [M]}``.
``*.pt`` (SGLang ``StsDataRecorder`` shards, from a running server)
    ``{"logits": [M, B], "prefix_mask": [M, B]}``: read as rounds of domain ``live``, one
    request each (the shard records no request ids).

Real traces come from the trained drafter's rollouts on SmolLM2 (GSM8K / MT-Bench /
code prompts); ``synthetic_traces`` builds controlled ones for tests and first plots.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist

import msgspec
import torch

from dspark_sglang.calibration.rollouts import check_round_logits, decode_jsonl, stack_round_logits

__all__ = [
    "AcceptanceTraces",
    "TraceRecord",
    "accepted_under",
    "concat_traces",
    "decaying_acceptance",
    "load_traces",
    "load_traces_many",
    "save_traces",
    "synthetic_traces",
]


def accepted_under(accepted_full: torch.Tensor, verify_lens: torch.Tensor) -> torch.Tensor:
    """Drafts accepted when only ``verify_lens`` of them are verified: ``min(full, l)``.

    Valid for chain verification, where draft ``k``'s fate depends on tokens ``<= k`` only.
    """
    return torch.minimum(accepted_full.to(torch.int64), verify_lens.to(torch.int64))


@dataclass(frozen=True)
class AcceptanceTraces:
    """``M`` recorded rounds with block size ``B``, grouped by request.

    Fields:
        request_id: int64 ``[M]``; rounds of one request are contiguous and in order.
        domain_index: int64 ``[M]``, index into ``domains``; constant within a request.
        domains: domain names (e.g. ``"gsm8k"``, ``"mt-bench"``), unique, non-empty.
        confidence_logits: float32 ``[M, B]`` raw confidence-head logits (pre-STS).
        accepted: int64 ``[M]`` in ``0..B``: drafts accepted had all ``B`` been verified.
    """

    request_id: torch.Tensor
    domain_index: torch.Tensor
    domains: tuple[str, ...]
    confidence_logits: torch.Tensor
    accepted: torch.Tensor

    def __post_init__(self) -> None:
        m, b = check_round_logits(self.confidence_logits, owner="AcceptanceTraces.")
        for name in ("request_id", "domain_index", "accepted"):
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor) or t.dtype != torch.int64 or t.shape != (m,):
                got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t)
                raise ValueError(f"AcceptanceTraces.{name} must be int64 [{m}], got {got}")
        if bool(((self.accepted < 0) | (self.accepted > b)).any()):
            raise ValueError(
                f"AcceptanceTraces.accepted must lie in 0..{b} (the block size): it counts "
                "drafts accepted had the whole block been verified"
            )
        if not self.domains or len(set(self.domains)) != len(self.domains):
            raise ValueError(
                f"AcceptanceTraces.domains must be non-empty and unique, got {self.domains!r}"
            )
        if any(not isinstance(d, str) or not d for d in self.domains):
            raise ValueError("AcceptanceTraces.domains must be non-empty strings")
        di = self.domain_index
        if bool(((di < 0) | (di >= len(self.domains))).any()):
            raise ValueError(
                f"AcceptanceTraces.domain_index must lie in 0..{len(self.domains) - 1} "
                "(an index into domains)"
            )
        starts = self._starts()
        # Contiguity: each request id appears in exactly one run of rounds.
        run_ids = self.request_id[starts]
        if run_ids.unique().numel() != run_ids.numel():
            raise ValueError(
                "AcceptanceTraces.request_id: rounds of one request must be contiguous (sort "
                "the rounds by request, keeping generation order within a request)"
            )
        run_of_round = torch.repeat_interleave(
            torch.arange(starts.numel()), torch.diff(starts, append=torch.tensor([m]))
        )
        if not bool((self.domain_index == self.domain_index[starts][run_of_round]).all()):
            raise ValueError("AcceptanceTraces.domain_index must be constant within a request")

    def _starts(self) -> torch.Tensor:
        rid = self.request_id
        change = torch.ones_like(rid, dtype=torch.bool)
        change[1:] = rid[1:] != rid[:-1]
        return torch.nonzero(change).reshape(-1)

    @property
    def block_size(self) -> int:
        return int(self.confidence_logits.shape[1])

    @property
    def num_rounds(self) -> int:
        return int(self.confidence_logits.shape[0])

    def request_spans(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per recorded request: ``(start, length, domain_index)`` int64 tensors ``[R]``."""
        starts = self._starts()
        lengths = torch.diff(starts, append=torch.tensor([self.num_rounds]))
        return starts, lengths, self.domain_index[starts]

    def mean_accept_length(self, verify_len: int | None = None) -> float:
        """Mean tokens per round (accepted + 1 bonus/correction) at a fixed verify length."""
        full = self.accepted
        l = torch.full_like(full, self.block_size if verify_len is None else int(verify_len))
        return float(accepted_under(full, l).double().mean()) + 1.0

    def conditional_acceptance(self) -> torch.Tensor:
        """Empirical ``P(draft k passes | drafts < k passed)``, float64 ``[B]`` (nan: unseen)."""
        ks = torch.arange(self.block_size)
        reached = (self.accepted.reshape(-1, 1) >= ks).sum(0).double()
        passed = (self.accepted.reshape(-1, 1) > ks).sum(0).double()
        return passed / reached

    def select_domains(self, names: Sequence[str]) -> AcceptanceTraces:
        """Only the rounds of the given domains (order of ``names`` kept for indices)."""
        missing = [n for n in names if n not in self.domains]
        if missing:
            raise ValueError(f"unknown domain(s) {missing}; traces have {list(self.domains)}")
        remap = torch.full((len(self.domains),), -1, dtype=torch.int64)
        for new, n in enumerate(names):
            remap[self.domains.index(n)] = new
        keep = remap[self.domain_index] >= 0
        return AcceptanceTraces(
            request_id=self.request_id[keep],
            domain_index=remap[self.domain_index[keep]],
            domains=tuple(names),
            confidence_logits=self.confidence_logits[keep],
            accepted=self.accepted[keep],
        )


class TraceRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One ``.jsonl`` line: one drafting round of one request."""

    request_id: int
    domain: str
    confidence_logits: list[float]
    accepted: int

    def __post_init__(self) -> None:
        b = len(self.confidence_logits)
        if b == 0:
            raise ValueError("confidence_logits is empty: give one raw logit per block position")
        if not 0 <= self.accepted <= b:
            raise ValueError(
                f"accepted = {self.accepted} must lie in 0..{b}: drafts accepted had all "
                "B been verified"
            )
        if not self.domain:
            raise ValueError("domain must be a non-empty string (e.g. 'gsm8k')")


def _from_records(rows: Sequence[TraceRecord], src: str) -> AcceptanceTraces:
    logits = stack_round_logits(rows, src)
    domains = tuple(dict.fromkeys(r.domain for r in rows))
    index = {d: i for i, d in enumerate(domains)}
    try:
        return AcceptanceTraces(
            request_id=torch.tensor([r.request_id for r in rows], dtype=torch.int64),
            domain_index=torch.tensor([index[r.domain] for r in rows], dtype=torch.int64),
            domains=domains,
            confidence_logits=logits,
            accepted=torch.tensor([r.accepted for r in rows], dtype=torch.int64),
        )
    except ValueError as exc:
        raise ValueError(f"{src}: {exc}") from exc


def load_traces(path: str | Path) -> AcceptanceTraces:
    """Read traces from ``.jsonl`` or ``.pt`` (see the module docstring for the layouts)."""
    p = Path(path)
    src = str(p)
    if not p.is_file():
        raise ValueError(f"trace file {src} does not exist")
    if p.suffix == ".jsonl":
        return _from_records(decode_jsonl(p, TraceRecord), src)
    if p.suffix == ".pt":
        try:
            obj = torch.load(p, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise ValueError(f"{src}: cannot load as a torch file ({exc})") from exc
        need = {"request_id", "domain_index", "domains", "confidence_logits", "accepted"}
        if isinstance(obj, dict) and set(obj) == {"logits", "prefix_mask"}:
            return _from_sglang_shard(p)
        if not isinstance(obj, dict) or set(obj) != need:
            keys = sorted(map(str, obj)) if isinstance(obj, dict) else type(obj).__name__
            raise ValueError(f"{src}: expected keys {sorted(need)}, got {keys}")
        try:
            return AcceptanceTraces(
                request_id=obj["request_id"],
                domain_index=obj["domain_index"],
                domains=tuple(obj["domains"]),
                confidence_logits=obj["confidence_logits"],
                accepted=obj["accepted"],
            )
        except ValueError as exc:
            raise ValueError(f"{src}: {exc}") from exc
    raise ValueError(f"{src}: unknown trace format {p.suffix!r}; use .jsonl or .pt")


#: Domain of rounds recorded by a live server (SGLang's STS recorder names none).
LIVE_DOMAIN = "live"


def _from_sglang_shard(p: Path) -> AcceptanceTraces:
    """A shard of SGLang's STS recorder (``SGLANG_DSPARK_STS_COLLECT_PATH``) as traces.

    The recorder stores, per verified round of a running server, the raw confidence
    logits and the greedy-correct prefix of all ``B`` drafts: exactly a trace round.
    It does not store which request a round belongs to, so each round replays as its
    own request (domain ``live``): the simulator then draws rounds independently and
    loses the within-request correlation of acceptance that offline traces keep.
    """
    from dspark_sglang.calibration.rollouts import load_rollouts

    r = load_rollouts([p])
    if r.verified is not None:
        raise ValueError(f"{p}: an STS shard verifies whole blocks; got per-round verify counts")
    m = r.accepted.shape[0]
    return AcceptanceTraces(
        request_id=torch.arange(m, dtype=torch.int64),
        domain_index=torch.zeros(m, dtype=torch.int64),
        domains=(LIVE_DOMAIN,),
        confidence_logits=r.confidence_logits,
        accepted=r.accepted,
    )


def load_traces_many(paths: Sequence[str | Path]) -> AcceptanceTraces:
    """Several trace files (e.g. one per domain, as ``bench acceptance`` writes them) as one
    set; request ids are renumbered per file (``concat_traces``)."""
    if not paths:
        raise ValueError("no trace files given")
    return concat_traces([load_traces(p) for p in paths])


def save_traces(traces: AcceptanceTraces, path: str | Path) -> None:
    """Write ``.jsonl`` or ``.pt`` (chosen by suffix); ``load_traces`` reads it back exactly."""
    p = Path(path)
    if p.suffix == ".pt":
        torch.save(
            {
                "request_id": traces.request_id,
                "domain_index": traces.domain_index,
                "domains": list(traces.domains),
                "confidence_logits": traces.confidence_logits,
                "accepted": traces.accepted,
            },
            p,
        )
        return
    if p.suffix != ".jsonl":
        raise ValueError(f"{p}: unknown trace format {p.suffix!r}; use .jsonl or .pt")
    enc = msgspec.json.Encoder()
    rid = traces.request_id.tolist()
    dom = [traces.domains[i] for i in traces.domain_index.tolist()]
    z = traces.confidence_logits.tolist()
    acc = traces.accepted.tolist()
    with p.open("wb") as f:
        for i in range(traces.num_rounds):
            f.write(enc.encode(TraceRecord(rid[i], dom[i], z[i], acc[i])) + b"\n")


def concat_traces(parts: Sequence[AcceptanceTraces]) -> AcceptanceTraces:
    """Join traces (e.g. one per domain); request ids are renumbered to stay unique."""
    if not parts:
        raise ValueError("concat_traces needs at least one trace set")
    b = parts[0].block_size
    if any(t.block_size != b for t in parts):
        raise ValueError(
            f"all traces must share one block size, got {[t.block_size for t in parts]}"
        )
    domains = tuple(dict.fromkeys(d for t in parts for d in t.domains))
    rids, dis, zs, accs = [], [], [], []
    offset = 0
    for t in parts:
        _, inverse = torch.unique_consecutive(t.request_id, return_inverse=True)
        rids.append(inverse + offset)
        offset += int(inverse.max()) + 1
        remap = torch.tensor([domains.index(d) for d in t.domains], dtype=torch.int64)
        dis.append(remap[t.domain_index])
        zs.append(t.confidence_logits)
        accs.append(t.accepted)
    return AcceptanceTraces(
        torch.cat(rids), torch.cat(dis), domains, torch.cat(zs), torch.cat(accs)
    )


def decaying_acceptance(first: float, decay: float, block_size: int) -> tuple[float, ...]:
    """Per-position conditional acceptance ``first * decay**k`` (``decay = 1``: flat)."""
    if not 0.0 < first < 1.0 or not 0.0 < decay <= 1.0:
        raise ValueError(f"need 0 < first < 1 and 0 < decay <= 1, got {first}, {decay}")
    return tuple(first * decay**k for k in range(block_size))


def synthetic_traces(
    num_requests: int,
    rounds_per_request: int,
    acceptance: Sequence[float],
    *,
    auc: float = 0.85,
    request_spread: float = 0.0,
    domain: str = "synthetic",
    seed: int = 0,
) -> AcceptanceTraces:
    """Traces with a known per-position acceptance and a confidence head of a chosen AUC.

    Model (binormal, exactly calibrated): request ``r`` has a difficulty shift
    ``u_r ~ N(0, request_spread^2)``; draft ``k`` passes (given its prefix passed) with
    ``p = sigmoid(logit(acceptance[k]) + u_r)``, outcomes independent. The head sees a
    score ``s ~ N(mu * o, 1)`` (``o`` = the outcome) with ``mu = sqrt(2) * Phi^-1(auc)``,
    so ``AUC(s) = auc``, and reports the Bayes posterior logit
    ``z = logit(p) + mu * s - mu^2 / 2``: ``sigmoid(z)`` is calibrated (STS temperature 1)
    and ranks outcomes with exactly the chosen AUC. ``accepted`` = leading passes.
    """
    if num_requests < 1 or rounds_per_request < 1:
        raise ValueError("num_requests and rounds_per_request must be >= 1")
    acc = torch.tensor(list(acceptance), dtype=torch.float64)
    if acc.dim() != 1 or acc.numel() == 0 or bool(((acc <= 0) | (acc >= 1)).any()):
        raise ValueError(
            "acceptance must be a non-empty list of per-position probabilities in (0, 1)"
        )
    if not 0.5 <= auc < 1.0:
        raise ValueError(f"auc must be in [0.5, 1) (0.5 = uninformative head), got {auc}")
    if request_spread < 0 or not math.isfinite(request_spread):
        raise ValueError(f"request_spread must be finite and >= 0, got {request_spread}")
    g = torch.Generator().manual_seed(seed)
    m, b = num_requests * rounds_per_request, acc.numel()
    mu = math.sqrt(2.0) * NormalDist().inv_cdf(auc)
    shift = request_spread * torch.randn(num_requests, 1, generator=g, dtype=torch.float64)
    base = torch.logit(acc).reshape(1, b) + shift.repeat_interleave(rounds_per_request, 0)
    passed = torch.rand(m, b, generator=g, dtype=torch.float64) < torch.sigmoid(base)
    score = mu * passed.double() + torch.randn(m, b, generator=g, dtype=torch.float64)
    z = base + mu * score - mu * mu / 2.0
    return AcceptanceTraces(
        request_id=torch.arange(num_requests).repeat_interleave(rounds_per_request),
        domain_index=torch.zeros(m, dtype=torch.int64),
        domains=(domain,),
        confidence_logits=z.to(torch.float32),
        accepted=torch.cumprod(passed.long(), dim=1).sum(1),
    )
