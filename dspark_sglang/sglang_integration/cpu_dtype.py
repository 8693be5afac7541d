"""Which dtype SGLang's CPU engine should run in, from the CPU's instruction set.

bfloat16 halves the bytes every decode step streams through the caches, and
on CPUs with bf16 matrix instructions (Intel AMX-BF16 tiles, AVX-512 BF16 dot
products) the kernels run it natively, which makes it much faster than float32
there. Without those instructions bf16 arithmetic goes through conversions to
float32, so there is no speed-up to count on and float32 (with its tighter
numerics) stays the default.

Algorithm (``choose_cpu_dtype``): an explicit ``bfloat16`` or ``float32`` is
taken as given; ``auto`` reads the ``flags`` lines of ``/proc/cpuinfo`` and
picks bfloat16 when every CPU lists ``amx_bf16`` or ``avx512_bf16``, else
float32. Where the flags cannot be read (not Linux, no permission) it falls
back to float32 and says so. The choice always carries the reason, so a
caller can print why it runs in that dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BF16_FLAGS",
    "DTYPE_CHOICES",
    "DtypeChoice",
    "bf16_flags",
    "choose_cpu_dtype",
    "read_cpuinfo",
]

#: ``/proc/cpuinfo`` flags that mean native bf16 matrix arithmetic, strongest first.
BF16_FLAGS: tuple[str, ...] = ("amx_bf16", "avx512_bf16")

#: Values of a ``--dtype`` option; ``auto`` asks ``choose_cpu_dtype`` to decide.
DTYPE_CHOICES: tuple[str, ...] = ("auto", "bfloat16", "float32")

_CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True)
class DtypeChoice:
    """The engine dtype and, in words, why it was chosen."""

    dtype: str
    reason: str

    def describe(self) -> str:
        """One line for the user, e.g. ``dtype bfloat16 (CPU has amx_bf16)``."""
        return f"dtype {self.dtype} ({self.reason})"


def read_cpuinfo(path: Path = _CPUINFO) -> str | None:
    """The text of ``/proc/cpuinfo``; None where there is none (not Linux) or it is unreadable."""
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def bf16_flags(cpuinfo: str) -> tuple[str, ...]:
    """The ``BF16_FLAGS`` every CPU in ``cpuinfo`` lists on its ``flags`` line, in that order.

    Every CPU, not any: the engine's threads may run on any core. Flags are
    matched as whole words (``avx512_bf16`` is not ``avx512_bf16x``); text
    without a ``flags`` line yields none.
    """
    common: set[str] | None = None
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            words = set(value.split())
            common = words if common is None else common & words
    return tuple(f for f in BF16_FLAGS if common is not None and f in common)


def choose_cpu_dtype(requested: str, cpuinfo: str | None) -> DtypeChoice:
    """``requested`` (one of ``DTYPE_CHOICES``) resolved against the CPU's ``cpuinfo`` text.

    ``cpuinfo`` is None when it could not be read (see ``read_cpuinfo``).
    Raises ``ValueError`` naming the option for anything outside ``DTYPE_CHOICES``.
    """
    if requested not in DTYPE_CHOICES:
        raise ValueError(f"--dtype must be one of {list(DTYPE_CHOICES)}, got {requested!r}")
    if requested != "auto":
        return DtypeChoice(requested, "--dtype " + requested)
    if cpuinfo is None:
        return DtypeChoice(
            "float32", "CPU flags unreadable (no /proc/cpuinfo), so no bf16 support is assumed"
        )
    flags = bf16_flags(cpuinfo)
    if flags:
        return DtypeChoice("bfloat16", "CPU has " + ", ".join(flags))
    return DtypeChoice("float32", "no AMX/AVX-512 BF16 on this CPU")
