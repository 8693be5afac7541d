"""Hook for validating the simulator against a live SGLang server (issue 7, Must-show #2).

Not done yet: it needs the DSpark SGLang worker (issue 4) serving SmolLM2 on CPU. The
plan: drive the server in closed loop at >= 3 concurrencies with the same length
distribution, read throughput and per-request TPOT from the responses (or SGLang's
``/metrics``), simulate the same configuration with the server's recorded acceptance
traces and its profiled cost table, and report ``prediction_error`` per quantity
(target <= 15 %). ``prediction_error`` is ready; ``measure_live_server`` is the hook.
"""

from __future__ import annotations

from dataclasses import dataclass

from dspark_sglang.planning.simulator import SimResult

__all__ = ["LiveMeasurement", "measure_live_server", "prediction_error"]


@dataclass(frozen=True)
class LiveMeasurement:
    """What a load test measured at one concurrency (output tokens per second)."""

    concurrency: int
    throughput: float
    user_tps_p50: float
    user_tps_p90: float

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"LiveMeasurement.concurrency must be >= 1, got {self.concurrency}")
        for name in ("throughput", "user_tps_p50", "user_tps_p90"):
            v = getattr(self, name)
            if not v > 0:
                raise ValueError(f"LiveMeasurement.{name} must be > 0 tok/s, got {v!r}")


def prediction_error(predicted: SimResult, measured: LiveMeasurement) -> dict[str, float]:
    """Relative error ``predicted / measured - 1`` of throughput and per-user p50/p90."""
    if predicted.concurrency != measured.concurrency:
        raise ValueError(
            f"compare like with like: predicted concurrency {predicted.concurrency} vs "
            f"measured {measured.concurrency}"
        )
    return {
        "throughput": predicted.throughput / measured.throughput - 1.0,
        "user_tps_p50": predicted.user_tps_p50 / measured.user_tps_p50 - 1.0,
        "user_tps_p90": predicted.user_tps_p90 / measured.user_tps_p90 - 1.0,
    }


def measure_live_server(
    base_url: str, concurrencies: list[int], num_requests: int
) -> list[LiveMeasurement]:
    """Closed-loop load test of a running DSpark SGLang server (NOT IMPLEMENTED YET).

    Waits on the SGLang worker integration (issue 4); until then the simulator's
    predictions are unvalidated against a live engine.
    """
    raise NotImplementedError(
        "live validation needs the DSpark SGLang CPU worker (issue 4); not implemented yet"
    )
