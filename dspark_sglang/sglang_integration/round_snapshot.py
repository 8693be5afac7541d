"""Names and snapshot arithmetic of the round profiler (``round_profile.py``), engine-free.

What a ``DSPARK_PROFILE_ROUNDS`` snapshot holds and how to read it, without SGLang:
the timer names (:data:`ROUND`, :data:`PLAIN_STEP`, the phases of :data:`PHASES`, the
per-shape verify timers of :func:`shape_timer`), where a process writes its snapshot
(:func:`profile_path`), and the reader's side: :func:`read_snapshot`, :func:`delta`
of two snapshots, :func:`summarize` (mean ms per round per phase), :func:`plain_step_ms`
and :func:`verify_shapes`. Benchmarks use these; ``round_profile`` re-exports them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV = "DSPARK_PROFILE_ROUNDS"
SNAPSHOT_VERSION = 1
ROUND = "round"
PLAIN_STEP = "plain_step"
PROPOSE = "propose"
VERIFY_MODEL_FORWARD = "verify_model_forward"


@dataclass(frozen=True)
class Phase:
    """One timed (or derived) part of a round."""

    name: str
    group: str
    label: str
    #: What is wrapped; empty for a derived row.
    wraps: str = ""


#: The round's phases in execution order. Every measured one is disjoint from the others;
#: ``draft_rest`` is ``propose`` minus the four draft phases, ``unattributed`` is the
#: round minus everything else. So the rows add up to the round by construction, and
#: ``unattributed`` says how much of it no wrapper saw.
PHASES: tuple[Phase, ...] = (
    Phase(
        "verify_window",
        "accept + KV bookkeeping",
        "verify window: KV slots and positions",
        "dspark_planner.alloc_verify_window (hook)",
    ),
    Phase(
        "draft_forward",
        "draft",
        "draft backbone forward",
        "proposer._run_forward",
    ),
    Phase(
        "draft_base_logits",
        "draft",
        "draft LM head (base logits)",
        "draft_model.compute_base_logits",
    ),
    Phase(
        "markov_loop",
        "draft",
        "Markov sequential loop",
        "dspark_draft.sample_draft_block (hook)",
    ),
    Phase(
        "confidence",
        "confidence + policy",
        "confidence head",
        "draft_model.compute_confidence",
    ),
    Phase(
        "draft_rest",
        "draft",
        "rest of propose (embedding, fault guard)",
    ),
    Phase(
        "verify_budget",
        "confidence + policy",
        "verify token budget",
        "verify_planner.resolve_verify_token_budget",
    ),
    Phase(
        "verify_layout",
        "confidence + policy",
        "policy decision + layout",
        "verify_planner.schedule_layout",
    ),
    Phase(
        "verify_forward",
        "target verify",
        "target verify forward",
        "verify_executor.run_non_compact / run_compact; a plain step's decode forward",
    ),
    Phase(
        "accept",
        "accept + KV bookkeeping",
        "accept",
        "verify_executor.accept_and_finalize",
    ),
    Phase(
        "commit_hidden",
        "accept + KV bookkeeping",
        "commit: target hidden -> draft KV",
        "verify_executor.commit_hidden; a plain step's commit",
    ),
    Phase(
        "observers",
        "accept + KV bookkeeping",
        "SGLang's step observers",
        "worker._observers.observe_verify_step",
    ),
    Phase(
        "dspark_metrics",
        "accept + KV bookkeeping",
        "DSPARK_MOE metrics",
        "worker._observe_round",
    ),
    Phase("unattributed", "unattributed", "unattributed remainder"),
)
DRAFT_PHASES = ("draft_forward", "draft_base_logits", "markov_loop", "confidence")
DERIVED = ("draft_rest", "unattributed")
MEASURED = tuple(p.name for p in PHASES if p.name not in DERIVED)
#: Everything a snapshot may hold, besides the verify forward per shape (below).
TIMERS = (ROUND, PLAIN_STEP, PROPOSE, VERIFY_MODEL_FORWARD, *MEASURED)
#: The target's verify forward is also timed per shape, as ``verify@<requests>x<tokens>``
#: (:func:`shape_timer`): what a cost table prices, measured on the batches it prices.
SHAPE_PREFIX = "verify@"


def shape_timer(num_reqs: int, tokens: int) -> str:
    """The timer name of a verify forward over ``tokens`` tokens of ``num_reqs`` requests."""
    if num_reqs < 1 or tokens < num_reqs:
        raise ValueError(f"a verify has >= 1 request and a token each, got {num_reqs}, {tokens}")
    return f"{SHAPE_PREFIX}{num_reqs}x{tokens}"


def verify_shapes(timers: Mapping[str, Mapping[str, float]]) -> list[dict[str, Any]]:
    """The per-shape verify timers of a snapshot or :func:`delta`, as rows.

    Each row: ``requests``, ``tokens``, ``calls`` and ``ms`` (mean per call), sorted by
    requests, then tokens.
    """
    rows = []
    for name, t in timers.items():
        if not name.startswith(SHAPE_PREFIX):
            continue
        n, b = (int(x) for x in name[len(SHAPE_PREFIX) :].split("x"))
        calls = int(t["calls"])
        rows.append(
            {"requests": n, "tokens": b, "calls": calls, "ms": 1e3 * float(t["seconds"]) / calls}
        )
    return sorted(rows, key=lambda r: (r["requests"], r["tokens"]))


def profile_path(env: Mapping[str, str] | None = None, *, tp_rank: int = 0) -> Path | None:
    """Where this process writes its snapshot, or ``None`` when profiling is off.

    Raises ``ValueError`` naming :data:`ENV` when the value cannot be a JSON file path.
    """
    env = os.environ if env is None else env
    raw = env.get(ENV, "").strip()
    if not raw:
        return None
    path = Path(raw)
    if path.suffix != ".json":
        raise ValueError(
            f"{ENV}={raw!r}: give the path of a .json file the scheduler process "
            "writes its phase timings to (unset it to turn profiling off)"
        )
    if path.exists() and path.is_dir():
        raise ValueError(f"{ENV}={raw!r} is a directory; give a .json file path")
    if tp_rank < 0:
        raise ValueError(f"tp_rank must be >= 0, got {tp_rank}")
    return path if tp_rank == 0 else path.with_suffix(f".rank{tp_rank}.json")


def read_snapshot(path: Path) -> dict[str, dict[str, float]]:
    """The timers of a snapshot file (``{}`` when no step has been timed yet)."""
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("version") != SNAPSHOT_VERSION:
        raise ValueError(
            f"{path}: snapshot version {data.get('version')!r}, expected {SNAPSHOT_VERSION}"
        )
    return data["timers"]


def delta(
    before: Mapping[str, Mapping[str, float]], after: Mapping[str, Mapping[str, float]]
) -> dict[str, dict[str, float]]:
    """``after - before`` per timer (timers that did not move are left out)."""
    out: dict[str, dict[str, float]] = {}
    for name, a in after.items():
        b = before.get(name, {"seconds": 0.0, "calls": 0})
        calls = int(a["calls"]) - int(b["calls"])
        seconds = float(a["seconds"]) - float(b["seconds"])
        if calls < 0 or seconds < -1e-9:
            raise ValueError(f"timer {name!r} went backwards: {dict(b)} -> {dict(a)}")
        if calls:
            out[name] = {"seconds": seconds, "calls": calls}
    return out


def summarize(spec: Mapping[str, Mapping[str, float]]) -> dict[str, Any]:
    """Per phase of a round: mean ms per round and share of the round time.

    ``spec`` is a :func:`delta` of a DSPARK_MOE engine. Every phase row is its total
    seconds over the number of rounds (a phase that ran in no round counts 0), so the
    rows, ``draft_rest`` and ``unattributed`` included, add up to the mean round.
    """
    rounds = int(spec.get(ROUND, {}).get("calls", 0))
    if rounds == 0:
        raise ValueError("no DSPARK_MOE decode round was timed; is the engine DSPARK_MOE?")
    sec = {name: float(spec.get(name, {}).get("seconds", 0.0)) for name in TIMERS}
    sec["draft_rest"] = sec[PROPOSE] - sum(sec[n] for n in DRAFT_PHASES)
    outside_propose = [n for n in MEASURED if n not in DRAFT_PHASES]
    sec["unattributed"] = sec[ROUND] - sec[PROPOSE] - sum(sec[n] for n in outside_propose)
    round_s = sec[ROUND]
    phases = [
        {
            "phase": p.name,
            "group": p.group,
            "label": p.label,
            "wraps": p.wraps,
            "ms_per_round": 1e3 * sec[p.name] / rounds,
            "share": sec[p.name] / round_s,
        }
        for p in PHASES
    ]
    return {
        "rounds": rounds,
        "round_ms": 1e3 * round_s / rounds,
        "phases": phases,
        "verify_model_forward_ms_per_round": 1e3 * sec[VERIFY_MODEL_FORWARD] / rounds,
    }


def plain_step_ms(plain: Mapping[str, Mapping[str, float]]) -> tuple[float, int]:
    """``(mean ms per decode step, steps)`` of a plain engine's :func:`delta`."""
    t = plain.get(PLAIN_STEP)
    if not t or not t["calls"]:
        raise ValueError("no plain decode step was timed; is the engine plain (no speculation)?")
    return 1e3 * float(t["seconds"]) / int(t["calls"]), int(t["calls"])
