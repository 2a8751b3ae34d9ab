"""Task environments on one machine (``gagar/sandbox/venvs.py``): a lock becomes one virtual
environment, made once whoever asks at the same time; a session of the environment runs its
``python`` (first on ``PATH``, ``VIRTUAL_ENV``), in bubblewrap read-only, warm from a fork server
of that environment, and in isolation ``none`` through ``PATH`` alone; verification runs a task's
tests in the task's environment, so a test that needs a package only the environment has passes
with it and fails without it or in another environment, and stations never mix environments;
the loop's rollouts ask the task's environment for the agent's session and the verification's;
the pod mode refuses an environment its session uids could not reach.

Offline: the locks install wheels made here, from this interpreter's own pytest and its
dependencies (repacked from their installed files) and a package ``envonly`` written here in two
versions, through ``--no-index --find-links``."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import importlib.metadata as md
import json
import os
import sys
import threading
import zipfile
from pathlib import Path

import pytest

from gagar.driver import components as comp
from gagar.driver.rollouts import RolloutConfig, Rollouts
from gagar.rollout.agent import AgentLimits
from gagar.rollout.envs.task import Task, dump_tasks
from gagar.rollout.envs.verify import verify_files
from gagar.sandbox import SandboxError, SandboxUnavailable, podjail, venvs
from gagar.sandbox.local import LocalFactory, check_isolation
from gagar.sandbox.types import Limits, SessionRequest, VerificationFactory
from gagar.spec import GagarRunSpec
from tests.support.submitting import Fmt, Submits

LIMITS = Limits(wall_time_s=60, cpu_time_s=40, memory_bytes=1 << 30, processes=64)
PYTEST_STACK = ("pytest", "pluggy", "iniconfig", "packaging", "pygments")
WHEEL = "Wheel-Version: 1.0\nGenerator: gagar-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
SITE = f"python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
ENV_TEST = (
    "import envonly\nfrom calc import f\n\n\ndef test_f():\n    assert f() == envonly.VALUE\n"
)


def _record(files: dict[str, bytes], dist_info: str) -> bytes:
    lines = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        lines.append(f"{name},sha256={digest},{len(data)}")
    return ("\n".join([*lines, f"{dist_info}/RECORD,,"]) + "\n").encode()


def _write_wheel(out: Path, name: str, version: str, files: dict[str, bytes]) -> Path:
    dist_info = f"{name}-{version}.dist-info"
    files = {
        **files,
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist_info}/WHEEL": WHEEL.encode(),
    }
    path = out / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as whl:
        for arc, data in files.items():
            whl.writestr(arc, data)
        whl.writestr(f"{dist_info}/RECORD", _record(files, dist_info))
    return path


def _repack(out: Path, dist_name: str) -> Path:
    """A wheel of an installed pure-Python distribution, from its installed files."""
    dist = md.distribution(dist_name)
    name = dist.metadata["Name"].replace("-", "_")
    files = {}
    for f in dist.files or []:
        arc = str(f)
        if arc.startswith("..") or "__pycache__" in arc or ".dist-info/" in arc:
            continue
        files[arc] = Path(str(dist.locate_file(f))).read_bytes()
    return _write_wheel(out, name, dist.version, files)


def _lock(path: Path, wheels: list[Path], where: Path) -> Path:
    lines = ["--no-index", f"--find-links {os.path.relpath(where, path.parent)}"]  # the lock's
    for whl in wheels:
        name, version = whl.name.split("-")[:2]
        digest = hashlib.sha256(whl.read_bytes()).hexdigest()
        lines.append(f"{name}=={version} --hash=sha256:{digest}")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def envs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two environments (``envonly`` 1 and 2, each with pytest), the first made by two builders
    at once; and where their cache is."""
    check_isolation()
    root = tmp_path_factory.mktemp("envs")
    house = root / "wheels"
    house.mkdir()
    stack = [_repack(house, n) for n in PYTEST_STACK]
    one = _write_wheel(house, "envonly", "1.0", {"envonly.py": b"VALUE = 1\n"})
    two = _write_wheel(house, "envonly", "2.0", {"envonly.py": b"VALUE = 2\n"})
    lock_a = _lock(root / "a.txt", [*stack, one], house)
    lock_b = _lock(root / "b.txt", [*stack, two], house)
    cache, made = root / "envs", []  # venvs.default_cache() with GAGAR_CACHE_DIR=root
    builders = [threading.Thread(target=lambda: made.append(venvs.ensure(lock_a, cache)))]
    builders.append(threading.Thread(target=lambda: made.append(venvs.ensure(lock_a, cache))))
    for t in builders:
        t.start()
    for t in builders:
        t.join()
    assert len(made) == 2 and made[0] == made[1]  # one environment, whoever asked
    b = venvs.ensure(lock_b, cache)
    return {"a": made[0], "b": b, "cache": cache, "lock_a": lock_a, "lock_b": lock_b}


@pytest.fixture(scope="module")
def factory(envs: dict[str, Path]) -> LocalFactory:
    return LocalFactory(LIMITS, environments={"a": envs["a"], "b": envs["b"]})


def _task(environment: str | None) -> Task:
    files = {"calc.py": "def f():\n    return 0\n", "tests/test_calc.py": ENV_TEST}
    return Task(
        instance_id=f"env-{environment}",
        problem_statement="f returns the wrong value",
        files=files,
        reference_files={"calc.py": "import envonly\n\n\ndef f():\n    return envonly.VALUE\n"},
        fail_to_pass=["tests/test_calc.py::test_f"],
        test_command="PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest -q -p no:cacheprovider",
        environment=environment,
    )


def test_the_cache_holds_one_whole_environment_per_lock(envs: dict[str, Path]) -> None:
    cache = envs["cache"]
    assert sorted(p.name for p in cache.iterdir() if p.is_dir()) == sorted(
        [envs["a"].name, envs["b"].name]
    )  # nothing half-built left behind
    stamp = (envs["a"] / "pyvenv.cfg").stat().st_mtime_ns
    assert venvs.ensure(envs["lock_a"], cache) == envs["a"]  # made once
    assert (envs["a"] / "pyvenv.cfg").stat().st_mtime_ns == stamp
    assert not (envs["a"] / "bin" / "pip").exists()  # pip ran from its wheel: not installed


def test_a_lock_with_a_wrong_hash_or_without_pytest_is_refused(
    envs: dict[str, Path], tmp_path: Path
) -> None:
    lines = envs["lock_a"].read_text().splitlines()
    wrong = envs["lock_a"].parent / "wrong.txt"  # beside it: its --find-links is relative
    wrong.write_text("\n".join(ln[:-4] + "0000" if "envonly" in ln else ln for ln in lines))
    with pytest.raises(venvs.VenvError, match=r"pip install of the lock failed.*(?i:hash)"):
        venvs.ensure(wrong, tmp_path / "cache")
    bare = envs["lock_a"].parent / "bare.txt"
    bare.write_text(
        "\n".join(
            ln for ln in lines if not ln.startswith(("pytest", "pluggy", "Pygments", "pygments"))
        )
    )
    with pytest.raises(venvs.VenvError, match="installs no pytest that imports"):
        venvs.ensure(bare, tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == [] or all(
        p.suffix == ".lock" for p in (tmp_path / "cache").iterdir()
    )  # no environment, no half-built one


def test_a_session_runs_in_its_environment_and_cannot_write_into_it(
    factory: LocalFactory, envs: dict[str, Path]
) -> None:
    probe = "import envonly, os, sys; print(json.dumps([sys.prefix, os.environ['VIRTUAL_ENV'], envonly.VALUE]))"
    with factory.create(files={}, environment="a") as s:
        result = s.exec(["python", "-c", "import json; " + probe])
        assert result.ok, result.stderr
        assert json.loads(result.stdout) == [str(envs["a"]), str(envs["a"]), 1]
        for attempt in (
            f"touch {envs['a']}/planted",
            f"echo 'VALUE = 99' > {envs['a']}/lib/{SITE}/envonly.py",
        ):
            result = s.exec(attempt)
            assert not result.ok and "Read-only file system" in result.stderr
        assert not (envs["a"] / "planted").exists()
    with factory.create(files={}) as s:  # no environment: the executor's own Python
        result = s.exec(["python", "-c", "import envonly"])
        assert result.exit_code == 1 and "No module named 'envonly'" in result.stderr
    with pytest.raises(SandboxError, match="no environment 'gpu' here"):
        factory.create(files={}, environment="gpu")


def test_pytest_runs_warm_from_a_fork_server_of_the_sessions_environment(
    factory: LocalFactory,
) -> None:
    test = "import envonly, sys\n\n\ndef test_v():\n    assert envonly.VALUE == int(sys.argv[-1][-1])\n"
    for env, value in (("a", 1), ("b", 2)):
        with factory.create(
            files={"test_v.py": test.replace("int(sys.argv[-1][-1])", str(value))}, environment=env
        ) as s:
            result = s.exec(_task(env).test_command + " test_v.py")
            assert result.ok, result.stdout + result.stderr
            assert result.warm, result.warm_fallback


def test_verification_runs_the_tests_in_the_tasks_environment(factory: LocalFactory) -> None:
    made = factory.stations.made
    fixed = _task("a").fixed_files()
    assert verify_files(_task("a"), fixed, factory).passed  # envonly 1: what the test wants
    unfixed = verify_files(_task("a"), _task("a").repo_files(), factory)
    assert unfixed.valid and not unfixed.passed
    without = verify_files(_task(None), fixed, factory)  # the executor's Python has no envonly
    assert without.valid and not without.passed and "No module named 'envonly'" in without.log
    assert factory.stations.made == made + 2 or not factory.warm  # a's, then the plain one
    # another environment's station: envonly 2, so the fix made for 1 is right there too
    # (f() returns envonly.VALUE), while a test pinned to 1 fails: the stations do not mix
    pinned = _task("b").model_copy(
        update={"test_files": {"tests/test_calc.py": ENV_TEST.replace("envonly.VALUE", "1")}}
    )
    assert not verify_files(pinned, fixed, factory).passed
    assert verify_files(_task("b"), fixed, factory).passed
    if factory.warm:  # a's, the environment-less one's, b's: one station each, reused after
        assert factory.stations.made == made + 3 and factory.stations.reused >= 2


def test_isolation_none_runs_the_environment_through_path(envs: dict[str, Path]) -> None:
    with pytest.warns(UserWarning, match="isolation is OFF"):
        bare = LocalFactory(LIMITS, isolation="none", environments={"a": envs["a"]})
    with bare.create(files={}, environment="a") as s:
        result = s.exec("python -c 'import envonly, sys; print(sys.prefix, envonly.VALUE)'")
        assert result.ok and result.stdout.split() == [str(envs["a"]), "1"]
        assert s.exec("echo $VIRTUAL_ENV").stdout.strip() == str(envs["a"])


def test_the_specs_environments_reach_the_sandbox_and_the_sources_tasks(
    envs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``spec.sandbox.environments`` become the trainer's sandbox environments (made from their
    locks, here found in the cache), ``spec.dataset.sources[].environment`` the tasks'; the
    task then passes verification with the fix, which it fails without the environment."""
    monkeypatch.setenv(venvs.CACHE_ENV, str(envs["cache"].parent))
    rows = tmp_path / "tasks.jsonl"
    dump_tasks([_task(None)], rows)
    spec = GagarRunSpec.model_validate(
        {
            "model": {"preset": "tiny"},
            "rollout": {"replicas": 1},
            "sandbox": {
                "isolation": "bubblewrap",
                "limits": {"wallSeconds": 60, "cpuSeconds": 40},
                "environments": [
                    {"name": "one", "lock": str(envs["lock_a"])},
                    {"name": "two", "lock": str(envs["lock_b"])},
                ],
            },
            "dataset": {
                "sources": [{"kind": "jsonl", "path": str(rows), "environment": "one"}],
                "heldOutFraction": 0,
            },
        }
    )
    factory = comp.sandbox_factory(spec.sandbox)
    assert factory.environments == {"one": str(envs["a"]), "two": str(envs["b"])}
    [[task]], _ = comp.load_sources(spec.dataset, ["one", "two"])
    assert task.environment == "one"
    assert verify_files(task, task.fixed_files(), factory).passed
    plain = task.model_copy(update={"environment": None})
    assert not verify_files(plain, plain.fixed_files(), factory).passed


def test_isolation_pod_refuses_an_environment_its_session_uids_cannot_reach(
    envs: dict[str, Path],
) -> None:
    """In the pod mode a session runs as a leased uid with the pod's file system: an environment
    behind a directory others may not traverse (pytest's 0700 temporary root here) would fail
    every command, so the factory refuses it, naming the environment and the directory."""
    if os.geteuid() != 0:
        pytest.skip("a non-root executor has no uid to lease: its sessions run as itself")
    try:
        podjail.check()
    except SandboxUnavailable as e:
        pytest.skip(f"the pod mode does not work here: {e}")
    blocked = next(d for d in envs["a"].parents if not d.stat().st_mode & 0o001)
    with pytest.raises(
        SandboxUnavailable, match=f"cannot pass through {blocked} .*environment 'a'"
    ):
        LocalFactory(LIMITS, isolation="pod", environments={"a": envs["a"]})


class _Recording(VerificationFactory):
    """``factory``, noting the environment of every session asked of it."""

    def __init__(self, factory: LocalFactory) -> None:
        self.factory, self.asked = factory, []  # type: ignore[var-annotated]

    def open(self, request: SessionRequest):
        self.asked.append(
            ("verification" if request.verification else "create", request.environment)
        )
        return self.factory.open(request)


def test_the_rollouts_agent_and_verification_run_in_the_tasks_environment(
    factory: LocalFactory,
) -> None:
    """Through the loop's path (``Rollouts.group``): each agent's session and each verification
    is asked for the task's environment; the untouched repository (its ``f`` already returns
    ``envonly.VALUE``) passes there, as it would nowhere else."""
    task = _task("a")
    task = task.model_copy(update={"files": {**(task.files or {}), **task.reference_files}})
    recording = _Recording(factory)
    cfg = RolloutConfig(AgentLimits(4, 64, 4096), 20.0, 60.0)
    rollouts = Rollouts.bounded(recording, Submits(), Fmt(), cfg, concurrency=2)  # type: ignore[arg-type]
    try:
        group = asyncio.run(rollouts.group(task, 2, 0))
    finally:
        rollouts.close()
    assert [r.passed for r in group.rollouts] == [True, True]
    assert sorted(set(recording.asked)) == [("create", "a"), ("verification", "a")]
