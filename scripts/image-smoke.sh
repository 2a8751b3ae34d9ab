#!/usr/bin/env bash
# Smoke runs of built images (`make images` runs them after building): scripts/image-smoke.sh NAME...
#
# Each image runs as a pod would run it: its own USER (non-root), its ENV and WORKDIR, a read-only
# root filesystem with an empty writable /tmp (the chart's and the operator's emptyDir), no
# network but its own loopback, new PID/IPC/UTS namespaces, a /proc with masked parts, a
# read-only /sys (vLLM reads the CPU topology there). buildah mounts the image's root
# filesystem; bubblewrap is the runtime (`buildah run` cannot make the root read-only, and its
# chroot isolation forbids the user namespaces the sandbox's own jail needs).
#   operator  gagar operator --help
#   sandbox   gagar sandbox check --isolation=bubblewrap: refuses under a masked /proc (exit 3),
#             passes with it unmasked; auto takes pod there, and pod mode runs a command
#   grader    the heuristic grader ranks the prepared sample group (gagar grader sample)
#   trainer   the trainer entry point (python -m gagar.driver.launch) --help
#   rollout   vLLM serves a tiny Llama policy (written by gagar on the host) and answers one
#             completion from inside the container
# Exits non-zero at the first image whose run fails or shows anything else than expected.
set -euo pipefail
cd "$(dirname "$0")/.."
export STORAGE_DRIVER=vfs
BUILDAH=(buildah --storage-driver "$STORAGE_DRIVER")
CTR=

cleanup() {
  [ -z "$CTR" ] || { "${BUILDAH[@]}" umount "$CTR" >/dev/null 2>&1 || true; "${BUILDAH[@]}" rm "$CTR" >/dev/null 2>&1 || true; }
  CTR=
}
trap cleanup EXIT

config() { "${BUILDAH[@]}" inspect --type image --format "$2" "$1"; }

# run_image IMAGE [BWRAP_ARG...] -- ARG...: the image's ENTRYPOINT with ARGs (as `docker run IMAGE
# ARG...`); `--entrypoint PROG` right after IMAGE replaces the entry point.
run_image() {
  local image=$1 root user workdir entry=() env=() extra=()
  shift
  if [ "$1" = --entrypoint ]; then entry=("$2"); shift 2; fi
  while [ "$1" != -- ]; do extra+=("$1"); shift; done
  shift
  CTR=$("${BUILDAH[@]}" from --pull=false --quiet "$image")
  root=$("${BUILDAH[@]}" mount "$CTR")
  user=$(config "$image" '{{.OCIv1.Config.User}}')
  workdir=$(config "$image" '{{.OCIv1.Config.WorkingDir}}')
  [ ${#entry[@]} -gt 0 ] || mapfile -t entry < <(config "$image" '{{range .OCIv1.Config.Entrypoint}}{{println .}}{{end}}')
  while IFS='=' read -r key value; do
    [ -n "$key" ] && env+=(--setenv "$key" "$value")
  done < <(config "$image" '{{range .OCIv1.Config.Env}}{{println .}}{{end}}')
  case $user in
    '' | 0 | 0:* | root*) echo "smoke: $image runs as root (USER '$user')" >&2; return 1 ;;
  esac
  local status=0
  local proc=(--proc /proc --unshare-pid)
  [ -z "${UNMASKED_PROC:-}" ] || proc=(--bind /proc /proc)
  bwrap --ro-bind "$root" / --dev /dev --tmpfs /dev/shm "${proc[@]}" --ro-bind /sys /sys --tmpfs /tmp \
    --unshare-user --uid "${user%%:*}" --gid "${user##*:}" \
    --unshare-ipc --unshare-uts --unshare-net --die-with-parent \
    --clearenv "${env[@]}" --chdir "${workdir:-/}" "${extra[@]}" -- "${entry[@]}" "$@" || status=$?
  cleanup
  return $status
}

# expect NAME PATTERN OUTPUT: fail unless OUTPUT matches the extended regex PATTERN.
expect() {
  if grep -Eq "$2" <<<"$3"; then
    echo "smoke: $1 ok"
  else
    printf 'smoke: %s FAILED: no match for %s in:\n%s\n' "$1" "$2" "$3" >&2
    exit 1
  fi
}

tag() { bash scripts/images.sh tag "$1"; }

# What every image promises a pod: not root, and a root filesystem it cannot write.
hardened() {
  local out
  out=$(run_image "$(tag "$1")" --entrypoint /bin/sh -- -c \
    'id -u; touch /probe 2>&1 || echo "root read-only"; touch /tmp/probe && echo "tmp writable"' 2>&1) || true
  expect "$1: non-root" '^[1-9][0-9]*$' "$(head -1 <<<"$out")"
  expect "$1: read-only root" '^root read-only$' "$out"
  expect "$1: writable /tmp" '^tmp writable$' "$out"
}

smoke_operator() { expect "operator: gagar operator --help" '^usage: gagar operator' "$(run_image "$(tag operator)" -- operator --help 2>&1)"; }

smoke_sandbox() {
  # /workspace is the sandbox pod's emptyDir. The check's two verdicts: under a /proc whose
  # parts are masked (what runc and containerd do by default, and bubblewrap here) the kernel
  # refuses the jail a /proc of its own, so the executor must refuse to start; with the
  # container's /proc unmasked (a pod's procMount: Unmasked; here the host's /proc, so this
  # run alone shares the host's PID namespace) bubblewrap creates its namespaces.
  local out code=0
  out=$(run_image "$(tag sandbox)" --tmpfs /workspace -- sandbox check --isolation=bubblewrap 2>&1) || code=$?
  expect "sandbox: gagar sandbox check refuses under a masked /proc" \
    "bubblewrap cannot create its namespaces here .*Can't mount proc" "$out"
  expect "sandbox: ... with exit code 3" '^3$' "$code"
  expect "sandbox: gagar sandbox check passes with /proc unmasked" \
    '^sandbox isolation available \(bubblewrap\)$' \
    "$(UNMASKED_PROC=1 run_image "$(tag sandbox)" --tmpfs /workspace -- sandbox check --isolation=bubblewrap 2>&1)"
  # Where bubblewrap cannot run, auto takes the pod mode (the pod is the boundary), and it runs.
  expect "sandbox: auto takes the pod mode under a masked /proc" '^sandbox isolation available \(pod\)$' \
    "$(run_image "$(tag sandbox)" --tmpfs /workspace -- sandbox check 2>/dev/null)"
  expect "sandbox: a command in the pod mode" '"stdout": "ok\\n"' \
    "$(run_image "$(tag sandbox)" --tmpfs /workspace -- sandbox exec --isolation=pod -- python3 -c "print('ok')" 2>/dev/null)"
}

smoke_grader() {
  local out
  out=$(run_image "$(tag grader)" --entrypoint /bin/sh -- -c \
    'gagar grader sample /tmp/group >/dev/null && gagar grade /tmp/group --grader heuristic' 2>&1) || true
  expect "grader: heuristic ranking of the sample group" '"grader": "heuristic"' "$out"
  expect "grader: the sample's test tampering found" '"kind": "test_tampering"' "$out"
}

smoke_trainer() {
  expect "trainer: python -m gagar.driver.launch --help" 'usage: .*--nproc[-_]per[-_]node' \
    "$(run_image "$(tag trainer)" -- --help 2>&1)"
}

smoke_rollout() {
  local model out
  model=$(mktemp -d)
  .venv/bin/python -c "import sys; from pathlib import Path; from gagar.rollout.engines.tiny import write_tiny_llama; write_tiny_llama(Path(sys.argv[1]))" "$model/tiny"
  out=$(run_image "$(tag rollout)" --entrypoint /bin/sh --ro-bind "$model/tiny" /tmp/model \
    --setenv VLLM_CPU_KVCACHE_SPACE 1 --setenv OMP_NUM_THREADS 1 --setenv VLLM_CPU_OMP_THREADS_BIND nobind \
    -- -c '
vllm serve /tmp/model --served-model-name tiny --port 8000 --dtype float32 --max-model-len 512 \
  --enforce-eager >/tmp/vllm.log 2>&1 &
python - <<PY || { tail -30 /tmp/vllm.log; exit 1; }
import json, time, urllib.request
base = "http://127.0.0.1:8000"
start = time.monotonic()
while True:
    try:
        urllib.request.urlopen(base + "/v1/models", timeout=5)
        break
    except OSError:
        if time.monotonic() - start > 900:
            raise SystemExit("vLLM did not start in 900 s")
        time.sleep(2)
body = {"model": "tiny", "prompt": "def add(a, b):", "max_tokens": 8, "temperature": 0}
req = urllib.request.Request(base + "/v1/completions", json.dumps(body).encode(),
                             {"Content-Type": "application/json"})
choice = json.load(urllib.request.urlopen(req, timeout=300))["choices"][0]
print("vLLM up in %.0f s; finish reason: %s" % (time.monotonic() - start, choice["finish_reason"]))
print(json.dumps(choice))
PY' 2>&1) || true  # expect shows what went wrong
  rm -rf "$model"
  expect "rollout: vLLM serves the tiny policy, one completion" '^vLLM up in [0-9]+ s; finish reason: (length|stop)$' "$out"
  echo "$out" | head -1
}

for name in "$@"; do
  start=$SECONDS
  hardened "$name"
  "smoke_$name"
  echo "smoke: $name passed in $((SECONDS - start)) s"
done
