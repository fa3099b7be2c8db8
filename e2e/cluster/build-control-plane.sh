#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager and kube-scheduler from Debian's `kubernetes` source
# package (the full upstream tree, vendor/ included) with Debian's Go, fully offline apart from the
# Debian archive. The binaries are cached outside the repository, keyed by version, so only the first
# run pays the 5-15 minute build.
#
# Usage: build-control-plane.sh            prints the directory holding the binaries
set -euo pipefail

K8S_DEB_VERSION="1.20.5+really1.20.2-1.1+deb12u1"
K8S_VERSION="1.20.2"
CACHE_ROOT="${DUALPODS_CACHE:-$HOME/.cache/dualpods}"
OUT_DIR="$CACHE_ROOT/kubernetes-$K8S_VERSION"
BINARIES=(kube-apiserver kube-controller-manager kube-scheduler)

have_all() {
  for b in "${BINARIES[@]}"; do [ -x "$OUT_DIR/bin/$b" ] || return 1; done
}

if have_all; then
  echo "$OUT_DIR/bin"
  exit 0
fi

log() { echo "build-control-plane: $*" >&2; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

needed=()
[ -x /usr/lib/go-1.19/bin/go ] || needed+=(golang-1.19-go)
command -v rsync >/dev/null || needed+=(rsync)
[ -d /usr/share/gocode/src/github.com/modern-go/reflect2 ] || needed+=(golang-github-modern-go-reflect2-dev)
if [ ${#needed[@]} -gt 0 ]; then
  log "installing build dependencies: ${needed[*]}"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${needed[@]}" >&2 \
    || { as_root apt-get update >&2 && as_root env DEBIAN_FRONTEND=noninteractive \
           apt-get install -y --no-install-recommends "${needed[@]}" >&2; }
fi

WORK="$CACHE_ROOT/build-kubernetes-$K8S_VERSION"
mkdir -p "$WORK"
cd "$WORK"

if ! ls kubernetes_*.orig.tar.gz >/dev/null 2>&1; then
  log "fetching the Debian source package kubernetes=$K8S_DEB_VERSION"
  # A private APT configuration with a deb-src line, so the system's sources stay untouched.
  mkdir -p apt/lists/partial apt/cache/archives/partial apt/etc/sources.list.d apt/etc/preferences.d
  echo "deb-src http://deb.debian.org/debian bookworm main" > apt/etc/sources.list
  cat > apt/apt.conf <<CONF
Dir::Etc::SourceList "$WORK/apt/etc/sources.list";
Dir::Etc::SourceParts "$WORK/apt/etc/sources.list.d";
Dir::Etc::Preferences "$WORK/apt/etc/preferences";
Dir::Etc::PreferencesParts "$WORK/apt/etc/preferences.d";
Dir::State::Lists "$WORK/apt/lists";
Dir::Cache "$WORK/apt/cache";
CONF
  APT_CONFIG="$WORK/apt/apt.conf" apt-get update >&2
  APT_CONFIG="$WORK/apt/apt.conf" apt-get source --download-only "kubernetes=$K8S_DEB_VERSION" >&2
fi

SRC="$WORK/kubernetes-$K8S_VERSION"
if [ ! -f "$SRC/.dualpods-prepared" ]; then
  log "unpacking the source tree"
  rm -rf "$SRC"
  tar xzf kubernetes_*.orig.tar.gz
  [ -d "$SRC" ] || mv "$(tar tzf kubernetes_*.orig.tar.gz | head -1 | cut -d/ -f1)" "$SRC"
  # Go 1.19 with the vendored reflect2 v1.0.1 crashes the apiserver on the first custom-resource
  # write (fatal error: fault in runtime.mapiterinit); Debian's reflect2 1.0.2 fixes it.
  rm -rf "$SRC/vendor/github.com/modern-go/reflect2"
  mkdir -p "$SRC/vendor/github.com/modern-go/reflect2"
  cp /usr/share/gocode/src/github.com/modern-go/reflect2/*.go \
     /usr/share/gocode/src/github.com/modern-go/reflect2/*.s "$SRC/vendor/github.com/modern-go/reflect2/" 2>/dev/null \
    || cp /usr/share/gocode/src/github.com/modern-go/reflect2/*.go "$SRC/vendor/github.com/modern-go/reflect2/"
  touch "$SRC/.dualpods-prepared"
fi

log "building ${BINARIES[*]} (5-15 minutes on 2 cores, once)"
cd "$SRC"
start=$(date +%s)
PATH="/usr/lib/go-1.19/bin:$PATH" CGO_ENABLED=0 GOPROXY=off GOFLAGS= \
  GOCACHE="$WORK/go-cache" \
  make WHAT="cmd/kube-apiserver cmd/kube-controller-manager cmd/kube-scheduler" GOLDFLAGS="-s -w" >&2
mkdir -p "$OUT_DIR/bin"
for b in "${BINARIES[@]}"; do
  install -m 0755 "_output/bin/$b" "$OUT_DIR/bin/$b.tmp"
  mv "$OUT_DIR/bin/$b.tmp" "$OUT_DIR/bin/$b"
done
log "built in $(( $(date +%s) - start )) s"
# The source tree and Go cache take ~3.7 GB; only the binaries are needed from now on.
if [ "${DUALPODS_KEEP_K8S_BUILD:-0}" != 1 ]; then
  cd "$CACHE_ROOT" && rm -rf "$WORK"
fi
echo "$OUT_DIR/bin"
