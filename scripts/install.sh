#!/usr/bin/env bash
# Installs everything gagar and its tests need on a fresh Debian machine (idempotent, re-runnable),
# without touching the system Python: gagar and its locked dependencies go into the project
# environment .venv, created by uv (itself kept in .tools/uv), and vLLM into .venv-vllm.
# Each step is skipped when what it installs is already there and matches the lock file.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/uv.sh

need_apt=()
command -v bwrap >/dev/null || need_apt+=(bubblewrap)
command -v prometheus >/dev/null || need_apt+=(prometheus)
command -v promtool >/dev/null || need_apt+=(prometheus)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "install: Debian packages ${need_apt[*]}"
  if [ "$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

# The project environment: exactly the lock file, then gagar itself (editable, no dependencies).
uv_sync_venv .venv lock/gagar.txt

for step in scripts/install.d/*.sh; do
  [ -e "$step" ] || continue
  bash "$step"
done
