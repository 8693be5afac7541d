"""Suite-wide settings and the fixtures more than one test folder uses.

Settings that must hold before any test module imports SGLang or torch work starts
come first. The fixtures below live here, not in a folder's conftest, because a
package's tests and its command's tests (``tests/<package>`` and ``tests/cli``)
need the same inputs: the staircase cost table, the synthetic calibration rounds and
the tiny chat target with its drafters and eval sets. Their builders are plain
modules on the path (``synthetic_inputs``, ``tiny_chat_target``), imported inside
the fixtures so collecting an unrelated folder does not load them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# Tests never have a GPU. SGLang caches its is_cpu() probe on first use, so the
# CPU-engine switch must be in place before whichever test folder imports it first.
os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
# Ray must never phone home from a test run: tests must not touch the network.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Tests stop SGLang servers by signalling all their processes at once, so the launcher
# sees its scheduler exit first and takes its crash path, which sleeps 5 s before a
# py-spy dump and a CUDA core dump. Neither exists here; servers inherit this environment.
os.environ.setdefault("SGLANG_PYSPY_DUMP_BEFORE_CRASH", "0")
os.environ.setdefault("SGLANG_CUDA_COREDUMP_BEFORE_CRASH", "0")
# Under pytest-xdist (``make test`` runs two workers) a worker's torch work gets its share
# of the cores, set before torch reads it; tests that pick their own count use the same
# rule (``cpu_threads``).
if os.environ.get("PYTEST_XDIST_WORKER"):
    from cpu_threads import torch_threads

    os.environ.setdefault("OMP_NUM_THREADS", str(torch_threads()))

#: SGLang model files (``sglang/srt/models/<name>.py``) the suite's engines load: Llama
#: (SmolLM2, the tiny chat and llama3 targets), the tiny Qwen3 target and SGLang's dense
#: DSPARK draft. Our MoE draft class is added to the registry by our worker.
SGLANG_MODEL_FILES = ("llama", "qwen3", "dspark")


def _sglang_model_files() -> list[str]:
    """Names of SGLang's model modules, read from the folder (nothing is imported)."""
    import importlib.util
    import pkgutil

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return []
    folder = Path(next(iter(spec.submodule_search_locations))) / "srt" / "models"
    return [m.name for m in pkgutil.iter_modules([str(folder)]) if not m.ispkg]


# SGLang's model registry imports every model module (about 270 architectures, 1 s of
# CPU) in each scheduler it starts; SGLANG_DISABLED_MODEL_ARCHS (SGLang's own switch)
# skips the ones no test engine loads. An engine whose architecture is skipped fails to
# start ("not supported"; the transformers fallback is skipped too), so none runs on
# anything but SGLang's own model class. Servers inherit this environment.
os.environ.setdefault(
    "SGLANG_DISABLED_MODEL_ARCHS",
    ",".join(sorted(set(_sglang_model_files()) - set(SGLANG_MODEL_FILES))),
)


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct as an HF folder (converted into the cache on first use)."""
    from dspark_sglang.targets.smollm2 import ensure_smollm2

    return ensure_smollm2()


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Single-threaded torch for one test: on shared 2-core machines two OpenMP threads
    under load are far slower than one, and results must not depend on it."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# --------------------------------------------------------------------------- synthetic inputs


@pytest.fixture(scope="session")
def table() -> Any:
    """The staircase SPS cost table (``synthetic_inputs.staircase``): planning and its CLI."""
    from synthetic_inputs import staircase

    return staircase()


@pytest.fixture
def synthetic() -> Callable[..., Any]:
    """``synthetic_inputs.synthetic_rounds``: calibration and the ``calibrate`` command."""
    from synthetic_inputs import synthetic_rounds

    return synthetic_rounds


# --------------------------------------------------------------------------- tiny chat target


@pytest.fixture(scope="session")
def tiny_chat_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny chat target as an HF folder (``tiny_chat_target.save_tiny_chat_target``)."""
    from tiny_chat_target import save_tiny_chat_target

    return save_tiny_chat_target(tmp_path_factory.mktemp("models") / "tiny-chat")


@pytest.fixture(scope="session")
def tiny_chat_model(tiny_chat_dir: Path) -> Any:
    """The tiny chat target loaded as an ``HFTarget`` (read only: shared by the session)."""
    from dspark_sglang.targets.hf_target import HFTarget

    return HFTarget(tiny_chat_dir)


@pytest.fixture(scope="session")
def tiny_drafters(
    tiny_chat_model: Any, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """Untrained dspark / dflash / ar drafters of the tiny chat target, in the trainer's layouts."""
    from tiny_chat_target import save_tiny_drafters

    return save_tiny_drafters(tiny_chat_model, tmp_path_factory.mktemp("runs"))


@pytest.fixture(scope="session")
def tiny_eval_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``DSPARK_CACHE_DIR`` holding three-prompt eval sets in the fetched layouts."""
    from tiny_chat_target import write_tiny_eval_sets

    return write_tiny_eval_sets(tmp_path_factory.mktemp("cache"))
