#!/usr/bin/env bash
# Installs the CPU-only shims SGLang 0.5.23 needs into an existing venv.
#
# Usage: bash scripts/install_cpu_sglang.sh <venv>
#
# Why: SGLang's CPU engine calls torch.ops.sgl_kernel.*_cpu ops from a C++
# sgl-kernel build that is not on PyPI. packages/sgl_kernel_ref is a
# pure-PyTorch reference of the few ops our CPU paths reach. It is installed
# only when no real sgl_kernel is importable (a GPU image keeps its kernel).
# Editable, so it always tracks the checkout that last ran setup (like the
# project itself); re-running is cheap and idempotent.
#
# SGLang also imports torchvision (image transforms) on its import chain.
# PyPI's torchvision is CUDA-linked and fails to import under CPU torch
# ("operator torchvision::nms does not exist"); packages/torchvision_cpu_shim
# plus a .pth hook registers those op schemas first. The shim is installed
# only when a plain `import torchvision` fails.
set -euo pipefail

VENV="${1:?usage: install_cpu_sglang.sh <venv>}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
PY="$VENV/bin/python"
log() { echo "[install_cpu_sglang] $*" >&2; }
# shellcheck source=scripts/quiet.sh
source "$ROOT/scripts/quiet.sh"

TORCHVISION_PIN="torchvision==0.28.0"  # the release built against torch 2.13

if ! "$PY" -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('torchvision') is None)"; then
  log "installing $TORCHVISION_PIN (--no-deps: keeps the CPU torch)"
  run_logged "$VENV/bin/pip" install --disable-pip-version-check -q --no-deps "$TORCHVISION_PIN"
fi
SITE=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
PTH="$SITE/dspark_torchvision_cpu_shim.pth"
# (Re)install when torchvision fails without it, or when it is already in use
# (so the installed copy tracks this checkout).
SHIM_SRC="$ROOT/packages/torchvision_cpu_shim/src/torchvision_cpu_shim/__init__.py"
SHIM_DST="$SITE/torchvision_cpu_shim/__init__.py"
if [ -f "$PTH" ] && cmp -s "$SHIM_SRC" "$SHIM_DST"; then
  :  # installed and identical to this checkout's copy
elif [ -f "$PTH" ] || ! "$PY" -c "import torchvision" 2>/dev/null; then
  log "torchvision needs the op-schema shim on this torch; installing it"
  # Built from a temporary copy: setuptools would leave build/ in the checkout.
  tmp=$(mktemp -d)
  cp -r "$ROOT/packages/torchvision_cpu_shim" "$tmp/"
  run_logged "$VENV/bin/pip" install --disable-pip-version-check -q --no-deps --no-build-isolation \
    "$tmp/torchvision_cpu_shim"
  rm -rf "$tmp"
  echo "import torchvision_cpu_shim; torchvision_cpu_shim.activate()" > "$PTH"
  "$PY" -c "import torchvision.transforms" >&2
fi

state=$("$PY" - <<'PYEOF'
try:
    import sgl_kernel
except ImportError:
    print("absent")
else:
    if getattr(sgl_kernel, "IS_REFERENCE_IMPLEMENTATION", False):
        from pathlib import Path
        # .../packages/sgl_kernel_ref/src/sgl_kernel/__init__.py -> checkout root
        print(f"reference@{Path(sgl_kernel.__file__).resolve().parents[4]}")
    else:
        print("real")
PYEOF
)

if [ "$state" = "real" ]; then
  log "a real sgl_kernel is installed; leaving it alone"
  exit 0
fi
if [ "$state" = "reference@$ROOT" ]; then
  exit 0  # already the editable install of this checkout
fi
run_logged "$VENV/bin/pip" install --disable-pip-version-check -q --no-deps --no-build-isolation \
  -e "$ROOT/packages/sgl_kernel_ref"
"$PY" -c "import sgl_kernel, torch; torch.ops.sgl_kernel.extend_attention_cpu" >&2
log "sgl_kernel reference ops installed"
