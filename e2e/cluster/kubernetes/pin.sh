#!/usr/bin/env bash
# Writes the Go module that builds one Kubernetes release's control plane: vVERSION/go.mod and go.sum.
# k8s.io/kubernetes requires its staging modules (k8s.io/api, k8s.io/client-go, ...) at v0.0.0 and points
# them at local paths, which a depending module does not inherit; this module points each one at its
# published v0.MINOR.PATCH instead. The control plane's programs (and etcd, which k8s.io/kubernetes already
# requires at the release it was tested with) are the module's `tool`s. Needs the Go module proxy.
#
# Usage: pin.sh 1.35.4
set -euo pipefail

VERSION="${1:?usage: pin.sh MAJOR.MINOR.PATCH}"
MINOR="${VERSION%.*}"
DIR="$(cd "$(dirname "$0")" && pwd)/v$MINOR"
TOOLS=(k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager
       k8s.io/kubernetes/cmd/kube-scheduler go.etcd.io/etcd/server/v3)

mkdir -p "$DIR"
cd "$DIR"
rm -f go.mod go.sum
go mod init dualpods.local/control-plane >/dev/null 2>&1
upstream_mod="$(go mod download -json "k8s.io/kubernetes@v$VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
go_line="$(grep -m1 -E '^go [0-9]' "$upstream_mod")"
sed -i "s/^go .*/$go_line/" go.mod
staging_version="v0.${VERSION#*.}"
{
  echo
  echo "require k8s.io/kubernetes v$VERSION"
  echo
  echo "replace ("
  sed -n -E 's#^\s*(k8s\.io/[a-z0-9-]+) => \./staging/src/.*#\t\1 => \1 '"$staging_version"'#p' "$upstream_mod"
  echo ")"
  echo
  echo "tool ("
  printf '\t%s\n' "${TOOLS[@]}"
  echo ")"
} >> go.mod
# `go get -tool` would upgrade k8s.io/kubernetes to the newest release; tidy keeps the pinned one.
go mod tidy
echo "pinned Kubernetes v$VERSION in $DIR" >&2
