"""`make images` uses the host's pinned uv inside each build instead of bootstrapping it with pip.

Behind a TLS-intercepting proxy, the pip of a Debian base ignored ``PIP_CERT`` and
``SSL_CERT_FILE`` and every build failed at ``pip install uv==...``. ``scripts/images.sh`` now
mounts ``.tools/uv/bin/uv`` read-only into the build (``GAGAR_UV``), as it mounts the wheel
folder, and ``scripts/uv.sh`` takes it when its version is the pinned one: no pip runs at all.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.tools import ROOT

HOST_UV = ROOT / ".tools" / "uv" / "bin" / "uv"
needs_uv = pytest.mark.skipif(not HOST_UV.exists(), reason="make install puts uv in .tools")


def build_args(name: str) -> list[str]:
    out = subprocess.run(
        ["bash", "scripts/images.sh", "args", name], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


@needs_uv
@pytest.mark.parametrize("name", ["operator", "sandbox", "grader", "trainer", "rollout"])
def test_every_build_gets_the_hosts_uv_and_declares_it(name: str) -> None:
    args = build_args(name)
    assert f"{HOST_UV.resolve()}:/run/gagar-uv:ro" in args
    assert "GAGAR_UV=/run/gagar-uv" in args
    dockerfile = ROOT / args[args.index("-f") + 1]
    assert re.search(r"^ARG GAGAR_UV$", dockerfile.read_text(), flags=re.M), dockerfile


@needs_uv
def test_uv_sh_takes_the_mounted_uv_without_pip(tmp_path: Path) -> None:
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "uv.sh", tmp_path / "scripts" / "uv.sh")
    bin_dir = tmp_path / "bin"  # no python3 on the PATH: a pip bootstrap would fail loudly
    bin_dir.mkdir()
    for tool in ("cut", "mkdir"):
        (bin_dir / tool).symlink_to(shutil.which(tool))  # type: ignore[arg-type]
    env = {"PATH": str(bin_dir), "GAGAR_UV": str(HOST_UV.resolve())}
    script = 'source scripts/uv.sh && echo "UV=$UV"'
    out = subprocess.run(
        [shutil.which("bash"), "-c", script],  # type: ignore[list-item]
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"UV={HOST_UV.resolve()}"]
    assert not (tmp_path / ".tools").exists()


@needs_uv
def test_uv_sh_bootstraps_when_the_mounted_uv_is_another_version(tmp_path: Path) -> None:
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "uv.sh", tmp_path / "scripts" / "uv.sh")
    fake = tmp_path / "uv"
    fake.write_text("#!/bin/sh\necho 'uv 0.0.1'\n")
    fake.chmod(0o755)
    env = {**os.environ, "GAGAR_UV": str(fake), "PATH": "/nonexistent:" + os.environ["PATH"]}
    script = 'python3() { echo "bootstrap $*"; exit 0; }; source scripts/uv.sh'
    out = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert "bootstrap -m venv .tools/uv" in out.stdout


@pytest.mark.parametrize("variable", ["SSL_CERT_FILE", "PIP_CERT"])
def test_a_pip_bootstrap_gets_the_proxys_ca_as_cert(tmp_path: Path, variable: str) -> None:
    """Where no pinned uv is at hand (a plain ``docker build``, a host before ``make install``),
    uv.sh still bootstraps it with pip, whose ``--isolated`` ignores ``PIP_CERT`` and which never
    reads ``SSL_CERT_FILE``: the CA bundle must reach it as ``--cert``."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "uv.sh", tmp_path / "scripts" / "uv.sh")
    ca = tmp_path / "proxy-ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    env = {k: v for k, v in os.environ.items() if k not in ("SSL_CERT_FILE", "PIP_CERT")}
    env |= {variable: str(ca), "PATH": "/nonexistent:" + os.environ["PATH"]}
    env.pop("GAGAR_UV", None)
    fake_venv = (  # python3 -m venv DIR: a DIR/bin/python that prints what pip was asked
        'python3() { mkdir -p "$3/bin"; printf "#!/bin/sh\\necho pip \\"\\$@\\"\\n" > "$3/bin/python";'
        ' chmod +x "$3/bin/python"; }; source scripts/uv.sh'
    )
    out = subprocess.run(
        ["bash", "-c", fake_venv], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    pip = [line for line in out.stdout.splitlines() if line.startswith("pip ")]
    assert pip, out.stdout + out.stderr
    assert f"--cert {ca}" in pip[0] and "--isolated" in pip[0], pip


def test_the_public_rollout_image_installs_with_the_mounted_uv() -> None:
    """BASES=public builds images/rollout/Dockerfile on vLLM's image: the host's uv is mounted
    and the Dockerfile declares and uses it (pip only as a plain docker build's fallback)."""
    out = subprocess.run(
        ["bash", "scripts/images.sh", "args", "rollout"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "BASES": "public"},
    )
    assert out.returncode == 0, out.stderr
    args = out.stdout.splitlines()
    assert args[args.index("-f") + 1] == "images/rollout/Dockerfile"
    text = (ROOT / "images" / "rollout" / "Dockerfile").read_text()
    assert re.search(r"^ARG GAGAR_UV$", text, flags=re.M)
    assert '"$GAGAR_UV" pip install' in text
    if HOST_UV.exists():
        assert "GAGAR_UV=/run/gagar-uv" in args
