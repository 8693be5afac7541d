"""One node's profiling job: what to measure and how, as a plain value.

The same ``ProfileJob`` is run locally by ``dspark-sglang profile`` and shipped
to every Ray actor by the fleet driver, so a fleet table and a local table of
the same job are measured identically.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dspark_sglang.profiling.artifacts import NodeProfile, software_versions, utc_now
from dspark_sglang.profiling.backend import CLOCKS, Backend
from dspark_sglang.profiling.hardware import detect_fingerprint, slugify
from dspark_sglang.profiling.measure import GridSpec, MeasureConfig, measure_staircase

SMOLLM2 = "smollm2"
SMOLLM2_SLUG = "smollm2-135m-instruct"
BACKENDS = ("hf", "sglang")
DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class ProfileJob:
    """Everything a node needs to measure one staircase.

    ``model`` is ``"smollm2"`` (the project's cached SmolLM2-135M-Instruct) or a
    HF model folder; ``threads`` pins torch's CPU threads (the measurement is
    meaningless if a co-tenant changes it); ``backend`` is ``"hf"`` (transformers
    verify forward, CPU or GPU) or ``"sglang"`` (SGLang's model runner, GPU).
    """

    model: str
    grid: GridSpec
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    backend: str = "hf"
    device: str = "cpu"
    dtype: str = "float32"
    threads: int = 2
    context_len: int = 128
    verify_width: int = 4
    tp_size: int = 1
    cuda_graphs: bool = True
    model_slug: str | None = None
    clock: str = "wall"

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("ProfileJob.model must be 'smollm2' or a model folder")
        if self.backend not in BACKENDS:
            raise ValueError(f"ProfileJob.backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"ProfileJob.dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.threads < 1:
            raise ValueError(f"ProfileJob.threads must be >= 1, got {self.threads}")
        if self.tp_size < 1:
            raise ValueError(f"ProfileJob.tp_size must be >= 1, got {self.tp_size}")
        if self.backend == "hf" and self.tp_size != 1:
            raise ValueError("ProfileJob: the hf backend runs tp_size=1 only; use --backend sglang")
        if self.clock not in CLOCKS:
            raise ValueError(f"ProfileJob.clock must be one of {CLOCKS}, got {self.clock!r}")
        if self.clock == "thread_cpu" and (self.threads != 1 or self.device != "cpu"):
            raise ValueError(
                "ProfileJob: clock='thread_cpu' needs --threads 1 on --device cpu "
                "(it times the calling thread only)"
            )
        if self.backend == "sglang" and not self.device.startswith("cuda"):
            raise ValueError("ProfileJob: the sglang backend profiles GPUs; pass --device cuda")

    @property
    def slug(self) -> str:
        if self.model_slug:
            return slugify(self.model_slug)
        if self.model == SMOLLM2:
            return SMOLLM2_SLUG
        return slugify(Path(self.model).name)


def resolve_model_path(model: str) -> Path:
    if model == SMOLLM2:
        from dspark_sglang.targets.smollm2 import ensure_smollm2

        return Path(ensure_smollm2())
    path = Path(model)
    if not (path / "config.json").is_file():
        raise ValueError(
            f"model {model!r} is neither 'smollm2' nor a HF model folder with config.json"
        )
    return path


def build_backend(job: ProfileJob) -> Backend:
    """Instantiate the job's backend on this node (loads the model)."""
    import torch

    torch.set_num_threads(job.threads)
    path = resolve_model_path(job.model)
    if job.backend == "sglang":
        from dspark_sglang.profiling.sglang_backend import SGLangRunnerBackend

        return SGLangRunnerBackend(
            model_path=str(path),
            model_slug=job.slug,
            max_batch_tokens=job.grid.max_tokens,
            context_len=job.context_len,
            tp_size=job.tp_size,
            dtype=job.dtype,
            cuda_graphs=job.cuda_graphs,
        )
    from transformers import AutoModelForCausalLM

    from dspark_sglang.profiling.backend import HFVerifyBackend

    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, job.dtype))
    model.to(job.device)
    return HFVerifyBackend(
        model,
        job.slug,
        context_len=job.context_len,
        verify_width=job.verify_width,
        max_batch_tokens=job.grid.max_tokens,
        clock=job.clock,
    )


def run_job(
    job: ProfileJob,
    node: str,
    progress: Callable[[int, int], None] | None = None,
    backend: Backend | None = None,
) -> NodeProfile:
    """Measure this node's staircase for ``job`` (building the backend unless given)."""
    started = utc_now()
    hardware = detect_fingerprint(job.device)
    be = backend if backend is not None else build_backend(job)
    probes = measure_staircase(be, job.grid, job.measure, progress)
    return NodeProfile(
        node=node,
        hardware=hardware,
        backend=be.info,
        grid=job.grid,
        measure=job.measure,
        probes=tuple(probes),
        versions=software_versions(),
        started_at=started,
        finished_at=utc_now(),
    )


def job_to_dict(job: ProfileJob) -> dict[str, Any]:
    from dataclasses import asdict

    d = asdict(job)
    d["grid"] = job.grid.to_dict()
    return d
