# Sourced by the install scripts: uv (pinned, in its own venv under .tools/) and uv_sync_venv.
# Packages come from PyPI; torch's CPU build from the wheel folder this machine keeps
# ($GAGAR_FIND_LINKS, default /opt/wheels) or from $UV_INDEX (e.g. PyTorch's CPU index) elsewhere.
UV_VERSION=0.13.9
# The Python the lock files are compiled for; every environment (.venv, .venv-vllm, the images'
# venvs) is created with it: uv finds it on the machine, or fetches a managed build (the CUDA
# trainer image's Ubuntu base ships another python3).
LOCK_PYTHON=3.11
UV=.tools/uv/bin/uv
STAMP_DIR=.install-stamps
mkdir -p "$STAMP_DIR"
if [ -n "${GAGAR_UV:-}" ] && [ -x "$GAGAR_UV" ] \
  && [ "$("$GAGAR_UV" --version | cut -d' ' -f2)" = "$UV_VERSION" ]; then
  UV=$GAGAR_UV  # an image build: the host's pinned uv, mounted read-only (scripts/images.sh)
elif ! [ -x "$UV" ] || [ "$("$UV" --version | cut -d' ' -f2)" != "$UV_VERSION" ]; then
  echo "install: uv $UV_VERSION into .tools/uv"
  python3 -m venv .tools/uv
  # --isolated ignores pip's environment (PIP_CERT too) and configuration: a proxy's CA bundle
  # ($PIP_CERT, else $SSL_CERT_FILE, which pip never reads itself) is passed as --cert.
  pip_cert=()
  ca=${PIP_CERT:-${SSL_CERT_FILE:-}}
  [ -z "$ca" ] || [ ! -f "$ca" ] || pip_cert=(--cert "$ca")
  .tools/uv/bin/python -m pip install -q --isolated --disable-pip-version-check "${pip_cert[@]}" \
    "uv==$UV_VERSION"
fi
find_links=()
[ -d "${GAGAR_FIND_LINKS:-/opt/wheels}" ] && find_links=(--find-links "${GAGAR_FIND_LINKS:-/opt/wheels}")

# uv_sync_venv VENV LOCK: make VENV hold exactly LOCK plus gagar (editable), every module compiled
# to bytecode; stamped by the hashes of the lock, pyproject.toml and this script, so a re-run with
# nothing changed returns at once.
# Compiled because nothing else can write the bytecode: the sandbox's jails see the environment
# read-only, and a host may set PYTHONDONTWRITEBYTECODE (this one does). Without it every process
# compiles all it imports, every time: a jailed pytest run took 0.54 CPU s instead of 0.27, and
# importing vLLM's server 20 CPU s instead of 9 (docs/driver.md, tests/unit/test_install.py).
uv_sync_venv() {
  local venv=$1 lock=$2 stamp
  stamp="$STAMP_DIR/$(basename "$venv")-$(cat "$lock" pyproject.toml scripts/uv.sh | sha256sum | cut -c1-16)"
  if [ -f "$stamp" ] && [ -x "$venv/bin/python" ]; then return 0; fi
  local start=$SECONDS
  echo "install: $venv from $lock"
  [ -x "$venv/bin/python" ] || "$UV" venv -q --python "$LOCK_PYTHON" "$venv"
  "$UV" pip sync -q --compile-bytecode --python "$venv/bin/python" "${find_links[@]}" "$lock"
  "$UV" pip install -q --python "$venv/bin/python" --no-deps -e .
  rm -f "$STAMP_DIR/$(basename "$venv")"-*; touch "$stamp"
  echo "install: $venv ready in $((SECONDS - start)) s"
}
