"""The torch-only GPU check (``benchmarks/gpu_check.py``, ``scripts/gpu_check.sh``) on the CPU.

The driver runs with ``--device cpu --small`` in a subprocess in which ``sglang`` cannot
be imported (``sys.modules['sglang'] = None``), so any SGLang import anywhere in the four
checks would turn that check's row into an error. The rows of its JSON must all pass:
the device policies equal the host ones, the graph-safe greedy draft loop equals
``sample_block`` (capture itself is CUDA only, and the row says it was skipped), the
verifier on the check's device equals the CPU (here both are the CPU, so this only
proves the comparison runs), and a training step gives finite losses. The shell
script, with no ``nvidia-smi`` on PATH, prints SKIPPED and exits 0.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DRIVER = REPO / "benchmarks" / "gpu_check.py"
CHECKS = ["device_policies", "draft_cuda_graph", "verify_chain", "train_step"]
SMALL_CPU = ("--device", "cpu", "--small")

_RUN_WITHOUT_SGLANG = """
import runpy, sys
sys.modules["sglang"] = None  # any `import sglang` now raises ImportError
sys.argv = [sys.argv[1], *sys.argv[2:]]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in ("sglang", "sgl_kernel")
                    and sys.modules[m] is not None)
    print("SGLANG_MODULES", leaked)
"""


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path_factory.mktemp("gpu_check") / "gpu_check.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run(
        [sys.executable, "-c", _RUN_WITHOUT_SGLANG, str(DRIVER), *SMALL_CPU, "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert out.exists(), proc.stdout + proc.stderr
    return proc, json.loads(out.read_text())


def test_cpu_small_run_passes_every_check_without_sglang(cpu_run) -> None:
    proc, doc = cpu_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SGLANG_MODULES []" in proc.stdout
    rows = {r["check"]: r for r in doc["rows"]}
    assert list(rows) == CHECKS
    failed = {k: r["detail"] for k, r in rows.items() if r["status"] != "pass"}
    assert not failed, failed
    assert doc["all_passed"] is True
    assert doc["settings"] == {"device": "cpu", "small": True, "seed": 0}
    for name in CHECKS:  # the printed table has one line per check
        assert any(
            line.startswith(f"{name} ") and " pass " in line for line in proc.stdout.splitlines()
        )


def test_rows_carry_what_each_check_measured(cpu_run) -> None:
    _, doc = cpu_run
    rows = {r["check"]: r for r in doc["rows"]}
    sizes = doc["sizes"]

    pol = rows["device_policies"]["metrics"]
    # 4 policies x (lagged_steps + 1) decisions per case, none differing.
    assert pol["decisions"] == sizes["policy_cases"] * 4 * (sizes["lagged_steps"] + 1)
    assert pol["mismatches"] == 0

    graph = rows["draft_cuda_graph"]
    assert graph["metrics"]["captured"] is False
    assert "capture skipped on cpu" in graph["detail"]
    assert sorted(graph["metrics"]["heads"]) == ["gated", "rnn", "vanilla"]
    assert all(h["tokens_equal"] for h in graph["metrics"]["heads"].values())

    ver = rows["verify_chain"]["metrics"]
    assert ver["greedy_equal"] and ver["chain_accept_lens_equal"]
    assert 0 < ver["mean_accept_len"] < ver["mean_verify_len"]  # accepts and rejects

    train = rows["train_step"]["metrics"]
    assert len(train["step_seconds"]) == sizes["train_steps"]
    assert train["median_step_seconds"] > 0
    assert train["max_memory_allocated_bytes"] is None  # CPU: no CUDA allocator
    assert (
        train["anchors"] == sizes["train_anchors"] and train["vocab_size"] == sizes["train_vocab"]
    )
    assert train["autocast"] == "float32"
    assert train["drafter_parameters"] > 0


def test_full_sizes_are_the_paper_scale() -> None:
    """What the GPU run is sized to: 512 anchors and a 151936-token vocabulary."""
    sys.path.insert(0, str(DRIVER.parent))
    try:
        import gpu_check  # benchmarks/ is not a package
    finally:
        sys.path.remove(str(DRIVER.parent))
    assert gpu_check.FULL.train_anchors == 512
    assert gpu_check.FULL.train_vocab == 151936
    assert gpu_check.FULL.tiny_target is False
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--only", "nope"])


def test_script_skips_without_nvidia_smi(tmp_path: Path) -> None:
    """PATH holds only ``dirname`` (what the script needs before its GPU test)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    dirname = shutil.which("dirname")
    assert dirname is not None
    (bindir / "dirname").symlink_to(dirname)
    out = tmp_path / "never.json"
    proc = subprocess.run(
        [shutil.which("bash") or "/bin/bash", str(REPO / "scripts" / "gpu_check.sh")],
        env={"PATH": str(bindir), "OUT": str(out), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "[gpu_check] SKIPPED: no NVIDIA GPU" in proc.stdout
    assert not out.exists()
