"""Hardware fingerprints: which nodes may share one cost table.

A cost table is only valid on hardware that steps the same way, so the fleet
driver groups nodes by fingerprint and the on-disk layout is keyed by its slug
(``profiles/<slug>/...``). The fingerprint therefore holds what changes the
staircase (device model, device count, driver/CUDA, CPU core count and ISA) and
nothing that varies between identical machines (hostname, IPs, serials).
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
from dataclasses import asdict, dataclass
from typing import Any

_SLUG_BAD = re.compile(r"[^a-z0-9]+")


def slugify(text: str) -> str:
    """Lowercase DNS-label-ish slug (usable in paths and ConfigMap names)."""
    return _SLUG_BAD.sub("-", text.lower()).strip("-")


@dataclass(frozen=True)
class HardwareFingerprint:
    """What the staircase depends on, as detected on one node.

    ``kind`` is ``"cpu"`` or ``"cuda"``; ``device_name`` the CPU model name or
    GPU product name; ``device_count`` logical CPUs or GPUs; ``driver`` the
    NVIDIA driver (GPU) or kernel release (CPU); ``runtime`` the CUDA version
    torch was built for (GPU) or the widest SIMD ISA (CPU).
    """

    kind: str
    device_name: str
    device_count: int
    driver: str
    runtime: str

    def __post_init__(self) -> None:
        if self.kind not in ("cpu", "cuda"):
            raise ValueError(f"HardwareFingerprint.kind must be 'cpu' or 'cuda', got {self.kind!r}")
        if not self.device_name.strip():
            raise ValueError("HardwareFingerprint.device_name must be non-empty")
        if self.device_count < 1:
            raise ValueError(
                f"HardwareFingerprint.device_count must be >= 1, got {self.device_count}"
            )

    @property
    def slug(self) -> str:
        """Group key and directory name, e.g. ``cpu-amd-epyc-avx2-2c`` or ``cuda-nvidia-h200-8x``.

        The driver is deliberately not part of the slug: a driver upgrade should
        show up as a *deviating node* inside its group, not silently start a new
        group. It is recorded in the metadata and compared by ``same_group``.
        """
        if self.kind == "cpu":
            return slugify(f"cpu-{self.device_name}-{self.runtime}-{self.device_count}c")
        return slugify(f"cuda-{self.device_name}-{self.device_count}x")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HardwareFingerprint:
        try:
            return cls(
                kind=str(data["kind"]),
                device_name=str(data["device_name"]),
                device_count=int(data["device_count"]),
                driver=str(data["driver"]),
                runtime=str(data["runtime"]),
            )
        except KeyError as exc:
            raise ValueError(
                f"hardware fingerprint is missing field {exc.args[0]!r}; expected keys "
                "kind, device_name, device_count, driver, runtime"
            ) from None


def _cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown-cpu"


def _cpu_isa() -> str:
    flags = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("flags"):
                    flags = line.split(":", 1)[1]
                    break
    except OSError:
        return platform.machine() or "unknown"
    have = set(flags.split())
    for isa in ("amx_tile", "avx512f", "avx2", "avx", "sse4_2", "asimd"):
        if isa in have:
            return isa.replace("_tile", "").replace("512f", "512")
    return platform.machine() or "unknown"


def _nvidia_driver() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
        return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def detect_fingerprint(device: str = "cpu") -> HardwareFingerprint:
    """Fingerprint of this machine for ``device`` (``"cpu"`` or ``"cuda"``)."""
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("device='cuda' requested but torch sees no CUDA device")
        return HardwareFingerprint(
            kind="cuda",
            device_name=torch.cuda.get_device_name(0),
            device_count=torch.cuda.device_count(),
            driver=_nvidia_driver(),
            runtime=f"cuda{torch.version.cuda}",
        )
    return HardwareFingerprint(
        kind="cpu",
        device_name=_cpu_model_name(),
        device_count=os.cpu_count() or 1,
        driver=platform.release(),
        runtime=_cpu_isa(),
    )
