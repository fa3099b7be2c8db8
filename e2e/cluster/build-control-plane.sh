#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-controller-manager and kube-scheduler of one Kubernetes minor with the
# machine's Go, from the Go module proxy, as pinned by e2e/cluster/kubernetes/vMINOR/go.{mod,sum} (written by
# kubernetes/pin.sh; no Kubernetes source lives in this repository). The binaries are cached outside the
# repository, keyed by the module's pins, this script and the Go version, so only the first run pays the build
# (about 6 minutes on 2 cores with a cold Go cache).
#
# Usage: build-control-plane.sh [MINOR]      MINOR defaults to $DUALPODS_K8S_MINOR, else 1.35;
#                                            prints the directory holding the binaries
set -euo pipefail

MINOR="${1:-${DUALPODS_K8S_MINOR:-1.35}}"
MODULE_DIR="$(cd "$(dirname "$0")" && pwd)/kubernetes/v$MINOR"
[ -f "$MODULE_DIR/go.mod" ] || { echo "build-control-plane: no pinned module for Kubernetes $MINOR ($MODULE_DIR)" >&2; exit 2; }
command -v go >/dev/null || { echo "build-control-plane: Go is needed (the polyglot machine has it)" >&2; exit 2; }

VERSION="$(sed -n -E 's#^\s*k8s\.io/kubernetes (v[0-9.]+).*#\1#p' "$MODULE_DIR/go.mod")"
KEY="$( (cat "$0" "$MODULE_DIR/go.mod" "$MODULE_DIR/go.sum"; go env GOVERSION) | sha256sum | cut -c1-12)"
CACHE_ROOT="${DUALPODS_CACHE:-$HOME/.cache/dualpods}"
OUT_DIR="$CACHE_ROOT/kubernetes-$VERSION-$KEY"
BINARIES=(etcd kube-apiserver kube-controller-manager kube-scheduler)

have_all() {
  for b in "${BINARIES[@]}"; do [ -x "$OUT_DIR/bin/$b" ] || return 1; done
}

if have_all; then
  echo "$OUT_DIR/bin"
  exit 0
fi

log() { echo "build-control-plane: $*" >&2; }
log "building Kubernetes $VERSION (${BINARIES[*]}) from the Go module proxy, once"
start=$(date +%s)
cd "$MODULE_DIR"
# What `kubectl version` and the API server's /version report (upstream's build sets the same variables).
major="${VERSION#v}"; major="${major%%.*}"
minor="${VERSION#v*.}"; minor="${minor%%.*}"
released="$(go list -m -f '{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}' k8s.io/kubernetes)"
stamp=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  stamp+=" -X $pkg.gitVersion=$VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
  stamp+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$released"
done
staging="$OUT_DIR/bin.partial"
rm -rf "$staging"
mkdir -p "$staging"
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=readonly
go build -trimpath -ldflags "-s -w$stamp" -o "$staging/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler
go build -trimpath -ldflags "-s -w" -o "$staging/etcd" go.etcd.io/etcd/server/v3
rm -rf "$OUT_DIR/bin"
mv "$staging" "$OUT_DIR/bin"
log "built in $(( $(date +%s) - start )) s"
echo "$OUT_DIR/bin"
