"""Backends: the forward pass whose steps per second the profiler measures.

The cost table must describe the *serving* forward, so each backend builds a
verify-shaped batch of ``b`` tokens (several requests, each verifying a few
draft tokens over a KV cache of realistic length) and runs exactly that forward.
The measurement core only sees the ``Backend`` protocol, so the CPU transformers
backend (here), the GPU SGLang model-runner backend (``sglang_backend.py``) and the
simulated device used to test the core are interchangeable.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

Step = Callable[[], None]

# "wall": perf_counter, what an idle dedicated machine sees. "thread_cpu": the
# calling thread's CPU time; with one torch thread all forward compute runs on
# that thread, so it equals the wall time of an idle core while ignoring the
# time a *shared* machine's scheduler gives to co-tenants (the dev/CI machines
# run at load 5-10 on 2 cores, where wall time measures the neighbours).
CLOCKS = ("wall", "thread_cpu")


@dataclass(frozen=True)
class BackendInfo:
    """What a table measured with this backend is valid for (goes into the metadata)."""

    kind: str  # "hf", "sglang", "simulated"
    model: str  # model slug used in file names, e.g. "smollm2-135m-instruct"
    dtype: str
    tp_size: int
    device: str
    settings: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.tp_size < 1:
            raise ValueError(f"BackendInfo.tp_size must be >= 1, got {self.tp_size}")
        if not self.model:
            raise ValueError("BackendInfo.model must be a non-empty model slug")


@runtime_checkable
class Backend(Protocol):
    """A forward pass that can be run at a chosen batch size in tokens.

    ``prepare(b)`` does all allocation for a ``b``-token forward (inputs, KV cache,
    CUDA graph lookup) *outside* the timed region and returns a ``Step``; each call
    of the step runs one complete forward, synchronised with the device, and leaves
    the state ready for the next call (so steps can be repeated). ``now()`` is the
    clock the step is timed with.
    """

    @property
    def info(self) -> BackendInfo: ...

    @property
    def max_batch_tokens(self) -> int: ...

    def prepare(self, batch_tokens: int) -> Step: ...

    def now(self) -> float: ...

    def release(self) -> None: ...


def verify_widths(batch_tokens: int, target_width: int) -> list[int]:
    """Per-request verify lengths for a ``b``-token step: ``ceil(b / w)`` requests,
    lengths as equal as possible (they differ by at most one), summing to ``b``.

    Why not an ``n x w`` rectangle: a rectangle needs ``n * w == b``, so prime ``b``
    would become ``b`` one-token requests and the table would show fake cliffs at
    primes (request-count effects, not hardware); padding would instead charge
    compute for tokens that do not exist. Ragged lengths are what compact ragged
    verify really runs.
    """
    if batch_tokens < 1:
        raise ValueError(f"batch_tokens must be >= 1, got {batch_tokens}")
    if target_width < 1:
        raise ValueError(f"target_width must be >= 1, got {target_width}")
    n = -(-batch_tokens // target_width)
    base, extra = divmod(batch_tokens, n)
    return [base + 1] * extra + [base] * (n - extra)


@dataclass
class VerifyBatch:
    """The inputs of the current probe (and the last step's logits, for checking)."""

    widths: list[int]
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    cache: Any
    last_logits: torch.Tensor | None = None

    @property
    def num_requests(self) -> int:
        return len(self.widths)


class HFVerifyBackend:
    """Verify-shaped forward of a transformers causal LM (the CPU serving stand-in).

    For ``b`` tokens: ``ceil(b / verify_width)`` requests with ragged verify
    lengths (``verify_widths``) packed into one row of ``b`` tokens, as SGLang
    packs a ragged verify batch. Each verify token attends to ``context_len``
    cached positions and causally to its own request's earlier verify tokens
    (a block-causal 4D mask), never to other requests; positions continue after
    the context; logits are computed for every verify token (verify needs them
    all). So the GEMMs run on exactly ``b`` rows. Approximation: the requests
    share one cached prefix (their KV reads hit one ``context_len`` block) and the
    dense masked attention computes ``b x (context_len + b)`` scores, which at
    ``b = 256, context_len = 128`` is a few percent of the step. The cache is a
    ``StaticCache`` rewound after each step (no re-prefill, no growth); its
    contents are random, since attention cost does not depend on the values.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        model_slug: str,
        *,
        context_len: int = 128,
        verify_width: int = 4,
        max_batch_tokens: int = 256,
        seed: int = 0,
        clock: str = "wall",
    ) -> None:
        if clock not in CLOCKS:
            raise ValueError(f"clock must be one of {CLOCKS}, got {clock!r}")
        if clock == "thread_cpu" and torch.get_num_threads() != 1:
            raise ValueError(
                "clock='thread_cpu' times only the calling thread, so it needs "
                f"torch.set_num_threads(1) (now {torch.get_num_threads()}); use clock='wall'"
            )
        if context_len < 1:
            raise ValueError(f"context_len must be >= 1, got {context_len}")
        if max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be >= 1, got {max_batch_tokens}")
        verify_widths(1, verify_width)  # validates the width
        self.model = model.eval()
        self.config = model.config
        self.context_len = context_len
        self.verify_width = verify_width
        self._max_batch_tokens = max_batch_tokens
        self._gen = torch.Generator().manual_seed(seed)
        param = next(model.parameters())
        self._device = param.device
        self._dtype = param.dtype
        self._info = BackendInfo(
            kind="hf",
            model=model_slug,
            dtype=str(self._dtype).removeprefix("torch."),
            tp_size=1,
            device=str(self._device),
            settings={
                "context_len": context_len,
                "verify_width": verify_width,
                "torch_threads": torch.get_num_threads(),
                "clock": clock,
                "layout": "ceil(b/verify_width) requests, ragged lengths packed in one row "
                "over a shared context_len-token cached prefix (verify_widths)",
            },
        )
        self.current: VerifyBatch | None = None
        self._now = time.thread_time if clock == "thread_cpu" else time.perf_counter
        if clock == "thread_cpu" and self._device.type != "cpu":
            raise ValueError("clock='thread_cpu' is for CPU backends; GPU steps need clock='wall'")

    @property
    def info(self) -> BackendInfo:
        return self._info

    @property
    def max_batch_tokens(self) -> int:
        return self._max_batch_tokens

    def now(self) -> float:
        return self._now()

    def release(self) -> None:
        self.current = None

    def prepare(self, batch_tokens: int) -> Step:
        from transformers import StaticCache

        if not 1 <= batch_tokens <= self._max_batch_tokens:
            raise ValueError(
                f"batch_tokens {batch_tokens} outside [1, {self._max_batch_tokens}] "
                "(raise --max-batch-tokens)"
            )
        widths = verify_widths(batch_tokens, self.verify_width)
        b = batch_tokens
        cfg = self.config.get_text_config(decoder=True)
        kv_heads = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
        head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        L = self.context_len
        self.current = None  # free the previous probe's cache before allocating
        cache = StaticCache(config=self.config, max_cache_len=L + b)
        cache.early_initialization(1, kv_heads, head_dim, self._dtype, self._device)
        for layer in cache.layers:
            shape = (1, kv_heads, L, head_dim)
            layer.keys[:, :, :L] = torch.randn(shape, generator=self._gen).to(layer.keys)
            layer.values[:, :, :L] = torch.randn(shape, generator=self._gen).to(layer.values)
            layer.cumulative_length.fill_(L)
        w = torch.tensor(widths)
        req = torch.repeat_interleave(torch.arange(len(widths)), w)
        offset = torch.arange(b) - torch.repeat_interleave(w.cumsum(0) - w, w)
        same_request_causal = (req[:, None] == req[None, :]) & (offset[None, :] <= offset[:, None])
        mask = torch.cat([torch.ones(b, L, dtype=torch.bool), same_request_causal], dim=1)
        batch = VerifyBatch(
            widths=widths,
            input_ids=torch.randint(0, int(cfg.vocab_size), (1, b), generator=self._gen).to(
                self._device
            ),
            position_ids=(L + offset).unsqueeze(0).to(self._device),
            attention_mask=mask[None, None].to(self._device),
            cache=cache,
        )
        self.current = batch
        model = self.model
        sync = _synchronizer(self._device)

        def step() -> None:
            with torch.inference_mode():
                out = model(
                    input_ids=batch.input_ids,
                    position_ids=batch.position_ids,
                    attention_mask=batch.attention_mask,
                    past_key_values=cache,
                    use_cache=True,
                )
            sync()
            batch.last_logits = out.logits
            for layer in cache.layers:  # rewind: the next step overwrites the same slots
                layer.cumulative_length.fill_(L)

        return step


def _synchronizer(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


class SimulatedBackend:
    """A device with a *known* step-time curve and seeded noise, on a virtual clock.

    The measurement core and stair detector need ground truth to be tested
    against; real hardware cannot provide it (and tests must not assert on wall
    clock). Each step advances the virtual clock by ``step_time(b)`` times a
    log-normal noise factor and, with probability ``outlier_prob``, an extra
    ``outlier_factor`` slowdown (a co-tenant burst).
    """

    def __init__(
        self,
        step_time: Callable[[int], float],
        *,
        max_batch_tokens: int,
        noise: float = 0.0,
        outlier_prob: float = 0.0,
        outlier_factor: float = 3.0,
        seed: int = 0,
        model_slug: str = "simulated",
    ) -> None:
        self._step_time = step_time
        self._max = max_batch_tokens
        self._noise = noise
        self._outlier_prob = outlier_prob
        self._outlier_factor = outlier_factor
        self._gen = torch.Generator().manual_seed(seed)
        self._clock = 0.0
        self.calls: dict[int, int] = {}
        self._info = BackendInfo(
            kind="simulated",
            model=model_slug,
            dtype="none",
            tp_size=1,
            device="virtual",
            settings={"noise": noise, "outlier_prob": outlier_prob},
        )

    @property
    def info(self) -> BackendInfo:
        return self._info

    @property
    def max_batch_tokens(self) -> int:
        return self._max

    def now(self) -> float:
        return self._clock

    def release(self) -> None:
        return None

    def prepare(self, batch_tokens: int) -> Step:
        if not 1 <= batch_tokens <= self._max:
            raise ValueError(f"batch_tokens {batch_tokens} outside [1, {self._max}]")
        base = float(self._step_time(batch_tokens))
        if not (base > 0 and math.isfinite(base)):
            raise ValueError(f"step_time({batch_tokens}) must be positive, got {base}")

        def step() -> None:
            factor = math.exp(self._noise * float(torch.randn((), generator=self._gen)))
            if float(torch.rand((), generator=self._gen)) < self._outlier_prob:
                factor *= self._outlier_factor
            self._clock += base * factor
            self.calls[batch_tokens] = self.calls.get(batch_tokens, 0) + 1

        return step
