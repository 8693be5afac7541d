"""``choose_cpu_dtype``: bfloat16 only where every CPU has native bf16 matrix instructions."""

from __future__ import annotations

from pathlib import Path

import pytest

from dspark_sglang.sglang_integration.cpu_dtype import (
    bf16_flags,
    choose_cpu_dtype,
    read_cpuinfo,
)


def _cpuinfo(*flag_lines: str) -> str:
    """Fake /proc/cpuinfo text: one processor block per flags line."""
    return "\n\n".join(
        f"processor\t: {i}\nmodel name\t: Test CPU\nflags\t\t: {flags}\nbugs\t\t: spectre_v1"
        for i, flags in enumerate(flag_lines)
    )


AVX2 = "fpu sse sse2 avx avx2 fma"
SAPPHIRE = AVX2 + " avx512f avx512_bf16 amx_bf16 amx_tile amx_int8"


def test_auto_picks_bfloat16_on_amx_and_says_why() -> None:
    choice = choose_cpu_dtype("auto", _cpuinfo(SAPPHIRE, SAPPHIRE))
    assert choice.dtype == "bfloat16"
    assert choice.describe() == "dtype bfloat16 (CPU has amx_bf16, avx512_bf16)"


def test_auto_picks_bfloat16_on_avx512_bf16_alone() -> None:
    choice = choose_cpu_dtype("auto", _cpuinfo(AVX2 + " avx512f avx512_bf16"))
    assert (choice.dtype, choice.reason) == ("bfloat16", "CPU has avx512_bf16")


def test_auto_falls_back_to_float32_without_bf16_instructions() -> None:
    choice = choose_cpu_dtype("auto", _cpuinfo(AVX2, AVX2))
    assert choice.describe() == "dtype float32 (no AMX/AVX-512 BF16 on this CPU)"
    # whole words only, and a flag must be on every CPU's line
    assert bf16_flags(_cpuinfo(AVX2 + " avx512_bf16x amx_bf16_foo")) == ()
    assert bf16_flags(_cpuinfo(SAPPHIRE, AVX2)) == ()
    assert bf16_flags("no flags line here\n") == ()


def test_unreadable_cpuinfo_falls_back_to_float32(tmp_path: Path) -> None:
    assert read_cpuinfo(tmp_path / "missing") is None
    choice = choose_cpu_dtype("auto", None)
    assert choice.dtype == "float32" and "unreadable" in choice.reason


def test_explicit_dtype_wins_and_bad_values_name_the_option() -> None:
    assert choose_cpu_dtype("float32", _cpuinfo(SAPPHIRE)).describe() == (
        "dtype float32 (--dtype float32)"
    )
    assert choose_cpu_dtype("bfloat16", _cpuinfo(AVX2)).dtype == "bfloat16"
    with pytest.raises(ValueError, match="--dtype must be one of"):
        choose_cpu_dtype("float16", None)
