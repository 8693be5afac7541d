#!/usr/bin/env bash
# Builds a real kube-apiserver (Kubernetes 1.20.2) from Debian bookworm's source
# package and puts it, with Debian's etcd, into the project cache:
#   ${DSPARK_CACHE_DIR:-~/.cache/dspark-sglang}/kube/{kube-apiserver,etcd,build-info.json}
# The apiserver tests (`pytest -m apiserver`, tests/deploy/apiserver.py) start both on
# 127.0.0.1; without them those tests skip. Never commit the binaries (~110 MB).
#
# Why this route: dev/CI machines reach only PyPI, Debian and npm mirrors, and no
# Debian or PyPI package ships a kube-apiserver binary. Debian's `kubernetes` source
# package (1.20.2, which only builds kubectl there) has the whole tree with vendored
# modules, so `make WHAT=cmd/kube-apiserver` builds offline with Debian's Go 1.19.
# One change is needed: the vendored github.com/modern-go/reflect2 v1.0.1 crashes
# (SIGSEGV, its unsafe map iteration predates Go 1.18) the first time the server
# serves a custom resource; it is swapped for Debian's reflect2 1.0.2
# (golang-github-modern-go-reflect2-dev), which fixes exactly that.
#
# What it is good for: ConfigMaps, Secrets, CRDs, RBAC objects and helm's release
# history (install / upgrade / rollback, `helm get manifest`). What it is not: a
# cluster. There is no controller-manager, scheduler or kubelet, so no pod ever
# runs, and 1.20 has no policy/v1 PodDisruptionBudget or autoscaling/v2 HPA.
#
# Needs (installed with apt-get when run as root, else listed and refused):
# golang-go (>= 1.15; bookworm: 1.19), etcd-server (3.4), golang-github-modern-go-
# reflect2-dev, make, rsync, curl, dpkg-dev (dpkg-source); and the Debian mirror for
# the three source files (~34 MB, sha256-pinned below; kept in the cache for reruns).
# Cost (measured on a busy 2-core machine): `make` 465 s, 8.5 min in all, 1.3 GB peak
# RSS, ~3.5 GB written while building (the tree and Go's build cache, removed afterwards).
#
# Idempotent: exits at once when the cached binaries match build-info.json. Logs go
# to stderr; the last stdout line is the directory holding both binaries:
#   KUBE_DIR=$(bash scripts/build_kube_apiserver.sh | tail -1)
# Env: DSPARK_CACHE_DIR (cache root), DEBIAN_MIRROR (default http://deb.debian.org/debian),
# DSPARK_KEEP_KUBE_BUILD=1 keeps the build tree, DSPARK_KUBE_NICE (default 10).
set -euo pipefail

SRC_VERSION="1.20.5+really1.20.2-1.1+deb12u1"
ORIG_VERSION="1.20.5+really1.20.2"
DSC="kubernetes_${SRC_VERSION}.dsc"
DSC_SHA256="19fa1da5aefcef673894ac9511986bd98a14410cf8eea0b626613c30df435257"
ORIG="kubernetes_${ORIG_VERSION}.orig.tar.gz"
ORIG_SHA256="b83c0780efb182d928dc63d46488a847f161f04e40a94b96bf5247dd671ecdfc"
DEBTAR="kubernetes_${SRC_VERSION}.debian.tar.xz"
DEBTAR_SHA256="9b6e5fd41769d2b5badf2e73b274e3bcd90f85e13d06a1a4a845ccce018127d8"
EXPECT_KUBE_VERSION="v1.20.2"
REFLECT2_DIR="/usr/share/gocode/src/github.com/modern-go/reflect2"
APT_PACKAGES=(golang-go etcd-server golang-github-modern-go-reflect2-dev make rsync curl dpkg-dev)

CACHE="${DSPARK_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dspark-sglang}"
KDIR="$CACHE/kube"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
NICE="${DSPARK_KUBE_NICE:-10}"
INFO="$KDIR/build-info.json"
log() { echo "[build_kube_apiserver] $*" >&2; }

sha() { sha256sum "$1" | cut -d' ' -f1; }

# Already built: both binaries present and matching the recorded hashes.
built() {
  [ -x "$KDIR/kube-apiserver" ] && [ -x "$KDIR/etcd" ] && [ -f "$INFO" ] || return 1
  grep -q "\"$(sha "$KDIR/kube-apiserver")\"" "$INFO" && grep -q "\"$(sha "$KDIR/etcd")\"" "$INFO"
}

if built; then
  echo "$KDIR"
  exit 0
fi

mkdir -p "$KDIR/src"
# One build at a time (two test sessions asking at once must not race).
exec 9>"$KDIR/.lock"
flock 9
if built; then
  echo "$KDIR"
  exit 0
fi

missing=()
command -v go >/dev/null 2>&1 || missing+=(golang-go)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
[ -f "$REFLECT2_DIR/reflect2.go" ] || missing+=(golang-github-modern-go-reflect2-dev)
for tool in make rsync curl dpkg-source flock; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing build dependencies: ${APT_PACKAGES[*]}"
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      "${APT_PACKAGES[@]}" >&2
  else
    log "missing: ${missing[*]}"
    log "install them (Debian/Ubuntu: sudo apt-get install ${APT_PACKAGES[*]}) and rerun"
    exit 1
  fi
fi
ETCD_BIN="$(command -v etcd)"

fetch() { # name sha256: download into the cache unless already there with that hash
  local name="$1" want="$2" path="$KDIR/src/$1"
  if [ -f "$path" ] && [ "$(sha "$path")" = "$want" ]; then
    return 0
  fi
  log "downloading $MIRROR/pool/main/k/kubernetes/$name"
  curl -fsSL --retry 3 -o "$path.part" "$MIRROR/pool/main/k/kubernetes/$name"
  if [ "$(sha "$path.part")" != "$want" ]; then
    log "sha256 mismatch for $name: expected $want, got $(sha "$path.part"); refusing"
    rm -f "$path.part"
    exit 1
  fi
  mv -f "$path.part" "$path"
}
fetch "$DSC" "$DSC_SHA256"
fetch "$ORIG" "$ORIG_SHA256"
fetch "$DEBTAR" "$DEBTAR_SHA256"

BUILD="$KDIR/build"
rm -rf "$BUILD"
mkdir -p "$BUILD"
if [ "${DSPARK_KEEP_KUBE_BUILD:-0}" != 1 ]; then
  trap 'rm -rf "$BUILD"' EXIT
fi
SRC="$BUILD/kubernetes-$ORIG_VERSION"
log "unpacking $DSC (Debian's patches applied by dpkg-source)"
# The .dsc is sha256-pinned above and dpkg-source checks the tarballs against it.
dpkg-source -x "$KDIR/src/$DSC" "$SRC" >&2

log "replacing vendored modern-go/reflect2 v1.0.1 with Debian's $(dpkg-query -W -f='${Version}' golang-github-modern-go-reflect2-dev 2>/dev/null || echo '?')"
rm -rf "$SRC/vendor/github.com/modern-go/reflect2"
mkdir -p "$SRC/vendor/github.com/modern-go/reflect2"
# Sources only: a go.mod inside vendor/ would be taken for a nested module.
find "$REFLECT2_DIR" -maxdepth 1 -type f \( -name '*.go' -o -name '*.s' -o -name 'LICENSE' \) \
  ! -name '*_test.go' -exec cp {} "$SRC/vendor/github.com/modern-go/reflect2/" \;

log "building cmd/kube-apiserver with $(go version | cut -d' ' -f3) (nice $NICE; minutes)"
start=$(date +%s)
(
  cd "$SRC"
  export GOCACHE="$BUILD/gocache" GOPATH="$BUILD/gopath" GOFLAGS="-mod=vendor" GO111MODULE=on
  export GOPROXY=off CGO_ENABLED=0 HOME="$BUILD/home"
  mkdir -p "$HOME"
  nice -n "$NICE" make WHAT=cmd/kube-apiserver >&2
)
secs=$(( $(date +%s) - start ))
OUTBIN="$SRC/_output/bin/kube-apiserver"
[ -x "$OUTBIN" ] || { log "no $OUTBIN after make"; exit 1; }
got="$("$OUTBIN" --version | awk '{print $2}')"
if [ "$got" != "$EXPECT_KUBE_VERSION" ]; then
  log "built kube-apiserver reports $got, expected $EXPECT_KUBE_VERSION"
  exit 1
fi

# Atomic installs: a concurrent reader never sees a half-written binary.
install -m 0755 "$OUTBIN" "$KDIR/kube-apiserver.tmp.$$"
mv -f "$KDIR/kube-apiserver.tmp.$$" "$KDIR/kube-apiserver"
install -m 0755 "$ETCD_BIN" "$KDIR/etcd.tmp.$$"
mv -f "$KDIR/etcd.tmp.$$" "$KDIR/etcd"
cat >"$INFO.tmp.$$" <<EOF
{
  "kube_apiserver_version": "$got",
  "kube_apiserver_sha256": "$(sha "$KDIR/kube-apiserver")",
  "debian_source": "kubernetes $SRC_VERSION",
  "debian_dsc_sha256": "$DSC_SHA256",
  "go_version": "$(go version | cut -d' ' -f3)",
  "reflect2": "golang-github-modern-go-reflect2-dev $(dpkg-query -W -f='${Version}' golang-github-modern-go-reflect2-dev 2>/dev/null || echo unknown)",
  "etcd_version": "$("$KDIR/etcd" --version | awk '/etcd Version/ {print $3}')",
  "etcd_package": "etcd-server $(dpkg-query -W -f='${Version}' etcd-server 2>/dev/null || echo unknown)",
  "etcd_sha256": "$(sha "$KDIR/etcd")",
  "build_seconds": $secs,
  "built_at": "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
}
EOF
mv -f "$INFO.tmp.$$" "$INFO"
log "built kube-apiserver $got in ${secs}s; binaries and build-info.json in $KDIR"
echo "$KDIR"
