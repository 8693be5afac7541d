"""Whether bfloat16 pays on the device a stage runs on, and a warning when it does not.

On a GPU, and on CPUs with bf16 matrix instructions (AMX-BF16, AVX-512 BF16),
bfloat16 runs natively and is faster than float32. On other CPUs every bf16
matmul is converted to float32 and back, so ``data.gen_dtype: bfloat16`` and
``run.autocast: bfloat16`` make the data and train stages slower, not faster.
Nothing is changed for the user (the config is what they asked for); the stage
prints one line naming the option and the fix.
"""

from __future__ import annotations

from dspark_sglang.sglang_integration.cpu_dtype import BF16_FLAGS, bf16_flags, read_cpuinfo


def emulated_bf16_warning(option: str, value: str, device: str, cpuinfo: str | None) -> str | None:
    """One line when ``option`` = ``value`` asks for bfloat16 on a CPU that emulates it.

    ``device`` is ``run.device`` (only ``cpu`` is checked); ``cpuinfo`` the text of
    ``/proc/cpuinfo`` (None where unreadable: nothing is claimed then).
    """
    if value != "bfloat16" or not device.startswith("cpu") or cpuinfo is None:
        return None
    if bf16_flags(cpuinfo):
        return None
    return (
        f"[precision] {option}: bfloat16 on a CPU without {' or '.join(BF16_FLAGS)}: "
        f"bfloat16 is emulated here and runs slower than float32; set {option}: float32"
    )


def warn_emulated_bf16(option: str, value: str, device: str) -> None:
    """Print :func:`emulated_bf16_warning` for this machine's CPU, if it applies."""
    line = emulated_bf16_warning(option, value, device, read_cpuinfo())
    if line is not None:
        print(line, flush=True)
