#!/usr/bin/env bash
# Profile the SPS staircase of one GPU (built for an H200) into profiles/.
#
# UNTESTED: written in a session without a GPU. It runs the target's forward
# through SGLang 0.5.23's own ModelRunner with CUDA graphs captured for every
# batch size up to MAX_TOKENS (dspark_sglang/profiling/sglang_backend.py), probes
# batch tokens 1..2048 (every size to 16, then 8 points per octave, then up to 48
# refinement probes bisecting each detected cliff), and writes
#   profiles/cuda-<gpu>-<n>x/<model>-tp1.{json,meta.json,png,configmap.yaml}
# The whole run is capped at 8 minutes (timeout 480).
#
# Needs a GPU Python environment with CUDA torch and `sglang==0.5.23` installed
# (NOT scripts/setup.sh, which builds the CPU dev venv). Environment:
#   PYTHON      python of that environment            (default: python3)
#   MODEL       'smollm2' or a HF model folder         (default: smollm2; needs the
#               converted SmolLM2 in the dspark-sglang cache or PyPI access)
#   MAX_TOKENS  largest batch in tokens                (default: 2048)
#   DTYPE       bfloat16 | float16 | float32            (default: bfloat16)
#   OUT         profiles root                          (default: <repo>/profiles)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
MODEL="${MODEL:-smollm2}"
MAX_TOKENS="${MAX_TOKENS:-2048}"
DTYPE="${DTYPE:-bfloat16}"
OUT="${OUT:-$ROOT/profiles}"
log() { echo "[profile_gpu] $*" >&2; }

command -v nvidia-smi >/dev/null || { log "nvidia-smi not found: this script needs an NVIDIA GPU"; exit 2; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >&2
"$PY" - <<'PYEOF'
import sys
import torch
if not torch.cuda.is_available():
    sys.exit("[profile_gpu] torch sees no CUDA device (CPU torch build?)")
import sglang  # noqa: F401  (the GPU environment must have SGLang installed)
print(f"[profile_gpu] torch {torch.__version__} cuda {torch.version.cuda} "
      f"sglang {sglang.__version__} on {torch.cuda.get_device_name(0)}", file=sys.stderr)
PYEOF
if ! "$PY" -c "import dspark_sglang" 2>/dev/null; then
  log "installing this checkout (--no-deps, keeps the CUDA stack untouched)"
  "$PY" -m pip install -q --no-deps --no-build-isolation -e "$ROOT" >&2
fi

cd "$ROOT"
log "profiling $MODEL, batch tokens 1..$MAX_TOKENS, $DTYPE, CUDA graphs on"
timeout 480 "$PY" -m dspark_sglang.cli profile \
  --backend sglang --device cuda --dtype "$DTYPE" --model "$MODEL" \
  --max-batch-tokens "$MAX_TOKENS" --dense-until 16 --points-per-octave 8 \
  --max-refine-probes 48 --drop-threshold 0.03 \
  --warmup 3 --repeats 10 --rounds 2 --context-len 128 --threads 4 \
  --out "$OUT" --node-name "$(hostname)"
log "done; commit the files printed above"
