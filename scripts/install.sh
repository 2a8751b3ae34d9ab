#!/usr/bin/env bash
# Installs everything gagar and its tests need on a fresh Debian machine (idempotent, re-runnable).
# Each step is skipped when what it installs is already there and up to date.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
STAMP_DIR=.install-stamps
mkdir -p "$STAMP_DIR"

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

# Python packages: reinstall only when pyproject.toml changed since the last install.
hash=$(sha256sum pyproject.toml | cut -c1-16)
if [ ! -f "$STAMP_DIR/pip-$hash" ] || ! "$PYTHON" -c "import gagar" 2>/dev/null; then
  echo "install: pip install -e .[operator,train,dev]"
  "$PYTHON" -m pip install -q -e ".[operator,train,dev]"
  rm -f "$STAMP_DIR"/pip-*; touch "$STAMP_DIR/pip-$hash"
fi

for step in scripts/install.d/*.sh; do
  [ -e "$step" ] || continue
  bash "$step"
done
