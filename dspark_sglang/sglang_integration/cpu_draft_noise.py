"""Sampled draft steps on CPU: the Gumbel noise's random words from torch's generator.

SGLang samples a draft token per row and draft step by Gumbel-max: ``argmax(value / T -
log(E))`` over the vocabulary, ``E = -log(1 - u)`` exponential, ``u`` from 32-bit random
words. On a GPU its Triton kernel makes the words with Philox4x32-10 keyed by the
server's draft-noise key and a block counter. Its CPU reference (``MarkovSampleStep.torch``)
recomputes the same Philox words in int64 tensor arithmetic (ten rounds of 32-bit
multiplies split into halves) for every vocabulary entry of every row at every draft step,
so that a CPU draw equals the GPU's bit for bit. At temperature 1 that made the seven-step
draft loop about a fifth of a CPU round.

This hook returns words of the same law (independent, uniform on ``[0, 2**32)``) from one
``torch.Generator`` per draft-noise key, seeded with the key at first use, so a server with
a fixed seed still repeats its draws for the same sequence of draft blocks. The words no
longer equal the GPU kernel's, which losslessness does not need: verification checks each
draft against the distribution it was drawn from (the step's own logits), whatever
generator drew it. Everything after the words (the uniforms, the exponential, the argmax,
NaN and tie rules) stays SGLang's.

An AROUND hook on ``markov_sample._philox`` through SGLang's ``HookRegistry`` (no SGLang
file is edited), registered with the other CPU bridges, CPU engine only; CUDA tensors take
SGLang's Philox.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

#: SGLang's Philox used by its CPU reference of the draft sampling kernel.
TARGET = "sglang.kernels.ops.speculative.dspark.markov_sample._philox"

_WORD = 1 << 32
_generators: dict[int, torch.Generator] = {}


def generator_for(key: int) -> torch.Generator:
    """The process's CPU generator for draft-noise ``key`` (seeded with it at first use)."""
    gen = _generators.get(key)
    if gen is None:
        gen = torch.Generator(device="cpu")
        gen.manual_seed(key & 0x7FFF_FFFF_FFFF_FFFF)
        _generators[key] = gen
    return gen


def random_words(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """int64 words of ``shape``, independent and uniform on ``[0, 2**32)``, from ``generator``."""
    return torch.randint(0, _WORD, shape, generator=generator, dtype=torch.int64)


def cpu_random_words(
    original: Callable[..., Any], key: int, *counters: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """AROUND hook on SGLang's ``_philox(key, c0, c1, c2, c3)``: four int64 tensors of the
    counters' broadcast shape, uniform on ``[0, 2**32)``, from :func:`generator_for`.

    The counters only give the shape here (row, vocabulary quad, step, block). CUDA
    counters, or anything else than four tensors, go to SGLang's Philox.
    """
    if len(counters) != 4 or not all(
        isinstance(c, torch.Tensor) and not c.is_cuda for c in counters
    ):
        return original(key, *counters)
    shape = torch.broadcast_shapes(*(c.shape for c in counters))
    return tuple(random_words((4, *shape), generator_for(key)).unbind(0))
