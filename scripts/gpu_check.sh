#!/usr/bin/env bash
# Torch-only GPU check: device scheduling policies, CUDA-graph drafting, verification
# and a drafter training step on one CUDA GPU, with no SGLang.
#
# Prerequisites: an NVIDIA GPU with `nvidia-smi` on PATH and a Python (PYTHON, default
# python3) with CUDA torch, numpy, pyyaml, msgspec, safetensors, tqdm and transformers
# (what dspark_sglang's model, scheduling and training modules import; SGLang is not
# needed and not imported). Nothing is installed or downloaded: the checkout is used
# in place (PYTHONPATH), so a bare torch image works once msgspec is there (carry its
# wheel if the image lacks it). Capped at 8 minutes (timeout 480). UNTESTED ON A GPU:
# written without one; only its CPU mode and no-GPU skip ran.
#
# Checks (driver: benchmarks/gpu_check.py, whose docstring has the details):
#   1. device policies (prefix, lagged, static-k, verify-all) on CUDA equal the host
#      policies, with host syncs made to raise (torch.cuda.set_sync_debug_mode);
#   2. a drafter's forward + greedy Markov loop captured as a CUDA graph and replayed
#      gives the eager sampler's tokens;
#   3. greedy and sampled chain verification on CUDA equal the CPU's on the same inputs;
#   4. one training step at 512 anchors and a 151936-token vocabulary under bf16
#      autocast: median step time and peak GPU memory.
# It prints a table and writes benchmarks/results/gpu_check.json (OUT to change).
# Without a GPU it prints SKIPPED and exits 0. Exit status: 0 all passed or skipped,
# 1 a check failed, 2 setup error or over 8 minutes. The CPU test runs the same driver
# with `--device cpu --small` (tests/benchmarks/test_benchmarks_gpu_check.py).
# The SGLang engine check (plain vs DSPARK_MOE) is scripts/gpu_sglang_check.sh.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
log() { echo "[gpu_check] $*" >&2; }

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "[gpu_check] SKIPPED: no NVIDIA GPU on this machine (nvidia-smi missing or sees no device)"
  exit 0
fi
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "[gpu_check] SKIPPED: $PY's torch sees no CUDA device (CPU torch build?)"
  exit 0
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >&2
missing="$("$PY" - <<'PYEOF'
import importlib.util
need = ("numpy", "yaml", "msgspec", "safetensors", "tqdm", "transformers")
print(" ".join(m for m in need if importlib.util.find_spec(m) is None))
PYEOF
)"
if [[ -n "$missing" ]]; then
  log "FAIL: $PY lacks the Python modules: $missing (pip install them, or carry their wheels)"
  exit 2
fi

cd "$ROOT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
set +e
timeout 480 "$PY" benchmarks/gpu_check.py --device cuda \
  --out "${OUT:-$ROOT/benchmarks/results/gpu_check.json}"
rc=$?
set -e
if [[ $rc -eq 124 ]]; then log "FAIL: took longer than 8 minutes"; exit 2; fi
exit $rc
