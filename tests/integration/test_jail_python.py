"""The jail's Python is the executor's own environment, wherever that environment lives.

A jailed ``python`` is the first on the jail's PATH: the executor's environment (its lock's
pytest), not whichever installation sorts first (on a machine whose base interpreter has a pytest
installed by hand, every task's tests ran that one). An environment under /tmp (a clone there)
is bound after the session's /tmp, so it is seen, not hidden.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from gagar.rollout.envs import synthetic
from gagar.rollout.envs.verify import verify_files
from gagar.sandbox import bwrap
from gagar.sandbox.local import LocalFactory, check_isolation
from gagar.sandbox.types import Limits

LIMITS = Limits(wall_time_s=60, cpu_time_s=30, memory_bytes=1 << 30)


@pytest.fixture(scope="module")
def factory() -> LocalFactory:
    check_isolation()
    return LocalFactory(limits=LIMITS)


def test_a_jailed_python_is_the_executor_s_environment(factory) -> None:
    code = "import sys, pytest; print(sys.prefix); print(pytest.__file__)"
    with factory.create(files={}) as s:
        r = s.exec(["/bin/sh", "-c", f"python -c '{code}'"])
    assert r.ok, r.stderr
    prefix, pytest_file = r.stdout.split()
    own = os.path.realpath(sys.prefix)
    assert prefix == own and pytest_file.startswith(own + "/")


def test_a_read_only_path_under_tmp_is_visible_inside() -> None:
    """What a clone under /tmp needs: its environment bound over the session's /tmp."""
    check_isolation()
    env = Path(tempfile.mkdtemp(prefix="gagar-env-", dir="/tmp"))
    env.chmod(0o755)  # as an environment is: readable by the sandbox's uid
    try:
        (env / "bin").mkdir()
        (env / "bin" / "marker").write_text("here\n")
        with LocalFactory(limits=LIMITS, ro_paths=(str(env),)).create(files={}) as s:
            r = s.exec(f"cat {env}/bin/marker && touch /tmp/mine && ls /tmp")
            assert r.ok and r.stdout.startswith("here\n"), (r.describe(), r.stderr)
            assert s.exec(f"touch {env}/bin/x").exit_code != 0  # read-only inside
    finally:
        for p in sorted(env.rglob("*"), reverse=True):
            p.unlink() if p.is_file() else p.rmdir()
        env.rmdir()


def _base_site_packages() -> str:
    paths = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_prefix})
    return os.path.realpath(paths["purelib"])


def test_tasks_verify_with_the_base_interpreter_s_pytest_masked(factory, monkeypatch) -> None:
    """The base interpreter's site-packages hidden inside the jail (as on a machine where only
    the project's environment has pytest): tasks still verify, with the environment's pytest."""
    base = _base_site_packages()
    if base.startswith(os.path.realpath(sys.prefix) + "/"):
        pytest.skip("no separate environment: the executor runs the base interpreter itself")
    real = bwrap.bwrap_argv

    def masked(jail, limits, cmd):
        argv = real(jail, limits, cmd)
        at = argv.index("--clearenv")
        return [*argv[:at], "--tmpfs", base, *argv[at:]]

    monkeypatch.setattr(bwrap, "bwrap_argv", masked)
    with factory.create(files={}) as s:  # the mask acts: the base has no packages inside
        assert s.exec(["ls", "-A", base]).stdout == ""
    for seed in (0, 1):
        task = synthetic.generate(seed)
        verdict = verify_files(task, task.fixed_files(), factory)
        assert verdict.valid and verdict.passed, verdict.log[-2000:]


RUNNER_PACKAGES = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "pygments", "py.py")
CLONE_SCRIPT = """
import sys
sys.path += {extra!r}  # gagar and its dependencies, after the clone's own site-packages
from gagar.rollout.envs import synthetic
from gagar.rollout.envs.verify import verify_files
from gagar.sandbox import bwrap
from gagar.sandbox.local import LocalFactory
from gagar.sandbox.types import Limits
real = bwrap.bwrap_argv
def masked(jail, limits, cmd):  # the base interpreter's site-packages hidden inside the jail
    argv = real(jail, limits, cmd)
    at = argv.index("--clearenv")
    return [*argv[:at], "--tmpfs", {base!r}, *argv[at:]]
bwrap.bwrap_argv = masked
factory = LocalFactory(limits=Limits(wall_time_s=60, cpu_time_s=30, memory_bytes=1 << 30))
task = synthetic.generate(0)
v = verify_files(task, task.fixed_files(), factory)
print(sys.prefix, v.passed, v.valid)
print(v.log[-1500:])
"""


def test_an_environment_under_tmp_verifies_tasks(tmp_path) -> None:
    """A clone under /tmp: its environment (the only one with pytest, the base's masked) runs
    the tests. The executor here is a venv made under /tmp holding a copy of pytest."""
    import shutil
    import subprocess
    import venv

    check_isolation()
    base = _base_site_packages()
    if base.startswith(os.path.realpath(sys.prefix) + "/"):
        pytest.skip("no separate environment: the executor runs the base interpreter itself")
    env = Path(tempfile.mkdtemp(prefix="gagar-clone-", dir="/tmp"))
    try:
        env.chmod(0o755)
        venv.EnvBuilder(symlinks=True, with_pip=False).create(env / "venv")
        py = env / "venv" / "bin" / "python"
        site = subprocess.run(
            [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        ours = sysconfig.get_paths()["purelib"]
        for name in RUNNER_PACKAGES:
            src = Path(ours) / name
            if src.is_dir():
                shutil.copytree(src, Path(site) / name)
            elif src.exists():
                shutil.copy2(src, Path(site) / name)
        root = str(Path(__file__).resolve().parents[2])
        script = CLONE_SCRIPT.format(extra=[root, ours], base=base)
        r = subprocess.run(
            [py, "-c", script], capture_output=True, text=True, timeout=300, cwd=root
        )
        assert r.returncode == 0, r.stderr[-3000:]
        prefix, passed, valid = r.stdout.split("\n", 1)[0].split()
        assert prefix.startswith("/tmp/") and (passed, valid) == ("True", "True"), r.stdout
    finally:
        shutil.rmtree(env)
