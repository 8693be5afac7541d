"""The load side of sim validation: closed-loop clients, what they measured, and step probes.

Why: the simulator's prediction is only as good as the figures it is held against. This
module turns a live server's streamed chunks (``client.RequestTimeline``) into those
figures, three independent ways:

1. Step cost (``profile_server``): ``n`` requests of the load's typical length decoded
   together give one streamed chunk per engine step, so the median gap between chunks
   while all ``n`` are running is the step time at ``n`` requests (``b = n * (1 + k)``
   batch tokens under a static-``k`` policy); a lone request with ``max_new_tokens = 1``
   gives the prefill step time at ``b`` = its prompt length. Together they form an
   SGLang ``SpsCostTable`` of this server (decode and prefill probes do not overlap in
   ``b`` as long as ``n_max * (1 + k)`` stays below the shortest probed prompt).
2. Load (``closed_loop``): ``c`` clients each keep one streaming request in flight,
   over a fixed request list, recording when every chunk arrived; ``summarise_load``
   reads it exactly as ``simulator._summarise`` reads a simulated run (same warm-up
   rule, same window, same per-user speed), so the two compare like with like.
3. The load's own steps (``load_steps``): its chunk gaps split into quiet decode steps
   and what each arrival cost the requests already running, to tell a mispriced step
   from a mispriced prefill when a level's prediction misses.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dspark_sglang.bench.sim_validation.client import RequestTimeline

__all__ = [
    "LiveMeasurement",
    "LoadRun",
    "LoadSteps",
    "ServerProfile",
    "closed_loop",
    "decode_step_time",
    "load_steps",
    "pick_decode_prompts",
    "pick_prefill_prompts",
    "profile_server",
    "summarise_load",
]


@dataclass(frozen=True)
class LiveMeasurement:
    """What a load test measured at one concurrency (output tokens per second)."""

    concurrency: int
    throughput: float
    user_tps_p50: float
    user_tps_p90: float
    ttft_p50: float = float("nan")
    mean_accept_len: float = float("nan")
    completed: int = 0
    window_s: float = float("nan")

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"LiveMeasurement.concurrency must be >= 1, got {self.concurrency}")
        for name in ("throughput", "user_tps_p50", "user_tps_p90"):
            v = getattr(self, name)
            if not v > 0:
                raise ValueError(f"LiveMeasurement.{name} must be > 0 tok/s, got {v!r}")


# --------------------------------------------------------------------------- load


@dataclass(frozen=True)
class LoadRun:
    """A closed-loop run: timelines in submission order and when the steady state ended.

    ``steady_end`` is the first finish after the last request was sent (from then on a
    slot cannot be refilled: the simulator's end of run without ``drain``).
    """

    concurrency: int
    timelines: tuple[RequestTimeline, ...]
    steady_end: float


def closed_loop(
    send: Callable[[int], RequestTimeline], num_requests: int, concurrency: int
) -> LoadRun:
    """``concurrency`` clients keep one request each in flight until ``num_requests`` ran.

    ``send(i)`` performs request ``i`` (blocking) and returns its timeline; requests
    are handed out in order ``0 .. num_requests - 1``.
    """
    if concurrency < 1 or num_requests < concurrency:
        raise ValueError(
            f"closed_loop needs 1 <= concurrency <= num_requests, got {concurrency} and "
            f"{num_requests}"
        )
    lock = threading.Lock()
    state = {"next": 0}
    results: list[RequestTimeline | None] = [None] * num_requests
    finishes_after_last: list[float] = []
    errors: list[BaseException] = []

    def worker() -> None:
        while True:
            with lock:
                i = state["next"]
                if i >= num_requests or errors:
                    return
                state["next"] = i + 1
            try:
                tl = send(i)
            except BaseException as exc:  # surfaced below: a lost request fails the run
                with lock:
                    errors.append(exc)
                return
            with lock:
                results[i] = tl
                if state["next"] >= num_requests:
                    finishes_after_last.append(tl.finish)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise RuntimeError(f"a request of the closed-loop run failed: {errors[0]!r}") from errors[0]
    done = tuple(r for r in results if r is not None)
    assert len(done) == num_requests
    return LoadRun(concurrency=concurrency, timelines=done, steady_end=min(finishes_after_last))


def summarise_load(run: LoadRun, warmup_fraction: float = 0.2) -> LiveMeasurement:
    """The simulator's statistics (``simulator._summarise``) of a measured run.

    Warm-up: the first ``floor(warmup_fraction * R)`` requests to finish; the window
    runs from the last of their finishes to ``steady_end``; throughput = output tokens
    whose chunks arrived in the window / its length. Per-user speed of each request
    sent after the warm-up and done by ``steady_end``: ``(output - 1) / (finish - first
    chunk)``; p90 is the speed 90 % of requests reach (10th percentile).
    """
    tls = run.timelines
    n_req = len(tls)
    warm = int(warmup_fraction * n_req)
    finishes = sorted(tl.finish for tl in tls)
    t0 = finishes[warm - 1] if warm else min(tl.submit for tl in tls)
    t1 = run.steady_end
    if t1 <= t0:
        raise ValueError(
            "the measured window after the warm-up is empty: send more requests than "
            f"concurrency / (1 - warmup_fraction) (got {n_req} at {run.concurrency})"
        )
    emitted = sum(tl.emitted_between(t0, t1) for tl in tls)
    # As the simulator: only requests done by the end of the steady state count (the
    # tail, decoding in a shrinking batch, would look faster than steady state).
    speeds = [
        (tl.output_tokens - 1) / (tl.finish - tl.first)
        for tl in tls[warm:]
        if tl.output_tokens >= 2 and tl.first < tl.finish <= t1
    ]
    if not speeds:
        raise ValueError("no request after the warm-up finished in the steady state")
    ttft = [tl.first - tl.submit for tl in tls[warm:] if tl.first <= t1]
    rounds = [tl.verify_ct for tl in tls if tl.verify_ct]
    accept = (
        sum(tl.output_tokens - 1 for tl in tls if tl.verify_ct) / sum(rounds)
        if rounds
        else float("nan")
    )
    return LiveMeasurement(
        concurrency=run.concurrency,
        throughput=emitted / (t1 - t0),
        user_tps_p50=float(np.percentile(speeds, 50)),
        user_tps_p90=float(np.percentile(speeds, 10)),
        ttft_p50=float(np.percentile(ttft, 50)),
        mean_accept_len=accept,
        completed=len(speeds),
        window_s=t1 - t0,
    )


@dataclass(frozen=True)
class LoadSteps:
    """A closed loop's own engine steps, to set against the probe that priced them.

    Why: when a level's prediction misses, the miss is either in the decode step (the
    load stepped slower than the probe of ``c`` requests: the machine drifted, or the
    probe is not what the load runs) or in what each arrival costs the requests already
    running (the simulator charges one lone prefill). The chunk gaps tell them apart.

    ``quiet_gaps``: ``(start, gap)`` of every chunk gap while the first ``c`` requests
    had all started decoding and before ``steady_end``, that overlaps no arrival (a
    request after the first ``c``, from its submission to its first chunk).
    ``arrival_stall_s``: per arrival in that window, how much longer the requests
    decoding through it took, from their last chunk at or before its submission to their
    first chunk after its first chunk, than that many of their own quiet steps (median
    over those requests).
    ``window``: ``(start, end)`` of that steady window, in the timelines' clock.
    """

    quiet_gaps: tuple[tuple[float, float], ...]
    arrival_stall_s: tuple[float, ...]
    window: tuple[float, float]

    @property
    def quiet_step_s(self) -> float:
        return float(statistics.median(g for _, g in self.quiet_gaps))

    def quiet_step_by_time(self, bin_s: float = 30.0) -> list[dict[str, float]]:
        """Median quiet step per ``bin_s`` seconds of the window, in order.

        Why: on a shared machine the decode step drifts in phases of tens of seconds; a
        load whose quiet step moves from bin to bin was priced by a probe of one phase.
        """
        if not bin_s > 0:
            raise ValueError(f"bin_s must be > 0 seconds, got {bin_s!r}")
        t_lo = self.window[0]
        bins: dict[int, list[float]] = {}
        for a, g in self.quiet_gaps:
            bins.setdefault(int((a - t_lo) // bin_s), []).append(g)
        return [
            {"from_s": k * bin_s, "median_s": float(statistics.median(v)), "gaps": len(v)}
            for k, v in sorted(bins.items())
        ]

    def to_dict(self) -> dict[str, Any]:
        stalls = self.arrival_stall_s
        return {
            "quiet_step_s": self.quiet_step_s,
            "quiet_gaps": len(self.quiet_gaps),
            "arrivals": len(stalls),
            "arrival_stall_median_s": float(statistics.median(stalls)) if stalls else None,
            "arrival_stall_total_s": float(sum(stalls)),
            "window_s": self.window[1] - self.window[0],
            "quiet_step_by_time": self.quiet_step_by_time(),
        }


def load_steps(run: LoadRun, skip_chunks: int = 2) -> LoadSteps:
    """Split a closed loop's chunk gaps into quiet steps and arrival stalls (``LoadSteps``)."""
    tls = run.timelines
    c = run.concurrency
    arrivals = [(tl.submit, tl.first) for tl in tls[c:]]
    t_lo = max(tl.times[min(skip_chunks, len(tl.times) - 1)] for tl in tls[:c])
    t_hi = run.steady_end
    quiet: list[tuple[float, float]] = []
    own: list[float | None] = []
    for tl in tls:
        mine = [
            (a, b - a)
            for a, b in zip(tl.times, tl.times[1:], strict=False)
            if t_lo <= a and b <= t_hi and not any(a < first and b > sub for sub, first in arrivals)
        ]
        quiet.extend(mine)
        own.append(float(statistics.median(g for _, g in mine)) if mine else None)
    if len(quiet) < 3:
        raise ValueError(
            f"only {len(quiet)} quiet chunk gaps in the loop's steady window: send more "
            "requests or longer outputs"
        )
    stalls: list[float] = []
    for sub, first in arrivals:
        if not t_lo <= sub <= t_hi:
            continue
        per = []
        for tl, step in zip(tls, own, strict=True):
            if step is None or tl.first > sub or tl.finish <= first:
                continue
            before = [t for t in tl.times if t <= sub]
            after = [t for t in tl.times if t > first]
            inside = sum(1 for t in tl.times if sub < t <= first)
            if before and after:
                per.append(after[0] - before[-1] - (inside + 1) * step)
        if per:
            stalls.append(float(statistics.median(per)))
    return LoadSteps(tuple(sorted(quiet)), tuple(stalls), (t_lo, t_hi))


# --------------------------------------------------------------------------- step cost


def pick_prefill_prompts(prompts: Sequence[Sequence[int]], count: int) -> list[list[int]]:
    """``count`` prompts spread over the length range (shortest .. longest), distinct lengths."""
    by_len: dict[int, list[int]] = {}
    for p in prompts:
        by_len.setdefault(len(p), list(p))
    lengths = sorted(by_len)
    if count >= len(lengths):
        return [by_len[n] for n in lengths]
    idx = sorted({round(i * (len(lengths) - 1) / (count - 1)) for i in range(count)})
    return [by_len[lengths[i]] for i in idx]


def pick_decode_prompts(prompts: Sequence[Sequence[int]], count: int) -> list[list[int]]:
    """The ``count`` prompts nearest the median length: the decode probe's context should be
    the load's typical one (``profile_server``)."""
    if not prompts:
        raise ValueError("pick_decode_prompts needs at least one prompt")
    median = statistics.median(len(p) for p in prompts)
    order = sorted(range(len(prompts)), key=lambda i: (abs(len(prompts[i]) - median), i))
    return [list(prompts[i]) for i in order[:count]]


def decode_step_time(timelines: Sequence[RequestTimeline], skip_chunks: int = 2) -> float:
    """Median chunk gap while every one of ``timelines`` (sent together) was decoding.

    The window starts after the latest of their first ``skip_chunks`` chunks (the
    batch has formed) and ends at the earliest finish (the batch starts to shrink).
    """
    if not timelines:
        raise ValueError("decode_step_time needs at least one timeline")
    start = max(tl.times[min(skip_chunks, len(tl.times) - 1)] for tl in timelines)
    end = min(tl.finish for tl in timelines)
    gaps = [
        b - a
        for tl in timelines
        for a, b in zip(tl.times, tl.times[1:], strict=False)
        if a >= start and b <= end
    ]
    if len(gaps) < 3:
        raise ValueError(
            f"only {len(gaps)} chunk gaps while all {len(timelines)} requests decoded: "
            "raise the probe's max_new_tokens"
        )
    return float(statistics.median(gaps))


@dataclass(frozen=True)
class ServerProfile:
    """Step times of one server: decode at ``n`` requests, prefill at ``p`` prompt tokens."""

    verify_tokens_per_request: int  # 1 + k under a static-k policy
    decode_seconds: dict[int, float] = field(default_factory=dict)
    prefill_seconds: dict[int, float] = field(default_factory=dict)

    def probes(self) -> list[tuple[int, float]]:
        """``(batch tokens, steps per second)``, decode and prefill probes merged."""
        pts = {n * self.verify_tokens_per_request: 1.0 / s for n, s in self.decode_seconds.items()}
        overlap = set(pts) & set(self.prefill_seconds)
        if overlap or (pts and self.prefill_seconds and max(pts) >= min(self.prefill_seconds)):
            raise ValueError(
                f"decode probes reach b = {max(pts)} tokens but a prefill probe starts at "
                f"{min(self.prefill_seconds)}: one table cannot hold both; lower the largest "
                "decode batch or lengthen the shortest prefill probe"
            )
        pts.update({p: 1.0 / s for p, s in self.prefill_seconds.items()})
        return sorted(pts.items())

    def with_decode(self, decode_seconds: dict[int, float]) -> ServerProfile:
        """This profile with some decode probes replaced by fresher ones."""
        return ServerProfile(
            self.verify_tokens_per_request,
            {**self.decode_seconds, **decode_seconds},
            dict(self.prefill_seconds),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "verify_tokens_per_request": self.verify_tokens_per_request,
            "decode_seconds": {str(k): v for k, v in sorted(self.decode_seconds.items())},
            "prefill_seconds": {str(k): v for k, v in sorted(self.prefill_seconds.items())},
        }


def profile_server(
    send: Callable[[Sequence[int], int], RequestTimeline],
    decode_prompts: Sequence[Sequence[int]],
    batch_sizes: Sequence[int],
    prefill_prompts: Sequence[Sequence[int]],
    *,
    verify_tokens_per_request: int,
    decode_tokens: int = 32,
    prefill_repeats: int = 3,
    decode_repeats: int = 3,
    warmup: bool = True,
) -> ServerProfile:
    """Measure decode step time at each ``batch_sizes`` and prefill time per prompt.

    ``send(input_ids, max_new_tokens)`` performs one streaming request. Decode: ``n``
    requests sent at once, request ``j`` with ``decode_prompts[j % len]``. A step's cost
    grows with the KV context it attends over, so give prompts of the load's typical
    length and ``decode_tokens`` of its typical output: a short probe times steps the
    load never runs (on the CPU server, closed-loop steps took 6 % and 15 % longer at 1
    and 2 requests than a one-prompt, 32-token probe's). Each batch size is probed
    ``decode_repeats`` times and the median kept, after one discarded run of the first
    batch size (``warmup``; skip it on a server that has just served): a single probe
    of one request on a fresh server once came out 15 % slower than the closed-loop
    steps that followed it, and that one figure set the whole level's prediction.
    Prefill: the median time to first token of a lone request, ``prefill_repeats``
    times per prompt; run the server with the radix cache off, or repeats would hit
    the cached prompt and time nothing.
    """
    if not decode_prompts:
        raise ValueError("profile_server needs at least one decode prompt")
    if decode_repeats < 1:
        raise ValueError(f"decode_repeats must be >= 1, got {decode_repeats}")

    def probe(n: int) -> float:
        ids = [decode_prompts[j % len(decode_prompts)] for j in range(n)]
        with ThreadPoolExecutor(max_workers=n) as pool:
            out = list(pool.map(lambda p: send(p, decode_tokens), ids))
        return decode_step_time(out)

    decode: dict[int, float] = {}
    if warmup and batch_sizes:
        probe(batch_sizes[0])  # not recorded
    for n in batch_sizes:
        decode[n] = float(statistics.median(probe(n) for _ in range(decode_repeats)))
    prefill: dict[int, float] = {}
    for ids in prefill_prompts:
        ttft = []
        for _ in range(prefill_repeats):
            tl = send(ids, 1)
            ttft.append(tl.first - tl.submit)
        prefill[len(ids)] = float(statistics.median(ttft))
    return ServerProfile(verify_tokens_per_request, decode, prefill)
