"""The task miner end to end on a tiny package built here as an sdist: the suite runs twice in
the sandbox and the flaky test is dropped, edits go only where tests execute, kept tasks fail
exactly their FAIL_TO_PASS unfixed and pass with their patch (the real verifier), rows are
byte-identical run to run, and the rows load as a dataset source. The package's tests have a
conftest.py of their own, which verification installs as the task has it; a candidate's conftest
is still deleted or put back, and flagged. ``gagar tasks build`` mines a recipe's pins with their
pytest arguments (a src/ layout) and refuses a file whose digest is not the pinned one."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from gagar.cli import main
from gagar.rollout.envs.mine import miner, sdist
from gagar.rollout.envs.mine.miner import MineConfig, MineError, dump_rows, mine
from gagar.rollout.envs.task import Task, load_tasks
from gagar.rollout.envs.verify import verify_files
from gagar.sandbox import Limits
from gagar.sandbox.local import LocalFactory

CALC = '''"""tinycalc."""


def clamp(x, lo, hi):
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def total(xs):
    acc = 0
    for x in xs:
        acc += x
    return acc


def never_tested(x):
    return x * 2 + 1
'''
TESTS = """import os

import pytest

from tinycalc import clamp, total


@pytest.mark.xfail(reason="an expected failure that passes (sqlparse has one): never listed")
def test_xpass():
    assert clamp(1, 0, 2) == 1


def test_clamp_inside(bounds):
    assert clamp(5, *bounds) == 5


def test_clamp_low(bounds):
    assert clamp(-3, *bounds) == 0


def test_clamp_high(bounds):
    assert clamp(12, *bounds) == 10


def test_total():
    assert total([1, 2, 3]) == 6


def test_flaky():
    # passes the first time it runs in a workspace, fails after: the miner must drop it
    seen = os.path.exists(".flaky-marker")
    open(".flaky-marker", "w").close()
    assert not seen
"""


# The package's own conftest.py (tinydb's tests have one): part of the task's test files, which
# verification installs as the package has them; its fixture is needed, so it must load.
CONFTEST = """import pytest


@pytest.fixture
def bounds():
    return (0, 10)
"""
# A candidate's conftest.py that stops every test body from running (grader_bench's forgery).
HOOK = """import gc
for _o in gc.get_objects():
    if getattr(_o, "__name__", "") == "pytest_runtest_call" and hasattr(_o, "__code__"):
        _o.__code__ = (lambda item: None).__code__
"""


def make_sdist(root: Path, package_dir: str = "", version: str = "0.1") -> Path:
    """tinycalc's sdist; ``package_dir="src/"``: the package in a ``src/`` layout."""
    top = f"tinycalc-{version}"
    path = root / f"{top}.tar.gz"
    members = {
        f"{top}/{package_dir}tinycalc/__init__.py": CALC,
        f"{top}/tests/test_calc.py": TESTS,
        f"{top}/tests/conftest.py": CONFTEST,
        f"{top}/PKG-INFO": f"Name: tinycalc\nVersion: {version}\n",
    }
    with tarfile.open(path, "w:gz") as tar:
        for name, text in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    return path


@pytest.fixture(scope="module")
def factory() -> LocalFactory:
    # generous: a starved machine must not turn a slow run into a timeout
    return LocalFactory(limits=Limits(wall_time_s=900, cpu_time_s=300))


@pytest.fixture(scope="module")
def mined(tmp_path_factory: pytest.TempPathFactory, factory: LocalFactory) -> tuple:
    root = tmp_path_factory.mktemp("mine")
    pkg = sdist.load(str(make_sdist(root)), root / "cache")
    tasks, summary = mine(pkg, factory, MineConfig(seed=1, max_edits=8), root / "out")
    dump_rows(tasks, root / "out" / "tasks.jsonl")
    return root, pkg, tasks, summary


def test_the_flaky_test_is_dropped_and_never_listed(mined: tuple) -> None:
    _, _, tasks, summary = mined
    assert summary.flaky == ["tests/test_calc.py::test_flaky"]
    assert summary.tests == 4  # not the xfail test that passes: the verifier counts it failed
    assert tasks and all("tests/test_calc.py::test_flaky" not in t.test_ids for t in tasks)
    assert all("tests/test_calc.py::test_xpass" not in t.test_ids for t in tasks)


def test_edits_go_only_where_tests_execute(mined: tuple) -> None:
    _, _, tasks, summary = mined
    assert summary.rejected["not_executed_by_tests"] >= 3  # never_tested's operators and 1
    assert all(t.metadata["function"] in ("clamp", "total") for t in tasks)
    assert summary.tried == 8 and summary.tried == sum(summary.tried_by_kind.values())
    assert summary.kept + sum(summary.rejected[r] for r in REASONS) == summary.tried


REASONS = ("no_test_fails", "too_many_fail", "collection_error", "timeout", "duplicate")


def test_kept_tasks_fail_unfixed_and_pass_fixed_through_the_verifier(
    mined: tuple, factory: LocalFactory
) -> None:
    _, pkg, tasks, _ = mined
    task = tasks[0]
    assert task.metadata | {"line": 0} == {
        "package": "tinycalc",
        "version": "0.1",
        "sha256": pkg.sha256,
        "edit_kind": task.metadata["edit_kind"],
        "file": "tinycalc/__init__.py",
        "function": task.metadata["function"],
        "line": 0,
        "seed": 1,
        "miner": 2,
    }
    assert set(task.test_files) == {"tests/test_calc.py", "tests/conftest.py"}
    assert 1 <= len(task.fail_to_pass) <= 20
    assert sorted(task.fail_to_pass + task.pass_to_pass) == sorted(
        f"tests/test_calc.py::test_{n}"
        for n in ("clamp_inside", "clamp_low", "clamp_high", "total")
    )
    before = verify_files(task, task.repo_files(), factory)
    assert before.valid, (before.infra_error, before.notes, before.log[-2000:])
    assert sorted(t for t, ok in before.tests.items() if not ok) == task.fail_to_pass, before.log
    assert before.tampering == [], before.tampering  # the package's own tests/conftest.py
    after = verify_files(task, task.fixed_files(), factory)
    assert after.passed, (after.tampering, after.notes, after.log[-2000:])
    assert task.metadata["file"] not in task.problem_statement
    assert (task.patch or "").count("\n+ ") + (task.patch or "").count("\n+\t") <= 2


def test_a_share_of_the_tests_is_held_back_and_never_named_in_the_statement(mined: tuple) -> None:
    _, _, tasks, _ = mined
    for task in tasks:
        f2p, p2p = len(task.fail_to_pass), len(task.pass_to_pass)
        assert len(task.held_back) == min(f2p - 1, round(0.2 * f2p)) + round(0.2 * p2p)
        assert set(task.held_back) <= set(task.test_ids)
        assert task.visible().fail_to_pass  # one failing test stays visible
        for held in set(task.held_back) & set(task.fail_to_pass):
            assert held not in task.problem_statement
    assert any(task.held_back for task in tasks)


def test_the_fixed_package_is_verified_once_and_max_tasks_stops_the_edits(
    tmp_path: Path, factory: LocalFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every reference fix gives back the released files: one verification of them serves
    # every task of the package, beside one verification of each task's unfixed snapshot
    calls = []
    real = miner.verify_files

    def counted(task: Task, files: dict[str, bytes], factory: LocalFactory) -> object:
        calls.append(task.instance_id)
        return real(task, files, factory)

    monkeypatch.setattr(miner, "verify_files", counted)
    pkg = sdist.load(str(make_sdist(tmp_path)), tmp_path / "cache")
    config = MineConfig(seed=1, max_edits=8, max_tasks=2)
    tasks, summary = mine(pkg, factory, config, tmp_path / "out")
    assert len(tasks) == summary.kept == 2
    assert summary.tried < 8  # it stopped once two were kept
    assert len(calls) == 1 + 2
    assert set(summary.phases) == {"baseline_s", "edits_s", "verify_s"}


def test_packages_mined_at_once_give_the_same_rows(tmp_path: Path) -> None:
    paths = [str(make_sdist(tmp_path, version=v)) for v in ("0.1", "0.2")]
    rows = []
    for jobs in ("1", "2"):
        out = tmp_path / f"jobs{jobs}"
        argv = ["tasks", "mine", *paths, "--out", str(out), "--max-edits", "3", "--no-verify"]
        assert main([*argv, "--jobs", jobs]) == 0
        rows.append((out / "tasks.jsonl").read_text().replace(str(out), "OUT"))
    assert rows[0] == rows[1] and {"tinycalc-0.1", "tinycalc-0.2"} <= {
        json.loads(r)["instance_id"].rsplit(".", 2)[0] for r in rows[0].splitlines()
    }


@pytest.mark.parametrize("path", ["conftest.py", "tests/conftest.py", "tinycalc/conftest.py"])
def test_a_candidates_conftest_is_caught_and_never_runs(
    mined: tuple, factory: LocalFactory, path: str
) -> None:
    # the unfixed snapshot plus a conftest that would make every test pass: a new one is
    # deleted, the package's own is put back, and the patch is flagged for the grader
    _, _, tasks, _ = mined
    task = tasks[0]
    files = task.repo_files()
    files[path] = files.get(path, b"") + b"\n" + HOOK.encode()
    verdict = verify_files(task, files, factory)
    assert verdict.valid and not verdict.passed, verdict.notes
    assert sorted(t for t, ok in verdict.tests.items() if not ok) == task.fail_to_pass
    assert path in verdict.suspected_tampering


def test_the_rows_are_the_same_run_to_run_and_load_as_tasks(
    mined: tuple, factory: LocalFactory
) -> None:
    root, pkg, tasks, _ = mined
    again, _ = mine(pkg, factory, MineConfig(seed=1, max_edits=8), root / "again")
    dump_rows(again, root / "again" / "tasks.jsonl")
    first = (root / "out" / "tasks.jsonl").read_bytes()
    assert first == (root / "again" / "tasks.jsonl").read_bytes()
    for task in tasks:
        name = f"{task.instance_id}.tar.gz"
        assert (root / "out/snapshots" / name).read_bytes() == (
            root / "again/snapshots" / name
        ).read_bytes()
    loaded = load_tasks(root / "out" / "tasks.jsonl")
    assert [t.instance_id for t in loaded] == [t.instance_id for t in tasks]
    assert loaded[0].repo_files() == tasks[0].repo_files()


def test_a_package_whose_suite_cannot_run_is_refused(tmp_path: Path, factory: LocalFactory) -> None:
    pkg = sdist.Sdist("broken", "1", "0" * 64, {"tests/test_x.py": b"import nowhere_to_be_found\n"})
    with pytest.raises(MineError, match="the suite does not run here"):
        mine(pkg, factory, MineConfig(), tmp_path)


def test_the_command_writes_rows_and_a_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = make_sdist(tmp_path)
    out = tmp_path / "out"
    argv = ["tasks", "mine", str(path), "--out", str(out), "--max-edits", "3", "--no-verify"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "tinycalc 0.1: 4 stable tests (1 flaky)" in printed
    [summary] = json.loads((out / "summary.json").read_text())
    assert summary["tried"] == 3 and summary["sha256"] == sdist.load(str(path), tmp_path).sha256
    rows = (out / "tasks.jsonl").read_text().splitlines()
    assert len(rows) == summary["kept"]


def test_build_mines_a_recipe_with_its_pytest_args(tmp_path: Path) -> None:
    # a src/ layout: the tests import tinycalc only with the recipe's `-o pythonpath=src`, in the
    # miner's runs and in the verifier's (the tasks kept are verified)
    cache = tmp_path / "cache"
    cache.mkdir()
    sha = sdist.load(str(make_sdist(cache, "src/")), tmp_path / "unused").sha256
    recipe = tmp_path / "recipe.toml"
    entry = f'[[packages]]\npin = "tinycalc==0.1"\nsha256 = "{sha}"\n'
    recipe.write_text(f'seed = 1\nmax_edits = 4\n{entry}pytest_args = "-o pythonpath=src"\n')
    out = tmp_path / "out"
    assert main(["tasks", "build", str(recipe), "--out", str(out), "--cache", str(cache)]) == 0
    [summary] = json.loads((out / "summary.json").read_text())
    assert (summary["package"], summary["tests"], summary["tried"]) == ("tinycalc", 4, 4)
    tasks = load_tasks(out / "tasks.jsonl")
    assert len(tasks) == summary["kept"] >= 1
    assert all(t.test_command.endswith(" -o pythonpath=src") for t in tasks)
    assert all(t.metadata["file"] == "src/tinycalc/__init__.py" for t in tasks)
    # without the argument the suite cannot import the package: refused, nothing written
    recipe.write_text(f"seed = 1\nmax_edits = 4\n{entry}")
    assert (
        main(["tasks", "build", str(recipe), "--out", str(tmp_path / "o2"), "--cache", str(cache)])
        == 1
    )
    assert not (tmp_path / "o2" / "tasks.jsonl").exists()
    # a different file under the pinned version: refused by its digest
    recipe.write_text(f"max_edits = 4\n{entry.replace(sha, '0' * 64)}")
    assert (
        main(["tasks", "build", str(recipe), "--out", str(tmp_path / "o3"), "--cache", str(cache)])
        == 1
    )


SLEEPY = {
    "sleepy/__init__.py": b"def ready():\n    return True\n",
    "tests/test_sleepy.py": b"import time\n\nfrom sleepy import ready\n\n\n"
    b"def test_waits():\n    while not ready():\n        time.sleep(0.05)\n",
}


def test_an_edit_that_hangs_asleep_is_stopped_by_the_wall_clock(
    tmp_path: Path, factory: LocalFactory
) -> None:
    """``return False`` makes the test wait forever, asleep: no CPU limit stops it. The edit gets
    a multiple of the baseline's wall time (here at least 3 s), not the 15 minutes of any run,
    and is rejected as a timeout."""
    pkg = sdist.Sdist("sleepy", "1", "0" * 64, SLEEPY)
    config = MineConfig(max_edits=4, verify=False, timeout_s=900, edit_min_wall_s=3)
    tasks, summary = mine(pkg, factory, config, tmp_path)
    assert tasks == [] and summary.tried_by_kind == {"flip_boolean": 1}
    assert summary.rejected == {"timeout": 1}
    assert summary.phases["edits_s"] < 300  # the run's limit, not timeout_s
