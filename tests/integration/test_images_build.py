"""``make images IMAGES="operator sandbox grader"``: real builds and smoke runs (slow, needs root).

buildah builds the three images from images/*/Dockerfile on a Debian base that mmdebstrap makes
from Debian's packages (no container registry), installing gagar from the lock files; then each
image runs as a pod runs it (scripts/image-smoke.sh): non-root, read-only root, its command's
expected output. The image's configuration is read back from buildah's storage.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NAMES = ("operator", "sandbox", "grader")

pytestmark = pytest.mark.slow


def tags(*names: str) -> list[str]:
    out = subprocess.run(
        ["bash", "scripts/images.sh", "tag", *names], cwd=ROOT, capture_output=True, text=True
    )
    return out.stdout.split()


def image_config(tag: str) -> dict:
    out = subprocess.run(
        ["buildah", "--storage-driver", "vfs", "inspect", "--type", "image", tag],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)["OCIv1"]["config"]


@pytest.mark.timeout(3600)
def test_make_images_builds_and_smoke_runs_operator_sandbox_grader() -> None:
    if os.geteuid() != 0:
        pytest.fail("make images needs root: buildah's vfs storage and chroot isolation as root")
    run = subprocess.run(
        ["make", "images", f"IMAGES={' '.join(NAMES)}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=3500,
    )
    print(run.stdout[-6000:], run.stderr[-3000:])
    assert run.returncode == 0, run.stderr[-3000:]
    for name, tag in zip(NAMES, tags(*NAMES), strict=True):
        assert re.search(
            rf"^images: built {re.escape(tag)} in \d+ s, [\d.]+ [kMG]?B$", run.stdout, re.M
        )
        assert f"smoke: {name} passed" in run.stdout
        config = image_config(tag)
        assert config["User"] == "65532:65532"
        assert config["Labels"]["org.opencontainers.image.title"] == f"gagar-{name}"
    assert "smoke: operator: gagar operator --help ok" in run.stdout
    assert "smoke: sandbox: gagar sandbox check passes with /proc unmasked ok" in run.stdout
    assert "smoke: grader: heuristic ranking of the sample group ok" in run.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def registry_get(url: str, accept: str = "application/json") -> dict:
    with urllib.request.urlopen(urllib.request.Request(url, headers={"Accept": accept})) as r:
        return json.loads(r.read())


@pytest.mark.timeout(1800)
def test_make_images_push_reaches_a_real_registry_and_pulls_back_the_same(tmp_path: Path) -> None:
    """``scripts/images.sh push`` (what ``make images PUSH=<prefix>`` ends with) against a real
    registry: Debian's docker-registry (the CNCF distribution registry) on a local port, no TLS.
    The image lands at the name the chart's ``image.registry=<prefix>`` pulls, and pulled back
    it is the same image: the same ID (the digest of its configuration) and layers."""
    if os.geteuid() != 0:
        pytest.fail("make images needs root: buildah's vfs storage and chroot isolation as root")
    if shutil.which("docker-registry") is None:
        pytest.fail("no docker-registry: `make test-images` installs it (Debian package)")
    (tag,) = tags("operator")
    inspect = ["buildah", "--storage-driver", "vfs", "inspect", "--type", "image"]
    if subprocess.run([*inspect, tag], capture_output=True).returncode != 0:  # alone: build it
        subprocess.run(["make", "images", "IMAGES=operator", "SMOKE=0"], cwd=ROOT, check=True,
                       capture_output=True, timeout=1700)  # fmt: skip
    port = free_port()
    config = tmp_path / "registry.yml"
    config.write_text(
        "version: 0.1\nlog:\n  level: warn\n"
        f"storage:\n  filesystem:\n    rootdirectory: {tmp_path / 'blobs'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
    )
    registry = subprocess.Popen(["docker-registry", "serve", str(config)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    base = f"http://127.0.0.1:{port}/v2"
    prefix = f"127.0.0.1:{port}/team/ml"
    pulled = f"{prefix}/gagar-operator:{tag.rsplit(':', 1)[1]}"
    try:
        for _ in range(100):
            try:
                registry_get(base + "/")
                break
            except OSError:
                time.sleep(0.1)
        env = {**os.environ, "PUSH": prefix, "PUSH_TLS_VERIFY": "false"}
        out = subprocess.run(["bash", "scripts/images.sh", "push", "operator"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=900)  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
        assert re.search(rf"^images: pushed {re.escape(pulled)} in \d+ s$", out.stdout, re.M)
        assert f"--set image.registry={prefix}" in out.stdout
        where = subprocess.run(["bash", "scripts/images.sh", "pushed", "operator"], cwd=ROOT,
                               env=env, capture_output=True, text=True, check=True)  # fmt: skip
        assert where.stdout.split() == [pulled]
        listed = registry_get(f"{base}/team/ml/gagar-operator/tags/list")
        assert listed["tags"] == [tag.rsplit(":", 1)[1]]
        # pulled back under another name: the same image
        back = "localhost/pulled-back/gagar-operator:check"
        subprocess.run(["buildah", "--storage-driver", "vfs", "pull", "--quiet",
                        "--tls-verify=false", f"docker://{pulled}"],
                       check=True, capture_output=True, timeout=600)  # fmt: skip
        subprocess.run(["buildah", "--storage-driver", "vfs", "tag", pulled, back], check=True)
        mine, theirs = (json.loads(subprocess.run([*inspect, t], capture_output=True, text=True,
                                                  check=True).stdout)
                        for t in (tag, back))  # fmt: skip
        # the image ID is the digest of the configuration, which names every layer's digest
        assert theirs["FromImageID"] == mine["FromImageID"]
        assert theirs["OCIv1"]["rootfs"]["diff_ids"] == mine["OCIv1"]["rootfs"]["diff_ids"]
        assert theirs["OCIv1"]["config"]["User"] == "65532:65532"
    finally:
        registry.terminate()
        registry.wait(timeout=30)
        subprocess.run(["buildah", "--storage-driver", "vfs", "rmi", "--force",
                        pulled, "localhost/pulled-back/gagar-operator:check"],
                       capture_output=True)  # fmt: skip
