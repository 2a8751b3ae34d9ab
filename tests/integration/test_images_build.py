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
import subprocess
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
